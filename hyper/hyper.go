package hyper

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// Defaults of Config, those of the authors' code (DefaultBlockRows aside,
// which is this package's tiling). The zero Sampling is Uniform and the
// zero Seed is seed 0.
const (
	DefaultProjs   = 7
	DefaultBlock   = 256
	DefaultSamples = 256
	DefaultMin     = 4096
	// DefaultBlockRows is the query tile of the exact calls on gathered
	// blocks when Flash.BlockRows is zero: one default block, so that one
	// tile holds a whole block's queries and packs each key tile once.
	DefaultBlockRows = 256
)

// Sampling selects how the columns outside a query's block are sampled.
type Sampling int

const (
	// Uniform draws the columns uniformly without replacement and
	// weights those a block keeps by (keys outside the block)/(samples
	// kept). The default; the authors' code draws with replacement.
	Uniform Sampling = iota
	// ValueNorm is the paper's approximate matrix product: the normaliser
	// is still estimated from the uniform samples, but the product with V
	// from a second set of Samples columns drawn with replacement with
	// probability proportional to the squared norm of their value row,
	// each weighted by the inverse of its probability. Numerator and
	// normaliser then come from independent samples, so the output is no
	// longer an average of value rows: where a large entry escapes the
	// blocks and only one of the two samples catches it, the error can
	// exceed that of Uniform by far, and the ratio can pass any float. The
	// estimate of the rest is therefore clipped, coordinate by coordinate,
	// to the range of the values of the problem's keys: the exact average
	// lies in that range, so the clip only ever moves the estimate towards
	// it. It costs a third exact call per block.
	ValueNorm
)

func (s Sampling) String() string {
	switch s {
	case Uniform:
		return "uniform"
	case ValueNorm:
		return "vnorm"
	}
	return fmt.Sprintf("Sampling(%d)", int(s))
}

// Config holds the parameters of HyperAttention. The zero value is the
// authors' configuration: 7 projections, blocks of 256, 256 samples, exact
// attention below 4096 tokens, uniform sampling, seed 0.
type Config struct {
	// Projs is the number r of random hyperplanes of the sortLSH, 1 to
	// MaxProjs (default 7): 2^r buckets. The projections are shared by
	// all batch rows and heads.
	Projs int
	// Block is the number of keys per block of the block-diagonal part
	// (default 256). A problem with n keys sorted by bucket is cut into
	// ceil(n/Block) blocks of as equal sizes as possible, and each query
	// attends to the block where its bucket falls. A negative Block drops
	// the block-diagonal part: every key is then estimated from the
	// samples.
	Block int
	// Samples is the number of key columns sampled per problem (default
	// 256), uniformly and without replacement; each query uses those
	// outside its own key block, weighted by how many keys they stand for.
	// With Samples at least the number of keys, every key is taken and the
	// result is exact. A negative Samples drops the sampled part.
	Samples int
	// Min is the length below which attention is exact (default 4096): a
	// call, or a sub-problem of the causal recursion, with fewer than Min
	// queries or fewer than Min keys is computed by the exact kernel. A
	// negative Min never falls back.
	Min int
	// Sampling selects uniform (default) or value-norm sampling.
	Sampling Sampling
	// Seed determines every random draw: the projections and the samples.
	// The same seed gives the same output for the same inputs, whatever
	// the number of workers.
	Seed uint64
	// Flash sets the tiles of the exact kernel. A zero BlockRows means
	// flash's default for the whole-tensor calls (the fallback and the
	// causal leaves) and DefaultBlockRows for the calls on gathered
	// blocks.
	Flash flash.Config
}

// Attention is HyperAttention. It implements attn.Mechanism under the name
// "hyper" and is safe for concurrent use.
type Attention struct {
	projs, block, samples, min int
	sampling                   Sampling
	seed                       uint64
	flash                      flash.Config
	kn                         *flash.Kernel // whole tensors
	bk                         *flash.Kernel // gathered blocks
}

// New returns HyperAttention with the parameters of cfg, or an error
// wrapping attn.ErrInput if one is out of range.
func New(cfg Config) (*Attention, error) {
	a := &Attention{
		projs: cfg.Projs, block: cfg.Block, samples: cfg.Samples, min: cfg.Min,
		sampling: cfg.Sampling, seed: cfg.Seed, flash: cfg.Flash, kn: flash.New(cfg.Flash),
	}
	bc := cfg.Flash
	if bc.BlockRows == 0 {
		bc.BlockRows = DefaultBlockRows
	}
	a.bk = flash.New(bc)
	if a.projs == 0 {
		a.projs = DefaultProjs
	}
	if a.block == 0 {
		a.block = DefaultBlock
	}
	if a.samples == 0 {
		a.samples = DefaultSamples
	}
	if a.min == 0 {
		a.min = DefaultMin
	}
	switch {
	case a.projs < 1 || a.projs > MaxProjs:
		return nil, fmt.Errorf("%w: hyper: Projs = %d, want 1 to %d", attn.ErrInput, cfg.Projs, MaxProjs)
	case a.block < 0 && a.samples < 0:
		return nil, fmt.Errorf("%w: hyper: no block-diagonal part (Block < 0) and no samples (Samples < 0) leave nothing to attend to", attn.ErrInput)
	case a.block > math.MaxInt32 || a.samples > math.MaxInt32:
		return nil, fmt.Errorf("%w: hyper: Block = %d or Samples = %d is too large", attn.ErrInput, a.block, a.samples)
	case a.sampling != Uniform && a.sampling != ValueNorm:
		return nil, fmt.Errorf("%w: hyper: unknown sampling %v", attn.ErrInput, a.sampling)
	}
	return a, nil
}

