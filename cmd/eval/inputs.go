package eval

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// Inputs are queries, keys and values for one shape, in the layout of
// package attn.
type Inputs struct {
	Shape   attn.Shape
	Q, K, V []float32
	// Kind names where they came from: "gaussian", "planted" or a file.
	Kind string
}

// Input kinds built in to Generate.
const (
	Gaussian = "gaussian"
	Planted  = "planted"
)

// Generate returns inputs of the built-in kind for shape s, drawn from
// seed:
//
//   - "gaussian": every element i.i.d. standard normal. Logits are then
//     N(0, 1) after the 1/sqrt(D) scale, so attention is spread thinly over
//     all keys: the hard case for sparse patterns, the easy one for
//     sampling.
//   - "planted": gaussian, then for one query in 16 of every head a key it
//     can see (under the causal mask when causal) is replaced by a multiple
//     of that query, so that their scaled logit is log M + 6 and the query
//     puts nearly all its weight on that one key, as heavy-hitter tokens do
//     in trained models: the hard case for sampling and low-rank methods,
//     the case LSH is made for.
func Generate(kind string, s attn.Shape, causal bool, seed uint64) (*Inputs, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x1b873593))
	in := &Inputs{Shape: s, Kind: kind,
		Q: ref.Normal(rng, s.QLen()), K: ref.Normal(rng, s.KVLen()), V: ref.Normal(rng, s.KVLen())}
	switch kind {
	case Gaussian:
	case Planted:
		plant(rng, in, causal)
	default:
		return nil, fmt.Errorf("%w: input kind %q (want %s or %s)", attn.ErrInput, kind, Gaussian, Planted)
	}
	return in, nil
}

// plant makes one query in 16 of each head attend almost only to one key.
func plant(rng *rand.Rand, in *Inputs, causal bool) {
	s := in.Shape
	scale := float64(attn.Options{}.ScaleFor(s.D))
	target := math.Log(float64(s.M)) + 6
	for b := range s.B {
		for h := range s.H {
			kvh := h / s.Group()
			for i := range s.N {
				if rng.IntN(16) != 0 {
					continue
				}
				visible := s.M
				if causal {
					visible = min(s.M, s.M-s.N+i+1)
				}
				if visible <= 0 {
					continue
				}
				j := rng.IntN(visible)
				q := in.Q[((b*s.H+h)*s.N+i)*s.D:][:s.D]
				k := in.K[((b*s.HKV+kvh)*s.M+j)*s.D:][:s.D]
				qq := 0.0
				for _, x := range q {
					qq += float64(x) * float64(x)
				}
				if qq == 0 {
					continue
				}
				c := target / (scale * qq) // scale·q·(c·q) = target
				for t, x := range q {
					k[t] = float32(c * float64(x))
				}
			}
		}
	}
}
