package experiment

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/registry"
)

// broken is exact attention that fails (or panics) above limit tokens.
type broken struct {
	limit  int
	panics bool
}

func (broken) Name() string { return "broken" }

func (b broken) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if s.N > b.limit {
		if b.panics {
			panic("index out of range")
		}
		return fmt.Errorf("%w: n = %d > %d", attn.ErrUnsupported, s.N, b.limit)
	}
	return flash.New(flash.Config{}).Forward(ctx, s, q, k, v, o, out, lse)
}

// withBroken is a Lookup that adds "broken" and "panicky" to the registry.
func withBroken() Lookup {
	return func(name string) (registry.Entry, error) {
		switch name {
		case "broken", "panicky":
			b := broken{limit: 20, panics: name == "panicky"}
			return registry.Entry{Name: name, Summary: "test double",
				Build: func(*registry.Params, uint64) (attn.Mechanism, error) { return b, nil }}, nil
		}
		return registry.Lookup(name)
	}
}

// recorder is a Progress that keeps what it hears.
type recorder struct {
	steps []Step
	ends  []string
	notes []string
}

func (r *recorder) Begin(s Step)     { r.steps = append(r.steps, s) }
func (r *recorder) End(note string)  { r.ends = append(r.ends, note) }
func (r *recorder) Note(line string) { r.notes = append(r.notes, line) }

// TestRunBench runs a small prefill sweep as a library call: every row
// is there in the mechanisms' order, errors are measured against exact
// (exact's against ref), one mechanism's failures and panics skip its
// rows without ending the sweep, and progress hears every row with
// forecasts once there are measurements to forecast from.
func TestRunBench(t *testing.T) {
	rec := &recorder{}
	cfg := BenchConfig{Mode: Prefill, Mechs: []string{Ref, "exact", "window", "broken", "panicky"}, Ns: []int{17, 40},
		B: 1, H: 4, HKV: 2, D: 24, Causal: []bool{false, true}, Reps: 2, Seed: 3, Input: eval.Gaussian,
		Settings: Settings{{Mech: "window", Name: "left", Value: "8"}}, MaxErr: 0.1, Lookup: withBroken(), Progress: rec}
	res, err := RunBench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 5*2*2 || len(rec.steps) != len(res.Rows) || len(rec.ends) != len(res.Rows) {
		t.Fatalf("%d rows, %d steps begun, %d ended", len(res.Rows), len(rec.steps), len(rec.ends))
	}
	for i, r := range res.Rows {
		if want := cfg.Mechs[i/4]; r.Mech != want {
			t.Fatalf("row %d is %s, want %s", i, r.Mech, want)
		}
		switch {
		case (r.Mech == "broken" || r.Mech == "panicky") && r.N == 40:
			if !strings.Contains(r.Skipped, "error") {
				t.Errorf("%s n=40: skipped %q", r.Mech, r.Skipped)
			}
		case r.Skipped != "" || r.Seconds <= 0:
			t.Errorf("%s n=%d causal=%v: skipped %q, %g s", r.Mech, r.N, r.Causal, r.Skipped, r.Seconds)
		case r.Mech == "exact" && (r.RelErr == nil || *r.RelErr > 1e-5):
			t.Errorf("exact against ref: %v", r.RelErr)
		case (r.Mech == "broken" || r.Mech == "panicky") && (r.RelErr == nil || *r.RelErr > 1e-6):
			t.Errorf("%s (exact attention) against exact: %v", r.Mech, r.RelErr)
		case r.Mech == "window" && r.Params["left"] != "8":
			t.Errorf("window params %v, want left=8", r.Params)
		}
	}
	// The second length is forecast from the first.
	last := rec.steps[len(rec.steps)-1]
	if last.Index != len(res.Rows) || last.Total != len(res.Rows) || last.Forecast < 0 || last.Rest != 0 {
		t.Errorf("last step %+v", last)
	}
	if res.Bench == nil || !strings.Contains(res.Bench.Summary, "Fastest mechanism") {
		t.Errorf("bench info %+v", res.Bench)
	}
}

