package experiment

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/registry"
)

// PatchingMechs are the softmax approximations of the HyperAttention
// paper's Figure 3, in the order its legend lists them: attn patching's
// default curves.
var PatchingMechs = []string{"window", "strided", "longformer", "bigbird", "reformer", "performer", "hyper"}

// ScaledBudget returns mechanism name's patching budget for windows of n
// tokens, the shortest of which has shortest tokens: the registry entry's
// rule (registry.Entry.Budget), about n/8 keys per query.
func ScaledBudget(name string, n, shortest int) registry.Budget {
	e, err := registry.Lookup(name)
	if err != nil {
		return registry.Budget{Rule: "the registry's defaults"}
	}
	return e.Budget(n, shortest)
}

// PatchingConfig is one patching run (attn patching): perplexity of a
// model as the attention of its last ℓ layers is replaced by each
// mechanism, for each ℓ.
type PatchingConfig struct {
	// Exact is the model unpatched; ModelName names it in the results.
	Exact     *model.Model
	ModelName string
	Text      *Text
	// Mechs are the curves; Settings change their scaled budgets.
	Mechs    []string
	Settings Settings
	// Ells are the values of ℓ in [0, layers]; 0, the exact model, is
	// added when missing.
	Ells []int
	// KL also measures the KL divergence from the exact model and each
	// layer's attention error (running the exact model again each time).
	KL       bool
	Workers  int
	Seed     uint64
	Progress Progress
}

// PlanPatching checks cfg and returns the results' frame: every
// mechanism's budget and settings, each built once so that a bad
// parameter fails before the first (long) perplexity run.
func PlanPatching(cfg PatchingConfig) (*eval.Patching, error) {
	if cfg.Exact == nil || cfg.Text == nil {
		return nil, fmt.Errorf("%w: patching needs a model and a text", attn.ErrInput)
	}
	if len(cfg.Mechs) == 0 {
		return nil, fmt.Errorf("%w: no mechanism", attn.ErrInput)
	}
	L := cfg.Exact.Config().Layers
	ells := append([]int{0}, cfg.Ells...)
	slices.Sort(ells)
	ells = slices.Compact(ells)
	if ells[len(ells)-1] > L || ells[0] < 0 {
		return nil, fmt.Errorf("%w: ℓ %v outside [0, %d]", attn.ErrInput, ells, L)
	}
	for i, name := range cfg.Mechs {
		if _, err := registry.Lookup(name); err != nil {
			return nil, err
		}
		if slices.Contains(cfg.Mechs[:i], name) {
			return nil, fmt.Errorf("%w: %s listed twice", attn.ErrInput, name)
		}
	}
	if err := cfg.Settings.Check(cfg.Mechs, nil); err != nil {
		return nil, err
	}
	t := cfg.Text
	res := &eval.Patching{
		Model: cfg.ModelName, Text: t.Name, Context: t.Context, Stride: t.Stride, N: t.Longest,
		Windows: t.Windows, Tokens: len(t.Tokens) - 1, Chars: t.Chars, Layers: L,
		Workers: cfg.Workers, Seed: cfg.Seed, KL: cfg.KL, Ells: ells,
	}
	if res.Workers == 0 {
		res.Workers = runtime.GOMAXPROCS(0)
	}
	for _, name := range cfg.Mechs {
		b := ScaledBudget(name, t.Longest, t.Shortest)
		e, err := registry.Lookup(name)
		if err != nil {
			return nil, err
		}
		if merged := cfg.Settings.For(e, b.Settings); !slices.Equal(merged, b.Settings) {
			b.Rule += "; with -set " + strings.Join(cfg.Settings.For(e, nil), ",")
			b.Settings, b.Keys = merged, 0
		}
		if _, err := registry.New(name, b.Settings, cfg.Seed); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		res.Mechanisms = append(res.Mechanisms, eval.PatchingMech{Name: name, Settings: b.Settings, Budget: b.Rule, KeysPerQuery: b.Keys})
	}
	return res, nil
}

