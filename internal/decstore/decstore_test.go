package decstore_test

import (
	"errors"
	"math"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore"
	"github.com/attnkit/attn/internal/decstore/dectest"
)

// exactRule decodes by exact attention over every stored position, and
// records what Index was asked for.
type exactRule struct {
	st      *decstore.Store
	indexed []int
}

func (r *exactRule) NewScratch() []float64 { return nil }
func (r *exactRule) Reset()                { clear(r.indexed) }
func (r *exactRule) Bytes() int            { return 8 * len(r.indexed) }

func (r *exactRule) Index(_ []float64, b, kvh, n int) {
	cfg := r.st.Config()
	if n != r.st.Len(b) || n != r.st.Head(b, kvh).Len() {
		panic("Index past the committed positions")
	}
	r.indexed[b*cfg.HKV+kvh] = n
}

func (r *exactRule) Decode(sc []float64, b, kvh, p int, q, out, lse []float32) {
	cfg := r.st.Config()
	d, g := cfg.D, cfg.H/cfg.HKV
	if r.indexed[b*cfg.HKV+kvh] != p || r.st.Head(b, kvh).Len() != p+1 {
		panic("Decode without the earlier positions indexed or its own stored")
	}
	hd := r.st.Head(b, kvh)
	row := make([]float32, d)
	scale := float64(cfg.ScaleFor())
	for h := range g {
		logits := make([]float64, p+1)
		mx := math.Inf(-1)
		for j := range logits {
			var s float64
			for c := range d {
				s += float64(q[h*d+c]) * float64(hd.K(row, j)[c])
			}
			logits[j] = s * scale
			mx = max(mx, logits[j])
		}
		acc := make([]float64, d)
		var sum float64
		for j, l := range logits {
			w := math.Exp(l - mx)
			sum += w
			for c := range d {
				acc[c] += w * float64(hd.V(row, j)[c])
			}
		}
		for c := range d {
			out[h*d+c] = float32(acc[c] / sum)
		}
		lse[h] = float32(mx + math.Log(sum))
	}
}

func newExact(t *testing.T) func(attn.DecodeConfig) attn.Decoder {
	return func(cfg attn.DecodeConfig) attn.Decoder {
		st, err := decstore.NewStore("exact", cfg, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		return decstore.New(st, &exactRule{st: st, indexed: make([]int, cfg.B*cfg.HKV)})
	}
}

// With an exact rule the decoder is exact attention for any steps, the
// prompt chunks (flash over the stored rows) included.
func TestExactRule(t *testing.T) {
	rng := dectest.FreshRNG(t, 1)
	for _, cfg := range []attn.DecodeConfig{
		{B: 3, H: 6, HKV: 2, D: 19},
		{B: 1, H: 4, HKV: 4, D: 32, Scale: -0.3},
		{B: 2, H: 6, HKV: 2, D: 19, Storage: "bf16"},
		{B: 1, H: 4, HKV: 2, D: 32, Storage: "f16"},
	} {
		dectest.Run(t, newExact(t)(cfg), cfg, rng, dectest.Script(cfg.B, 41, 9), func(hs *dectest.History, st dectest.Step, before []int, out, lse []float32) {
			dectest.Compare(t, "exact rule", hs, st, before, out, lse, 2e-5, func(b, h, p int) ([]float64, float64, bool) {
				o, l := hs.Exact(b, h, p)
				return o, l, true
			})
		})
	}
}

func TestSkeleton(t *testing.T) {
	cfg := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 7}
	dectest.CheckRagged(t, newExact(t), cfg, dectest.FreshRNG(t, 2), dectest.Script(cfg.B, 23, 6))
	dectest.CheckWorkers(t, newExact(t), cfg, 3, dectest.Script(cfg.B, 23, 6))
	dectest.CheckState(t, newExact(t), attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 5, MaxLen: 40})
}

func TestNewStoreErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  attn.DecodeConfig
		want error
	}{
		{attn.DecodeConfig{B: 1, H: 3, HKV: 2, D: 4}, attn.ErrShape},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Storage: "i8"}, attn.ErrUnsupported},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Storage: "bf16+rot"}, attn.ErrUnsupported},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Storage: "f8"}, attn.ErrInput},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Window: 8}, attn.ErrUnsupported},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, MaxLen: 1 << 21}, attn.ErrUnsupported},
	} {
		if _, err := decstore.NewStore("test", c.cfg, 1<<20); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v, want %v", c.cfg, err, c.want)
		}
	}
}
