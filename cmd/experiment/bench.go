package experiment

import (
	"context"
	"fmt"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/simd"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/registry"
)

// Ref names the float64 reference in bench rows: the naive dense
// computation every kernel is checked against.
const Ref = "ref"

// Bench modes: a prompt of each length (prefill), or one decoder step
// against caches of each length (decode).
const (
	Prefill = "prefill"
	Decode  = "decode"
)

// BenchConfig is one benchmark sweep (attn bench).
type BenchConfig struct {
	// Mode is Prefill or Decode.
	Mode string
	// Mechs are the mechanisms timed, in the order of the tables: Ref or
	// registered names.
	Mechs []string
	// Settings are the mechanisms' parameters (-set).
	Settings Settings
	// Ns are the lengths swept: prefill's query and key length, decode's
	// cache length.
	Ns []int
	// B, H, HKV, D are the shape (HKV 0: H). Decode sweeps HKVs and
	// DTypes (storage types of kvcache) instead of HKV and DType.
	B, H, HKV, D int
	HKVs         []int
	DType        string
	DTypes       []string
	// Causal lists the masks timed (prefill; decode is causal).
	Causal []bool
	// Reps is the most timed calls of a row after one warm-up (0: 5).
	Reps, Workers int
	Seed          uint64
	// Budgets; 0 means no limit. RefBudget and CallBudget bound the
	// forecast time of one call (of Ref, of anything else), RowTime the
	// time spent repeating one row's timed calls, Budget the whole sweep
	// from Start, MemBudget the bytes a row may hold.
	RefBudget, CallBudget, RowTime, Budget time.Duration
	MemBudget                              float64
	// MaxErr is the summary's error bound, ParetoN the length of the
	// report's speed/error plot (0: the longest at which exact ran).
	MaxErr  float64
	ParetoN int
	// Input is eval.Model (Source's activations), eval.Gaussian or
	// eval.Planted.
	Input  string
	Source *eval.ModelSource
	// Probe measures the machine's FMA peak and DRAM bandwidth first.
	Probe bool
	// Command is recorded in the results; Start is when the sweep's
	// budget began (zero: when RunBench is called).
	Command string
	Start   time.Time
	// Lookup finds the mechanisms (nil: the registry).
	Lookup   Lookup
	Progress Progress
}

// Check reports the first setting that cannot run, wrapping
// attn.ErrInput or attn.ErrShape, before any work.
func (cfg *BenchConfig) Check() error {
	switch {
	case cfg.Mode != Prefill && cfg.Mode != Decode && cfg.Mode != Train:
		return fmt.Errorf("%w: mode %q: want prefill, decode or train", attn.ErrInput, cfg.Mode)
	case cfg.Mode == Prefill && cfg.DType != "f32" && cfg.DType != "bf16" && cfg.DType != "":
		return fmt.Errorf("%w: dtype %q: prefill supports f32 and bf16 (exact only)", attn.ErrInput, cfg.DType)
	case len(cfg.Ns) == 0:
		return fmt.Errorf("%w: no lengths", attn.ErrInput)
	case len(cfg.Mechs) == 0:
		return fmt.Errorf("%w: no mechanisms", attn.ErrInput)
	case cfg.RefBudget < 0 || cfg.CallBudget < 0 || cfg.RowTime < 0 || cfg.Budget < 0 || cfg.MemBudget < 0:
		return fmt.Errorf("%w: budgets must not be negative", attn.ErrInput)
	case cfg.Input != eval.Model && cfg.Input != eval.Gaussian && cfg.Input != eval.Planted:
		return fmt.Errorf("%w: input %q: want %s, %s or %s", attn.ErrInput, cfg.Input, eval.Model, eval.Gaussian, eval.Planted)
	case cfg.Input == eval.Model && cfg.Source == nil:
		return fmt.Errorf("%w: input %s needs a Source", attn.ErrInput, eval.Model)
	case cfg.Mode == Decode && cfg.Input != eval.Gaussian:
		return fmt.Errorf("%w: input %s: decode mode fills its caches with Gaussian keys and values only", attn.ErrInput, cfg.Input)
	case !(cfg.MaxErr >= 0):
		return fmt.Errorf("%w: max error %v: want >= 0", attn.ErrInput, cfg.MaxErr)
	case cfg.Reps < 0 || cfg.Workers < 0:
		return fmt.Errorf("%w: reps %d, workers %d: want >= 0", attn.ErrInput, cfg.Reps, cfg.Workers)
	}
	if cfg.Mode == Decode {
		if len(cfg.HKVs) == 0 || len(cfg.DTypes) == 0 {
			return fmt.Errorf("%w: decode needs cache head counts and storage types", attn.ErrInput)
		}
		for _, t := range cfg.DTypes {
			if _, _, err := kvcache.ParseStorage(t); err != nil {
				return fmt.Errorf("%w: dtype %q: want f32, bf16, f16, i8 or i4, each with +rot or not", attn.ErrInput, t)
			}
		}
		for _, hkv := range cfg.HKVs {
			if err := (attn.Shape{B: cfg.B, H: cfg.H, HKV: hkv, N: 1, M: 1, D: cfg.D}).Validate(); err != nil {
				return err
			}
		}
	}
	for _, n := range cfg.Ns {
		s := attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.hkv(), N: n, M: n, D: cfg.D}
		if err := s.Validate(); err != nil {
			return err
		}
		if cfg.Source != nil && n > cfg.Source.Len() {
			return fmt.Errorf("%w: length %d: the model inputs hold %d positions", attn.ErrInput, n, cfg.Source.Len())
		}
	}
	return nil
}

