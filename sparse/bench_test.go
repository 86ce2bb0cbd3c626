package sparse

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// benchShape is the shape of `attn bench`'s default rows: one batch row,
// 8 heads of 64.
func benchShape(n int) attn.Shape { return attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: 64} }

func benchInputs(s attn.Shape) (q, k, v, out, lse []float32) {
	rng := rand.New(rand.NewPCG(1, 2))
	return ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen()),
		make([]float32, s.QLen()), make([]float32, s.LSELen())
}

func benchMech(b *testing.B, m attn.Mechanism, s attn.Shape, causal bool) {
	q, k, v, out, lse := benchInputs(s)
	o := attn.Options{Causal: causal}
	ctx := context.Background()
	b.SetBytes(int64(4 * (s.QLen()*2 + s.KVLen()*2)))
	for b.Loop() {
		if err := m.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWindow times a causal window of 64 keys (left 64) as N doubles:
// the time per doubling should stay near 2.
func BenchmarkWindow(b *testing.B) {
	w, err := NewWindow(WindowConfig{Left: 64})
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{4096, 8192, 16384, 32768, 65536} {
		b.Run(fmt.Sprintf("n%d", n), func(b *testing.B) { benchMech(b, w, benchShape(n), true) })
	}
}

// BenchmarkMechanisms times every mechanism at its defaults and exact
// attention at N = 4096, causal and not.
func BenchmarkMechanisms(b *testing.B) {
	mechs := []func() (attn.Mechanism, error){
		func() (attn.Mechanism, error) { return flash.New(flash.Config{}), nil },
		func() (attn.Mechanism, error) { return NewWindow(WindowConfig{}) },
		func() (attn.Mechanism, error) { return NewWindow(WindowConfig{Left: 256, Dilation: 4}) },
		func() (attn.Mechanism, error) { return NewStrided(StridedConfig{}) },
		func() (attn.Mechanism, error) { return NewStrided(StridedConfig{Mode: ModeFixed}) },
		func() (attn.Mechanism, error) { return NewLongformer(LongformerConfig{}) },
		func() (attn.Mechanism, error) { return NewBigBird(BigBirdConfig{}) },
	}
	for i, mk := range mechs {
		m, err := mk()
		if err != nil {
			b.Fatal(err)
		}
		for _, causal := range []bool{false, true} {
			b.Run(fmt.Sprintf("%d-%s/causal=%v", i, m.Name(), causal), func(b *testing.B) {
				benchMech(b, m, benchShape(4096), causal)
			})
		}
	}
}

// minTime returns the shortest wall time and the shortest CPU time of
// reps calls of m: the least disturbed by other load on the machine.
func minTime(b *testing.B, m attn.Mechanism, s attn.Shape, o attn.Options, q, k, v, out, lse []float32, reps int) (wall, cpu time.Duration) {
	wall, cpu = time.Duration(1<<63-1), time.Duration(1<<63-1)
	for range reps {
		t0, c0 := time.Now(), cpuTime()
		if err := m.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
			b.Fatal(err)
		}
		wall, cpu = min(wall, time.Since(t0)), min(cpu, cpuTime()-c0)
	}
	return wall, cpu
}

// BenchmarkWindowSpeedup times a window-64 layer (left 64 and right 64:
// causal, the 64 keys before each query) and exact attention at N = 4096
// in the same run, in turns, and reports how many times faster the window
// is (target: >= 10), by wall time and by CPU time (which other load on
// the machine disturbs less).
func BenchmarkWindowSpeedup(b *testing.B) {
	s := benchShape(4096)
	q, k, v, out, lse := benchInputs(s)
	w, err := NewWindow(WindowConfig{})
	if err != nil {
		b.Fatal(err)
	}
	exact := flash.New(flash.Config{})
	for _, causal := range []bool{false, true} {
		b.Run(fmt.Sprintf("causal=%v", causal), func(b *testing.B) {
			o := attn.Options{Causal: causal}
			inf := time.Duration(1<<63 - 1)
			var ww, wc, ew, ec time.Duration
			for b.Loop() {
				ww, wc, ew, ec = inf, inf, inf, inf
				for range 3 {
					a, c := minTime(b, w, s, o, q, k, v, out, lse, 3)
					ww, wc = min(ww, a), min(wc, c)
					a, c = minTime(b, exact, s, o, q, k, v, out, lse, 1)
					ew, ec = min(ew, a), min(ec, c)
				}
			}
			b.ReportMetric(float64(ew)/float64(ww), "x-faster-wall")
			if wc > 0 {
				b.ReportMetric(float64(ec)/float64(wc), "x-faster-cpu")
			}
			b.ReportMetric(ww.Seconds(), "window-s")
			b.ReportMetric(ew.Seconds(), "exact-s")
		})
	}
}

// BenchmarkWindowScaling times a window-64 layer (left 64, causal) at N =
// 4k, 8k, …, 64k and reports the ratio of the times of consecutive lengths
// and the largest one (target: <= 2.2 per doubling), by wall time and by
// CPU time. The lengths are timed in turns, the shortest of several turns
// kept, so that a burst of other load does not land on one length only.
func BenchmarkWindowScaling(b *testing.B) {
	w, err := NewWindow(WindowConfig{Left: 64})
	if err != nil {
		b.Fatal(err)
	}
	ns := []int{4096, 8192, 16384, 32768, 65536}
	type input struct{ q, k, v, out, lse []float32 }
	in := make([]input, len(ns))
	for i, n := range ns {
		q, k, v, out, lse := benchInputs(benchShape(n))
		in[i] = input{q, k, v, out, lse}
	}
	o := attn.Options{Causal: true}
	wall := make([]time.Duration, len(ns))
	cpu := make([]time.Duration, len(ns))
	for b.Loop() {
		for i := range ns {
			wall[i], cpu[i] = time.Duration(1<<63-1), time.Duration(1<<63-1)
		}
		for range 5 {
			for i, n := range ns {
				x := in[i]
				a, c := minTime(b, w, benchShape(n), o, x.q, x.k, x.v, x.out, x.lse, 1)
				wall[i], cpu[i] = min(wall[i], a), min(cpu[i], c)
			}
		}
	}
	report := func(ts []time.Duration, unit string) {
		if ts[0] <= 0 {
			return
		}
		worst := 0.0
		for i := 1; i < len(ns); i++ {
			r := float64(ts[i]) / float64(ts[i-1])
			worst = max(worst, r)
			b.ReportMetric(r, fmt.Sprintf("%s-ratio-%dk", unit, ns[i]/1024))
		}
		b.ReportMetric(worst, unit+"-worst-ratio")
		b.ReportMetric(ts[0].Seconds(), unit+"-s-4k")
		b.ReportMetric(ts[len(ts)-1].Seconds(), unit+"-s-64k")
	}
	report(wall, "wall")
	report(cpu, "cpu")
}