// RunPatching runs the exact model once, then each mechanism patched into
// the last ℓ layers for every ℓ of cfg. A mechanism that fails (one that
// cannot be causal, say) records its error and skips its remaining ℓ,
// which would fail the same way; the others' curves go on. When ctx ends
// it returns what ran with ctx's error.
func RunPatching(ctx context.Context, cfg PatchingConfig) (*eval.Patching, error) {
	res, err := PlanPatching(cfg)
	if err != nil {
		return nil, err
	}
	prog := progressOr(cfg.Progress)
	t, L, ells := cfg.Text, res.Layers, res.Ells
	total := 1 + len(res.Mechanisms)*(len(ells)-1)
	step := 0
	exactSecs := -1.0
	score := func(m *model.Model, label string) (eval.PatchingPoint, error) {
		o := t.Options()
		if cfg.KL && m != cfg.Exact {
			o.Reference = cfg.Exact
		}
		step++
		// Every run costs about what the exact one did (twice that with
		// the exact model run again for KL).
		forecast, rest := -1.0, -1.0
		if exactSecs > 0 {
			forecast = exactSecs
			if o.Reference != nil {
				forecast *= 2
			}
			rest = forecast * float64(total-step)
		}
		s := Step{Label: label, Index: step, Total: total, Forecast: forecast, Rest: rest}
		prog.Begin(s)
		o.Progress = func(d, n int) {
			if d < n {
				s.Label = fmt.Sprintf("%s, window %d/%d", label, d+1, n)
				prog.Begin(s)
			}
		}
		start := time.Now()
		r, err := model.Perplexity(ctx, m, t.Tokens, o)
		if err != nil {
			prog.End(err.Error())
			return eval.PatchingPoint{}, err
		}
		p := eval.PatchingPoint{
			Perplexity: r.PPL(), BitsPerChar: r.BitsPerChar(t.Chars), NatsPerToken: r.NLL / float64(r.Tokens),
			AttnSeconds: r.AttnSeconds, Seconds: time.Since(start).Seconds(),
		}
		if o.Reference != nil {
			p.MeanKL, p.LayerRelErr = r.MeanKL(), r.LayerErr
		}
		prog.End(fmt.Sprintf("perplexity %.6g, %.3gs in attention of %.3gs", p.Perplexity, p.AttnSeconds, p.Seconds))
		return p, nil
	}
	if res.Exact, err = score(cfg.Exact, "exact"); err != nil {
		return nil, fmt.Errorf("exact: %w", err)
	}
	exactSecs = res.Exact.Seconds
	res.Exact.Layers = []int{}
	for i := range res.Mechanisms {
		pm := &res.Mechanisms[i]
		pm.Points = append(pm.Points, res.Exact)
		// A layer's mechanism is the same in every run that patches it:
		// say once that it falls back.
		said := map[string]bool{}
		for k, ell := range ells[1:] {
			p := model.Patch{Mechanism: pm.Name, Settings: pm.Settings}
			for l := L - ell; l < L; l++ {
				p.Layers = append(p.Layers, l)
			}
			var pt eval.PatchingPoint
			m, err := model.New(cfg.Exact.Weights(), model.Options{Workers: cfg.Workers, Patches: []model.Patch{p}, Seed: cfg.Seed})
			var fallbacks []string
			if err == nil {
				fallbacks = LayerFallbacks(m, L, t.Longest, t.Shortest)
				for _, line := range fallbacks {
					if !said[line] {
						said[line] = true
						prog.Note(line)
					}
				}
				pt, err = score(m, fmt.Sprintf("%s ℓ=%d", pm.Name, ell))
			}
			if err != nil {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				if m == nil {
					step++ // the run that could not be built
				}
				pm.Error = fmt.Sprintf("ℓ=%d: %v", ell, err)
				step += len(ells) - 2 - k
				break
			}
			pt.Patched, pt.Layers, pt.Patch, pt.Fallbacks = ell, p.Layers, p.String(), fallbacks
			pm.Points = append(pm.Points, pt)
		}
	}
	return res, nil
}
