package main

import (
	"context"
	"fmt"
	"io"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/model"
)

// modelInputs returns the attention inputs that layer (-1: the last) of
// the embedded model computes over the first n tokens of its held-out
// text, Persuasion: the default inputs of bench and accuracy. Where n is
// past the model's context it says so on w: the positions beyond are
// computed all the same, with the rotary embedding extrapolated.
func modelInputs(ctx context.Context, layer, n, workers int, w io.Writer) (*eval.ModelSource, error) {
	wts, tok, err := austen.Load()
	if err != nil {
		return nil, err
	}
	m, err := model.New(wts, model.Options{Workers: workers})
	if err != nil {
		return nil, err
	}
	c := m.Config()
	if layer < 0 {
		layer = c.Layers - 1
	}
	if layer >= c.Layers {
		return nil, fmt.Errorf("-layer %d: the embedded model has layers 0 to %d", layer, c.Layers-1)
	}
	text, err := austen.HeldOut()
	if err != nil {
		return nil, err
	}
	// About 0.27 tokens a character: encode just enough of the text.
	chars := min(len(text), 6*n+1024)
	tokens := tok.Encode(text[:chars], true)
	if len(tokens) < n {
		return nil, fmt.Errorf("-input model: the held-out text has %d tokens, fewer than n = %d", len(tokens), n)
	}
	if n > c.SeqLen {
		fmt.Fprintf(w, "note: -input model past the model's context of %d tokens: positions beyond it extrapolate the rotary embedding\n", c.SeqLen)
	}
	name := fmt.Sprintf("%s layer %d over %s", austen.Name, layer, austen.HeldOutName)
	return eval.NewModelSource(ctx, m, tokens[:n], layer, name)
}

// modelShape is the shape of a model source's inputs at length n.
func modelShape(src *eval.ModelSource, n int) attn.Shape {
	s := src.Shape
	s.N, s.M = n, n
	return s
}
