package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/attnkit/attn/experiment"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/registry"
)

// patchingMechs are the softmax approximations of the HyperAttention
// paper's Figure 3, in the order its legend lists them.
var patchingMechs = []string{"window", "strided", "longformer", "bigbird", "reformer", "performer", "hyper"}

// scaledBudget returns mechanism name's `attn patching` budget for
// windows of n tokens, the shortest of which has shortest tokens: the
// registry entry's rule (registry.Entry.Budget), about n/8 keys per query.
func scaledBudget(name string, n, shortest int) registry.Budget {
	e, err := registry.Lookup(name)
	if err != nil {
		return registry.Budget{Rule: "the registry's defaults"}
	}
	return e.Budget(n, shortest)
}

// patchingPoint is one perplexity run: the last Patched layers replaced.
type patchingPoint struct {
	Patched      int     `json:"patched_layers"`  // ℓ
	Layers       []int   `json:"layers"`          // the patched layers, L-ℓ…L-1
	Patch        string  `json:"patch,omitempty"` // as for attn ppl -patch
	Perplexity   float64 `json:"perplexity"`
	BitsPerChar  float64 `json:"bits_per_char"`
	NatsPerToken float64 `json:"nats_per_token"`
	AttnSeconds  float64 `json:"attn_seconds"`      // inside the attention calls, every layer, every window
	Seconds      float64 `json:"seconds"`           // the whole run (with -kl, the exact model's too)
	MeanKL       float64 `json:"mean_kl,omitempty"` // with -kl: KL(exact ‖ patched), nats/token
	// LayerRelErr, with -kl, is each layer's attention error against
	// exact attention on the same inputs (see model.PerplexityResult).
	LayerRelErr []float64 `json:"layer_rel_err,omitempty"`
	// Fallbacks has a line for each patched layer that ran exact
	// attention instead of its approximation, saying why.
	Fallbacks []string `json:"fallbacks,omitempty"`
}

// patchingMech is one mechanism's curve.
type patchingMech struct {
	Name         string          `json:"name"`
	Settings     []string        `json:"settings"`
	Budget       string          `json:"budget"`
	KeysPerQuery float64         `json:"keys_per_query,omitempty"`
	Points       []patchingPoint `json:"points"` // ℓ ascending; ℓ = 0 is the exact run
	Error        string          `json:"error,omitempty"`
}

// patchingJSON is what patching writes to -out DIR/patching.json.
type patchingJSON struct {
	Model      string         `json:"model"`
	Text       string         `json:"text"`
	Context    int            `json:"context"`
	Stride     int            `json:"stride"`
	N          int            `json:"n"` // the length the budgets are scaled to
	Windows    int            `json:"windows"`
	Tokens     int            `json:"tokens"`
	Chars      int            `json:"chars"`
	Layers     int            `json:"layers"`
	Workers    int            `json:"workers"`
	Seed       uint64         `json:"seed"`
	KL         bool           `json:"kl"`
	Exact      patchingPoint  `json:"exact"`
	Mechanisms []patchingMech `json:"mechanisms"`
}

