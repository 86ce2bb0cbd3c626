package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/eval"
	"github.com/attnkit/attn/registry"
)

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

var accuracyHelp = helpText{
	synopsis: "attn accuracy [-mech LIST] [-n N] [-input model|gaussian|planted|FILE] [-set name=value ...] [-out DIR] [flags]",
	examples: []string{
		"attn accuracy -mech performer,hyper -n 2048",
		"attn accuracy -input planted -heads 4 -d 64 -seeds 3 -out report",
		"attn accuracy -causal -q q.npy -k k.npy -v v.npy   # activations from attn dump",
	},
	about: `Error against exact attention as each mechanism's budget grows, on one
input: the sweeps declared with each mechanism's registry entry (listed
below), each point with every error metric and the time of one call.`,
	more: func(w io.Writer) {
		fmt.Fprintln(w, "sweeps (mechanism and parameter: values, unit, fixed settings):")
		for _, s := range eval.BudgetSweeps() {
			if len(s.Params) > 0 {
				fmt.Fprintf(w, "  %-24s %v %s %s\n", s.Name(), s.Values, s.Unit, strings.Join(s.Fixed, " "))
			}
		}
	},
}

func cmdAccuracy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("accuracy", stdout, stderr, accuracyHelp)
	var approx []string
	for _, name := range registryNames() {
		if name != "exact" {
			approx = append(approx, name)
		}
	}
	mechs := fs.String("mech", strings.Join(approx, ","), "comma-separated `mechanisms` to sweep")
	fs.alias("mechs", "mech")
	var n, bFlag, hFlag, hkvFlag, dFlag, seedsFlag, workers int
	fs.intVar(&n, "n", 2048, 1, 1<<24, "a length of 1 or more", "query and key `length`")
	fs.intVar(&bFlag, "batch", 1, 1, 1<<20, "1 or more", "batch size, with -input gaussian or planted")
	fs.alias("b", "batch")
	fs.intVar(&hFlag, "heads", 8, 1, 1<<16, "1 or more", "query heads, with -input gaussian or planted")
	fs.intVar(&hkvFlag, "kv-heads", 0, 0, 1<<16, "0 (same as -heads) or more", "key/value heads (0: same as -heads)")
	fs.alias("hkv", "kv-heads")
	fs.intVar(&dFlag, "d", 64, 1, 1<<16, "1 or more", "head size, with -input gaussian or planted")
	b, h, hkv, d := &bFlag, &hFlag, &hkvFlag, &dFlag
	causal := fs.Bool("causal", false, "bottom-right aligned causal mask")
	input := fs.String("input", eval.Model, "inputs: model (the embedded model's activations over held-out Persuasion; the shape is the model's), gaussian, planted (heavy-hitter keys) or a .safetensors `FILE` holding q, k, v")
	layer := fs.Int("layer", -1, "with -input model, the model's `layer` whose attention inputs are used (-1: the last)")
	qPath := fs.String("q", "", "queries `FILE`[:tensor], [B,H,N,D] (.npy or .safetensors); with -k and -v, replaces -input")
	kPath := fs.String("k", "", "keys `FILE`[:tensor], [B,Hkv,M,D]")
	vPath := fs.String("v", "", "values `FILE`[:tensor], [B,Hkv,M,D]")
	fs.intVar(&seedsFlag, "seeds", 1, 1, 1<<16, "1 or more", "average over this many seeds (inputs and mechanisms' draws; file inputs: draws only)")
	seeds := &seedsFlag
	seed := fs.Uint64("seed", 1, "first seed")
	fs.workersVar(&workers)
	probe := fs.Bool("probe", true, "measure the machine's FMA peak and DRAM bandwidth for the report (about 1 s)")
	out := fs.String("out", "", "write `DIR`/results.json and DIR/report.html (keeping a bench's results there)")
	format := fs.String("format", "text", "`form` of the tables on stdout: text, md (Markdown), csv (one line a point, every field) or json (results.json)")
	var set listFlag
	fs.Var(&set, "set", "parameter `name=value` held for the mechanisms that have it, or MECH:name=value for one (repeatable); the swept one overrides it")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	given := fs.given()
	if err := eval.CheckFormat(*format); err != nil {
		return err
	}
	if *hkv == 0 {
		*hkv = *h
	}
	names := parseNames(*mechs)
	if len(names) == 0 {
		return fmt.Errorf("-mech: no mechanisms")
	}

	// Inputs: drawn per seed, or read once.
	var fixed *eval.Inputs
	s := attn.Shape{B: *b, H: *h, HKV: *hkv, N: n, M: n, D: *d}
	switch {
	case *qPath != "" || *kPath != "" || *vPath != "":
		if *qPath == "" || *kPath == "" || *vPath == "" {
			return fmt.Errorf("-q, -k and -v go together")
		}
		var err error
		if fixed, err = loadInputs(*qPath, *kPath, *vPath, "q", "k", "v"); err != nil {
			return err
		}
		fixed.Kind = fmt.Sprintf("q=%s k=%s v=%s", filepath.Base(*qPath), filepath.Base(*kPath), filepath.Base(*vPath))
	case *input == eval.Model:
		for _, f := range []string{"batch", "heads", "kv-heads", "d"} {
			if given[f] {
				return fmt.Errorf("-%s: with -input model the shape is the model's; use -input gaussian for other shapes", f)
			}
		}
		src, err := modelInputs(ctx, *layer, n, workers, stderr)
		if err != nil {
			return err
		}
		if fixed, err = src.Inputs(modelShape(src, n)); err != nil {
			return err
		}
		fixed.Kind = src.Name
	case *input == eval.Gaussian || *input == eval.Planted:
	case strings.EqualFold(filepath.Ext(*input), ".safetensors"):
		var err error
		if fixed, err = loadInputs(*input, *input, *input, "q", "k", "v"); err != nil {
			return err
		}
		fixed.Kind = filepath.Base(*input)
	case strings.EqualFold(filepath.Ext(*input), ".npy"):
		return fmt.Errorf("-input %s: an .npy file holds one tensor; give -q Q.npy -k K.npy -v V.npy", *input)
	default:
		return fmt.Errorf("-input %q: want gaussian, planted or a .safetensors file", *input)
	}
	if fixed != nil {
		s = fixed.Shape
	}
	if err := s.Validate(); err != nil {
		return err
	}
	cfg := accuracyConfig{
		names: names, set: set, s: s, o: attn.Options{Causal: *causal, Workers: workers},
		input: *input, fixed: fixed, seeds: *seeds, seed: *seed,
		command: "attn accuracy " + strings.Join(args, " "), stderr: stderr,
	}
	acc, runErr := runAccuracy(ctx, cfg)
	if acc == nil {
		return runErr
	}
	if err := eval.WriteAccuracy(stdout, acc, *format); err != nil {
		return errors.Join(runErr, err)
	}
	if *out != "" {
		threads := workers
		if threads <= 0 {
			threads = runtime.GOMAXPROCS(0)
		}
		res := &eval.Results{Version: attn.Version, Accuracy: acc}
		old, err := eval.Load(*out)
		if err == nil && old != nil {
			// Keep the benchmark saved there, and the machine it measured.
			res.Rows, res.Bench, res.Machine = old.Rows, old.Bench, old.Machine
		}
		if res.Machine.CPU == "" {
			res.Machine = eval.ProbeMachine(threads, *probe)
		}
		if err == nil {
			err = res.Save(*out)
		}
		if err != nil {
			return errors.Join(runErr, err)
		}
	}
	return runErr
}

