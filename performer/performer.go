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
// to exact attention below DefaultMin keys (DefaultMinCausal under the
// causal mask).
type Config struct {
	// Features is the number of random features m (default
	// DefaultFeatures). Trig needs an even number.
	Features int
	// Kind selects positive (FAVOR+, DefaultKind) or trigonometric
	// features.
	Kind Kind
	// Min is the key length M below which Forward computes exact attention
	// instead (0: DefaultMin, DefaultMinCausal under the causal mask; an
	// explicit Min applies to both). A negative Min never falls back; the
	// command line's min=0 maps to it.
	Min int
	// Seed selects the random projection (default 0).
	Seed uint64
	// Chunk is the chunk length of the causal pass (default DefaultChunk).
	Chunk int
}

const (
	// DefaultFeatures is the number of random features when
	// Config.Features is 0.
	DefaultFeatures = 256
	// DefaultKind is the zero Config.Kind: FAVOR+'s positive features.
	DefaultKind = Positive
	// DefaultMin is the fallback length when Config.Min is 0 and there is
	// no causal mask: below it exact attention is faster than 256
	// features, and always more accurate (BenchmarkForward measures the
	// crossing).
	DefaultMin = 2048
	// DefaultMinCausal is the fallback length when Config.Min is 0 under
	// the causal mask: exact causal attention does half the work, so it
	// stays faster up to twice the length.
	DefaultMinCausal = 2 * DefaultMin
	// DefaultChunk is the chunk length of the causal pass when
	// Config.Chunk is 0.
	DefaultChunk = linear.DefaultChunk
)

var (
	_ attn.Mechanism      = (*Performer)(nil)
	_ attn.Fallbacker     = (*Performer)(nil)
	_ attn.Decodable      = (*Performer)(nil)
	_ attn.Differentiable = (*Performer)(nil)

	_ linear.DifferentiableMap = (*FeatureMap)(nil)
)

// Performer is FAVOR+ attention. It implements attn.Mechanism under the
// name "performer". A Performer is safe for concurrent use.
type Performer struct {
	fm    *FeatureMap
	lin   *linear.Attention
	flash *flash.Kernel
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
		flash: flash.New(flash.Config{}),
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
// threshold is DefaultMinCausal (MinFor).
func (p *Performer) Min() int { return p.min }

// MinFor returns the key length below which Forward computes exact
// attention, for calls with the causal mask or without; 0 or less means
// never.
func (p *Performer) MinFor(causal bool) int {
	if p.auto && causal {
		return DefaultMinCausal
	}
	return p.min
}

// exact reports whether Forward computes a call exactly: the one rule
// behind Forward and Fallback.
func (p *Performer) exact(s attn.Shape, o attn.Options) (limit int, ok bool) {
	limit = p.MinFor(o.Causal)
	return limit, s.M < limit
}

// Fallback implements attn.Fallbacker: it returns why Forward computes a
// call of shape s under o exactly (its key length is below MinFor), or ""
// when it runs the random features.
func (p *Performer) Fallback(s attn.Shape, o attn.Options) string {
	limit, ok := p.exact(s, o)
	if !ok {
		return ""
	}
	mask := ""
	if o.Causal {
		mask = " (causal)"
	}
	return fmt.Sprintf("M = %d < min = %d%s: ran exact attention", s.M, limit, mask)
}

// Forward writes the FAVOR+ estimate of softmax attention into out and,
// when lse is non-nil, the log of the estimated normaliser
// Σ_j exp(scale·q_i·k_j) into lse. When s.M < MinFor(o.Causal) it
// computes exact attention instead (Fallback says so). A row that sees no
// key gets out 0 and lse -Inf. With positive features a row whose
// estimated normaliser underflows float32 is computed exactly; with
// trigonometric features a row whose estimate is not positive gets out 0
// and lse -Inf. A row whose query, or a key or value it sees, holds a NaN
// or an infinity is NaN, as in package linear. The result does not depend
// on o.Workers.
func (p *Performer) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	if _, ok := p.exact(s, o); ok {
		return p.flash.Forward(ctx, s, q, k, v, o, out, lse)
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

// Backward computes the gradients of the loss with respect to q, k and v
// for the forward pass Forward made, given its out and lse and dout, the
// gradient with respect to out (see linear.Attention.Backward for the
// layouts). When s.M < MinFor(o.Causal) Forward computed exact attention,
// and Backward is exact attention's backward pass (package flash). Else it
// is the gradient of the random-feature estimate: through the features
// exp(w·x' − |x'|²/2)/sqrt(m) (or the trigonometric ones), the projection W
// being fixed by the seed and getting no gradient, with the stabilisers
// of Forward, which cancel between the estimate's numerator and its
// normaliser (linear.Attention.Backward). The rows Forward computed
// exactly because their positive-feature normaliser underflowed get the
// exact gradient of their softmax row, so every row's gradient is that of
// the function that produced its out.
//
// Errors are those of linear.Attention.Backward: bad shapes wrap
// attn.ErrShape or attn.ErrInput, a cancelled ctx returns its error. The
// result does not depend on o.Workers.
func (p *Performer) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return err
	}
	if _, ok := p.exact(s, o); ok {
		return p.flash.Backward(ctx, s, q, k, v, out, lse, dout, o, nil, dq, dk, dv)
	}
	rows, err := p.lin.BackwardSkipped(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv)
	if err != nil || p.fm.kind != Positive {
		// Forward repairs no trigonometric row: one that
		// BackwardSkipped lists did not come from Forward.
		return err
	}
	exactGrad(s, q, k, v, out, lse, dout, o, rows, dq, dk, dv)
	return nil
}