func TestRunBenchDecode(t *testing.T) {
	cfg := BenchConfig{Mode: Decode, Mechs: []string{"exact", "window", "linformer"}, Ns: []int{40, 100},
		B: 1, H: 4, D: 16, HKVs: []int{2, 1}, DTypes: []string{"f32", "bf16"}, Causal: []bool{true}, Reps: 2, Input: eval.Gaussian}
	res, err := RunBench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 3*2*2*2 {
		t.Fatalf("%d rows", len(res.Rows))
	}
	for _, r := range res.Rows {
		switch {
		case r.Mech == "linformer":
			if !strings.Contains(r.Skipped, "no decoder") {
				t.Errorf("linformer: %q", r.Skipped)
			}
		case r.Skipped != "" || r.RelErr == nil:
			t.Errorf("%s hkv=%d %s n=%d: %q", r.Mech, r.HKV, r.DType, r.N, r.Skipped)
		case r.Mech == "exact" && (r.DType == "f32" && *r.RelErr > 1e-5 || r.DType == "bf16" && *r.RelErr > 0.02):
			t.Errorf("%s hkv=%d %s: error %g", r.Mech, r.HKV, r.DType, *r.RelErr)
		case r.Mech == "exact" && r.GBps <= 0:
			t.Errorf("exact hkv=%d %s: no GB/s", r.HKV, r.DType)
		}
	}
}

func TestRunBenchErrors(t *testing.T) {
	good := BenchConfig{Mode: Prefill, Mechs: []string{"exact"}, Ns: []int{16}, B: 1, H: 2, D: 8, Causal: []bool{false}, Input: eval.Gaussian}
	for _, c := range []struct {
		change func(*BenchConfig)
		want   string
	}{
		{func(c *BenchConfig) { c.Mode = "fit" }, "want prefill, decode or train"},
		{func(c *BenchConfig) { c.Mechs = []string{"nosuch"} }, "unknown mechanism"},
		{func(c *BenchConfig) { c.Settings = Settings{{Name: "nosuch", Value: "1"}} }, "no selected mechanism"},
		{func(c *BenchConfig) { c.H, c.HKV = 3, 2 }, "multiple"},
		{func(c *BenchConfig) { c.Budget = -1 }, "negative"},
		{func(c *BenchConfig) { c.Input = eval.Model }, "Source"},
		{func(c *BenchConfig) { c.Workers = -1 }, "workers"},
	} {
		cfg := good
		c.change(&cfg)
		res, err := RunBench(context.Background(), cfg)
		if err == nil || res != nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, %v", c.want, res, err)
		}
	}
	// Interrupted: the rows so far, with ctx's error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := RunBench(ctx, good)
	if !errors.Is(err, context.Canceled) || res == nil || len(res.Rows) != 1 || !res.Rows[0].Interrupted {
		t.Errorf("cancelled: %v, %+v", err, res)
	}
}

// TestRunBenchDecodeI4: a 4-bit cache decodes, and its rows count the
// bytes a step reads: the codes and a scale and zero per group of 64.
func TestRunBenchDecodeI4(t *testing.T) {
	cfg := BenchConfig{Mode: Decode, Mechs: []string{"exact"}, Ns: []int{130}, B: 1, H: 4, D: 72,
		HKVs: []int{2}, DTypes: []string{"i4", "f32"}, Causal: []bool{true}, Reps: 2, Input: eval.Gaussian}
	res, err := RunBench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var i4, f32 eval.Row
	for _, r := range res.Rows {
		switch r.DType {
		case "i4":
			i4 = r
		case "f32":
			f32 = r
		}
	}
	if i4.Skipped != "" || i4.RelErr == nil || *i4.RelErr > 0.2 || *i4.RelErr < *f32.RelErr {
		t.Fatalf("i4 row %+v (f32's error %v)", i4, f32.RelErr)
	}
	t.Logf("i4 error %.3g, f32 %.3g", *i4.RelErr, *f32.RelErr)
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 1, M: 130, D: 72}
	// 2·2·130·72 codes of half a byte; keys 2·72 channels × 3 groups of
	// positions, values 2·130 positions × 2 groups of channels, 8 bytes
	// each.
	if got, want := kvBytes(s, kvcache.I4), 2*2*130*72/2+8*(2*72*3+2*130*2); got != want {
		t.Errorf("kvBytes i4 = %d, want %d", got, want)
	}
}

