package linear

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Backward computes the gradients of linear attention. Given the inputs
// q, k, v of a forward pass, its out and lse (as Forward wrote them) and
// dout, the gradient of a loss with respect to out, it writes the
// gradients of the loss with respect to q, k and v into dq, dk and dv.
// Shape and options must be those of the forward pass; dq and dout are
// laid out like q, dk and dv like k. dq, dk and dv are overwritten, never
// read, and must not overlap the inputs. The feature map must implement
// DifferentiableMap (ELU and package performer's maps do); with any other
// Backward returns an error wrapping attn.ErrUnsupported.
//
// # Gradients
//
// Write each feature row in the map's log-scaled form φ(x) = exp(ℓ)·ψ
// (ℓ = 0 for maps that are not log-scaled) and let m_i be the stabiliser
// of Forward: the largest ℓ among the keys query i sees (0 for maps that
// are not log-scaled). The weight of key j for query i is then
// A_ij = exp(ℓq_i + m_i)·w_ij·ψq_i·ψk_j with w_ij = exp(ℓk_j − m_i) ≤ 1,
// and the row's normaliser exp(ℓq_i + m_i)·den_i with
// den_i = Σ_j w_ij ψq_i·ψk_j. The query's own scale cancels in out, and
// with û_i = [dO_i, −dO_i·out_i] / den_i and v'_j = [v_j, 1] (D+1
// numbers each) the gradients are
//
//	exp(ℓq_i)·∂L/∂φ(q_i) = Σ_{j seen by i} w_ij (û_i·v'_j) ψk_j
//	exp(ℓk_j)·∂L/∂φ(k_j) = Σ_{i that see j} w_ij (û_i·v'_j) ψq_i
//	dv_j                 = Σ_{i that see j} w_ij (ψq_i·ψk_j) û_i,   first D numbers
//
// and dq, dk follow through DifferentiableMap.MapBackward. Every
// exponential formed is at most 1, none of a feature's scale alone, and
// the stabilisers are those of Forward, taken only over the keys a query
// sees, so causal gradients of a prefix's loss do not depend on later
// tokens.
// The sums over keys and over queries run over every query head of the
// kv head's group; K and V are never expanded.
//
// The masks are prefixes of the keys that only grow with the position, so
// the sum over keys is a prefix sum S' = Σ_j exp(ℓk_j − M) ψk_j v'_jᵀ and
// the sum over queries a suffix sum R = Σ_i exp(μ − m_i) ψq_i û_iᵀ: the
// pass walks the queries forward in chunks of Config.Chunk positions
// carrying S' (as Forward carries its state, M the running maximum of the
// keys' ℓ), and the keys backward in chunks carrying R (μ the stabiliser
// of the earliest query folded in, which sees every key of the chunk),
// each chunk adding a dense block for the pairs at its boundary, masked;
// every step is a simd.Gemm. Padded keys (Options.KVLen) are never read
// and get zero gradients.
//
// den_i is recomputed from the features rather than read off lse, whose
// float32 rounding is coarse where it is large. A row whose out Forward set to 0 (lse
// −Inf: it saw no key, or its normaliser was not a positive float32)
// contributes nothing and gets dq 0, as does a row whose lse is NaN.
// Options.Scale is passed to the feature map, as in Forward.
//
// The sums hold û_i, which grows as 1/den_i. Where den_i is within a few
// orders of magnitude of the float32 underflow (features of a query and
// of its keys that peak in different places by some 80 in the exponent:
// random features of inputs far beyond unit scale), they can overflow and
// the gradients that row touches become Inf or NaN, although the true
// gradient is bounded; Forward still computes such a row.
//
// # Cost and determinism
//
// About 2 to 3 times the forward's flops. Per query head and position,
// with D' = D+1: 4·F·D' for the query pass (folding keys into S' and
// applying it) and as much for the key pass (folding queries into R, and
// the products giving dv and the keys' feature gradients), plus the
// feature map of every query and key again and its MapBackward (for
// random features a product as large as the map's), plus 6·C·(F+D) for
// the chunks' dense blocks when causal; with a log-scaled map the dense
// blocks also take an exponential per weight, as Forward's do.
// BenchmarkBackward (and package performer's BenchmarkBackwardRatio)
// measures the time against the forward's. The work is split over (batch
// row, kv head) pairs, the query pass and the key pass of a pair being
// separate tasks; each output is written by one task in a fixed order, so
// the result does not depend on the worker count. Extra memory is
// O((B·H·N + B·Hkv·M)·(F+D)): ψ(q), û and ψ(k), v' as the products read
// them (û and v' also transposed), reused from one call to the next, plus
// O(C·(C+F+D) + F·D) per worker.
//
// Errors wrap attn.ErrShape or attn.ErrInput as for Forward (a nil lse or
// a wrong length of dout, dq, dk or dv is an attn.ErrShape error, and so
// are operands of one kv head past MaxStateBytes); a cancelled ctx stops
// the pass and returns its error, the outputs then being partly written.
func (a *Attention) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	_, err := a.BackwardSkipped(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv)
	return err
}