func cmdPatching(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("patching", stdout, stderr, helpText{
		synopsis: "attn patching [-model FILE] [-text FILE] [-ctx N] [-mech LIST] [-layers LIST] [-set MECH:name=value ...] [-out DIR] [flags]",
		examples: []string{
			"attn patching -ctx 2048 -tokens 32768 -out patching-out   # the embedded model on embedded Persuasion",
			"attn patching -text book.txt -mech window,hyper -layers 0-2 -set hyper:samples=128",
		},
		about: `Perplexity as the attention of the last ℓ layers is replaced by an
approximation, for ℓ = 0…L and each mechanism, and the time spent in
attention (the HyperAttention paper's Figure 3). ℓ = 0 is the exact model,
run once and shared by every curve.`,
		more: func(w io.Writer) {
			fmt.Fprint(w, `Budgets scale with n, the window length (-ctx, or the text when shorter),
so that each mechanism sees about n/8 keys per query on average (exact
attention, causal, averages (n+1)/2):
`)
			for _, name := range patchingMechs {
				fmt.Fprintf(w, "  %-10s %s\n", name, scaledBudget(name, 2048, 2048).Rule)
			}
			fmt.Fprintln(w, "and min=0 (no fallback to exact) for reformer, performer and hyper.")
			fmt.Fprintln(w, "Other registered mechanisms run with their defaults; -set changes any of them.")
		},
	})
	var mf modelFlags
	mf.register(fs, false)
	textPath := fs.String("text", "", "text `FILE` to score (UTF-8; .gz is read gunzipped; default: Persuasion, embedded)")
	ctxLen := fs.Int("ctx", 0, "tokens per window, n (0: the model's context, or 512)")
	stride := fs.Int("stride", 0, "tokens a window moves (0: half the window)")
	limit := fs.Int("tokens", 0, "score only the first `N` tokens of the text (0: all)")
	mechList := fs.String("mech", strings.Join(patchingMechs, ","), "comma-separated `mechanisms`, one curve each")
	fs.alias("mechs", "mech")
	layerList := fs.String("layers", "all", "the values of ℓ to run: `LIST` of numbers and ranges lo-hi, or all (0…L); 0 always runs")
	kl := fs.Bool("kl", false, "also the KL divergence from the exact model and each layer's attention error (runs the exact model on every window again)")
	out := fs.String("out", "", "write `DIR`/patching.json, patching.md, patching.png and patching.svg")
	var sets listFlag
	fs.Var(&sets, "set", "override or add parameters: `SPEC` MECH:name=value[,name=value] for one mechanism, name=value for every one that has it (repeatable, or ';'-separated)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tcfg := experiment.TextConfig{Path: *textPath, Limit: *limit, Context: *ctxLen, Stride: *stride}
	if err := tcfg.Check(); err != nil {
		return err
	}
	mechs, err := parseMechs(*mechList)
	if err != nil {
		return err
	}
	overrides, err := experiment.ParseSettings(sets)
	if err != nil {
		return err
	}
	if err := overrides.Check(mechs, nil); err != nil {
		return err
	}
	exact, _, tok, err := mf.load()
	if err != nil {
		return err
	}
	L := exact.Config().Layers
	ells, err := parseEll(*layerList, L)
	if err != nil {
		return err
	}
	tcfg.SeqLen = exact.Config().SeqLen
	text, err := experiment.LoadText(tcfg, tok)
	if err != nil {
		return err
	}
	printLines(stderr, text.Notes)
	tokens, chars, opts := text.Tokens, text.Chars, text.Options()
	n, shortest := text.Longest, text.Shortest

	res := patchingJSON{
		Model: mf.model, Text: text.Name, Context: opts.Context, Stride: opts.Stride, N: n,
		Windows: text.Windows, Tokens: len(tokens) - 1, Chars: chars, Layers: L,
		Workers: mf.workers, Seed: mf.seed, KL: *kl,
	}
	if res.Workers == 0 {
		res.Workers = runtime.GOMAXPROCS(0)
	}
	// Every mechanism is built once here, so that a bad parameter stops
	// the command before the first (long) perplexity run, not after it.
	for _, name := range mechs {
		b := scaledBudget(name, n, shortest)
		if e, err := registry.Lookup(name); err == nil {
			if merged := overrides.For(e, b.Settings); !slices.Equal(merged, b.Settings) {
				b.Rule += "; with -set " + strings.Join(overrides.For(e, nil), ",")
				b.Settings, b.Keys = merged, 0
			}
		}
		if _, err := registry.New(name, b.Settings, mf.seed); err != nil {
			return fmt.Errorf("-mech %s: %w", name, err)
		}
		res.Mechanisms = append(res.Mechanisms, patchingMech{Name: name, Settings: b.Settings, Budget: b.Rule, KeysPerQuery: b.Keys})
	}

	fmt.Fprintln(stdout, "model ", describeModel(mf.model, exact))
	fmt.Fprintf(stdout, "text   %s: %d characters, %d tokens; windows of %d tokens, stride %d: %d windows\n",
		text.Name, chars, len(tokens), opts.Context, opts.Stride, text.Windows)
	fmt.Fprintf(stdout, "\nbudgets for n = %d (exact: (n+1)/2 = %.0f keys per query on average):\n", n, float64(n+1)/2)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mechanism\tsettings\t≈keys/query\trule")
	for _, m := range res.Mechanisms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Name, strings.Join(m.Settings, ","), fmtKeys(m.KeysPerQuery), m.Budget)
	}
	tw.Flush()

	// A progress step is one perplexity run: a line each where stderr is
	// not a terminal (a log), the bar following the windows where it is.
	prog := newProgress(stderr, 1+len(mechs)*(len(ells)-1), 0)
	score := func(m *model.Model, label string) (patchingPoint, error) {
		o := opts
		if *kl && m != exact {
			o.Reference = exact
		}
		prog.begin(fmt.Sprintf("%s, window 1/%d", label, text.Windows))
		o.Progress = func(d, total int) {
			if d < total {
				prog.begin(fmt.Sprintf("%s, window %d/%d", label, d+1, total))
			}
		}
		start := time.Now()
		r, err := model.Perplexity(ctx, m, tokens, o)
		prog.label = label
		if err != nil {
			prog.end(err.Error())
			return patchingPoint{}, err
		}
		p := patchingPoint{
			Perplexity: r.PPL(), BitsPerChar: r.BitsPerChar(chars), NatsPerToken: r.NLL / float64(r.Tokens),
			AttnSeconds: r.AttnSeconds, Seconds: time.Since(start).Seconds(),
		}
		if o.Reference != nil {
			p.MeanKL, p.LayerRelErr = r.MeanKL(), r.LayerErr
		}
		prog.end(fmt.Sprintf("perplexity %.6g, %.3gs in attention of %.3gs", p.Perplexity, p.AttnSeconds, p.Seconds))
		return p, nil
	}
	res.Exact, err = score(exact, "exact")
	if err != nil {
		prog.finish()
		return fmt.Errorf("exact: %w", err)
	}
	res.Exact.Layers = []int{}
	var failed []string
	for i := range res.Mechanisms {
		pm := &res.Mechanisms[i]
		pm.Points = append(pm.Points, res.Exact)
		// A layer's mechanism is the same in every run that patches it:
		// say once that it falls back.
		said := map[string]bool{}
		for _, ell := range ells[1:] {
			p := model.Patch{Mechanism: pm.Name, Settings: pm.Settings}
			for l := L - ell; l < L; l++ {
				p.Layers = append(p.Layers, l)
			}
			var pt patchingPoint
			m, err := model.New(exact.Weights(), model.Options{Workers: mf.workers, Patches: []model.Patch{p}, Seed: mf.seed})
			var fallbacks []string
			if err == nil {
				fallbacks = layerFallbacks(m, L, n, shortest)
				for _, line := range fallbacks {
					if !said[line] {
						said[line] = true
						prog.note(line)
					}
				}
				pt, err = score(m, fmt.Sprintf("%s ℓ=%d", pm.Name, ell))
			} else {
				prog.done++ // score counts its own runs
			}
			if err != nil {
				if ctx.Err() != nil {
					prog.finish()
					return ctx.Err()
				}
				// One mechanism failing (say, one that cannot run causal)
				// should not cost the others' curves: note it, skip its
				// remaining ℓ, which would fail the same way.
				pm.Error = fmt.Sprintf("ℓ=%d: %v", ell, err)
				failed = append(failed, pm.Name)
				prog.done += len(ells) - 1 - slices.Index(ells, ell)
				break
			}
			pt.Patched, pt.Layers, pt.Patch, pt.Fallbacks = ell, p.Layers, p.String(), fallbacks
			pm.Points = append(pm.Points, pt)
		}
	}
	prog.finish()

	fmt.Fprintln(stdout)
	writePatchingTables(stdout, &res, ells, false)
	if *out != "" {
		if err := writePatching(*out, &res, ells); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "\nwrote", filepath.Join(*out, "patching.{json,md,png,svg}"))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d mechanisms failed: %s (see the tables)", len(failed), strings.Join(failed, ", "))
	}
	return nil
}

