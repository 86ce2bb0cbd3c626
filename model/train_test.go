package model

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/attnkit/attn"
)

// trainConfig is a tiny GQA model the products accept (widths multiples
// of 16) with a head size (8) that is not.
func trainConfig(tied bool) Config {
	return Config{Dim: 32, Hidden: 48, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 48, SeqLen: 24, TiedOutput: tied}
}

func randomSeq(rng *rand.Rand, n, vocab int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = rng.IntN(vocab)
	}
	return s
}

// TestTrainGradient checks every tensor's gradient against central finite
// differences of the loss, at the coordinates with the largest gradients
// and at random ones, for each training attention, with GQA, an odd
// sequence length and tied and untied output layers.
func TestTrainGradient(t *testing.T) {
	ctx := context.Background()
	// odd is a model whose widths are no multiple of the products' panels
	// of 16: head size 10, one key/value head, a vocabulary of 47.
	odd := Config{Dim: 40, Hidden: 50, Layers: 2, Heads: 4, KVHeads: 1, Vocab: 47, SeqLen: 24}
	for _, tc := range []struct {
		attention string
		tied      bool
		cfg       *Config
	}{{"exact", false, nil}, {"exact", true, nil}, {"linear", false, nil}, {"window:left=3", false, nil}, {"exact", false, &odd}, {"window:left=3", false, &odd}} {
		cfg := trainConfig(tc.tied)
		if tc.cfg != nil {
			cfg = *tc.cfg
			cfg.TiedOutput = tc.tied
		}
		t.Run(fmt.Sprintf("%s/dim%d", tc.attention, cfg.Dim), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.attention))))
			w, err := RandomWeights(cfg, 3)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := NewTrainer(w, TrainConfig{Attention: tc.attention, Steps: 1})
			if err != nil {
				t.Fatal(err)
			}
			batch := [][]int{randomSeq(rng, 20, cfg.Vocab), randomSeq(rng, 13, cfg.Vocab)}
			if _, err := tr.Gradient(ctx, batch); err != nil {
				t.Fatal(err)
			}
			loss := func() float64 {
				var sum float64
				var n int
				for _, s := range batch {
					l, err := tr.Loss(ctx, s)
					if err != nil {
						t.Fatal(err)
					}
					sum += l * float64(len(s)-1)
					n += len(s) - 1
				}
				return sum / float64(n)
			}
			for _, ts := range w.Tensors() {
				g := slices.Clone(tr.Grad(ts.Name))
				d := *ts.Data
				idx := make([]int, len(g))
				for i := range idx {
					idx[i] = i
				}
				sort.Slice(idx, func(a, b int) bool { return math.Abs(float64(g[idx[a]])) > math.Abs(float64(g[idx[b]])) })
				gmax := math.Abs(float64(g[idx[0]]))
				if gmax == 0 {
					t.Errorf("%s: gradient is all zero", ts.Name)
					continue
				}
				check := append(idx[:3:3], rng.IntN(len(g)), rng.IntN(len(g)))
				for _, i := range check {
					const h = 1e-2
					x := d[i]
					d[i] = x + h
					up := loss()
					d[i] = x - h
					down := loss()
					d[i] = x
					fd := (up - down) / (2 * h)
					if diff := math.Abs(fd - float64(g[i])); diff > 2e-3*gmax+1e-5 {
						t.Errorf("%s[%d]: gradient %.6g, finite difference %.6g (largest |g| %.3g)", ts.Name, i, g[i], fd, gmax)
					}
				}
			}
		})
	}
}

