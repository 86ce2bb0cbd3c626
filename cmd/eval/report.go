package eval

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"

	"github.com/attnkit/attn/cmd/needle"
)

// Report is everything one report page shows; any part may be missing.
// `attn bench` and `attn accuracy` fill Results, `attn patching`
// Patching, `attn needle` Needle; a folder holding the files of several
// gets one page with all of them.
type Report struct {
	Results  *Results
	Patching *Patching
	Needle   *needle.Results
}

// PlotsDir is the folder beside report.html that holds every figure as
// PNG and SVG.
const PlotsDir = "plots"

// NeedleFile is the needle test's results in a report folder.
const NeedleFile = "needle.json"

// LoadReport reads the results in dir (results.json, patching.json,
// needle.json), those that are there.
func LoadReport(dir string) (*Report, error) {
	rep := &Report{}
	var err error
	if rep.Results, err = Load(dir); err != nil {
		return nil, err
	}
	if rep.Patching, err = LoadPatching(dir); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(dir, NeedleFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		defer f.Close()
		if rep.Needle, err = needle.ReadJSON(f); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, NeedleFile), err)
		}
	}
	return rep, nil
}

// SaveReport writes dir/report.html and every figure in dir/plots as PNG
// and SVG, from the results in dir.
func SaveReport(dir string) error {
	rep, err := LoadReport(dir)
	if err != nil {
		return err
	}
	v, err := rep.view()
	if err != nil {
		return err
	}
	plots := filepath.Join(dir, PlotsDir)
	if err := os.MkdirAll(plots, 0o755); err != nil {
		return err
	}
	for _, p := range v.Parts {
		for _, f := range p.Figures {
			for ext, data := range map[string][]byte{".png": f.PNG, ".svg": f.SVG} {
				if err := os.WriteFile(filepath.Join(plots, f.Name+ext), data, 0o644); err != nil {
					return err
				}
			}
		}
	}
	var buf bytes.Buffer
	if err := reportTemplate.Execute(&buf, v); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ReportFile), buf.Bytes(), 0o644)
}

// WriteReport writes r as one self-contained HTML page: the machine, the
// benchmark's summary, plots and tables, and the accuracy sweeps' plots
// and tables. Plots are PNGs embedded as data URIs, so the page needs no
// other file; each links its SVG in plots/, which Save writes beside it.
func WriteReport(w io.Writer, r *Results) error {
	v, err := (&Report{Results: r}).view()
	if err != nil {
		return err
	}
	return reportTemplate.Execute(w, v)
}

// part is one section of the page, an entry of its table of contents.
type part struct {
	ID, Title string
	Level     int // 2 or 3
	Command   string
	Summary   string
	Text      []string
	Figures   []Figure
	Sections  []Section
}

type reportView struct {
	Title   string
	Version string
	Machine *Machine
	Parts   []part
}

// DataURI is the figure's PNG as a data URI.
func (f Figure) DataURI() template.URL {
	return template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(f.PNG))
}

// mechNames lists every mechanism and series of r's rows and sweeps, so
// that each has one colour in every plot of the page.
func (rep *Report) palette() *palette {
	var names []string
	add := func(n string) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if r := rep.Results; r != nil {
		for i := range r.Rows {
			add(seriesName(&r.Rows[i]))
		}
	}
	return newPalette(names)
}

func (rep *Report) view() (*reportView, error) {
	v := &reportView{Title: "attn report"}
	pal := rep.palette()
	if r := rep.Results; r != nil {
		v.Version = r.Version
		if r.Machine.CPU != "" || r.Machine.Threads > 0 {
			v.Machine = &r.Machine
		}
		if len(r.Rows) > 0 {
			if err := v.addBench(r, pal); err != nil {
				return nil, err
			}
		}
		if r.Accuracy != nil && len(r.Accuracy.Points) > 0 {
			maxErr := 0.0
			if r.Bench != nil {
				maxErr = r.Bench.MaxErr
			}
			if err := v.addAccuracy(r.Accuracy, maxErr); err != nil {
				return nil, err
			}
		}
	}
	if p := rep.Patching; p != nil {
		if err := v.addPatching(p); err != nil {
			return nil, err
		}
	}
	if n := rep.Needle; n != nil && len(n.Rows) > 0 {
		if err := v.addNeedle(n); err != nil {
			return nil, err
		}
	}
	if v.Version != "" {
		v.Title = "attn " + v.Version + " report"
	}
	return v, nil
}

// figure renders p under a name unique in the page.
func (v *reportView) figure(name, caption string, panels ...*plot.Plot) (Figure, error) {
	f, err := renderPanels(name, panels...)
	f.Caption = caption
	return f, err
}

