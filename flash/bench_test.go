package flash

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/ref"
)

// cpuSeconds is the CPU time (user and system) this process has used.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)*1e-6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// peakGFlops is the FMA peak of workers cores together in GFLOP/s: the
// best of a few runs of simd.MeasurePeakGFlops, each the median of many
// short bursts, so that a burst of activity elsewhere on the machine
// does not lower it.
func peakGFlops(workers int) float64 {
	best := 0.0
	for range 4 {
		best = max(best, simd.MeasurePeakGFlops(workers, 30*time.Millisecond))
	}
	return best
}

// BenchmarkForward reports GFLOP/s with the conventional count
// 4·B·H·N·M·D, halved when causal, for B=1, H=8 and N=M, and its share of
// the FMA peak (simd.FMAPeak through simd.MeasurePeakGFlops, with the
// kernels in use: under the purego tag, scalar Go) measured in the same
// process, before and after each case:
//
//   - GFLOP/s is the rate over wall-clock time and wall%peak its share of
//     the peak of GOMAXPROCS cores together;
//   - cpuGFLOP/s is the rate per second of CPU time the process used
//     (all workers together) and %peak its share of the peak of one
//     core: the efficiency of the cores while the kernel ran on them;
//   - best%peak is wall%peak for the call that took the least wall-clock
//     time: the share the cores reach when nothing else runs. (The CPU
//     time of one short call of several threads is too coarse for it:
//     Linux splits it between user and system time by ticks, and can
//     report less than the call used.)
//
// On a quiet machine, with every worker busy to the end, the two shares
// agree. On a machine shared with other processes the wall-clock rate
// falls with the share of the cores the process gets, while %peak does
// not (the peak is itself measured in short bursts that the other
// processes do not slow down); it then also hides any time a worker
// waits for the others at the end of a call. Neither hides a slowdown of
// the cores themselves, such as another virtual machine running on the
// same physical core: that shows as a lower %peak, as the peak loop
// (registers only) suffers less from it than the kernel.
//
// The sizes run with -short are N = 1024 and 2048 only.
func BenchmarkForward(b *testing.B) {
	ns := []int{1024, 2048, 4096, 8192}
	if testing.Short() {
		ns = ns[:2]
	}
	for _, d := range []int{64, 128} {
		for _, n := range ns {
			for _, causal := range []bool{false, true} {
				s := attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: d}
				name := fmt.Sprintf("d%d/n%d/causal=%v", d, n, causal)
				b.Run(name, func(b *testing.B) {
					benchForward(b, s, attn.Options{Causal: causal})
				})
			}
		}
	}
}

func benchForward(b *testing.B, s attn.Shape, o attn.Options) {
	rng := rand.New(rand.NewPCG(1, 2))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	kn := New(Config{})
	ctx := context.Background()
	// One untimed call: page in the buffers.
	if err := kn.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
		b.Fatal(err)
	}
	procs := runtime.GOMAXPROCS(0)
	peak1, peakAll := peakGFlops(1), peakGFlops(procs)
	b.ResetTimer()
	cpu0 := cpuSeconds()
	best := math.Inf(1)
	for b.Loop() {
		t0 := time.Now()
		if err := kn.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
			b.Fatal(err)
		}
		best = min(best, time.Since(t0).Seconds())
	}
	cpu := cpuSeconds() - cpu0
	b.StopTimer()
	peak1, peakAll = max(peak1, peakGFlops(1)), max(peakAll, peakGFlops(procs))
	f := 4 * float64(s.B*s.H*s.N*s.M*s.D)
	if o.Causal {
		f /= 2
	}
	wall := f * float64(b.N) / b.Elapsed().Seconds() / 1e9
	b.ReportMetric(wall, "GFLOP/s")
	b.ReportMetric(100*wall/peakAll, "wall%peak")
	if cpu > 0 {
		perCPU := f * float64(b.N) / cpu / 1e9
		b.ReportMetric(perCPU, "cpuGFLOP/s")
		b.ReportMetric(100*perCPU/peak1, "%peak")
	}
	if best > 0 && !math.IsInf(best, 1) {
		b.ReportMetric(100*f/best/1e9/peakAll, "best%peak")
	}
	b.ReportMetric(peak1, "peak1GFLOP/s")
}
