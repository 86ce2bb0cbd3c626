package sparse

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// maxExtent bounds window extents, strides and block sizes so that
// position arithmetic cannot overflow; it is far beyond any length a
// tensor in this module can have (attn.Shape caps tensors at 2^40
// elements).
const maxExtent = 1 << 40

// Attention is one sparse attention mechanism: a pattern of visible
// (query, key) pairs, intersected with the causal and padding masks of
// attn.Options, executed exactly by the fused kernel of package flash over
// only the keys the pattern touches. It implements attn.Mechanism and is
// safe for concurrent use. Build one with NewWindow, NewStrided,
// NewLongformer or NewBigBird.
type Attention struct {
	name   string
	kernel *flash.Kernel
	layout layout
}

// layout is what distinguishes the four mechanisms: the pattern that
// defines them and the plan that executes it.
type layout interface {
	// pattern returns the pattern of a call with shape s.
	pattern(s attn.Shape, causal bool) (flash.Pattern, error)
	// plan splits the pattern into parts over disjoint key sets whose
	// results merge by lse, and parts that overwrite whole rows.
	plan(s attn.Shape, causal bool) (merged, rows []part, err error)
	// stepRule returns the causal pattern one query at a time, for a
	// decoder of one sequence.
	stepRule() stepRule
}

// part computes attention over some of the keys of every query row (or
// over all keys of some rows) with the kernel.
type part interface {
	run(ctx context.Context, kn *flash.Kernel, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error
}

// Name returns the mechanism's name on the command line: "window",
// "strided", "longformer" or "bigbird".
func (a *Attention) Name() string { return a.name }

// Pattern returns the pattern of a call with shape s and the causal flag
// (which only BigBird's random draw depends on), over absolute positions
// (query i at M-N+i), before the causal and padding masks. Its Visible is
// the mechanism's definition and its KeyRanges a correct cover, so
// flash's ForwardPattern runs it as it is; Forward may run a faster
// decomposition of the same pattern (see the package documentation).
// Render it with Dense or WritePNG.
func (a *Attention) Pattern(s attn.Shape, causal bool) (flash.Pattern, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return a.layout.pattern(s, causal)
}

// Forward computes attention restricted to the pattern, intersected with
// the causal and padding masks of o, into out and, when lse is non-nil,
// the log-sum-exp of each row over the keys it saw. A row that sees no key
// gets output 0 and lse -Inf.
func (a *Attention) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	merged, rows, err := a.layout.plan(s, o.Causal)
	if err != nil {
		return err
	}
	if _, alone := merged[0].(direct); lse == nil && !(alone && len(merged) == 1 && len(rows) == 0) {
		// Merging and gathering need it. Every part writes every row.
		p := getFloats(s.LSELen())
		defer putFloats(p)
		lse = *p
	}
	for i, p := range merged {
		if i == 0 {
			if err := p.run(ctx, a.kernel, s, q, k, v, o, out, lse); err != nil {
				return err
			}
			continue
		}
		tmpOut, tmpLSE := getFloats(s.QLen()), getFloats(s.LSELen())
		err := p.run(ctx, a.kernel, s, q, k, v, o, *tmpOut, *tmpLSE)
		if err == nil {
			err = attn.Merge(out, lse, *tmpOut, *tmpLSE, s.D)
		}
		putFloats(tmpOut, tmpLSE)
		if err != nil {
			return err
		}
	}
	for _, p := range rows {
		if err := p.run(ctx, a.kernel, s, q, k, v, o, out, lse); err != nil {
			return err
		}
	}
	return nil
}

// Backward computes the gradients of Forward (see attn.Differentiable)
// with the exact kernel's backward pass over the pattern of the call,
// Pattern(s, o.Causal). Every mechanism here is one flash.Pattern, so no
// layout needs a backward of its own and none is unsupported; the parts
// Forward splits a pattern into do not matter, since out and lse are the
// same. The cost is that of the pattern's cover, its KeyRanges: about the
// visible keys for a window, BigBird, Longformer (all M keys for a query
// tile holding a global row) and fixed mode (up to 256 blocks of summary
// columns; one masked range past that), but Left+Right+tile keys a row
// for a dilated window, and a masked range over all keys for strided
// mode, whose backward pass then does dense attention's work. A cancelled
// ctx stops it, the gradients then being partly written.
func (a *Attention) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return err
	}
	pat, err := a.layout.pattern(s, o.Causal)
	if err != nil {
		return err
	}
	return a.kernel.Backward(ctx, s, q, k, v, out, lse, dout, o, pat, dq, dk, dv)
}

// direct runs a pattern on the tensors as they are; the kernel applies the
// causal and padding masks.
type direct struct{ pat flash.Pattern }

