package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn"
)

// ErrFormat is wrapped by every error about a model file or weights that
// do not describe a usable model: missing or misshapen tensors, sizes that
// disagree, non-finite weights.
var ErrFormat = errors.New("model: malformed model")

// Config is the architecture of a llama-style decoder.
type Config struct {
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
}

// Limits on a Config, far above any model a CPU runs, to keep every size
// computation inside int.
const (
	maxWidth  = 1 << 20
	maxLayers = 1 << 12
	maxVocab  = 1 << 24
	maxParams = 1 << 36
)

// WithDefaults returns c with zero fields that have defaults filled in.
func (c Config) WithDefaults() Config {
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
		return fmt.Errorf("%w: %d parameters, more than this package allows (2^36)", ErrFormat, n)
	}
	return nil
}

// params counts the weights of a valid config (with defaults).
func (c Config) params() int {
	kv := c.KVHeads * c.HeadDim()
	perLayer := 2*c.Dim + 2*c.Dim*c.Dim + 2*kv*c.Dim + 3*c.Dim*c.Hidden
	n := c.Vocab*c.Dim + c.Layers*perLayer + c.Dim
	if !c.TiedOutput {
		n += c.Vocab * c.Dim
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
}

// Weights are a model's parameters, one plain []float32 per tensor, so
// that they can be loaded, saved, and trained in place.
type Weights struct {
	Config Config
	Embed  []float32 // [Vocab][Dim] token embedding
	Layers []Layer
	Norm   []float32 // [Dim] final RMSNorm
	Output []float32 // [Vocab][Dim] output layer; nil when Config.TiedOutput
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
// logits have a spread of about 1), and norm weights set to 1 + 0.1·N(0,1). The same seed gives the same weights.
func RandomWeights(cfg Config, seed uint64) (*Weights, error) {
	w, err := NewWeights(cfg)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	for _, t := range w.Tensors() {
		d := *t.Data
		switch {
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
	if w.Config.TiedOutput && w.Output != nil {
		return fmt.Errorf("%w: Output set although Config.TiedOutput", ErrFormat)
	}
	for _, t := range w.Tensors() {
		d := *t.Data
		if len(d) != elems(t.Shape) {
			return fmt.Errorf("%w: tensor %s has %d values, want %v = %d", ErrFormat, t.Name, len(d), t.Shape, elems(t.Shape))
		}
		for i, x := range d {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("%w: tensor %s holds %v at %d", ErrFormat, t.Name, x, i)
			}
		}
	}
	return nil
}

// Params returns the number of weights.
func (w *Weights) Params() int { return w.Config.WithDefaults().params() }

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
