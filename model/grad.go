package model

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/attnkit/attn"
	par "github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// The training pass runs the decoder as pass does, feature-major ([features]
// [ld], positions along the vector lanes), but keeps every activation the
// backward pass needs. The backward pass then walks the layers in reverse:
//
//	Y = W·X           dX = Wᵀ·dY (Wᵀ transposed once per step),
//	                  dW += dY·Xᵀ  (X transposed to position-major once)
//	rmsnorm y = x·r·g dx = r·g·dy − x·r³·Σ(dy·g·x)/d, dg = Σ_t dy·x·r
//	swiglu h = silu(a)·u
//	rope              the rotation by −θ
//	attention         the mechanism's own backward (see trainAttention)
//
// so that no product is computed twice and none is done without the
// assembly kernels. Widths that are not a multiple of simd.Panel (16), the
// products' column panels, pad their last panel with zeros (see gemm).

// layerActs are the activations of one layer that its backward pass reads.
type layerActs struct {
	xin, xn1, xmid, xn2 []float32 // [Dim][ld]
	r1, r2              []float32 // [ld] inverse RMS of xin, xmid
	qh, kh, vh, oh, lse []float32 // attention's layout (after RoPE)
	o                   []float32 // [Dim][ld] attention output
	a, u, h             []float32 // [Hidden][ld] gate, up, silu(a)·u
}

// trainPass is the state of one sequence's forward and backward pass.
type trainPass struct {
	t           *Trainer
	n, ld       int
	tokens      []int
	acts        []layerActs
	xf, xnf, rf []float32 // final residual, normed, inverse RMS
	cos, sin    []float32 // RoPE tables, [hd/2][ld]
	nsin        []float32 // −sin: the inverse rotation
}

// gemmStrip is stripFloats, a variable so that the tests run both
// loop orders of gemm.
var gemmStrip = stripFloats

// gemm computes C = A·B (or C += A·B) in tiles spread over the workers,
// each tile summing over k in the same order whatever the worker count,
// so that results are bit-identical on any number of goroutines. Each
// tile of B is first copied to a contiguous block: the rows of B are
// often whole activations (a stride of 8 KB at 2048 positions), which
// would map every row of a panel to the same L1 set. When a work item's
// whole strip of B (k rows of a column tile) fits in stripFloats, it is
// packed once and each tile of C takes all its k steps before the next,
// so that the tile stays in the core's caches instead of travelling to
// memory and back once per tileK rows of B (C of a layer over a long
// window is tens of megabytes).
func gemm(ctx context.Context, workers, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) error {
	if m == 0 || n == 0 {
		return nil
	}
	rowTiles, colTiles := (m+tileRows-1)/tileRows, (n+tileCols-1)/tileCols
	// A work item is a column of tiles and a run of row tiles, so that a
	// packed block of B serves several tiles; runs are short enough to
	// give every worker about four items.
	runs := min(rowTiles, max(1, (4*workers+colTiles-1)/colTiles))
	run := (rowTiles + runs - 1) / runs
	runs = (rowTiles + run - 1) / run
	strip := k*tileCols <= gemmStrip
	packRows := tileK
	if strip {
		packRows = max(k, 1)
	}
	// A last column tile narrower than a panel (n not a multiple of
	// simd.Panel: a model of any width) goes through a zero-padded copy
	// of B and a scratch tile of C, so that the kernels see whole panels.
	type scratch struct{ pack, tile []float32 }
	newPack := func() scratch {
		return scratch{pack: make([]float32, packRows*tileCols), tile: make([]float32, tileRows*tileCols)}
	}
	return par.For(ctx, workers, runs*colTiles, newPack, func(sc scratch, it int) error {
		t0, c0 := it/colTiles*run, it%colTiles*tileCols
		t1 := min(t0+run, rowTiles)
		nc := min(tileCols, n-c0)
		ncp := (nc + simd.Panel - 1) / simd.Panel * simd.Panel
		if k == 0 && !acc {
			for r := t0 * tileRows; r < min(t1*tileRows, m); r++ {
				clear(c[r*ldc+c0:][:nc])
			}
		}
		// pack copies rows [k0, k0+kc) of the column tile of B to dst.
		pack := func(dst []float32, k0, kc int) {
			for r := range kc {
				row := dst[r*ncp:][:ncp]
				copy(row, b[(k0+r)*ldb+c0:][:nc])
				clear(row[nc:])
			}
		}
		// step adds rows [k0, k0+kc) of the product to row tile ti, B's
		// rows packed in bp.
		step := func(ti, k0, kc int, bp []float32) {
			r0 := ti * tileRows
			mr := min(tileRows, m-r0)
			add := acc || k0 > 0
			if ncp == nc {
				simd.Gemm(mr, nc, kc, a[r0*lda+k0:], lda, bp, nc, c[r0*ldc+c0:], ldc, add)
				return
			}
			tile := sc.tile[:mr*ncp]
			if add {
				for r := range mr {
					copy(tile[r*ncp:][:nc], c[(r0+r)*ldc+c0:][:nc])
				}
			}
			simd.Gemm(mr, ncp, kc, a[r0*lda+k0:], lda, bp, ncp, tile, ncp, add)
			for r := range mr {
				copy(c[(r0+r)*ldc+c0:][:nc], tile[r*ncp:][:nc])
			}
		}
		if strip {
			pack(sc.pack, 0, k)
			for ti := t0; ti < t1; ti++ {
				for k0 := 0; k0 < k; k0 += tileK {
					step(ti, k0, min(tileK, k-k0), sc.pack[k0*ncp:])
				}
			}
			return nil
		}
		for k0 := 0; k0 < k; k0 += tileK {
			kc := min(tileK, k-k0)
			pack(sc.pack, k0, kc)
			for ti := t0; ti < t1; ti++ {
				step(ti, k0, kc, sc.pack)
			}
		}
		return nil
	})
}

