package needle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/registry"
)

// Mech is one attention setting of the model under test.
type Mech struct {
	// Name labels the mechanism's rows and plots.
	Name string
	// Patches are the model's patches at every length (none: exact).
	Patches []model.Patch
	// Scaled, when not nil, gives the patches for prompts of n tokens
	// instead (budgets that grow with n).
	Scaled func(n int) ([]model.Patch, error)
}

// PatchesFor returns the mechanism's patches for prompts of n tokens.
func (m Mech) PatchesFor(n int) ([]model.Patch, error) {
	if m.Scaled != nil {
		return m.Scaled(n)
	}
	return m.Patches, nil
}

// PatchMech returns the mechanism of patch spec (model.ParsePatch's
// syntax, as `attn ppl -patch`), named by the spec.
func PatchMech(spec string) (Mech, error) {
	ps, err := model.ParsePatch(spec)
	if err != nil {
		return Mech{}, err
	}
	if len(ps) == 0 {
		return Mech{}, fmt.Errorf("%w: empty patch", attn.ErrInput)
	}
	return Mech{Name: strings.TrimSpace(spec), Patches: ps}, nil
}

// MechsScaled returns each named mechanism patched into every layer at a
// budget scaled to the prompt's length n: the registry's rule for `attn
// patching` (registry.Entry.Budget, about n/8 keys per query, the prompt
// being the only window), or, for a mechanism without one, its defaults
// with min=0 where it has that parameter, so that no length falls back to
// exact attention. "exact" is exact attention.
func MechsScaled(names []string) ([]Mech, error) {
	var out []Mech
	for _, name := range names {
		name = strings.TrimSpace(name)
		e, err := registry.Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", attn.ErrInput, err)
		}
		if slices.ContainsFunc(out, func(m Mech) bool { return m.Name == name }) {
			return nil, fmt.Errorf("%w: mechanism %q listed twice", attn.ErrInput, name)
		}
		out = append(out, Mech{Name: name, Scaled: func(n int) ([]model.Patch, error) {
			if n < 1 {
				return nil, fmt.Errorf("%w: length %d", attn.ErrInput, n)
			}
			var settings []string
			if e.Scaled != nil {
				settings = e.Budget(n, n).Settings
			} else if _, ok := e.Param("min"); ok {
				settings = []string{"min=0"}
			}
			return []model.Patch{{Mechanism: name, Settings: settings}}, nil
		}})
	}
	return out, nil
}

// Config is one needle-in-a-haystack run.
type Config struct {
	// Weights and Tokenizer are the model's.
	Weights   *model.Weights
	Tokenizer Tokenizer
	// Model names the model in the results.
	Model string
	// Haystack is the text the needles hide in; HaystackName names it in
	// the results. A text shorter than the longest prompt is repeated,
	// paragraphs apart.
	Haystack, HaystackName string
	// Templates are the needle, question and answer (empty: defaults).
	Templates Templates
	// Lengths are the prompts' lengths in tokens, Depths the needle's
	// depths (fractions in [0, 1]), Trials the cases per length and depth.
	Lengths []int
	Depths  []float64
	Trials  int
	// Seed draws the cases (the same for every mechanism) and seeds the
	// patched mechanisms (model.Options.Seed).
	Seed uint64
	// Mechs are the settings compared; none means exact attention alone.
	Mechs []Mech
	// Workers, Cache and CacheRotate are the model's (model.Options).
	Workers     int
	Cache       kvcache.DType
	CacheRotate bool
}

// Limits on a run, to keep every count inside int long before memory
// runs out.
const (
	MaxLength = 1 << 22
	MaxTrials = 1 << 20
)

