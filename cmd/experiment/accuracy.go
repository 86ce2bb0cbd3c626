package experiment

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/registry"
)

// AccuracyConfig is one accuracy run (attn accuracy): each mechanism's
// budget sweeps on one input.
type AccuracyConfig struct {
	// Mechs are the mechanisms whose sweeps run (eval.SweepsFor).
	Mechs []string
	// Settings are held for every point; a swept parameter overrides
	// them.
	Settings Settings
	Shape    attn.Shape
	Options  attn.Options
	// Input is the built-in kind drawn per seed (eval.Generate), unless
	// Fixed holds the inputs (read from files, or a model's).
	Input string
	Fixed *eval.Inputs
	// Seeds is the count of seeds averaged over (0: 1), from Seed.
	Seeds int
	Seed  uint64
	// Deadline, when not zero, skips the points not reached by then.
	Deadline time.Time
	Command  string
	Lookup   Lookup
	Progress Progress
}

// accPoint is one point of a budget sweep and what each seed measured.
type accPoint struct {
	sweep    eval.BudgetSweep
	entry    registry.Entry
	value    int
	settings []string
	params   map[string]string
	skipped  string
	fallback string // why the mechanism ran exact attention, "" when it did not
	errs     []eval.Errors
	secs     []float64
}

// RunAccuracy measures every point of the sweeps of cfg.Mechs. A bad
// mechanism name or setting fails it (nil result); a point whose
// mechanism fails is skipped with the reason. When ctx ends it returns the
// points so far with ctx's error.
func RunAccuracy(ctx context.Context, cfg AccuracyConfig) (*eval.Accuracy, error) {
	if cfg.Seeds == 0 {
		cfg.Seeds = 1
	}
	if cfg.Fixed != nil {
		cfg.Shape = cfg.Fixed.Shape
	}
	switch {
	case cfg.Seeds < 0:
		return nil, fmt.Errorf("%w: %d seeds", attn.ErrInput, cfg.Seeds)
	case len(cfg.Mechs) == 0:
		return nil, fmt.Errorf("%w: no mechanisms", attn.ErrInput)
	}
	if err := cfg.Shape.Validate(); err != nil {
		return nil, err
	}
	exactEntry, err := cfg.Lookup.get("exact")
	if err != nil {
		return nil, err
	}
	for _, name := range cfg.Mechs {
		if _, err := cfg.Lookup.get(name); err != nil {
			return nil, err
		}
	}
	if err := cfg.Settings.Check(cfg.Mechs, cfg.Lookup); err != nil {
		return nil, err
	}
	points, err := planPoints(cfg.Mechs, cfg.Settings, cfg.Options.Causal, cfg.Lookup)
	if err != nil {
		return nil, err
	}
	s := cfg.Shape
	acc := &eval.Accuracy{
		Command: cfg.Command, Date: time.Now().Format(time.RFC3339),
		Input: cfg.Input, B: s.B, H: s.H, HKV: s.HKV, N: s.N, M: s.M, D: s.D, Causal: cfg.Options.Causal, Seeds: cfg.Seeds,
	}
	if cfg.Fixed != nil {
		acc.Input = cfg.Fixed.Kind
	}
	prog := progressOr(cfg.Progress)
	total := cfg.Seeds * len(points)
	runErr := func() error {
		for i := range cfg.Seeds {
			sd := cfg.Seed + uint64(i)
			in := cfg.Fixed
			if in == nil {
				if in, err = eval.Generate(cfg.Input, s, cfg.Options.Causal, sd); err != nil {
					return err
				}
			}
			t := time.Now()
			base, err := exactReference(ctx, exactEntry, s, cfg.Options, in, sd)
			if err != nil {
				return err
			}
			exactSecs := time.Since(t).Seconds()
			for j, p := range points {
				// A point's forecast is its last seed's time, or exact
				// attention's on the first seed.
				forecast := func(q *accPoint) float64 {
					switch {
					case q.skipped != "":
						return 0
					case len(q.secs) > 0:
						return q.secs[len(q.secs)-1]
					}
					return exactSecs
				}
				rest := 0.0
				for _, q := range points[j+1:] {
					rest += forecast(q)
				}
				for _, q := range points {
					rest += float64(cfg.Seeds-i-1) * forecast(q)
				}
				prog.Begin(Step{Label: fmt.Sprintf("%s=%d seed %d", p.sweep.Name(), p.value, sd),
					Index: i*len(points) + j + 1, Total: total, Forecast: forecast(p), Rest: rest})
				if !cfg.Deadline.IsZero() && time.Now().After(cfg.Deadline) && p.skipped == "" {
					p.skipped = "the time budget ran out before this point"
				}
				if err := p.run(ctx, s, cfg.Options, in, base, sd); err != nil {
					prog.End("interrupted")
					return err
				}
				prog.End(p.skipped)
			}
		}
		return nil
	}()
	for _, p := range points {
		acc.Points = append(acc.Points, p.result(cfg.Seeds))
	}
	return acc, runErr
}

