package eval

import (
	"context"
	"fmt"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model"
)

// Model is the input kind of real activations: the queries, keys and
// values (after the rotary embedding) that one layer of a model computes
// over a text.
const Model = "model"

// ModelSource holds one layer's attention inputs over the first Len
// tokens of a text. A causal model's activations at a position depend on
// the positions before it only, so the inputs of every shorter length are
// a prefix of these: one pass serves a whole sweep.
type ModelSource struct {
	Layer int
	// Shape is the layer's: B = 1, the model's heads, N = M = Len.
	Shape   attn.Shape
	q, k, v []float32
	// Name says where the inputs come from, for results.
	Name string
}

// NewModelSource runs m over tokens, up to layer, and keeps that layer's
// attention inputs. Positions past the model's context (Config.SeqLen)
// are computed all the same, with the rotary embedding extrapolated: the
// caller says so where it matters.
func NewModelSource(ctx context.Context, m *model.Model, tokens []int, layer int, name string) (*ModelSource, error) {
	s, q, k, v, _, err := m.Activations(ctx, tokens, layer)
	if err != nil {
		return nil, err
	}
	return &ModelSource{Layer: layer, Shape: s, q: q, k: k, v: v, Name: name}, nil
}

// Len is the number of positions the source holds.
func (src *ModelSource) Len() int { return src.Shape.N }

// Inputs returns the first n positions of every head for shape s, which
// must be the source's but for N = M = n <= Len.
func (src *ModelSource) Inputs(s attn.Shape) (*Inputs, error) {
	t := src.Shape
	if s.B != 1 || s.H != t.H || s.HKV != t.HKV || s.D != t.D {
		return nil, fmt.Errorf("%w: model inputs have B = 1, H = %d, Hkv = %d, D = %d, not %+v", attn.ErrShape, t.H, t.HKV, t.D, s)
	}
	if s.N != s.M || s.N < 1 || s.N > t.N {
		return nil, fmt.Errorf("%w: model inputs have N = M up to %d, not N = %d, M = %d", attn.ErrShape, t.N, s.N, s.M)
	}
	n, d := s.N, s.D
	prefix := func(x []float32, heads int) []float32 {
		out := make([]float32, heads*n*d)
		for h := range heads {
			copy(out[h*n*d:][:n*d], x[h*t.N*d:][:n*d])
		}
		return out
	}
	return &Inputs{Shape: s, Q: prefix(src.q, s.H), K: prefix(src.k, s.HKV), V: prefix(src.v, s.HKV), Kind: Model}, nil
}