// BackwardSkipped is Backward that also returns, in increasing order, the
// rows (indices into lse) that see keys and have a finite lse but whose
// normaliser under the feature map is not a positive float32. Forward
// gives such a row out 0 and lse −Inf, so a finite lse means out came from
// elsewhere: package performer computes these rows exactly, and adds
// their exact gradients to those of the other rows. Backward leaves them
// out: they contribute nothing, and their dq is 0.
func (a *Attention) BackwardSkipped(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) ([]int, error) {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return nil, err
	}
	fm, ok := a.fm.(DifferentiableMap)
	if !ok {
		return nil, fmt.Errorf("%w: linear: Backward needs a feature map with MapBackward (a DifferentiableMap), not %T", attn.ErrUnsupported, a.fm)
	}
	nf := fm.Features(s.D)
	if nf < 1 {
		return nil, fmt.Errorf("%w: linear: feature map gives %d features for head size %d", attn.ErrInput, nf, s.D)
	}
	g := &gradPass{
		s: s, o: o, q: q, k: k, v: v, out: out, lse: lse, dout: dout, dq: dq, dk: dk, dv: dv,
		fm: fm, logScaled: fm.LogScaled(), scale: o.ScaleFor(s.D),
		c: a.chunk, nf: nf, f: pad(nf), e: pad(s.D + 1), dp: pad(s.D),
		np: pad(s.N) + simd.Panel, mp: pad(s.M) + simd.Panel,
	}
	if n, ok := g.pairFloats(); !ok || n > MaxStateBytes/4 {
		return nil, fmt.Errorf("%w: linear: the backward operands of one kv head (%d query heads × %d positions, %d keys, %d features, head size %d) need more than MaxStateBytes = %d bytes",
			attn.ErrShape, s.Group(), s.N, s.M, nf, s.D, MaxStateBytes)
	}
	pairs := s.B * s.HKV
	g.pairs = make([]gradPair, pairs)
	procs := runtime.GOMAXPROCS(0)
	var err error
	if nw := o.WorkerCount(procs, pairs); pairs >= 2*nw {
		// Enough pairs to keep the workers busy one pair each: a pair's
		// operands are used while they are still in cache, and its slab
		// goes back to the pool for the next pair, so that the pass
		// writes the same memory again rather than megabytes more.
		err = parallel.For(ctx, nw, pairs, g.newWork, func(w *gradWork, n int) error {
			g.prepare(n)
			defer g.release(n)
			if err := g.queries(ctx, w, n); err != nil {
				return err
			}
			return g.keys(ctx, w, n)
		})
	} else {
		// Few pairs: the operands of them all first, then their
		// queries and keys as separate tasks, twice the parallelism.
		err = parallel.For(ctx, nw, pairs,
			func() struct{} { return struct{}{} },
			func(_ struct{}, n int) error { g.prepare(n); return nil })
		if err == nil {
			err = parallel.For(ctx, o.WorkerCount(procs, 2*pairs), 2*pairs,
				g.newWork,
				func(w *gradWork, n int) error {
					if n%2 == 0 {
						return g.queries(ctx, w, n/2)
					}
					return g.keys(ctx, w, n/2)
				})
		}
		for i := range g.pairs {
			g.release(i)
		}
	}
	if err != nil {
		return nil, err
	}
	var skipped []int
	for i := range g.pairs {
		// Pairs are in row order and each lists its rows in order.
		skipped = append(skipped, g.pairs[i].skipped...)
	}
	return skipped, nil
}