// parseMechs parses -mech: registered names, each once.
func parseMechs(s string) ([]string, error) {
	var names []string
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if _, err := registry.Lookup(name); err != nil {
			return nil, fmt.Errorf("-mech: %w", err)
		}
		if slices.Contains(names, name) {
			return nil, fmt.Errorf("-mech: %s listed twice", name)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("-mech: no mechanism")
	}
	return names, nil
}

// parseEll parses -layers: "all" (0…L) or numbers and ranges lo-hi in
// [0, L]. The result is ascending, without repeats, and starts with 0: the
// exact model is every curve's first point.
func parseEll(s string, L int) ([]int, error) {
	if strings.TrimSpace(s) == "all" {
		s = fmt.Sprintf("0-%d", L)
	}
	ells, err := parseInts("layers", s, 0, L, true)
	if err != nil {
		return nil, fmt.Errorf("%w (the model has %d layers)", err, L)
	}
	ells = append(ells, 0)
	slices.Sort(ells)
	return slices.Compact(ells), nil
}

func fmtKeys(k float64) string {
	if k <= 0 {
		return "?"
	}
	return strconv.FormatFloat(math.Round(k), 'f', 0, 64)
}

// writePatchingTables prints the perplexity and attention-time tables, as
// text or (md) as markdown.
func writePatchingTables(w io.Writer, res *patchingJSON, ells []int, md bool) {
	cell := func(p *patchingPoint, secs bool) string {
		c := strconv.FormatFloat(p.Perplexity, 'g', 6, 64)
		if secs {
			c = strconv.FormatFloat(p.AttnSeconds, 'f', 3, 64)
		}
		if len(p.Fallbacks) > 0 {
			c += "*"
		}
		return c
	}
	anyFallback := false
	for _, m := range res.Mechanisms {
		for _, p := range m.Points {
			anyFallback = anyFallback || len(p.Fallbacks) > 0
		}
	}
	for _, secs := range []bool{false, true} {
		title := "perplexity as the last ℓ layers are patched (ℓ = 0: exact)"
		if secs {
			title = "attention seconds: wall time inside the attention calls, all layers and windows"
		}
		header := []string{"ℓ", "layers"}
		for _, m := range res.Mechanisms {
			header = append(header, m.Name)
		}
		var rows [][]string
		for _, ell := range ells {
			layers := "—"
			switch {
			case ell == 1:
				layers = strconv.Itoa(res.Layers - 1)
			case ell > 1:
				layers = fmt.Sprintf("%d–%d", res.Layers-ell, res.Layers-1)
			}
			row := []string{strconv.Itoa(ell), layers}
			for i := range res.Mechanisms {
				c := "—"
				for j := range res.Mechanisms[i].Points {
					if p := &res.Mechanisms[i].Points[j]; p.Patched == ell {
						c = cell(p, secs)
					}
				}
				if c == "—" && res.Mechanisms[i].Error != "" {
					c = "failed"
				}
				row = append(row, c)
			}
			rows = append(rows, row)
		}
		if md {
			fmt.Fprintf(w, "## %s\n\n", strings.ToUpper(title[:1])+title[1:])
			fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
			for _, r := range rows {
				fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
			}
			fmt.Fprintln(w)
			continue
		}
		if secs {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, title+":")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, r := range append([][]string{header}, rows...) {
			fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
		}
		tw.Flush()
	}
	if anyFallback {
		fmt.Fprintln(w, "* some patched layers ran exact attention instead of the approximation:")
		for _, m := range res.Mechanisms {
			said := map[string]bool{}
			for _, p := range m.Points {
				for _, l := range p.Fallbacks {
					if !said[l] {
						said[l] = true
						fmt.Fprintf(w, "  %s %s\n", m.Name, l)
					}
				}
			}
		}
	}
	for _, m := range res.Mechanisms {
		if m.Error != "" {
			fmt.Fprintf(w, "%s failed at %s\n", m.Name, m.Error)
		}
	}
}

