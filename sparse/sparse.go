package sparse

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/simd"
)

// maxExtent bounds window extents, strides and block sizes so that
// position arithmetic cannot overflow; it is far beyond any length a
// tensor in this module can have (attn.Shape caps tensors at 2^40
// elements, 2^28 where int has 32 bits, where this is 2^29).
const maxExtent = min(1<<40, math.MaxInt>>2)

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

// gradPart is a part whose share of the gradients can be computed on its
// own (see Attention.Backward): grad writes or adds it. Parts that
// overwrite whole rows have none.
type gradPart interface {
	part
	grad(ctx context.Context, g gradArgs) error
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

// Backward computes the gradients of Forward (see attn.Differentiable).
// Where Forward's plan is parts over disjoint key sets only (window and
// strided), the gradients are the sums of the parts' gradients, each
// computed by the exact kernel's backward pass over the part's own
// pattern, as Forward ran it: given the whole row's out and lse, the
// kernel's probabilities exp(s−lse) and its rowsum(dO∘O) are the whole
// attention's, restricted to the part's keys, so the parts' shares add up
// exactly. Strided mode so costs what its forward costs, O(l + M/l) keys
// a query. Other plans (Longformer and BigBird, whose global rows
// overwrite what the merged parts computed) run the kernel's backward
// over the pattern's cover, Pattern(s, o.Causal).KeyRanges: about the
// visible keys for BigBird and Longformer (all M keys for a query tile
// holding a global row). A cancelled ctx stops it, the gradients then
// being partly written.
func (a *Attention) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return err
	}
	merged, rows, err := a.layout.plan(s, o.Causal)
	if err != nil {
		return err
	}
	gps := make([]gradPart, 0, len(merged))
	for _, p := range merged {
		if gp, ok := p.(gradPart); ok {
			gps = append(gps, gp)
		}
	}
	if len(rows) == 0 && len(gps) == len(merged) {
		g := gradArgs{kn: a.kernel, s: s, q: q, k: k, v: v, out: out, lse: lse, dout: dout, o: o, dq: dq, dk: dk, dv: dv}
		if _, ok := gps[0].(direct); !ok {
			clear(dq)
			clear(dk)
			clear(dv)
			g.add = true
		}
		for _, p := range gps {
			if err := p.grad(ctx, g); err != nil {
				return err
			}
			g.add = true
		}
		return nil
	}
	pat, err := a.layout.pattern(s, o.Causal)
	if err != nil {
		return err
	}
	return a.kernel.Backward(ctx, s, q, k, v, out, lse, dout, o, pat, dq, dk, dv)
}

// gradArgs are the arguments of a part's backward pass: the whole
// problem's inputs, out, lse and dout, and the gradients it writes (add
// false: only the first part, which covers every row and key of a
// direct pattern) or adds to.
type gradArgs struct {
	kn                      *flash.Kernel
	s                       attn.Shape
	q, k, v, out, lse, dout []float32
	o                       attn.Options
	dq, dk, dv              []float32
	add                     bool
}

// direct runs a pattern on the tensors as they are; the kernel applies the
// causal and padding masks.
type direct struct{ pat flash.Pattern }

func (d direct) run(ctx context.Context, kn *flash.Kernel, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	return kn.ForwardPattern(ctx, s, q, k, v, o, d.pat, out, lse)
}

