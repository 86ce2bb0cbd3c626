package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/registry"
)

// TrainConfig are the settings of a training run. Zero fields take the
// defaults named; they are those of small GPT-style runs (nanoGPT,
// llama2.c's tinystories models).
type TrainConfig struct {
	// Attention is the attention every layer trains with, a registry
	// mechanism with a backward pass and its parameters in the syntax of
	// ParsePatch without layers: "exact" (or ""), "linear",
	// "window:left=64", …. Layer l's mechanism is built with seed l. A
	// model trained with a mechanism runs with it (Config.Attention).
	Attention string
	// Tasks describes what the caller mixes into the training windows
	// (attn train: "retrieval=0.5,facts=4", planted facts asked for at the
	// end). The trainer does not read it; checkpoints keep it, so that a
	// resumed run mixes the same.
	Tasks   string
	Context int // tokens per training sequence (default Config.SeqLen)
	Batch   int // sequences per step (default 1)
	Steps   int // steps of the cosine schedule (required)
	Warmup  int // steps of linear warm-up (default Steps/20)
	// LR is the peak learning rate (default 1e-3); the schedule decays it
	// along a cosine to MinLR (default LR/10) at Steps, and holds it there.
	LR, MinLR float64
	// WeightDecay is AdamW's decoupled decay of the matrices (default
	// 0.1; norm gains are never decayed). Set a negative value for none.
	WeightDecay float64
	// Beta1, Beta2 and Eps are Adam's (defaults 0.9, 0.95, 1e-8).
	Beta1, Beta2, Eps float64
	// Clip bounds the global L2 norm of the gradient (default 1; a
	// negative value disables clipping).
	Clip float64
	// Seed draws the training windows (see Sample).
	Seed uint64
	// Workers bounds the goroutines (0: GOMAXPROCS). The result does not
	// depend on it.
	Workers int
}

func (c TrainConfig) withDefaults(m Config) TrainConfig {
	if c.Attention == "" {
		c.Attention = "exact"
	}
	if c.Context == 0 {
		c.Context = m.SeqLen
	}
	if c.Batch == 0 {
		c.Batch = 1
	}
	if c.Warmup == 0 {
		c.Warmup = c.Steps / 20
	}
	if c.LR == 0 {
		c.LR = 1e-3
	}
	if c.MinLR == 0 {
		c.MinLR = c.LR / 10
	}
	if c.WeightDecay == 0 {
		c.WeightDecay = 0.1
	}
	c.WeightDecay = max(c.WeightDecay, 0)
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.95
	}
	if c.Eps == 0 {
		c.Eps = 1e-8
	}
	if c.Clip == 0 {
		c.Clip = 1
	}
	return c
}

// Trainer trains a model's weights in place with AdamW. It is not safe for
// concurrent use.
type Trainer struct {
	w       *Weights
	cfg     Config
	tc      TrainConfig
	workers int
	att     []trainAttention // per layer
	step    int              // steps taken
	// attnTime is the wall time spent in attention's forward and
	// backward calls.
	attnTime time.Duration

	ts     []Tensor    // w's tensors, in file order
	m, v   [][]float32 // Adam's moments, per tensor
	gflat  [][]float32 // gradients, per tensor (views of grads)
	grads  *gradients
	woutT  []float32   // Woutᵀ [Dim][Vocab], refreshed every step
	dwoutT []float32   // its gradient
	wT     []layerMats // transposed matrices of every layer
}

// gradients mirror the weights.
type gradients struct {
	embed, norm, output []float32
	layers              []Layer
}

// layerMats holds the transposed matrices of a layer (fields as in Layer,
// norms unused).
type layerMats = Layer

