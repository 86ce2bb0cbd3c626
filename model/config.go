package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"

	"github.com/attnkit/attn"
)

// ErrFormat is wrapped by every error about a model file or weights that
// do not describe a usable model: missing or misshapen tensors, sizes that
// disagree, non-finite weights.
var ErrFormat = errors.New("model: malformed model")

// Config is the architecture of a llama-style decoder: one of the GGUF
// architectures llama (Llama 1 to 3, TinyLlama, SmolLM), mistral and qwen2,
// which differ only in the switches below.
type Config struct {
	// Arch is the GGUF architecture: "" (what ReadGGUF returns) or
	// "llama", "mistral" or "qwen2". It names the metadata keys of the
	// file and fixes the rotary style and the biases the architecture
	// has.
	Arch    string
	Dim     int // width of the residual stream
	Hidden  int // width of the SwiGLU MLP
	Layers  int // decoder blocks
	Heads   int // query heads; Dim must be a multiple of it
	KVHeads int // key/value heads; 0 means Heads (no grouping)
	Vocab   int // pieces of the vocabulary
	// SeqLen is the context length the model was trained for; 0 means
	// unknown. Nothing stops longer inputs; generation stops there.
	SeqLen int
	// RopeBase is the base of the rotary embedding's frequencies; 0 means
	// 10000.
	RopeBase float32
	// NormEps is RMSNorm's epsilon; 0 means 1e-5.
	NormEps float32
	// TiedOutput says that the output layer is the token embedding.
	TiedOutput bool
	// Attention is the attention the model was trained with, as a patch
	// spec without layers ("linear", "window:left=256"); "" or "exact"
	// is softmax attention. Models run every layer with it unless a
	// patch says otherwise. GGUF files carry it as attn.attention.
	Attention string
	// RopeNeoX turns the rotary embedding's pairs (i, i+HeadDim/2), the
	// halves of each head, instead of the interleaved (2i, 2i+1): GPT-NeoX
	// style, which qwen2 uses (WithDefaults sets it there) and llama and
	// mistral do not, their GGUF weights being permuted for the
	// interleaved style.
	RopeNeoX bool
	// RopeScale is linear rope scaling (position interpolation): positions
	// are divided by it before the rotary embedding, as ggml's freq_scale
	// = 1/RopeScale; 0 means none. Per-frequency factors (Llama 3.1's
	// rope_freqs) are Weights.RopeFreqs.
	RopeScale float32
	// QKVBias says that the query, key and value projections add a bias
	// (Layer.Bq, Bk, Bv): qwen2 always (WithDefaults sets it there), llama
	// when its file has them.
	QKVBias bool
	// SlidingWindow, when positive, limits every query to itself and the
	// SlidingWindow-1 positions before it, as Mistral's sliding-window
	// attention does; the layers then run the window mechanism
	// (window:left=SlidingWindow-1) as their own attention.
	SlidingWindow int
}

// Archs are the GGUF architectures this package runs.
var Archs = []string{"llama", "mistral", "qwen2"}

// arch is the architecture's GGUF name.
func (c Config) arch() string {
	if c.Arch == "" {
		return "llama"
	}
	return c.Arch
}

// ropeScale is RopeScale with 0 as 1.
func (c Config) ropeScale() float32 {
	if c.RopeScale == 0 {
		return 1
	}
	return c.RopeScale
}

// ownAttention is the attention every layer runs unless a patch says
// otherwise, as a patch spec: Attention, or the sliding window.
func (c Config) ownAttention() string {
	if c.SlidingWindow > 0 {
		return fmt.Sprintf("window:left=%d", c.SlidingWindow-1)
	}
	return c.Attention
}

// Limits on a Config, far above any model a CPU runs, to keep every size
// computation inside int.
const (
	maxWidth  = 1 << 20
	maxLayers = 1 << 12
	maxVocab  = 1 << 24
	maxParams = min(1<<36, math.MaxInt>>2) // 2^29 where int has 32 bits
	maxWindow = 1 << 30
)

