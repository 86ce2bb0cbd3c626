package needle

import (
	"bytes"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/internal/plotstyle"
)

// Plot sizes, as the eval package's: the plot on the left, its legend or
// colour bar in a column of its own on the right (wide: a mechanism's name
// may be a patch spec).
const (
	plotW   = 6.5 * vg.Inch
	sideW   = 2.4 * vg.Inch
	barW    = 1.1 * vg.Inch
	plotH   = 4.5 * vg.Inch
	plotDPI = 110
)

// Colours of the heat maps: red at accuracy 0, yellow at 1/2, green at 1
// (ColorBrewer's RdYlGn ends and middle), grey where nothing ran.
var (
	stops = []color.RGBA{{215, 48, 39, 255}, {254, 224, 139, 255}, {26, 152, 80, 255}}
	grey  = color.RGBA{210, 210, 210, 255}
)

// accuracyColor maps an accuracy in [0, 1] to the heat maps' colour.
func accuracyColor(a float64) color.RGBA {
	a = max(0, min(1, a))
	seg := min(len(stops)-2, int(a*float64(len(stops)-1)))
	f := a*float64(len(stops)-1) - float64(seg)
	lo, hi := stops[seg], stops[seg+1]
	mix := func(x, y uint8) uint8 { return uint8(float64(x) + f*(float64(y)-float64(x)) + 0.5) }
	return color.RGBA{mix(lo.R, hi.R), mix(lo.G, hi.G), mix(lo.B, hi.B), 255}
}

// rect is one filled cell of a heat map or colour bar.
type rect struct {
	x0, x1, y0, y1 float64
	fill           color.Color
	label          string
}

// rects draws cells, each with its label in the middle.
type rects struct {
	cells []rect
	text  draw.TextStyle
}

func (r *rects) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for _, cell := range r.cells {
		x0, x1, y0, y1 := trX(cell.x0), trX(cell.x1), trY(cell.y0), trY(cell.y1)
		c.FillPolygon(cell.fill, []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
		if cell.label != "" {
			c.FillText(r.text, vg.Point{X: (x0 + x1) / 2, Y: (y0 + y1) / 2}, cell.label)
		}
	}
}

func (r *rects) DataRange() (xmin, xmax, ymin, ymax float64) {
	if len(r.cells) == 0 {
		return 0, 1, 0, 1
	}
	xmin, xmax, ymin, ymax = r.cells[0].x0, r.cells[0].x1, r.cells[0].y0, r.cells[0].y1
	for _, c := range r.cells {
		xmin, xmax = min(xmin, c.x0), max(xmax, c.x1)
		ymin, ymax = min(ymin, c.y0), max(ymax, c.y1)
	}
	return
}

// ticks labels given values.
type ticks []plot.Tick

func (t ticks) Ticks(_, _ float64) []plot.Tick { return t }

func depthLabel(d float64) string { return strconv.FormatFloat(100*d, 'g', 4, 64) + "%" }

// heatMap returns the heat map of mech and its colour bar: context length
// across, needle depth down (0% at the top, as the test is usually
// drawn), each cell coloured and labelled by its accuracy.
func heatMap(r *Results, mech string) (hm, bar *plot.Plot, err error) {
	if !slices.Contains(r.Mechs(), mech) {
		return nil, nil, fmt.Errorf("%w: no rows of mechanism %q", attn.ErrInput, mech)
	}
	lengths, depths := r.grid()
	hm = plot.New()
	plotstyle.SetFonts(hm)
	hm.Title.Text = "needle in a haystack: " + mech
	hm.X.Label.Text = "context length (tokens)"
	hm.Y.Label.Text = "needle depth (share of the haystack before it)"
	cells := &rects{text: hm.X.Tick.Label}
	cells.text.XAlign, cells.text.YAlign = draw.XCenter, draw.YCenter
	var xt, yt ticks
	for i, n := range lengths {
		xt = append(xt, plot.Tick{Value: float64(i), Label: strconv.Itoa(n)})
	}
	for j, d := range depths {
		y := float64(len(depths) - 1 - j)
		yt = append(yt, plot.Tick{Value: y, Label: depthLabel(d)})
		for i, n := range lengths {
			c := rect{x0: float64(i) - 0.5, x1: float64(i) + 0.5, y0: y - 0.5, y1: y + 0.5, fill: grey}
			if row, ok := r.row(mech, n, d); ok {
				switch {
				case row.Error != "":
					c.label = "error"
				case row.Trials > 0:
					c.fill = accuracyColor(row.Accuracy)
					c.label = strconv.FormatFloat(row.Accuracy, 'f', 2, 64)
				}
			}
			cells.cells = append(cells.cells, c)
		}
	}
	hm.Add(cells)
	hm.X.Tick.Marker, hm.Y.Tick.Marker = xt, yt
	hm.X.Min, hm.X.Max = -0.5, float64(len(lengths))-0.5
	hm.Y.Min, hm.Y.Max = -0.5, float64(len(depths))-0.5

	bar = plot.New()
	plotstyle.SetFonts(bar)
	bar.Title.Text = "accuracy"
	bar.HideX()
	const steps = 100
	strip := &rects{}
	for k := range steps {
		lo, hi := float64(k)/steps, float64(k+1)/steps
		// Each step overlaps the next, so that no seam shows between them.
		strip.cells = append(strip.cells, rect{x0: 0, x1: 1, y0: lo, y1: min(1, hi+0.5/steps), fill: accuracyColor((lo + hi) / 2)})
	}
	bar.Add(strip)
	bar.Y.Tick.Marker = ticks{{Value: 0, Label: "0"}, {Value: 0.25, Label: "0.25"}, {Value: 0.5, Label: "0.5"}, {Value: 0.75, Label: "0.75"}, {Value: 1, Label: "1"}}
	bar.Y.Min, bar.Y.Max = 0, 1
	return hm, bar, nil
}

