package linformer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Config sets up a Linformer. The zero value projects to DefaultK keys
// with Gaussian projections drawn from seed 0, for key lengths up to
// DefaultLength.
type Config struct {
	// K is the projected length k (default DefaultK).
	K int
	// Length is n, the longest key length the projections cover. With E
	// and F supplied it defaults to len(E)/K; with drawn projections to
	// DefaultLength.
	Length int
	// E and F are the key and value projections, n×k row-major
	// ([Length][K], the layout of PyTorch Linformer parameters of shape
	// (seq_len, k)): projected key p is Σ_j E[j][p]·k_j. Both nil means
	// both are drawn from Seed; one without the other is an error. New
	// copies them.
	E, F []float32
	// Seed selects the drawn projections.
	Seed uint64
}

const (
	// DefaultK is the projected length when Config.K is 0.
	DefaultK = 256
	// DefaultLength is the longest key length of drawn projections when
	// Config.Length is 0. Rows are drawn only as far as the longest
	// sequence seen, so a large limit costs nothing until used.
	DefaultLength = 1 << 16
)

// Linformer is low-rank attention with length projections. It implements
// attn.Mechanism under the name "linformer". A Linformer is safe for
// concurrent use.
type Linformer struct {
	k, kp, n int // projected length, padded to simd.Panel; longest key length
	exact    *flash.Kernel

	mu   sync.Mutex
	e, f []float32 // rows drawn or supplied so far, [rows][kp], zero past column k
	rows int
	rngE *rand.Rand // nil when supplied
	rngF *rand.Rand
}

// Stream numbers for PCG(seed, stream): E and F are independent.
const (
	streamE = 0x4c696e666f726d45 // "LinformE"
	streamF = 0x4c696e666f726d46 // "LinformF"
)

// New returns a Linformer configured by cfg.
func New(cfg Config) (*Linformer, error) {
	l := &Linformer{k: cfg.K, exact: flash.New(flash.Config{})}
	if l.k == 0 {
		l.k = DefaultK
	}
	if l.k < 0 || cfg.Length < 0 {
		return nil, fmt.Errorf("%w: linformer: k = %d, length = %d; want both >= 0", attn.ErrInput, cfg.K, cfg.Length)
	}
	l.kp = pad(l.k)
	switch {
	case cfg.E == nil && cfg.F == nil:
		l.n = cfg.Length
		if l.n == 0 {
			l.n = DefaultLength
		}
		l.rngE = rand.New(rand.NewPCG(cfg.Seed, streamE))
		l.rngF = rand.New(rand.NewPCG(cfg.Seed, streamF))
	case cfg.E == nil || cfg.F == nil:
		return nil, fmt.Errorf("%w: linformer: E and F must be supplied together", attn.ErrInput)
	default:
		if len(cfg.E) != len(cfg.F) {
			return nil, fmt.Errorf("%w: linformer: len(E) = %d, len(F) = %d differ", attn.ErrShape, len(cfg.E), len(cfg.F))
		}
		l.n = cfg.Length
		if l.n == 0 {
			l.n = len(cfg.E) / l.k
		}
		if l.n == 0 || len(cfg.E) != l.n*l.k {
			return nil, fmt.Errorf("%w: linformer: len(E) = %d, want length·k = %d·%d", attn.ErrShape, len(cfg.E), l.n, l.k)
		}
		for _, x := range cfg.E {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("%w: linformer: E holds %v", attn.ErrInput, x)
			}
		}
		for _, x := range cfg.F {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("%w: linformer: F holds %v", attn.ErrInput, x)
			}
		}
		l.e, l.f = l.padRows(cfg.E), l.padRows(cfg.F)
		l.rows = l.n
	}
	return l, nil
}

func pad(n int) int { return (n + simd.Panel - 1) / simd.Panel * simd.Panel }

// padRows copies an n×k matrix into n rows of stride kp.
func (l *Linformer) padRows(x []float32) []float32 {
	y := make([]float32, l.n*l.kp)
	for j := range l.n {
		copy(y[j*l.kp:], x[j*l.k:(j+1)*l.k])
	}
	return y
}

// Name returns "linformer".
func (*Linformer) Name() string { return "linformer" }