// forward runs the decoder over p.tokens keeping the activations, and
// returns the logits of every position, position-major [n][Vocab].
func (p *trainPass) forward(ctx context.Context) ([]float32, error) {
	t := p.t
	w, c, workers := t.w, t.cfg, t.workers
	n, ld := p.n, p.ld
	hd, kvd := c.HeadDim(), c.KVDim()
	x := make([]float32, c.Dim*ld)
	for pos, tok := range p.tokens {
		for i, e := range w.Embed[tok*c.Dim:][:c.Dim] {
			x[i*ld+pos] = e
		}
	}
	p.cos, p.sin = ropeTableT(0, n, ld, hd, c.RopeBase)
	p.nsin = make([]float32, len(p.sin))
	for i, s := range p.sin {
		p.nsin[i] = -s
	}
	s := attn.Shape{B: 1, H: c.Heads, HKV: c.KVHeads, N: n, M: n, D: hd}
	q, k, v := make([]float32, c.Dim*ld), make([]float32, kvd*ld), make([]float32, kvd*ld)
	tmp := make([]float32, c.Dim*ld)
	p.acts = make([]layerActs, c.Layers)
	for l := range w.Layers {
		L, A := &w.Layers[l], &p.acts[l]
		A.xin = x
		A.xn1, A.r1 = make([]float32, c.Dim*ld), make([]float32, ld)
		rmsNormT(A.xn1, x, L.AttnNorm, ld, c.NormEps, A.r1)
		for _, pr := range []struct {
			dst, w []float32
			out    int
		}{{q, L.Wq, c.Dim}, {k, L.Wk, kvd}, {v, L.Wv, kvd}} {
			if err := gemm(ctx, workers, pr.out, ld, c.Dim, pr.w, c.Dim, A.xn1, ld, pr.dst, ld, false); err != nil {
				return nil, err
			}
		}
		ropeT(q, p.cos, p.sin, ld, c.Heads, hd)
		ropeT(k, p.cos, p.sin, ld, c.KVHeads, hd)
		A.qh, A.kh, A.vh = make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
		A.oh, A.lse = make([]float32, s.QLen()), make([]float32, s.LSELen())
		headsFromT(A.qh, q, n, ld, c.Heads, hd)
		headsFromT(A.kh, k, n, ld, c.KVHeads, hd)
		headsFromT(A.vh, v, n, ld, c.KVHeads, hd)
		start := time.Now()
		err := t.att[l].Forward(ctx, s, A.qh, A.kh, A.vh, t.attnOpts(), A.oh, A.lse)
		t.attnTime += time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		A.o = make([]float32, c.Dim*ld)
		headsToT(A.o, A.oh, n, ld, c.Heads, hd)
		if err := gemm(ctx, workers, c.Dim, ld, c.Dim, L.Wo, c.Dim, A.o, ld, tmp, ld, false); err != nil {
			return nil, err
		}
		A.xmid = make([]float32, c.Dim*ld)
		for i := range A.xmid {
			A.xmid[i] = x[i] + tmp[i]
		}
		A.xn2, A.r2 = make([]float32, c.Dim*ld), make([]float32, ld)
		rmsNormT(A.xn2, A.xmid, L.MLPNorm, ld, c.NormEps, A.r2)
		A.a, A.u = make([]float32, c.Hidden*ld), make([]float32, c.Hidden*ld)
		if err := gemm(ctx, workers, c.Hidden, ld, c.Dim, L.W1, c.Dim, A.xn2, ld, A.a, ld, false); err != nil {
			return nil, err
		}
		if err := gemm(ctx, workers, c.Hidden, ld, c.Dim, L.W3, c.Dim, A.xn2, ld, A.u, ld, false); err != nil {
			return nil, err
		}
		A.h = make([]float32, c.Hidden*ld)
		copy(A.h, A.a)
		swiGLU(A.h, A.u)
		if err := gemm(ctx, workers, c.Dim, ld, c.Hidden, L.W2, c.Hidden, A.h, ld, tmp, ld, false); err != nil {
			return nil, err
		}
		x = make([]float32, c.Dim*ld)
		for i := range x {
			x[i] = A.xmid[i] + tmp[i]
		}
	}
	p.xf = x
	p.xnf, p.rf = make([]float32, c.Dim*ld), make([]float32, ld)
	rmsNormT(p.xnf, x, w.Norm, ld, c.NormEps, p.rf)
	// Logits position-major, so that each position's softmax is a
	// contiguous row: Z[n][V] = xnfᵀ·Woutᵀ.
	xr := make([]float32, n*c.Dim)
	transpose(xr, c.Dim, p.xnf, ld, c.Dim, n)
	logits := make([]float32, n*c.Vocab)
	if err := gemm(ctx, workers, n, c.Vocab, c.Dim, xr, c.Dim, t.woutT, c.Vocab, logits, c.Vocab, false); err != nil {
		return nil, err
	}
	return logits, ctx.Err()
}

