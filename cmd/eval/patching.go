package eval

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// PatchingPoint is one perplexity run of `attn patching`: the last
// Patched layers' attention replaced.
type PatchingPoint struct {
	Patched      int     `json:"patched_layers"`  // ℓ
	Layers       []int   `json:"layers"`          // the patched layers, L-ℓ…L-1
	Patch        string  `json:"patch,omitempty"` // as for attn ppl -patch
	Perplexity   float64 `json:"perplexity"`
	BitsPerChar  float64 `json:"bits_per_char"`
	NatsPerToken float64 `json:"nats_per_token"`
	AttnSeconds  float64 `json:"attn_seconds"`      // inside the attention calls, every layer, every window
	Seconds      float64 `json:"seconds"`           // the whole run (with KL, the exact model's too)
	MeanKL       float64 `json:"mean_kl,omitempty"` // with KL: KL(exact ‖ patched), nats/token
	// LayerRelErr, with KL, is each layer's attention error against
	// exact attention on the same inputs (see model.PerplexityResult).
	LayerRelErr []float64 `json:"layer_rel_err,omitempty"`
	// Fallbacks has a line for each patched layer that ran exact
	// attention instead of its approximation, saying why.
	Fallbacks []string `json:"fallbacks,omitempty"`
}

// PatchingMech is one mechanism's curve.
type PatchingMech struct {
	Name         string          `json:"name"`
	Settings     []string        `json:"settings"`
	Budget       string          `json:"budget"`
	KeysPerQuery float64         `json:"keys_per_query,omitempty"`
	Points       []PatchingPoint `json:"points"` // ℓ ascending; ℓ = 0 is the exact run
	Error        string          `json:"error,omitempty"`
}

// Patching is what `attn patching -out DIR` writes to DIR/patching.json:
// perplexity and attention time as the last ℓ layers of a model are
// patched, for each mechanism (the HyperAttention paper's Figure 3).
type Patching struct {
	Model   string `json:"model"`
	Text    string `json:"text"`
	Context int    `json:"context"`
	Stride  int    `json:"stride"`
	N       int    `json:"n"` // the length the budgets are scaled to
	Windows int    `json:"windows"`
	Tokens  int    `json:"tokens"`
	Chars   int    `json:"chars"`
	Layers  int    `json:"layers"`
	Workers int    `json:"workers"`
	Seed    uint64 `json:"seed"`
	KL      bool   `json:"kl"`
	// Ells are the values of ℓ run, 0 first.
	Ells       []int          `json:"ells,omitempty"`
	Exact      PatchingPoint  `json:"exact"`
	Mechanisms []PatchingMech `json:"mechanisms"`
}

// PatchingFile is the name SavePatching writes its JSON under.
const PatchingFile = "patching.json"

// ells returns the values of ℓ of p: Ells, or for files written before
// it, the ℓ of every point.
func (p *Patching) ells() []int {
	if len(p.Ells) > 0 {
		return p.Ells
	}
	ells := []int{0}
	for _, m := range p.Mechanisms {
		for _, pt := range m.Points {
			if pt.Patched > ells[len(ells)-1] {
				ells = append(ells, pt.Patched)
			}
		}
	}
	return ells
}

// KeysText prints a budget's keys per query, "?" where unknown.
func KeysText(k float64) string {
	if k <= 0 {
		return "?"
	}
	return strconv.FormatFloat(math.Round(k), 'f', 0, 64)
}

// BudgetTable is the budgets of p's mechanisms at n.
func (p *Patching) BudgetTable() Table {
	t := Table{Title: fmt.Sprintf("budgets for n = %d (exact: (n+1)/2 = %.0f keys per query on average)", p.N, float64(p.N+1)/2),
		Head: []string{"mechanism", "settings", "≈keys/query", "rule"}, Left: 4}
	for _, m := range p.Mechanisms {
		t.Rows = append(t.Rows, []string{m.Name, strings.Join(m.Settings, ","), KeysText(m.KeysPerQuery), m.Budget})
	}
	return t
}

// patchingSection is the perplexity and attention-time tables of p.
func (p *Patching) section() Section {
	sec := Section{ID: "patching", Title: fmt.Sprintf("patching the last ℓ of %d layers of %s (%s, windows of %d tokens)",
		p.Layers, filepath.Base(p.Model), p.Text, p.Context)}
	cell := func(pt *PatchingPoint, secs bool) string {
		c := strconv.FormatFloat(pt.Perplexity, 'g', 6, 64)
		if secs {
			c = strconv.FormatFloat(pt.AttnSeconds, 'f', 3, 64)
		}
		if len(pt.Fallbacks) > 0 {
			c += fallbackMark
		}
		return c
	}
	for _, secs := range []bool{false, true} {
		t := Table{Title: "perplexity as the last ℓ layers are patched (ℓ = 0: exact)", Head: []string{"ℓ", "layers"}}
		if secs {
			t.Title = "attention seconds: wall time inside the attention calls, all layers and windows"
		}
		for _, m := range p.Mechanisms {
			t.Head = append(t.Head, m.Name)
		}
		for _, ell := range p.ells() {
			layers := "—"
			switch {
			case ell == 1:
				layers = strconv.Itoa(p.Layers - 1)
			case ell > 1:
				layers = fmt.Sprintf("%d–%d", p.Layers-ell, p.Layers-1)
			}
			row := []string{strconv.Itoa(ell), layers}
			for i := range p.Mechanisms {
				c := "—"
				for j := range p.Mechanisms[i].Points {
					if pt := &p.Mechanisms[i].Points[j]; pt.Patched == ell {
						c = cell(pt, secs)
					}
				}
				if c == "—" && p.Mechanisms[i].Error != "" {
					c = "failed"
				}
				row = append(row, c)
			}
			t.Rows = append(t.Rows, row)
		}
		sec.Tables = append(sec.Tables, t)
	}
	for _, m := range p.Mechanisms {
		said := map[string]bool{}
		for _, pt := range m.Points {
			for _, l := range pt.Fallbacks {
				if !said[l] {
					said[l] = true
					sec.Fallbacks = append(sec.Fallbacks, m.Name+" "+l)
				}
			}
		}
		if m.Error != "" {
			sec.Notes = append(sec.Notes, fmt.Sprintf("%s failed at %s", m.Name, m.Error))
		}
	}
	return sec
}