// accuracyConfig is one accuracy sweep.
type accuracyConfig struct {
	names, set []string
	s          attn.Shape
	o          attn.Options
	input      string       // the built-in kind drawn per seed, unless fixed
	fixed      *eval.Inputs // inputs read from files
	seeds      int
	seed       uint64
	// deadline, when not zero, skips the points not reached by then.
	deadline time.Time
	command  string
	stderr   io.Writer
}

// runAccuracy measures every point of the sweeps of cfg.names. A bad
// mechanism name or setting fails it (nil result); a point whose mechanism
// fails is skipped with the reason. When ctx ends it returns the points so
// far with ctx's error.
func runAccuracy(ctx context.Context, cfg accuracyConfig) (*eval.Accuracy, error) {
	exactEntry, err := lookupMech("exact")
	if err != nil {
		return nil, err
	}
	for _, name := range cfg.names {
		if _, err := lookupMech(name); err != nil {
			return nil, err
		}
	}
	if err := checkSettings(cfg.names, cfg.set); err != nil {
		return nil, err
	}
	points, err := planPoints(cfg.names, cfg.set, cfg.o.Causal)
	if err != nil {
		return nil, err
	}
	s := cfg.s
	acc := &eval.Accuracy{
		Command: cfg.command, Date: time.Now().Format(time.RFC3339),
		Input: cfg.input, B: s.B, H: s.H, HKV: s.HKV, N: s.N, M: s.M, D: s.D, Causal: cfg.o.Causal, Seeds: cfg.seeds,
	}
	if cfg.fixed != nil {
		acc.Input = cfg.fixed.Kind
	}
	prog := newProgress(cfg.stderr, cfg.seeds*len(points), 0)
	runErr := func() error {
		for i := range cfg.seeds {
			sd := cfg.seed + uint64(i)
			in := cfg.fixed
			if in == nil {
				if in, err = eval.Generate(cfg.input, s, cfg.o.Causal, sd); err != nil {
					return err
				}
			}
			base, err := exactReference(ctx, exactEntry, s, cfg.o, in, sd)
			if err != nil {
				return err
			}
			for _, p := range points {
				prog.begin(fmt.Sprintf("%s=%d seed %d", p.sweep.Name(), p.value, sd))
				if !cfg.deadline.IsZero() && time.Now().After(cfg.deadline) && p.skipped == "" {
					p.skipped = "the time budget ran out before this point"
				}
				if err := p.run(ctx, s, cfg.o, in, base, sd); err != nil {
					return err
				}
				prog.end(p.skipped)
			}
		}
		return nil
	}()
	prog.finish()
	for _, p := range points {
		acc.Points = append(acc.Points, p.result(cfg.seeds))
	}
	return acc, runErr
}

