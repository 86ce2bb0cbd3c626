package eval

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/attnkit/attn/cmd/internal/plotstyle"
)

// Plot sizes and resolution: each panel, and its legend in a column of its
// own on the right, where it cannot hide a line however many mechanisms
// there are.
const (
	plotW   = 6.5 * vg.Inch
	legendW = 2.5 * vg.Inch
	plotH   = 4.5 * vg.Inch
	plotDPI = 110
	// panelW is each panel's width in a figure of several side by side,
	// which then keeps about the width of one plot.
	panelW = 4.6 * vg.Inch
)

// PlotFont is the typeface of every plot (see plotstyle.Font).
var PlotFont = plotstyle.Font

func setFonts(p *plot.Plot) { plotstyle.SetFonts(p) }

// newPlot returns a plot with a title, axis labels, a grid and the plot
// font.
func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	setFonts(p)
	p.Add(plotter.NewGrid())
	return p
}

func newLogLog(title, x, y string) *plot.Plot {
	p := newPlot(title, x, y)
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = logTicks{}, logTicks{}
	return p
}

// Figure is one rendered plot: PNG for the page, SVG beside it.
type Figure struct {
	// Name is the file name without extension, unique in a report.
	Name    string
	Caption string
	PNG     []byte
	SVG     []byte
}

// renderPanels draws panels side by side, the first one's legend in a
// column on the right, as PNG and SVG.
func renderPanels(name string, panels ...*plot.Plot) (Figure, error) {
	pw := plotW
	if len(panels) > 1 {
		pw = panelW
	}
	w := vg.Length(len(panels))*pw + legendW
	paint := func(dc draw.Canvas) {
		leg := panels[0].Legend
		for i, p := range panels {
			l := p.Legend
			p.Legend = plot.NewLegend()
			x0 := vg.Length(i) * pw
			p.Draw(draw.Crop(dc, x0, -(w - x0 - pw), 0, 0))
			p.Legend = l
		}
		leg.Top, leg.Left = true, true
		leg.XOffs, leg.YOffs = vg.Points(6), -vg.Points(28)
		leg.Draw(draw.Crop(dc, w-legendW, 0, 0, 0))
	}
	f := Figure{Name: name}
	ic := vgimg.NewWith(vgimg.UseWH(w, plotH), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
	paint(draw.New(ic))
	var pb bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: ic}).WriteTo(&pb); err != nil {
		return f, err
	}
	sc := vgsvg.New(w, plotH)
	dc := draw.New(sc)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	paint(dc)
	var sb bytes.Buffer
	if _, err := sc.WriteTo(&sb); err != nil {
		return f, err
	}
	f.PNG, f.SVG = pb.Bytes(), sb.Bytes()
	return f, nil
}

// palette gives each name its own colour and glyph (plotstyle.Palette).
type palette = plotstyle.Palette

func newPalette(names []string) *palette   { return plotstyle.NewPalette(names) }
func localPalette(names []string) *palette { return plotstyle.LocalPalette(names) }

// hline draws a dashed grey line at y across the x range [x0, x1] of pl,
// named in its legend: a bound, a peak, a break-even.
func hline(pl *plot.Plot, label string, y, x0, x1 float64, c color.Color) error {
	l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	if err != nil {
		return err
	}
	l.Color, l.Width, l.Dashes = c, vg.Points(1.2), []vg.Length{vg.Points(7), vg.Points(3)}
	pl.Add(l)
	pl.Legend.Add(label, l)
	return nil
}

var (
	boundColor = color.RGBA{R: 200, G: 30, B: 30, A: 255}
	guideColor = color.Gray{Y: 120}
)

// errFloor is where an error of 0 is drawn on the accuracy plots'
// logarithmic axes.
const errFloor = 1e-9

// lengthTicks labels the lengths themselves on a logarithmic axis.
type lengthTicks []int

func (t lengthTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, n := range t {
		out = append(out, plot.Tick{Value: float64(n), Label: strconv.Itoa(n)})
	}
	return out
}

// logTicks marks 1…9 × 10^k and labels the powers of ten, and 2 and 5
// times them too when the axis spans few decades, so that every axis has
// labels.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	labelled := []int{1}
	switch decades := math.Log10(hi / lo); {
	case decades < 1:
		labelled = []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
	case decades < 3:
		labelled = []int{1, 2, 5}
	}
	var out []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if slices.Contains(labelled, m) {
				t.Label = strconv.FormatFloat(v, 'g', 3, 64)
			}
			out = append(out, t)
		}
	}
	return out
}

