package model

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
)

// TestWiden checks that a widened model gives the logits of the model it
// came from, for wider streams, MLPs and groups of heads, more key/value
// heads and more layers, tied and untied, with biases; and that a step of
// training then moves the rows that write the new channels.
func TestWiden(t *testing.T) {
	ctx := context.Background()
	small := Config{Dim: 40, Hidden: 50, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 47, SeqLen: 24}
	for _, tc := range []struct {
		name string
		from Config
		to   Config
	}{
		{"dim,heads,kv", small, Config{Dim: 60, Hidden: 50, Layers: 2, Heads: 6, KVHeads: 3}},
		{"group 2→4", small, Config{Dim: 80, Hidden: 50, Layers: 2, Heads: 8, KVHeads: 2}},
		{"hidden,layers", small, Config{Dim: 40, Hidden: 70, Layers: 3, Heads: 4, KVHeads: 2}},
		{"all,tied", func() Config { c := small; c.TiedOutput = true; return c }(), Config{Dim: 80, Hidden: 90, Layers: 3, Heads: 8, KVHeads: 2}},
		{"bias", func() Config { c := small; c.QKVBias = true; c.KVHeads = 1; return c }(), Config{Dim: 80, Hidden: 60, Layers: 2, Heads: 8, KVHeads: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := RandomWeights(tc.from, 1)
			if err != nil {
				t.Fatal(err)
			}
			if tc.from.QKVBias {
				rng := rand.New(rand.NewPCG(3, 3))
				for l := range w.Layers {
					for _, b := range [][]float32{w.Layers[l].Bq, w.Layers[l].Bk, w.Layers[l].Bv} {
						for i := range b {
							b[i] = float32(rng.NormFloat64())
						}
					}
				}
			}
			nw, err := Widen(w, tc.to, 2)
			if err != nil {
				t.Fatal(err)
			}
			if c := nw.Config; c.Dim != tc.to.Dim || c.Hidden != tc.to.Hidden || c.Layers != tc.to.Layers || c.Heads != tc.to.Heads || c.KVHeads != tc.to.KVHeads || c.Vocab != tc.from.Vocab || c.TiedOutput != tc.from.TiedOutput {
				t.Fatalf("config %+v", c)
			}
			tokens := randomSeq(rand.New(rand.NewPCG(4, 4)), 19, tc.from.Vocab)
			logits := func(w *Weights) []float32 {
				m, err := New(w, Options{Workers: 1})
				if err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(tokens)*w.Config.Vocab)
				if err := m.Forward(ctx, tokens, 0, out); err != nil {
					t.Fatal(err)
				}
				return out
			}
			want, got := logits(w), logits(nw)
			var worst float64
			for i := range want {
				worst = max(worst, math.Abs(float64(got[i]-want[i]))/(1+math.Abs(float64(want[i]))))
			}
			t.Logf("logits differ by %.3g at most (relative)", worst)
			if worst > 1e-5 {
				t.Fatalf("logits differ by %.3g (relative)", worst)
			}
			if tc.from.QKVBias {
				return // training has no biases
			}
			// A training step moves the new parts: they get gradients.
			tr, err := NewTrainer(nw, TrainConfig{Context: len(tokens) - 1, Steps: 2, LR: 1e-2, Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			wo := append([]float32(nil), nw.Layers[0].Wo...)
			if _, err := tr.Step(ctx, [][]int{tokens}); err != nil {
				t.Fatal(err)
			}
			d0 := tc.from.Dim
			moved := false
			for r := d0; r < tc.to.Dim; r++ { // rows writing the new channels
				for c := range tc.to.Dim {
					moved = moved || nw.Layers[0].Wo[r*tc.to.Dim+c] != wo[r*tc.to.Dim+c]
				}
			}
			if tc.to.Dim > d0 && !moved {
				t.Fatal("Wo's rows of the new channels did not move in a step")
			}
		})
	}
}

func TestWidenErrors(t *testing.T) {
	c := Config{Dim: 32, Hidden: 48, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 20}
	w, err := RandomWeights(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []Config{
		{Dim: 16, Hidden: 48, Layers: 2, Heads: 2, KVHeads: 1}, // narrower
		{Dim: 32, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2}, // smaller MLP
		{Dim: 32, Hidden: 48, Layers: 1, Heads: 4, KVHeads: 2}, // fewer layers
		{Dim: 48, Hidden: 48, Layers: 2, Heads: 4, KVHeads: 2}, // head width 8 → 12
		{Dim: 32, Hidden: 48, Layers: 2, Heads: 4, KVHeads: 4}, // group 2 → 1
		{Dim: 32, Hidden: 48, Layers: 2, Heads: 4, KVHeads: 3}, // invalid config
	} {
		if _, err := Widen(w, to, 1); !errors.Is(err, attn.ErrInput) && !errors.Is(err, ErrFormat) {
			t.Errorf("%+v: err = %v, want an input error", to, err)
		}
	}
	// With biases, one key/value head for 4 query heads: 6 heads on 2
	// key/value heads would shrink the group to 3.
	bc := Config{Dim: 40, Hidden: 50, Layers: 2, Heads: 4, KVHeads: 1, Vocab: 47, QKVBias: true}
	if bw, err := RandomWeights(bc, 1); err != nil {
		t.Fatal(err)
	} else if _, err := Widen(bw, Config{Dim: 60, Hidden: 60, Layers: 2, Heads: 6, KVHeads: 2}, 2); !errors.Is(err, attn.ErrInput) {
		t.Errorf("group 4 → 3: err = %v, want ErrInput", err)
	}
	if _, err := Widen(nil, c, 1); !errors.Is(err, attn.ErrInput) {
		t.Errorf("nil weights: err = %v", err)
	}
}
