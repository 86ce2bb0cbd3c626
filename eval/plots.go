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
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot sizes and resolution of the report's PNGs: the plot on the left,
// its legend in a column of its own on the right, where it cannot hide a
// line however many mechanisms there are.
const (
	plotW   = 6.5 * vg.Inch
	legendW = 1.9 * vg.Inch
	plotH   = 4.5 * vg.Inch
	plotDPI = 110
)

// renderPNG draws p, and its legend beside it, as a PNG.
func renderPNG(p *plot.Plot) ([]byte, error) {
	c := vgimg.NewWith(vgimg.UseWH(plotW+legendW, plotH), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(c)
	leg := p.Legend
	p.Legend = plot.NewLegend()
	p.Draw(draw.Crop(dc, 0, -legendW, 0, 0))
	p.Legend = leg
	leg.Top, leg.Left = true, true
	leg.XOffs, leg.YOffs = vg.Points(4), -vg.Points(24)
	leg.Draw(draw.Crop(dc, plotW, 0, 0, 0))
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// errFloor is where an error of 0 (a mechanism that fell back to exact
// attention, say) is drawn on the accuracy plots' logarithmic axes.
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

func newLogLog(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = logTicks{}, logTicks{}
	p.Add(plotter.NewGrid())
	return p
}

// style gives series i its color, glyph and dashes.
func style(i int) (color.Color, draw.GlyphDrawer, []vg.Length) {
	return plotutil.Color(i), plotutil.Shape(i), plotutil.Dashes(i / 7)
}

// mechIndex numbers the mechanisms of g in order of appearance, so that a
// mechanism has the same style in every plot.
func (g grid) mechIndex(mech string) int {
	var seen []string
	for _, s := range g.series {
		if !slices.Contains(seen, s.mech) {
			seen = append(seen, s.mech)
		}
		if s.mech == mech {
			return slices.Index(seen, mech)
		}
	}
	return len(seen)
}

// addLine adds a line with points for xys, in style i, to p and its legend.
func addLine(p *plot.Plot, name string, i int, xys plotter.XYs) error {
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	c, shape, dashes := style(i)
	l.Color, l.Dashes, l.Width = c, dashes, vg.Points(1.5)
	pts.Color, pts.Shape = c, shape
	p.Add(l, pts)
	p.Legend.Add(name, l, pts)
	return nil
}

// markFallbacks rings the points xys of p, rows or points that ran exact
// attention instead of their mechanism's approximation, under one legend
// entry.
func markFallbacks(p *plot.Plot, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	sc, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	sc.Shape, sc.Radius, sc.Color = draw.RingGlyph{}, vg.Points(6), color.RGBA{R: 200, A: 255}
	p.Add(sc)
	p.Legend.Add("ran exact attention (fallback)", sc)
	return nil
}

// timePlot draws time per call against length for every series of g with
// the given mask, with O(n) and O(n²) guide slopes through the median
// time at the shortest length. ok is false when nothing was measured.
func timePlot(g grid, causal bool) (p *plot.Plot, ok bool, err error) {
	mask := "full mask"
	if causal {
		mask = "causal"
	}
	p = newLogLog(fmt.Sprintf("%s, %s: time per call", g.mode, mask), "n (tokens, log scale)", "seconds (log scale)")
	p.X.Tick.Marker = lengthTicks(g.ns)
	var lo []float64
	var fallbacks plotter.XYs
	n0, n1 := math.Inf(1), 0.0
	for _, s := range g.series {
		if s.causal != causal {
			continue
		}
		i := g.mechIndex(s.mech)
		var xys plotter.XYs
		for _, n := range g.ns {
			if r := g.cells[s][n]; r != nil && r.Skipped == "" && r.Seconds > 0 {
				xys = append(xys, plotter.XY{X: float64(n), Y: r.Seconds})
				if r.Fallback != "" {
					fallbacks = append(fallbacks, xys[len(xys)-1])
				}
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := addLine(p, s.mech, i, xys); err != nil {
			return nil, false, err
		}
		ok = true
		if xys[0].X < n0 {
			n0, lo = xys[0].X, nil
		}
		if xys[0].X == n0 {
			lo = append(lo, xys[0].Y)
		}
		n1 = math.Max(n1, xys[len(xys)-1].X)
	}
	if !ok {
		return nil, false, nil
	}
	if err := markFallbacks(p, fallbacks); err != nil {
		return nil, false, err
	}
	if n1 > n0 {
		slices.Sort(lo)
		t0 := Median(lo)
		for k, slope := range []float64{1, 2} {
			l, err := plotter.NewLine(plotter.XYs{{X: n0, Y: t0}, {X: n1, Y: t0 * math.Pow(n1/n0, slope)}})
			if err != nil {
				return nil, false, err
			}
			l.Color = color.Gray{Y: 120}
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(3 + 3*float64(k))}
			p.Add(l)
			p.Legend.Add([]string{"O(n) slope", "O(n²) slope"}[k], l)
		}
	}
	padLog(p, 1.2)
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
// length n that have both, and the front of the ones no other beats on
// both. An error of 0 (a mechanism that fell back to exact attention) and
// exact's error where the float64 reference did not run are drawn a decade
// below the smallest error measured, and said so. Rows that say they fell
// back (Row.Fallback) are drawn ringed and labelled so, and are never on
// the front: they are exact attention under another name.
func paretoPlot(rows []Row, mode string, causal bool, n int) (p *plot.Plot, ok bool, err error) {
	var xys plotter.XYs
	var labels []string
	var fellBack []bool
	smallest := math.Inf(1)
	for _, r := range rows {
		if r.Mode != mode || r.Causal != causal || r.N != n || r.Skipped != "" || r.Mech == "ref" || r.Seconds <= 0 {
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
		labels = append(labels, r.Mech)
		fellBack = append(fellBack, r.Fallback != "")
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
			labels[i] += "*"
			atFloor = true
		}
	}
	mask := "full mask"
	if causal {
		mask = "causal"
	}
	title := fmt.Sprintf("%s, %s, n=%d: speed and error", mode, mask, n)
	if atFloor {
		title += "\n(* error 0, or not measured: drawn a decade below the smallest)"
	}
	p = newLogLog(title,
		"seconds per call (log scale)", "relative error (log scale)")
	var fallbacks plotter.XYs
	for i, xy := range xys {
		if fellBack[i] {
			fallbacks = append(fallbacks, xy)
			labels[i] += " (exact)"
		}
	}
	if fxys := frontOf(xys, fellBack); len(fxys) > 0 {
		l, err := plotter.NewLine(fxys)
		if err != nil {
			return nil, false, err
		}
		l.StepStyle = plotter.PostStep
		l.Color = color.RGBA{R: 200, A: 255}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add("Pareto front", l)
	}
	sc, err := plotter.NewScatter(xys)
	if err != nil {
		return nil, false, err
	}
	sc.Color = color.Black
	sc.Shape = draw.CircleGlyph{}
	p.Add(sc)
	if err := markFallbacks(p, fallbacks); err != nil {
		return nil, false, err
	}
	// Points closer than a factor of 1.5 on both axes would print their
	// labels over each other: each such label goes one line lower.
	for i := range xys {
		below := 0
		for j := range i {
			if closeOnLog(xys[i].X, xys[j].X) && closeOnLog(xys[i].Y, xys[j].Y) {
				below++
			}
		}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys[i : i+1], Labels: labels[i : i+1]})
		if err != nil {
			return nil, false, err
		}
		lb.TextStyle[0].XAlign = draw.XLeft
		lb.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(2 - 11*float64(below))}
		p.Add(lb)
	}
	// Room for the labels right of the points.
	padLog(p, 2)
	p.X.Max *= 3
	return p, true, nil
}

// closeOnLog reports whether two positive values are within a factor of 1.5.
func closeOnLog(a, b float64) bool { return a < 1.5*b && b < 1.5*a }

// accuracyPlot draws the relative and spectral errors of one budget sweep
// against its budget; ok is false with fewer than two points measured.
func accuracyPlot(name string, pts []*AccuracyPoint) (p *plot.Plot, ok bool, err error) {
	var rel, spec, fallbacks plotter.XYs
	for _, pt := range pts {
		if pt.Skipped != "" || pt.RelErr == nil || pt.Value <= 0 {
			continue
		}
		rel = append(rel, plotter.XY{X: float64(pt.Value), Y: math.Max(*pt.RelErr, errFloor)})
		if pt.Fallback != "" {
			fallbacks = append(fallbacks, rel[len(rel)-1])
		}
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
	if err := addLine(p, "relative Frobenius", 0, rel); err != nil {
		return nil, false, err
	}
	if len(spec) > 0 {
		if err := addLine(p, "spectral norm", 1, spec); err != nil {
			return nil, false, err
		}
	}
	if err := markFallbacks(p, fallbacks); err != nil {
		return nil, false, err
	}
	padLog(p, 1.2)
	return p, true, nil
}

// costPlot draws every budget sweep of a as a curve of error against time
// per call: how much accuracy each mechanism buys with each second.
func costPlot(a *Accuracy) (p *plot.Plot, ok bool, err error) {
	p = newLogLog(fmt.Sprintf("error against time per call as the budget grows (n=%d)", a.N),
		"seconds per call (log scale)", "relative error (log scale)")
	names, groups := sweepGroups(a)
	var fallbacks plotter.XYs
	for i, name := range names {
		var xys plotter.XYs
		for _, pt := range groups[name] {
			if pt.Skipped == "" && pt.RelErr != nil && pt.Seconds > 0 {
				xys = append(xys, plotter.XY{X: pt.Seconds, Y: math.Max(*pt.RelErr, errFloor)})
				if pt.Fallback != "" {
					fallbacks = append(fallbacks, xys[len(xys)-1])
				}
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := addLine(p, name, i, xys); err != nil {
			return nil, false, err
		}
		ok = true
	}
	if ok {
		if err := markFallbacks(p, fallbacks); err != nil {
			return nil, false, err
		}
		padLog(p, 1.3)
	}
	return p, ok, nil
}
