package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/registry"
)

func cmdPatching(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("patching", stdout, stderr, helpText{
		synopsis: "attn patching [-model FILE] [-text FILE] [-ctx N] [-mech LIST] [-layers LIST] [-set MECH:name=value ...] [-out DIR] [flags]",
		examples: []string{
			"attn patching -ctx 2048 -tokens 32768 -out patching-out   # the embedded model on embedded Persuasion",
			"attn patching -text book.txt -mech window,hyper -layers 0-2 -set hyper:samples=128",
		},
		about: `Perplexity as the attention of the last ℓ layers is replaced by an
approximation, for ℓ = 0…L and each mechanism, and the time spent in
attention (the HyperAttention paper's Figure 3). ℓ = 0 is the exact model,
run once and shared by every curve.`,
		more: func(w io.Writer) {
			fmt.Fprint(w, `Budgets scale with n, the window length (-ctx, or the text when shorter),
so that each mechanism sees about n/8 keys per query on average (exact
attention, causal, averages (n+1)/2):
`)
			for _, name := range experiment.PatchingMechs {
				fmt.Fprintf(w, "  %-10s %s\n", name, experiment.ScaledBudget(name, 2048, 2048).Rule)
			}
			fmt.Fprintln(w, "and min=0 (no fallback to exact) for reformer, performer and hyper.")
			fmt.Fprintln(w, "Other registered mechanisms run with their defaults; -set changes any of them.")
		},
	})
	var mf modelFlags
	mf.register(fs, false)
	textPath := fs.String("text", "", "text `FILE` to score (UTF-8; .gz is read gunzipped; default: Persuasion, embedded)")
	ctxLen := fs.Int("ctx", 0, "tokens per window, n (0: the model's context, or 512)")
	stride := fs.Int("stride", 0, "tokens a window moves (0: half the window)")
	limit := fs.Int("tokens", 0, "score only the first `N` tokens of the text (0: all)")
	mechList := fs.String("mech", strings.Join(experiment.PatchingMechs, ","), "comma-separated `mechanisms`, one curve each")
	fs.alias("mechs", "mech")
	layerList := fs.String("layers", "all", "the values of ℓ to run: `LIST` of numbers and ranges lo-hi, or all (0…L); 0 always runs")
	kl := fs.Bool("kl", false, "also the KL divergence from the exact model and each layer's attention error (runs the exact model on every window again)")
	out := fs.String("out", "", "write `DIR`/patching.json, patching.md, patching.png and patching.svg")
	var sets listFlag
	fs.Var(&sets, "set", "override or add parameters: `SPEC` MECH:name=value[,name=value] for one mechanism, name=value for every one that has it (repeatable, or ';'-separated)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tcfg := experiment.TextConfig{Path: *textPath, Limit: *limit, Context: *ctxLen, Stride: *stride}
	if err := tcfg.Check(); err != nil {
		return err
	}
	mechs := strings.Split(*mechList, ",")
	for i := range mechs {
		mechs[i] = strings.TrimSpace(mechs[i])
	}
	mechs = slices.DeleteFunc(mechs, func(m string) bool { return m == "" })
	if len(mechs) == 0 {
		return fmt.Errorf("-mech: no mechanism")
	}
	overrides, err := experiment.ParseSettings(sets)
	if err != nil {
		return err
	}
	for i, name := range mechs {
		if _, err := registry.Lookup(name); err != nil {
			return fmt.Errorf("-mech: %w", err)
		}
		if slices.Contains(mechs[:i], name) {
			return fmt.Errorf("-mech: %s listed twice", name)
		}
	}
	if err := overrides.Check(mechs, nil); err != nil {
		return err
	}
	exact, _, tok, err := mf.load()
	if err != nil {
		return err
	}
	ells, err := parseEll(*layerList, exact.Config().Layers)
	if err != nil {
		return err
	}
	tcfg.SeqLen = exact.Config().SeqLen
	text, err := experiment.LoadText(tcfg, tok)
	if err != nil {
		return err
	}
	printLines(stderr, text.Notes)
	cfg := experiment.PatchingConfig{Exact: exact, ModelName: mf.model, Text: text, Mechs: mechs, Settings: overrides,
		Ells: ells, KL: *kl, Workers: mf.workers, Seed: mf.seed}
	plan, err := experiment.PlanPatching(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "model ", describeModel(mf.model, exact))
	fmt.Fprintf(stdout, "text   %s: %d characters, %d tokens; windows of %d tokens, stride %d: %d windows\n\n",
		text.Name, text.Chars, len(text.Tokens), text.Context, text.Stride, text.Windows)
	bt := plan.BudgetTable()
	fmt.Fprintln(stdout, bt.Title+":")
	eval.WriteTable(stdout, bt)
	prog := newProgress(stderr, 0, 0)
	cfg.Progress = prog
	res, err := experiment.RunPatching(ctx, cfg)
	prog.finish()
	if res == nil {
		return err
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	eval.WritePatchingTables(stdout, res, false)
	if *out != "" {
		if err := eval.SavePatching(*out, res); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "\nwrote", filepath.Join(*out, "patching.{json,md,png,svg}"), "and", filepath.Join(*out, eval.ReportFile))
	}
	var failed []string
	for _, m := range res.Mechanisms {
		if m.Error != "" {
			failed = append(failed, m.Name)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d mechanisms failed: %s (see the tables)", len(failed), strings.Join(failed, ", "))
	}
	return nil
}

// parseEll parses -layers: "all" (0…L) or numbers and ranges lo-hi in
// [0, L]. The result is ascending, without repeats, and starts with 0: the
// exact model is every curve's first point.
func parseEll(s string, L int) ([]int, error) {
	if strings.TrimSpace(s) == "all" {
		s = fmt.Sprintf("0-%d", L)
	}
	ells, err := parseInts("layers", s, 0, L, true)
	if err != nil {
		return nil, fmt.Errorf("%w (the model has %d layers)", err, L)
	}
	ells = append(ells, 0)
	slices.Sort(ells)
	return slices.Compact(ells), nil
}
