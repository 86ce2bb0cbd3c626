package flash

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/ref"
)

// BenchmarkForwardBF16 reports GFLOP/s (4·B·H·N·M·D, halved when causal,
// over wall-clock time) of ForwardBF16 on the path of the kernels in use
// (BF16Path: run with ATTN_KERNELS=avx512 for the float32 fallback),
// and of Forward on the same inputs widened to float32 for comparison,
// for B=1, H=8 and N=M. It also reports, as BenchmarkForward does, the
// rate per second of CPU time (cpuGFLOP/s) and the FMA peak of one core
// (peak1GFLOP/s, simd.MeasurePeakGFlops) and of GOMAXPROCS cores
// (peakGFLOP/s), measured in the same process: AMX and VDPBF16PS are no
// FMA, and the bfloat16 tile may exceed that peak; the figure is a
// yardstick.
//
// The sizes run with -short are N = 1024 only.
func BenchmarkForwardBF16(b *testing.B) {
	ns := []int{1024, 4096}
	if testing.Short() {
		ns = ns[:1]
	}
	for _, dtype := range []string{"bf16", "f32"} {
		for _, d := range []int{64, 128} {
			for _, n := range ns {
				for _, causal := range []bool{false, true} {
					s := attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: d}
					name := fmt.Sprintf("%s/d%d/n%d/causal=%v", dtype, d, n, causal)
					b.Run(name, func(b *testing.B) {
						benchBF16(b, s, attn.Options{Causal: causal}, dtype == "bf16")
					})
				}
			}
		}
	}
}

func benchBF16(b *testing.B, s attn.Shape, o attn.Options, bf16 bool) {
	rng := rand.New(rand.NewPCG(1, 2))
	in := func(n int) ([]uint16, []float32) {
		x := ref.Normal(rng, n)
		h := make([]uint16, n)
		for i, v := range x {
			h[i] = half.F32ToBF16(v)
			x[i] = half.BF16ToF32(h[i])
		}
		return h, x
	}
	q, qf := in(s.QLen())
	k, kf := in(s.KVLen())
	v, vf := in(s.KVLen())
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	kn := New(Config{})
	ctx := context.Background()
	call := func() error {
		if bf16 {
			return kn.ForwardBF16(ctx, s, q, k, v, o, out, lse)
		}
		return kn.Forward(ctx, s, qf, kf, vf, o, out, lse)
	}
	if err := call(); err != nil { // page in the buffers
		b.Fatal(err)
	}
	procs := runtime.GOMAXPROCS(0)
	peak1, peakAll := peakGFlops(1), peakGFlops(procs)
	b.ResetTimer()
	cpu0 := cpuSeconds()
	for b.Loop() {
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
	cpu := cpuSeconds() - cpu0
	b.StopTimer()
	f := 4 * float64(s.B*s.H*s.N*s.M*s.D)
	if o.Causal {
		f /= 2
	}
	b.ReportMetric(f*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	if cpu > 0 {
		b.ReportMetric(f*float64(b.N)/cpu/1e9, "cpuGFLOP/s")
	}
	b.ReportMetric(math.Round(peak1), "peak1GFLOP/s")
	b.ReportMetric(math.Round(peakAll), "peakGFLOP/s")
}
