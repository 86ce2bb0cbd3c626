package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/attnkit/attn/internal/simd"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/registry"
)

// refMech names the float64 reference in bench rows.
const refMech = experiment.Ref

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

// defaultMemBudget is half the memory available now, or 8 GiB where that
// cannot be read.
func defaultMemBudget() float64 {
	if b, ok := availableMemory(); ok {
		return b / 2
	}
	return 8 << 30
}

var benchHelp = helpText{
	synopsis: "attn bench [-mode prefill|decode|train] [-mech LIST] [-n LIST] [-set name=value ...] [-out DIR] [flags]",
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
	mode := fs.String("mode", "prefill", "prefill; decode: one query per head against a KV cache of each length (defaults then: -n 1024…65536 -heads 32 -d 128, Hkv 8 and 1, f32 and bf16); or train: a forward and a backward pass per call")
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
	dtype := fs.String("dtype", "f32", "element type: f32; for prefill bf16 (Q, K, V in bfloat16 with float32 softmax and sums, exact alone: in bfloat16 arithmetic where the amx or avx512bf16 kernels run, else widened to f32); for decode the KV cache's bf16, f16, i8 (int8, a float32 scale a row) or i4 (4-bit codes in groups of 64, KIVI), each with +rot for a Hadamard rotation of keys and values (i4+rot), or a comma-separated list of them (decode: default f32,bf16)")
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
	kernels := fs.String("kernels", "", "kernel `family` to run on: avx512bf16, avx512, avx2 or generic (default: the best this CPU has; as ATTN_KERNELS)")
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
	sets, err := experiment.ParseSettings(set)
	if err != nil {
		return err
	}
	cfg := experiment.BenchConfig{
		Mode: *mode, DType: *dtype, B: b, H: h, HKV: hkv, D: d,
		Causal: causal.values(), Reps: reps, Workers: workers, Seed: *seed, Settings: sets,
		RefBudget: *refBudget, CallBudget: *callBudget, RowTime: *rowTime, Budget: *budget,
		MemBudget: memBudget * (1 << 30), MaxErr: *maxErr, ParetoN: *paretoN, Probe: *probe, Input: *input,
		Command: "attn bench " + strings.Join(args, " "), Start: time.Now(), Lookup: lookupMech,
	}
	if cfg.Ns, err = parseInts("n", *ns, 1, 1<<24, false); err != nil {
		return err
	}
	cfg.Mechs = parseNames(*mechs)
	switch cfg.Mode {
	case experiment.Decode:
		if err := decodeDefaults(&cfg, given); err != nil {
			return err
		}
		// Decode rows fill caches with Gaussian keys and values.
		if given["input"] && cfg.Input != eval.Gaussian {
			return fmt.Errorf("-input %s: decode mode fills its caches with Gaussian keys and values only", cfg.Input)
		}
		cfg.Input = eval.Gaussian
	case experiment.Prefill, experiment.Train:
	default:
		return fmt.Errorf("-mode %q: want prefill, decode or train", cfg.Mode)
	}
	if cfg.HKV == 0 {
		cfg.HKV = cfg.H
	}
	if cfg.Input == eval.Model {
		for _, f := range []string{"batch", "heads", "kv-heads", "d"} {
			if given[f] {
				return fmt.Errorf("-%s: with -input model the shape is the model's; use -input gaussian for other shapes", f)
			}
		}
		// Check the rest before the model runs.
		probe := cfg
		probe.Input, probe.B, probe.H, probe.HKV, probe.D = eval.Gaussian, 1, 1, 1, 1
		if err := probe.Check(); err != nil {
			return err
		}
		n := max(slices.Max(cfg.Ns), *accN)
		if cfg.Source, err = modelInputs(ctx, *layer, n, cfg.Workers, stderr); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "inputs: %s\n", cfg.Source.Name)
		cfg.B, cfg.H, cfg.HKV, cfg.D = 1, cfg.Source.Shape.H, cfg.Source.Shape.HKV, cfg.Source.Shape.D
	}
	if err := cfg.Check(); err != nil {
		return err
	}
	if *kernels != "" {
		if _, err := simd.UseKernels(*kernels); err != nil {
			return fmt.Errorf("-kernels: %w", err)
		}
	}
	if note := simd.KernelsNote(); note != "" {
		fmt.Fprintln(stderr, "note:", note)
	}
	prog := newProgress(stderr, 0, cfg.Budget)
	cfg.Progress = prog
	res, err := experiment.RunBench(ctx, cfg)
	prog.finish()
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
		res.Accuracy, err = benchAccuracy(ctx, cfg, *accN, stderr)
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
// length n on the benchmark's kind of inputs, for the report, within what
// is left of -budget; nil when there is nothing to sweep or no time left.
func benchAccuracy(ctx context.Context, cfg experiment.BenchConfig, n int, stderr io.Writer) (*eval.Accuracy, error) {
	var names []string
	for _, m := range cfg.Mechs {
		if m != refMech && m != "exact" {
			names = append(names, m)
		}
	}
	var deadline time.Time
	if cfg.Budget > 0 {
		deadline = cfg.Start.Add(cfg.Budget)
		if time.Now().After(deadline) {
			fmt.Fprintf(stderr, "no accuracy sweep: -budget %s is spent\n", cfg.Budget)
			return nil, nil
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	var fixed *eval.Inputs
	if cfg.Source != nil {
		var err error
		if fixed, err = cfg.Source.Inputs(modelShape(cfg.Source, n)); err != nil {
			return nil, err
		}
		fixed.Kind = cfg.Source.Name
	}
	prog := newProgress(stderr, 0, 0)
	defer prog.finish()
	return experiment.RunAccuracy(ctx, experiment.AccuracyConfig{
		Mechs: names, Settings: cfg.Settings,
		Shape:   attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: n, M: n, D: cfg.D},
		Options: attn.Options{Workers: cfg.Workers}, Input: cfg.Input, Fixed: fixed, Seeds: 1, Seed: cfg.Seed, Deadline: deadline,
		Command: fmt.Sprintf("attn bench -accuracy-n %d (the sweeps of attn accuracy -n %d)", n, n),
		Lookup:  cfg.Lookup, Progress: prog,
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
