package eval

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
)

func f64(x float64) *float64 { return &x }

// sampleResults is a small hand-made bench and accuracy run: every mechanism
// at two lengths, full and causal, one row skipped, one that failed.
func sampleResults() *Results {
	r := &Results{
		Version: "9.9.9-test",
		Machine: Machine{CPU: "Test CPU 3000", Threads: 2, PeakGFlops: 100, DRAMGBps: 20, Cores: 2, Kernels: "avx2", OS: "linux", Arch: "amd64", Go: "go1.26"},
		Bench:   &BenchInfo{Command: "attn bench -n 512,1024", Date: "2026-11-30T10:00:00Z", Seconds: 12, Input: Gaussian, MaxErr: 0.1},
	}
	secs := map[string]float64{"ref": 2, "exact": 0.01, "window": 0.002, "performer": 0.004}
	errs := map[string]float64{"exact": 3e-7, "window": 0.5, "performer": 0.05}
	for _, mech := range []string{"ref", "exact", "window", "performer"} {
		for _, causal := range []bool{false, true} {
			for _, n := range []int{512, 1024} {
				f := float64(n) / 512
				row := Row{Mode: "prefill", Mech: mech, B: 1, H: 8, HKV: 8, N: n, M: n, D: 64, Causal: causal,
					DType: "f32", Params: map[string]string{}, Seconds: secs[mech] * f * f, Reps: 3,
					ExtraBytes: uint64(1000 * n)}
				row.SecondsMin, row.SecondsMax = row.Seconds*0.9, row.Seconds*1.1
				if e, ok := errs[mech]; ok {
					row.RelErr, row.SpectralErr, row.MaxRowErr = f64(e), f64(e/2), f64(e*3)
				}
				if mech == "exact" || mech == "ref" {
					row.GFlops = 12.5
				}
				if mech == "exact" {
					row.PeakPct = 12.5
				}
				switch {
				case mech == "ref" && n == 1024:
					row = Row{Mode: row.Mode, Mech: mech, B: 1, H: 8, HKV: 8, N: n, M: n, D: 64, Causal: causal, DType: "f32",
						Params: map[string]string{}, Skipped: "forecast 8 s per call > -ref-budget 1s"}
				case mech == "window" && causal && n == 1024:
					row = Row{Mode: row.Mode, Mech: mech, B: 1, H: 8, HKV: 8, N: n, M: n, D: 64, Causal: causal, DType: "f32",
						Params: map[string]string{"left": "64"}, Skipped: "error: attn: unsupported: window wobbles"}
				}
				r.Rows = append(r.Rows, row)
			}
		}
	}
	r.Bench.Summary = Summarize(r.Rows, r.Bench.MaxErr, Gaussian)
	r.Accuracy = &Accuracy{Command: "attn accuracy", Date: "2026-11-30T10:05:00Z", Input: Planted,
		B: 1, H: 8, HKV: 8, N: 2048, M: 2048, D: 64, Seeds: 2}
	for i, v := range []int{16, 64, 256} {
		e := 0.8 / float64(i+1)
		r.Accuracy.Points = append(r.Accuracy.Points, AccuracyPoint{Sweep: "performer features", Mech: "performer",
			Param: "features", Value: v, Unit: "random features", Params: map[string]string{"features": "16", "min": "0"},
			RelErr: f64(e), RelErrMin: f64(e * 0.9), RelErrMax: f64(e * 1.1), SpectralErr: f64(e / 2), MaxRowErr: f64(e * 2),
			LSERelErr: f64(e / 10), LSEMaxAbs: f64(e), Seconds: 0.001 * float64(i+1), Seeds: 2})
	}
	r.Accuracy.Points = append(r.Accuracy.Points,
		AccuracyPoint{Sweep: "performer features", Mech: "performer", Param: "features", Value: 4096, Params: map[string]string{},
			Skipped: "parameter features=4096 is outside [1, 1024]"},
		AccuracyPoint{Sweep: "linear", Mech: "linear", Params: map[string]string{}, RelErr: f64(0.9), Seconds: 0.002, Seeds: 2})
	return r
}