// loadInputs reads Q, K and V (each PATH or PATH:NAME, see loadTensor).
func loadInputs(qp, kp, vp, qn, kn, vn string) (*eval.Inputs, error) {
	q, err := loadTensor(qp, qn)
	if err != nil {
		return nil, err
	}
	k, err := loadTensor(kp, kn)
	if err != nil {
		return nil, err
	}
	v, err := loadTensor(vp, vn)
	if err != nil {
		return nil, err
	}
	s, err := shapeOf(q, k, v)
	if err != nil {
		return nil, err
	}
	return &eval.Inputs{Shape: s, Q: q.Data, K: k.Data, V: v.Data}, nil
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
// sweep's fixed settings, then the -set values the mechanism knows, then
// the swept parameters, each later one overriding an earlier one of the
// same name. A sweep over a parameter the mechanism does not know is one
// skipped point. A point's params are every parameter in effect under
// the mask, defaults included.
func planPoints(names, set []string, causal bool) ([]*accPoint, error) {
	var points []*accPoint
	for _, name := range names {
		e, err := lookupMech(name)
		if err != nil {
			return nil, err
		}
		knows := func(p string) bool {
			_, ok := e.Param(p)
			return ok
		}
		for _, sw := range eval.SweepsFor(e) {
			if i := slices.IndexFunc(sw.Params, func(p string) bool { return !knows(p) }); i >= 0 {
				points = append(points, &accPoint{sweep: sw, entry: e,
					skipped: fmt.Sprintf("%s has no parameter %q", name, sw.Params[i])})
				continue
			}
			values := sw.Values
			if len(values) == 0 {
				values = []int{0}
			}
			for _, v := range values {
				byName := map[string]string{}
				var order []string
				add := func(kv string) {
					k, val, _ := strings.Cut(kv, "=")
					k = strings.TrimSpace(k)
					if !knows(k) {
						return
					}
					if _, ok := byName[k]; !ok {
						order = append(order, k)
					}
					byName[k] = strings.TrimSpace(val)
				}
				for _, kv := range sw.Fixed {
					add(kv)
				}
				for _, kv := range set {
					add(kv)
				}
				for _, param := range sw.Params {
					add(fmt.Sprintf("%s=%d", param, v))
				}
				p := &accPoint{sweep: sw, entry: e, value: v, params: byName}
				for _, k := range order {
					p.settings = append(p.settings, k+"="+byName[k])
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
	err = func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return m.Forward(ctx, s, in.Q, in.K, in.V, o, out, lse)
	}()
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