// gradPass is one Backward call's state.
type gradPass struct {
	s                       attn.Shape
	o                       attn.Options
	q, k, v, out, lse, dout []float32
	dq, dk, dv              []float32
	fm                      DifferentiableMap
	logScaled               bool
	scale                   float32
	c                       int // chunk
	nf                      int // features F
	f, e, dp                int // F, D+1 and D, padded to simd.Panel
	np, mp                  int // strides of the transposed arrays: N and M padded, plus a panel
	pairs                   []gradPair
}

// gradPair holds one (batch row, kv head)'s operands, laid out as the
// products read them; columns and rows past the data hold 0.
type gradPair struct {
	phiQ []float32 // [G][N][f]: ψ(q) of the group's heads
	u    []float32 // [G][N][e]: û
	uT   []float32 // [G][e][np]: û transposed
	phiK []float32 // [M][f]: ψ(k), keys before the key length only
	vx   []float32 // [M][e]: v' = [v, 1]
	vxT  []float32 // [e][mp]: v' transposed
	lk   []float32 // [M]: the keys' log scales (log-scaled maps only)
	mq   []float32 // [N]: each position's stabiliser m_i (log-scaled maps only)
	// skipped lists the rows BackwardSkipped returns.
	skipped []int
	// slab holds the arrays above, from slabPool.
	slab *[]float32
}

// slabPool keeps the pairs' operands between Backward calls. They are
// megabytes a pair. Allocated afresh at every call, their pages were
// faulted in and zeroed by the operating system each time, and the
// feature map writing them took several times as long as on memory
// already mapped (results/2026-12-07, "Backward passes of linear
// attention").
var slabPool sync.Pool

// getSlab returns n zeroed float32 from slabPool, or new ones.
func getSlab(n int) *[]float32 {
	if p, ok := slabPool.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		clear(*p)
		return p
	}
	p := make([]float32, n)
	return &p
}

// release returns pair n's slab, if it has one, to slabPool.
func (g *gradPass) release(n int) {
	if sl := g.pairs[n].slab; sl != nil {
		slabPool.Put(sl)
		g.pairs[n].slab = nil
	}
}

// pairFloats returns the float32s prepare allocates for one pair (ints
// counted as one), or false if the count overflows.
func (g *gradPass) pairFloats() (int, bool) {
	const limit = math.MaxInt / 8
	mul := func(xs ...int) int {
		p := 1
		for _, x := range xs {
			if x != 0 && p > limit/x {
				return limit
			}
			p *= x
		}
		return p
	}
	s, gs := g.s, g.s.Group()
	parts := []int{
		mul(gs, s.N, g.f+g.e+1), // phiQ, u, den
		mul(gs, g.np, g.e),      // uT
		mul(s.M, g.f+g.e+1),     // phiK, vx, lk
		mul(g.e, g.mp),          // vxT
		mul(3, s.N),             // mq, query log scales, visible ends
	}
	n := 0
	for _, x := range parts {
		if x >= limit || n > limit-x {
			return 0, false
		}
		n += x
	}
	return n, true
}

