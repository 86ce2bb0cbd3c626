package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/attnkit/attn/needle"
	"github.com/attnkit/attn/registry"
)

func cmdNeedle(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("attn needle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var mf modelFlags
	mf.register(fs, true)
	text := fs.String("text", "", "haystack text `FILE` (.gz is read gunzipped; default: Persuasion from the shared data folder)")
	def := needle.DefaultTemplates()
	ndl := fs.String("needle", def.Needle, "needle `TEMPLATE`: {key} and {value} are replaced")
	question := fs.String("question", def.Question, "question `TEMPLATE` asked at the end: {key} is replaced")
	answer := fs.String("answer", def.Answer, "expected answer `TEMPLATE`: {value} is replaced")
	lengths := fs.String("n", "1024,2048", "comma-separated prompt `lengths` in tokens")
	depths := fs.String("depths", "0,0.25,0.5,0.75,1", "comma-separated needle `depths`, fractions of the prompt")
	trials := fs.Int("trials", 5, "cases per length and depth")
	mechs := fs.String("mechs", "", "comma-separated `mechanisms`, each patched into every layer at budgets scaled to n (with exact first: exact,window,hyper,...)")
	out := fs.String("out", "", "write DIR/needle.json and heat maps per mechanism to `DIR`")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: attn needle [-model FILE] [-n 2048,4096] [-depths 0,0.5,1] [-trials 5] [-mechs exact,window,...] [-patch SPEC] [-out DIR]")
		fmt.Fprintln(stderr, "\nNeedle in a haystack: a fact (the needle) hidden at a depth of a long text, and a question about")
		fmt.Fprintln(stderr, "it at the end; the model's greedy answer is scored by exact match, per mechanism, length and depth.")
		fmt.Fprintln(stderr, "\nexample: attn needle -n 1024,2048 -depths 0,0.5,1 -trials 3 -mechs exact,window,hyper -out needle-out")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ns, err := registry.ParseInts("-n", *lengths, 1, needle.MaxLength)
	if err != nil {
		return err
	}
	var ds []float64
	for f := range strings.SplitSeq(*depths, ",") {
		d, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || d < 0 || d > 1 {
			return fmt.Errorf("-depths: %q is not a fraction in [0, 1]", f)
		}
		ds = append(ds, d)
	}
	if len(ns) == 0 || len(ds) == 0 {
		return fmt.Errorf("-n and -depths need at least one value each")
	}
	var ms []needle.Mech
	if *mechs != "" {
		if ms, err = needle.MechsScaled(strings.Split(*mechs, ",")); err != nil {
			return err
		}
	}
	for _, spec := range mf.patches {
		m, err := needle.PatchMech(spec)
		if err != nil {
			return fmt.Errorf("-patch: %w", err)
		}
		ms = append(ms, m)
	}
	patches := mf.patches
	mf.patches = nil // each mechanism builds its own patched model
	exact, _, tok, err := mf.load()
	mf.patches = patches
	if err != nil {
		return err
	}
	var hay, hayName string
	if *text != "" {
		if hay, err = needle.ReadText(*text); err != nil {
			return err
		}
		hayName = *text
	} else {
		if hay, err = needle.DefaultHaystack(); err != nil {
			if errors.Is(err, needle.ErrNoData) {
				return fmt.Errorf("no -text and the shared data folder's Persuasion is not there: %w", err)
			}
			return err
		}
		hayName = "persuasion"
	}
	if c := exact.Config(); c.SeqLen > 0 {
		for _, n := range ns {
			if n > c.SeqLen {
				fmt.Fprintf(stderr, "note: -n %d is longer than the model's context (%d)\n", n, c.SeqLen)
			}
		}
	}
	cfg := needle.Config{
		Weights: exact.Weights(), Tokenizer: tok, Model: mf.model,
		Haystack: hay, HaystackName: hayName,
		Templates: needle.Templates{Needle: *ndl, Question: *question, Answer: *answer},
		Lengths:   ns, Depths: ds, Trials: *trials, Seed: mf.seed, Mechs: ms, Workers: mf.workers,
	}
	fmt.Fprintln(stderr, "model:", describeModel(mf.model, exact))
	bar := newProgress(stderr, 0, 0)
	res, err := needle.Run(ctx, cfg, func(done, total int) {
		bar.total = total
		bar.done = done
		if bar.tty {
			bar.draw()
		}
	})
	bar.finish()
	if err != nil {
		return err
	}
	if err := needle.WriteTable(stdout, res); err != nil {
		return err
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		files, err := needle.WriteReport(*out, res)
		if err != nil {
			return err
		}
		fmt.Fprintln(stderr, "wrote", strings.Join(files, ", "))
	}
	return nil
}