func (c Config) check() error {
	switch {
	case c.Weights == nil || c.Tokenizer == nil:
		return fmt.Errorf("%w: weights and tokenizer are required", attn.ErrInput)
	case strings.TrimSpace(c.Haystack) == "":
		return fmt.Errorf("%w: empty haystack", attn.ErrInput)
	case len(c.Lengths) == 0 || len(c.Depths) == 0:
		return fmt.Errorf("%w: no lengths or no depths", attn.ErrInput)
	case c.Trials < 1 || c.Trials > MaxTrials:
		return fmt.Errorf("%w: %d trials, want 1 to %d", attn.ErrInput, c.Trials, MaxTrials)
	case c.Workers < 0:
		return fmt.Errorf("%w: %d workers", attn.ErrInput, c.Workers)
	}
	for _, n := range c.Lengths {
		if n < 1 || n > MaxLength {
			return fmt.Errorf("%w: length %d, want 1 to %d", attn.ErrInput, n, MaxLength)
		}
	}
	if len(c.Lengths) != len(slices.Compact(slices.Sorted(slices.Values(c.Lengths)))) {
		return fmt.Errorf("%w: a length is listed twice", attn.ErrInput)
	}
	for _, d := range c.Depths {
		if math.IsNaN(d) || d < 0 || d > 1 {
			return fmt.Errorf("%w: depth %v, want a fraction in [0, 1]", attn.ErrInput, d)
		}
	}
	if len(c.Depths) != len(slices.Compact(slices.Sorted(slices.Values(c.Depths)))) {
		return fmt.Errorf("%w: a depth is listed twice", attn.ErrInput)
	}
	var names []string
	for _, m := range c.Mechs {
		if strings.TrimSpace(m.Name) == "" || slices.Contains(names, m.Name) {
			return fmt.Errorf("%w: mechanism names must be set and distinct (%q)", attn.ErrInput, m.Name)
		}
		names = append(names, m.Name)
	}
	return nil
}

// Row is the result of one mechanism, length and depth.
type Row struct {
	Mech     string  `json:"mech"`
	N        int     `json:"n"`
	Depth    float64 `json:"depth"`
	Trials   int     `json:"trials"`
	Correct  int     `json:"correct"`
	Accuracy float64 `json:"accuracy"`
	// Seconds is the mean time per answer: the prompt's prefill and the
	// answer's decoding.
	Seconds float64 `json:"seconds"`
	// Patch is the model's patches at this length (ParsePatch's syntax;
	// empty for exact attention).
	Patch string `json:"patch,omitempty"`
	// Error says why the mechanism could not run (no causal decoder, a
	// bad parameter): the row has no trials.
	Error string `json:"error,omitempty"`
	// Fallback, when not empty, names the layers whose decoders ran
	// exact attention over the prompt's n positions instead of the
	// mechanism (quest with a budget that covers the cache, say), and
	// why: the row measures exact attention there.
	Fallback string `json:"fallback,omitempty"`
}

// CaseResult is one answer.
type CaseResult struct {
	Mech     string  `json:"mech"`
	N        int     `json:"n"`
	Depth    float64 `json:"depth"`
	Trial    int     `json:"trial"`
	Key      string  `json:"key"`
	Value    string  `json:"value"`
	Offset   int     `json:"offset"`    // of the haystack stretch, in haystack tokens
	NeedleAt int     `json:"needle_at"` // of the needle, in prompt tokens
	// Got is the model's greedy answer as text, bytes that are not UTF-8
	// (a character cut by the end of the answer) as U+FFFD; GotTokens its
	// tokens.
	Got       string  `json:"got"`
	GotTokens []int   `json:"got_tokens"`
	Correct   bool    `json:"correct"`
	Seconds   float64 `json:"seconds"`
}

// Info is what a run needs to be repeated.
type Info struct {
	Model          string    `json:"model"`
	Haystack       string    `json:"haystack"`
	HaystackTokens int       `json:"haystack_tokens"`
	Needle         string    `json:"needle"`
	Question       string    `json:"question"`
	Answer         string    `json:"answer"`
	Seed           uint64    `json:"seed"`
	Lengths        []int     `json:"lengths"`
	Depths         []float64 `json:"depths"`
	Trials         int       `json:"trials"`
	Mechs          []string  `json:"mechs"`
	Cache          string    `json:"cache"`
	Version        string    `json:"version"`
}

// Results are a run's rows, per mechanism, length and depth in the
// order of the Config, and its answers.
type Results struct {
	Rows   []Row        `json:"rows"`
	Config Info         `json:"config"`
	Cases  []CaseResult `json:"cases,omitempty"`
}

// WriteJSON writes r as indented JSON.
func (r *Results) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadJSON reads results that WriteJSON wrote.
func ReadJSON(rd io.Reader) (*Results, error) {
	var r Results
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: needle results: %v", attn.ErrInput, err)
	}
	return &r, nil
}

// Mechs returns the mechanisms of r's rows in order of appearance.
func (r *Results) Mechs() []string {
	var out []string
	for _, row := range r.Rows {
		if !slices.Contains(out, row.Mech) {
			out = append(out, row.Mech)
		}
	}
	return out
}

// Answer is what the model answered to a case.
type Answer struct {
	Tokens  []int
	Text    string // as it reads after the prompt
	Correct bool   // Score(case.AnswerText, Text)
}