type plotFunc func() (*plot.Plot, bool, error)

// add renders each plot that has something to show into part p.
func (v *reportView) add(p *part, name, caption string, mk plotFunc) error {
	pl, ok, err := mk()
	if err != nil || !ok {
		return err
	}
	f, err := v.figure(name, caption, pl)
	if err != nil {
		return err
	}
	p.Figures = append(p.Figures, f)
	return nil
}

func maskID(causal bool) string {
	if causal {
		return "causal"
	}
	return "full"
}

func (v *reportView) addBench(r *Results, pal *palette) error {
	top := part{ID: "bench", Title: "Benchmark", Level: 2}
	maxErr := 0.0
	if b := r.Bench; b != nil {
		top.Command, top.Summary, maxErr = b.Command, b.Summary, b.MaxErr
		top.Text = append(top.Text, fmt.Sprintf("%s, %.0f s, %s inputs.", b.Date, b.Seconds, b.Input))
	}
	v.Parts = append(v.Parts, top)
	secs := benchSections(r)
	for i, mode := range modes(r.Rows) {
		g := gridOf(r.Rows, mode)
		pal := pal
		if mode == "decode" {
			// A decode line is a cache configuration, not a mechanism:
			// the strongest colours, in the order of the tables.
			var names []string
			for _, s := range g.series {
				names = append(names, s.mech)
			}
			pal = localPalette(names)
		}
		p := part{ID: "bench-" + mode, Title: secs[i].Title, Level: 3, Sections: []Section{secs[i]}}
		masks := []bool{false, true}
		if mode == "decode" {
			masks = []bool{true}
		}
		for _, causal := range masks {
			m, id := maskName(causal), mode+"-"+maskID(causal)
			if mode == "decode" {
				m, id = "decode", mode
			}
			plots := []struct {
				name, caption string
				mk            plotFunc
			}{
				{"speedup-" + id, fmt.Sprintf("%s: each mechanism's speed-up over exact attention (exact's median time over its own, at the same length%s) against n. Above the break-even line it is faster. Rows that ran exact attention instead of the approximation are left out.", m, sameCache(mode)),
					func() (*plot.Plot, bool, error) { return speedupPlot(g, pal, causal) }},
				{"time-" + id, fmt.Sprintf("%s: median time per call against n on log-log axes. The grey dashed lines have the slopes of O(n) and O(n²) cost; a mechanism parallel to one grows at that rate.", m),
					func() (*plot.Plot, bool, error) { return timePlot(g, pal, causal) }},
				{"error-" + id, fmt.Sprintf("%s: relative error against exact attention against n (exact: against the float64 reference), with the summary's error bound in red.", m),
					func() (*plot.Plot, bool, error) { return errorPlot(g, pal, causal, maxErr) }},
				{"memory-" + id, fmt.Sprintf("%s: bytes one call allocates on the Go heap against n; inputs and outputs are not counted.", m),
					func() (*plot.Plot, bool, error) { return memoryPlot(g, pal, causal) }},
			}
			if mode == "decode" {
				plots = append(plots[:1], append([]struct {
					name, caption string
					mk            plotFunc
				}{{"bandwidth-decode", "decode: the K/V bytes one step of exact attention reads per second against the cache length, for each cache head count and storage, and the DRAM read bandwidth the machine measured at the start (red): a step that streams its cache reaches it.",
					func() (*plot.Plot, bool, error) { return bandwidthPlot(g, pal, r.Machine.DRAMGBps) }}}, plots[1:]...)...)
			}
			for _, pl := range plots {
				if err := v.add(&p, pl.name, pl.caption, pl.mk); err != nil {
					return err
				}
			}
			if n := r.paretoN(mode, causal); n > 0 && mode != "decode" {
				caption := fmt.Sprintf("%s, n=%d: speed against error, each mechanism at its parameters (exact at its error against the float64 reference). The grey staircase joins the mechanisms no other beats on both, the Pareto front; below the red line a mechanism is within the error bound. Rows that ran exact attention instead of the approximation are left out.", m, n)
				if err := v.add(&p, "pareto-"+id, caption, func() (*plot.Plot, bool, error) { return paretoPlot(r.Rows, pal, mode, causal, n, maxErr) }); err != nil {
					return err
				}
			}
		}
		v.Parts = append(v.Parts, p)
	}
	return nil
}

func sameCache(mode string) string {
	if mode == "decode" {
		return ", cache head count and storage"
	}
	return " and mask"
}

