package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/cmd/needle"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/registry"
)

func cmdNeedle(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("needle", stdout, stderr, helpText{
		synopsis: "attn needle [-model FILE] [-n LIST] [-depths LIST] [-trials N] [-mech LIST] [-set name=value ...] [-patch SPEC] [-out DIR]",
		examples: []string{
			"attn needle -n 1024,2048 -depths 0,0.5,1 -trials 3 -mech exact,window,hyper -out needle-out",
			"attn needle -model long.gguf -n 8192 -mech exact,hyper -set hyper:samples=256",
		},
		about: `Needle in a haystack: a fact (the needle) hidden at a depth of a long
text, and a question about it at the end; the model's greedy answer is
scored by exact match, per mechanism, length and depth. The haystack is
held-out Persuasion, embedded with the default model, unless -text says
otherwise.`,
	})
	var mf modelFlags
	mf.register(fs, true)
	mf.registerCache(fs)
	text := fs.String("text", "", "haystack text `FILE` (UTF-8; .gz is read gunzipped; default: Persuasion, embedded)")
	def := needle.DefaultTemplates()
	ndl := fs.String("needle", def.Needle, "needle `TEMPLATE`: {key} and {value} are replaced")
	question := fs.String("question", def.Question, "question `TEMPLATE` asked at the end: {key} is replaced")
	answer := fs.String("answer", def.Answer, "expected answer `TEMPLATE`: {value} is replaced")
	lengths := fs.String("n", "1024,2048", "comma-separated prompt `lengths` in tokens")
	depths := fs.String("depths", "0,0.25,0.5,0.75,1", "comma-separated needle `depths`, fractions of the prompt")
	var trials int
	fs.intVar(&trials, "trials", 5, 1, needle.MaxTrials, fmt.Sprintf("1 to %d", needle.MaxTrials), "cases per length and depth")
	mechs := fs.String("mech", "", "comma-separated `mechanisms`, each patched into every layer at budgets scaled to n (with exact first: exact,window,hyper,...)")
	fs.alias("mechs", "mech")
	var set listFlag
	fs.Var(&set, "set", "with -mech, parameter `name=value` for every mechanism that has it, or MECH:name=value for one (repeatable); replaces the scaled budget's")
	out := fs.String("out", "", "write DIR/needle.json and heat maps per mechanism to `DIR`")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ns, err := parseInts("n", *lengths, 1, needle.MaxLength, false)
	if err != nil {
		return err
	}
	ds, err := parseFloats("depths", *depths, 0, 1)
	if err != nil {
		return err
	}
	if len(ns) == 0 || len(ds) == 0 {
		return fmt.Errorf("-n and -depths need at least one value each")
	}
	sets, err := experiment.ParseSettings(set)
	if err != nil {
		return err
	}
	var ms []needle.Mech
	names := parseNames(*mechs)
	if len(names) > 0 {
		if ms, err = needle.MechsScaled(names); err != nil {
			return err
		}
		if err := sets.Check(names, nil); err != nil {
			return err
		}
		for i := range ms {
			ms[i] = withSettings(ms[i], sets)
		}
	} else if len(sets) > 0 {
		return fmt.Errorf("-set needs -mech (a -patch spec carries its own parameters)")
	}
	for _, spec := range mf.patches {
		m, err := needle.PatchMech(spec)
		if err != nil {
			return fmt.Errorf("-patch: %w", err)
		}
		ms = append(ms, m)
	}
	dt, rot, err := mf.storage()
	if err != nil {
		return err
	}
	patches, cache := mf.patches, mf.cache
	mf.patches, mf.cache = nil, "" // each mechanism builds its own model, with the cache
	exact, _, tok, err := mf.load()
	mf.patches, mf.cache = patches, cache
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
		// Persuasion, embedded with the default model: the command runs
		// from a fresh clone.
		if hay, err = austen.HeldOut(); err != nil {
			return err
		}
		hayName = austen.HeldOutName
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
		Lengths:   ns, Depths: ds, Trials: trials, Seed: mf.seed, Mechs: ms, Workers: mf.workers,
		Cache: dt, CacheRotate: rot,
	}
	fmt.Fprintln(stderr, "model:", describeModel(mf.model, exact))
	bar := newProgress(stderr, 0, 0)
	bar.label = "needle"
	res, err := needle.Run(ctx, cfg, bar.count)
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
		if err := eval.SaveReport(*out); err != nil {
			return err
		}
		fmt.Fprintln(stderr, "wrote", strings.Join(files, ", "), "and", filepath.Join(*out, eval.ReportFile))
	}
	return nil
}

// withSettings applies the -set values to a scaled mechanism: each
// length's budget settings, then the -set ones, which replace them.
func withSettings(m needle.Mech, sets experiment.Settings) needle.Mech {
	if len(sets) == 0 {
		return m
	}
	scaled := m.PatchesFor
	name := m.Name
	m.Scaled = func(n int) ([]model.Patch, error) {
		ps, err := scaled(n)
		if err != nil {
			return nil, err
		}
		e, err := registry.Lookup(name)
		if err != nil {
			return nil, err
		}
		out := make([]model.Patch, len(ps))
		for i, p := range ps {
			p.Settings = sets.For(e, p.Settings)
			out[i] = p
		}
		return out, nil
	}
	return m
}
