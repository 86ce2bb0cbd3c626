package eval

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/attnkit/attn/cmd/needle"
)

func samplePatching() *Patching {
	p := &Patching{Model: "m.gguf", Text: "t.txt", Context: 64, Stride: 32, N: 64, Windows: 3, Tokens: 120, Chars: 400,
		Layers: 2, Workers: 1, Seed: 1, Ells: []int{0, 1, 2}}
	p.Exact = PatchingPoint{Perplexity: 10, AttnSeconds: 0.5, Layers: []int{}}
	for i, name := range []string{"window", "hyper"} {
		m := PatchingMech{Name: name, Settings: []string{"left=8"}, Budget: "n/8", KeysPerQuery: 8, Points: []PatchingPoint{p.Exact}}
		for ell := 1; ell <= 2; ell++ {
			m.Points = append(m.Points, PatchingPoint{Patched: ell, Perplexity: 10 + float64(ell*(i+1)), AttnSeconds: 0.5 - 0.1*float64(ell)})
		}
		p.Mechanisms = append(p.Mechanisms, m)
	}
	return p
}

// TestSaveReportDir: a folder holding a benchmark, a patching run and a
// needle run gets one page with all of them, each figure as PNG and SVG
// in plots/, and the plots' text in the page's typeface.
func TestSaveReportDir(t *testing.T) {
	dir := t.TempDir()
	if err := SavePatching(dir, samplePatching()); err != nil {
		t.Fatal(err)
	}
	nr := &needle.Results{Rows: []needle.Row{
		{Mech: "exact", N: 64, Depth: 0, Trials: 2, Correct: 2, Accuracy: 1, Seconds: 0.1},
		{Mech: "exact", N: 64, Depth: 1, Trials: 2, Correct: 1, Accuracy: 0.5, Seconds: 0.1},
		{Mech: "window", N: 64, Depth: 0, Trials: 2, Correct: 0, Accuracy: 0, Seconds: 0.05},
		{Mech: "window", N: 64, Depth: 1, Trials: 2, Correct: 1, Accuracy: 0.5, Seconds: 0.05},
	}}
	var nb bytes.Buffer
	if err := nr.WriteJSON(&nb); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, NeedleFile), nb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sampleResults().Save(dir); err != nil {
		t.Fatal(err)
	}
	html, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`id="patching"`, `id="fig-patching"`, `id="needle"`, `id="fig-needle-accuracy"`,
		`id="fig-needle-exact"`, `id="fig-speedup-prefill-full"`, "budgets for n = 64", `href="#needle"`} {
		if !strings.Contains(string(html), want) {
			t.Errorf("report lacks %s", want)
		}
	}
	for _, name := range []string{"patching", "needle-exact", "speedup-prefill-causal", "pareto-prefill-full", "accuracy-cost"} {
		for _, ext := range []string{".png", ".svg"} {
			if st, err := os.Stat(filepath.Join(dir, PlotsDir, name+ext)); err != nil || st.Size() == 0 {
				t.Errorf("plots/%s%s: %v", name, ext, err)
			}
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, PlotsDir, "speedup-prefill-full.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(svg), "Liberation Sans") || strings.Contains(string(svg), "Liberation Serif") {
		t.Error("the plot's text is not in the page's typeface (Liberation Sans)")
	}
	if !strings.Contains(string(html), `font-family: "Liberation Sans"`) {
		t.Error("the page does not ask for the plots' typeface")
	}
}

// TestPlotsLeaveOutFallbacks: a row that ran exact attention instead of
// its approximation is no point of the Pareto plot, nor of the speed-up
// plot, and the bound is drawn.
func TestPlotsLeaveOutFallbacks(t *testing.T) {
	r := fallbackResults()
	pal := newPalette(nil)
	p, ok, err := paretoPlot(r.Rows, pal, "prefill", false, 512, 0.1)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	f, err := renderPanels("p", p)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(f.SVG)
	if strings.Contains(svg, ">performer<") || !strings.Contains(svg, ">window<") || !strings.Contains(svg, "error bound 0.1") {
		t.Error("Pareto plot: want window and the bound, not the performer row that fell back")
	}
	// Unmarked, the performer row is drawn: the mark is what keeps it out.
	for i := range r.Rows {
		r.Rows[i].Fallback = ""
	}
	p, _, _ = paretoPlot(r.Rows, pal, "prefill", false, 512, 0.1)
	if f, _ = renderPanels("p", p); !strings.Contains(string(f.SVG), ">performer<") {
		t.Error("unmarked, the performer row is not drawn either")
	}
}
