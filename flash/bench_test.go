package flash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// BenchmarkForward reports GFLOP/s with the conventional count
// 4·B·H·N·M·D, halved when causal.
func BenchmarkForward(b *testing.B) {
	for _, d := range []int{64, 128} {
		for _, n := range []int{1024, 4096} {
			for _, causal := range []bool{false, true} {
				s := attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: d}
				name := fmt.Sprintf("d%d/n%d/causal=%v", d, n, causal)
				b.Run(name, func(b *testing.B) {
					rng := rand.New(rand.NewPCG(1, 2))
					q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
					out := make([]float32, s.QLen())
					lse := make([]float32, s.LSELen())
					kn := New(Config{})
					o := attn.Options{Causal: causal}
					ctx := context.Background()
					for b.Loop() {
						if err := kn.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
							b.Fatal(err)
						}
					}
					f := 4 * float64(s.B*s.H*s.N*s.M*s.D)
					if causal {
						f /= 2
					}
					b.ReportMetric(f*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