// paretoN is the length of the speed/error plot: Bench.ParetoN where set
// and present, else the longest length at which exact ran.
func (r *Results) paretoN(mode string, causal bool) int {
	best := 0
	for _, row := range r.Rows {
		if row.Mode != mode || row.Causal != causal {
			continue
		}
		if r.Bench != nil && r.Bench.ParetoN > 0 {
			if row.N == r.Bench.ParetoN {
				return row.N
			}
			continue
		}
		if row.Mech == "exact" && row.Skipped == "" && row.N > best {
			best = row.N
		}
	}
	return best
}

func (v *reportView) addAccuracy(a *Accuracy, maxErr float64) error {
	p := part{ID: "accuracy", Title: "Accuracy", Level: 2, Command: a.Command,
		Text: []string{fmt.Sprintf("%s: %s. Every error is against exact attention on the same inputs.", a.Date, a.Describe())}}
	if err := v.add(&p, "accuracy-cost", "Each budget sweep as a curve of relative error against time per call: lower and further left is better.",
		func() (*plot.Plot, bool, error) { return costPlot(a, maxErr) }); err != nil {
		return err
	}
	names, groups := sweepGroups(a)
	for i, name := range names {
		pts := groups[name]
		err := v.add(&p, fmt.Sprintf("accuracy-%d", i+1), name+": error against exact attention as the budget grows (mean over seeds); points that ran exact attention instead are left out.",
			func() (*plot.Plot, bool, error) { return accuracyPlot(name, pts, maxErr) })
		if err != nil {
			return err
		}
	}
	p.Sections = []Section{accuracySection(a)}
	v.Parts = append(v.Parts, p)
	return nil
}

func (v *reportView) addPatching(pt *Patching) error {
	p := part{ID: "patching", Title: "Patching: perplexity as the last ℓ layers are approximated", Level: 2,
		Text: []string{fmt.Sprintf("Model %s (%d layers), text %s: %d tokens scored in %d windows of %d tokens, stride %d; seed %d, %d workers.",
			filepath.Base(pt.Model), pt.Layers, pt.Text, pt.Tokens, pt.Windows, pt.Context, pt.Stride, pt.Seed, pt.Workers)}}
	f, err := pt.figure()
	if err != nil {
		return err
	}
	f.Name = "patching"
	f.Caption = "Perplexity (left) and the time spent in attention (right) as the last ℓ layers' attention is replaced by each mechanism at a budget of about n/8 keys per query; ℓ = 0 is the exact model, the dashed line its perplexity."
	p.Figures = append(p.Figures, f)
	sec := pt.section()
	sec.Tables = append([]Table{pt.BudgetTable()}, sec.Tables...)
	p.Sections = []Section{sec}
	v.Parts = append(v.Parts, p)
	return nil
}

