package flash

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// TestNaNPropagates checks the documented NaN behaviour on both paths of
// the kernel (whole tiles and masked ones): a NaN in a query reaches that
// query's row only, a NaN in a key every row that sees the key.
func TestNaNPropagates(t *testing.T) {
	for _, kn := range kernels {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 1, H: 2, HKV: 1, N: 200, M: 200, D: 64}
			rng := rand.New(rand.NewPCG(1, 2))
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			q[5*s.D+3] = float32(math.NaN())   // head 0, query 5
			k[150*s.D+1] = float32(math.NaN()) // key 150
			out := make([]float32, s.QLen())
			lse := make([]float32, s.LSELen())
			if err := kn.Forward(context.Background(), s, q, k, v, attn.Options{Causal: causal}, out, lse); err != nil {
				t.Fatal(err)
			}
			for h := range s.H {
				for i := range s.N {
					row := h*s.N + i
					nan := math.IsNaN(float64(out[row*s.D])) || math.IsNaN(float64(lse[row]))
					want := (h == 0 && i == 5) || !causal || i >= 150
					if nan != want {
						t.Errorf("blocks %d/%d causal=%v head %d query %d: NaN %v, want %v", kn.blockRows, kn.blockK, causal, h, i, nan, want)
					}
				}
			}
		}
	}
}

// TestKVLayouts runs the same problems through Forward, which reads K and
// V in place, and ForwardKV, which packs them tile by tile (Kᵀ), with and
// without masks, over several key tiles of the default kernel.
func TestKVLayouts(t *testing.T) {
	rng := ref.FreshRNG(t, 11)
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 150, M: 333, D: 72}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for _, o := range []attn.Options{{}, {Causal: true}, {KVLen: []int{333, 200}}} {
		want, wantLSE, _ := ref.Attention(s, q, k, v, ref.Spec{Mask: ref.Mask(s, o)})
		for _, kn := range kernels {
			for _, viaKV := range []bool{false, true} {
				out := make([]float32, s.QLen())
				lse := make([]float32, s.LSELen())
				var err error
				if viaKV {
					err = kn.ForwardKV(context.Background(), s, q, newPaddedKV(s, k, v), o, nil, out, lse)
				} else {
					err = kn.Forward(context.Background(), s, q, k, v, o, out, lse)
				}
				if err != nil {
					t.Fatal(err)
				}
				if e := ref.RelErr(out, want); e > tol {
					t.Errorf("%+v blocks %d/%d viaKV=%v: out rel err %.3g", o, kn.blockRows, kn.blockK, viaKV, e)
				}
				if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
					t.Errorf("%+v blocks %d/%d viaKV=%v: lse rel err %.3g %v", o, kn.blockRows, kn.blockK, viaKV, e, err)
				}
			}
		}
	}
}