// prepare computes the operands of pair n: the features, each position's
// stabiliser, each row's normaliser den_i recomputed from the features,
// and û.
func (g *gradPass) prepare(n int) {
	s, d, f, e := g.s, g.s.D, g.f, g.e
	gs := s.Group()
	b, kvh := n/s.HKV, n%s.HKV
	p := &g.pairs[n]
	size := gs*s.N*(f+e) + gs*e*g.np + s.M*(f+e) + e*g.mp
	if g.logScaled {
		size += s.M + s.N
	}
	p.slab = getSlab(size)
	slab := *p.slab
	take := func(n int) []float32 {
		x := slab[:n:n]
		slab = slab[n:]
		return x
	}
	p.phiQ = take(gs * s.N * f)
	p.u = take(gs * s.N * e)
	p.uT = take(gs * e * g.np)
	p.phiK = take(s.M * f)
	p.vx = take(s.M * e)
	p.vxT = take(e * g.mp)

	kend := g.o.KeyEnd(s, b)
	base := n * s.M * d
	var lk, lq []float32
	if g.logScaled {
		p.lk = take(s.M)
		p.mq = take(s.N)
		lk, lq = p.lk[:kend], make([]float32, s.N)
	}
	g.fm.Map(p.phiK, f, lk, g.k[base:][:kend*d], kend, d, g.scale, true)
	clearCols(p.phiK, f, g.nf, kend)
	for j := range kend {
		copy(p.vx[j*e:], g.v[base+j*d:][:d])
		p.vx[j*e+d] = 1
	}
	transpose(p.vxT, g.mp, p.vx, e, kend, d+1)

	ends := make([]int, s.N)
	for i := range ends {
		ends[i] = g.o.VisibleKeys(s, b, i)
	}
	if g.logScaled {
		// m_i, the running maximum of Forward over the keys i sees.
		m, j := negInf, 0
		for i, end := range ends {
			for ; j < end; j++ {
				m = max(m, lk[j])
			}
			p.mq[i] = m
		}
	}
	for hh := range gs {
		row0 := (b*s.H + kvh*gs + hh) * s.N
		phi := p.phiQ[hh*s.N*f:][:s.N*f]
		g.fm.Map(phi, f, lq, g.q[row0*d:][:s.N*d], s.N, d, g.scale, false)
		clearCols(phi, f, g.nf, s.N)
	}

	// den_i = ψq_i·z_i with z_i = Σ_{j seen by i} exp(ℓk_j − m_i) ψk_j,
	// z carried along the positions and rescaled when m grows.
	den := make([]float32, gs*s.N)
	z := make([]float32, f)
	zm, cur := negInf, 0
	for i, end := range ends {
		if end > cur {
			c := float32(1)
			if g.logScaled {
				m := p.mq[i]
				if cur > 0 && m > zm {
					scaleBy(z, exp32(zm-m))
				}
				zm = m
			}
			for j := cur; j < end; j++ {
				if g.logScaled {
					c = exp32(lk[j] - zm)
				}
				simd.Axpy(c, p.phiK[j*f:][:f], z)
			}
			cur = end
		}
		if end == 0 {
			continue
		}
		for hh := range gs {
			den[hh*s.N+i] = simd.Dot(p.phiQ[(hh*s.N+i)*f:][:f], z)
		}
	}

	for hh := range gs {
		row0 := (b*s.H + kvh*gs + hh) * s.N
		u := p.u[hh*s.N*e:][:s.N*e]
		for i, end := range ends {
			row := row0 + i
			if end == 0 || !(g.lse[row] > negInf) {
				// Forward gave the row the constant out 0 (or NaN).
				continue
			}
			dn := den[hh*s.N+i]
			inv := 1 / dn
			if !(dn > 0) || isInf(inv) {
				p.skipped = append(p.skipped, row)
				continue
			}
			gr := g.dout[row*d:][:d]
			ui := u[i*e:][:e]
			for c, x := range gr {
				ui[c] = x * inv
			}
			ui[d] = -simd.Dot(gr, g.out[row*d:][:d]) * inv
		}
		transpose(p.uT[hh*e*g.np:], g.np, u, e, s.N, d+1)
	}
}

