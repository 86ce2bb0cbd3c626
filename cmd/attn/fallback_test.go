package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/registry"
)

// fallsBack is exact attention that says it is the exact fallback of an
// approximation below min queries: a stand-in for the mechanisms that run
// exact attention on short inputs, independent of when they say so.
type fallsBack struct{ min int }

func (fallsBack) Name() string { return "fallsback" }

func (fallsBack) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	return flash.New(flash.Config{}).Forward(ctx, s, q, k, v, o, out, lse)
}

func (f fallsBack) Fallback(s attn.Shape, o attn.Options) string {
	if s.N < f.min {
		return fmt.Sprintf("N = %d < min = %d", s.N, f.min)
	}
	return ""
}

// fallsBackEntry registers fallsBack with one parameter, min (default 32).
var fallsBackEntry = registry.Entry{
	Name: "fallsback", Summary: "test double",
	Params: []registry.Param{{Name: "min", Kind: registry.KindInt, Default: "32", Lo: 0, Hi: 1 << 20, Doc: "fallback length"}},
	Build: func(p *registry.Params, _ uint64) (attn.Mechanism, error) {
		m, err := p.Int("min")
		return fallsBack{m}, err
	},
}

// decodes is exact attention with a decoder of its own (kvcache's), so
// that the decode benchmark fills it through Step rather than straight
// into the cache.
type decodes struct{ fallsBack }

func (decodes) Name() string { return "decodes" }

func (decodes) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	d, err := kvcache.NewDecoder(cfg)
	if err != nil {
		return nil, err
	}
	return stepOnly{d}, nil
}

// stepOnly hides the kvcache.Decoder's type, and says it is the exact
// fallback of some decoder for steps onto fewer than 100 positions.
type stepOnly struct{ attn.Decoder }

func (stepOnly) Fallback(s attn.Shape, o attn.Options) string {
	if s.M < 100 {
		return fmt.Sprintf("M = %d < 100", s.M)
	}
	return ""
}

var decodesEntry = registry.Entry{
	Name: "decodes", Summary: "test double", Decode: true,
	Build: func(*registry.Params, uint64) (attn.Mechanism, error) { return decodes{}, nil },
}

// TestBenchFallback: rows where the mechanism ran exact attention carry
// the reason in "fallback", are marked in the tables and are no speed-up;
// every row lists its parameters, defaults included.
func TestBenchFallback(t *testing.T) {
	withFakes(t, fallsBackEntry)
	for _, c := range []struct {
		set  []string
		min  string
		fell []int // lengths that fall back
	}{{nil, "32", []int{17}}, {[]string{"-set", "min=10"}, "10", nil}, {[]string{"-set", "min=50"}, "50", []int{17, 40}}} {
		dir := t.TempDir()
		args := append([]string{"bench", "-mech", "exact,fallsback", "-n", "17,40", "-heads", "2", "-d", "8", "-reps", "1",
			"-probe=false", "-accuracy-n", "0", "-out", dir}, c.set...)
		code, stdout, stderr := attnCmd(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.set, code, stderr)
		}
		res, raw := readResults(t, dir)
		for i, r := range res.Rows {
			fb, has := raw["rows"].([]any)[i].(map[string]any)["fallback"]
			want := r.Mech == "fallsback" && slices.Contains(c.fell, r.N)
			if has != want || (want && fb != fmt.Sprintf("N = %d < min = %s", r.N, c.min)) {
				t.Errorf("%v: %s n=%d: fallback %v (present %v), want present %v", c.set, r.Mech, r.N, fb, has, want)
			}
			if r.Mech == "fallsback" && (len(r.Params) != 1 || r.Params["min"] != c.min) {
				t.Errorf("%v: params %v, want min=%s", c.set, r.Params, c.min)
			}
		}
		marked := strings.Contains(stdout, "ran exact attention instead of the approximation (marked *):")
		if marked != (len(c.fell) > 0) {
			t.Errorf("%v: tables mark fallbacks: %v\n%s", c.set, marked, stdout)
		}
		for _, n := range c.fell {
			for _, causal := range []string{"full", "causal"} {
				if want := fmt.Sprintf("fallsback n=%d %s: N = %d < min = %s", n, causal, n, c.min); !strings.Contains(stdout, want) {
					t.Errorf("%v: stdout lacks %q:\n%s", c.set, want, stdout)
				}
			}
		}
		if strings.Contains(res.Bench.Summary, "n=17 fallsback") && slices.Contains(c.fell, 17) {
			t.Errorf("the summary counts a fallback row: %s", res.Bench.Summary)
		}
	}
}

