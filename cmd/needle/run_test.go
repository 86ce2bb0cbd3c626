package needle

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/model"
)

// tinyModel returns random weights for the test tokenizer's vocabulary.
func tinyModel(t testing.TB, seed uint64) *model.Weights {
	t.Helper()
	cfg := model.Config{Dim: 24, Hidden: 40, Layers: 2, Heads: 4, KVHeads: 2, Vocab: testTokenizer(t).Len()}
	w, err := model.RandomWeights(cfg, seed)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// bigram returns weights whose next token depends on the current one
// alone, next[tok] (or token 0 where next has none): attention and MLP
// outputs are zero, the embedding one-hot and the output layer the table.
func bigram(t testing.TB, vocab int, next map[int]int) *model.Weights {
	t.Helper()
	dim := (vocab + 15) / 16 * 16
	w, err := model.NewWeights(model.Config{Dim: dim, Hidden: 16, Layers: 1, Heads: 2, Vocab: vocab})
	if err != nil {
		t.Fatal(err)
	}
	for i := range w.Norm {
		w.Norm[i] = 1
	}
	for l := range w.Layers {
		for i := range w.Layers[l].AttnNorm {
			w.Layers[l].AttnNorm[i], w.Layers[l].MLPNorm[i] = 1, 1
		}
	}
	for tok := range vocab {
		w.Embed[tok*dim+tok] = 1
		w.Output[next[tok]*dim+tok] = 1
	}
	return w
}

func TestAsk(t *testing.T) {
	tok := testTokenizer(t)
	b := newBuilder(t, tok)
	hay := Haystack(b, hayText(21, 2000), 0)
	c, err := b.Build(hay, 120, 0.5, "green owl", "135790")
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(c.Answer)))) != len(c.Answer) {
		t.Fatalf("answer tokens %v repeat: a bigram cannot say them", c.Answer)
	}
	stop := b.Encode(" the")[0]
	chain := map[int]int{c.Tokens[len(c.Tokens)-1]: c.Answer[0]}
	for i := 1; i < len(c.Answer); i++ {
		chain[c.Answer[i-1]] = c.Answer[i]
	}
	chain[c.Answer[len(c.Answer)-1]] = stop
	m, err := model.New(bigram(t, tok.Len(), chain), model.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	a, err := Ask(context.Background(), b, sess, tok.Len(), c)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Correct || a.Text != " #135790 the" || !slices.Equal(a.Tokens, append(slices.Clone(c.Answer), stop)) {
		t.Fatalf("answer %v %q correct %v, want the value then \" the\"", a.Tokens, a.Text, a.Correct)
	}
	// The same model with another value: wrong, and stopped as soon as
	// the text leaves the answer's path.
	c2, err := b.Build(hay, 120, 0.5, "green owl", "135799")
	if err != nil {
		t.Fatal(err)
	}
	sess.Reset()
	a, err = Ask(context.Background(), b, sess, tok.Len(), c2)
	if err != nil {
		t.Fatal(err)
	}
	if a.Correct || !strings.HasPrefix(" #135790 the", a.Text) || !decided(c2.AnswerText, a.Text) ||
		decided(c2.AnswerText, b.Continuation(c.Tokens[119], a.Tokens[:len(a.Tokens)-1])) {
		t.Fatalf("answer %q correct %v, want a wrong answer cut where it went wrong", a.Text, a.Correct)
	}
	// A model that never stops the number: cut at 2·len(answer)+2 tokens.
	loop := map[int]int{c.Tokens[len(c.Tokens)-1]: c.Answer[0]}
	for i := 1; i < len(c.Answer); i++ {
		loop[c.Answer[i-1]] = c.Answer[i]
	}
	loop[c.Answer[len(c.Answer)-1]] = c.Answer[len(c.Answer)-1]
	ml, err := model.New(bigram(t, tok.Len(), loop), model.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	sl, _ := ml.NewSession()
	if a, err = Ask(context.Background(), b, sl, tok.Len(), c); err != nil || a.Correct || len(a.Tokens) != len(c.Answer)+1 {
		t.Fatalf("answer %q (%d tokens) correct %v: %v", a.Text, len(a.Tokens), a.Correct, err)
	}
	// Errors: a used session, an empty case, a cancelled context.
	if _, err := Ask(context.Background(), b, sl, tok.Len(), c); !errors.Is(err, attn.ErrInput) {
		t.Errorf("used session: %v", err)
	}
	sl.Reset()
	if _, err := Ask(context.Background(), b, sl, tok.Len(), Case{}); !errors.Is(err, attn.ErrInput) {
		t.Errorf("empty case: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Ask(ctx, b, sl, tok.Len(), c); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func tinyConfig(t testing.TB) Config {
	mechs, err := MechsScaled([]string{"exact", "window", "linformer"})
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Weights: tinyModel(t, 31), Tokenizer: testTokenizer(t), Model: "tiny", Haystack: hayText(32, 1500), HaystackName: "synthetic",
		Lengths: []int{90, 131}, Depths: []float64{0, 0.5, 1}, Trials: 3, Seed: 33, Mechs: mechs, Workers: 2,
	}
}

// zeroTimes clears what depends on the clock.
func zeroTimes(r *Results) {
	for i := range r.Rows {
		r.Rows[i].Seconds = 0
	}
	for i := range r.Cases {
		r.Cases[i].Seconds = 0
	}
}

func TestRun(t *testing.T) {
	cfg := tinyConfig(t)
	var calls []int
	r, err := Run(context.Background(), cfg, func(done, total int) {
		if total != 3*2*3*3 {
			t.Errorf("total %d", total)
		}
		calls = append(calls, done)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 6 || calls[len(calls)-1] != 54 || !slices.IsSorted(calls) {
		t.Errorf("progress %v", calls)
	}
	if len(r.Rows) != 3*2*3 {
		t.Fatalf("%d rows, want 18", len(r.Rows))
	}
	i := 0
	for _, mech := range []string{"exact", "window", "linformer"} {
		for _, n := range cfg.Lengths {
			for _, d := range cfg.Depths {
				row := r.Rows[i]
				i++
				if row.Mech != mech || row.N != n || row.Depth != d {
					t.Fatalf("row %d is %s/%d/%v, want %s/%d/%v", i, row.Mech, row.N, row.Depth, mech, n, d)
				}
				if mech == "linformer" {
					if row.Error == "" || row.Trials != 0 {
						t.Errorf("linformer row %+v, want an error and no trials", row)
					}
					continue
				}
				if row.Error != "" || row.Trials != cfg.Trials || row.Correct < 0 || row.Correct > row.Trials ||
					row.Accuracy != float64(row.Correct)/float64(row.Trials) || !(row.Seconds > 0) {
					t.Errorf("row %+v", row)
				}
				correct := 0
				for _, c := range r.Cases {
					if c.Mech == mech && c.N == n && c.Depth == d && c.Correct {
						correct++
					}
				}
				if correct != row.Correct {
					t.Errorf("row %+v: %d correct answers", row, correct)
				}
			}
		}
	}
	if r.Rows[0].Patch != "exact" || r.Rows[6].Patch != "window:left=11,right=0" {
		t.Errorf("patches %q and %q, want exact and window's n/8", r.Rows[0].Patch, r.Rows[6].Patch)
	}
	// Every mechanism answered the same prompts.
	if len(r.Cases) != 2*2*3*3 {
		t.Fatalf("%d answers", len(r.Cases))
	}
	half := len(r.Cases) / 2
	for i, c := range r.Cases[:half] {
		w := r.Cases[half+i]
		if c.Mech != "exact" || w.Mech != "window" || c.N != w.N || c.Depth != w.Depth || c.Trial != w.Trial ||
			c.Key != w.Key || c.Value != w.Value || c.Offset != w.Offset || c.NeedleAt != w.NeedleAt {
			t.Fatalf("answers %d: %+v and %+v", i, c, w)
		}
	}
	// The cases are Cases'.
	b := newBuilder(t, cfg.Tokenizer)
	hay := Haystack(b, cfg.Haystack, 131)
	cs, err := Cases(b, hay, 131, cfg.Depths, cfg.Trials, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Cases[3*3+3+2]; got.Key != cs[1][2].Key || got.NeedleAt != cs[1][2].NeedleAt || got.Offset != cs[1][2].Offset {
		t.Errorf("answer %+v is not case %+v", got, cs[1][2])
	}
	// Deterministic, whatever the workers.
	cfg.Workers = 1
	again, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	zeroTimes(r)
	zeroTimes(again)
	if !reflect.DeepEqual(r, again) {
		t.Error("two runs differ")
	}
	if r.Config.Seed != 33 || r.Config.Trials != 3 || r.Config.Needle != DefaultNeedle || r.Config.Model != "tiny" ||
		!slices.Equal(r.Config.Mechs, []string{"exact", "window", "linformer"}) || r.Config.HaystackTokens < 131 {
		t.Errorf("config %+v", r.Config)
	}
}

func TestRunErrors(t *testing.T) {
	good := tinyConfig(t)
	good.Mechs = nil
	good.Lengths, good.Depths, good.Trials = []int{90}, []float64{0.5}, 1
	r, err := Run(context.Background(), good, nil)
	if err != nil || len(r.Rows) != 1 || r.Rows[0].Mech != "exact" || r.Rows[0].Trials != 1 {
		t.Fatalf("no mechanisms: %v %+v", err, r)
	}
	for name, edit := range map[string]func(*Config){
		"no weights":      func(c *Config) { c.Weights = nil },
		"no tokenizer":    func(c *Config) { c.Tokenizer = nil },
		"no haystack":     func(c *Config) { c.Haystack = " \n" },
		"no lengths":      func(c *Config) { c.Lengths = nil },
		"length 0":        func(c *Config) { c.Lengths = []int{0} },
		"length twice":    func(c *Config) { c.Lengths = []int{90, 90} },
		"too short":       func(c *Config) { c.Lengths = []int{20} },
		"no depths":       func(c *Config) { c.Depths = nil },
		"depth 2":         func(c *Config) { c.Depths = []float64{2} },
		"depth NaN":       func(c *Config) { c.Depths = []float64{math.NaN()} },
		"depth twice":     func(c *Config) { c.Depths = []float64{0.5, 0.5} },
		"trials 0":        func(c *Config) { c.Trials = 0 },
		"workers -1":      func(c *Config) { c.Workers = -1 },
		"bad template":    func(c *Config) { c.Templates.Needle = "no placeholders" },
		"mech twice":      func(c *Config) { c.Mechs = []Mech{{Name: "a"}, {Name: "a"}} },
		"mech no name":    func(c *Config) { c.Mechs = []Mech{{}} },
		"small vocabular": func(c *Config) { w := *c.Weights; w.Config.Vocab = 100; c.Weights = &w },
	} {
		c := good
		edit(&c)
		if _, err := Run(context.Background(), c, nil); !errors.Is(err, attn.ErrInput) && !errors.Is(err, model.ErrFormat) {
			t.Errorf("%s: error %v, want ErrInput", name, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, good, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	// A bad patch is the mechanism's rows' error, not the run's.
	bad := good
	pm, err := PatchMech("window:left=-3")
	if err != nil {
		t.Fatal(err)
	}
	bad.Mechs = []Mech{pm, {Name: "exact"}}
	r, err = Run(context.Background(), bad, nil)
	if err != nil || len(r.Rows) != 2 || r.Rows[0].Error == "" || r.Rows[1].Error != "" || r.Rows[1].Trials != 1 {
		t.Fatalf("bad patch: %v %+v", err, r)
	}
}

func TestMechs(t *testing.T) {
	ms, err := MechsScaled([]string{"exact", " window", "hyper", "linear"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"exact": "exact", "window": "window:left=128,right=0", "hyper": "hyper:block=32,samples=32,min=0", "linear": "linear"}
	for _, m := range ms {
		ps, err := m.PatchesFor(1024)
		if err != nil || len(ps) != 1 || ps[0].Layers != nil {
			t.Fatalf("%s: %v %v", m.Name, ps, err)
		}
		if got := ps[0].String(); got != want[m.Name] {
			t.Errorf("%s at 1024: %q, want %q", m.Name, got, want[m.Name])
		}
		if _, err := m.PatchesFor(0); err == nil {
			t.Errorf("%s at length 0: no error", m.Name)
		}
	}
	for _, names := range [][]string{{"nope"}, {"exact", "exact"}} {
		if _, err := MechsScaled(names); !errors.Is(err, attn.ErrInput) {
			t.Errorf("%v: %v", names, err)
		}
	}
	pm, err := PatchMech("hyper:layers=1,block=8")
	if err != nil || pm.Name != "hyper:layers=1,block=8" || len(pm.Patches) != 1 || !slices.Equal(pm.Patches[0].Layers, []int{1}) {
		t.Fatalf("PatchMech: %+v %v", pm, err)
	}
	if ps, _ := pm.PatchesFor(77); !reflect.DeepEqual(ps, pm.Patches) {
		t.Errorf("fixed patches at 77: %v", ps)
	}
	for _, s := range []string{"", ":x=1", "hyper:layers=x"} {
		if _, err := PatchMech(s); err == nil {
			t.Errorf("PatchMech(%q): no error", s)
		}
	}
}

func TestJSONRoundTrip(t *testing.T) {
	r, err := Run(context.Background(), func() Config {
		c := tinyConfig(t)
		c.Lengths, c.Trials = []int{90}, 2
		return c
	}(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"rows"`, `"mech"`, `"n"`, `"depth"`, `"trials"`, `"correct"`, `"accuracy"`, `"seconds"`, `"config"`, `"seed"`} {
		if !strings.Contains(buf.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
	back, err := ReadJSON(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, back) {
		t.Errorf("round trip differs:\n%+v\n%+v", r, back)
	}
	for _, s := range []string{"", "{", `{"rows": 3}`, `{"unknown": 1}`} {
		if _, err := ReadJSON(strings.NewReader(s)); !errors.Is(err, attn.ErrInput) {
			t.Errorf("ReadJSON(%q): %v", s, err)
		}
	}
	var table strings.Builder
	if err := WriteTable(&table, r); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"exact\n", "window\n", "linformer\n", "50%", "s/answer", "error"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
}

// plotResults are results with every kind of cell.
func plotResults() *Results {
	r := &Results{}
	for _, mech := range []string{"exact", "hyper:layers=1,block=8"} {
		for _, n := range []int{128, 256, 512} {
			for _, d := range []float64{0, 0.5, 1} {
				row := Row{Mech: mech, N: n, Depth: d, Trials: 4, Correct: int(4 * d), Seconds: 0.01}
				row.Accuracy = float64(row.Correct) / 4
				if mech != "exact" && n == 512 {
					row = Row{Mech: mech, N: n, Depth: d, Error: "unsupported"}
				}
				r.Rows = append(r.Rows, row)
			}
		}
	}
	return r
}

func TestPlots(t *testing.T) {
	r := plotResults()
	for _, mech := range r.Mechs() {
		img, err := HeatMap(r, mech, "png")
		if err != nil {
			t.Fatal(err)
		}
		p, err := png.Decode(bytes.NewReader(img))
		if err != nil {
			t.Fatal(err)
		}
		if b := p.Bounds(); b.Dx() < 500 || b.Dy() < 300 {
			t.Errorf("heat map of %v", b)
		}
		svg, err := HeatMap(r, mech, "svg")
		if err != nil || !bytes.Contains(svg, []byte("<svg")) {
			t.Errorf("SVG heat map: %v", err)
		}
	}
	// The cells have the colours of their accuracies: red at 0, green at 1.
	if c := accuracyColor(0); c != stops[0] {
		t.Errorf("colour of 0: %v", c)
	}
	if c := accuracyColor(1); c != stops[2] {
		t.Errorf("colour of 1: %v", c)
	}
	if c := accuracyColor(0.5); c != stops[1] {
		t.Errorf("colour of 1/2: %v", c)
	}
	if _, err := HeatMap(r, "nope", "png"); !errors.Is(err, attn.ErrInput) {
		t.Errorf("unknown mechanism: %v", err)
	}
	if _, err := HeatMap(r, "exact", "gif"); !errors.Is(err, attn.ErrInput) {
		t.Errorf("gif: %v", err)
	}
	img, err := AccuracyPlot(r, "png")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(img)); err != nil {
		t.Fatal(err)
	}
	if _, err := AccuracyPlot(&Results{}, "png"); !errors.Is(err, attn.ErrInput) {
		t.Errorf("no rows: %v", err)
	}
	// One length only.
	one := &Results{Rows: []Row{{Mech: "exact", N: 64, Depth: 0.5, Trials: 1, Correct: 1, Accuracy: 1}}}
	if _, err := AccuracyPlot(one, "svg"); err != nil {
		t.Errorf("one length: %v", err)
	}
	if _, err := HeatMap(one, "exact", "png"); err != nil {
		t.Errorf("one cell: %v", err)
	}

	dir := filepath.Join(t.TempDir(), "out")
	r.Rows = append(r.Rows, Row{Mech: "hyper:layers=1;block=8", N: 128, Depth: 0, Trials: 1, Accuracy: 0})
	files, err := WriteReport(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	want := []string{"needle.json", "needle-exact.png", "needle-exact.svg",
		"needle-hyper_layers=1_block=8.png", "needle-hyper_layers=1_block=8.svg",
		"needle-hyper_layers=1_block=8-2.png", "needle-hyper_layers=1_block=8-2.svg",
		"needle-accuracy.png", "needle-accuracy.svg"}
	if !slices.Equal(names, want) {
		t.Errorf("files %v, want %v", names, want)
	}
	f, err := os.Open(filepath.Join(dir, "needle.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := ReadJSON(f)
	if err != nil || !reflect.DeepEqual(back, r) {
		t.Errorf("needle.json: %v", err)
	}
}

func TestDefaultHaystack(t *testing.T) {
	// The embedded text: no shared folder needed.
	t.Setenv(EnvShared, t.TempDir())
	text, err := DefaultHaystack()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(strings.TrimSpace(text), "Persuasion") || len(text) < 400000 {
		t.Errorf("Persuasion: %d bytes starting %q", len(text), text[:min(40, len(text))])
	}
}

func TestReadText(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(plain, []byte("She walked."), 0o644); err != nil {
		t.Fatal(err)
	}
	if s, err := ReadText(plain); err != nil || s != "She walked." {
		t.Errorf("ReadText: %q %v", s, err)
	}
	bad := filepath.Join(dir, "b.txt")
	os.WriteFile(bad, []byte{0xff, 0xfe}, 0o644)
	if _, err := ReadText(bad); err == nil {
		t.Error("not UTF-8: no error")
	}
	if _, err := ReadText(filepath.Join(dir, "c.txt.gz")); err == nil {
		t.Error("missing file: no error")
	}
	os.WriteFile(filepath.Join(dir, "d.txt.gz"), []byte("not gzip"), 0o644)
	if _, err := ReadText(filepath.Join(dir, "d.txt.gz")); err == nil {
		t.Error("not gzip: no error")
	}
}

// persuasion is the opening of Persuasion, which the embedded model never
// saw in training.
const persuasion = `Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who,
for his own amusement, never took up any book but the Baronetage; there
he found occupation for an idle hour, and consolation in a distressed
one; there his faculties were roused into admiration and respect, by
contemplating the limited remnant of the earliest patents; there any
unwelcome sensations, arising from domestic affairs changed naturally
into pity and contempt as he turned over the almost endless creations
of the last century; and there, if every other leaf were powerless, he
could read his own history with an interest which never failed.`

// TestEmbedded runs the embedded model on one short fixed case. It was
// not trained for retrieval (its vocabulary has no digits, so a value is
// six byte pieces it hardly ever saw), so the test is about the
// mechanics: Run answers with the model's greedy continuation, which
// model.Generate at temperature 0 repeats, through every layer's decoder
// (a window patch that sees the whole prompt answers as exact attention
// does), and scores what it answered.
func TestEmbedded(t *testing.T) {
	w, tok, err := austen.Load()
	if err != nil {
		t.Fatal(err)
	}
	mechs := []Mech{{Name: "exact"}, {Name: "window", Patches: []model.Patch{{Mechanism: "window", Settings: []string{"left=1000", "right=0"}}}}}
	cfg := Config{Weights: w, Tokenizer: tok, Model: austen.Name, Haystack: persuasion, HaystackName: "Persuasion's opening",
		Lengths: []int{150}, Depths: []float64{0.5}, Trials: 1, Seed: 1, Mechs: mechs}
	r, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Cases) != 2 {
		t.Fatalf("%d answers", len(r.Cases))
	}
	got := r.Cases[0]
	t.Logf("key %q value %q: the model answered %q", got.Key, got.Value, got.Got)
	if got.Correct != Score(" "+got.Value, got.Got) || r.Rows[0].Correct != map[bool]int{false: 0, true: 1}[got.Correct] {
		t.Errorf("answer %q scored %v", got.Got, got.Correct)
	}
	if r.Cases[1].Got != got.Got {
		t.Errorf("a window over the whole prompt answered %q, exact attention %q", r.Cases[1].Got, got.Got)
	}
	b := newBuilder(t, tok)
	cs, err := Cases(b, Haystack(b, persuasion, 150), 150, cfg.Depths, 1, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	c := cs[0][0]
	if c.Key != got.Key || len(c.Tokens) != 150 || c.Tokens[0] != tok.BOS {
		t.Fatalf("case %+v", c)
	}
	m, err := model.New(w, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	smp, err := model.NewSampler(0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var gen []int
	sess, _ := m.NewSession()
	a, err := Ask(context.Background(), b, sess, w.Config.Vocab, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Generate(context.Background(), c.Tokens, len(a.Tokens), smp, -1, func(id int) error { gen = append(gen, id); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gen, a.Tokens) || strings.ToValidUTF8(a.Text, "\uFFFD") != got.Got {
		t.Errorf("Ask answered %v %q, Generate %v, Run %q", a.Tokens, a.Text, gen, got.Got)
	}
}

// The long-context model was trained to answer exactly this test, so it
// must: a few cases at a quarter of its context, where a model that does
// not copy from the needle gets none (a value is six random digits).
func TestEmbeddedLongRetrieves(t *testing.T) {
	load, name, _ := austen.Embedded("austen-long")
	w, tok, err := load()
	if err != nil {
		t.Fatal(err)
	}
	text, err := austen.HeldOut()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Weights: w, Tokenizer: tok, Model: name, Haystack: text, HaystackName: austen.HeldOutName,
		Lengths: []int{2048}, Depths: []float64{0.1, 0.5, 0.9}, Trials: 2, Seed: 1}
	r, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	correct := 0
	for _, c := range r.Cases {
		t.Logf("depth %.1f key %q value %q: answered %q", c.Depth, c.Key, c.Value, c.Got)
		if c.Correct {
			correct++
		}
	}
	if correct < minLongCorrect {
		t.Errorf("%d of %d answers right, want at least %d", correct, len(r.Cases), minLongCorrect)
	}
}

// minLongCorrect is what TestEmbeddedLongRetrieves asks of the 6 cases.
const minLongCorrect = 5
