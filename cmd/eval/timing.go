package eval

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/attnkit/attn"
)

// TimeConfig says how Measure repeats a call. The zero value warms up with
// one call and times five more with no time limit.
type TimeConfig struct {
	// Reps is the most timed calls after the warm-up; 0 means 5.
	Reps int
	// MaxTime stops the repetitions once the warm-up and the timed calls
	// so far have taken this long; 0 means no limit. At least one call is
	// timed after the warm-up unless the warm-up alone took MaxTime: then
	// the warm-up call is the only sample (Measurement.FromWarmup).
	MaxTime time.Duration
}

// Measurement is what Measure found.
type Measurement struct {
	// Samples are the durations of the timed calls in seconds, sorted.
	Samples []float64
	// Median, Min and Max summarise Samples; SD is their standard
	// deviation (0 for one sample).
	Median, Min, Max, SD float64
	// FromWarmup reports that the warm-up call was too slow to repeat
	// within MaxTime and is the only sample.
	FromWarmup bool
	// ExtraBytes and Allocs are the bytes and objects the warm-up call
	// allocated on the Go heap.
	ExtraBytes, Allocs uint64
}

// Spread is (Max−Min)/Median, the relative range of the samples.
func (m Measurement) Spread() float64 {
	if m.Median == 0 {
		return 0
	}
	return (m.Max - m.Min) / m.Median
}

// Measure warms up with one call of f, counting what it allocates, then
// times up to cfg.Reps further calls. An error or panic of f, or ctx ending
// between calls, stops it with that error.
func Measure(ctx context.Context, cfg TimeConfig, f func() error) (Measurement, error) {
	reps := cfg.Reps
	if reps <= 0 {
		reps = 5
	}
	var m Measurement
	if err := ctx.Err(); err != nil {
		return m, err
	}
	// A collection now keeps the previous row's garbage from being
	// collected, and timed, inside this one.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	if err := Guard(f); err != nil {
		return m, err
	}
	warm := time.Since(t0)
	runtime.ReadMemStats(&after)
	m.ExtraBytes = after.TotalAlloc - before.TotalAlloc
	m.Allocs = after.Mallocs - before.Mallocs

	spent := warm
	for range reps {
		if cfg.MaxTime > 0 && spent >= cfg.MaxTime && (len(m.Samples) > 0 || warm >= cfg.MaxTime) {
			break
		}
		if err := ctx.Err(); err != nil {
			return m, err
		}
		t := time.Now()
		if err := Guard(f); err != nil {
			return m, err
		}
		d := time.Since(t)
		spent += d
		m.Samples = append(m.Samples, d.Seconds())
	}
	if len(m.Samples) == 0 {
		m.Samples = []float64{warm.Seconds()}
		m.FromWarmup = true
	}
	slices.Sort(m.Samples)
	m.Min, m.Max = m.Samples[0], m.Samples[len(m.Samples)-1]
	m.Median = Median(m.Samples)
	m.SD = stddev(m.Samples)
	return m, nil
}

// Guard calls f and turns a panic into an error, so that one broken
// mechanism cannot end a sweep: the one panic recovery of the sweeps.
func Guard(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f()
}

// stddev is the sample standard deviation of x, 0 for fewer than two.
func stddev(x []float64) float64 {
	if len(x) < 2 {
		return 0
	}
	mean := 0.0
	for _, v := range x {
		mean += v
	}
	mean /= float64(len(x))
	ss := 0.0
	for _, v := range x {
		ss += (v - mean) * (v - mean)
	}
	return math.Sqrt(ss / float64(len(x)-1))
}

// Median returns the median of sorted x (the mean of the middle two for an
// even count), or 0 for none.
func Median(x []float64) float64 {
	n := len(x)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return x[n/2]
	}
	return (x[n/2-1] + x[n/2]) / 2
}

// ExactFlops is the conventional flop count of exact attention for shape s:
// 4·B·H·N·M·D (two matrix products of 2·N·M·D each per head), half of it
// under a causal mask.
func ExactFlops(s attn.Shape, causal bool) float64 {
	f := 4 * float64(s.B) * float64(s.H) * float64(s.N) * float64(s.M) * float64(s.D)
	if causal {
		f /= 2
	}
	return f
}

// GFlops returns flops per second in units of 1e9, or 0 for no time.
func GFlops(flops, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return flops / seconds / 1e9
}