// clearCols zeroes columns [from, ld) of the rows×ld matrix x: a map may
// leave scratch there, and the products read whole padded rows.
func clearCols(x []float32, ld, from, rows int) {
	if from >= ld {
		return
	}
	for r := range rows {
		clear(x[r*ld+from : (r+1)*ld])
	}
}

// gradWork is one worker's scratch: O(C·(C+F+D) + F·D) floats.
type gradWork struct {
	st   []float32 // [e][f]: S'ᵀ, or Rᵀ
	r    []float32 // [f][e]: R
	blk  []float32 // [c][cp]: a dense block
	blk2 []float32 // [c][cp]: a second dense block
	accF []float32 // [c][f]: the features' gradients of a chunk
	accE []float32 // [c][e]: dv of a chunk
	ks   []float32 // [c][f]: key features scaled for S'
	us   []float32 // [c][e]: û scaled for R
	ex   []float32 // [cp]: exponents, then weights
	dx   []float32 // [c][dp]: MapBackward's output
	ends []int     // [c]: visible key ends of a chunk's rows
}

func (g *gradPass) newWork() *gradWork {
	cp := pad(g.c)
	return &gradWork{
		st:   make([]float32, g.e*g.f),
		r:    make([]float32, g.f*g.e),
		blk:  make([]float32, g.c*cp),
		blk2: make([]float32, g.c*cp),
		accF: make([]float32, g.c*g.f),
		accE: make([]float32, g.c*g.e),
		ks:   make([]float32, g.c*g.f),
		us:   make([]float32, g.c*g.e),
		ex:   make([]float32, cp),
		dx:   make([]float32, g.c*g.dp),
		ends: make([]int, g.c),
	}
}

// weighRow multiplies x[t] by exp(lk[t] − mi): a query row's weights w_ij
// over consecutive keys.
func (w *gradWork) weighRow(x, lk []float32, mi float32) {
	ex := w.ex[:len(x)]
	for t := range ex {
		ex[t] = lk[t] - mi
	}
	simd.Exp(ex, ex)
	mulInto(x, ex)
}

// weighCol multiplies x[t] by exp(lkj − mq[t]): a key's weights w_ij over
// consecutive queries. The weights stay in w.ex for a second block.
func (w *gradWork) weighCol(x []float32, lkj float32, mq []float32) {
	ex := w.ex[:len(x)]
	for t := range ex {
		ex[t] = lkj - mq[t]
	}
	simd.Exp(ex, ex)
	mulInto(x, ex)
}