// HeatMap draws mech's accuracy per context length (across) and needle
// depth (down) as an image in format "png" or "svg", with a colour bar:
// the usual picture of the test.
func HeatMap(r *Results, mech, format string) ([]byte, error) {
	hm, bar, err := heatMap(r, mech)
	if err != nil {
		return nil, err
	}
	return render(format, plotW+barW, plotH, func(dc draw.Canvas) {
		hm.Draw(draw.Crop(dc, 0, -barW, 0, 0))
		bar.Draw(draw.Crop(dc, plotW+vg.Points(8), -vg.Points(24), vg.Points(24), 0))
	})
}

// AccuracyPlot draws each mechanism's accuracy over every depth against
// the context length (log scale), in format "png" or "svg".
func AccuracyPlot(r *Results, format string) ([]byte, error) {
	lengths, _ := r.grid()
	if len(lengths) == 0 {
		return nil, fmt.Errorf("%w: no rows to plot", attn.ErrInput)
	}
	p := plot.New()
	plotstyle.SetFonts(p)
	p.Title.Text = "needle in a haystack: accuracy over every depth"
	p.X.Label.Text = "context length (tokens, log scale)"
	p.Y.Label.Text = "accuracy"
	p.X.Scale = plot.LogScale{}
	var xt ticks
	for _, n := range lengths {
		xt = append(xt, plot.Tick{Value: float64(n), Label: strconv.Itoa(n)})
	}
	p.X.Tick.Marker = xt
	p.Add(plotter.NewGrid())
	pal := plotstyle.NewPalette(r.Mechs())
	for _, mech := range r.Mechs() {
		var xys plotter.XYs
		for _, n := range lengths {
			if acc, _, ok := r.overall(mech, n); ok {
				xys = append(xys, plotter.XY{X: float64(n), Y: acc})
			}
		}
		if len(xys) == 0 {
			continue
		}
		if err := pal.Line(p, mech, xys); err != nil {
			return nil, err
		}
	}
	p.X.Min, p.X.Max = float64(lengths[0])/1.15, float64(lengths[len(lengths)-1])*1.15
	p.Y.Min, p.Y.Max = -0.03, 1.03
	leg := p.Legend
	p.Legend = plot.NewLegend()
	return render(format, plotW+sideW, plotH, func(dc draw.Canvas) {
		p.Draw(draw.Crop(dc, 0, -sideW, 0, 0))
		leg.Top, leg.Left = true, true
		leg.XOffs, leg.YOffs = vg.Points(4), -vg.Points(24)
		leg.Draw(draw.Crop(dc, plotW, 0, 0, 0))
	})
}

// render draws into a white canvas of w×h and encodes it as format.
func render(format string, w, h vg.Length, paint func(draw.Canvas)) ([]byte, error) {
	var buf bytes.Buffer
	switch format {
	case "png":
		c := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
		paint(draw.New(c))
		if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(&buf); err != nil {
			return nil, err
		}
	case "svg":
		c := vgsvg.New(w, h)
		dc := draw.New(c)
		dc.SetColor(color.White)
		dc.Fill(dc.Rectangle.Path())
		paint(dc)
		if _, err := c.WriteTo(&buf); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: image format %q, want png or svg", attn.ErrInput, format)
	}
	return buf.Bytes(), nil
}

// FileName returns the name of mech's heat map without extension:
// needle-MECH, with every character of a patch spec that does not belong
// in a file name replaced by '_'.
func FileName(mech string) string {
	b := []byte("needle-" + mech)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '=') {
			b[i] = '_'
		}
	}
	return string(b)
}

// WriteReport writes r to directory dir (made if missing): needle.json,
// a heat map per mechanism (FileName(mech) .png and .svg; two mechanisms
// whose names map to one file name get -2, -3, … appended) and the
// accuracy against length of every mechanism (needle-accuracy .png and
// .svg). It returns the files' paths.
func WriteReport(dir string, r *Results) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	write := func(name string, data []byte) error {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
		files = append(files, path)
		return nil
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		return nil, err
	}
	if err := write("needle.json", js.Bytes()); err != nil {
		return nil, err
	}
	used := map[string]bool{"needle-accuracy": true, "needle": true}
	for _, mech := range r.Mechs() {
		base := FileName(mech)
		for k := 2; used[strings.ToLower(base)]; k++ {
			base = FileName(mech) + "-" + strconv.Itoa(k)
		}
		used[strings.ToLower(base)] = true
		for _, f := range []string{"png", "svg"} {
			img, err := HeatMap(r, mech, f)
			if err != nil {
				return nil, err
			}
			if err := write(base+"."+f, img); err != nil {
				return nil, err
			}
		}
	}
	for _, f := range []string{"png", "svg"} {
		img, err := AccuracyPlot(r, f)
		if err != nil {
			return nil, err
		}
		if err := write("needle-accuracy."+f, img); err != nil {
			return nil, err
		}
	}
	return files, nil
}