// K returns the projected length.
func (l *Linformer) K() int { return l.k }

// Length returns the longest key length the projections cover.
func (l *Linformer) Length() int { return l.n }

// Projections returns copies of the first m rows of E and F, each m×k
// row-major, drawing them first if need be; m must be in [0, Length].
func (l *Linformer) Projections(m int) (e, f []float32, err error) {
	if m < 0 || m > l.n {
		return nil, nil, fmt.Errorf("%w: linformer: %d projection rows of %d", attn.ErrInput, m, l.n)
	}
	pe, pf := l.projections(m)
	e, f = make([]float32, m*l.k), make([]float32, m*l.k)
	for j := range m {
		copy(e[j*l.k:(j+1)*l.k], pe[j*l.kp:])
		copy(f[j*l.k:(j+1)*l.k], pf[j*l.kp:])
	}
	return e, f, nil
}

// SetProjections replaces the first m rows of E and F with e and f, each
// m×k row-major as Projections returns them: the step by which a model
// that trains E and F (see BackwardProjections) installs its updated
// parameters. Rows past m are kept; drawn ones stay those of the seed's
// streams, so a drawn row j is the same whether or not earlier rows were
// set. m must be in [0, Length], len(e) and len(f) must be m·k and every
// entry finite; nothing changes on an error.
//
// Calls in flight keep the projections they started with: the new rows go
// into new matrices rather than over the old ones. A backward pass must use
// the E and F of its forward pass, so a model sets them between steps,
// not between a Forward and its Backward.
func (l *Linformer) SetProjections(m int, e, f []float32) error {
	if m < 0 || m > l.n {
		return fmt.Errorf("%w: linformer: %d projection rows of %d", attn.ErrInput, m, l.n)
	}
	if len(e) != m*l.k || len(f) != m*l.k {
		return fmt.Errorf("%w: linformer: len(E) = %d, len(F) = %d, want m·k = %d·%d", attn.ErrShape, len(e), len(f), m, l.k)
	}
	for _, x := range [][]float32{e, f} {
		for _, v := range x {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("%w: linformer: projection entry %v", attn.ErrInput, v)
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.draw(m)
	set := func(dst, src []float32) []float32 {
		dst = slices.Clone(dst)
		for j := range m {
			copy(dst[j*l.kp:j*l.kp+l.k], src[j*l.k:(j+1)*l.k])
		}
		return dst
	}
	l.e, l.f = set(l.e, e), set(l.f, f)
	return nil
}

// projections returns the first m rows of E and F, [m][kp], drawing rows
// up to m if need be. Rows that a caller may hold are never written over
// (later draws append, SetProjections copies), so the slices stay valid
// and unchanged for the whole of a call.
func (l *Linformer) projections(m int) (e, f []float32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.draw(m)
	return l.e[:m*l.kp], l.f[:m*l.kp]
}

// draw draws rows of E and F up to m, with l.mu held.
func (l *Linformer) draw(m int) {
	if l.rows >= m {
		return
	}
	// Row j is always the j-th row drawn from each stream, so drawing
	// lazily gives exactly the matrices of an eager draw.
	sd := 1 / math.Sqrt(float64(l.k))
	grow := func(x []float32, rng *rand.Rand) []float32 {
		x = append(x, make([]float32, (m-l.rows)*l.kp)...)
		for j := l.rows; j < m; j++ {
			for p := range l.k {
				x[j*l.kp+p] = float32(rng.NormFloat64() * sd)
			}
		}
		return x
	}
	l.e = grow(l.e, l.rngE)
	l.f = grow(l.f, l.rngF)
	l.rows = m
}

// Forward writes Linformer attention of q, k, v into out and, when lse is
// non-nil, the log-sum-exp of each row's scaled logits over the k
// projected keys into lse. Keys past a batch row's valid length are
// removed before projecting; a batch row with none gets out 0 and lse
// -Inf. Causal attention and key lengths beyond Length return errors
// wrapping attn.ErrUnsupported.
func (l *Linformer) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	if err := l.supports(s, o); err != nil {
		return err
	}
	e, f := l.projections(s.M)
	ps, kp, vp, po, err := l.projected(ctx, s, k, v, o, e, f)
	if err != nil {
		return err
	}
	return l.exact.Forward(ctx, ps, q, kp, vp, po, out, lse)
}

// supports refuses what Linformer cannot compute: causal attention and
// keys beyond the projections.
func (l *Linformer) supports(s attn.Shape, o attn.Options) error {
	if o.Causal {
		return fmt.Errorf("%w: linformer cannot be causal: every projected key mixes keys from the whole sequence, later ones included", attn.ErrUnsupported)
	}
	if s.M > l.n {
		return fmt.Errorf("%w: linformer: key length M = %d exceeds the projection length %d", attn.ErrUnsupported, s.M, l.n)
	}
	return nil
}

// projected returns the exact attention that Linformer is on shape s: its
// shape ps (k keys), the projected keys and values K' = Eᵀ·K and
// V' = Fᵀ·V over each batch row's valid keys, and its options po.
func (l *Linformer) projected(ctx context.Context, s attn.Shape, k, v []float32, o attn.Options, e, f []float32) (ps attn.Shape, kp, vp []float32, po attn.Options, err error) {
	ps = attn.Shape{B: s.B, H: s.H, HKV: s.HKV, N: s.N, M: l.k, D: s.D}
	kp = make([]float32, ps.KVLen())
	vp = make([]float32, ps.KVLen())

	pairs := s.B * s.HKV
	workers := o.WorkerCount(runtime.GOMAXPROCS(0), pairs)
	err = parallel.For(ctx, workers, pairs,
		func() *projector { return newProjector(s.D, l.kp) },
		func(pr *projector, n int) error {
			b := n / s.HKV
			end := o.KeyEnd(s, b)
			src := n * s.M * s.D
			dst := n * l.k * s.D
			pr.project(kp[dst:dst+l.k*s.D], k[src:], e, end, l.k)
			pr.project(vp[dst:dst+l.k*s.D], v[src:], f, end, l.k)
			return nil
		})
	if err != nil {
		return ps, nil, nil, po, err
	}

	po = attn.Options{Scale: o.ScaleFor(s.D), Workers: o.Workers}
	for b := range s.B {
		if o.KeyEnd(s, b) == 0 {
			// A row with no valid key has nothing to project: it sees
			// no key, so it must get out 0 and lse -Inf.
			if po.KVLen == nil {
				po.KVLen = make([]int, s.B)
				for i := range po.KVLen {
					po.KVLen[i] = l.k
				}
			}
			po.KVLen[b] = 0
		}
	}
	return ps, kp, vp, po, nil
}

// projector is one worker's scratch for computing Pᵀ·X over the valid
// rows of X, a block of keys at a time.
type projector struct {
	d, kp int
	xt    []float32 // [d][block], a block of X transposed
	acc   []float32 // [d][kp], (Pᵀ·X)ᵀ
}

const block = 256

func newProjector(d, kp int) *projector {
	return &projector{d: d, kp: kp, xt: make([]float32, d*block), acc: make([]float32, d*kp)}
}

// project writes dst[p][c] = Σ_{j<end} proj[j][p]·x[j][c] for p < k: the
// k×d projection of the first end rows of x (row stride d).
func (pr *projector) project(dst, x, proj []float32, end, k int) {
	d := pr.d
	clear(pr.acc)
	for j0 := 0; j0 < end; j0 += block {
		nb := min(block, end-j0)
		for j := range nb {
			for c, val := range x[(j0+j)*d : (j0+j+1)*d] {
				pr.xt[c*block+j] = val
			}
		}
		// (Pᵀ·X)ᵀ = Xᵀ·P: keys run along the inner dimension.
		simd.Gemm(d, pr.kp, nb, pr.xt, block, proj[j0*pr.kp:], pr.kp, pr.acc, pr.kp, true)
	}
	for p := range k {
		for c := range d {
			dst[p*d+c] = pr.acc[c*pr.kp+p]
		}
	}
}

// NewDecoder always fails: Linformer projects keys and values along the
// whole length, so every output depends on every position and there is no
// causal, incremental form.
func (l *Linformer) NewDecoder(attn.DecodeConfig) (attn.Decoder, error) {
	return nil, fmt.Errorf("%w: linformer projects K and V over the whole length, so it cannot decode causally", attn.ErrUnsupported)
}
