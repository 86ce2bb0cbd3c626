package eval

import (
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"strconv"

	"gonum.org/v1/plot"
)

// WriteReport writes r as one self-contained HTML page: the machine, the
// benchmark's summary, plots and tables, and the accuracy sweeps' plots
// and tables. Plots are PNGs embedded as data URIs, so the page needs no
// other file.
func WriteReport(w io.Writer, r *Results) error {
	v := reportView{R: r}
	if len(r.Rows) > 0 {
		if err := v.addBench(r); err != nil {
			return err
		}
	}
	if r.Accuracy != nil && len(r.Accuracy.Points) > 0 {
		if err := v.addAccuracy(r.Accuracy); err != nil {
			return err
		}
	}
	return reportTemplate.Execute(w, v)
}

type figure struct {
	Caption string
	Src     template.URL
}

type htmlTable = Table

type reportView struct {
	R           *Results
	TimePlots   []figure
	ParetoPlots []figure
	Sections    []Section
	AccPlots    []figure
	AccTables   []htmlTable
}

func (v *reportView) figure(p *plot.Plot, caption string) (figure, error) {
	png, err := renderPNG(p)
	if err != nil {
		return figure{}, err
	}
	return figure{caption, template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(png))}, nil
}

func (v *reportView) addBench(r *Results) error {
	v.Sections = benchSections(r)
	for _, mode := range modes(r.Rows) {
		g := gridOf(r.Rows, mode)
		for _, causal := range []bool{false, true} {
			p, ok, err := timePlot(g, causal)
			if err != nil {
				return err
			}
			if ok {
				f, err := v.figure(p, "Median time per call against n on log-log axes. The grey dashed lines have the slopes of O(n) and O(n²) cost; a mechanism parallel to one grows at that rate.")
				if err != nil {
					return err
				}
				v.TimePlots = append(v.TimePlots, f)
			}
			n := r.paretoN(mode, causal)
			if n == 0 {
				continue
			}
			p, ok, err = paretoPlot(r.Rows, mode, causal, n)
			if err != nil {
				return err
			}
			if ok {
				f, err := v.figure(p, fmt.Sprintf("Speed against error at n=%d: each point is one mechanism at its default parameters (exact at its error against the float64 reference; an error of 0, a mechanism that fell back to exact attention, or one not measured is drawn a decade below the smallest measured). The red staircase joins the mechanisms no other beats on both: the Pareto front. A ringed point, labelled (exact), ran exact attention instead of its approximation and is never on the front.", n))
				if err != nil {
					return err
				}
				v.ParetoPlots = append(v.ParetoPlots, f)
			}
		}
	}
	return nil
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

func (v *reportView) addAccuracy(a *Accuracy) error {
	p, ok, err := costPlot(a)
	if err != nil {
		return err
	}
	if ok {
		f, err := v.figure(p, "Each budget sweep as a curve of relative error against time per call: lower and further left is better.")
		if err != nil {
			return err
		}
		v.AccPlots = append(v.AccPlots, f)
	}
	names, groups := sweepGroups(a)
	for _, name := range names {
		pts := groups[name]
		p, ok, err := accuracyPlot(name, pts)
		if err != nil {
			return err
		}
		if ok {
			f, err := v.figure(p, name+": error against exact attention as the budget grows (mean over seeds).")
			if err != nil {
				return err
			}
			v.AccPlots = append(v.AccPlots, f)
		}
		param := pts[0].Param
		if param == "" {
			param = "budget"
		}
		t := htmlTable{Title: name, Head: []string{param, "rel err", "spectral", "max row", "lse rel", "time", "skipped or fell back"}}
		if pts[0].Unit != "" {
			t.Title += " (" + pts[0].Unit + ")"
		}
		for _, pt := range pts {
			val := strconv.Itoa(pt.Value)
			if pt.Param == "" {
				val = "default"
			}
			if pt.Skipped != "" {
				t.Rows = append(t.Rows, []string{val, "", "", "", "", "", pt.Skipped})
				continue
			}
			note := ""
			if pt.Fallback != "" {
				val += fallbackMark
				note = "ran exact attention instead: " + pt.Fallback
			}
			t.Rows = append(t.Rows, []string{val, errCell(pt.RelErr), errCell(pt.SpectralErr), errCell(pt.MaxRowErr),
				errCell(pt.LSERelErr), FormatSeconds(pt.Seconds), note})
		}
		v.AccTables = append(v.AccTables, t)
	}
	return nil
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>attn {{.R.Version}}: benchmark and accuracy report</title>
<style>
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.5rem; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.8rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
td, th { padding: 0.2rem 0.6rem; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
td:first-child, th:first-child, td.l { text-align: left; }
th { background: #f4f4f4; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9rem; color: #555; max-width: 50rem; }
.summary { background: #f6f8fa; padding: 0.8rem 1rem; border-left: 4px solid #4a7; }
code { background: #f4f4f4; padding: 0 0.2rem; }
.skipped { font-size: 0.85rem; color: #744; }
</style>
</head>
<body>
<h1>attn {{.R.Version}}: benchmark and accuracy report</h1>

<h2>Machine</h2>
<table>
<tr><td>CPU</td><td class="l">{{.R.Machine.CPU}}</td></tr>
<tr><td>threads used / logical CPUs</td><td class="l">{{.R.Machine.Threads}} / {{.R.Machine.Cores}}</td></tr>
<tr><td>kernels</td><td class="l">{{.R.Machine.Kernels}}</td></tr>
<tr><td>measured fp32 FMA peak</td><td class="l">{{if .R.Machine.PeakGFlops}}{{printf "%.1f" .R.Machine.PeakGFlops}} GFLOP/s ({{.R.Machine.Threads}} threads){{else}}not measured{{end}}</td></tr>
<tr><td>measured DRAM read bandwidth</td><td class="l">{{if .R.Machine.DRAMGBps}}{{printf "%.1f" .R.Machine.DRAMGBps}} GB/s (256 MiB buffer){{else}}not measured{{end}}</td></tr>
<tr><td>attn version</td><td class="l">{{.R.Version}}</td></tr>
<tr><td>Go</td><td class="l">{{.R.Machine.Go}} {{.R.Machine.OS}}/{{.R.Machine.Arch}}</td></tr>
</table>

{{if .R.Rows}}
<h2>Benchmark</h2>
{{with .R.Bench}}<p><code>{{.Command}}</code>, {{.Date}}, {{printf "%.0f" .Seconds}} s, {{.Input}} inputs.</p>
<p class="summary">{{.Summary}}</p>{{end}}
{{range .TimePlots}}<figure><img src="{{.Src}}" alt="time against n"><figcaption>{{.Caption}}</figcaption></figure>
{{end}}
{{range .ParetoPlots}}<figure><img src="{{.Src}}" alt="speed against error"><figcaption>{{.Caption}}</figcaption></figure>
{{end}}
{{range .Sections}}
<h3>{{.Title}}</h3>
{{range .Tables}}<p><b>{{.Title}}</b></p>
<table><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{end}}
{{if .Skipped}}<p><b>Skipped rows</b></p><ul class="skipped">{{range .Skipped}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .Fallbacks}}<p><b>Rows that ran exact attention instead of the approximation</b> (marked *; never counted as a speed-up)</p><ul class="skipped">{{range .Fallbacks}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .Notes}}<ul class="skipped">{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{end}}
{{end}}

{{with .R.Accuracy}}
<h2>Accuracy</h2>
<p><code>{{.Command}}</code>, {{.Date}}: {{.Describe}}. Every error is against exact attention on the same inputs.</p>
{{end}}
{{range .AccPlots}}<figure><img src="{{.Src}}" alt="error against budget"><figcaption>{{.Caption}}</figcaption></figure>
{{end}}
{{range .AccTables}}<p><b>{{.Title}}</b></p>
<table><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{end}}

<h2>Definitions</h2>
<ul>
<li><b>time</b>: the median of the timed calls of one forward pass, after one warm-up call.</li>
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