// Ask feeds c's prompt to an empty session in one step, then decodes the
// answer greedily (the most likely token, the lowest id on a tie) one
// token at a time until Score is settled: the text has left the answer's
// path or gone past its end, or 2·len(c.Answer)+2 tokens were generated.
func Ask(ctx context.Context, b *Builder, sess *model.Session, vocab int, c Case) (Answer, error) {
	if len(c.Tokens) == 0 || len(c.Answer) == 0 {
		return Answer{}, fmt.Errorf("%w: a case without a prompt or an answer", attn.ErrInput)
	}
	if sess.Len() != 0 {
		return Answer{}, fmt.Errorf("%w: session holds %d positions, want an empty one", attn.ErrInput, sess.Len())
	}
	logits := make([]float32, vocab)
	if err := sess.Step(ctx, c.Tokens, logits); err != nil {
		return Answer{}, err
	}
	prev := c.Tokens[len(c.Tokens)-1]
	var a Answer
	for limit := 2*len(c.Answer) + 2; ; {
		best := 0
		for i, x := range logits {
			if x > logits[best] {
				best = i
			}
		}
		a.Tokens = append(a.Tokens, best)
		a.Text = b.Continuation(prev, a.Tokens)
		if len(a.Tokens) >= limit || decided(c.AnswerText, a.Text) {
			break
		}
		if err := sess.Step(ctx, []int{best}, logits); err != nil {
			return Answer{}, err
		}
	}
	a.Correct = Score(c.AnswerText, a.Text)
	return a, nil
}

// caseSeq is the PCG stream of the cases of length n and trial t: a case
// does not depend on the other lengths and trials of the grid, and depths
// move only the needle.
func caseSeq(n, t int) uint64 { return uint64(n)<<32 | uint64(t) }

// Cases returns the cases of length n: per depth, Trials of them, drawn
// by Builder.Draw from (seed, n, trial) alone.
func Cases(b *Builder, hay []int, n int, depths []float64, trials int, seed uint64) ([][]Case, error) {
	out := make([][]Case, len(depths))
	for i, d := range depths {
		for t := range trials {
			c, err := b.Draw(rand.New(rand.NewPCG(seed, caseSeq(n, t))), hay, n, d)
			if err != nil {
				return nil, fmt.Errorf("length %d, depth %v, trial %d: %w", n, d, t, err)
			}
			out[i] = append(out[i], c)
		}
	}
	return out, nil
}

// Haystack returns the tokens of text (no BOS), repeated, paragraphs
// apart, until there are at least n.
func Haystack(b *Builder, text string, n int) []int {
	one := b.tok.Encode(text, false)
	if len(one) == 0 {
		return nil
	}
	hay := one
	if len(hay) < n {
		sep := b.Encode("\n\n" + text)
		for len(hay) < n {
			hay = append(hay, sep...)
		}
	}
	return hay
}

// skippable reports whether err says that the mechanism cannot run, as
// opposed to the run failing.
func skippable(err error) bool {
	return errors.Is(err, attn.ErrUnsupported) || errors.Is(err, attn.ErrInput) || errors.Is(err, attn.ErrShape)
}