func TestResultsRoundTrip(t *testing.T) {
	r := sampleResults()
	buf, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(buf, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, &back) {
		t.Errorf("round trip changed the results:\n%+v\n%+v", r, &back)
	}
	// docs/DESIGN.md §5's field names, on the raw JSON.
	var raw map[string]any
	if err := json.Unmarshal(buf, &raw); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"version", "machine", "rows"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("results lack %q", f)
		}
	}
	for _, f := range []string{"cpu", "threads", "peak_gflops", "dram_gbps"} {
		if _, ok := raw["machine"].(map[string]any)[f]; !ok {
			t.Errorf("machine lacks %q", f)
		}
	}
	for i, row := range raw["rows"].([]any) {
		for _, f := range []string{"mode", "mech", "b", "h", "hkv", "n", "m", "d", "causal", "dtype", "params",
			"seconds", "gflops", "gbps", "extra_bytes", "rel_err", "skipped"} {
			if _, ok := row.(map[string]any)[f]; !ok {
				t.Errorf("row %d lacks %q", i, f)
			}
		}
	}
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	if r, err := Load(dir); r != nil || err != nil {
		t.Fatalf("Load of an empty dir: %v, %v", r, err)
	}
	r := sampleResults()
	if err := r.Save(filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	back, err := Load(filepath.Join(dir, "sub"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, back) {
		t.Error("Load(Save(r)) != r")
	}
	if _, err := os.Stat(filepath.Join(dir, "sub", ReportFile)); err != nil {
		t.Error(err)
	}
	os.WriteFile(filepath.Join(dir, ResultsFile), []byte("{not json"), 0o644)
	if _, err := Load(dir); err == nil {
		t.Error("Load of a broken results.json: no error")
	}
}

func TestSetErrorsNonFinite(t *testing.T) {
	var r Row
	r.SetErrors(Errors{Rel: posInf(), MaxRow: posInf(), Spectral: posInf(), LSE: 0.1, LSEMaxAbs: 0.2})
	if r.RelErr != nil || r.Note == "" || r.LSERelErr == nil {
		t.Errorf("non-finite error: %+v", r)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Error(err)
	}
}

func posInf() float64 { x := 0.0; return 1 / x }

func TestReport(t *testing.T) {
	r := sampleResults()
	var buf bytes.Buffer
	if err := WriteReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	for _, want := range []string{"ref", "exact", "window", "performer", "linear", "performer features",
		"Test CPU 3000", "9.9.9-test", "100.0 GFLOP/s", "20.0 GB/s",
		"forecast 8 s per call &gt; -ref-budget 1s", "window wobbles", "data:image/png;base64,", r.Bench.Command} {
		if !strings.Contains(html, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Self-contained: per mask the speed-up, time, error, memory and
	// Pareto plots, then the cost plot and the one sweep with several
	// points, all inline, each named in the page.
	var want []string
	for _, m := range []string{"full", "causal"} {
		for _, kind := range []string{"speedup", "time", "error", "memory", "pareto"} {
			want = append(want, kind+"-prefill-"+m)
		}
	}
	want = append(want, "accuracy-cost", "accuracy-1")
	if got := strings.Count(html, "data:image/png;base64,"); got != len(want) {
		t.Errorf("%d embedded images, want %d", got, len(want))
	}
	for _, name := range want {
		if !strings.Contains(html, `id="fig-`+name+`"`) || !strings.Contains(html, `href="plots/`+name+`.svg"`) {
			t.Errorf("report lacks figure %s or its SVG link", name)
		}
	}
	// A table of contents that reaches every part.
	for _, id := range []string{"machine", "bench", "bench-prefill", "accuracy", "definitions"} {
		if !strings.Contains(html, `href="#`+id+`"`) || !strings.Contains(html, `id="`+id+`"`) {
			t.Errorf("table of contents lacks %s", id)
		}
	}
	if strings.Contains(html, `src="http`) || strings.Contains(html, `href="http`) {
		t.Error("report links outside itself")
	}
}

func TestReportDegenerate(t *testing.T) {
	// One row, an error of 0, everything else skipped: nothing may panic on
	// the logarithmic axes.
	for _, rows := range [][]Row{
		{{Mode: "prefill", Mech: "exact", N: 64, M: 64, B: 1, H: 1, HKV: 1, D: 8, Seconds: 0.001}},
		{{Mode: "prefill", Mech: "exact", N: 64, M: 64, B: 1, H: 1, HKV: 1, D: 8, Seconds: 0.001},
			{Mode: "prefill", Mech: "hyper", N: 64, M: 64, B: 1, H: 1, HKV: 1, D: 8, Seconds: 0.001, RelErr: f64(0)}},
		{{Mode: "prefill", Mech: "exact", N: 64, M: 64, B: 1, H: 1, HKV: 1, D: 8, Skipped: "no"}},
	} {
		r := &Results{Version: "x", Rows: rows, Accuracy: &Accuracy{Points: []AccuracyPoint{{Sweep: "a", Value: 1, RelErr: f64(0), Seconds: 1}}}}
		var buf bytes.Buffer
		if err := WriteReport(&buf, r); err != nil {
			t.Fatal(err)
		}
		var text bytes.Buffer
		WriteBenchTables(&text, r)
		WriteAccuracyTables(&text, r.Accuracy)
	}
}

func TestBenchTables(t *testing.T) {
	r := sampleResults()
	var buf bytes.Buffer
	WriteBenchTables(&buf, r)
	WriteSummary(&buf, r)
	out := buf.String()
	for _, want := range []string{"time per call", "extra memory per call", "relative error", "speed-up over exact",
		"GFLOP/s", "12.5 (12%)", "skip[1]", "[1] ref n=1024 full: forecast 8 s per call > -ref-budget 1s",
		"window n=1024 causal: error: attn: unsupported: window wobbles", "Fastest mechanism", "n=512", "n=1024"} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}
	buf.Reset()
	WriteAccuracyTables(&buf, r.Accuracy)
	for _, want := range []string{"performer features (random features)", "features=4096: parameter", "linear", "default", "planted inputs"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("accuracy tables lack %q:\n%s", want, buf.String())
		}
	}
}

func TestFastest(t *testing.T) {
	row := func(mech string, secs, err float64) Row {
		return Row{Mode: "prefill", Mech: mech, N: 1024, Seconds: secs, SecondsMin: secs * 0.95, RelErr: f64(err)}
	}
	rows := []Row{
		row("ref", 0.001, 0), // the reference never wins
		row("exact", 1, 1e-7),
		row("loose", 0.1, 0.5),  // too wrong
		row("good", 0.5, 0.05),  // the answer
		row("same", 0.97, 0.0),  // within exact's spread: not faster
		row("gone", 0.01, 0.01), // skipped
	}
	rows[5].Skipped = "no"
	best, exact := Fastest(rows, "prefill", false, 1024, 0.1)
	if best == nil || best.Mech != "good" || exact == nil || exact.Mech != "exact" {
		t.Fatalf("Fastest = %v, %v", best, exact)
	}
	best, _ = Fastest(rows, "prefill", false, 1024, 0.01)
	if best.Mech != "exact" {
		t.Errorf("tight bound: %s, want exact", best.Mech)
	}
	best, _ = Fastest(rows, "prefill", false, 1024, 1)
	if best.Mech != "loose" {
		t.Errorf("loose bound: %s, want loose", best.Mech)
	}
	if best, _ := Fastest(rows, "prefill", true, 1024, 1); best != nil {
		t.Errorf("no causal rows: %v", best)
	}
	s := Summarize(rows, 0.1, Gaussian)
	if !strings.Contains(s, "n=1024 good (500 ms, 2.0× faster than exact, error 0.05)") {
		t.Errorf("summary: %s", s)
	}
}

func TestParetoFront(t *testing.T) {
	pts := plotter.XYs{{X: 1, Y: 0.1}, {X: 2, Y: 0.01}, {X: 3, Y: 0.05}, {X: 0.5, Y: 0.5}, {X: 4, Y: 0.001}, {X: 2, Y: 0.2}}
	front := paretoFront(pts)
	slices.Sort(front)
	if want := []int{0, 1, 3, 4}; !slices.Equal(front, want) {
		t.Errorf("front %v, want %v", front, want)
	}
}

// fallbackResults is sampleResults with performer at n=512, full mask,
// having run exact attention: faster than exact and as accurate, as the
// same computation can be by timing noise.
func fallbackResults() *Results {
	r := sampleResults()
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Mech == "performer" && row.N == 512 && !row.Causal {
			row.Fallback = "M = 512 < min = 2048"
			row.Seconds, row.SecondsMin, row.SecondsMax, row.SecondsSD, row.RelErr = 0.001, 0.00099, 0.00101, 0.00001, f64(1e-7)
		}
	}
	r.Bench.Summary = Summarize(r.Rows, r.Bench.MaxErr, Gaussian)
	r.Accuracy.Points[0].Fallback = "M = 2048 < min = 4096"
	return r
}

