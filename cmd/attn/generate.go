package main

import (
	"context"
	"fmt"
	"io"

	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/model"
)

func cmdGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("generate", stdout, stderr, helpText{
		synopsis: "attn generate [-model FILE] -prompt TEXT [-n 200] [-temp T] [-topk K] [-seed S] [-patch SPEC] [flags]",
		examples: []string{
			`attn generate -prompt "It is a truth universally acknowledged" -n 120 -seed 1`,
			`attn generate -prompt "Anne" -patch "window:left=256" -temp 0`,
		},
		about: `Streams the prompt and its continuation to stdout and reports prefill and
decode tokens/s on stderr. Every layer attends through its mechanism's
decoder. Without -model, the embedded model.`,
	})
	var mf modelFlags
	mf.register(fs, true)
	mf.registerCache(fs)
	prompt := fs.String("prompt", "", "`TEXT` to continue (empty: start from BOS alone)")
	n := fs.Int("n", 200, "tokens to generate at most")
	temp := fs.Float64("temp", 0.8, "sampling temperature (0: greedy)")
	topk := fs.Int("topk", 40, "sample among the `K` most likely tokens (0: all)")
	sampleSeed := fs.Uint64("sample-seed", 0, "seed of the sampler (0: -seed)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *n < 0 {
		return fmt.Errorf("-n %d: want >= 0", *n)
	}
	exact, patched, tok, err := mf.load()
	if err != nil {
		return err
	}
	m := exact
	if patched != nil {
		m = patched
	}
	seed := *sampleSeed
	if seed == 0 {
		seed = mf.seed
	}
	smp, err := model.NewSampler(*temp, *topk, seed)
	if err != nil {
		return err
	}
	ids := tok.Encode(*prompt, true)
	if len(ids) == 0 {
		return fmt.Errorf("the tokenizer has no BOS and the prompt is empty: nothing to start from")
	}
	fmt.Fprintln(stderr, "model:", describeModel(mf.model, m))
	if patched != nil {
		fmt.Fprintln(stderr, "patch:", patchSummary(mf.patches))
		// Generation runs every layer through its decoder, whose rule
		// (and fallback) need not be Forward's.
		printLines(stderr, experiment.LayerFallbacks(decodeLayers{patched}, patched.Config().Layers, len(ids), 0))
	}
	// The prompt as the tokenizer sees it, then each token as it comes.
	if _, err := io.WriteString(stdout, tok.Decode(ids)); err != nil {
		return err
	}
	stream := tok.NewStream(len(ids) > 1 || *prompt != "")
	var buf []byte
	st, err := m.Generate(ctx, ids, *n, smp, tok.EOS, func(id int) error {
		buf = stream.Append(buf[:0], id)
		_, err := stdout.Write(buf)
		return err
	})
	fmt.Fprintln(stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "prefill: %d tokens in %v (%.1f tokens/s)\n", st.Prompt, st.Prefill.Round(10e3), st.PrefillRate())
	fmt.Fprintf(stderr, "decode:  %d tokens in %v (%.1f tokens/s), stopped by %s\n", st.Generated, st.Decode.Round(10e3), st.DecodeRate(), st.Stop)
	return nil
}

// decodeLayers reports a model's fallbacks as its decoders see them.
type decodeLayers struct{ *model.Model }

func (d decodeLayers) Fallback(l, n int) string { return d.DecodeFallback(l, n) }