func (v *reportView) addNeedle(n *needle.Results) error {
	p := part{ID: "needle", Title: "Needle in a haystack", Level: 2,
		Text: []string{"Each mechanism patched into every layer answers the same cases; a cell is the share of exact-match answers at that depth and length."}}
	render := func(name, caption string, mk func(format string) ([]byte, error)) error {
		png, err := mk("png")
		if err != nil {
			return err
		}
		svg, err := mk("svg")
		if err != nil {
			return err
		}
		p.Figures = append(p.Figures, Figure{Name: name, Caption: caption, PNG: png, SVG: svg})
		return nil
	}
	if err := render("needle-accuracy", "Accuracy against prompt length, every depth together, one line per mechanism.",
		func(f string) ([]byte, error) { return needle.AccuracyPlot(n, f) }); err != nil {
		return err
	}
	for _, mech := range n.Mechs() {
		if err := render(needle.FileName(mech), mech+": accuracy by needle depth (rows) and prompt length (columns).",
			func(f string) ([]byte, error) { return needle.HeatMap(n, mech, f) }); err != nil {
			return err
		}
	}
	var b strings.Builder
	if err := needle.WriteTable(&b, n); err != nil {
		return err
	}
	p.Text = append(p.Text, b.String())
	v.Parts = append(v.Parts, p)
	return nil
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: "Liberation Sans", Arial, Helvetica, sans-serif; max-width: 76rem; margin: 2rem auto; padding: 0 1rem; color: #222; line-height: 1.4; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.5rem; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.8rem; }
nav { background: #f6f8fa; padding: 0.5rem 1rem; border: 1px solid #e3e6e8; display: inline-block; }
nav ul { margin: 0.2rem 0; padding-left: 1.2rem; } nav li.l3 { margin-left: 1.2rem; font-size: 0.95rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.88rem; }
td, th { padding: 0.2rem 0.6rem; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
td:first-child, th:first-child, td.l { text-align: left; }
th { background: #f4f4f4; }
figure { margin: 1rem 0 1.6rem; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9rem; color: #555; max-width: 56rem; }
.summary { background: #f6f8fa; padding: 0.8rem 1rem; border-left: 4px solid #4a7; }
code { background: #f4f4f4; padding: 0 0.2rem; }
pre { background: #f8f8f8; padding: 0.6rem; font-size: 0.85rem; overflow-x: auto; }
.notes { font-size: 0.85rem; color: #744; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<nav><b>Contents</b><ul>
{{if .Machine}}<li><a href="#machine">Machine</a></li>{{end}}
{{range .Parts}}<li class="l{{.Level}}"><a href="#{{.ID}}">{{.Title}}</a></li>
{{end}}<li><a href="#definitions">Definitions</a></li>
</ul></nav>

{{with .Machine}}
<h2 id="machine">Machine</h2>
<table>
<tr><td>CPU</td><td class="l">{{.CPU}}</td></tr>
<tr><td>threads used / logical CPUs</td><td class="l">{{.Threads}} / {{.Cores}}</td></tr>
<tr><td>kernels</td><td class="l">{{.Kernels}}</td></tr>
<tr><td>measured fp32 FMA peak</td><td class="l">{{if .PeakGFlops}}{{printf "%.1f" .PeakGFlops}} GFLOP/s ({{.Threads}} threads){{else}}not measured{{end}}</td></tr>
<tr><td>measured DRAM read bandwidth</td><td class="l">{{if .DRAMGBps}}{{printf "%.1f" .DRAMGBps}} GB/s (256 MiB buffer){{else}}not measured{{end}}</td></tr>
<tr><td>attn version</td><td class="l">{{$.Version}}</td></tr>
<tr><td>Go</td><td class="l">{{.Go}} {{.OS}}/{{.Arch}}</td></tr>
</table>
{{end}}

{{range .Parts}}
{{if eq .Level 2}}<h2 id="{{.ID}}">{{.Title}}</h2>{{else}}<h3 id="{{.ID}}">{{.Title}}</h3>{{end}}
{{with .Command}}<p><code>{{.}}</code></p>{{end}}
{{range .Text}}{{if gt (len .) 200}}<pre>{{.}}</pre>{{else}}<p>{{.}}</p>{{end}}{{end}}
{{with .Summary}}<p class="summary">{{.}}</p>{{end}}
{{range .Figures}}<figure id="fig-{{.Name}}"><img src="{{.DataURI}}" alt="{{.Caption}}"><figcaption>{{.Caption}} <a href="plots/{{.Name}}.svg">SVG</a></figcaption></figure>
{{end}}
{{range .Sections}}
{{range .Tables}}<p><b>{{.Title}}</b></p>
<table><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{end}}
{{if .Skipped}}<p><b>Skipped rows</b></p><ul class="notes">{{range .Skipped}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .Fallbacks}}<p><b>Rows that ran exact attention instead of the approximation</b> (marked *; never counted as a speed-up, left out of the plots)</p><ul class="notes">{{range .Fallbacks}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .Notes}}<ul class="notes">{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{end}}
{{end}}

<h2 id="definitions">Definitions</h2>
<ul>
<li><b>time</b>: the median of the timed calls of one forward pass, after one warm-up call, ± their standard deviation; <b>!</b> marks a row whose calls spread over a quarter of the median.</li>
<li><b>GFLOP/s</b>: 4·B·H·N·M·D flops (half when causal) per second, for the rows that compute exact attention; the percentage is of the fp32 FMA peak measured in the same process.</li>
<li><b>extra memory</b>: bytes one call allocates on the Go heap (runtime.MemStats.TotalAlloc), an upper bound on its peak extra heap; inputs and outputs are not counted.</li>
<li><b>relative error</b>: ‖O−Ô‖<sub>F</sub>/‖O‖<sub>F</sub> over the whole output; exact against the float64 reference, every other mechanism against exact.</li>
<li><b>spectral</b>: ‖O−Ô‖<sub>2</sub>/‖O‖<sub>2</sub> of each head's N×D output by power iteration, the worst head.</li>
<li><b>max row</b>: the largest relative error of one query row. <b>lse rel</b>: relative error of the log-sum-exp.</li>
<li>A row is <b>skipped</b> when it would exceed a time or memory budget (forecast from the shorter lengths) or the mechanism returned an error; the reason is shown.</li>
<li>A row marked <b>*</b> <b>fell back</b>: the mechanism ran exact attention instead of its approximation (a short input, say); the reason is listed. Its time and error are exact attention's.</li>
</ul>
</body>
</html>
`))