func (cfg *BenchConfig) hkv() int {
	if cfg.HKV == 0 {
		return cfg.H
	}
	return cfg.HKV
}

// RunBench runs the sweep: each mechanism at each length (and mask, or
// cache configuration), shortest first so that each row's time and
// memory are forecast from the shorter ones and a row that would not fit
// a budget is skipped with the reason. Mechanism construction errors fail
// it (nil results); an error or panic of one row is recorded in that row.
// When ctx ends it returns the rows so far, the running one marked
// interrupted, with ctx's error.
func RunBench(ctx context.Context, cfg BenchConfig) (*eval.Results, error) {
	if cfg.HKV == 0 {
		cfg.HKV = cfg.H
	}
	if cfg.DType == "" {
		cfg.DType = "f32"
	}
	if cfg.Reps == 0 {
		cfg.Reps = 5
	}
	if cfg.Start.IsZero() {
		cfg.Start = time.Now()
	}
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	ns := slices.Clone(cfg.Ns)
	slices.Sort(ns)
	cfg.Ns = slices.Compact(ns)
	mechs, err := buildMechs(cfg.Mechs, cfg.Settings, cfg.Seed, cfg.Lookup)
	if err != nil {
		return nil, err
	}
	threads := cfg.Workers
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	res := &eval.Results{Version: attn.Version, Machine: eval.ProbeMachine(threads, cfg.Probe)}
	prog := progressOr(cfg.Progress)
	if m := res.Machine; m.PeakGFlops > 0 {
		prog.Note(fmt.Sprintf("measured peak %.1f GFLOP/s, DRAM read %.1f GB/s on %d threads", m.PeakGFlops, m.DRAMGBps, threads))
	}
	sw := &sweep{cfg: cfg, growth: map[string]*eval.Growth{}, prog: prog, machine: res.Machine}
	needsBaseline := slices.ContainsFunc(cfg.Mechs, func(m string) bool { return m != Ref && m != "exact" })
	if needsBaseline && !slices.Contains(cfg.Mechs, "exact") {
		e, err := cfg.Lookup.get("exact")
		if err != nil {
			return nil, err
		}
		p, err := registry.ParseSettings(nil)
		if err != nil {
			return nil, err
		}
		if sw.baseline, err = e.New(p, cfg.Seed); err != nil {
			return nil, err
		}
	}
	var rows []eval.Row
	switch cfg.Mode {
	case Decode:
		rows, err = sw.decode(ctx, mechs)
	case Train:
		rows, err = sw.train(ctx, mechs)
	default:
		rows, err = sw.prefill(ctx, mechs)
	}
	for i := range rows {
		r := &rows[i]
		r.Kernels = simd.Kernels()
		// The peak is of float32 FMAs: bfloat16 rows (AMX tiles or
		// VDPBF16PS) are not measured against it.
		if r.Mech == "exact" && r.DType != "bf16" && r.GFlops > 0 && res.Machine.PeakGFlops > 0 {
			r.PeakPct = 100 * r.GFlops / res.Machine.PeakGFlops
		}
	}
	sortRows(rows, cfg.Mechs)
	res.Rows = rows
	res.Bench = &eval.BenchInfo{
		Command: cfg.Command, Date: time.Now().Format(time.RFC3339), Seconds: time.Since(cfg.Start).Seconds(),
		Input: cfg.Input, MaxErr: cfg.MaxErr, ParetoN: cfg.ParetoN,
		Summary: eval.Summarize(rows, cfg.MaxErr, cfg.Input),
	}
	return res, err
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

// buildMechs builds the selected mechanisms with the settings each has.
// Unknown names, bad parameters and a setting that no selected mechanism
// has (a typo, most likely) are errors.
func buildMechs(names []string, set Settings, seed uint64, lookup Lookup) ([]mechanism, error) {
	var known []string
	for _, n := range names {
		if n != Ref {
			known = append(known, n)
		}
	}
	if err := set.Check(known, lookup); err != nil {
		return nil, err
	}
	var out []mechanism
	for _, name := range names {
		if name == Ref {
			out = append(out, mechanism{name: name, params: [2]map[string]string{{}, {}}})
			continue
		}
		e, err := lookup.get(name)
		if err != nil {
			return nil, err
		}
		mine := set.For(e, nil)
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

// sweep is the state of one bench run: the forecasts of every series.
type sweep struct {
	cfg     BenchConfig
	machine eval.Machine
	growth  map[string]*eval.Growth // by mechanism and mask
	prog    Progress
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

// rowKey is one planned row of a sweep, for the forecasts of progress.
type rowKey struct {
	mech   string
	s      attn.Shape
	causal bool
	dtype  string
}

// begin tells the progress that row i of plan begins, with the forecast
// of it and of the rows after it.
func (sw *sweep) begin(label string, plan []rowKey, i int) {
	step := Step{Label: label, Index: i + 1, Total: len(plan), Forecast: -1, Rest: -1}
	if f, ok := sw.forecastRow(plan[i]); ok {
		step.Forecast = f
		rest := 0.0
		for _, k := range plan[i+1:] {
			f, _ := sw.forecastRow(k)
			rest += f
		}
		step.Rest = rest
		if sw.cfg.Budget > 0 {
			left := (sw.cfg.Budget - time.Since(sw.cfg.Start)).Seconds() - step.Forecast
			step.Rest = math.Max(0, math.Min(step.Rest, left))
		}
	}
	sw.prog.Begin(step)
}

// unknownGFlops is a conservative speed of a mechanism at a length
// where no forecast exists yet, for progress only: a fraction of the
// measured peak, or of a small machine's.
func (sw *sweep) unknownGFlops() float64 {
	if sw.machine.PeakGFlops > 0 {
		return sw.machine.PeakGFlops / 4
	}
	return 10
}

// forecastRow is the seconds a planned row will take (0 for one the
// budgets will skip); ok is false when not even exact attention at that
// length has a forecast yet and the guess is from flops alone.
func (sw *sweep) forecastRow(k rowKey) (float64, bool) {
	s := k.s
	if k.mech == Ref {
		est := eval.ExactFlops(s, k.causal) / (refGFlops * 1e9)
		if g, ok := sw.growthOf(Ref, k.causal).Seconds(s.M); ok {
			est = g
		}
		if sw.cfg.RefBudget > 0 && est > sw.cfg.RefBudget.Seconds() {
			return 0, true
		}
		return sw.rowCost(est), true
	}
	series := k.mech
	if sw.cfg.Mode == Decode {
		series = decodeSeries(k.mech, s.HKV, k.dtype)
	}
	est, ok := sw.growthOf(series, k.causal).Seconds(s.M)
	if !ok {
		for _, other := range []string{"exact", baselineMech} {
			if e, found := sw.growthOf(other, k.causal).Seconds(s.M); found && sw.cfg.Mode != Decode {
				est, ok = e, true
				break
			}
		}
	}
	known := ok
	if !ok {
		if sw.cfg.Mode == Decode {
			dt, _, _ := kvcache.ParseStorage(k.dtype)
			est = float64(kvBytes(s, dt)) / 5e9
		} else {
			est = eval.ExactFlops(s, k.causal) / (sw.unknownGFlops() * 1e9)
		}
	}
	if sw.cfg.CallBudget > 0 && est > sw.cfg.CallBudget.Seconds() {
		return 0, known
	}
	return sw.rowCost(est), known
}

// prefill times every mechanism on one prompt of each length, shortest
// first so that each row's cost is forecast from the shorter ones.
func (sw *sweep) prefill(ctx context.Context, mechs []mechanism) ([]eval.Row, error) {
	cfg := sw.cfg
	var plan []rowKey
	for _, n := range cfg.Ns {
		for _, causal := range cfg.Causal {
			for _, mech := range orderForBaseline(mechs) {
				plan = append(plan, rowKey{mech: mech.name, causal: causal,
					s: attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: n, M: n, D: cfg.D}})
			}
		}
	}
	var rows []eval.Row
	hasRef := slices.ContainsFunc(mechs, func(m mechanism) bool { return m.name == Ref })
	step := 0
	for _, n := range cfg.Ns {
		c := prefillCase{s: attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: n, M: n, D: cfg.D}}
		s := c.s
		// What stays allocated while the rows of this length run: Q, K, V,
		// one output and lse written by the row under test, exact's kept
		// as the baseline, ref's float64 one, and a head of differences.
		c.resident = 4 * float64(2*s.KVLen()+3*s.QLen()+2*s.LSELen())
		if hasRef {
			c.resident += 8 * float64(s.QLen()+s.LSELen())
		}
		c.resident += 8 * float64(s.N*s.D)
		if cfg.DType == "bf16" {
			c.resident += 2 * float64(2*s.KVLen()+s.QLen())
		}
		fits := cfg.MemBudget == 0 || c.resident <= cfg.MemBudget
		if fits {
			c.out, c.lse = make([]float32, s.QLen()), make([]float32, s.LSELen())
		}
		for i, causal := range cfg.Causal {
			c.o = attn.Options{Causal: causal, Workers: cfg.Workers}
			// Planted keys must be visible to their query under the mask,
			// so planted inputs are drawn per mask; Gaussian ones once.
			if fits && (i == 0 || cfg.Input == eval.Planted) {
				var err error
				if c.in, err = cfg.inputs(s, causal, cfg.Seed+uint64(n)); err != nil {
					return rows, err
				}
				if cfg.DType == "bf16" {
					c.qb, c.kb, c.vb = roundBF16(c.in.Q), roundBF16(c.in.K), roundBF16(c.in.V)
				}
			}
			c.refBase, c.exactBase = nil, nil
			for _, mech := range orderForBaseline(mechs) {
				mask := "full"
				if causal {
					mask = "causal"
				}
				sw.begin(fmt.Sprintf("%s n=%d %s", mech.name, n, mask), plan, step)
				step++
				row, err := sw.prefillRow(ctx, &c, mech)
				if err != nil {
					row = interrupted(row)
				}
				rows = append(rows, row)
				switch {
				case err != nil:
					sw.prog.End("interrupted")
					return rows, err
				case row.Skipped != "":
					sw.prog.End("skipped: " + row.Skipped)
				default:
					sw.prog.End("")
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
	s        attn.Shape
	o        attn.Options
	in       *eval.Inputs // nil when over the memory budget
	resident float64      // bytes held while the rows run
	out, lse []float32
	// qb, kb, vb are Q, K, V in bfloat16 for -dtype bf16, whose float32
	// inputs are rounded to the same values, so that ref and every row
	// see one problem.
	qb, kb, vb []uint16
	refBase    *eval.Reference[float64]
	exactBase  *eval.Reference[float32]
}

// prefillRow runs one mechanism on c. Budgets and the mechanism's own
// errors make a skipped row; only ctx ending is returned as an error.
func (sw *sweep) prefillRow(ctx context.Context, c *prefillCase, mech mechanism) (eval.Row, error) {
	s, o := c.s, c.o
	row := eval.Row{
		Mode: Prefill, Mech: mech.name, B: s.B, H: s.H, HKV: s.HKV, N: s.N, M: s.M, D: s.D,
		Causal: o.Causal, DType: sw.cfg.DType, Params: mech.paramsFor(o.Causal),
	}
	if c.in == nil {
		row.Skipped = fmt.Sprintf("inputs and outputs need %s > -mem-budget %s", fmtGiB(c.resident), fmtGiB(sw.cfg.MemBudget))
		return row, nil
	}
	if row.Skipped = sw.plan(mech.name, s, o.Causal, c.resident); row.Skipped != "" {
		return row, nil
	}
	in := c.in
	if mech.name == Ref {
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
	forward := func() error { return mech.m.Forward(ctx, s, in.Q, in.K, in.V, o, c.out, c.lse) }
	if c.qb != nil {
		kn, ok := mech.m.(*flash.Kernel)
		if !ok {
			row.Skipped = "no bfloat16 path (-dtype bf16 times exact alone)"
			return row, nil
		}
		forward = func() error { return kn.ForwardBF16(ctx, s, c.qb, c.kb, c.vb, o, c.out, c.lse) }
	}
	err := sw.measure(ctx, &row, forward)
	if err != nil || row.Skipped != "" {
		return row, err
	}
	row.Fallback = mech.fallback(s, o)
	return row, sw.compare(&row, s, c.out, c.lse, c.refBase, &c.exactBase)
}

// roundBF16 rounds x to bfloat16 in place and returns the bfloat16 bits.
func roundBF16(x []float32) []uint16 {
	b := make([]uint16, len(x))
	for i, v := range x {
		b[i] = half.F32ToBF16(v)
		x[i] = half.BF16ToF32(b[i])
	}
	return b
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
	m, err := eval.Measure(ctx, eval.TimeConfig{Reps: sw.cfg.Reps, MaxTime: sw.cfg.RowTime}, call)
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
	if row.Mech == Ref || row.Mech == "exact" {
		s := attn.Shape{B: row.B, H: row.H, HKV: row.HKV, N: row.N, M: row.M, D: row.D}
		row.GFlops = eval.GFlops(eval.ExactFlops(s, row.Causal), row.Seconds)
	}
	return nil
}

// refGFlops is a conservative speed of the float64 reference, used to
// forecast its first row, before any has been measured.
const refGFlops = 0.5

// plan returns why the row of mech at shape s should not run, or "": its
// forecast time per call against RefBudget or CallBudget, the forecast
// time of the whole row against what is left of Budget, and the forecast
// allocation plus the inputs (resident bytes) against MemBudget.
func (sw *sweep) plan(mech string, s attn.Shape, causal bool, resident float64) string {
	cfg := sw.cfg
	g := sw.growthOf(mech, causal)
	est, known := g.Seconds(s.N)
	bytes, _ := g.Bytes(s.N)
	if !known && mech == Ref {
		est = eval.ExactFlops(s, causal) / (refGFlops * 1e9)
		bytes = 8 * float64(s.QLen()+s.LSELen()+s.M)
		known = true
	}
	limit, flagName := cfg.CallBudget, "-call-budget"
	if mech == Ref {
		limit, flagName = cfg.RefBudget, "-ref-budget"
	}
	if known && limit > 0 && est > limit.Seconds() {
		return fmt.Sprintf("forecast %s per call > %s %s", eval.FormatSeconds(est), flagName, limit)
	}
	if known && cfg.Budget > 0 {
		left := cfg.Budget - time.Since(cfg.Start)
		if cost := sw.rowCost(est); cost > left.Seconds() {
			return fmt.Sprintf("forecast %s for the row, %s left of -budget %s",
				eval.FormatSeconds(cost), eval.FormatSeconds(math.Max(left.Seconds(), 0)), cfg.Budget)
		}
	}
	if cfg.MemBudget > 0 && resident+bytes > cfg.MemBudget {
		return fmt.Sprintf("forecast %s allocated per call + %s of inputs > -mem-budget %s",
			fmtGiB(bytes), fmtGiB(resident), fmtGiB(cfg.MemBudget))
	}
	return ""
}

// rowCost forecasts the seconds eval.Measure spends on calls of est
// seconds: one warm-up, then timed calls until RowTime has passed (at
// least one, unless the warm-up alone took that long), at most Reps.
func (sw *sweep) rowCost(est float64) float64 {
	rowTime := sw.cfg.RowTime.Seconds()
	if est <= 0 {
		return 0
	}
	if sw.cfg.RowTime > 0 && est >= rowTime {
		return est
	}
	calls := float64(sw.cfg.Reps)
	if sw.cfg.RowTime > 0 {
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
		case Ref:
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

// sortRows orders rows by the mechanisms' order, then causal, then length.
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
func (cfg BenchConfig) inputs(s attn.Shape, causal bool, seed uint64) (*eval.Inputs, error) {
	if cfg.Source != nil {
		in, err := cfg.Source.Inputs(s)
		if in != nil {
			in.Kind = cfg.Source.Name
		}
		return in, err
	}
	return eval.Generate(cfg.Input, s, causal, seed)
}