// WritePatchingTables prints p's perplexity and attention-time tables, as
// text or, with md, as Markdown.
func WritePatchingTables(w io.Writer, p *Patching, md bool) {
	writeSections(w, []Section{p.section()}, md)
}

// SavePatching writes p to dir: patching.json, patching.md and the
// figure as patching.png and patching.svg, then the report of everything
// in dir (SaveReport).
func SavePatching(dir string, p *Patching) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "# Perplexity as the last ℓ layers' attention is approximated\n\n")
	fmt.Fprintf(&md, "Model `%s` (%d layers), text `%s`: %d tokens scored in %d windows of %d tokens, stride %d; seed %d, %d workers.\n\n",
		filepath.Base(p.Model), p.Layers, p.Text, p.Tokens, p.Windows, p.Context, p.Stride, p.Seed, p.Workers)
	fmt.Fprintf(&md, "## Budgets\n\n")
	writeMarkdown(&md, p.BudgetTable())
	WritePatchingTables(&md, p, true)
	fmt.Fprintf(&md, "\n![perplexity and attention time against ℓ](patching.svg)\n")
	fig, err := p.figure()
	if err != nil {
		return err
	}
	files := map[string][]byte{PatchingFile: append(b, '\n'), "patching.md": md.Bytes(), "patching.png": fig.PNG, "patching.svg": fig.SVG}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return SaveReport(dir)
}

// LoadPatching reads DIR/patching.json; a missing file gives (nil, nil).
func LoadPatching(dir string) (*Patching, error) {
	buf, err := os.ReadFile(filepath.Join(dir, PatchingFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var p Patching
	if err := json.Unmarshal(buf, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, PatchingFile), err)
	}
	return &p, nil
}

// figure draws perplexity and attention time against ℓ, one line per
// mechanism, side by side with one legend, as the report's plots are.
func (p *Patching) figure() (Figure, error) {
	ppl, secs := newPlot(fmt.Sprintf("perplexity, n = %d", p.N), "ℓ: last layers patched", "perplexity"),
		newPlot("time in attention, all layers and windows", "ℓ: last layers patched", "seconds")
	lo, hi := math.Inf(1), 0.0
	for _, pl := range []*plot.Plot{ppl, secs} {
		pl.X.Tick.Marker = intTicks{}
	}
	names := make([]string, len(p.Mechanisms))
	for i, m := range p.Mechanisms {
		names[i] = m.Name
	}
	pal := newPalette(names)
	for _, m := range p.Mechanisms {
		var xp, xs plotter.XYs
		for _, pt := range m.Points {
			xp = append(xp, plotter.XY{X: float64(pt.Patched), Y: pt.Perplexity})
			xs = append(xs, plotter.XY{X: float64(pt.Patched), Y: pt.AttnSeconds})
			lo, hi = math.Min(lo, pt.Perplexity), math.Max(hi, pt.Perplexity)
		}
		if len(xp) == 0 {
			continue
		}
		if err := pal.Line(ppl, m.Name, xp); err != nil {
			return Figure{}, err
		}
		if err := pal.Line(secs, m.Name, xs); err != nil {
			return Figure{}, err
		}
	}
	// Exact's perplexity across the panel, so that each curve reads as a
	// distance from it.
	ells := p.ells()
	if len(ells) > 1 {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: p.Exact.Perplexity}, {X: float64(ells[len(ells)-1]), Y: p.Exact.Perplexity}})
		if err != nil {
			return Figure{}, err
		}
		l.Color, l.Dashes = color.Gray{Y: 120}, []vg.Length{vg.Points(6), vg.Points(3)}
		ppl.Add(l)
		ppl.Legend.Add("exact", l)
	}
	// Patching can multiply perplexity; a log axis keeps the good curves
	// readable when one mechanism blows up.
	if hi > 10*lo && lo > 0 {
		ppl.Y.Scale, ppl.Y.Tick.Marker = plot.LogScale{}, logTicks{}
	}
	secs.Y.Min = 0
	return renderPanels("perplexity and attention time against ℓ", ppl, secs)
}

// intTicks labels whole numbers only, at most about a dozen, since ℓ is a
// count of layers.
type intTicks struct{}

func (intTicks) Ticks(lo, hi float64) []plot.Tick {
	a, b := int(math.Ceil(lo)), int(math.Floor(hi))
	step := max(1, (b-a+11)/12)
	var out []plot.Tick
	for v := a; v <= b; v++ {
		t := plot.Tick{Value: float64(v)}
		if (v-a)%step == 0 {
			t.Label = strconv.Itoa(v)
		}
		out = append(out, t)
	}
	return out
}
