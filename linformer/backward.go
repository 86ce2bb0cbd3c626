package linformer

import (
	"context"
	"fmt"
	"runtime"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

var _ attn.Differentiable = (*Linformer)(nil)

// Backward writes into dq, dk and dv the gradients of a loss with respect
// to q, k and v, given dout, its gradient with respect to out, and the
// inputs, out and lse of a Forward call of the same shape and options
// with the same projections. Linformer is exact attention of Q against
// the projected K' = Eᵀ·K and V' = Fᵀ·V, so the gradients are those of
// exact attention (flash's Backward on k keys) carried back through the
// projections:
//
//	dK = E·dK',  dV = F·dV'
//
// over each batch row's valid keys; padded keys get dk and dv 0, and a
// batch row with no valid key gets dq, dk and dv 0. Grouped-query heads
// sum into their kv head's gradients. dq, dk and dv are overwritten,
// never read, and must not overlap the inputs.
//
// Backward recomputes K' and V' rather than keeping them from Forward, so
// a Linformer holds no state between the passes. Its cost is twice the
// forward's projections (recomputing K' and V', then dK and dV), plus
// exact attention's backward over k keys, 10·B·H·N·k·D flops; extra
// memory is O(B·Hkv·k·D), never O(N·M).
//
// The results do not depend on Options.Workers. Errors are those of
// Forward, and of attn.CheckBackward for the gradients' lengths and a nil
// lse; a cancelled ctx stops the pass and returns its error, the outputs
// then being partly written.
func (l *Linformer) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := l.checkBackward(s, q, k, v, out, lse, dout, o, dq, dk, dv); err != nil {
		return err
	}
	return l.backward(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv, nil, nil)
}

// BackwardProjections is Backward that also writes the gradients of the
// loss with respect to the projections into dE and dF, each M×k
// row-major like the first M rows that Projections(M) returns:
//
//	dE = Σ K·dK'ᵀ,  dF = Σ V·dV'ᵀ
//
// summed over batch rows and kv heads, since one E and one F serve them
// all. Row j gets contributions only from the batch rows whose valid
// length exceeds j; rows past every valid length get 0. dE and dF are
// overwritten. They cost one more product the size of a projection
// each. Rows of E and F past M have no influence on the call and
// so a gradient of 0, which dE and dF leave out.
//
// This is what makes E and F trainable parameters of a model: the model
// keeps E and F (initially Projections(Length) or a checkpoint's), calls
// Forward and then BackwardProjections for a layer, updates E and F from
// dE and dF (adding the gradients of every call that shares them, as
// layers or chunks with shared projections do) and installs them with
// SetProjections before the next step.
func (l *Linformer) BackwardProjections(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv, dE, dF []float32) error {
	if err := l.checkBackward(s, q, k, v, out, lse, dout, o, dq, dk, dv); err != nil {
		return err
	}
	if len(dE) != s.M*l.k || len(dF) != s.M*l.k {
		return fmt.Errorf("%w: linformer: len(dE) = %d, len(dF) = %d, want M·k = %d·%d", attn.ErrShape, len(dE), len(dF), s.M, l.k)
	}
	return l.backward(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv, dE, dF)
}

func (l *Linformer) checkBackward(s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return err
	}
	return l.supports(s, o)
}

// backward is Backward on checked arguments; dE and dF nil skip the
// projections' gradients.
func (l *Linformer) backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv, dE, dF []float32) error {
	e, f := l.projections(s.M)
	ps, kp, vp, po, err := l.projected(ctx, s, k, v, o, e, f)
	if err != nil {
		return err
	}
	dkp := make([]float32, ps.KVLen())
	dvp := make([]float32, ps.KVLen())
	if err := l.exact.Backward(ctx, ps, q, kp, vp, out, lse, dout, po, nil, dq, dkp, dvp); err != nil {
		return err
	}
	g := newGradProj(l, s, o, e, f, k, v, dkp, dvp, dk, dv, dE, dF)
	procs := runtime.GOMAXPROCS(0)
	pairs := s.B * s.HKV
	if err := parallel.For(ctx, o.WorkerCount(procs, pairs), pairs, parallel.None,
		func(_ struct{}, n int) error { g.layout(n); return nil }); err != nil {
		return err
	}
	items := g.items()
	return parallel.For(ctx, o.WorkerCount(procs, items), items,
		func() []float32 { return make([]float32, block*max(l.kp, g.dp)) },
		g.run)
}

// gradProj carries the gradients of K' and V' back through the
// projections. Its work is cut in blocks of rows of E and F (and of the
// keys, which run along the same index): the gradients of the
// projections first, a block of dE or dF summing over every (batch row,
// kv head) pair in order, then a block of one pair's dk or dv. Each item
// writes its own part of the outputs, so neither the cut nor any sum
// depends on the worker count.
type gradProj struct {
	l          *Linformer
	s          attn.Shape
	o          attn.Options
	dp         int // D rounded up to simd.Panel
	blocks     int // blocks of rows per pair
	e, f, k, v []float32
	dkp, dvp   []float32 // [pair][k][D]: dK', dV'
	// [pair][k][dp]: dK', dV' padded to Gemm's columns; dkp, dvp when
	// D = dp.
	dkP, dvP []float32
	// [pair][D][kp]: dK', dV' transposed, zero past column k; nil without
	// dE and dF.
	dkT, dvT       []float32
	dk, dv, dE, dF []float32
}