// Name returns "hyper".
func (*Attention) Name() string { return "hyper" }

// Config returns the configuration in effect, defaults filled in.
func (a *Attention) Config() Config {
	return Config{Projs: a.projs, Block: a.block, Samples: a.samples, Min: a.min, Sampling: a.sampling, Seed: a.seed, Flash: a.flash}
}

// Forward writes HyperAttention of q, k, v into out and, when lse is not
// nil, the estimated log-sum-exp of every row into lse. See the package
// documentation for the algorithm and its masks.
func (a *Attention) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	if s.N > math.MaxInt32 || s.M > math.MaxInt32 || s.Group()*s.N > math.MaxInt32 {
		return fmt.Errorf("%w: hyper: lengths N = %d, M = %d (or N times the group of %d) past 2^31-1",
			attn.ErrUnsupported, s.N, s.M, s.Group())
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return ctxErr(ctx, a.forward(ctx, s, q, k, v, o, out, lse))
}

// ctxErr returns ctx's error alone when err is it or joins it: the exact
// kernel's workers each report the cancellation they see, and the caller
// wants to read it once.
func ctxErr(ctx context.Context, err error) error {
	if e := ctx.Err(); err != nil && e != nil && errors.Is(err, e) {
		return e
	}
	return err
}

// forward is Forward on checked arguments.
func (a *Attention) forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if a.exact(s.N, s.M) {
		return a.kn.Forward(ctx, s, q, k, v, o, out, lse)
	}
	if lse == nil {
		lse = make([]float32, s.LSELen())
	}
	c := &call{
		a: a, s: s, o: o, q: q, k: k, v: v, out: out, lse: lse,
		scale: o.ScaleFor(s.D),
	}
	leaves, phases := a.layout(s, o.Causal)
	if o.Causal {
		// The leaves of the recursion, exact and causal, in one
		// block-sparse call; every row is written, so the phases below
		// merge into it.
		if err := a.kn.ForwardPattern(ctx, s, q, k, v, o, leaves, out, lse); err != nil {
			return err
		}
	} else {
		// One rectangle, whose tasks write every row once.
		c.fresh = true
	}
	for _, ph := range phases {
		if err := c.runPhase(ctx, ph); err != nil {
			return err
		}
	}
	return nil
}

// Fallback returns why Forward computes exact attention for a call of shape
// s under o: fewer than Min queries or keys in the whole call, or no part
// of it (the rectangles of the causal recursion, each batch row after
// padding) that is approximated, each being below Min, within one block or
// taken whole by the samples (the causal leaves are exact). It returns ""
// when some part of the call is approximated, and for arguments Forward
// rejects.
func (a *Attention) Fallback(s attn.Shape, o attn.Options) string {
	if s.Validate() != nil || o.Check(s) != nil || s.N > math.MaxInt32 || s.M > math.MaxInt32 || s.Group()*s.N > math.MaxInt32 {
		return ""
	}
	if a.exact(s.N, s.M) {
		return fmt.Sprintf("hyper: %d queries against %d keys, fewer than Min = %d", s.N, s.M, a.min)
	}
	_, phases := a.layout(s, o.Causal)
	for _, ph := range phases {
		for _, r := range ph {
			for b := range s.B {
				if nk := min(r.k1, o.KeyEnd(s, b)) - r.k0; nk > 0 && a.approximates(r.q1-r.q0, nk) {
					return ""
				}
			}
		}
	}
	minPart := ""
	if a.min > 0 {
		minPart = fmt.Sprintf(", below Min = %d", a.min)
	}
	return fmt.Sprintf("hyper: no part of the call approximates: each is an exact causal leaf%s, within one block of %d keys or taken whole by %d samples",
		minPart, a.block, a.samples)
}

// approximates reports whether a problem of nq queries and nk keys leaves
// some keys to the estimate.
func (a *Attention) approximates(nq, nk int) bool {
	oneBlock := a.block > 0 && nk <= a.block
	return !a.exact(nq, nk) && !oneBlock && a.samples < nk
}

var _ attn.Fallbacker = (*Attention)(nil)

// exact reports whether a problem of nq queries and nk keys is below the
// fallback length.
func (a *Attention) exact(nq, nk int) bool {
	return a.min > 0 && (nq < a.min || nk < a.min)
}

var negInf = float32(math.Inf(-1))
