// Package plotstyle holds what every plot of attn shares: its font, the
// one the report's page asks for, and the palette that gives each
// mechanism one colour and glyph in every plot.
package plotstyle

import (
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/attnkit/attn/registry"
)

// Font is the typeface of every plot, the one the report's page asks
// for first (Liberation Sans, metric-compatible with Arial), so that the
// figures read as part of the page.
var Font = font.Font{Typeface: "Liberation", Variant: "Sans"}

// Sans is the plot font at size.
func Sans(size vg.Length) font.Font { return font.From(Font, size) }

// SetFonts gives every text of p the plot font.
func SetFonts(p *plot.Plot) {
	p.Title.TextStyle.Font = Sans(13)
	p.Title.Padding = vg.Points(8)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = Sans(11)
		a.Tick.Label.Font = Sans(9.5)
	}
	p.Legend.TextStyle.Font = Sans(10)
}

// Distinct are colours far apart from each other and from white, in an
// order where neighbours differ most (after Kelly's and Tableau's sets):
// every mechanism of a report gets its own.
var Distinct = []color.RGBA{
	{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
	{148, 103, 189, 255}, {23, 190, 207, 255}, {140, 86, 75, 255}, {227, 119, 194, 255},
	{0, 0, 0, 255}, {188, 189, 34, 255}, {0, 83, 138, 255}, {255, 187, 120, 255},
	{152, 223, 138, 255}, {174, 199, 232, 255}, {197, 176, 213, 255}, {127, 127, 127, 255},
	{255, 152, 150, 255}, {158, 218, 229, 255}, {219, 219, 141, 255}, {196, 156, 148, 255},
}

var Glyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.PlusGlyph{},
	draw.CrossGlyph{}, draw.RingGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{}}

// palette gives each name its own colour and glyph, the same in every
// plot of a report; past len(Distinct) names the colours come again with
// dashes. The float64 reference and the registered mechanisms come
// first, in the registry's order, so that a mechanism has one colour in
// every report.
type Palette struct{ names []string }

// NewPalette returns the palette of a report that draws names.
func NewPalette(names []string) *Palette {
	p := &Palette{names: append([]string{"ref"}, registry.Names()...)}
	for _, n := range names {
		p.Index(n)
	}
	return p
}

// LocalPalette is a palette of names alone: the lines of one plot that
// are not mechanisms (the error metrics of a sweep).
func LocalPalette(names []string) *Palette {
	p := &Palette{}
	for _, n := range names {
		p.Index(n)
	}
	return p
}

// Index returns name's place in the palette, adding it when new.
func (p *Palette) Index(name string) int {
	i := slices.Index(p.names, name)
	if i < 0 {
		p.names = append(p.names, name)
		i = len(p.names) - 1
	}
	return i
}

// Style returns name's colour, glyph and dashes (nil: solid).
func (p *Palette) Style(name string) (color.Color, draw.GlyphDrawer, []vg.Length) {
	i := p.Index(name)
	var dashes []vg.Length
	if i >= len(Distinct) {
		dashes = []vg.Length{vg.Points(5), vg.Points(2)}
	}
	return Distinct[i%len(Distinct)], Glyphs[i%len(Glyphs)], dashes
}

// Line adds name's line with points to pl and its legend.
func (p *Palette) Line(pl *plot.Plot, name string, xys plotter.XYs) error {
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	c, shape, dashes := p.Style(name)
	l.Color, l.Dashes, l.Width = c, dashes, vg.Points(1.6)
	pts.Color, pts.Shape, pts.Radius = c, shape, vg.Points(3)
	pl.Add(l, pts)
	pl.Legend.Add(name, l, pts)
	return nil
}