// TestRunBenchTrain times forward and backward passes: every row with a
// backward pass has both times, the ratio between them and a gradient
// error (exact's against the float64 reference's, tiny); one without a
// causal form is skipped with the reason.
func TestRunBenchTrain(t *testing.T) {
	cfg := BenchConfig{Mode: Train, Mechs: []string{"exact", "window", "hyper", "linformer"}, Ns: []int{48, 100},
		B: 1, H: 4, HKV: 2, D: 16, Causal: []bool{true, false}, Reps: 2, Input: eval.Gaussian,
		Settings: Settings{{Mech: "hyper", Name: "min", Value: "0"}, {Mech: "window", Name: "left", Value: "8"}}}
	res, err := RunBench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 4*2*2 {
		t.Fatalf("%d rows", len(res.Rows))
	}
	for _, r := range res.Rows {
		switch {
		case r.Mode != Train:
			t.Errorf("row mode %q", r.Mode)
		case r.Mech == "linformer" && r.Causal:
			if !strings.Contains(r.Skipped, "causal") {
				t.Errorf("causal linformer: %q", r.Skipped)
			}
		case r.Skipped != "":
			t.Errorf("%s n=%d causal=%v: %q", r.Mech, r.N, r.Causal, r.Skipped)
		// Times are only checked for being there: how they compare is the
		// machine's business (a busy core once made a forward median
		// longer than the forward-and-backward one).
		case r.ForwardSeconds <= 0 || r.Seconds <= 0 || !(r.BackwardRatio > 0) || r.RelErr == nil:
			t.Errorf("%s n=%d: seconds %g, forward %g, ratio %g, err %v", r.Mech, r.N, r.Seconds, r.ForwardSeconds, r.BackwardRatio, r.RelErr)
		case r.Mech == "exact" && (*r.RelErr > 1e-5 || r.GFlops <= 0):
			t.Errorf("exact n=%d: gradient error %g against float64, %g GFLOP/s", r.N, *r.RelErr, r.GFlops)
		case r.Mech == "window" && *r.RelErr == 0:
			t.Errorf("window n=%d: gradients equal exact's; the window did nothing", r.N)
		}
	}
}

// TestRunBenchBF16: -dtype bf16 times exact on bfloat16 inputs (on the AMX
// tiles where they run), measured against ref on the same rounded
// inputs; mechanisms without a bfloat16 path are skipped, saying so.
func TestRunBenchBF16(t *testing.T) {
	cfg := BenchConfig{Mode: Prefill, DType: "bf16", Mechs: []string{Ref, "exact", "window"}, Ns: []int{37, 70},
		B: 1, H: 4, HKV: 2, D: 40, Causal: []bool{false, true}, Reps: 1, Seed: 5, Input: eval.Gaussian, MaxErr: 0.1}
	res, err := RunBench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 3*2*2 {
		t.Fatalf("%d rows", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.DType != "bf16" {
			t.Errorf("%s n=%d: dtype %q", r.Mech, r.N, r.DType)
		}
		switch r.Mech {
		case "exact":
			// bfloat16 probabilities: relative errors near 2⁻⁹, far above
			// float32's and far below the bound.
			if r.Skipped != "" || r.RelErr == nil || *r.RelErr > 1e-2 || r.PeakPct != 0 {
				t.Errorf("exact n=%d causal=%v: skipped %q, error %v, peak %v%%", r.N, r.Causal, r.Skipped, r.RelErr, r.PeakPct)
			}
		case "window":
			if !strings.Contains(r.Skipped, "bfloat16") {
				t.Errorf("window ran on bf16: %+v", r)
			}
		}
	}
	cfg.DType = "f16"
	if _, err := RunBench(context.Background(), cfg); !errors.Is(err, attn.ErrInput) {
		t.Errorf("prefill dtype f16: %v, want ErrInput", err)
	}
}
