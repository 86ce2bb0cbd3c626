package experiment

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/registry"
)

// TestPlanPoints checks how a point's settings are put together: the
// sweep's fixed ones, overridden by Settings, overridden by the swept
// value; names the mechanism does not know are dropped. Its params are
// every parameter in effect, defaults included.
func TestPlanPoints(t *testing.T) {
	perf, err := registry.Lookup("performer")
	if err != nil {
		t.Fatal(err)
	}
	sweeps := eval.SweepsFor(perf)
	if len(sweeps[0].Params) == 0 {
		t.Fatal("no performer sweep in the registry")
	}
	param := sweeps[0].Params[0]
	set, err := ParseSettings([]string{"min=7", param + "=3", "performer:kind=trig", "window=9"})
	if err != nil {
		t.Fatal(err)
	}
	points, err := planPoints([]string{"performer"}, set, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	var values []int
	for _, p := range points {
		if p.sweep.Name() != sweeps[0].Name() {
			continue
		}
		values = append(values, p.value)
		want, err := registry.Effective("performer", []string{"min=7", param + "=" + strconv.Itoa(p.value), "kind=trig"}, true)
		if err != nil {
			t.Fatal(err)
		}
		if want["min"] != "7" || want["kind"] != "trig" || want["chunk"] == "" {
			t.Fatalf("effective %v", want)
		}
		if len(p.params) != len(want) {
			t.Errorf("point %d: params %v, want %v", p.value, p.params, want)
		}
		for k, v := range want {
			if p.params[k] != v {
				t.Errorf("point %d: %s=%q, want %q", p.value, k, p.params[k], v)
			}
		}
	}
	if !slices.Equal(values, sweeps[0].Values) {
		t.Errorf("values %v, want %v", values, sweeps[0].Values)
	}
	// A mechanism without the swept parameter gets one skipped point.
	bare := func(name string) (registry.Entry, error) {
		return registry.Entry{Name: "performer", Build: perf.Build, Sweeps: perf.Sweeps}, nil
	}
	points, err = planPoints([]string{"performer"}, nil, false, bare)
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != len(sweeps) || !strings.Contains(points[0].skipped, "has no parameter") {
		t.Errorf("points without the parameter: %d, %q", len(points), points[0].skipped)
	}
}

// TestRunAccuracy runs the sweeps of two mechanisms as a library call, on
// odd sizes: errors shrink as the budget grows, a failing mechanism is
// skipped with the reason, and progress hears each point with a forecast.
func TestRunAccuracy(t *testing.T) {
	rec := &recorder{}
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 45, M: 45, D: 12}
	acc, err := RunAccuracy(context.Background(), AccuracyConfig{Mechs: []string{"window", "broken"}, Shape: s,
		Options: attn.Options{Causal: true}, Input: eval.Gaussian, Seeds: 2, Seed: 5, Lookup: withBroken(), Progress: rec})
	if err != nil {
		t.Fatal(err)
	}
	if acc.N != 45 || acc.Seeds != 2 || len(rec.steps) != 2*len(acc.Points) {
		t.Fatalf("accuracy %+v, %d steps", acc, len(rec.steps))
	}
	var window []float64
	for _, p := range acc.Points {
		switch {
		case p.Mech == "broken":
			if !strings.Contains(p.Skipped, "error") {
				t.Errorf("broken: %q", p.Skipped)
			}
		case p.Mech == "window" && p.Skipped == "" && p.Fallback == "":
			if p.RelErr == nil || p.Seeds != 2 {
				t.Errorf("window %s=%d: %+v", p.Param, p.Value, p)
			} else if p.Sweep == acc.Points[0].Sweep {
				window = append(window, *p.RelErr)
			}
		}
	}
	if len(window) < 2 || window[len(window)-1] > window[0] {
		t.Errorf("window's error does not shrink as its window grows: %v", window)
	}
	for _, st := range rec.steps {
		if st.Forecast < 0 || st.Rest < 0 {
			t.Errorf("step %+v has no forecast", st)
		}
	}
}