// queries computes dq for the group of pair n: the queries forward in
// chunks, with S'ᵀ = Σ exp(ℓk_j − M) v'_j ψk_jᵀ over the keys every row of
// the chunk sees, and a masked block for the keys only some rows see.
func (g *gradPass) queries(ctx context.Context, w *gradWork, n int) error {
	s, d, f, e, c := g.s, g.s.D, g.f, g.e, g.c
	cp := pad(c)
	gs := s.Group()
	b, kvh := n/s.HKV, n%s.HKV
	p := &g.pairs[n]
	st := w.st
	clear(st)
	folded := 0  // keys [0, folded) are in S'
	sm := negInf // S' stabiliser M: the largest ℓ of the keys folded in
	for i0 := 0; i0 < s.N; i0 += c {
		if err := ctx.Err(); err != nil {
			return err
		}
		nr := min(c, s.N-i0)
		for r := range nr {
			w.ends[r] = g.o.VisibleKeys(s, b, i0+r)
		}
		ea, eb := w.ends[0], w.ends[nr-1] // every row sees [0, ea), some up to eb
		if ea > folded {
			if g.logScaled {
				// The keys [0, ea) are those position i0 sees.
				m := p.mq[i0]
				if folded > 0 && m > sm {
					scaleBy(st, exp32(sm-m))
				}
				sm = m
				for j0 := folded; j0 < ea; j0 += c {
					nk := min(c, ea-j0)
					ks := w.ks[:nk*f]
					copy(ks, p.phiK[j0*f:][:nk*f])
					for jj := range nk {
						scaleBy(ks[jj*f:][:f], exp32(p.lk[j0+jj]-m))
					}
					simd.Gemm(d+1, f, nk, p.vxT[j0:], g.mp, ks, f, st, f, true)
				}
			} else {
				simd.Gemm(d+1, f, ea-folded, p.vxT[folded:], g.mp, p.phiK[folded*f:], f, st, f, true)
			}
			folded = ea
		}
		for hh := range gs {
			u := p.u[(hh*s.N+i0)*e:]
			acc := w.accF[:nr*f]
			simd.Gemm(nr, f, d+1, u, e, st, f, acc, f, false)
			if g.logScaled && folded > 0 {
				for r := range nr {
					if mi := p.mq[i0+r]; mi > sm {
						scaleBy(acc[r*f:][:f], exp32(sm-mi))
					}
				}
			}
			for j0 := ea; j0 < eb; j0 += c {
				nb := min(c, eb-j0)
				// W = û·v'ᵀ over keys [j0, j0+nb), each row's invisible
				// keys set to 0 and the visible ones weighted by w_ij,
				// then the features' gradients += W·ψ(k).
				simd.Gemm(nr, pad(nb), d+1, u, e, p.vxT[j0:], g.mp, w.blk, cp, false)
				for r := range nr {
					vis := min(max(w.ends[r]-j0, 0), nb)
					br := w.blk[r*cp:]
					clear(br[vis:nb])
					if g.logScaled && vis > 0 {
						w.weighRow(br[:vis], p.lk[j0:j0+vis], p.mq[i0+r])
					}
				}
				simd.Gemm(nr, f, nb, w.blk, cp, p.phiK[j0*f:], f, acc, f, true)
			}
			row0 := (b*s.H+kvh*gs+hh)*s.N + i0
			dx := w.dx[:nr*g.dp]
			g.fm.MapBackward(dx, g.dp, acc, p.phiQ[(hh*s.N+i0)*f:][:nr*f], f, g.q[row0*d:][:nr*d], nr, d, g.scale, false)
			for r := range nr {
				copy(g.dq[(row0+r)*d:][:d], dx[r*g.dp:][:d])
			}
		}
	}
	return nil
}