// NewTrainer returns a trainer of w (which it updates in place) with
// settings tc.
func NewTrainer(w *Weights, tc TrainConfig) (*Trainer, error) {
	if w == nil {
		return nil, fmt.Errorf("%w: nil weights", attn.ErrInput)
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	// The backward pass differentiates the plain llama equations only.
	if err := w.plainLlama(); err != nil {
		return nil, err
	}
	cfg := w.Config.WithDefaults()
	tc = tc.withDefaults(cfg)
	switch {
	case tc.Context < 2:
		return nil, fmt.Errorf("%w: Context = %d, want >= 2 (or a model SeqLen)", attn.ErrInput, tc.Context)
	case tc.Batch < 1:
		return nil, fmt.Errorf("%w: Batch = %d, want >= 1", attn.ErrInput, tc.Batch)
	case tc.Steps < 1:
		return nil, fmt.Errorf("%w: Steps = %d, want >= 1", attn.ErrInput, tc.Steps)
	case tc.Warmup < 0 || tc.Warmup > tc.Steps:
		return nil, fmt.Errorf("%w: Warmup = %d, want 0 to Steps", attn.ErrInput, tc.Warmup)
	case !(tc.LR > 0) || !(tc.MinLR > 0) || tc.MinLR > tc.LR || math.IsInf(tc.LR, 0):
		return nil, fmt.Errorf("%w: LR = %g, MinLR = %g: want 0 < MinLR <= LR, finite", attn.ErrInput, tc.LR, tc.MinLR)
	case !(tc.Beta1 >= 0 && tc.Beta1 < 1) || !(tc.Beta2 >= 0 && tc.Beta2 < 1) || !(tc.Eps > 0):
		return nil, fmt.Errorf("%w: Beta1 = %g, Beta2 = %g, Eps = %g: want betas in [0, 1), Eps > 0", attn.ErrInput, tc.Beta1, tc.Beta2, tc.Eps)
	case tc.Workers < 0:
		return nil, fmt.Errorf("%w: Workers = %d, want >= 0", attn.ErrInput, tc.Workers)
	case math.IsNaN(tc.WeightDecay) || math.IsNaN(tc.Clip):
		return nil, fmt.Errorf("%w: NaN WeightDecay or Clip", attn.ErrInput)
	}
	att, err := newTrainAttention(tc.Attention, cfg.Layers)
	if err != nil {
		return nil, err
	}
	t := &Trainer{w: w, cfg: cfg, tc: tc, workers: tc.Workers, att: att, ts: w.Tensors()}
	if t.workers == 0 {
		t.workers = runtime.GOMAXPROCS(0)
	}
	g := &gradients{layers: make([]Layer, cfg.Layers)}
	gw := &Weights{Config: cfg, Layers: g.layers}
	gts := gw.Tensors()
	for i, ts := range t.ts {
		n := len(*ts.Data)
		*gts[i].Data = make([]float32, n)
		t.m = append(t.m, make([]float32, n))
		t.v = append(t.v, make([]float32, n))
	}
	g.embed, g.norm, g.output = gw.Embed, gw.Norm, gw.Output
	for _, ts := range gts {
		t.gflat = append(t.gflat, *ts.Data)
	}
	t.grads = g
	t.woutT = make([]float32, cfg.Dim*cfg.Vocab)
	t.dwoutT = make([]float32, cfg.Dim*cfg.Vocab)
	t.wT = make([]layerMats, cfg.Layers)
	for l := range t.wT {
		L, T := &w.Layers[l], &t.wT[l]
		T.Wq, T.Wk, T.Wv, T.Wo = make([]float32, len(L.Wq)), make([]float32, len(L.Wk)), make([]float32, len(L.Wv)), make([]float32, len(L.Wo))
		T.W1, T.W2, T.W3 = make([]float32, len(L.W1)), make([]float32, len(L.W2)), make([]float32, len(L.W3))
	}
	return t, nil
}

// Config returns the training settings with defaults filled in.
func (t *Trainer) Config() TrainConfig { return t.tc }

// Weights returns the weights being trained (shared, not a copy).
func (t *Trainer) Weights() *Weights { return t.w }

// AttentionTime returns the wall time this trainer has spent inside the
// attention of its layers (forward and backward), for the share of
// attention in training time.
func (t *Trainer) AttentionTime() time.Duration { return t.attnTime }

// Steps returns the number of steps taken.
func (t *Trainer) Steps() int { return t.step }

// LR returns the learning rate of step i (counted from 0): linear warm-up
// from LR/Warmup to LR over Warmup steps, then a cosine down to MinLR at
// Steps, MinLR after.
func (t *Trainer) LR(i int) float64 {
	c := t.tc
	switch {
	case i < c.Warmup:
		return c.LR * float64(i+1) / float64(c.Warmup)
	case i >= c.Steps:
		return c.MinLR
	}
	f := float64(i-c.Warmup) / float64(max(1, c.Steps-c.Warmup))
	return c.MinLR + 0.5*(c.LR-c.MinLR)*(1+math.Cos(math.Pi*f))
}

func (t *Trainer) attnOpts() attn.Options {
	return attn.Options{Causal: true, Workers: t.workers}
}

// refresh copies the transposed matrices the passes read from the
// current weights.
func (t *Trainer) refresh() {
	c, w := t.cfg, t.w
	transpose(t.woutT, c.Vocab, w.output(), c.Dim, c.Vocab, c.Dim)
	kvd := c.KVDim()
	for l := range w.Layers {
		L, T := &w.Layers[l], &t.wT[l]
		transpose(T.Wq, c.Dim, L.Wq, c.Dim, c.Dim, c.Dim)
		transpose(T.Wk, kvd, L.Wk, c.Dim, kvd, c.Dim)
		transpose(T.Wv, kvd, L.Wv, c.Dim, kvd, c.Dim)
		transpose(T.Wo, c.Dim, L.Wo, c.Dim, c.Dim, c.Dim)
		transpose(T.W1, c.Hidden, L.W1, c.Dim, c.Hidden, c.Dim)
		transpose(T.W3, c.Hidden, L.W3, c.Dim, c.Hidden, c.Dim)
		transpose(T.W2, c.Dim, L.W2, c.Hidden, c.Dim, c.Hidden)
	}
}

func (t *Trainer) checkSeq(seq []int) error {
	if len(seq) < 2 || len(seq) > t.tc.Context+1 {
		return fmt.Errorf("%w: a sequence of %d tokens, want 2 to Context+1 = %d", attn.ErrInput, len(seq), t.tc.Context+1)
	}
	for i, tok := range seq {
		if tok < 0 || tok >= t.cfg.Vocab {
			return fmt.Errorf("%w: token %d at %d outside the vocabulary [0, %d)", attn.ErrInput, tok, i, t.cfg.Vocab)
		}
	}
	return nil
}

// Loss returns the mean negative log-likelihood (nats per token) of each
// token of seq after the first given those before it, without changing
// anything: the validation loss of the model as it trains, with its
// training attention.
func (t *Trainer) Loss(ctx context.Context, seq []int) (float64, error) {
	if err := t.checkSeq(seq); err != nil {
		return 0, err
	}
	t.refresh()
	p := t.newPass(seq[:len(seq)-1])
	logits, err := p.forward(ctx)
	if err != nil {
		return 0, err
	}
	nll, n := crossEntropy(logits, seq[1:], t.cfg.Vocab, 1, nil)
	return nll / float64(n), nil
}

func (t *Trainer) newPass(tokens []int) *trainPass {
	n := len(tokens)
	// Always padded to the panel width: the products need it.
	ld := (n + simd.Panel - 1) / simd.Panel * simd.Panel
	return &trainPass{t: t, n: n, ld: ld, tokens: tokens}
}

// Gradient sets the trainer's gradient to that of the mean loss over the
// batch (each sequence's tokens after the first, predicted from those
// before) and returns the loss. It is Step without the update, for tests
// and tools; the gradient is read with Grad.
func (t *Trainer) Gradient(ctx context.Context, batch [][]int) (float64, error) {
	return t.GradientWeighted(ctx, batch, nil)
}

// GradientWeighted is Gradient of the weighted mean loss: weights[j][i]
// weighs the prediction of batch[j][i+1] (weights nil: every prediction
// 1), so that a task's few tokens (the answer of a retrieval question)
// can count for more than the text around them. Weights must be finite
// and non-negative, with a positive sum.
func (t *Trainer) GradientWeighted(ctx context.Context, batch [][]int, weights [][]float32) (float64, error) {
	if len(batch) == 0 {
		return 0, fmt.Errorf("%w: an empty batch", attn.ErrInput)
	}
	if weights != nil && len(weights) != len(batch) {
		return 0, fmt.Errorf("%w: %d weight rows for %d sequences", attn.ErrShape, len(weights), len(batch))
	}
	var count float64
	for j, seq := range batch {
		if err := t.checkSeq(seq); err != nil {
			return 0, err
		}
		if weights == nil {
			count += float64(len(seq) - 1)
			continue
		}
		if len(weights[j]) != len(seq)-1 {
			return 0, fmt.Errorf("%w: sequence %d has %d predictions and %d weights", attn.ErrShape, j, len(seq)-1, len(weights[j]))
		}
		for _, w := range weights[j] {
			if !(w >= 0) || math.IsInf(float64(w), 0) {
				return 0, fmt.Errorf("%w: weight %v of sequence %d, want finite and >= 0", attn.ErrInput, w, j)
			}
			count += float64(w)
		}
	}
	if !(count > 0) {
		return 0, fmt.Errorf("%w: the weights sum to %v, want > 0", attn.ErrInput, count)
	}
	for _, g := range t.gflat {
		clear(g)
	}
	clear(t.dwoutT)
	t.refresh()
	var nll float64
	for j, seq := range batch {
		p := t.newPass(seq[:len(seq)-1])
		logits, err := p.forward(ctx)
		if err != nil {
			return 0, err
		}
		var w []float32
		if weights != nil {
			w = weights[j]
		}
		l, _ := crossEntropy(logits, seq[1:], t.cfg.Vocab, float32(1/count), w)
		nll += l
		if err := p.backward(ctx, logits); err != nil {
			return 0, err
		}
	}
	// dWout += dWoutᵀ transposed (into the embedding when tied).
	c := t.cfg
	out := t.grads.output
	if c.TiedOutput {
		out = t.grads.embed
	}
	for i := range c.Vocab {
		row := out[i*c.Dim:][:c.Dim]
		for j := range row {
			row[j] += t.dwoutT[j*c.Vocab+i]
		}
	}
	return nll / count, nil
}

// Grad returns the gradient of the tensor named name (a GGUF name, see
// Weights.Tensors) after Gradient or Step, or nil.
func (t *Trainer) Grad(name string) []float32 {
	for i, ts := range t.ts {
		if ts.Name == name {
			return t.gflat[i]
		}
	}
	return nil
}

// StepStats describe one step.
type StepStats struct {
	Loss     float64 // mean loss of the batch before the update
	GradNorm float64 // global L2 norm of the gradient, before clipping
	LR       float64 // learning rate of the step
}

// Step computes the gradient of the batch's mean loss (see Gradient),
// clips it, and applies one AdamW update with the scheduled learning
// rate. A gradient that is not finite is an error and leaves the weights
// unchanged.
func (t *Trainer) Step(ctx context.Context, batch [][]int) (StepStats, error) {
	return t.StepWeighted(ctx, batch, nil)
}

// StepWeighted is Step on the weighted mean loss of GradientWeighted.
func (t *Trainer) StepWeighted(ctx context.Context, batch [][]int, weights [][]float32) (StepStats, error) {
	loss, err := t.GradientWeighted(ctx, batch, weights)
	if err != nil {
		return StepStats{}, err
	}
	var ss float64
	for _, g := range t.gflat {
		for _, x := range g {
			ss += float64(x) * float64(x)
		}
	}
	norm := math.Sqrt(ss)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return StepStats{}, fmt.Errorf("%w: step %d: the gradient is not finite (loss %g)", attn.ErrInput, t.step, loss)
	}
	st := StepStats{Loss: loss, GradNorm: norm, LR: t.LR(t.step)}
	scale := 1.0
	if t.tc.Clip > 0 && norm > t.tc.Clip {
		scale = t.tc.Clip / norm
	}
	t.step++
	c := t.tc
	bc1 := 1 - math.Pow(c.Beta1, float64(t.step))
	bc2 := 1 - math.Pow(c.Beta2, float64(t.step))
	for i, ts := range t.ts {
		decay := 0.0
		if len(ts.Shape) == 2 {
			decay = c.WeightDecay
		}
		adamW(*ts.Data, t.gflat[i], t.m[i], t.v[i], float32(scale), adamParams{
			lr: float32(st.LR), b1: float32(c.Beta1), b2: float32(c.Beta2), eps: float32(c.Eps),
			bc1: float32(bc1), bc2: float32(math.Sqrt(bc2)), decay: float32(st.LR * decay),
		})
	}
	return st, nil
}