// Run runs the test: for each mechanism, length, depth and trial, a
// model with the mechanism's patches answers a case (Ask) through a
// Session, so that every layer decodes through its mechanism's decoder.
// Every mechanism answers the same cases. progress, when not nil, is
// called after each answer with the answers done and to do. A mechanism
// that cannot run at a length (no causal decoder, a bad parameter) gets
// rows with Error set; anything else, a cancelled ctx included, stops the
// run with an error.
func Run(ctx context.Context, cfg Config, progress func(done, total int)) (*Results, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := cfg.Weights.Validate(); err != nil {
		return nil, err
	}
	b, err := NewBuilder(cfg.Tokenizer, cfg.Templates)
	if err != nil {
		return nil, err
	}
	mechs := cfg.Mechs
	if len(mechs) == 0 {
		mechs = []Mech{{Name: "exact"}}
	}
	vocab := cfg.Weights.Config.Vocab
	hay := Haystack(b, cfg.Haystack, slices.Max(cfg.Lengths))
	if len(hay) == 0 {
		return nil, fmt.Errorf("%w: the haystack has no tokens", attn.ErrInput)
	}
	if bad := slices.IndexFunc(hay, func(id int) bool { return id < 0 || id >= vocab }); bad >= 0 {
		return nil, fmt.Errorf("%w: haystack token %d is outside the model's vocabulary of %d: tokenizer and model do not match", attn.ErrInput, hay[bad], vocab)
	}
	t := b.Templates()
	res := &Results{Config: Info{
		Model: cfg.Model, Haystack: cfg.HaystackName, HaystackTokens: len(hay),
		Needle: t.Needle, Question: t.Question, Answer: t.Answer, Seed: cfg.Seed,
		Lengths: slices.Clone(cfg.Lengths), Depths: slices.Clone(cfg.Depths), Trials: cfg.Trials,
		Cache: storageName(cfg.Cache, cfg.CacheRotate), Version: attn.Version,
	}}
	for _, m := range mechs {
		res.Config.Mechs = append(res.Config.Mechs, m.Name)
	}
	total := len(mechs) * len(cfg.Lengths) * len(cfg.Depths) * cfg.Trials
	done := 0
	type cell struct{ mech, n int }
	rows := map[cell][]Row{}
	for _, n := range cfg.Lengths {
		cases, err := Cases(b, hay, n, cfg.Depths, cfg.Trials, cfg.Seed)
		if err != nil {
			return nil, err
		}
		for _, cs := range cases {
			for _, c := range cs {
				if bad := slices.IndexFunc(c.Tokens, func(id int) bool { return id < 0 || id >= vocab }); bad >= 0 {
					return nil, fmt.Errorf("%w: prompt token %d is outside the model's vocabulary of %d", attn.ErrInput, c.Tokens[bad], vocab)
				}
			}
		}
		for mi, mech := range mechs {
			rs, cr, err := runMech(ctx, cfg, b, mech, n, cases, vocab)
			if err != nil {
				return nil, fmt.Errorf("%s, length %d: %w", mech.Name, n, err)
			}
			rows[cell{mi, n}] = rs
			res.Cases = append(res.Cases, cr...)
			done += len(cfg.Depths) * cfg.Trials
			if progress != nil {
				progress(done, total)
			}
		}
	}
	for mi := range mechs {
		for _, n := range cfg.Lengths {
			res.Rows = append(res.Rows, rows[cell{mi, n}]...)
		}
	}
	slices.SortStableFunc(res.Cases, func(x, y CaseResult) int {
		return slices.Index(res.Config.Mechs, x.Mech) - slices.Index(res.Config.Mechs, y.Mech)
	})
	return res, nil
}

// runMech answers the cases of one length with one mechanism.
func runMech(ctx context.Context, cfg Config, b *Builder, mech Mech, n int, cases [][]Case, vocab int) ([]Row, []CaseResult, error) {
	rows := make([]Row, len(cfg.Depths))
	for i, d := range cfg.Depths {
		rows[i] = Row{Mech: mech.Name, N: n, Depth: d}
	}
	fail := func(err error) ([]Row, []CaseResult, error) {
		if !skippable(err) || ctx.Err() != nil {
			return nil, nil, err
		}
		for i := range rows {
			rows[i] = Row{Mech: rows[i].Mech, N: n, Depth: rows[i].Depth, Patch: rows[i].Patch, Error: err.Error()}
		}
		return rows, nil, nil
	}
	ps, err := mech.PatchesFor(n)
	if err != nil {
		return fail(err)
	}
	var specs []string
	for _, p := range ps {
		specs = append(specs, p.String())
	}
	for i := range rows {
		rows[i].Patch = strings.Join(specs, ";")
	}
	m, err := model.New(cfg.Weights, model.Options{Workers: cfg.Workers, Patches: ps, Seed: cfg.Seed, Cache: cfg.Cache, CacheRotate: cfg.CacheRotate})
	if err != nil {
		return fail(err)
	}
	sess, err := m.NewSession()
	if err != nil {
		return fail(err)
	}
	var fb, whys []string
	for l := range m.Config().Layers {
		if why := m.DecodeFallback(l, n); why != "" {
			fb, whys = append(fb, fmt.Sprintf("layer %d: %s", l, why)), append(whys, why)
		}
	}
	if len(whys) == m.Config().Layers && len(slices.Compact(slices.Clone(whys))) == 1 {
		fb = []string{"every layer: " + whys[0]}
	}
	for i := range rows {
		rows[i].Fallback = strings.Join(fb, "; ")
	}
	var out []CaseResult
	for i, cs := range cases {
		var secs float64
		for t, c := range cs {
			sess.Reset()
			t0 := time.Now()
			a, err := Ask(ctx, b, sess, vocab, c)
			if err != nil {
				return fail(err)
			}
			s := time.Since(t0).Seconds()
			secs += s
			rows[i].Trials++
			if a.Correct {
				rows[i].Correct++
			}
			out = append(out, CaseResult{
				Mech: mech.Name, N: n, Depth: cfg.Depths[i], Trial: t, Key: c.Key, Value: c.Value,
				Offset: c.Offset, NeedleAt: c.NeedleAt, Got: strings.ToValidUTF8(a.Text, "\uFFFD"), GotTokens: a.Tokens,
				Correct: a.Correct, Seconds: s,
			})
		}
		rows[i].Accuracy = float64(rows[i].Correct) / float64(rows[i].Trials)
		rows[i].Seconds = secs / float64(rows[i].Trials)
	}
	return rows, out, nil
}