func (d direct) grad(ctx context.Context, g gradArgs) error {
	s := g.s
	if !g.add {
		return g.kn.Backward(ctx, s, g.q, g.k, g.v, g.out, g.lse, g.dout, g.o, d.pat, g.dq, g.dk, g.dv)
	}
	pq, pk, pv := getFloats(s.QLen()), getFloats(s.KVLen()), getFloats(s.KVLen())
	defer putFloats(pq, pk, pv)
	if err := g.kn.Backward(ctx, s, g.q, g.k, g.v, g.out, g.lse, g.dout, g.o, d.pat, *pq, *pk, *pv); err != nil {
		return err
	}
	simd.Axpy(1, *pq, g.dq)
	simd.Axpy(1, *pk, g.dk)
	simd.Axpy(1, *pv, g.dv)
	return nil
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
	var bufs []*[]float32
	defer func() { putFloats(bufs...) }()
	qs := g.queryRows(q, s, d, &bufs)
	ks, vs := g.keyRows(k, v, s, &bufs)
	// Without rows the results are written in place, as the queries are
	// read; with them, into buffers scattered back below.
	os, ls := out[b*s.H*s.N*d:][:s.H*s.N*d], lse[b*s.H*s.N:][:s.H*s.N]
	if g.rows != nil {
		po, pl := getFloats(sub.QLen()), getFloats(sub.LSELen())
		bufs = append(bufs, po, pl)
		os, ls = *po, *pl
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

// grad adds the part's gradients: the kernel's backward pass over the
// gathered problem, given the whole problem's out, lse and dout of its
// rows, scattered back onto the rows and keys it gathered.
func (g gathered) grad(ctx context.Context, a gradArgs) error {
	s, b, d := a.s, g.b, a.s.D
	n := s.N
	if g.rows != nil {
		n = len(g.rows)
	}
	if n == 0 || len(g.keys) == 0 {
		return nil // its rows see none of its keys: it adds nothing
	}
	sub := attn.Shape{B: 1, H: s.H, HKV: s.HKV, N: n, M: len(g.keys), D: d}
	var bufs []*[]float32
	defer func() { putFloats(bufs...) }()
	qs, gs := g.queryRows(a.q, s, d, &bufs), g.queryRows(a.dout, s, d, &bufs)
	os, ls := g.queryRows(a.out, s, d, &bufs), g.queryRows(a.lse, s, 1, &bufs)
	ks, vs := g.keyRows(a.k, a.v, s, &bufs)
	pdq, pdk, pdv := getFloats(sub.QLen()), getFloats(sub.KVLen()), getFloats(sub.KVLen())
	bufs = append(bufs, pdq, pdk, pdv)
	so := attn.Options{Scale: a.o.ScaleFor(d), Workers: a.o.Workers}
	if err := a.kn.Backward(ctx, sub, qs, ks, vs, os, ls, gs, so, g.pat, *pdq, *pdk, *pdv); err != nil {
		return err
	}
	if g.rows == nil {
		simd.Axpy(1, *pdq, a.dq[b*s.H*s.N*d:][:s.H*s.N*d])
	} else {
		for h := range s.H {
			for r, i := range g.rows {
				simd.Axpy(1, (*pdq)[(h*n+r)*d:][:d], a.dq[((b*s.H+h)*s.N+i)*d:][:d])
			}
		}
	}
	for h := range s.HKV {
		base := (b*s.HKV + h) * s.M
		for t, j := range g.keys {
			simd.Axpy(1, (*pdk)[(h*len(g.keys)+t)*d:][:d], a.dk[(base+j)*d:][:d])
			simd.Axpy(1, (*pdv)[(h*len(g.keys)+t)*d:][:d], a.dv[(base+j)*d:][:d])
		}
	}
	return nil
}

// queryRows returns the rows g covers of batch row g.b of x, a tensor of
// [B][H][N][w], laid out [H][n][w]: x's own memory when g.rows is nil
// (the rows of a batch row are contiguous), else a copy in a pooled
// buffer appended to bufs.
func (g gathered) queryRows(x []float32, s attn.Shape, w int, bufs *[]*[]float32) []float32 {
	b := g.b
	if g.rows == nil {
		return x[b*s.H*s.N*w:][:s.H*s.N*w]
	}
	n := len(g.rows)
	p := getFloats(s.H * n * w)
	*bufs = append(*bufs, p)
	for h := range s.H {
		for r, i := range g.rows {
			copy((*p)[(h*n+r)*w:][:w], x[((b*s.H+h)*s.N+i)*w:][:w])
		}
	}
	return *p
}

// keyRows copies the keys g gathers of batch row g.b of k and v into
// pooled buffers appended to bufs, laid out [HKV][len(g.keys)][D].
func (g gathered) keyRows(k, v []float32, s attn.Shape, bufs *[]*[]float32) (ks, vs []float32) {
	d, nk := s.D, len(g.keys)
	pk, pv := getFloats(s.HKV*nk*d), getFloats(s.HKV*nk*d)
	*bufs = append(*bufs, pk, pv)
	ks, vs = *pk, *pv
	for h := range s.HKV {
		base := (g.b*s.HKV + h) * s.M
		for t, j := range g.keys {
			copy(ks[(h*nk+t)*d:][:d], k[(base+j)*d:][:d])
			copy(vs[(h*nk+t)*d:][:d], v[(base+j)*d:][:d])
		}
	}
	return ks, vs
}

// perBatch runs one gathered sub-problem per batch row, built by make for
// that row's valid key count.
type perBatch func(b, valid int) gathered

// each calls f with the sub-problem of every batch row in turn.
func (pb perBatch) each(ctx context.Context, s attn.Shape, o attn.Options, f func(gathered) error) error {
	for b := range s.B {
		if err := ctx.Err(); err != nil {
			return err
		}
		g := pb(b, o.KeyEnd(s, b))
		g.b = b
		if err := f(g); err != nil {
			return err
		}
	}
	return nil
}

func (pb perBatch) run(ctx context.Context, kn *flash.Kernel, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	return pb.each(ctx, s, o, func(g gathered) error { return g.run(ctx, kn, s, q, k, v, o, out, lse) })
}

func (pb perBatch) grad(ctx context.Context, a gradArgs) error {
	return pb.each(ctx, a.s, a.o, func(g gathered) error { return g.grad(ctx, a) })
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
		return fmt.Errorf("%w: sparse.%s: %s = %d is outside [%d, %d]", attn.ErrInput, mech, name, v, lo, maxExtent)
	}
	return nil
}