// exactReference runs exact attention on in, the reference of every point.
func exactReference(ctx context.Context, e registry.Entry, s attn.Shape, o attn.Options, in *eval.Inputs, seed uint64) (*eval.Reference[float32], error) {
	p, err := registry.ParseSettings(nil)
	if err != nil {
		return nil, err
	}
	m, err := e.New(p, seed)
	if err != nil {
		return nil, err
	}
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	if err := m.Forward(ctx, s, in.Q, in.K, in.V, o, out, lse); err != nil {
		return nil, fmt.Errorf("exact attention: %w", err)
	}
	return eval.NewReference(s, out, lse)
}

// planPoints lists the points of every sweep of the named mechanisms: the
// sweep's fixed settings, then the Settings the mechanism has, then the
// swept parameters, each later one overriding an earlier one of the same
// name (Merge). A sweep over a parameter the mechanism does not know is
// one skipped point. A point's params are every parameter in effect under
// the mask, defaults included.
func planPoints(names []string, set Settings, causal bool, lookup Lookup) ([]*accPoint, error) {
	var points []*accPoint
	for _, name := range names {
		e, err := lookup.get(name)
		if err != nil {
			return nil, err
		}
		for _, sw := range eval.SweepsFor(e) {
			if i := slices.IndexFunc(sw.Params, func(p string) bool { _, ok := e.Param(p); return !ok }); i >= 0 {
				points = append(points, &accPoint{sweep: sw, entry: e,
					skipped: fmt.Sprintf("%s has no parameter %q", name, sw.Params[i])})
				continue
			}
			values := sw.Values
			if len(values) == 0 {
				values = []int{0}
			}
			for _, v := range values {
				var swept []string
				for _, param := range sw.Params {
					swept = append(swept, fmt.Sprintf("%s=%d", param, v))
				}
				settings := Merge(set.For(e, sw.Fixed), swept)
				p := &accPoint{sweep: sw, entry: e, value: v, settings: settings, params: map[string]string{}}
				for _, kv := range settings {
					k, val, _ := strings.Cut(kv, "=")
					p.params[strings.TrimSpace(k)] = strings.TrimSpace(val)
				}
				// A bad value shows as the point's skip reason when it
				// fails to build, with the settings as given.
				if eff, err := e.Effective(p.settings, causal); err == nil {
					p.params = eff
				}
				points = append(points, p)
			}
		}
	}
	return points, nil
}

// run measures the point on one seed's inputs. A mechanism that cannot be
// built or fails marks the point skipped; only ctx ending is returned.
func (p *accPoint) run(ctx context.Context, s attn.Shape, o attn.Options, in *eval.Inputs, base *eval.Reference[float32], seed uint64) error {
	if p.skipped != "" {
		return nil
	}
	params, err := registry.ParseSettings(p.settings)
	if err != nil {
		p.skipped = err.Error()
		return nil
	}
	m, err := p.entry.New(params, seed)
	if err != nil {
		p.skipped = err.Error()
		return nil
	}
	p.fallback = attn.FallbackOf(m, s, o)
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	t := time.Now()
	err = eval.Guard(func() error { return m.Forward(ctx, s, in.Q, in.K, in.V, o, out, lse) })
	secs := time.Since(t).Seconds()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.skipped = "error: " + err.Error()
		return nil
	}
	e, err := base.Compare(out, lse)
	if err != nil {
		return err
	}
	p.errs = append(p.errs, e)
	p.secs = append(p.secs, secs)
	return nil
}

// result summarises the seeds: the mean of each metric over the seeds
// that ran, the range of the relative error, the median time.
func (p *accPoint) result(seeds int) eval.AccuracyPoint {
	r := eval.AccuracyPoint{
		Sweep: p.sweep.Name(), Mech: p.sweep.Mech, Param: strings.Join(p.sweep.Params, ","),
		Value: p.value, Unit: p.sweep.Unit, Params: p.params, Skipped: p.skipped, Seeds: len(p.errs),
	}
	if r.Params == nil {
		r.Params = map[string]string{}
	}
	if p.skipped != "" || len(p.errs) == 0 {
		if r.Skipped == "" {
			r.Skipped = "not run"
		}
		return r
	}
	r.Fallback = p.fallback
	mean := func(f func(eval.Errors) float64) *float64 {
		s := 0.0
		for _, e := range p.errs {
			s += f(e)
		}
		s /= float64(len(p.errs))
		if math.IsNaN(s) || math.IsInf(s, 0) {
			return nil
		}
		return &s
	}
	r.RelErr = mean(func(e eval.Errors) float64 { return e.Rel })
	r.MaxRowErr = mean(func(e eval.Errors) float64 { return e.MaxRow })
	r.LSERelErr = mean(func(e eval.Errors) float64 { return e.LSE })
	r.LSEMaxAbs = mean(func(e eval.Errors) float64 { return e.LSEMaxAbs })
	r.SpectralErr = mean(func(e eval.Errors) float64 { return e.Spectral })
	if r.RelErr == nil {
		r.Note = "output not finite in some seed"
	}
	if seeds > 1 && r.RelErr != nil {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, e := range p.errs {
			lo, hi = math.Min(lo, e.Rel), math.Max(hi, e.Rel)
		}
		r.RelErrMin, r.RelErrMax = &lo, &hi
	}
	secs := slices.Clone(p.secs)
	slices.Sort(secs)
	r.Seconds = eval.Median(secs)
	return r
}