// WriteTable writes r as text: per mechanism, the accuracy at each depth
// (rows) and length (columns), and the mean time per answer at each
// length.
func WriteTable(w io.Writer, r *Results) error {
	var b strings.Builder
	lengths, depths := r.grid()
	for _, mech := range r.Mechs() {
		fmt.Fprintf(&b, "%s\n", mech)
		fmt.Fprintf(&b, "  %-8s", "depth")
		for _, n := range lengths {
			fmt.Fprintf(&b, " %8d", n)
		}
		b.WriteString("\n")
		for _, d := range depths {
			fmt.Fprintf(&b, "  %-8s", fmt.Sprintf("%.0f%%", 100*d))
			for _, n := range lengths {
				row, ok := r.row(mech, n, d)
				switch {
				case !ok:
					fmt.Fprintf(&b, " %8s", "")
				case row.Error != "":
					fmt.Fprintf(&b, " %8s", "error")
				case row.Fallback != "":
					fmt.Fprintf(&b, " %7.2f*", row.Accuracy)
				default:
					fmt.Fprintf(&b, " %8.2f", row.Accuracy)
				}
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "  %-8s", "all")
		for _, n := range lengths {
			if acc, _, ok := r.overall(mech, n); ok {
				fmt.Fprintf(&b, " %8.2f", acc)
			} else {
				fmt.Fprintf(&b, " %8s", "")
			}
		}
		b.WriteString("\n")
		fmt.Fprintf(&b, "  %-8s", "s/answer")
		for _, n := range lengths {
			if _, secs, ok := r.overall(mech, n); ok {
				fmt.Fprintf(&b, " %8.3g", secs)
			} else {
				fmt.Fprintf(&b, " %8s", "")
			}
		}
		b.WriteString("\n")
		for _, n := range lengths {
			for _, d := range depths {
				if row, ok := r.row(mech, n, d); ok && row.Error != "" {
					fmt.Fprintf(&b, "  length %d: %s\n", n, row.Error)
					break
				} else if ok && row.Fallback != "" {
					fmt.Fprintf(&b, "  * length %d ran exact attention: %s\n", n, row.Fallback)
					break
				}
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// grid returns the lengths and depths of r's rows, ascending.
func (r *Results) grid() (lengths []int, depths []float64) {
	for _, row := range r.Rows {
		if !slices.Contains(lengths, row.N) {
			lengths = append(lengths, row.N)
		}
		if !slices.Contains(depths, row.Depth) {
			depths = append(depths, row.Depth)
		}
	}
	slices.Sort(lengths)
	slices.Sort(depths)
	return lengths, depths
}

func (r *Results) row(mech string, n int, d float64) (Row, bool) {
	for _, row := range r.Rows {
		if row.Mech == mech && row.N == n && row.Depth == d {
			return row, true
		}
	}
	return Row{}, false
}

// overall returns a mechanism's accuracy over every depth at length n and
// its mean time per answer; ok is false when no row there has trials.
func (r *Results) overall(mech string, n int) (acc, secs float64, ok bool) {
	trials, correct := 0, 0
	for _, row := range r.Rows {
		if row.Mech == mech && row.N == n && row.Error == "" && row.Trials > 0 {
			trials += row.Trials
			correct += row.Correct
			secs += row.Seconds * float64(row.Trials)
		}
	}
	if trials == 0 {
		return 0, 0, false
	}
	return float64(correct) / float64(trials), secs / float64(trials), true
}

// storageName is a cache's storage as kvcache.ParseStorage reads it.
func storageName(dt kvcache.DType, rotate bool) string {
	if rotate {
		return dt.String() + "+rot"
	}
	return dt.String()
}
