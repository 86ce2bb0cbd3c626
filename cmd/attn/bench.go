package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/eval"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/registry"
)

// refMech names the float64 reference in bench rows: the naive dense
// computation every kernel is checked against.
const refMech = "ref"

// The registry as the commands see it; tests replace these to add a
// mechanism that fails on purpose.
var (
	lookupMech    = registry.Lookup
	registryNames = registry.Names
)

// causalFlag is a boolean flag with a third state, unset, meaning both.
type causalFlag struct{ set, v bool }

func (c *causalFlag) String() string   { return strconv.FormatBool(c.v) }
func (c *causalFlag) IsBoolFlag() bool { return true }
func (c *causalFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	c.set, c.v = true, v
	return err
}

func (c *causalFlag) values() []bool {
	if !c.set {
		return []bool{false, true}
	}
	return []bool{c.v}
}

type benchConfig struct {
	mode, dtype   string
	mechs         []string
	hkvs          []int    // decode: the cache head counts swept
	dtypes        []string // decode: the storage types swept
	ns            []int
	b, h, hkv, d  int
	causal        []bool
	reps, workers int
	seed          uint64
	set           []string
	// Budgets; 0 means no limit. refBudget and callBudget bound the
	// forecast time of one call (of ref, of anything else), rowTime the
	// time spent repeating one row's timed calls, budget the whole sweep.
	refBudget, callBudget, rowTime, budget time.Duration
	memBudget                              float64 // bytes
	maxErr                                 float64
	paretoN                                int
	input                                  string // eval.Model, eval.Gaussian or eval.Planted
	// src holds the model's activations when input is eval.Model.
	src     *eval.ModelSource
	probe   bool
	command string
	stderr  io.Writer
	start   time.Time // of the command, for -budget
}

// defaultMemBudget is half the memory available now, or 8 GiB where that
// cannot be read.
func defaultMemBudget() float64 {
	if b, ok := availableMemory(); ok {
		return b / 2
	}
	return 8 << 30
}

