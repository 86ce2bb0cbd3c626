package hyper

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// benchShape is the shape of the targets: one head of 64.
func benchShape(n int) attn.Shape { return attn.Shape{B: 1, H: 1, HKV: 1, N: n, M: n, D: 64} }

// exactFlops is the conventional count 4·B·H·N·M·D, halved when causal.
func exactFlops(s attn.Shape, causal bool) float64 {
	f := 4 * float64(s.B*s.H*s.N*s.M*s.D)
	if causal {
		f /= 2
	}
	return f
}

// BenchmarkForward times HyperAttention (default configuration) and the
// exact kernel side by side, N = 8k … 128k, for the time per doubling of N.
// The exact rows stop at 32k (set HYPER_BENCH_EXACT_MAX to go further);
// "x-exact-GFLOP" is the exact count for the same shape, so
// exact-flops/ns is the rate an exact kernel would need to match.
func BenchmarkForward(b *testing.B) {
	exactMax := envInt("HYPER_BENCH_EXACT_MAX", 32768)
	for _, causal := range []bool{false, true} {
		for n := 8192; n <= 131072; n *= 2 {
			s := benchShape(n)
			rng := rand.New(rand.NewPCG(1, 2))
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			mechs := []attn.Mechanism{newAttention(b, Config{})}
			if n <= exactMax {
				mechs = append(mechs, flash.New(flash.Config{}))
			}
			for _, m := range mechs {
				b.Run(fmt.Sprintf("%s/causal=%v/n=%d", m.Name(), causal, n), func(b *testing.B) {
					out := make([]float32, s.QLen())
					lse := make([]float32, s.LSELen())
					o := attn.Options{Causal: causal}
					for b.Loop() {
						if err := m.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(exactFlops(s, causal)/1e9, "x-exact-GFLOP")
				})
			}
		}
	}
}

// BenchmarkDoubling times HyperAttention (defaults, D = 64, one head) at
// N = 8k, 16k, …, 128k within each iteration and keeps the fastest time of
// each length over the iterations, so that every length sees the same
// load on a shared machine (run with -benchtime 3x or more). Reported: the
// seconds at each length ("s-8k" …) and "x-per-doubling", the geometric
// mean of t(2N)/t(N): 2 is linear time, 4 quadratic ("-cpu": the same from
// the process CPU time).
func BenchmarkDoubling(b *testing.B) {
	ns := []int{8192, 16384, 32768, 65536, 131072}
	for _, causal := range []bool{false, true} {
		b.Run(fmt.Sprintf("causal=%v", causal), func(b *testing.B) {
			o := attn.Options{Causal: causal}
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			s := benchShape(ns[len(ns)-1])
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			out := make([]float32, s.QLen())
			lse := make([]float32, s.LSELen())
			a := newAttention(b, Config{})
			best := make([]float64, len(ns))
			bestCPU := make([]float64, len(ns))
			for i := range best {
				best[i], bestCPU[i] = math.Inf(1), math.Inf(1)
			}
			for b.Loop() {
				for i, n := range ns {
					sn := benchShape(n)
					start, startCPU := time.Now(), cpuSeconds()
					if err := a.Forward(ctx, sn, q[:sn.QLen()], k[:sn.KVLen()], v[:sn.KVLen()], o, out[:sn.QLen()], lse[:sn.LSELen()]); err != nil {
						b.Fatal(err)
					}
					best[i] = min(best[i], time.Since(start).Seconds())
					bestCPU[i] = min(bestCPU[i], cpuSeconds()-startCPU)
				}
			}
			for i, n := range ns {
				b.ReportMetric(best[i], fmt.Sprintf("s-%dk", n/1024))
			}
			last := len(ns) - 1
			b.ReportMetric(math.Pow(best[last]/best[0], 1/float64(last)), "x-per-doubling")
			b.ReportMetric(math.Pow(bestCPU[last]/bestCPU[0], 1/float64(last)), "x-per-doubling-cpu")
		})
	}
}

// BenchmarkTarget measures the target in one run: HyperAttention at
// N = 131072, D = 64, one head, against the exact kernel. The exact time
// is measured at N = HYPER_BENCH_EXACT_N (default 32768) and extrapolated
// by the square of the length ratio (exact cost is N·M); set
// HYPER_BENCH_EXACT_N=131072 to time it in full. Each iteration times one
// exact and one HyperAttention call back to back, and the fastest of each
// over the iterations is kept, so that both see the same load on a shared
// machine (run with -benchtime 3x or more; ns/op is the sum of both).
// Reported: "hyper-s", "exact-s" (at the reference length),
// "exact-131k-s" (extrapolated), "speedup" and "speedup-cpu", the same
// ratio of the process CPU time the calls used (both run on all cores),
// steadier than the wall clock when other work shares the machine.
func BenchmarkTarget(b *testing.B) {
	const n = 131072
	nRef := envInt("HYPER_BENCH_EXACT_N", 32768)
	for _, causal := range []bool{false, true} {
		b.Run(fmt.Sprintf("causal=%v", causal), func(b *testing.B) {
			o := attn.Options{Causal: causal}
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			sr, s := benchShape(nRef), benchShape(n)
			qr, kr, vr := ref.Normal(rng, sr.QLen()), ref.Normal(rng, sr.KVLen()), ref.Normal(rng, sr.KVLen())
			outr := make([]float32, sr.QLen())
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			out := make([]float32, s.QLen())
			lse := make([]float32, s.LSELen())
			kn := flash.New(flash.Config{})
			a := newAttention(b, Config{})
			exact, hyper := math.Inf(1), math.Inf(1)
			exactCPU, hyperCPU := math.Inf(1), math.Inf(1)
			for b.Loop() {
				start, startCPU := time.Now(), cpuSeconds()
				if err := kn.Forward(ctx, sr, qr, kr, vr, o, outr, nil); err != nil {
					b.Fatal(err)
				}
				mid, midCPU := time.Now(), cpuSeconds()
				if err := a.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
					b.Fatal(err)
				}
				exact = min(exact, mid.Sub(start).Seconds())
				hyper = min(hyper, time.Since(mid).Seconds())
				exactCPU = min(exactCPU, midCPU-startCPU)
				hyperCPU = min(hyperCPU, cpuSeconds()-midCPU)
			}
			scale := float64(n) / float64(nRef) * float64(n) / float64(nRef)
			b.ReportMetric(hyper, "hyper-s")
			b.ReportMetric(exact, "exact-s")
			b.ReportMetric(exact*scale, "exact-131k-s")
			b.ReportMetric(exact*scale/hyper, "speedup")
			b.ReportMetric(exactCPU*scale/hyperCPU, "speedup-cpu")
		})
	}
}