// padLog widens both axes of a log-log plot by factor f each way, so that
// no point sits on the frame and a single value still spans a range.
func padLog(p *plot.Plot, f float64) {
	p.X.Min, p.X.Max = p.X.Min/f, p.X.Max*f
	p.Y.Min, p.Y.Max = p.Y.Min/f, p.Y.Max*f
}

func maskName(causal bool) string {
	if causal {
		return "causal"
	}
	return "full mask"
}

// vsN draws, for every series of g with the given mask, value(row)
// against n on log-log axes, leaving out rows that did not run, fell
// back to exact attention, or have no value (ok false). ok is false when
// nothing was drawn.
func vsN(g grid, pal *palette, causal bool, title, ylabel string, value func(*Row) (float64, bool)) (p *plot.Plot, ok bool, err error) {
	heading := fmt.Sprintf("%s, %s: %s", g.mode, maskName(causal), title)
	if g.mode == "decode" {
		heading = "decode: " + title // every decode row is causal
	}
	p = newLogLog(heading, "n (tokens, log scale)", ylabel)
	p.X.Tick.Marker = lengthTicks(g.ns)
	for _, s := range g.series {
		if s.causal != causal {
			continue
		}
		var xys plotter.XYs
		for _, n := range g.ns {
			r := g.cells[s][n]
			if r == nil || r.Skipped != "" || r.Fallback != "" {
				continue
			}
			if v, has := value(r); has && v > 0 && !math.IsInf(v, 0) {
				xys = append(xys, plotter.XY{X: float64(n), Y: v})
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := pal.Line(p, s.mech, xys); err != nil {
			return nil, false, err
		}
		ok = true
	}
	return p, ok, nil
}

// nRange is the range of lengths of g, for lines across a plot.
func (g grid) nRange() (float64, float64) {
	return float64(g.ns[0]), float64(g.ns[len(g.ns)-1])
}

// timePlot draws time per call against length with O(n) and O(n²) guide
// slopes through the median time at the shortest length.
func timePlot(g grid, pal *palette, causal bool) (p *plot.Plot, ok bool, err error) {
	p, ok, err = vsN(g, pal, causal, "time per call", "seconds (log scale)", func(r *Row) (float64, bool) { return r.Seconds, true })
	if !ok || err != nil {
		return p, ok, err
	}
	var lo []float64
	n0 := g.ns[0]
	for _, s := range g.series {
		if r := g.cells[s][n0]; s.causal == causal && r != nil && r.Skipped == "" && r.Fallback == "" && r.Seconds > 0 {
			lo = append(lo, r.Seconds)
		}
	}
	x0, x1 := g.nRange()
	if len(lo) > 0 && x1 > x0 {
		slices.Sort(lo)
		t0 := Median(lo)
		for k, slope := range []float64{1, 2} {
			l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: t0}, {X: x1, Y: t0 * math.Pow(x1/x0, slope)}})
			if err != nil {
				return nil, false, err
			}
			l.Color = guideColor
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(3 + 3*float64(k))}
			p.Add(l)
			p.Legend.Add([]string{"O(n) slope", "O(n²) slope"}[k], l)
		}
	}
	padLog(p, 1.2)
	return p, true, nil
}

// speedupPlot draws each mechanism's speed-up over exact (exact's time
// over its own, at the same length, mask and cache) against length, with
// the break-even line at 1.
func speedupPlot(g grid, pal *palette, causal bool) (p *plot.Plot, ok bool, err error) {
	p, ok, err = vsN(g, pal, causal, "speed-up over exact", "exact's time / the mechanism's (log scale)", func(r *Row) (float64, bool) {
		if r.Mech == "exact" || r.Mech == "ref" {
			return 0, false
		}
		e := g.exactOf(r, "")
		if e == nil || e.Skipped != "" || e.Seconds <= 0 || r.Seconds <= 0 {
			return 0, false
		}
		return e.Seconds / r.Seconds, true
	})
	if !ok || err != nil {
		return p, ok, err
	}
	x0, x1 := g.nRange()
	if err := hline(p, "break-even (1×)", 1, x0, x1, guideColor); err != nil {
		return nil, false, err
	}
	padLog(p, 1.2)
	return p, true, nil
}

