package main

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/attnkit/attn/cmd/experiment"
)

// TestProgressForecast: the bar advances by the forecast work, not by
// steps, and shows the time left and the finish time.
func TestProgressForecast(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, 0, 0)
	p.tty = true
	p.start = time.Now().Add(-10 * time.Second)
	// Step 2 of 10, but the forecasts say 10 s spent of 10+30 s.
	p.Begin(experiment.Step{Label: "window n=4096 full", Index: 2, Total: 10, Forecast: 10, Rest: 20})
	frac, left, known := p.fraction(time.Now())
	if !known || frac < 0.24 || frac > 0.26 || left < 29 || left > 31 {
		t.Errorf("fraction %.3f, left %.1f s, known %v; want 0.25 and 30 s", frac, left, known)
	}
	// As the step runs, what is left shrinks with it.
	p.stepStart = p.stepStart.Add(-4 * time.Second)
	if _, left, _ := p.fraction(time.Now()); left < 25 || left > 27 {
		t.Errorf("4 s into the step: %.1f s left, want 26", left)
	}
	out := buf.String()
	if !strings.Contains(out, "[######..................] 0/10 window n=4096 full  10s, ~30s left (done ") {
		t.Errorf("bar %q", out)
	}
	// Without forecasts, the count of steps.
	p.Begin(experiment.Step{Label: "x", Index: 3, Total: 10, Forecast: -1, Rest: -1})
	p.done = 5
	if frac, _, known := p.fraction(time.Now()); known || frac != 0.5 {
		t.Errorf("by count: %v %v", frac, known)
	}
}

// TestProgressRedrawNoAlloc: a redraw during a measured call allocates
// nothing, so that it adds nothing to the bytes counted for the call.
func TestProgressRedrawNoAlloc(t *testing.T) {
	f, err := os.Create(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := newProgress(f, 0, 8*time.Minute)
	p.tty = true
	p.Begin(experiment.Step{Label: "hyper n=16384 causal", Index: 7, Total: 40, Forecast: 12, Rest: 300})
	p.finish()
	if a := testing.AllocsPerRun(100, func() {
		p.mu.Lock()
		p.redraw()
		p.mu.Unlock()
	}); a != 0 {
		t.Errorf("redraw allocates %v times", a)
	}
}

// TestProgressTicks: on a terminal the bar is redrawn during a long step.
func TestProgressTicks(t *testing.T) {
	defer func(d time.Duration) { redrawEvery = d }(redrawEvery)
	redrawEvery = 20 * time.Millisecond
	var buf syncBuffer
	p := newProgress(&buf, 0, 0)
	p.tty = true
	p.Begin(experiment.Step{Label: "slow", Index: 1, Total: 1, Forecast: 5, Rest: 0})
	// The ticker's redraws come however slowly a loaded machine runs
	// them: wait for two after Begin's own, for much longer than their
	// period, instead of counting the draws of a fixed sleep.
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(buf.String(), "slow") < 3 && time.Now().Before(deadline) {
		time.Sleep(redrawEvery)
	}
	p.finish()
	if n := strings.Count(buf.String(), "slow"); n < 3 {
		t.Errorf("%d draws in 10s of a %v redraw period: %q", n, redrawEvery, buf.String())
	}
}

// syncBuffer is a bytes.Buffer safe for the ticker's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestProgressOnce: a note or a step's ending repeated word for word is
// printed once (linformer cannot be causal, at every length).
func TestProgressOnce(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, 0, 0)
	for _, n := range []string{"512", "1024", "2048"} {
		p.begin("linformer n=" + n + " causal")
		p.End("skipped: error: linformer cannot be causal")
		p.Note("layer 2 (hyper): ran exact attention")
	}
	p.finish()
	out := buf.String()
	if c := strings.Count(out, "linformer cannot be causal"); c != 1 {
		t.Errorf("the skip printed %d times:\n%s", c, out)
	}
	if c := strings.Count(out, "ran exact attention"); c != 1 {
		t.Errorf("the note printed %d times:\n%s", c, out)
	}
	if !strings.Contains(out, "[3/0] linformer n=2048 causal: as above") && !strings.Contains(out, "linformer n=2048 causal: as above") {
		t.Errorf("the repeated step is not counted:\n%s", out)
	}
}