var benchHelp = helpText{
	synopsis: "attn bench [-mode prefill|decode] [-mech LIST] [-n LIST] [-set name=value ...] [-out DIR] [flags]",
	examples: []string{
		"attn bench -out report                      # every mechanism, n = 512…16384, report/report.html",
		"attn bench -mech exact,window,hyper -n 1024,4096 -causal",
		"attn bench -mode decode -n 4096,16384 -format md",
	},
	about: `Times every selected mechanism (and ref, the float64 reference) over a
sweep of lengths, with its memory allocated per call and its error against
exact attention, and ends with the fastest mechanism within -max-err at
each length. Inputs are the embedded model's activations by default
(-input model; the shape is then the model's), or drawn (-input gaussian,
planted) in the shape of -batch, -heads, -kv-heads and -d. Rows forecast
to exceed a time or memory budget are skipped with the reason. -mode
decode times one decoder step against caches of each length instead.`,
}

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", stdout, stderr, benchHelp)
	all := append([]string{refMech}, registryNames()...)
	mode := fs.String("mode", "prefill", "prefill, or decode: one query per head against a KV cache of each length (defaults then: -n 1024…65536 -heads 32 -d 128, Hkv 8 and 1, f32 and bf16)")
	mechs := fs.String("mech", strings.Join(all, ","), "comma-separated `mechanisms`: "+refMech+" (float64 reference) or registered ones")
	fs.alias("mechs", "mech")
	ns := fs.String("n", "512,1024,2048,4096,8192,16384", "comma-separated query `lengths` (keys: the same)")
	var b, h, hkv, d int
	fs.intVar(&b, "batch", 1, 1, 1<<20, "1 or more", "batch size, with -input gaussian or planted")
	fs.alias("b", "batch")
	fs.intVar(&h, "heads", 8, 1, 1<<16, "1 or more", "query heads, with -input gaussian or planted")
	fs.intVar(&hkv, "kv-heads", 0, 0, 1<<16, "0 (same as -heads) or more", "key/value heads (0: same as -heads)")
	fs.alias("hkv", "kv-heads")
	fs.intVar(&d, "d", 64, 1, 1<<16, "1 or more", "head size, with -input gaussian or planted")
	var causal causalFlag
	fs.Var(&causal, "causal", "causal rows only (-causal=false: non-causal only; unset: both)")
	dtype := fs.String("dtype", "f32", "storage type of K and V: f32, or for decode bf16, f16 or i8 (int8, a float32 scale a row)")
	var reps, workers int
	fs.intVar(&reps, "reps", 5, 1, 1<<20, "1 or more", "timed calls per row after one warm-up (median reported)")
	fs.workersVar(&workers)
	seed := fs.Uint64("seed", 1, "seed for inputs and randomised mechanisms")
	refBudget := fs.Duration("ref-budget", 20*time.Second, "skip "+refMech+" rows forecast to take longer than this per call (0: no limit)")
	callBudget := fs.Duration("call-budget", 60*time.Second, "skip other rows forecast to take longer than this per call (0: no limit)")
	rowTime := fs.Duration("row-time", 3*time.Second, "stop repeating a row's timed calls after this long")
	budget := fs.Duration("budget", 8*time.Minute, "skip rows that would take the whole sweep past this (0: no limit)")
	memBudget := defaultMemBudget() / (1 << 30)
	fs.Var(gibFlag{&memBudget}, "mem-budget", "skip rows forecast to need more than this many `GiB` (inputs and allocations; default: half the memory available now; 0: no limit)")
	maxErr := fs.Float64("max-err", 0.1, "error bound of the summary: the fastest mechanism with relative error at most this")
	paretoN := fs.Int("pareto-n", 0, "`length` of the report's speed/error plot (0: the longest at which exact ran)")
	probe := fs.Bool("probe", true, "measure the machine's FMA peak and DRAM bandwidth first (about 1 s)")
	input := fs.String("input", eval.Model, "inputs: model (the embedded model's queries, keys and values over held-out Persuasion; the shape is the model's), gaussian (i.i.d. normal) or planted (heavy-hitter keys; see attn accuracy)")
	layer := fs.Int("layer", -1, "with -input model, the model's `layer` whose attention inputs are used (-1: the last)")
	accN := fs.Int("accuracy-n", 2048, "with -out, also sweep each mechanism's budget at this `length` for the report, as attn accuracy does (0: no)")
	out := fs.String("out", "", "write `DIR`/results.json and DIR/report.html")
	format := fs.String("format", "text", "`form` of the tables on stdout: text, md (Markdown), csv (one line a row, every field) or json (results.json)")
	var set listFlag
	fs.Var(&set, "set", "mechanism parameter `name=value` for every selected mechanism that has it, or MECH:name=value for one (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	given := fs.given()
	if err := eval.CheckFormat(*format); err != nil {
		return err
	}
	cfg := benchConfig{
		mode: *mode, dtype: *dtype, b: b, h: h, hkv: hkv, d: d,
		causal: causal.values(), reps: reps, workers: workers, seed: *seed, set: set,
		refBudget: *refBudget, callBudget: *callBudget, rowTime: *rowTime, budget: *budget,
		memBudget: memBudget * (1 << 30), maxErr: *maxErr, paretoN: *paretoN, probe: *probe, input: *input,
		command: "attn bench " + strings.Join(args, " "), stderr: stderr, start: time.Now(),
	}
	var err error
	if cfg.ns, err = parseInts("n", *ns, 1, 1<<24, false); err != nil {
		return err
	}
	cfg.mechs = parseNames(*mechs)
	if cfg.mode == "decode" {
		if err := decodeDefaults(&cfg, given); err != nil {
			return err
		}
	}
	if cfg.hkv == 0 {
		cfg.hkv = cfg.h
	}
	slices.Sort(cfg.ns)
	cfg.ns = slices.Compact(cfg.ns)
	switch {
	case benchModes[cfg.mode] == nil:
		return fmt.Errorf("-mode %q: want prefill or decode", cfg.mode)
	case cfg.mode == "prefill" && cfg.dtype != "f32":
		return fmt.Errorf("-dtype %q: prefill supports f32 only", cfg.dtype)
	case len(cfg.ns) == 0:
		return fmt.Errorf("-n: no lengths")
	case len(cfg.mechs) == 0:
		return fmt.Errorf("-mech: no mechanisms")
	case cfg.refBudget < 0 || cfg.callBudget < 0 || cfg.rowTime < 0 || cfg.budget < 0 || cfg.memBudget < 0:
		return fmt.Errorf("budgets must not be negative")
	case cfg.input != eval.Model && cfg.input != eval.Gaussian && cfg.input != eval.Planted:
		return fmt.Errorf("-input %q: want %s, %s or %s", cfg.input, eval.Model, eval.Gaussian, eval.Planted)
	case !(cfg.maxErr >= 0):
		return fmt.Errorf("-max-err %v: want >= 0", cfg.maxErr)
	}
	if cfg.mode == "decode" {
		// Decode rows fill caches with Gaussian keys and values.
		if given["input"] && cfg.input != eval.Gaussian {
			return fmt.Errorf("-input %s: decode mode fills its caches with Gaussian keys and values only", cfg.input)
		}
		cfg.input = eval.Gaussian
	}
	if cfg.input == eval.Model {
		for _, f := range []string{"batch", "heads", "kv-heads", "d"} {
			if given[f] {
				return fmt.Errorf("-%s: with -input model the shape is the model's; use -input gaussian for other shapes", f)
			}
		}
		n := max(slices.Max(cfg.ns), *accN)
		if cfg.src, err = modelInputs(ctx, *layer, n, cfg.workers, stderr); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "inputs: %s\n", cfg.src.Name)
		cfg.b, cfg.h, cfg.hkv, cfg.d = 1, cfg.src.Shape.H, cfg.src.Shape.HKV, cfg.src.Shape.D
	}
	res, err := bench(ctx, cfg)
	if res == nil {
		return err
	}
	// Print and save what was measured even when interrupted; text as
	// soon as it is there, the other forms whole at the end.
	text := *format == "text"
	if text {
		eval.WriteBenchTables(stdout, res)
	}
	if err == nil && *out != "" && *accN > 0 {
		res.Accuracy, err = benchAccuracy(ctx, cfg, *accN)
		if res.Accuracy != nil && text {
			fmt.Fprintln(stdout)
			eval.WriteAccuracyTables(stdout, res.Accuracy)
		}
	}
	if text {
		eval.WriteSummary(stdout, res)
	} else if werr := eval.WriteBench(stdout, res, *format); werr != nil {
		return errors.Join(err, werr)
	}
	if *out != "" {
		keep := func(old *eval.Results) {
			if res.Accuracy == nil {
				res.Accuracy = old.Accuracy
			}
		}
		if serr := saveMerged(*out, res, keep); serr != nil {
			return errors.Join(err, serr)
		}
	}
	return err
}

