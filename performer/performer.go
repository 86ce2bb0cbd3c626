package performer

import (
	"context"
	"fmt"
	"math"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/linear"
)

// Config sets up a Performer. The zero value is FAVOR+ with
// DefaultFeatures positive orthogonal features from seed 0, falling back
// to exact attention below DefaultMin keys.
type Config struct {
	// Features is the number of random features m (default
	// DefaultFeatures). Trig needs an even number.
	Features int
	// Kind selects positive (FAVOR+, the default) or trigonometric
	// features.
	Kind Kind
	// Min is the key length M below which Forward computes exact attention
	// instead (default DefaultMin). A negative Min never falls back; the
	// command line's min=0 maps to it.
	Min int
	// Seed selects the random projection.
	Seed uint64
	// Chunk is the chunk length of the causal pass (default
	// linear.DefaultChunk).
	Chunk int
}

const (
	// DefaultFeatures is the number of random features when
	// Config.Features is 0.
	DefaultFeatures = 256
	// DefaultMin is the fallback length when Config.Min is 0 and there is
	// no causal mask; with one it is doubled, since exact causal attention
	// does half the work. Measured with the current exact kernel (attn
	// bench, B=1, H=8, D=64): 256 features are 2.2× faster than exact at
	// 2048 keys without the mask, but 0.75× at 2048 and 2.2× at 4096 with
	// it.
	DefaultMin = 2048
)

// Performer is FAVOR+ attention. It implements attn.Mechanism under the
// name "performer". A Performer is safe for concurrent use.
type Performer struct {
	fm    *FeatureMap
	lin   *linear.Attention
	exact *flash.Kernel
	min   int  // fallback length without the causal mask
	auto  bool // min is the default, doubled under the causal mask
}

// New returns a Performer configured by cfg.
func New(cfg Config) (*Performer, error) {
	m := cfg.Features
	if m == 0 {
		m = DefaultFeatures
	}
	fm, err := NewFeatureMap(cfg.Kind, m, cfg.Seed)
	if err != nil {
		return nil, err
	}
	if cfg.Chunk < 0 {
		return nil, fmt.Errorf("performer: chunk = %d, want >= 0", cfg.Chunk)
	}
	p := &Performer{
		fm:    fm,
		lin:   linear.New(linear.Config{Map: fm, Chunk: cfg.Chunk}),
		exact: flash.New(flash.Config{}),
		min:   cfg.Min,
	}
	if p.min == 0 {
		p.min, p.auto = DefaultMin, true
	}
	return p, nil
}

// Name returns "performer".
func (*Performer) Name() string { return "performer" }

// Features returns the feature map.
func (p *Performer) Features() *FeatureMap { return p.fm }

// Min returns the key length below which Forward is exact without the
// causal mask; 0 or less means never. With the default, the causal
// threshold is twice it.
func (p *Performer) Min() int { return p.min }

// minFor returns the fallback length in effect for a call.
func (p *Performer) minFor(causal bool) int {
	if p.auto && causal {
		return 2 * p.min
	}
	return p.min
}

// Forward writes the FAVOR+ estimate of softmax attention into out and,
// when lse is non-nil, the log of the estimated normaliser
// Σ_j exp(scale·q_i·k_j) into lse. When s.M < Min (twice the default
// Min under the causal mask) it computes exact attention instead. A row that sees no key gets out 0 and lse -Inf. With
// positive features a row whose estimated normaliser underflows float32
// is computed exactly; with trigonometric features a row whose estimate is
// not positive gets out 0 and lse -Inf.
func (p *Performer) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	if s.M < p.minFor(o.Causal) {
		return p.exact.Forward(ctx, s, q, k, v, o, out, lse)
	}
	l := lse
	if l == nil && p.fm.kind == Positive {
		l = make([]float32, s.LSELen())
	}
	if err := p.lin.Forward(ctx, s, q, k, v, o, out, l); err != nil {
		return err
	}
	if p.fm.kind == Positive {
		repairUnderflow(s, q, k, v, o, out, l)
	}
	return nil
}

// repairUnderflow computes exactly the rows whose positive-feature
// normaliser underflowed to 0: the only way a row that sees keys gets lse
// -Inf from positive features. It happens only far beyond unit scale
// (|x·scale^(1/2)|² in the hundreds), where the estimator's variance is
// astronomical anyway; the exact row uses only the keys the row sees, so
// causal outputs still never depend on later tokens.
func repairUnderflow(s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) {
	var logits []float32
	scale := o.ScaleFor(s.D)
	d := s.D
	for row, l := range lse {
		if !math.IsInf(float64(l), -1) {
			continue
		}
		b, h, i := row/(s.H*s.N), row/s.N%s.H, row%s.N
		end := o.VisibleKeys(s, b, i)
		if end == 0 {
			continue
		}
		if logits == nil {
			logits = make([]float32, s.M)
		}
		kvh := h / s.Group()
		kBase := k[(b*s.HKV+kvh)*s.M*d:]
		vBase := v[(b*s.HKV+kvh)*s.M*d:]
		qi := q[row*d : (row+1)*d]
		lg := logits[:end]
		for j := range lg {
			lg[j] = scale * simd.Dot(qi, kBase[j*d:(j+1)*d])
		}
		mx := simd.Max(lg)
		sum := simd.ExpSum(lg, mx)
		o := out[row*d : (row+1)*d]
		clear(o)
		for j, p := range lg {
			simd.Axpy(p/sum, vBase[j*d:(j+1)*d], o)
		}
		lse[row] = mx + float32(math.Log(float64(sum)))
	}
}

// NewState returns a recurrent decoding state with the same features, for
// b batch rows, h query heads, hkv key/value heads of size d and logit
// scale scale (0: 1/sqrt(d)). Decoding never falls back to exact
// attention.
func (p *Performer) NewState(b, h, hkv, d int, scale float32) (*linear.State, error) {
	return p.lin.NewState(b, h, hkv, d, scale)
}