type adamParams struct{ lr, b1, b2, eps, bc1, bc2, decay float32 }

// adamW applies one AdamW update to p given the gradient g·scale.
func adamW(p, g, m, v []float32, scale float32, a adamParams) {
	for i := range p {
		gi := g[i] * scale
		m[i] = a.b1*m[i] + (1-a.b1)*gi
		v[i] = a.b2*v[i] + (1-a.b2)*gi*gi
		mh := m[i] / a.bc1
		vh := float32(math.Sqrt(float64(v[i]))) / a.bc2
		p[i] -= a.lr*mh/(vh+a.eps) + a.decay*p[i]
	}
}

// Sample returns the training batch of step i: Batch windows of
// Context+1 tokens at positions drawn uniformly from tokens by a PCG
// generator seeded (Seed, i), so that a resumed run draws what an
// uninterrupted one would have. tokens shorter than a window give one
// window, the whole of it.
func (t *Trainer) Sample(tokens []int, i int) [][]int {
	n := t.tc.Context + 1
	if len(tokens) <= n {
		return [][]int{tokens}
	}
	rng := rand.New(rand.NewPCG(t.tc.Seed, uint64(i)))
	b := make([][]int, t.tc.Batch)
	for j := range b {
		s := rng.IntN(len(tokens) - n + 1)
		b[j] = tokens[s : s+n]
	}
	return b
}