// writePatching writes patching.json, patching.md and the figure, as PNG
// and SVG, into dir.
func writePatching(dir string, res *patchingJSON, ells []int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "# Perplexity as the last ℓ layers' attention is approximated\n\n")
	fmt.Fprintf(&md, "Model `%s` (%d layers), text `%s`: %d tokens scored in %d windows of %d tokens, stride %d; seed %d, %d workers.\n\n",
		filepath.Base(res.Model), res.Layers, filepath.Base(res.Text), res.Tokens, res.Windows, res.Context, res.Stride, res.Seed, res.Workers)
	fmt.Fprintf(&md, "## Budgets for n = %d\n\nExact attention sees (n+1)/2 = %.0f keys per query on average.\n\n", res.N, float64(res.N+1)/2)
	fmt.Fprintf(&md, "| mechanism | settings | ≈ keys/query | rule |\n|---|---|---|---|\n")
	for _, m := range res.Mechanisms {
		fmt.Fprintf(&md, "| %s | `%s` | %s | %s |\n", m.Name, strings.Join(m.Settings, ","), fmtKeys(m.KeysPerQuery), m.Budget)
	}
	fmt.Fprintln(&md)
	writePatchingTables(&md, res, ells, true)
	fmt.Fprintf(&md, "![perplexity and attention time against ℓ](patching.png)\n")
	pngB, svgB, err := patchingFigure(res)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"patching.json": append(b, '\n'), "patching.md": md.Bytes(), "patching.png": pngB, "patching.svg": svgB,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Sizes of the figure: two panels side by side and the legend in a column