func (d direct) run(ctx context.Context, kn *flash.Kernel, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	return kn.ForwardPattern(ctx, s, q, k, v, o, d.pat, out, lse)
}

// gathered is a sub-problem of one batch row: the query rows rows (indices
// into N, in the order they are laid out; nil for all in order) against
// the keys keys (indices into M, in order). Its pattern is over the
// sub-problem's own positions and carries the causal and padding masks
// itself, since neither is a prefix of the gathered keys in general.
type gathered struct {
	b          int
	rows, keys []int
	pat        flash.Pattern
}

// run computes g for batch row b and writes the rows it covers into out
// and lse (laid out as the full problem). q, k, v are copied for the
// gathered rows and keys only: O(H·len(rows)·D + HKV·len(keys)·D).
func (g gathered) run(ctx context.Context, kn *flash.Kernel, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	b, d := g.b, s.D
	n := s.N
	if g.rows != nil {
		n = len(g.rows)
	}
	if n == 0 {
		return nil
	}
	if len(g.keys) == 0 {
		// No key at all: every covered row sees nothing.
		for h := range s.H {
			for r := range n {
				i := r
				if g.rows != nil {
					i = g.rows[r]
				}
				row := (b*s.H+h)*s.N + i
				clear(out[row*d : (row+1)*d])
				lse[row] = float32(math.Inf(-1))
			}
		}
		return nil
	}
	sub := attn.Shape{B: 1, H: s.H, HKV: s.HKV, N: n, M: len(g.keys), D: d}
	var qs, os, ls []float32
	if g.rows == nil {
		// The queries of batch row b are contiguous: use them in place and
		// write the results in place.
		qs = q[b*s.H*s.N*d:][:s.H*s.N*d]
		os = out[b*s.H*s.N*d:][:s.H*s.N*d]
		ls = lse[b*s.H*s.N:][:s.H*s.N]
	} else {
		pq, po, pl := getFloats(sub.QLen()), getFloats(sub.QLen()), getFloats(sub.LSELen())
		defer putFloats(pq, po, pl)
		qs, os, ls = *pq, *po, *pl
		for h := range s.H {
			for r, i := range g.rows {
				copy(qs[(h*n+r)*d:][:d], q[((b*s.H+h)*s.N+i)*d:][:d])
			}
		}
	}
	pk, pv := getFloats(sub.KVLen()), getFloats(sub.KVLen())
	defer putFloats(pk, pv)
	ks, vs := *pk, *pv
	for h := range s.HKV {
		base := (b*s.HKV + h) * s.M
		for t, j := range g.keys {
			copy(ks[(h*len(g.keys)+t)*d:][:d], k[(base+j)*d:][:d])
			copy(vs[(h*len(g.keys)+t)*d:][:d], v[(base+j)*d:][:d])
		}
	}
	so := attn.Options{Scale: o.ScaleFor(d), Workers: o.Workers}
	if err := kn.ForwardPattern(ctx, sub, qs, ks, vs, so, g.pat, os, ls); err != nil {
		return err
	}
	if g.rows != nil {
		for h := range s.H {
			for r, i := range g.rows {
				row := (b*s.H+h)*s.N + i
				copy(out[row*d:][:d], os[(h*n+r)*d:][:d])
				lse[row] = ls[h*n+r]
			}
		}
	}
	return nil
}

// perBatch runs one gathered sub-problem per batch row, built by make for
// that row's valid key count.
type perBatch func(b, valid int) gathered

func (pb perBatch) run(ctx context.Context, kn *flash.Kernel, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	for b := range s.B {
		if err := ctx.Err(); err != nil {
			return err
		}
		g := pb(b, o.KeyEnd(s, b))
		g.b = b
		if err := g.run(ctx, kn, s, q, k, v, o, out, lse); err != nil {
			return err
		}
	}
	return nil
}

// scratch recycles the float buffers of the gathered and merged parts
// between calls: they are as large as Q, and fresh memory costs a page
// fault per 4 KiB on first touch.
var scratch sync.Pool // *[]float32

// getFloats returns a buffer of n floats with arbitrary contents.
func getFloats(n int) *[]float32 {
	if p, ok := scratch.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	b := make([]float32, n)
	return &b
}

func putFloats(ps ...*[]float32) {
	for _, p := range ps {
		scratch.Put(p)
	}
}

// validate checks an integer setting of a config.
func validate(mech, name string, v, lo int) error {
	if v < lo || v > maxExtent {
		return fmt.Errorf("%w: sparse.%s: %s = %d is outside [%d, 2^40]", attn.ErrInput, mech, name, v, lo)
	}
	return nil
}