// crossEntropy turns logits [n][V] into their gradient in place, dZ =
// (softmax(Z) − onehot(target))·scale·w[pos] (w nil: 1 for every
// position), and returns the summed negative log-likelihood of the
// targets, each times its weight (float64), and how many there were.
// Negative targets are not scored and get a zero gradient.
func crossEntropy(logits []float32, targets []int, vocab int, scale float32, w []float32) (nll float64, count int) {
	for pos, y := range targets {
		z := logits[pos*vocab:][:vocab]
		if y < 0 {
			clear(z)
			continue
		}
		s, wt := scale, 1.0
		if w != nil {
			s *= w[pos]
			wt = float64(w[pos])
		}
		zy := z[y]
		mx := simd.Max(z)
		for i := range z {
			z[i] -= mx
		}
		simd.Exp(z, z)
		var sum float64
		for _, e := range z {
			sum += float64(e)
		}
		nll += wt * (math.Log(sum) - float64(zy-mx))
		count++
		f := s / float32(sum)
		for i := range z {
			z[i] *= f
		}
		z[y] -= s
	}
	return nll, count
}

// backward accumulates into the trainer's gradients the gradient of the
// loss whose gradient with respect to the logits is dz [n][V] (position-
// major, overwritten).
func (p *trainPass) backward(ctx context.Context, dz []float32) error {
	t := p.t
	w, c, workers, g := t.w, t.cfg, t.workers, t.grads
	n, ld := p.n, p.ld
	hd, kvd := c.HeadDim(), c.KVDim()
	s := attn.Shape{B: 1, H: c.Heads, HKV: c.KVHeads, N: n, M: n, D: hd}

	// Output layer: dWoutᵀ[Dim][V] += xnf·dZ, dxnf = (dZ·Wout)ᵀ.
	if err := gemm(ctx, workers, c.Dim, c.Vocab, n, p.xnf, ld, dz, c.Vocab, t.dwoutT, c.Vocab, true); err != nil {
		return err
	}
	dr := make([]float32, n*c.Dim)
	if err := gemm(ctx, workers, n, c.Dim, c.Vocab, dz, c.Vocab, w.output(), c.Dim, dr, c.Dim, false); err != nil {
		return err
	}
	dxn := make([]float32, c.Dim*ld)
	transpose(dxn, ld, dr, c.Dim, n, c.Dim)
	dx := make([]float32, c.Dim*ld)
	rmsNormBackward(dx, g.norm, dxn, p.xf, p.rf, w.Norm, ld)

	// Scratch shared by the layers.
	xpos := make([]float32, ld*max(c.Dim, c.Hidden)) // an activation, position-major
	dh := make([]float32, c.Hidden*ld)
	du := make([]float32, c.Hidden*ld)
	do := make([]float32, c.Dim*ld)
	dq, dk, dv := make([]float32, c.Dim*ld), make([]float32, kvd*ld), make([]float32, kvd*ld)
	dqh, dkh, dvh := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	doh := make([]float32, s.QLen())
	for l := c.Layers - 1; l >= 0; l-- {
		L, A, G, T := &w.Layers[l], &p.acts[l], &g.layers[l], &t.wT[l]
		// MLP: dx is the gradient of the layer's output, which is also
		// that of xmid through the residual.
		transpose(xpos, c.Hidden, A.h, ld, c.Hidden, ld)
		if err := gemm(ctx, workers, c.Dim, c.Hidden, ld, dx, ld, xpos, c.Hidden, G.W2, c.Hidden, true); err != nil {
			return err
		}
		if err := gemm(ctx, workers, c.Hidden, ld, c.Dim, T.W2, c.Dim, dx, ld, dh, ld, false); err != nil {
			return err
		}
		swiGLUBackward(dh, du, A.a, A.u)
		transpose(xpos, c.Dim, A.xn2, ld, c.Dim, ld)
		if err := gemm(ctx, workers, c.Hidden, c.Dim, ld, dh, ld, xpos, c.Dim, G.W1, c.Dim, true); err != nil {
			return err
		}
		if err := gemm(ctx, workers, c.Hidden, c.Dim, ld, du, ld, xpos, c.Dim, G.W3, c.Dim, true); err != nil {
			return err
		}
		if err := gemm(ctx, workers, c.Dim, ld, c.Hidden, T.W1, c.Hidden, dh, ld, dxn, ld, false); err != nil {
			return err
		}
		if err := gemm(ctx, workers, c.Dim, ld, c.Hidden, T.W3, c.Hidden, du, ld, dxn, ld, true); err != nil {
			return err
		}
		rmsNormBackward(dx, G.MLPNorm, dxn, A.xmid, A.r2, L.MLPNorm, ld)

		// Attention: dx is now the gradient of xmid, and of xin through
		// the residual.
		transpose(xpos, c.Dim, A.o, ld, c.Dim, ld)
		if err := gemm(ctx, workers, c.Dim, c.Dim, ld, dx, ld, xpos, c.Dim, G.Wo, c.Dim, true); err != nil {
			return err
		}
		if err := gemm(ctx, workers, c.Dim, ld, c.Dim, T.Wo, c.Dim, dx, ld, do, ld, false); err != nil {
			return err
		}
		headsFromT(doh, do, n, ld, c.Heads, hd)
		start := time.Now()
		err := t.att[l].Backward(ctx, s, A.qh, A.kh, A.vh, A.oh, A.lse, doh, t.attnOpts(), dqh, dkh, dvh)
		t.attnTime += time.Since(start)
		if err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
		headsToT(dq, dqh, n, ld, c.Heads, hd)
		headsToT(dk, dkh, n, ld, c.KVHeads, hd)
		headsToT(dv, dvh, n, ld, c.KVHeads, hd)
		ropeT(dq, p.cos, p.nsin, ld, c.Heads, hd)
		ropeT(dk, p.cos, p.nsin, ld, c.KVHeads, hd)
		transpose(xpos, c.Dim, A.xn1, ld, c.Dim, ld)
		for _, pr := range []struct {
			dy, dw []float32
			out    int
		}{{dq, G.Wq, c.Dim}, {dk, G.Wk, kvd}, {dv, G.Wv, kvd}} {
			if err := gemm(ctx, workers, pr.out, c.Dim, ld, pr.dy, ld, xpos, c.Dim, pr.dw, c.Dim, true); err != nil {
				return err
			}
		}
		if err := gemm(ctx, workers, c.Dim, ld, c.Dim, T.Wq, c.Dim, dq, ld, dxn, ld, false); err != nil {
			return err
		}
		if err := gemm(ctx, workers, c.Dim, ld, kvd, T.Wk, kvd, dk, ld, dxn, ld, true); err != nil {
			return err
		}
		if err := gemm(ctx, workers, c.Dim, ld, kvd, T.Wv, kvd, dv, ld, dxn, ld, true); err != nil {
			return err
		}
		rmsNormBackward(dx, G.AttnNorm, dxn, A.xin, A.r1, L.AttnNorm, ld)
	}
	// Embedding: each position's gradient goes to its token's row, in
	// position order (deterministic).
	for pos, tok := range p.tokens {
		row := g.embed[tok*c.Dim:][:c.Dim]
		for i := range row {
			row[i] += dx[i*ld+pos]
		}
	}
	return ctx.Err()
}

