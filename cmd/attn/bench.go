package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/registry"
)

// refMech names the float64 reference in bench rows: the naive dense
// computation every kernel is checked against.
const refMech = "ref"

// benchResults is the -out DIR/results.json document (DESIGN.md §5).
type benchResults struct {
	Version string     `json:"version"`
	Machine machine    `json:"machine"`
	Rows    []benchRow `json:"rows"`
}

type machine struct {
	CPU     string `json:"cpu"`
	Threads int    `json:"threads"`
	// PeakGFlops and DRAMGBps are 0 until the probes that measure them
	// exist; readers must treat 0 as "not measured".
	PeakGFlops float64 `json:"peak_gflops"`
	DRAMGBps   float64 `json:"dram_gbps"`
}

type benchRow struct {
	Mode       string            `json:"mode"`
	Mech       string            `json:"mech"`
	B          int               `json:"b"`
	H          int               `json:"h"`
	HKV        int               `json:"hkv"`
	N          int               `json:"n"`
	M          int               `json:"m"`
	D          int               `json:"d"`
	Causal     bool              `json:"causal"`
	DType      string            `json:"dtype"`
	Params     map[string]string `json:"params"`
	Seconds    float64           `json:"seconds"`
	GFlops     float64           `json:"gflops"`
	GBps       float64           `json:"gbps"`
	ExtraBytes uint64            `json:"extra_bytes"`
	RelErr     *float64          `json:"rel_err"`
	Skipped    string            `json:"skipped"`
}

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
	mode, dtype      string
	mechs            []string
	ns               []int
	b, h, hkv, d     int
	causal           []bool
	reps, workers    int
	seed             uint64
	set              []string
	refBudget        float64
	rowBudget        time.Duration
	progress, stdout io.Writer
}

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("attn bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", "prefill", "prefill (decode arrives with the KV cache)")
	mechs := fs.String("mech", refMech+",exact", "comma-separated `mechanisms`: "+refMech+" (float64 reference), "+strings.Join(registry.Names(), ", "))
	ns := fs.String("n", "512,1024,2048,4096", "comma-separated query `lengths` (keys: the same)")
	b := fs.Int("b", 1, "batch size")
	h := fs.Int("h", 8, "query heads")
	hkv := fs.Int("hkv", 0, "key/value heads (0: same as -h)")
	d := fs.Int("d", 64, "head size")
	var causal causalFlag
	fs.Var(&causal, "causal", "causal rows only (-causal=false: non-causal only; unset: both)")
	dtype := fs.String("dtype", "f32", "storage type of K and V: f32")
	reps := fs.Int("reps", 5, "timed repetitions per row (median reported)")
	workers := fs.Int("workers", 0, "goroutines (0: GOMAXPROCS)")
	seed := fs.Uint64("seed", 1, "seed for inputs and randomised mechanisms")
	refBudget := fs.Float64("ref-budget", 20, "skip "+refMech+" rows estimated to take more than this many `seconds`")
	out := fs.String("out", "", "write `DIR`/results.json")
	var set listFlag
	fs.Var(&set, "set", "mechanism parameter `name=value` (repeatable) for the mechanisms that know it")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := benchConfig{
		mode: *mode, dtype: *dtype, b: *b, h: *h, hkv: *hkv, d: *d,
		causal: causal.values(), reps: *reps, workers: *workers, seed: *seed,
		set: set, refBudget: *refBudget, rowBudget: 10 * time.Second,
		progress: stderr, stdout: stdout,
	}
	if cfg.hkv == 0 {
		cfg.hkv = cfg.h
	}
	var err error
	if cfg.ns, err = registry.ParseInts("-n", *ns, 1, 1<<24); err != nil {
		return err
	}
	cfg.mechs = strings.Split(*mechs, ",")
	switch {
	case cfg.mode != "prefill":
		return fmt.Errorf("-mode %q: only prefill is implemented", cfg.mode)
	case cfg.dtype != "f32":
		return fmt.Errorf("-dtype %q: prefill supports f32 only", cfg.dtype)
	case cfg.reps < 1:
		return fmt.Errorf("-reps %d: want at least 1", cfg.reps)
	case len(cfg.ns) == 0:
		return fmt.Errorf("-n: no lengths")
	}
	res, err := bench(ctx, cfg)
	if err != nil {
		return err
	}
	printTable(stdout, res)
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		buf, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(*out, "results.json"), append(buf, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// bench runs the sweep. Mechanism construction errors fail the command;
// errors of one row are recorded in that row as skipped.
func bench(ctx context.Context, cfg benchConfig) (*benchResults, error) {
	mechs := map[string]attn.Mechanism{}
	params := map[string]map[string]string{}
	for _, name := range cfg.mechs {
		if name == refMech {
			continue
		}
		e, err := registry.Lookup(name)
		if err != nil {
			return nil, err
		}
		p, ps, err := settingsFor(e, cfg.set)
		if err != nil {
			return nil, err
		}
		if mechs[name], err = e.New(p, cfg.seed); err != nil {
			return nil, err
		}
		params[name] = ps
	}
	res := &benchResults{Version: attn.Version, Machine: probeMachine()}
	total := len(cfg.causal) * len(cfg.ns) * len(cfg.mechs)
	for _, causal := range cfg.causal {
		for _, n := range cfg.ns {
			s := attn.Shape{B: cfg.b, H: cfg.h, HKV: cfg.hkv, N: n, M: n, D: cfg.d}
			if err := s.Validate(); err != nil {
				return nil, err
			}
			rng := rand.New(rand.NewPCG(cfg.seed, uint64(n)))
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			o := attn.Options{Causal: causal, Workers: cfg.workers}
			var exactOut []float32
			var refOut []float64
			for _, name := range orderForBaseline(cfg.mechs) {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				fmt.Fprintf(cfg.progress, "[%d/%d] %s n=%d causal=%v\n", len(res.Rows)+1, total, name, n, causal)
				row := benchRow{
					Mode: cfg.mode, Mech: name, B: s.B, H: s.H, HKV: s.HKV, N: s.N, M: s.M, D: s.D,
					Causal: causal, DType: cfg.dtype, Params: params[name],
				}
				if row.Params == nil {
					row.Params = map[string]string{}
				}
				if name == refMech {
					refOut = benchRef(ctx, cfg, s, o, q, k, v, &row)
				} else {
					out := benchMech(ctx, cfg, mechs[name], s, o, q, k, v, &row)
					switch {
					case out == nil:
					case name == "exact":
						exactOut = out
						if refOut != nil {
							e := ref.RelErr(out, refOut)
							row.RelErr = &e
						}
					case exactOut != nil:
						e := ref.RelErr(out, widen(exactOut))
						row.RelErr = &e
					}
				}
				res.Rows = append(res.Rows, row)
			}
		}
	}
	sortRows(res.Rows, cfg.mechs)
	return res, nil
}

// orderForBaseline runs ref first and exact second, so that every other
// row can be compared with them, without changing the printed order.
func orderForBaseline(mechs []string) []string {
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
	slices.SortStableFunc(out, func(a, b string) int { return rank(a) - rank(b) })
	return out
}

// sortRows orders rows by the -mech order, then causal, then length.
func sortRows(rows []benchRow, mechs []string) {
	slices.SortStableFunc(rows, func(a, b benchRow) int {
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

// settingsFor keeps the -set values that entry e documents.
func settingsFor(e registry.Entry, set []string) (*registry.Params, map[string]string, error) {
	var mine []string
	ps := map[string]string{}
	for _, kv := range set {
		name, value, _ := strings.Cut(kv, "=")
		if slices.ContainsFunc(e.Params, func(p registry.Param) bool { return p.Name == name }) {
			mine = append(mine, kv)
			ps[name] = value
		}
	}
	p, err := registry.ParseSettings(mine)
	return p, ps, err
}

func widen(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// flops is the conventional count for exact attention: 4·B·H·N·M·D, half
// of it under a causal mask.
func flops(s attn.Shape, causal bool) float64 {
	f := 4 * float64(s.B) * float64(s.H) * float64(s.N) * float64(s.M) * float64(s.D)
	if causal {
		f /= 2
	}
	return f
}

// refGFlops is a conservative speed of the float64 reference, used only to
// decide whether a row fits the -ref-budget.
const refGFlops = 0.5

func benchRef(ctx context.Context, cfg benchConfig, s attn.Shape, o attn.Options, q, k, v []float32, row *benchRow) []float64 {
	if est := flops(s, o.Causal) / (refGFlops * 1e9); est > cfg.refBudget {
		row.Skipped = fmt.Sprintf("estimated %.0f s > -ref-budget %.0f s", est, cfg.refBudget)
		return nil
	}
	var out []float64
	var err error
	spec := ref.Spec{Mask: ref.Mask(s, o)}
	row.Seconds, row.ExtraBytes = timeCall(cfg, func() error {
		out, _, err = ref.Attention(s, q, k, v, spec)
		return err
	})
	if err != nil {
		row.Skipped = err.Error()
		return nil
	}
	row.GFlops = flops(s, o.Causal) / row.Seconds / 1e9
	return out
}

func benchMech(ctx context.Context, cfg benchConfig, m attn.Mechanism, s attn.Shape, o attn.Options, q, k, v []float32, row *benchRow) []float32 {
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	var err error
	row.Seconds, row.ExtraBytes = timeCall(cfg, func() error {
		err = m.Forward(ctx, s, q, k, v, o, out, lse)
		return err
	})
	if err != nil {
		row.Skipped = err.Error()
		return nil
	}
	row.GFlops = flops(s, o.Causal) / row.Seconds / 1e9
	return out
}

// timeCall runs f once to warm up and to count its allocations, then up to
// cfg.reps timed calls, stopping early once cfg.rowBudget is spent. It
// returns the median time and the bytes allocated by one call.
func timeCall(cfg benchConfig, f func() error) (seconds float64, extra uint64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	if f() != nil {
		return 0, 0
	}
	first := time.Since(t0)
	runtime.ReadMemStats(&after)
	extra = after.TotalAlloc - before.TotalAlloc
	times := []float64{}
	spent := first
	for range cfg.reps {
		if spent > cfg.rowBudget {
			break
		}
		t := time.Now()
		if f() != nil {
			return 0, 0
		}
		el := time.Since(t)
		spent += el
		times = append(times, el.Seconds())
	}
	if len(times) == 0 {
		times = append(times, first.Seconds()) // too slow to repeat
	}
	slices.Sort(times)
	return times[len(times)/2], extra
}

func printTable(w io.Writer, res *benchResults) {
	m := res.Machine
	fmt.Fprintf(w, "attn %s on %s, %d threads\n\n", res.Version, m.CPU, m.Threads)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tmech\tcausal\tn\tm\ttime\tGFLOP/s\textra mem\trel err\t")
	for _, r := range res.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%d\t", r.Mode, r.Mech, r.Causal, r.N, r.M)
		if r.Skipped != "" {
			fmt.Fprintf(tw, "skipped: %s\t\t\t\t\n", r.Skipped)
			continue
		}
		relErr := "-"
		if r.RelErr != nil {
			relErr = fmt.Sprintf("%.1e", *r.RelErr)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t\n", fmtDuration(r.Seconds), r.GFlops, fmtBytes(r.ExtraBytes), relErr)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nGFLOP/s counts 4·B·H·N·M·D flops (half when causal). extra mem: bytes allocated by one call.\n")
	fmt.Fprintf(w, "rel err: Frobenius relative error; exact against the float64 %s, others against exact.\n", refMech)
}

func fmtDuration(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.1f µs", s*1e6)
}

func fmtBytes(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// probeMachine describes this machine: the CPU model from /proc/cpuinfo
// where it exists, and the threads Go will use.
func probeMachine() machine {
	m := machine{CPU: runtime.GOARCH, Threads: runtime.GOMAXPROCS(0)}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}
