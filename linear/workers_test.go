package linear

import (
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
)

// TestForwardWorkers: the worker count must not change a bit of Forward,
// whatever the mask and map, including when the heads of a group are
// split over workers (B·Hkv below the worker count).
func TestForwardWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(40, testSeed(t)))
	maps := []*Attention{New(Config{}), New(Config{Chunk: 7}), New(Config{Map: expMap{}, Chunk: 16})}
	shapes := []attn.Shape{
		{B: 1, H: 8, HKV: 1, N: 75, M: 75, D: 24},
		{B: 1, H: 6, HKV: 2, N: 37, M: 90, D: 13},
		{B: 2, H: 3, HKV: 1, N: 90, M: 41, D: 5},
	}
	for _, a := range maps {
		for _, s := range shapes {
			for _, causal := range []bool{false, true} {
				for _, pad := range []bool{false, true} {
					o := attn.Options{Causal: causal}
					if pad {
						o.KVLen = make([]int, s.B)
						for b := range o.KVLen {
							o.KVLen[b] = rng.IntN(s.M + 1)
						}
					}
					q, k, v := inputs(rng, s)
					var out1, lse1 []float32
					for _, w := range []int{1, 2, 3, 8} {
						o.Workers = w
						out, lse := forward(t, a, s, q, k, v, o)
						if w == 1 {
							out1, lse1 = out, lse
							continue
						}
						if i := firstDiff(out, out1); i >= 0 {
							t.Errorf("%T %s workers=%d: out[%d] = %v, with 1 worker %v", a.fm, fmtCase(s, o), w, i, out[i], out1[i])
						}
						if i := firstDiff(lse, lse1); i >= 0 {
							t.Errorf("%T %s workers=%d: lse[%d] = %v, with 1 worker %v", a.fm, fmtCase(s, o), w, i, lse[i], lse1[i])
						}
					}
				}
			}
		}
	}
}