// benchAccuracy runs the accuracy sweep of the benchmarked mechanisms at
// length n on the benchmark's kind of inputs, for the report, within what is left of
// -budget; nil when there is nothing to sweep or no time left.
func benchAccuracy(ctx context.Context, cfg benchConfig, n int) (*eval.Accuracy, error) {
	var names []string
	for _, m := range cfg.mechs {
		if m != refMech && m != "exact" {
			names = append(names, m)
		}
	}
	var deadline time.Time
	if cfg.budget > 0 {
		deadline = cfg.start.Add(cfg.budget)
		if time.Now().After(deadline) {
			fmt.Fprintf(cfg.stderr, "no accuracy sweep: -budget %s is spent\n", cfg.budget)
			return nil, nil
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	var fixed *eval.Inputs
	if cfg.src != nil {
		var err error
		if fixed, err = cfg.src.Inputs(modelShape(cfg.src, n)); err != nil {
			return nil, err
		}
		fixed.Kind = cfg.src.Name
	}
	return runAccuracy(ctx, accuracyConfig{
		names: names, set: cfg.set,
		s: attn.Shape{B: cfg.b, H: cfg.h, HKV: cfg.hkv, N: n, M: n, D: cfg.d},
		o: attn.Options{Workers: cfg.workers}, input: cfg.input, fixed: fixed, seeds: 1, seed: cfg.seed, deadline: deadline,
		command: fmt.Sprintf("attn bench -accuracy-n %d (the sweeps of attn accuracy -n %d)", n, n), stderr: cfg.stderr,
	})
}

// saveMerged writes res to dir, first letting keep copy from the
// results.json already there the part of it that res does not replace.
func saveMerged(dir string, res *eval.Results, keep func(old *eval.Results)) error {
	old, err := eval.Load(dir)
	if err != nil {
		return err
	}
	if old != nil {
		keep(old)
	}
	return res.Save(dir)
}

// mechanism is one row source of a sweep.
type mechanism struct {
	name string
	m    attn.Mechanism // nil for ref
	// params are the parameters in effect, defaults included, without
	// and with the causal mask (registry.Entry.Effective).
	params [2]map[string]string
}

// paramsFor returns the parameters in effect for a row.
func (m mechanism) paramsFor(causal bool) map[string]string {
	if causal {
		return m.params[1]
	}
	return m.params[0]
}

// fallback returns why the mechanism runs exact attention for a call of
// shape s under o, or "".
func (m mechanism) fallback(s attn.Shape, o attn.Options) string {
	if m.m == nil {
		return ""
	}
	return attn.FallbackOf(m.m, s, o)
}

// buildMechs builds the selected mechanisms with the -set values each
// knows. Unknown names, bad parameters and a -set that no selected
// mechanism knows (a typo, most likely) fail the command.
func buildMechs(names, set []string, seed uint64) ([]mechanism, error) {
	if err := checkSettings(names, set); err != nil {
		return nil, err
	}
	var out []mechanism
	for _, name := range names {
		if name == refMech {
			out = append(out, mechanism{name: name, params: [2]map[string]string{{}, {}}})
			continue
		}
		e, err := lookupMech(name)
		if err != nil {
			return nil, err
		}
		mine := settingsFor(e, set)
		p, err := registry.ParseSettings(mine)
		if err != nil {
			return nil, err
		}
		m, err := e.New(p, seed)
		if err != nil {
			return nil, err
		}
		mech := mechanism{name: name, m: m}
		for i, causal := range []bool{false, true} {
			if mech.params[i], err = e.Effective(mine, causal); err != nil {
				return nil, err
			}
		}
		out = append(out, mech)
	}
	return out, nil
}

// checkSettings fails on a -set that is not name=value or whose name no
// mechanism among names documents.
func checkSettings(names, set []string) error {
	if _, err := registry.ParseSettings(set); err != nil {
		return err
	}
	for _, kv := range set {
		name, _, _ := strings.Cut(kv, "=")
		name = strings.TrimSpace(name)
		known := false
		for _, m := range names {
			if e, err := lookupMech(m); err == nil {
				_, ok := e.Param(name)
				known = known || ok
			}
		}
		if !known {
			return fmt.Errorf("-set %s: no selected mechanism has a parameter %q (see attn run -mech NAME -h)", kv, name)
		}
	}
	return nil
}

// settingsFor keeps the -set values that entry e documents.
func settingsFor(e registry.Entry, set []string) []string {
	var mine []string
	for _, kv := range set {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := e.Param(strings.TrimSpace(name)); ok {
			mine = append(mine, kv)
		}
	}
	return mine
}

// sweep is the state of one bench run: the forecasts of every series and
// the clock of the whole.
type sweep struct {
	cfg    benchConfig
	start  time.Time
	growth map[string]*eval.Growth // by mechanism and mask
	prog   *progress
	// baseline is exact attention for the errors when no row runs it.
	baseline attn.Mechanism
}

func (sw *sweep) growthOf(name string, causal bool) *eval.Growth {
	k := fmt.Sprintf("%s/%v", name, causal)
	if sw.growth[k] == nil {
		sw.growth[k] = &eval.Growth{}
	}
	return sw.growth[k]
}

// bench runs the sweep. Mechanism construction errors fail the command;
// an error of one row is recorded in that row as its skip reason. When ctx
// ends it returns the rows so far with ctx's error.
func bench(ctx context.Context, cfg benchConfig) (*eval.Results, error) {
	mechs, err := buildMechs(cfg.mechs, cfg.set, cfg.seed)
	if err != nil {
		return nil, err
	}
	for _, n := range cfg.ns {
		s := attn.Shape{B: cfg.b, H: cfg.h, HKV: cfg.hkv, N: n, M: n, D: cfg.d}
		if err := s.Validate(); err != nil {
			return nil, err
		}
	}
	threads := cfg.workers
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	res := &eval.Results{Version: attn.Version, Machine: eval.ProbeMachine(threads, cfg.probe)}
	if m := res.Machine; m.PeakGFlops > 0 {
		fmt.Fprintf(cfg.stderr, "measured peak %.1f GFLOP/s, DRAM read %.1f GB/s on %d threads\n", m.PeakGFlops, m.DRAMGBps, threads)
	}
	sw := &sweep{cfg: cfg, start: cfg.start, growth: map[string]*eval.Growth{}}
	needsBaseline := slices.ContainsFunc(cfg.mechs, func(m string) bool { return m != refMech && m != "exact" })
	if needsBaseline && !slices.Contains(cfg.mechs, "exact") {
		e, err := lookupMech("exact")
		if err != nil {
			return nil, err
		}
		p, err := registry.ParseSettings(nil)
		if err != nil {
			return nil, err
		}
		if sw.baseline, err = e.New(p, cfg.seed); err != nil {
			return nil, err
		}
	}
	total := len(cfg.ns) * len(cfg.causal) * len(mechs)
	if cfg.mode == "decode" {
		total = len(cfg.ns) * len(cfg.hkvs) * len(cfg.dtypes) * len(mechs)
	}
	sw.prog = newProgress(cfg.stderr, total, cfg.budget)
	rows, err := benchModes[cfg.mode](sw, ctx, mechs)
	sw.prog.finish()
	for i := range rows {
		r := &rows[i]
		if r.Mech == "exact" && r.GFlops > 0 && res.Machine.PeakGFlops > 0 {
			r.PeakPct = 100 * r.GFlops / res.Machine.PeakGFlops
		}
	}
	sortRows(rows, cfg.mechs)
	res.Rows = rows
	res.Bench = &eval.BenchInfo{
		Command: cfg.command, Date: time.Now().Format(time.RFC3339), Seconds: time.Since(sw.start).Seconds(),
		Input: cfg.input, MaxErr: cfg.maxErr, ParetoN: cfg.paretoN,
		Summary: eval.Summarize(rows, cfg.maxErr, cfg.input),
	}
	return res, err
}

// benchModes maps -mode to the sweep that produces its rows. A mode's rows
// carry its name in Row.Mode; the tables, summary and report group by it,
// so a new mode (decode: one query against a KV cache of each length, with
// GBps of K/V read) needs only its function here.
var benchModes = map[string]func(sw *sweep, ctx context.Context, mechs []mechanism) ([]eval.Row, error){
	"prefill": (*sweep).prefill,
	"decode":  (*sweep).decode,
}

// prefill times every mechanism on one prompt of each length, shortest
// first so that each row's cost is forecast from the shorter ones.
func (sw *sweep) prefill(ctx context.Context, mechs []mechanism) ([]eval.Row, error) {
	cfg := sw.cfg
	var rows []eval.Row
	hasRef := slices.ContainsFunc(mechs, func(m mechanism) bool { return m.name == refMech })
	for _, n := range cfg.ns {
		c := prefillCase{s: attn.Shape{B: cfg.b, H: cfg.h, HKV: cfg.hkv, N: n, M: n, D: cfg.d}}
		s := c.s
		// What stays allocated while the rows of this length run: Q, K, V,
		// one output and lse written by the row under test, exact's kept
		// as the baseline, ref's float64 one, and a head of differences.
		c.resident = 4 * float64(2*s.KVLen()+3*s.QLen()+2*s.LSELen())
		if hasRef {
			c.resident += 8 * float64(s.QLen()+s.LSELen())
		}
		c.resident += 8 * float64(s.N*s.D)
		fits := c.resident <= cfg.memBudget
		if fits {
			c.out, c.lse = make([]float32, s.QLen()), make([]float32, s.LSELen())
		}
		for i, causal := range cfg.causal {
			c.o = attn.Options{Causal: causal, Workers: cfg.workers}
			// Planted keys must be visible to their query under the mask,
			// so planted inputs are drawn per mask; Gaussian ones once.
			if fits && (i == 0 || cfg.input == eval.Planted) {
				var err error
				if c.in, err = cfg.inputs(s, causal, cfg.seed+uint64(n)); err != nil {
					return rows, err
				}
			}
			c.refBase, c.exactBase = nil, nil
			for _, mech := range orderForBaseline(mechs) {
				mask := "full"
				if causal {
					mask = "causal"
				}
				sw.prog.begin(fmt.Sprintf("%s n=%d %s", mech.name, n, mask))
				row, err := sw.prefillRow(ctx, &c, mech)
				if err != nil {
					row = interrupted(row)
				}
				rows = append(rows, row)
				switch {
				case err != nil:
					sw.prog.end("interrupted")
					return rows, err
				case row.Skipped != "":
					sw.prog.end("skipped: " + row.Skipped)
				default:
					sw.prog.end("")
					sw.growthOf(mech.name, causal).Add(n, row.Seconds, row.ExtraBytes)
				}
			}
		}
	}
	return rows, nil
}

// prefillCase is one length and mask of a prefill sweep: the inputs, the
// buffers the rows write, and the baselines of the errors once they ran.
type prefillCase struct {
	s         attn.Shape
	o         attn.Options
	in        *eval.Inputs // nil when over -mem-budget
	resident  float64      // bytes held while the rows run
	out, lse  []float32
	refBase   *eval.Reference[float64]
	exactBase *eval.Reference[float32]
}

// prefillRow runs one mechanism on c. Budgets and the mechanism's own
// errors make a skipped row; only ctx ending is returned as an error.
func (sw *sweep) prefillRow(ctx context.Context, c *prefillCase, mech mechanism) (eval.Row, error) {
	s, o := c.s, c.o
	row := eval.Row{
		Mode: "prefill", Mech: mech.name, B: s.B, H: s.H, HKV: s.HKV, N: s.N, M: s.M, D: s.D,
		Causal: o.Causal, DType: sw.cfg.dtype, Params: mech.paramsFor(o.Causal),
	}
	if c.in == nil {
		row.Skipped = fmt.Sprintf("inputs and outputs need %s > -mem-budget %s", fmtGiB(c.resident), fmtGiB(sw.cfg.memBudget))
		return row, nil
	}
	if row.Skipped = sw.plan(mech.name, s, o.Causal, c.resident); row.Skipped != "" {
		return row, nil
	}
	in := c.in
	if mech.name == refMech {
		var spec ref.Spec
		if o.Causal {
			spec.Mask = ref.Mask(s, o)
		}
		var out, lse []float64
		err := sw.measure(ctx, &row, func() error {
			var err error
			out, lse, err = ref.Attention(s, in.Q, in.K, in.V, spec)
			return err
		})
		if err != nil || row.Skipped != "" {
			return row, err
		}
		c.refBase, err = eval.NewReference(s, out, lse)
		return row, err
	}
	if mech.name != "exact" && c.exactBase == nil && sw.baseline != nil {
		var err error
		if c.exactBase, err = sw.runBaseline(ctx, s, o, in, c.resident); err != nil {
			return row, err
		}
	}
	err := sw.measure(ctx, &row, func() error {
		return mech.m.Forward(ctx, s, in.Q, in.K, in.V, o, c.out, c.lse)
	})
	if err != nil || row.Skipped != "" {
		return row, err
	}
	row.Fallback = mech.fallback(s, o)
	return row, sw.compare(&row, s, c.out, c.lse, c.refBase, &c.exactBase)
}

// interrupted returns r as a row stopped by the end of the sweep's
// context: its identity, no measurement, marked.
func interrupted(r eval.Row) eval.Row {
	return eval.Row{Mode: r.Mode, Mech: r.Mech, B: r.B, H: r.H, HKV: r.HKV, N: r.N, M: r.M, D: r.D,
		Causal: r.Causal, DType: r.DType, Params: r.Params, Skipped: "interrupted", Interrupted: true}
}

// baselineMech is the growth series of the untimed exact calls that
// provide the errors' baseline when exact is not among the rows.
const baselineMech = "exact (baseline)"

// runBaseline computes exact attention, untimed, as the baseline of the
// other rows' errors when exact itself is not benchmarked. It returns nil
// when the call would not fit the budgets; only ctx ending is an error.
func (sw *sweep) runBaseline(ctx context.Context, s attn.Shape, o attn.Options, in *eval.Inputs, resident float64) (*eval.Reference[float32], error) {
	if sw.plan(baselineMech, s, o.Causal, resident) != "" {
		return nil, nil
	}
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	t := time.Now()
	if err := sw.baseline.Forward(ctx, s, in.Q, in.K, in.V, o, out, lse); err != nil {
		return nil, ctx.Err()
	}
	sw.growthOf(baselineMech, o.Causal).Add(s.N, time.Since(t).Seconds(), 0)
	return eval.NewReference(s, out, lse)
}

// compare fills row's errors: exact against the float64 reference (and
// becomes the baseline), every other mechanism against exact.
func (sw *sweep) compare(row *eval.Row, s attn.Shape, out, lse []float32,
	refBase *eval.Reference[float64], exactBase **eval.Reference[float32]) error {
	var e eval.Errors
	var err error
	switch {
	case row.Mech == "exact":
		if refBase != nil {
			if e, err = refBase.Compare(out, lse); err != nil {
				return err
			}
			row.SetErrors(e)
		}
		// out is reused by the next row: keep a copy as the baseline.
		*exactBase, err = eval.NewReference(s, slices.Clone(out), slices.Clone(lse))
		return err
	case *exactBase != nil:
		if e, err = (*exactBase).Compare(out, lse); err != nil {
			return err
		}
		row.SetErrors(e)
	default:
		row.Note = "exact did not run at this length: no error measured"
	}
	return nil
}

// measure times one row. The mechanism's own errors and panics become the
// row's skip reason; only ctx ending is returned.
func (sw *sweep) measure(ctx context.Context, row *eval.Row, call func() error) error {
	m, err := eval.Measure(ctx, eval.TimeConfig{Reps: sw.cfg.reps, MaxTime: sw.cfg.rowTime}, call)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		row.Skipped = "error: " + err.Error()
		return nil
	}
	row.Seconds, row.SecondsMin, row.SecondsMax, row.SecondsSD = m.Median, m.Min, m.Max, m.SD
	row.Reps = len(m.Samples)
	if m.FromWarmup {
		row.Reps = 0
	}
	row.ExtraBytes = m.ExtraBytes
	if row.Mech == refMech || row.Mech == "exact" {
		s := attn.Shape{B: row.B, H: row.H, HKV: row.HKV, N: row.N, M: row.M, D: row.D}
		row.GFlops = eval.GFlops(eval.ExactFlops(s, row.Causal), row.Seconds)
	}
	return nil
}

// refGFlops is a conservative speed of the float64 reference, used to
// forecast its first row, before any has been measured.
const refGFlops = 0.5

// plan returns why the row of mech at shape s should not run, or "": its
// forecast time per call against -ref-budget or -call-budget, the forecast
// time of the whole row against what is left of -budget, and the forecast
// allocation plus the inputs (resident bytes) against -mem-budget.
func (sw *sweep) plan(mech string, s attn.Shape, causal bool, resident float64) string {
	cfg := sw.cfg
	g := sw.growthOf(mech, causal)
	est, known := g.Seconds(s.N)
	bytes, _ := g.Bytes(s.N)
	if !known && mech == refMech {
		est = eval.ExactFlops(s, causal) / (refGFlops * 1e9)
		bytes = 8 * float64(s.QLen()+s.LSELen()+s.M)
		known = true
	}
	limit, flagName := cfg.callBudget, "-call-budget"
	if mech == refMech {
		limit, flagName = cfg.refBudget, "-ref-budget"
	}
	if known && limit > 0 && est > limit.Seconds() {
		return fmt.Sprintf("forecast %s per call > %s %s", eval.FormatSeconds(est), flagName, limit)
	}
	if known && cfg.budget > 0 {
		left := cfg.budget - time.Since(sw.start)
		if cost := sw.rowCost(est); cost > left.Seconds() {
			return fmt.Sprintf("forecast %s for the row, %s left of -budget %s",
				eval.FormatSeconds(cost), eval.FormatSeconds(math.Max(left.Seconds(), 0)), cfg.budget)
		}
	}
	if cfg.memBudget > 0 && resident+bytes > cfg.memBudget {
		return fmt.Sprintf("forecast %s allocated per call + %s of inputs > -mem-budget %s",
			fmtGiB(bytes), fmtGiB(resident), fmtGiB(cfg.memBudget))
	}
	return ""
}

// rowCost forecasts the seconds eval.Measure spends on calls of est
// seconds: one warm-up, then timed calls until -row-time has passed (at
// least one, unless the warm-up alone took that long), at most -reps.
func (sw *sweep) rowCost(est float64) float64 {
	rowTime := sw.cfg.rowTime.Seconds()
	if est <= 0 {
		return 0
	}
	if sw.cfg.rowTime > 0 && est >= rowTime {
		return est
	}
	calls := float64(sw.cfg.reps)
	if sw.cfg.rowTime > 0 {
		calls = math.Min(calls, math.Max(1, math.Ceil((rowTime-est)/est)))
	}
	return est * (1 + calls)
}

func fmtGiB(b float64) string {
	if b < 0 {
		b = 0
	}
	return eval.FormatBytes(uint64(b))
}

// orderForBaseline runs ref first and exact second, so that every other
// row can be compared with them, without changing the printed order.
func orderForBaseline(mechs []mechanism) []mechanism {
	rank := func(m string) int {
		switch m {
		case refMech:
			return 0
		case "exact":
			return 1
		}
		return 2
	}
	out := slices.Clone(mechs)
	slices.SortStableFunc(out, func(a, b mechanism) int { return rank(a.name) - rank(b.name) })
	return out
}

// sortRows orders rows by the -mech order, then causal, then length.
func sortRows(rows []eval.Row, mechs []string) {
	slices.SortStableFunc(rows, func(a, b eval.Row) int {
		if c := slices.Index(mechs, a.Mech) - slices.Index(mechs, b.Mech); c != 0 {
			return c
		}
		if a.Causal != b.Causal {
			if a.Causal {
				return 1
			}
			return -1
		}
		return a.N - b.N
	})
}

// inputs returns the inputs of shape s: the model's activations, or drawn
// from seed.
func (cfg benchConfig) inputs(s attn.Shape, causal bool, seed uint64) (*eval.Inputs, error) {
	if cfg.src != nil {
		in, err := cfg.src.Inputs(s)
		if in != nil {
			in.Kind = cfg.src.Name
		}
		return in, err
	}
	return eval.Generate(cfg.input, s, causal, seed)
}