// of its own on the right, where it hides no line (as in package eval's
// report).
const (
	patchPanelW = 5.5 * vg.Inch
	patchLegW   = 1.6 * vg.Inch
	patchH      = 4.2 * vg.Inch
)

// patchingFigure draws perplexity and attention time against ℓ, one line
// per mechanism, and returns the figure as PNG and SVG.
func patchingFigure(res *patchingJSON) (pngB, svgB []byte, err error) {
	ppl, secs := plot.New(), plot.New()
	ppl.Title.Text = fmt.Sprintf("perplexity, n = %d", res.N)
	secs.Title.Text = "time in attention, all layers and windows"
	ppl.Y.Label.Text, secs.Y.Label.Text = "perplexity", "seconds"
	lo, hi := math.Inf(1), 0.0
	for _, p := range []*plot.Plot{ppl, secs} {
		p.X.Label.Text = "ℓ: last layers patched"
		p.X.Tick.Marker = intTicks{}
		p.Add(plotter.NewGrid())
	}
	for i, m := range res.Mechanisms {
		var xp, xs plotter.XYs
		for _, pt := range m.Points {
			xp = append(xp, plotter.XY{X: float64(pt.Patched), Y: pt.Perplexity})
			xs = append(xs, plotter.XY{X: float64(pt.Patched), Y: pt.AttnSeconds})
			lo, hi = math.Min(lo, pt.Perplexity), math.Max(hi, pt.Perplexity)
		}
		if err := patchLine(ppl, m.Name, i, xp); err != nil {
			return nil, nil, err
		}
		if err := patchLine(secs, m.Name, i, xs); err != nil {
			return nil, nil, err
		}
	}
	// Exact's perplexity across the panel, so that each curve reads as a
	// distance from it.
	if len(res.Mechanisms) > 0 && len(res.Mechanisms[0].Points) > 0 {
		ms := res.Mechanisms[0].Points
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: res.Exact.Perplexity}, {X: float64(ms[len(ms)-1].Patched), Y: res.Exact.Perplexity}})
		if err != nil {
			return nil, nil, err
		}
		l.Color, l.Dashes = color.Gray{Y: 120}, []vg.Length{vg.Points(6), vg.Points(3)}
		ppl.Add(l)
		ppl.Legend.Add("exact", l)
	}
	// Patching can multiply perplexity; a log axis keeps the good curves
	// readable when one mechanism blows up.
	if hi > 10*lo && lo > 0 {
		ppl.Y.Scale, ppl.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	secs.Y.Min = 0
	draw2 := func(c vg.CanvasSizer) {
		dc := draw.New(c)
		leg := ppl.Legend
		ppl.Legend, secs.Legend = plot.NewLegend(), plot.NewLegend()
		ppl.Draw(draw.Crop(dc, 0, -(patchPanelW + patchLegW), 0, 0))
		secs.Draw(draw.Crop(dc, patchPanelW, -patchLegW, 0, 0))
		leg.Top, leg.Left = true, true
		leg.XOffs, leg.YOffs = vg.Points(4), -vg.Points(24)
		leg.Draw(draw.Crop(dc, 2*patchPanelW, 0, 0, 0))
		ppl.Legend = leg
	}
	w := 2*patchPanelW + patchLegW
	ic := vgimg.NewWith(vgimg.UseWH(w, patchH), vgimg.UseDPI(110), vgimg.UseBackgroundColor(color.White))
	draw2(ic)
	var pb bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: ic}).WriteTo(&pb); err != nil {
		return nil, nil, err
	}
	sc := vgsvg.New(w, patchH)
	draw2(sc)
	var sb bytes.Buffer
	if _, err := sc.WriteTo(&sb); err != nil {
		return nil, nil, err
	}
	return pb.Bytes(), sb.Bytes(), nil
}

// patchLine adds a line with points in style i (package eval's: color,
// glyph, and dashes once the colors repeat) to p and its legend.
func patchLine(p *plot.Plot, name string, i int, xys plotter.XYs) error {
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	c := plotutil.Color(i)
	l.Color, l.Dashes, l.Width = c, plotutil.Dashes(i/7), vg.Points(1.5)
	pts.Color, pts.Shape = c, plotutil.Shape(i)
	p.Add(l, pts)
	p.Legend.Add(name, l, pts)
	return nil
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