// keys computes dk and dv of pair n: the keys backward in chunks, with
// R = Σ exp(μ − m_i) ψq_i û_iᵀ over the queries (of every head of the
// group) that see every key of the chunk, and a masked block for the
// queries that see only some.
func (g *gradPass) keys(ctx context.Context, w *gradWork, n int) error {
	s, d, f, e, c := g.s, g.s.D, g.f, g.e, g.c
	cp := pad(c)
	gs := s.Group()
	b := n / s.HKV
	p := &g.pairs[n]
	kend := g.o.KeyEnd(s, b)
	base := n * s.M * d
	clear(g.dk[base+kend*d : base+s.M*d])
	clear(g.dv[base+kend*d : base+s.M*d])
	// start(j) is the first query that sees key j: visible ends never fall
	// with the position, so the queries that see j are [start(j), N).
	start := func(j int) int {
		return sort.Search(s.N, func(i int) bool { return g.o.VisibleKeys(s, b, i) > j })
	}
	// Rᵀ = Σ exp(μ − m_i) û_i ψq_iᵀ is carried in w.st (rows past D+1
	// stay 0), R in w.r for the product that gives dv.
	st := w.st
	clear(st)
	clear(w.r)
	folded := s.N // queries [folded, N) are in R
	var mu float32
	for j0 := (kend - 1) / c * c; j0 >= 0 && kend > 0; j0 -= c {
		if err := ctx.Err(); err != nil {
			return err
		}
		j1 := min(j0+c, kend)
		nk := j1 - j0
		ia, ib := start(j0), start(j1-1) // [ib, N) see the whole chunk, [ia, ib) part of it
		if ib < folded {
			if g.logScaled {
				// Stabilisers rise with the position: the smallest of
				// the queries folded in is that of the earliest, ib.
				m := p.mq[ib]
				if folded < s.N && m < mu {
					scaleBy(st, exp32(m-mu))
				}
				mu = m
				for hh := range gs {
					for i := ib; i < folded; i += c {
						nr := min(c, folded-i)
						qs := w.ks[:nr*f]
						copy(qs, p.phiQ[(hh*s.N+i)*f:][:nr*f])
						for r := range nr {
							scaleBy(qs[r*f:][:f], exp32(m-p.mq[i+r]))
						}
						simd.Gemm(d+1, f, nr, p.uT[hh*e*g.np+i:], g.np, qs, f, st, f, true)
					}
				}
			} else {
				for hh := range gs {
					simd.Gemm(d+1, f, folded-ib, p.uT[hh*e*g.np+ib:], g.np, p.phiQ[(hh*s.N+ib)*f:], f, st, f, true)
				}
			}
			folded = ib
			transpose(w.r, e, st, f, d+1, f)
		}
		accF, accE := w.accF[:nk*f], w.accE[:nk*e]
		// dv needs the first D columns of accE only.
		simd.Gemm(nk, g.dp, f, p.phiK[j0*f:], f, w.r, e, accE, e, false)
		simd.Gemm(nk, f, d+1, p.vx[j0*e:], e, st, f, accF, f, false)
		if g.logScaled && folded < s.N {
			// ℓk_j ≤ μ: query ib sees key j.
			for jj := range nk {
				if x := exp32(p.lk[j0+jj] - mu); x != 1 {
					scaleBy(accE[jj*e:][:g.dp], x)
					scaleBy(accF[jj*f:][:f], x)
				}
			}
		}
		for hh := range gs {
			for r0 := ia; r0 < ib; r0 += c {
				nr := min(c, ib-r0)
				// Aᵀ = ψ(k)·ψ(q)ᵀ and (û·v'ᵀ)ᵀ = v'·ûᵀ for the chunk's
				// keys and queries [r0, r0+nr), each key's invisible
				// queries (a prefix) set to 0 and the visible ones
				// weighted by w_ij.
				// As products of rows (simd.DotRows), which read ψ(q)
				// and û as they are stored: a product with ψ(q)
				// transposed had to transpose it first, which took more
				// time than the product.
				simd.DotRows(w.blk, cp, p.phiK[j0*f:], f, nk, p.phiQ[(hh*s.N+r0)*f:], f, nr, f)
				simd.DotRows(w.blk2, cp, p.vx[j0*e:], e, nk, p.u[(hh*s.N+r0)*e:], e, nr, d+1)
				for r := range nr {
					w.ends[r] = g.o.VisibleKeys(s, b, r0+r)
				}
				first := 0
				for jj := range nk {
					for first < nr && w.ends[first] <= j0+jj {
						first++
					}
					b1, b2 := w.blk[jj*cp:][:nr], w.blk2[jj*cp:][:nr]
					clear(b1[:first])
					clear(b2[:first])
					if g.logScaled && first < nr {
						w.weighCol(b1[first:], p.lk[j0+jj], p.mq[r0+first:r0+nr])
						mulInto(b2[first:], w.ex[:nr-first])
					}
				}
				simd.Gemm(nk, g.dp, nr, w.blk, cp, p.u[(hh*s.N+r0)*e:], e, accE, e, true)
				simd.Gemm(nk, f, nr, w.blk2, cp, p.phiQ[(hh*s.N+r0)*f:], f, accF, f, true)
			}
		}
		row := base + j0*d
		dx := w.dx[:nk*g.dp]
		g.fm.MapBackward(dx, g.dp, accF, p.phiK[j0*f:][:nk*f], f, g.k[row:][:nk*d], nk, d, g.scale, true)
		for jj := range nk {
			copy(g.dk[row+jj*d:][:d], dx[jj*g.dp:][:d])
			copy(g.dv[row+jj*d:][:d], accE[jj*e:][:d])
		}
	}
	return nil
}