// TestFallbackRows: a row that fell back is marked in the tables, the
// report and the JSON, is no speed-up and is never the summary's pick or
// on the Pareto front.
func TestFallbackRows(t *testing.T) {
	r := fallbackResults()
	var buf bytes.Buffer
	WriteBenchTables(&buf, r)
	out := buf.String()
	for _, want := range []string{"1 ms ±1%*", "exact*", "ran exact attention instead of the approximation (marked *):",
		"performer n=512 full: M = 512 < min = 2048"} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}
	// Every table but the backward ratio's, the spectral error's and the
	// decode rows' against exact on f32 storage, which these rows lack.
	if strings.Count(out, "*") < len(benchTables)-3 {
		t.Errorf("the fallback row is not marked in every table:\n%s", out)
	}
	if strings.Contains(out, "10×") {
		t.Errorf("the fallback row counts as a speed-up:\n%s", out)
	}
	best, _ := Fastest(r.Rows, "prefill", false, 512, 0.1)
	if best == nil || best.Fallback != "" {
		t.Errorf("Fastest picked %+v", best)
	}
	if !strings.Contains(r.Bench.Summary, "full mask: n=512 exact") {
		t.Errorf("summary picks the fallback row: %s", r.Bench.Summary)
	}
	// Unmarked, the same row would win: the mark is what keeps it out.
	unmarked := slices.Clone(r.Rows)
	for i := range unmarked {
		unmarked[i].Fallback = ""
	}
	if best, _ := Fastest(unmarked, "prefill", false, 512, 0.1); best == nil || best.Mech != "performer" {
		t.Errorf("unmarked, Fastest picked %+v, want the performer row", best)
	}
	buf.Reset()
	WriteAccuracyTables(&buf, r.Accuracy)
	if !strings.Contains(buf.String(), "16*") || !strings.Contains(buf.String(), "performer features: features=16*: M = 2048 < min = 4096") {
		t.Errorf("accuracy tables do not mark the fallback point:\n%s", buf.String())
	}

	buf.Reset()
	if err := WriteReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Rows that ran exact attention instead", "M = 512 &lt; min = 2048", "<td>1 ms ±1%*</td>"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}

	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Rows []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal(js, &raw); err != nil {
		t.Fatal(err)
	}
	marked := 0
	for i, row := range raw.Rows {
		if fb, ok := row["fallback"]; ok {
			marked++
			if fb != r.Rows[i].Fallback || r.Rows[i].Fallback == "" {
				t.Errorf("row %d: fallback %v", i, fb)
			}
		}
	}
	if marked != 1 {
		t.Errorf("%d rows carry \"fallback\", want 1 (absent where the approximation ran)", marked)
	}

	// The front leaves out the point that fell back, though it dominates.
	xys := plotter.XYs{{X: 1, Y: 0.1}, {X: 0.5, Y: 1e-7}, {X: 2, Y: 0.01}}
	front := frontOf(xys, []bool{false, true, false})
	if want := (plotter.XYs{{X: 1, Y: 0.1}, {X: 2, Y: 0.01}}); !slices.Equal(front, want) {
		t.Errorf("front %v, want %v", front, want)
	}
}