func newGradProj(l *Linformer, s attn.Shape, o attn.Options, e, f, k, v, dkp, dvp, dk, dv, dE, dF []float32) *gradProj {
	g := &gradProj{l: l, s: s, o: o, dp: pad(s.D), blocks: (s.M + block - 1) / block,
		e: e, f: f, k: k, v: v, dkp: dkp, dvp: dvp, dkP: dkp, dvP: dvp, dk: dk, dv: dv, dE: dE, dF: dF}
	pairs := s.B * s.HKV
	if g.dp != s.D {
		g.dkP = make([]float32, pairs*l.k*g.dp)
		g.dvP = make([]float32, pairs*l.k*g.dp)
	}
	if dE != nil {
		g.dkT = make([]float32, pairs*s.D*l.kp)
		g.dvT = make([]float32, pairs*s.D*l.kp)
	}
	return g
}

// layout writes pair n's padded and transposed copies of dK' and dV'.
func (g *gradProj) layout(n int) {
	d, kk, kp, dp := g.s.D, g.l.k, g.l.kp, g.dp
	for _, m := range []struct{ src, pad, tr []float32 }{{g.dkp, g.dkP, g.dkT}, {g.dvp, g.dvP, g.dvT}} {
		src := m.src[n*kk*d : (n+1)*kk*d]
		if dp != d {
			for p := range kk {
				copy(m.pad[(n*kk+p)*dp:][:d], src[p*d:(p+1)*d])
			}
		}
		if m.tr != nil {
			tr := m.tr[n*d*kp : (n+1)*d*kp]
			for p := range kk {
				for c := range d {
					tr[c*kp+p] = src[p*d+c]
				}
			}
		}
	}
}

// items numbers the work: 2·blocks blocks of dE and dF when they are
// wanted (the larger items, first), then 2·pairs·blocks blocks of dk and
// dv.
func (g *gradProj) items() int {
	n := 2 * g.s.B * g.s.HKV * g.blocks
	if g.dE != nil {
		n += 2 * g.blocks
	}
	return n
}

func (g *gradProj) run(c []float32, it int) error {
	if g.dE != nil {
		if it < 2*g.blocks {
			if it%2 == 0 {
				g.projGrad(c, it/2, g.k, g.dkT, g.dE)
			} else {
				g.projGrad(c, it/2, g.v, g.dvT, g.dF)
			}
			return nil
		}
		it -= 2 * g.blocks
	}
	n, r := it/(2*g.blocks), it%(2*g.blocks)
	if r%2 == 0 {
		g.keyGrad(c, n, r/2, g.e, g.dkP, g.dk)
	} else {
		g.keyGrad(c, n, r/2, g.f, g.dvP, g.dv)
	}
	return nil
}

// projGrad writes rows [j0, j0+block) of dP = Σ_pairs X·dX'ᵀ, X the first
// valid rows of each pair's keys or values. c is block·kp scratch.
func (g *gradProj) projGrad(c []float32, blk int, x, dT, dP []float32) {
	s, kk, kp := g.s, g.l.k, g.l.kp
	j0 := blk * block
	nb := min(block, s.M-j0)
	c = c[:nb*kp]
	clear(c)
	for n := range s.B * s.HKV {
		if r := min(nb, g.o.KeyEnd(s, n/s.HKV)-j0); r > 0 {
			simd.Gemm(r, kp, s.D, x[(n*s.M+j0)*s.D:], s.D, dT[n*s.D*kp:], kp, c, kp, true)
		}
	}
	for j := range nb {
		copy(dP[(j0+j)*kk:(j0+j+1)*kk], c[j*kp:])
	}
}

// keyGrad writes rows [j0, j0+block) of pair n's dX = P·dX' over the
// valid rows, 0 past them. c is block·dp scratch.
func (g *gradProj) keyGrad(c []float32, n, blk int, p, dP, dX []float32) {
	s, d, dp := g.s, g.s.D, g.dp
	j0 := blk * block
	nb := min(block, s.M-j0)
	dst := dX[(n*s.M+j0)*d : (n*s.M+j0+nb)*d]
	r := max(0, min(nb, g.o.KeyEnd(s, n/s.HKV)-j0))
	clear(dst[r*d:])
	if r == 0 {
		return
	}
	src := dP[n*g.l.k*dp:]
	if dp == d {
		simd.Gemm(r, d, g.l.k, p[j0*g.l.kp:], g.l.kp, src, dp, dst, d, false)
		return
	}
	simd.Gemm(r, dp, g.l.k, p[j0*g.l.kp:], g.l.kp, src, dp, c, dp, false)
	for j := range r {
		copy(dst[j*d:(j+1)*d], c[j*dp:])
	}
}