func envInt(name string, def int) int {
	if x, err := strconv.Atoi(os.Getenv(name)); err == nil && x > 0 {
		return x
	}
	return def
}

// BenchmarkBackward measures the backward pass's targets in one run:
// HyperAttention's forward and backward passes at N = HYPER_BENCH_N
// (default 131072), D = 64, one head, and the exact kernel's at N =
// HYPER_BENCH_EXACT_N (default 16384), extrapolated by the square of the
// length ratio. Each iteration times the four calls back to back and the
// fastest of each over the iterations is kept (run with -benchtime 3x or
// more). Reported: "fwd-s", "bwd-s", "bwd-over-fwd" (the backward pass
// against its own forward), "exact-fwd+bwd-s" (extrapolated) and
// "speedup", exact forward plus backward over HyperAttention's.
func BenchmarkBackward(b *testing.B) {
	n := envInt("HYPER_BENCH_N", 131072)
	nRef := envInt("HYPER_BENCH_EXACT_N", 16384)
	for _, causal := range []bool{false, true} {
		b.Run(fmt.Sprintf("causal=%v", causal), func(b *testing.B) {
			o := attn.Options{Causal: causal}
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			kn := flash.New(flash.Config{})
			a := newAttention(b, Config{})
			type problem struct {
				s                       attn.Shape
				q, k, v, out, lse, dout []float32
				dq, dk, dv              []float32
			}
			newProblem := func(n int) *problem {
				s := benchShape(n)
				return &problem{
					s: s, q: ref.Normal(rng, s.QLen()), k: ref.Normal(rng, s.KVLen()), v: ref.Normal(rng, s.KVLen()),
					out: make([]float32, s.QLen()), lse: make([]float32, s.LSELen()), dout: ref.Normal(rng, s.QLen()),
					dq: make([]float32, s.QLen()), dk: make([]float32, s.KVLen()), dv: make([]float32, s.KVLen()),
				}
			}
			h, e := newProblem(n), newProblem(nRef)
			best := [4]float64{math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)}
			for b.Loop() {
				steps := []func() error{
					func() error { return a.Forward(ctx, h.s, h.q, h.k, h.v, o, h.out, h.lse) },
					func() error {
						return a.Backward(ctx, h.s, h.q, h.k, h.v, h.out, h.lse, h.dout, o, h.dq, h.dk, h.dv)
					},
					func() error { return kn.Forward(ctx, e.s, e.q, e.k, e.v, o, e.out, e.lse) },
					func() error {
						return kn.Backward(ctx, e.s, e.q, e.k, e.v, e.out, e.lse, e.dout, o, nil, e.dq, e.dk, e.dv)
					},
				}
				for i, step := range steps {
					start := time.Now()
					if err := step(); err != nil {
						b.Fatal(err)
					}
					best[i] = min(best[i], time.Since(start).Seconds())
				}
			}
			scale := float64(n) / float64(nRef) * float64(n) / float64(nRef)
			exact := (best[2] + best[3]) * scale
			b.ReportMetric(best[0], "fwd-s")
			b.ReportMetric(best[1], "bwd-s")
			b.ReportMetric(best[1]/best[0], "bwd-over-fwd")
			b.ReportMetric(exact, "exact-fwd+bwd-s")
			b.ReportMetric(exact/(best[0]+best[1]), "speedup")
		})
	}
}