// TestBenchParams: a real mechanism's rows list every parameter in
// effect, the -set ones and the defaults, the causal ones under the mask.
func TestBenchParams(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := attnCmd(t, "bench", "-mech", "window,performer", "-set", "left=8", "-n", "16", "-heads", "2", "-d", "8",
		"-reps", "1", "-probe=false", "-accuracy-n", "0", "-out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	res, _ := readResults(t, dir)
	for _, r := range res.Rows {
		want := map[string]string{"left": "8", "right": "64", "dilation": "1"}
		if r.Mech == "performer" {
			var err error
			if want, err = registry.Effective("performer", nil, r.Causal); err != nil {
				t.Fatal(err)
			}
		}
		if fmt.Sprint(r.Params) != fmt.Sprint(want) {
			t.Errorf("%s causal=%v: params %v, want %v", r.Mech, r.Causal, r.Params, want)
		}
	}
}

// TestRunFallback: attn run says on stderr when the mechanism ran exact
// attention, and says nothing when it did not.
func TestRunFallback(t *testing.T) {
	withFakes(t, fallsBackEntry)
	dir := t.TempDir()
	q := writeNPY(t, dir, "q.npy", []int{1, 2, 3, 4}, make([]float32, 24))
	k := writeNPY(t, dir, "k.npy", []int{1, 1, 5, 4}, make([]float32, 20))
	o := filepath.Join(dir, "o.npy")
	for _, c := range []struct {
		set, want string
	}{{"min=4", "fallsback: ran exact attention: N = 3 < min = 4\n"}, {"min=3", ""}} {
		code, _, stderr := attnCmd(t, "run", "-mech", "fallsback", "-set", c.set, "-q", q, "-k", k, "-v", k, "-o", o)
		if code != 0 || stderr != c.want {
			t.Errorf("-set %s: exit %d, stderr %q, want %q", c.set, code, stderr, c.want)
		}
	}
}

// fakeLayers is a model whose layer 1 is patched with fallsBack.
type fakeLayers struct{}

func (fakeLayers) Fallback(l, n int) string {
	if l != 1 {
		return ""
	}
	return fallsBack{min: 30}.Fallback(attn.Shape{N: n}, attn.Options{Causal: true})
}

func (fakeLayers) Mechanism(l int) attn.Mechanism {
	if l == 1 {
		return fallsBack{}
	}
	return flash.New(flash.Config{})
}

func TestLayerFallbacks(t *testing.T) {
	for _, c := range []struct {
		n, shortest int
		want        []string
	}{
		{40, 40, nil},
		{24, 10, []string{"layer 1 (fallsback): ran exact attention: N = 24 < min = 30"}},
		{40, 12, []string{"layer 1 (fallsback): ran exact attention over 12 positions: N = 12 < min = 30"}},
		{20, 0, []string{"layer 1 (fallsback): ran exact attention: N = 20 < min = 30"}},
	} {
		if got := experiment.LayerFallbacks(fakeLayers{}, 3, c.n, c.shortest); !slices.Equal(got, c.want) {
			t.Errorf("n=%d, shortest %d: %q, want %q", c.n, c.shortest, got, c.want)
		}
	}
}

// TestModelCommandsFallback: ppl, patching and generate print a line for
// each patched layer whose mechanism runs exact attention at the window
// (or prompt) length, here hyper below its default min, and none with
// min=0 and blocks and samples that do not cover the window. It needs hyper to say when it falls back (attn.Fallbacker).
func TestModelCommandsFallback(t *testing.T) {
	m, err := registry.New("hyper", nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.(attn.Fallbacker); !ok {
		t.Skip("hyper does not say when it falls back yet")
	}
	f := newModelFixture(t)
	line := "layer 1 (hyper): ran exact attention: "
	cases := []struct {
		cmd  func(context.Context, []string, io.Writer, io.Writer) error
		args []string
	}{
		{cmdPPL, []string{"-text", f.text, "-ctx", "24", "-tokens", "40", "-patch", "hyper:layers=1"}},
		{cmdPatching, []string{"-text", f.text, "-ctx", "24", "-tokens", "40", "-mech", "hyper", "-set", "hyper:min=4096", "-layers", "1"}},
	}
	// Generation decodes every layer through its mechanism's decoder.
	if _, err := registry.NewDecoder(m, attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 12}); err == nil {
		cases = append(cases, struct {
			cmd  func(context.Context, []string, io.Writer, io.Writer) error
			args []string
		}{cmdGenerate, []string{"-prompt", "the cat", "-n", "3", "-patch", "hyper:layers=1"}})
	} else {
		t.Logf("generate not run: %v", err)
	}
	for _, c := range cases {
		_, stderr, err := modelCmd(t, c.cmd, append([]string{"-model", f.gguf}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", c.args, err, stderr)
		}
		if strings.Count(stderr, line) != 1 || strings.Contains(stderr, "layer 0 (") {
			t.Errorf("%v: stderr does not have one line for layer 1:\n%s", c.args, stderr)
		}
	}
	_, stderr, err := modelCmd(t, cmdPPL, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-tokens", "40", "-patch", "hyper:layers=1,min=0,block=4,samples=4")
	if err != nil || strings.Contains(stderr, "ran exact attention") {
		t.Errorf("min=0: %v\n%s", err, stderr)
	}
}

// TestBenchDecodeMechanisms: decode mode builds each mechanism's decoder
// through the registry; those without one are skipped saying so, the
// others' rows carry the prefill rows' fields.
func TestBenchDecodeMechanisms(t *testing.T) {
	withFakes(t, decodesEntry)
	dir := t.TempDir()
	code, stdout, stderr := attnCmd(t, "bench", "-mode", "decode", "-probe=false", "-n", "40,300", "-heads", "4", "-kv-heads", "2", "-d", "24",
		"-dtype", "f32", "-reps", "1", "-mech", "exact,window,decodes,failing", "-out", dir, "-accuracy-n", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	res, raw := readResults(t, dir)
	if len(res.Rows) != 2*4 {
		t.Fatalf("%d rows, want 8:\n%s", len(res.Rows), stdout)
	}
	for i, r := range res.Rows {
		if r.Mode != "decode" || r.N != r.M || r.HKV != 2 || r.DType != "f32" || r.Params == nil {
			t.Errorf("row %+v", r)
		}
		switch {
		case r.Mech == "failing":
			if !strings.Contains(r.Skipped, "no decoder") || !strings.Contains(r.Skipped, "unsupported") {
				t.Errorf("failing n=%d: skipped %q, want no decoder", r.N, r.Skipped)
			}
			continue
		case r.Mech == "window" && strings.Contains(r.Skipped, "no decoder"):
			t.Logf("window n=%d: %s", r.N, r.Skipped)
			continue
		case r.Skipped != "":
			t.Errorf("%s n=%d: skipped %q", r.Mech, r.N, r.Skipped)
			continue
		}
		if r.Seconds <= 0 || r.RelErr == nil {
			t.Errorf("%s n=%d: %+v", r.Mech, r.N, r)
			continue
		}
		// window is an approximation: its error is the point, but finite.
		if tol := 1e-5; (r.Mech != "window" && *r.RelErr > tol) || math.IsNaN(*r.RelErr) || math.IsInf(*r.RelErr, 0) {
			t.Errorf("%s n=%d: rel_err %g", r.Mech, r.N, *r.RelErr)
		}
		if (r.Mech == "exact") != (r.GBps > 0) {
			t.Errorf("%s n=%d: GBps %g", r.Mech, r.N, r.GBps)
		}
		// Only the decoder's own word marks a decode row.
		if want := map[bool]string{true: "M = 41 < 100"}[r.Mech == "decodes" && r.N == 40]; r.Fallback != want {
			t.Errorf("%s n=%d: fallback %q, want %q", r.Mech, r.N, r.Fallback, want)
		}
		if r.Mech == "window" {
			want, _ := registry.Effective("window", nil, true)
			if fmt.Sprint(r.Params) != fmt.Sprint(want) {
				t.Errorf("window params %v, want %v", r.Params, want)
			}
		}
		// The fields of a prefill row, on the raw JSON.
		row := raw["rows"].([]any)[i].(map[string]any)
		for _, f := range []string{"mode", "mech", "b", "h", "hkv", "n", "m", "d", "causal", "dtype", "params", "seconds",
			"gflops", "gbps", "extra_bytes", "rel_err", "skipped", "seconds_min", "seconds_max", "reps"} {
			if _, ok := row[f]; !ok {
				t.Errorf("%s decode row lacks %q", r.Mech, f)
			}
		}
	}
	if !slices.ContainsFunc(res.Rows, func(r eval.Row) bool { return r.Mech == "decodes" && r.N == 300 && r.Skipped == "" }) {
		t.Error("the stepped fill of a decoder of its own did not run at n=300 (over one fill chunk)")
	}
	if _, err := os.Stat(filepath.Join(dir, "report.html")); err != nil {
		t.Error(err)
	}
}

// recordsQueries is decodes whose decoder keeps the query of every step
// of one position, in queriesSeen.
type recordsQueries struct{ decodes }

var queriesSeen [][]float32

func (recordsQueries) Name() string { return "records" }

func (r recordsQueries) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	d, err := r.decodes.NewDecoder(cfg)
	return recorder{d}, err
}

type recorder struct{ attn.Decoder }

func (r recorder) Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error {
	if n == 1 {
		queriesSeen = append(queriesSeen, slices.Clone(q))
	}
	return r.Decoder.Step(ctx, q, k, v, n, valid, out, lse)
}

// TestBenchDecodeQueries: the timed steps of a decode row each attend a
// query of their own, so that a decoder that reads the rows its query
// picks cannot find them in cache from the step before.
func TestBenchDecodeQueries(t *testing.T) {
	withFakes(t, registry.Entry{Name: "records", Summary: "test double", Decode: true,
		Build: func(*registry.Params, uint64) (attn.Mechanism, error) { return recordsQueries{}, nil }})
	queriesSeen = nil
	code, _, stderr := attnCmd(t, "bench", "-mode", "decode", "-probe=false", "-n", "40", "-heads", "4", "-kv-heads", "2", "-d", "8",
		"-dtype", "f32", "-reps", "4", "-mech", "records", "-out", t.TempDir(), "-accuracy-n", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// The error's step, a warm-up and the four timed steps at least.
	if len(queriesSeen) < 6 {
		t.Fatalf("%d steps of one position, want at least 6", len(queriesSeen))
	}
	for i := range queriesSeen {
		for j := range i {
			if slices.Equal(queriesSeen[i], queriesSeen[j]) {
				t.Errorf("steps %d and %d of %d attended the same query", j, i, len(queriesSeen))
			}
		}
	}
}
