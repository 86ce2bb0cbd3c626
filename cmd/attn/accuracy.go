package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/cmd/experiment"
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
	sets, err := experiment.ParseSettings(set)
	if err != nil {
		return err
	}
	prog := newProgress(stderr, 0, 0)
	cfg := experiment.AccuracyConfig{
		Mechs: names, Settings: sets, Shape: s, Options: attn.Options{Causal: *causal, Workers: workers},
		Input: *input, Fixed: fixed, Seeds: *seeds, Seed: *seed,
		Command: "attn accuracy " + strings.Join(args, " "), Lookup: lookupMech, Progress: prog,
	}
	acc, runErr := experiment.RunAccuracy(ctx, cfg)
	prog.finish()
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
