package eval

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/attnkit/attn"
)

var sink []byte

func TestMeasureCountsCallsAndBytes(t *testing.T) {
	calls := 0
	const size = 1 << 20
	m, err := Measure(context.Background(), TimeConfig{Reps: 3}, func() error {
		calls++
		sink = make([]byte, size)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 4 || len(m.Samples) != 3 || m.FromWarmup {
		t.Errorf("%d calls, %d samples, from warm-up %v; want 4, 3, false", calls, len(m.Samples), m.FromWarmup)
	}
	// The one allocation, give or take the runtime's own small change.
	if m.ExtraBytes < size || m.ExtraBytes > size+64<<10 {
		t.Errorf("ExtraBytes = %d, want about %d", m.ExtraBytes, size)
	}
	if !(m.Min <= m.Median && m.Median <= m.Max) || m.Spread() < 0 {
		t.Errorf("summary %+v out of order", m)
	}
}

func TestMeasureNoAllocation(t *testing.T) {
	x := 0
	m, err := Measure(context.Background(), TimeConfig{Reps: 1}, func() error { x++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if m.ExtraBytes > 1<<10 {
		t.Errorf("a call that allocates nothing: ExtraBytes = %d", m.ExtraBytes)
	}
}

func TestMeasureSlowCallOnce(t *testing.T) {
	calls := 0
	m, err := Measure(context.Background(), TimeConfig{Reps: 5, MaxTime: time.Nanosecond}, func() error {
		calls++
		time.Sleep(time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || !m.FromWarmup || len(m.Samples) != 1 || m.Median < 1e-3 {
		t.Errorf("%d calls, %+v; want the warm-up call as the only sample", calls, m)
	}
}

func TestMeasureErrors(t *testing.T) {
	boom := errors.New("boom")
	if _, err := Measure(context.Background(), TimeConfig{}, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("error: got %v", err)
	}
	_, err := Measure(context.Background(), TimeConfig{}, func() error { panic("kaput") })
	if err == nil || !strings.Contains(err.Error(), "panic: kaput") {
		t.Errorf("panic: got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Measure(ctx, TimeConfig{}, func() error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v", err)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		x    []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{1, 5}, 3}, {[]float64{1, 2, 9}, 2}} {
		if got := Median(c.x); got != c.want {
			t.Errorf("Median(%v) = %g, want %g", c.x, got, c.want)
		}
	}
}

func TestExactFlops(t *testing.T) {
	s := attn.Shape{B: 2, H: 8, HKV: 2, N: 512, M: 1024, D: 64}
	want := 4.0 * 2 * 8 * 512 * 1024 * 64
	if got := ExactFlops(s, false); got != want {
		t.Errorf("ExactFlops = %g, want %g", got, want)
	}
	if got := ExactFlops(s, true); got != want/2 {
		t.Errorf("causal ExactFlops = %g, want %g", got, want/2)
	}
	if got := GFlops(2e9, 0.5); got != 4 {
		t.Errorf("GFlops = %g, want 4", got)
	}
}

func TestGrowth(t *testing.T) {
	var g Growth
	if _, ok := g.Seconds(512); ok {
		t.Error("forecast from nothing")
	}
	g.Add(512, 1, 1000)
	// One length: quadratic.
	if s, _ := g.Seconds(1024); !near(s, 4, 1e-12) {
		t.Errorf("one point: %g s, want 4", s)
	}
	if b, _ := g.Bytes(2048); !near(b, 16000, 1e-12) {
		t.Errorf("one point: %g bytes, want 16000", b)
	}
	// Two lengths on a linear law: linear.
	g.Add(1024, 2, 1000)
	if s, _ := g.Seconds(4096); !near(s, 8, 1e-12) {
		t.Errorf("linear: %g s, want 8", s)
	}
	// Constant memory stays constant; time never forecast to shrink per token.
	if b, _ := g.Bytes(4096); !near(b, 1000, 1e-12) {
		t.Errorf("constant: %g bytes, want 1000", b)
	}
	var c Growth
	c.Add(100, 1, 0)
	c.Add(200, 1, 0)
	if s, _ := c.Seconds(400); !near(s, 2, 1e-12) {
		t.Errorf("flat time: %g s, want the linear 2", s)
	}
	// Cubic data is clamped to n^2.5.
	var q Growth
	q.Add(100, 1, 0)
	q.Add(200, 8, 0)
	if s, _ := q.Seconds(400); !near(s, 8*math.Pow(2, 2.5), 1e-12) {
		t.Errorf("cubic: %g s, want %g", s, 8*math.Pow(2, 2.5))
	}
	// A measured length is returned as measured; one below all is unknown.
	if s, ok := g.Seconds(512); !ok || s != 1 {
		t.Errorf("measured length: %g %v", s, ok)
	}
	if _, ok := g.Seconds(100); ok {
		t.Error("forecast below every measured length")
	}
}

func TestStddev(t *testing.T) {
	for _, c := range []struct {
		x    []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 0}, {[]float64{1, 3}, math.Sqrt2}, {[]float64{2, 4, 4, 4, 5, 5, 7, 9}, math.Sqrt(32.0 / 7)}} {
		if got := stddev(c.x); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("stddev(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}
