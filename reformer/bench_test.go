package reformer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// benchForward times m on B=1, H=8, D=64 and reports GFLOP/s with the
// exact count 4·B·H·N·M·D (halved when causal), so that reformer and exact
// rows compare as speed-ups over the same work.
func benchForward(b *testing.B, m attn.Mechanism, n int, causal bool) {
	s := attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: 64}
	rng := rand.New(rand.NewPCG(1, 2))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	o := attn.Options{Causal: causal}
	ctx := context.Background()
	cpu0 := cpuSeconds()
	for b.Loop() {
		if err := m.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
			b.Fatal(err)
		}
	}
	// CPU seconds per call: on a shared machine wall time also counts the
	// time other processes held the cores.
	b.ReportMetric((cpuSeconds()-cpu0)/float64(b.N), "cpu-s/op")
	f := 4 * float64(s.B*s.H*s.N*s.M*s.D)
	if causal {
		f /= 2
	}
	b.ReportMetric(f*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkForward compares Reformer (4 rounds, 64-key chunks, no
// fallback) with the exact kernel in the same run, around the crossover.
func BenchmarkForward(b *testing.B) {
	lsh, err := New(Config{Min: -1})
	if err != nil {
		b.Fatal(err)
	}
	exact := flash.New(flash.Config{})
	for _, causal := range []bool{false, true} {
		for _, n := range []int{512, 1024, 2048, 4096, 8192} {
			for _, m := range []attn.Mechanism{exact, lsh} {
				b.Run(fmt.Sprintf("causal=%v/n%d/%s", causal, n, m.Name()), func(b *testing.B) {
					benchForward(b, m, n, causal)
				})
			}
		}
	}
}

// BenchmarkScaling times Reformer alone from 4k to 64k tokens: the time per
// doubling of N should stay near 2 (linear cost).
func BenchmarkScaling(b *testing.B) {
	lsh, err := New(Config{Min: -1})
	if err != nil {
		b.Fatal(err)
	}
	for _, causal := range []bool{false, true} {
		for _, n := range []int{4096, 8192, 16384, 32768, 65536} {
			b.Run(fmt.Sprintf("causal=%v/n%d", causal, n), func(b *testing.B) { benchForward(b, lsh, n, causal) })
		}
	}
}

// BenchmarkDecodeStep times one decoding step (H=8, D=64) of the Decoder
// against caches of growing length, and exact attention of one query over
// the whole cache (the exact kernel with N = 1) in the same run. The
// Decoder's work per step is fixed; its time still grows somewhat once the
// cache outgrows the CPU caches, as its keys are read at random.
func BenchmarkDecodeStep(b *testing.B) {
	const h, d = 8, 64
	for _, n := range []int{1024, 16384, 65536} {
		rng := rand.New(rand.NewPCG(3, 4))
		k, v := ref.Normal(rng, h*n*d), ref.Normal(rng, h*n*d)
		q := ref.Normal(rng, h*d)
		out := make([]float32, h*d)
		lse := make([]float32, h)
		b.Run(fmt.Sprintf("cache%d/reformer", n), func(b *testing.B) {
			dec, err := NewDecoder(Config{Buckets: 128}, h, h, d, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := dec.Append(k, v); err != nil {
				b.Fatal(err)
			}
			cpu0 := cpuSeconds()
			for b.Loop() {
				if err := dec.Step(q, out, lse); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cpuSeconds()-cpu0)/float64(b.N)*1e6, "cpu-µs/op")
		})
		b.Run(fmt.Sprintf("cache%d/exact", n), func(b *testing.B) {
			s := attn.Shape{B: 1, H: h, HKV: h, N: 1, M: n, D: d}
			kn := flash.New(flash.Config{})
			ctx := context.Background()
			cpu0 := cpuSeconds()
			for b.Loop() {
				if err := kn.Forward(ctx, s, q, k, v, attn.Options{Causal: true}, out, lse); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cpuSeconds()-cpu0)/float64(b.N)*1e6, "cpu-µs/op")
		})
	}
}

// BenchmarkBackward times Backward (4 rounds, 64-key chunks, no fallback;
// B=1, H=8, Hkv=2, D=64) next to Forward on the same inputs, so that the
// two rows of a size give the backward pass's cost in forward passes.
func BenchmarkBackward(b *testing.B) {
	lsh, err := New(Config{Min: -1})
	if err != nil {
		b.Fatal(err)
	}
	for _, causal := range []bool{false, true} {
		for _, n := range []int{4096, 16384} {
			s := attn.Shape{B: 1, H: 8, HKV: 2, N: n, M: n, D: 64}
			rng := rand.New(rand.NewPCG(5, 6))
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			dout := ref.Normal(rng, s.QLen())
			out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
			dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
			o := attn.Options{Causal: causal}
			ctx := context.Background()
			if err := lsh.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
				b.Fatal(err)
			}
			for _, op := range []string{"forward", "backward"} {
				b.Run(fmt.Sprintf("causal=%v/n%d/%s", causal, n, op), func(b *testing.B) {
					cpu0 := cpuSeconds()
					for b.Loop() {
						var err error
						if op == "forward" {
							err = lsh.Forward(ctx, s, q, k, v, o, out, lse)
						} else {
							err = lsh.Backward(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric((cpuSeconds()-cpu0)/float64(b.N), "cpu-s/op")
				})
			}
		}
	}
}