// TestTrainStepLowersLoss takes one step on a batch and checks that the
// loss of that batch fell.
func TestTrainStepLowersLoss(t *testing.T) {
	ctx := context.Background()
	for _, a := range []string{"exact", "linear", "window:left=4"} {
		w, err := InitWeights(trainConfig(false), 1)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewTrainer(w, TrainConfig{Attention: a, Steps: 10, Warmup: 1, LR: 1e-2})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		seq := randomSeq(rng, 25, 48)
		before, err := tr.Loss(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		st, err := tr.Step(ctx, [][]int{seq})
		if err != nil {
			t.Fatal(err)
		}
		after, err := tr.Loss(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(st.Loss-before) > 1e-5 {
			t.Errorf("%s: Step reports loss %g, Loss gave %g", a, st.Loss, before)
		}
		if !(after < before-1e-3) {
			t.Errorf("%s: loss %g before the step, %g after", a, before, after)
		}
		if tr.Steps() != 1 {
			t.Errorf("%s: Steps() = %d after one step", a, tr.Steps())
		}
	}
}

// trainRun takes steps from..to-1 of a run on tokens.
func trainRun(t *testing.T, tr *Trainer, tokens []int, to int) {
	t.Helper()
	for tr.Steps() < to {
		if _, err := tr.Step(context.Background(), tr.Sample(tokens, tr.Steps())); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTrainResume checks that saving, resuming and continuing gives the
// same weights, bit for bit, as an uninterrupted run, and that the worker
// count changes nothing.
func TestTrainResume(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	tokens := randomSeq(rng, 400, 48)
	tc := TrainConfig{Tasks: "retrieval=0.5", Context: 16, Batch: 2, Steps: 8, Warmup: 2, LR: 3e-3, Seed: 9, Workers: 1}
	newRun := func(workers int) *Trainer {
		w, err := InitWeights(trainConfig(false), 4)
		if err != nil {
			t.Fatal(err)
		}
		c := tc
		c.Workers = workers
		tr, err := NewTrainer(w, c)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	whole := newRun(1)
	trainRun(t, whole, tokens, 6)

	part := newRun(2)
	trainRun(t, part, tokens, 3)
	var buf bytes.Buffer
	if err := part.Save(&buf, nil, "test"); err != nil {
		t.Fatal(err)
	}
	res, tok, err := Resume(bytes.NewReader(buf.Bytes()), int64(buf.Len()), 2)
	if err != nil {
		t.Fatal(err)
	}
	if tok != nil {
		t.Errorf("resumed a tokenizer that was never saved")
	}
	if res.Steps() != 3 || res.Config() != part.Config() {
		t.Fatalf("resumed step %d, config %+v; saved step 3, config %+v", res.Steps(), res.Config(), part.Config())
	}
	trainRun(t, res, tokens, 6)
	for i, ts := range whole.Weights().Tensors() {
		got := *res.Weights().Tensors()[i].Data
		if !slices.Equal(*ts.Data, got) {
			t.Errorf("%s differs between the resumed and the uninterrupted run", ts.Name)
		}
	}
	// The checkpoint is also a model.
	w, _, err := ReadGGUF(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(w, Options{}); err != nil {
		t.Fatal(err)
	}
}

// TestTrainedAttentionRoundTrip checks that a model trained with linear
// attention is saved with it and runs with it.
func TestTrainedAttentionRoundTrip(t *testing.T) {
	cfg := trainConfig(false)
	cfg.Attention = "linear"
	w, err := InitWeights(cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, w, nil, 0, "lin"); err != nil {
		t.Fatal(err)
	}
	back, _, err := ReadGGUF(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if back.Config.Attention != "linear" {
		t.Fatalf("read attention %q, want linear", back.Config.Attention)
	}
	m, err := New(back, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(back, TrainConfig{Attention: "linear", Steps: 1})
	if err != nil {
		t.Fatal(err)
	}
	seq := randomSeq(rand.New(rand.NewPCG(1, 1)), 17, 48)
	want, err := tr.Loss(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, 16*48)
	if err := m.Forward(context.Background(), seq[:16], 0, logits); err != nil {
		t.Fatal(err)
	}
	nll, _ := crossEntropy(logits, seq[1:], 48, 1, nil)
	if got := nll / 16; math.Abs(got-want) > 1e-4 {
		t.Errorf("model loss %g, trainer loss %g", got, want)
	}
	if m.Attention(0) != "linear" {
		t.Errorf("layer 0 runs %q", m.Attention(0))
	}
}

func TestTrainErrors(t *testing.T) {
	w, err := InitWeights(trainConfig(false), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []TrainConfig{
		{},                                 // no steps
		{Steps: 1, Attention: "linformer"}, // no causal form
		{Steps: 1, Attention: "window:left=-1"},
		{Steps: 1, Attention: "exact:x=1"},
		{Steps: 1, Batch: -1},
		{Steps: 4, Warmup: 5},
		{Steps: 1, LR: -1},
		{Steps: 1, LR: 1e-3, MinLR: 1e-2},
		{Steps: 1, Beta2: 1},
		{Steps: 1, Context: 1},
	} {
		if _, err := NewTrainer(w, tc); err == nil {
			t.Errorf("NewTrainer(%+v) succeeded", tc)
		}
	}
	tr, err := NewTrainer(w, TrainConfig{Steps: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, b := range [][][]int{nil, {{1}}, {{1, 48}}, {{-1, 2}}, {make([]int, 26)}} {
		if _, err := tr.Step(ctx, b); !errors.Is(err, attn.ErrInput) {
			t.Errorf("Step(%v): %v, want ErrInput", b, err)
		}
	}
	if _, _, err := Resume(bytes.NewReader([]byte("GGUF")), 4, 0); err == nil {
		t.Errorf("Resume of a truncated file succeeded")
	}
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, w, nil, 0, "plain"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Resume(bytes.NewReader(buf.Bytes()), int64(buf.Len()), 0); !errors.Is(err, ErrFormat) {
		t.Errorf("Resume of a model without training state: %v, want ErrFormat", err)
	}
}

func TestLRSchedule(t *testing.T) {
	w, err := InitWeights(trainConfig(false), 1)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(w, TrainConfig{Steps: 100, Warmup: 10, LR: 1e-3, MinLR: 1e-4})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		i    int
		want float64
	}{{0, 1e-4}, {4, 5e-4}, {9, 1e-3}, {10, 1e-3}, {55, 5.5e-4}, {100, 1e-4}, {500, 1e-4}} {
		if got := tr.LR(c.i); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("LR(%d) = %g, want %g", c.i, got, c.want)
		}
	}
	for i := 11; i < 100; i++ {
		if tr.LR(i) > tr.LR(i-1) {
			t.Errorf("LR rises from step %d to %d", i-1, i)
		}
	}
}

// TestGradientWeighted checks the weighted loss: uniform weights are the
// mean loss, and a prediction of weight 0 changes nothing whatever its
// target.
func TestGradientWeighted(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(31, 1))
	w, _ := InitWeights(trainConfig(false), 3)
	tr, err := NewTrainer(w, TrainConfig{Context: 12, Steps: 1})
	if err != nil {
		t.Fatal(err)
	}
	batch := [][]int{randomSeq(rng, 13, 48), randomSeq(rng, 13, 48)}
	grad := func(weights [][]float32) (float64, []float32) {
		l, err := tr.GradientWeighted(ctx, batch, weights)
		if err != nil {
			t.Fatal(err)
		}
		g := tr.Grad("blk.0.attn_q.weight")
		return l, slices.Clone(g)
	}
	l0, g0 := grad(nil)
	twos := [][]float32{slices.Repeat([]float32{2}, 12), slices.Repeat([]float32{2}, 12)}
	l2, g2 := grad(twos)
	if math.Abs(l0-l2) > 1e-9*l0 || maxDiff(g0, g2) > 1e-6 {
		t.Errorf("uniform weights 2: loss %v vs %v, gradient differs by %.2g", l2, l0, maxDiff(g0, g2))
	}
	mask := [][]float32{slices.Repeat([]float32{1}, 12), slices.Repeat([]float32{1}, 12)}
	mask[1][11] = 0
	_, ga := grad(mask)
	batch[1][12] = (batch[1][12] + 1) % 48 // the target of prediction 11, input to none
	_, gb := grad(mask)
	if maxDiff(ga, gb) != 0 {
		t.Errorf("a prediction of weight 0 changed the gradient by %.2g", maxDiff(ga, gb))
	}
	for _, bad := range [][][]float32{{mask[0]}, {mask[0], mask[1][:3]}, {make([]float32, 12), make([]float32, 12)}} {
		if _, err := tr.GradientWeighted(ctx, batch, bad); err == nil {
			t.Errorf("weights %v: no error", bad)
		}
	}
}