// rmsNormBackward adds to dx the gradient of y = x·r·g (r the inverse RMS
// of each column of x [d][ld]) given dy, and adds dg to dgain. dx may hold
// the residual's gradient already; dy is left unchanged.
func rmsNormBackward(dx, dgain, dy, x, r, gain []float32, ld int) {
	d := len(gain)
	dot := make([]float32, ld)
	for i, gi := range gain {
		dyr, xr := dy[i*ld:][:ld], x[i*ld:][:ld]
		var sg float32
		for t := range dot {
			dot[t] += dyr[t] * gi * xr[t]
			sg += dyr[t] * xr[t] * r[t]
		}
		dgain[i] += sg
	}
	for t, rt := range r[:ld] {
		dot[t] *= rt * rt * rt / float32(d)
	}
	for i, gi := range gain {
		dyr, xr, dxr := dy[i*ld:][:ld], x[i*ld:][:ld], dx[i*ld:][:ld]
		for t := range dxr {
			dxr[t] += r[t]*gi*dyr[t] - xr[t]*dot[t]
		}
	}
}

// swiGLUBackward turns dh (the gradient of h = silu(a)·u) into da, and
// writes du = dh·silu(a).
func swiGLUBackward(dh, du, a, u []float32) {
	var e [256]float32
	for i0 := 0; i0 < len(a); i0 += len(e) {
		as := a[i0:min(i0+len(e), len(a))]
		es := e[:len(as)]
		for i, x := range as {
			es[i] = -x
		}
		simd.Exp(es, es)
		for i, x := range as {
			j := i0 + i
			sig := 1 / (1 + es[i]) // 0 where exp(−x) overflows: silu and its slope are 0
			silu := x * sig
			du[j] = dh[j] * silu
			dh[j] *= u[j] * sig * (1 + x*(1-sig))
		}
	}
}
