package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/tensorio"
)

func cmdDump(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dump", stdout, stderr, helpText{
		synopsis: "attn dump [-model FILE] [-text FILE] -layer L -out DIR [flags]",
		examples: []string{
			"attn dump -layer 3 -ctx 1024 -out qkv     # the embedded model on embedded Persuasion",
		},
		about: `Writes the queries and keys (after the rotary embedding) and values of one
layer as float32 .npy, q [1,H,T,D], k and v [1,Hkv,T,D], and the layer's
causal attention output o [1,H,T,D], for attn accuracy -q -k -v -causal
and attn run. Without -model, the embedded model.`,
	})
	var mf modelFlags
	mf.register(fs, true)
	textPath := fs.String("text", "", "text `FILE` whose first tokens are run through the model (UTF-8; .gz is read gunzipped; default: Persuasion, embedded)")
	layer := fs.Int("layer", 0, "`layer` whose attention inputs are written (from 0)")
	ctxLen := fs.Int("ctx", 0, "tokens to run, BOS included (0: the model's context, or 512)")
	out := fs.String("out", "", "`DIR` for q.npy, k.npy, v.npy and o.npy")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("-out is required")
	}
	if *ctxLen < 0 {
		return fmt.Errorf("-ctx %d: want >= 0", *ctxLen)
	}
	exact, patched, tok, err := mf.load()
	if err != nil {
		return err
	}
	m := exact
	if patched != nil {
		m = patched // earlier patched layers shape what the layer sees
	}
	c := m.Config()
	if *layer < 0 || *layer >= c.Layers {
		return fmt.Errorf("-layer %d: the model has layers 0 to %d", *layer, c.Layers-1)
	}
	// The first window of the text: -ctx tokens, BOS included.
	text, err := experiment.LoadText(experiment.TextConfig{Path: *textPath, Limit: *ctxLen, Context: *ctxLen, SeqLen: c.SeqLen}, tok)
	if err != nil {
		return err
	}
	printLines(stderr, text.Notes)
	tokens := text.Tokens[:min(text.Context, len(text.Tokens))]
	s, q, k, v, o, err := m.Activations(ctx, tokens, *layer)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, t := range []struct {
		name  string
		heads int
		data  []float32
	}{{"q", s.H, q}, {"k", s.HKV, k}, {"v", s.HKV, v}, {"o", s.H, o}} {
		path := filepath.Join(*out, t.name+".npy")
		err := tensorio.WriteNPYFile(path, &tensorio.Tensor{Shape: []int{1, t.heads, s.N, s.D}, Data: t.data})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s [1,%d,%d,%d]\n", path, t.heads, s.N, s.D)
	}
	fmt.Fprintf(stdout, "layer %d (%s) of %s over %d tokens\n", *layer, m.Attention(*layer), filepath.Base(mf.model), s.N)
	fmt.Fprintf(stdout, "measure every mechanism on them: attn accuracy -causal -q %s -k %s -v %s\n",
		filepath.Join(*out, "q.npy"), filepath.Join(*out, "k.npy"), filepath.Join(*out, "v.npy"))
	return nil
}