// InitWeights returns the initial weights of a model to train: matrices
// drawn from N(0, 0.02²) as GPT-2 does, the two projections that write to
// the residual stream (Wo, W2) scaled down by 1/sqrt(2·Layers), norm gains
// 1. The same seed gives the same weights.
func InitWeights(cfg Config, seed uint64) (*Weights, error) {
	w, err := NewWeights(cfg)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	resid := 0.02 / math.Sqrt(2*float64(cfg.Layers))
	for _, t := range w.Tensors() {
		d := *t.Data
		if len(t.Shape) == 1 {
			for i := range d {
				d[i] = 1
			}
			continue
		}
		s := 0.02
		if strings.HasSuffix(t.Name, "attn_output.weight") || strings.HasSuffix(t.Name, "ffn_down.weight") {
			s = resid
		}
		for i := range d {
			d[i] = float32(s * rng.NormFloat64())
		}
	}
	return w, nil
}

// trainAttention is a layer's attention with its backward pass.
type trainAttention struct {
	attn.Mechanism
	attn.Differentiable
}

// newTrainAttention builds the attention of every layer from a
// TrainConfig.Attention spec through the registry, layer l with seed l:
// what Model builds for the trained weights with Options.Seed 0, so that
// the mechanisms that draw at random (Performer's features, say) run with
// the draws they were trained with.
func newTrainAttention(spec string, layers int) ([]trainAttention, error) {
	ps, err := ParsePatch(spec)
	if err != nil || len(ps) != 1 || ps[0].Layers != nil {
		return nil, fmt.Errorf("%w: training attention %q is not one mechanism NAME[:name=value,...] without layers", attn.ErrInput, spec)
	}
	e, err := registry.Lookup(ps[0].Mechanism)
	if err != nil {
		return nil, fmt.Errorf("%w: training attention %q: %v", attn.ErrInput, spec, err)
	}
	if !e.Causal {
		return nil, fmt.Errorf("%w: training attention %q: %s has no causal form, and a language model needs one", attn.ErrUnsupported, spec, e.Name)
	}
	out := make([]trainAttention, layers)
	for l := range out {
		m, err := registry.New(ps[0].Mechanism, ps[0].Settings, uint64(l))
		if err != nil {
			return nil, fmt.Errorf("%w: training attention %q: %v", attn.ErrInput, spec, err)
		}
		d, err := registry.Differentiable(m)
		if err != nil {
			return nil, fmt.Errorf("training attention %q: %w", spec, err)
		}
		out[l] = trainAttention{m, d}
	}
	return out, nil
}