// errorPlot draws each mechanism's relative error against length, with
// the summary's error bound.
func errorPlot(g grid, pal *palette, causal bool, maxErr float64) (p *plot.Plot, ok bool, err error) {
	p, ok, err = vsN(g, pal, causal, "relative error", "‖O−Ô‖_F / ‖O‖_F (log scale)", func(r *Row) (float64, bool) {
		if r.RelErr == nil {
			return 0, false
		}
		return math.Max(*r.RelErr, errFloor), true
	})
	if !ok || err != nil {
		return p, ok, err
	}
	if maxErr > 0 {
		x0, x1 := g.nRange()
		if err := hline(p, fmt.Sprintf("error bound %s (-max-err)", FormatErr(maxErr)), maxErr, x0, x1, boundColor); err != nil {
			return nil, false, err
		}
	}
	padLog(p, 1.3)
	return p, true, nil
}

// memoryPlot draws the bytes one call allocates against length.
func memoryPlot(g grid, pal *palette, causal bool) (p *plot.Plot, ok bool, err error) {
	p, ok, err = vsN(g, pal, causal, "extra memory per call", "bytes allocated on the Go heap (log scale)", func(r *Row) (float64, bool) {
		return float64(r.ExtraBytes), r.ExtraBytes > 0
	})
	if ok {
		padLog(p, 1.3)
	}
	return p, ok, err
}

// bandwidthPlot draws decode rows' K/V read rate against cache length,
// one line per cache configuration, with the DRAM read bandwidth the
// machine measured.
func bandwidthPlot(g grid, pal *palette, dram float64) (p *plot.Plot, ok bool, err error) {
	p, ok, err = vsN(g, pal, true, "K/V bytes read per second", "GB/s (log scale)", func(r *Row) (float64, bool) { return r.GBps, r.GBps > 0 })
	if !ok || err != nil {
		return p, ok, err
	}
	p.Title.Text = "decode: K/V bytes read per second against the cache length"
	if dram > 0 {
		x0, x1 := g.nRange()
		if err := hline(p, fmt.Sprintf("DRAM read %.1f GB/s", dram), dram, x0, x1, boundColor); err != nil {
			return nil, false, err
		}
	}
	padLog(p, 1.3)
	return p, true, nil
}

// paretoFront returns the indices of the points not dominated by another
// (faster and at most as wrong, or as fast and less wrong), by time.
func paretoFront(xys plotter.XYs) []int {
	idx := make([]int, len(xys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if c := cmpFloat(xys[a].X, xys[b].X); c != 0 {
			return c
		}
		return cmpFloat(xys[a].Y, xys[b].Y)
	})
	var front []int
	best := math.Inf(1)
	for _, i := range idx {
		if xys[i].Y < best {
			front = append(front, i)
			best = xys[i].Y
		}
	}
	return front
}

// frontOf returns the Pareto front of the points of xys that did not fall
// back, by time.
func frontOf(xys plotter.XYs, fellBack []bool) plotter.XYs {
	var candidates plotter.XYs
	for i, xy := range xys {
		if !fellBack[i] {
			candidates = append(candidates, xy)
		}
	}
	var front plotter.XYs
	for _, i := range paretoFront(candidates) {
		front = append(front, candidates[i])
	}
	return front
}

// paretoPlot draws error against time for the rows of mode and mask at
// length n that have both, each mechanism in its own colour and glyph
// (named in the legend, not by labels that would print over each other),
// the front of the ones no other beats on both, and the error bound.
// exact's error where the float64 reference did not run, and an error of
// 0, are drawn a decade below the smallest measured. Rows that fell back
// to exact attention (Row.Fallback) are left out: they are exact
// attention under another name.
func paretoPlot(rows []Row, pal *palette, mode string, causal bool, n int, maxErr float64) (p *plot.Plot, ok bool, err error) {
	var xys plotter.XYs
	var names []string
	smallest := math.Inf(1)
	for _, r := range rows {
		if r.Mode != mode || r.Causal != causal || r.N != n || r.Skipped != "" || r.Mech == "ref" || r.Seconds <= 0 || r.Fallback != "" {
			continue
		}
		e := math.NaN()
		switch {
		case r.RelErr != nil:
			e = *r.RelErr
		case r.Mech == "exact":
			e = 0
		}
		if math.IsNaN(e) {
			continue
		}
		if e > 0 {
			smallest = math.Min(smallest, e)
		}
		xys = append(xys, plotter.XY{X: r.Seconds, Y: e})
		names = append(names, seriesName(&r))
	}
	if len(xys) == 0 {
		return nil, false, nil
	}
	floor := smallest / 10
	if math.IsInf(smallest, 1) {
		floor = 1e-3
	}
	atFloor := false
	for i := range xys {
		if xys[i].Y < floor {
			xys[i].Y = floor
			atFloor = true
		}
	}
	title := fmt.Sprintf("%s, %s, n=%d: speed and error", mode, maskName(causal), n)
	if atFloor {
		title += " (error 0 or not measured: a decade below the smallest)"
	}
	p = newLogLog(title, "seconds per call (log scale)", "relative error (log scale)")
	if fxys := frontOf(xys, make([]bool, len(xys))); len(fxys) > 0 {
		l, err := plotter.NewLine(fxys)
		if err != nil {
			return nil, false, err
		}
		l.StepStyle = plotter.PostStep
		l.Color = color.Gray{Y: 60}
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add("Pareto front", l)
	}
	for i, xy := range xys {
		sc, err := plotter.NewScatter(plotter.XYs{xy})
		if err != nil {
			return nil, false, err
		}
		c, shape, _ := pal.Style(names[i])
		sc.Color, sc.Shape, sc.Radius = c, shape, vg.Points(4.5)
		p.Add(sc)
		p.Legend.Add(names[i], sc)
	}
	x0, x1 := xys[0].X, xys[0].X
	for _, xy := range xys {
		x0, x1 = math.Min(x0, xy.X), math.Max(x1, xy.X)
	}
	if maxErr > 0 {
		if err := hline(p, fmt.Sprintf("error bound %s (-max-err)", FormatErr(maxErr)), maxErr, x0/2, x1*2, boundColor); err != nil {
			return nil, false, err
		}
	}
	padLog(p, 2)
	return p, true, nil
}

