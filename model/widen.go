package model

import (
	"fmt"
	"math"

	"github.com/attnkit/attn"
)

// Widen returns the weights of a larger model that computes what w
// computes, to continue training from w with more capacity (the
// function-preserving growth of Net2Net and bert2BERT). It takes Dim,
// Hidden, Layers, Heads and KVHeads from to and everything else from w;
// none may shrink, the head width Dim/Heads must stay, and every group
// of query heads that shares a key/value head may only grow
// (Heads/KVHeads at least w's).
//
// The new parts start where they change nothing: the residual stream's
// new channels are zero (the embedding's new columns and every
// projection's rows that write them), new heads' output columns and new
// MLP units' down columns are zero, and new layers add zero to the
// stream. Their other weights are drawn as InitWeights draws them from
// seed, so that gradients reach them at the first step. RMSNorm gains
// are scaled by sqrt(w's Dim / Dim), which undoes the norm's wider
// mean over the zero channels, and its epsilon by the same factor, so
// the outputs agree up to rounding. An old head h of key/value group g becomes head
// g·(Heads/KVHeads) + h mod (w's group size), so that it keeps its keys
// and values; the new heads fill the rest of each group.
func Widen(w *Weights, to Config, seed uint64) (*Weights, error) {
	if w == nil {
		return nil, fmt.Errorf("%w: nil weights", attn.ErrInput)
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	old := w.Config.WithDefaults()
	c := w.Config
	c.Dim, c.Hidden, c.Layers, c.Heads, c.KVHeads = to.Dim, to.Hidden, to.Layers, to.Heads, to.KVHeads
	// The norms' mean over the zero channels is d0/d1 of w's; with
	// epsilon scaled alike the norm is scaled exactly, which the gains
	// undo.
	c.NormEps = old.NormEps * float32(old.Dim) / float32(max(to.Dim, 1))
	if err := c.Validate(); err != nil {
		return nil, err
	}
	nc := c.WithDefaults()
	for _, s := range []struct {
		name     string
		from, to int
	}{{"Dim", old.Dim, nc.Dim}, {"Hidden", old.Hidden, nc.Hidden}, {"Layers", old.Layers, nc.Layers},
		{"Heads", old.Heads, nc.Heads}, {"KVHeads", old.KVHeads, nc.KVHeads}, {"query heads a key/value head", old.Heads / old.KVHeads, nc.Heads / nc.KVHeads}} {
		if s.to < s.from {
			return nil, fmt.Errorf("%w: widen: %s %d → %d shrinks", attn.ErrInput, s.name, s.from, s.to)
		}
	}
	hd := old.HeadDim()
	if nc.HeadDim() != hd {
		return nil, fmt.Errorf("%w: widen: head width %d → %d (Dim/Heads must stay)", attn.ErrInput, hd, nc.HeadDim())
	}
	nw, err := InitWeights(c, seed)
	if err != nil {
		return nil, err
	}
	nw.RopeFreqs = w.RopeFreqs
	d0, d1 := old.Dim, nc.Dim
	gain := float32(math.Sqrt(float64(d0) / float64(d1)))
	// norm scales a norm's gains; old ones are w's, or nil for a new layer.
	norm := func(dst, src []float32) {
		for i := range dst {
			dst[i] = gain
			if i < len(src) {
				dst[i] *= src[i]
			}
		}
	}
	// copyRows copies src's rows [in = cols] into dst's rows rowOf(r) of
	// width dcols, leaving dst's other columns as they are.
	copyRows := func(dst []float32, dcols int, src []float32, cols int, rowOf func(int) int) {
		for r := 0; r < len(src)/cols; r++ {
			copy(dst[rowOf(r)*dcols:][:cols], src[r*cols:][:cols])
		}
	}
	same := func(r int) int { return r }
	g0, g1 := old.Heads/old.KVHeads, nc.Heads/nc.KVHeads
	// qRow maps a row of w's Wq (head h, channel j) to the wider model's.
	qRow := func(r int) int {
		h, j := r/hd, r%hd
		return ((h/g0)*g1+h%g0)*hd + j
	}
	for i := range nw.Embed {
		if i%d1 >= d0 {
			nw.Embed[i] = 0
		}
	}
	copyRows(nw.Embed, d1, w.Embed, d0, same)
	if !nc.TiedOutput {
		copyRows(nw.Output, d1, w.Output, d0, same)
	}
	norm(nw.Norm, w.Norm)
	for l := range nw.Layers {
		L := &nw.Layers[l]
		clear(L.Wo)
		clear(L.W2)
		if nc.QKVBias {
			clear(L.Bq)
			clear(L.Bk)
			clear(L.Bv)
		}
		if l >= old.Layers {
			norm(L.AttnNorm, nil)
			norm(L.MLPNorm, nil)
			continue
		}
		O := &w.Layers[l]
		norm(L.AttnNorm, O.AttnNorm)
		norm(L.MLPNorm, O.MLPNorm)
		copyRows(L.Wq, d1, O.Wq, d0, qRow)
		copyRows(L.Wk, d1, O.Wk, d0, same)
		copyRows(L.Wv, d1, O.Wv, d0, same)
		copyRows(L.W1, d1, O.W1, d0, same)
		copyRows(L.W3, d1, O.W3, d0, same)
		copyRows(L.W2, nc.Hidden, O.W2, old.Hidden, same)
		for r := 0; r < d0; r++ {
			for col := 0; col < d0; col++ {
				L.Wo[r*d1+qRow(col)] = O.Wo[r*d0+col]
			}
		}
		if nc.QKVBias {
			for r, b := range O.Bq {
				L.Bq[qRow(r)] = b
			}
			copy(L.Bk, O.Bk)
			copy(L.Bv, O.Bv)
		}
	}
	return nw, nil
}