// WithDefaults returns c with zero fields that have defaults filled in.
func (c Config) WithDefaults() Config {
	if c.Arch == "qwen2" {
		c.RopeNeoX, c.QKVBias = true, true
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.RopeBase == 0 {
		c.RopeBase = 10000
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-5
	}
	return c
}

// HeadDim is Dim/Heads, the size of one attention head (0 when Heads is
// not positive).
func (c Config) HeadDim() int {
	if c.Heads <= 0 {
		return 0
	}
	return c.Dim / c.Heads
}

// KVDim is the width of the keys (and values) of one position: KVHeads·HeadDim.
func (c Config) KVDim() int { return c.WithDefaults().KVHeads * c.HeadDim() }

// Validate reports whether c describes a model this package runs.
func (c Config) Validate() error {
	c = c.WithDefaults()
	for _, f := range []struct {
		name   string
		v, max int
	}{{"Dim", c.Dim, maxWidth}, {"Hidden", c.Hidden, maxWidth}, {"Layers", c.Layers, maxLayers},
		{"Heads", c.Heads, maxWidth}, {"KVHeads", c.KVHeads, maxWidth}, {"Vocab", c.Vocab, maxVocab}} {
		if f.v <= 0 || f.v > f.max {
			return fmt.Errorf("%w: %s = %d, want 1 to %d", ErrFormat, f.name, f.v, f.max)
		}
	}
	if !slices.Contains(Archs, c.arch()) {
		return fmt.Errorf("%w: architecture %q (this package runs %s)", attn.ErrUnsupported, c.Arch, strings.Join(Archs, ", "))
	}
	switch {
	case c.RopeNeoX && c.Arch != "qwen2":
		return fmt.Errorf("%w: NeoX-style rotary embedding in architecture %s, whose rotary style is interleaved", ErrFormat, c.arch())
	case !(c.RopeScale >= 0) || math.IsInf(float64(c.RopeScale), 0):
		return fmt.Errorf("%w: RopeScale = %v, want 0 (none) or a finite value > 0", ErrFormat, c.RopeScale)
	case c.SlidingWindow < 0 || c.SlidingWindow > maxWindow:
		return fmt.Errorf("%w: SlidingWindow = %d, want 0 to %d", ErrFormat, c.SlidingWindow, maxWindow)
	case c.SlidingWindow > 0 && c.Attention != "" && c.Attention != "exact":
		return fmt.Errorf("%w: a sliding window of %d and the attention %q: one rule per layer", ErrFormat, c.SlidingWindow, c.Attention)
	}
	switch {
	case c.SeqLen < 0:
		return fmt.Errorf("%w: SeqLen = %d, want >= 0", ErrFormat, c.SeqLen)
	case c.Dim%c.Heads != 0:
		return fmt.Errorf("%w: Dim = %d is not a multiple of Heads = %d", ErrFormat, c.Dim, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("%w: Heads = %d is not a multiple of KVHeads = %d", ErrFormat, c.Heads, c.KVHeads)
	case c.HeadDim()%2 != 0:
		return fmt.Errorf("%w: head size %d is odd; the rotary embedding turns pairs", ErrFormat, c.HeadDim())
	case !(c.RopeBase > 1) || math.IsInf(float64(c.RopeBase), 0):
		return fmt.Errorf("%w: RopeBase = %v, want a finite value > 1", ErrFormat, c.RopeBase)
	case !(c.NormEps > 0) || math.IsInf(float64(c.NormEps), 0):
		return fmt.Errorf("%w: NormEps = %v, want a finite value > 0", ErrFormat, c.NormEps)
	}
	if n := c.params(); n > maxParams {
		return fmt.Errorf("%w: %d parameters, more than this package allows (%d)", ErrFormat, n, maxParams)
	}
	return nil
}

// params counts the weights of a valid config (with defaults).
func (c Config) params() int64 {
	// In int64, so that the bounds are checked where int has 32 bits too.
	dim, kv := int64(c.Dim), int64(c.KVHeads)*int64(c.HeadDim())
	perLayer := 2*dim + 2*dim*dim + 2*kv*dim + 3*dim*int64(c.Hidden)
	if c.QKVBias {
		perLayer += dim + 2*kv
	}
	n := int64(c.Vocab)*dim + int64(c.Layers)*perLayer + dim
	if !c.TiedOutput {
		n += int64(c.Vocab) * dim
	}
	return n
}

// Layer holds the weights of one decoder block. Matrices are row-major
// [out][in], as PyTorch's Linear stores them: y = W·x.
type Layer struct {
	AttnNorm []float32 // [Dim] RMSNorm before attention
	Wq       []float32 // [Dim][Dim] queries
	Wk       []float32 // [KVDim][Dim] keys
	Wv       []float32 // [KVDim][Dim] values
	Wo       []float32 // [Dim][Dim] attention output
	MLPNorm  []float32 // [Dim] RMSNorm before the MLP
	W1       []float32 // [Hidden][Dim] gate (silu)
	W2       []float32 // [Dim][Hidden] down
	W3       []float32 // [Hidden][Dim] up
	// Biases of the projections, when Config.QKVBias (nil otherwise).
	Bq []float32 // [Dim]
	Bk []float32 // [KVDim]
	Bv []float32 // [KVDim]
}

// Weights are a model's parameters, one plain []float32 per tensor, so
// that they can be loaded, saved, and trained in place.
type Weights struct {
	Config Config
	Embed  []float32 // [Vocab][Dim] token embedding
	Layers []Layer
	Norm   []float32 // [Dim] final RMSNorm
	Output []float32 // [Vocab][Dim] output layer; nil when Config.TiedOutput
	// RopeFreqs, when not nil, are per-frequency divisors of the rotary
	// embedding, [HeadDim/2]: frequency i turns by pos·base^(-2i/HeadDim)
	// / RopeFreqs[i] (then / Config.RopeScale), as ggml applies the
	// rope_freqs.weight tensor of Llama 3.1 and later. They are fixed,
	// not trained, so Tensors does not list them.
	RopeFreqs []float32
}

// Tensor names one tensor of a model with its shape, outermost first.
type Tensor struct {
	Name  string // the GGUF name: token_embd.weight, blk.0.attn_q.weight, …
	Shape []int  // [rows, cols] for matrices, [n] for norms
	Data  *[]float32
}

// Tensors lists every tensor of w, in file order, with its GGUF name and
// shape; Data points at the field, so that loaders can fill it.
func (w *Weights) Tensors() []Tensor {
	c := w.Config.WithDefaults()
	kv := c.KVHeads * c.HeadDim()
	ts := []Tensor{{"token_embd.weight", []int{c.Vocab, c.Dim}, &w.Embed}}
	for l := range w.Layers {
		L := &w.Layers[l]
		p := fmt.Sprintf("blk.%d.", l)
		ts = append(ts,
			Tensor{p + "attn_norm.weight", []int{c.Dim}, &L.AttnNorm},
			Tensor{p + "attn_q.weight", []int{c.Dim, c.Dim}, &L.Wq},
			Tensor{p + "attn_k.weight", []int{kv, c.Dim}, &L.Wk},
			Tensor{p + "attn_v.weight", []int{kv, c.Dim}, &L.Wv},
		)
		if c.QKVBias {
			ts = append(ts,
				Tensor{p + "attn_q.bias", []int{c.Dim}, &L.Bq},
				Tensor{p + "attn_k.bias", []int{kv}, &L.Bk},
				Tensor{p + "attn_v.bias", []int{kv}, &L.Bv},
			)
		}
		ts = append(ts,
			Tensor{p + "attn_output.weight", []int{c.Dim, c.Dim}, &L.Wo},
			Tensor{p + "ffn_norm.weight", []int{c.Dim}, &L.MLPNorm},
			Tensor{p + "ffn_gate.weight", []int{c.Hidden, c.Dim}, &L.W1},
			Tensor{p + "ffn_down.weight", []int{c.Dim, c.Hidden}, &L.W2},
			Tensor{p + "ffn_up.weight", []int{c.Hidden, c.Dim}, &L.W3},
		)
	}
	ts = append(ts, Tensor{"output_norm.weight", []int{c.Dim}, &w.Norm})
	if !c.TiedOutput {
		ts = append(ts, Tensor{"output.weight", []int{c.Vocab, c.Dim}, &w.Output})
	}
	return ts
}

func elems(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// NewWeights returns zero weights of the architecture cfg.
func NewWeights(cfg Config) (*Weights, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Weights{Config: cfg, Layers: make([]Layer, cfg.Layers)}
	for _, t := range w.Tensors() {
		*t.Data = make([]float32, elems(t.Shape))
	}
	return w, nil
}

// RandomWeights returns weights of the architecture cfg drawn from seed,
// for tests and benchmarks: a PCG generator seeded (seed, 0) fills the
// tensors in the order of Tensors with NormFloat64 draws, each matrix
// scaled by 1/sqrt(its columns) (Dim for the embedding, so that tied
// logits have a spread of about 1), norm weights set to 1 + 0.1·N(0,1)
// and biases to 0.1·N(0,1). The same seed gives the same weights.
func RandomWeights(cfg Config, seed uint64) (*Weights, error) {
	w, err := NewWeights(cfg)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	for _, t := range w.Tensors() {
		d := *t.Data
		switch {
		case strings.HasSuffix(t.Name, ".bias"):
			for i := range d {
				d[i] = float32(0.1 * rng.NormFloat64())
			}
		case len(t.Shape) == 1:
			for i := range d {
				d[i] = float32(1 + 0.1*rng.NormFloat64())
			}
		default:
			s := 1 / math.Sqrt(float64(t.Shape[1]))
			for i := range d {
				d[i] = float32(s * rng.NormFloat64())
			}
		}
	}
	return w, nil
}

// Validate checks the config, that every tensor has the length its shape
// needs and that every weight is finite.
func (w *Weights) Validate() error {
	if err := w.Config.Validate(); err != nil {
		return err
	}
	if len(w.Layers) != w.Config.Layers {
		return fmt.Errorf("%w: %d layers of weights for Config.Layers = %d", ErrFormat, len(w.Layers), w.Config.Layers)
	}
	c := w.Config.WithDefaults()
	if c.TiedOutput && w.Output != nil {
		return fmt.Errorf("%w: Output set although Config.TiedOutput", ErrFormat)
	}
	if f := w.RopeFreqs; f != nil {
		if len(f) != c.HeadDim()/2 {
			return fmt.Errorf("%w: %d rope frequency factors for a head size of %d, want %d", ErrFormat, len(f), c.HeadDim(), c.HeadDim()/2)
		}
		for i, x := range f {
			if !(x > 0) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("%w: rope frequency factor %d is %v, want a finite value > 0", ErrFormat, i, x)
			}
		}
	}
	for l, L := range w.Layers {
		if !c.QKVBias && (L.Bq != nil || L.Bk != nil || L.Bv != nil) {
			return fmt.Errorf("%w: layer %d has projection biases although not Config.QKVBias", ErrFormat, l)
		}
	}
	for _, t := range w.Tensors() {
		d := *t.Data
		if len(d) != elems(t.Shape) {
			return fmt.Errorf("%w: tensor %s has %d values, want %v = %d", ErrFormat, t.Name, len(d), t.Shape, elems(t.Shape))
		}
		if i := nonFinite(d); i >= 0 {
			return fmt.Errorf("%w: tensor %s holds %v at %d", ErrFormat, t.Name, d[i], i)
		}
	}
	return nil
}

// plainLlama returns nil when w is the architecture the backward pass
// (grad.go) differentiates: interleaved rotary embedding without scaling
// or frequency factors, no projection biases, no sliding window. Anything
// else wraps attn.ErrUnsupported and names the first feature it lacks, so
// that a trainer can refuse weights it would train wrongly.
func (w *Weights) plainLlama() error {
	c := w.Config.WithDefaults()
	var what string
	switch {
	case c.RopeNeoX:
		what = "NeoX-style rotary embedding"
	case c.ropeScale() != 1:
		what = fmt.Sprintf("rope scaling by %v", c.RopeScale)
	case w.RopeFreqs != nil:
		what = "rope frequency factors"
	case c.QKVBias:
		what = "projection biases"
	case c.SlidingWindow > 0:
		what = "a sliding window"
	default:
		return nil
	}
	return fmt.Errorf("%w: training a %s model with %s", attn.ErrUnsupported, c.arch(), what)
}

// nonFinite returns the index of the first NaN or infinity in d, or -1.
// It tests the exponent bits (all set only for NaN and ±Inf), a fraction
// of what float64 comparisons cost on the hundreds of millions of weights
// of a published model.
func nonFinite(d []float32) int {
	// A large tensor is scanned on every CPU, a stretch each; the first
	// stretch with a bad value gives the index, whatever the count.
	const stretch = 1 << 20
	parts := (len(d) + stretch - 1) / stretch
	if parts <= 1 {
		return nonFiniteIn(d)
	}
	found := make([]int, parts)
	_ = parallel(context.Background(), runtime.GOMAXPROCS(0), parts, func(p int) {
		lo := p * stretch
		found[p] = nonFiniteIn(d[lo:min(lo+stretch, len(d))])
		if found[p] >= 0 {
			found[p] += lo
		}
	})
	for _, i := range found {
		if i >= 0 {
			return i
		}
	}
	return -1
}

func nonFiniteIn(d []float32) int {
	const exp = 0x7f800000
	for i, x := range d {
		if math.Float32bits(x)&exp == exp {
			return i
		}
	}
	return -1
}

// Params returns the number of weights.
func (w *Weights) Params() int { return int(w.Config.WithDefaults().params()) }

// output returns the output layer's matrix.
func (w *Weights) output() []float32 {
	if w.Config.TiedOutput {
		return w.Embed
	}
	return w.Output
}

// errShape is the error for a tensor argument of the wrong length.
func errShape(what string, got, want int) error {
	return fmt.Errorf("%w: len(%s) = %d, want %d", attn.ErrShape, what, got, want)
}