// exactGrad adds the gradients of the listed rows as exact softmax rows
// over the keys each sees (repairUnderflow computed them so): with P the
// row's probabilities from its lse, dS_j = P_j·(dO·v_j − dO·out), and
// dq = scale·Σ_j dS_j k_j (the row's dq, 0 until now), dk_j += scale·dS_j q,
// dv_j += P_j dO. The rows go in order, one after the other, so the sums
// do not depend on the worker count.
func exactGrad(s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, rows []int, dq, dk, dv []float32) {
	if len(rows) == 0 {
		return
	}
	scale := o.ScaleFor(s.D)
	d := s.D
	for _, row := range rows {
		b, h, i := row/(s.H*s.N), row/s.N%s.H, row%s.N
		end := o.VisibleKeys(s, b, i)
		kv := (b*s.HKV + h/s.Group()) * s.M * d
		qi, gi := q[row*d:][:d], dout[row*d:][:d]
		dqi := dq[row*d:][:d]
		clear(dqi)
		delta := simd.Dot(gi, out[row*d:][:d])
		for j := range end {
			kj, vj := k[kv+j*d:][:d], v[kv+j*d:][:d]
			// The logit rounded to float32 before the subtraction, as
			// repairUnderflow stored it: a compiler that fuses x*y-z (on
			// arm64, ppc64le, riscv64, s390x) would skip that rounding,
			// whose ulp at the logits of these rows (near -1600) moves P
			// by 1e-4 and dq, a sum that cancels, by 1e-3.
			pj := float32(math.Exp(float64(float32(scale*simd.Dot(qi, kj)) - lse[row])))
			ds := pj * (simd.Dot(gi, vj) - delta) * scale
			simd.Axpy(ds, kj, dqi)
			simd.Axpy(ds, qi, dk[kv+j*d:][:d])
			simd.Axpy(pj, gi, dv[kv+j*d:][:d])
		}
	}
}

// NewState returns a recurrent decoding state with the same features, for
// b batch rows, h query heads, hkv key/value heads of size d and logit
// scale scale (0: 1/sqrt(d)). Decoding never falls back to exact
// attention. A state past linear.MaxStateBytes is an error wrapping
// attn.ErrShape, before anything is allocated.
func (p *Performer) NewState(b, h, hkv, d int, scale float32) (*linear.State, error) {
	return p.lin.NewState(b, h, hkv, d, scale)
}

// NewDecoder returns a decoder (a linear.Decoder) running the same random
// features over a recurrent state of m·(D+1) numbers per sequence and kv
// head, O(m·D) per token and head whatever the length; see
// linear.Attention.NewDecoder for cfg. It always uses the random features:
// unlike Forward it never falls back to exact attention for short
// sequences (it would need the keys the state does not keep), so its
// outputs equal those of Forward with a negative Config.Min, up to float32
// rounding. Nor are rows whose positive-feature normaliser underflows
// recomputed exactly: they get out 0 and lse -Inf.
func (p *Performer) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	return p.lin.NewDecoder(cfg)
}