// accuracyPlot draws the relative and spectral errors of one budget sweep
// against its budget; ok is false with fewer than two points measured.
// Points that ran exact attention instead of the approximation are left
// out.
func accuracyPlot(name string, pts []*AccuracyPoint, maxErr float64) (p *plot.Plot, ok bool, err error) {
	var rel, spec plotter.XYs
	for _, pt := range pts {
		if pt.Skipped != "" || pt.RelErr == nil || pt.Value <= 0 || pt.Fallback != "" {
			continue
		}
		rel = append(rel, plotter.XY{X: float64(pt.Value), Y: math.Max(*pt.RelErr, errFloor)})
		if pt.SpectralErr != nil {
			spec = append(spec, plotter.XY{X: float64(pt.Value), Y: math.Max(*pt.SpectralErr, errFloor)})
		}
	}
	if len(rel) < 2 {
		return nil, false, nil
	}
	x := pts[0].Param
	if pts[0].Unit != "" {
		x += " (" + pts[0].Unit + ", log scale)"
	}
	p = newLogLog(name+": error against exact", x, "error (log scale)")
	var ticks lengthTicks
	for _, xy := range rel {
		ticks = append(ticks, int(xy.X))
	}
	p.X.Tick.Marker = ticks
	pal := localPalette([]string{"relative Frobenius", "spectral norm"})
	if err := pal.Line(p, "relative Frobenius", rel); err != nil {
		return nil, false, err
	}
	if len(spec) > 0 {
		if err := pal.Line(p, "spectral norm", spec); err != nil {
			return nil, false, err
		}
	}
	if maxErr > 0 {
		if err := hline(p, fmt.Sprintf("error bound %s", FormatErr(maxErr)), maxErr, rel[0].X, rel[len(rel)-1].X, boundColor); err != nil {
			return nil, false, err
		}
	}
	padLog(p, 1.2)
	return p, true, nil
}

// costPlot draws every budget sweep of a as a curve of error against time
// per call: how much accuracy each mechanism buys with each second.
func costPlot(a *Accuracy, maxErr float64) (p *plot.Plot, ok bool, err error) {
	p = newLogLog(fmt.Sprintf("error against time per call as the budget grows (n=%d)", a.N),
		"seconds per call (log scale)", "relative error (log scale)")
	names, groups := sweepGroups(a)
	pal := localPalette(names)
	x0, x1 := math.Inf(1), 0.0
	for _, name := range names {
		var xys plotter.XYs
		for _, pt := range groups[name] {
			if pt.Skipped == "" && pt.RelErr != nil && pt.Seconds > 0 && pt.Fallback == "" {
				xys = append(xys, plotter.XY{X: pt.Seconds, Y: math.Max(*pt.RelErr, errFloor)})
				x0, x1 = math.Min(x0, pt.Seconds), math.Max(x1, pt.Seconds)
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := pal.Line(p, name, xys); err != nil {
			return nil, false, err
		}
		ok = true
	}
	if ok {
		if maxErr > 0 {
			if err := hline(p, fmt.Sprintf("error bound %s", FormatErr(maxErr)), maxErr, x0, x1, boundColor); err != nil {
				return nil, false, err
			}
		}
		padLog(p, 1.3)
	}
	return p, ok, nil
}
