package linear

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sort"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Backward computes the gradients of elu+1 linear attention. Given the
// inputs q, k, v of a forward pass, its out and lse (as Forward wrote
// them) and dout, the gradient of a loss with respect to out, it writes
// the gradients of the loss with respect to q, k and v into dq, dk and
// dv. Shape and options must be those of the forward pass; dq and dout
// are laid out like q, dk and dv like k. dq, dk and dv are overwritten,
// never read, and must not overlap the inputs. Only the default feature
// map, ELU, is supported; with any other Backward returns an error
// wrapping attn.ErrUnsupported.
//
// # Gradients
//
// With weights A_ij = φ(q_i)·φ(k_j) over the keys j query i sees, the
// normaliser den_i = Σ_j A_ij = exp(lse_i) and out_i = Σ_j A_ij v_j / den_i,
// the gradient of the loss with respect to A_ij is u'_i·v'_j, where
// u'_i = [dO_i / den_i, −dO_i·out_i / den_i] and v'_j = [v_j, 1] (D+1
// numbers each). Hence
//
//	dφ(q_i) = Σ_{j seen by i} (u'_i·v'_j) φ(k_j) = S'_i u'_i,   S'_i = Σ_{j seen by i} φ(k_j) v'_jᵀ
//	dφ(k_j) = Σ_{i that see j} (u'_i·v'_j) φ(q_i) = R_j v'_j,   R_j = Σ_{i that see j} φ(q_i) u'_iᵀ
//	dv_j    = Σ_{i that see j} A_ij dO_i/den_i = R_jᵀ φ(k_j), first D numbers
//
// and dq = dφ(q) ∘ φ'(q), dk = dφ(k) ∘ φ'(k), with φ'(x) = exp(x) below 0
// and 1 above, which is min(φ(x), 1). R_j sums over every query head of
// the kv head's group; K and V are never expanded.
//
// The masks are prefixes of the keys that only grow with the position, so
// S' is a prefix sum over keys and R a suffix sum over queries: the pass
// walks the queries forward in chunks of Config.Chunk positions carrying
// S' (as Forward carries S and z), and the keys backward in chunks
// carrying R, each chunk adding a dense block for the pairs at its
// boundary, masked; every step is a simd.Gemm. Padded keys (Options.KVLen)
// are never read and get zero gradients; a row with lse −Inf (it saw no
// key) contributes nothing and gets dq 0. Options.Scale is ignored, as in
// Forward.
//
// # Cost and determinism
//
// About 3 times the forward's flops: per query head and position
// 4·F·(D+1) for the query pass and as much for the key pass, plus
// 6·C·(F+D) for the chunks' dense blocks when causal (BenchmarkBackward
// measures the time against the forward's). The work is split
// over (batch row, kv head) pairs, the query pass and the key pass of a
// pair being separate tasks; each output is written by one task in a
// fixed order, so the result does not depend on the worker count. Extra
// memory is O((B·H·N + B·Hkv·M)·D): φ(q), u' and φ(k), v' as the products
// read them, plus O(C·(C+D)) per worker.
//
// Errors wrap attn.ErrShape or attn.ErrInput as for Forward (a nil lse or
// a wrong length of dout, dq, dk or dv is an attn.ErrShape error); a
// cancelled ctx stops the pass and returns its error, the outputs then
// being partly written.
func (a *Attention) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return err
	}
	if _, ok := a.fm.(ELU); !ok {
		return fmt.Errorf("%w: linear: Backward supports the elu+1 feature map only, not %T", attn.ErrUnsupported, a.fm)
	}
	g := &gradPass{
		s: s, o: o, q: q, k: k, v: v, out: out, lse: lse, dout: dout, dq: dq, dk: dk, dv: dv,
		c: a.chunk, f: pad(s.D), e: pad(s.D + 1),
		np: pad(s.N) + simd.Panel, mp: pad(s.M) + simd.Panel,
	}
	pairs := s.B * s.HKV
	g.pairs = make([]gradPair, pairs)
	procs := runtime.GOMAXPROCS(0)
	if err := parallel.For(ctx, o.WorkerCount(procs, pairs), pairs,
		func() struct{} { return struct{}{} },
		func(_ struct{}, n int) error { g.prepare(n); return nil }); err != nil {
		return err
	}
	return parallel.For(ctx, o.WorkerCount(procs, 2*pairs), 2*pairs,
		g.newWork,
		func(w *gradWork, n int) error {
			if n%2 == 0 {
				return g.queries(ctx, w, n/2)
			}
			return g.keys(ctx, w, n/2)
		})
}

// gradPass is one Backward call's state.
type gradPass struct {
	s                       attn.Shape
	o                       attn.Options
	q, k, v, out, lse, dout []float32
	dq, dk, dv              []float32
	c                       int // chunk
	f, e                    int // F = D and D+1, padded to simd.Panel
	np, mp                  int // strides of the transposed arrays: N and M padded, plus a panel
	pairs                   []gradPair
}

// gradPair holds one (batch row, kv head)'s operands, laid out as the
// products read them; columns and rows past the data hold 0.
type gradPair struct {
	phiQ  []float32 // [G][N][f]: φ(q) of the group's heads
	phiQT []float32 // [G][f][np]: φ(q) transposed
	u     []float32 // [G][N][e]: u'
	uT    []float32 // [G][e][np]: u' transposed
	phiK  []float32 // [M][f]: φ(k), keys before the key length only
	vx    []float32 // [M][e]: v' = [v, 1]
	vxT   []float32 // [e][mp]: v' transposed
}

// prepare computes the operands of pair n.
func (g *gradPass) prepare(n int) {
	s, d, f, e := g.s, g.s.D, g.f, g.e
	gs := s.Group()
	b, kvh := n/s.HKV, n%s.HKV
	p := &g.pairs[n]
	p.phiQ = make([]float32, gs*s.N*f)
	p.phiQT = make([]float32, gs*f*g.np)
	p.u = make([]float32, gs*s.N*e)
	p.uT = make([]float32, gs*e*g.np)
	p.phiK = make([]float32, s.M*f)
	p.vx = make([]float32, s.M*e)
	p.vxT = make([]float32, e*g.mp)
	for hh := range gs {
		row0 := (b*s.H + kvh*gs + hh) * s.N // first row of the head
		phi := p.phiQ[hh*s.N*f:][:s.N*f]
		ELU{}.Map(phi, f, nil, g.q[row0*d:][:s.N*d], s.N, d, 0, false)
		transpose(p.phiQT[hh*f*g.np:], g.np, phi, f, s.N, d)
		u := p.u[hh*s.N*e:][:s.N*e]
		for i := range s.N {
			l := float64(g.lse[row0+i])
			den := math.Exp(l)
			if !(den > 0) || math.IsInf(den, 1) {
				// The row saw no key (or its normaliser is unusable):
				// its output is the constant 0.
				continue
			}
			inv := float32(1 / den)
			gr := g.dout[(row0+i)*d:][:d]
			ui := u[i*e:][:e]
			for c, x := range gr {
				ui[c] = x * inv
			}
			ui[d] = -simd.Dot(gr, g.out[(row0+i)*d:][:d]) * inv
		}
		transpose(p.uT[hh*e*g.np:], g.np, u, e, s.N, d+1)
	}
	kend := g.o.KeyEnd(s, b)
	base := n * s.M * d
	ELU{}.Map(p.phiK, f, nil, g.k[base:][:kend*d], kend, d, 0, true)
	for j := range kend {
		copy(p.vx[j*e:], g.v[base+j*d:][:d])
		p.vx[j*e+d] = 1
	}
	transpose(p.vxT, g.mp, p.vx, e, kend, d+1)
}

// gradWork is one worker's scratch: O(C·(C+D) + D²) floats.
type gradWork struct {
	st   []float32 // [e][f]: S'ᵀ, or R transposed
	r    []float32 // [f][e]: R
	blk  []float32 // [c][cp]: a dense block
	blk2 []float32 // [c][cp]: a second dense block
	accF []float32 // [c][f]: dφ(q) or dφ(k) of a chunk
	accE []float32 // [c][e]: dv of a chunk
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
		ends: make([]int, g.c),
	}
}

// queries computes dq for the group of pair n: the queries forward in
// chunks, with S'ᵀ = Σ v'_j φ(k_j)ᵀ over the keys every row of the chunk
// sees, and a masked block for the keys only some rows see.
func (g *gradPass) queries(ctx context.Context, w *gradWork, n int) error {
	s, d, f, e, c := g.s, g.s.D, g.f, g.e, g.c
	cp := pad(c)
	gs := s.Group()
	b, kvh := n/s.HKV, n%s.HKV
	p := &g.pairs[n]
	st := w.st
	clear(st)
	folded := 0 // keys [0, folded) are in S'
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
			simd.Gemm(e, f, ea-folded, p.vxT[folded:], g.mp, p.phiK[folded*f:], f, st, f, true)
			folded = ea
		}
		for hh := range gs {
			u := p.u[(hh*s.N+i0)*e:]
			acc := w.accF[:nr*f]
			simd.Gemm(nr, f, e, u, e, st, f, acc, f, false)
			for j0 := ea; j0 < eb; j0 += c {
				nb := min(c, eb-j0)
				// W = u'·v'ᵀ over keys [j0, j0+nb), each row's invisible
				// keys set to 0, then dφ(q) += W·φ(k).
				simd.Gemm(nr, pad(nb), e, u, e, p.vxT[j0:], g.mp, w.blk, cp, false)
				for r := range nr {
					vis := min(max(w.ends[r]-j0, 0), nb)
					clear(w.blk[r*cp+vis : r*cp+nb])
				}
				simd.Gemm(nr, f, nb, w.blk, cp, p.phiK[j0*f:], f, acc, f, true)
			}
			row0 := (b*s.H+kvh*gs+hh)*s.N + i0
			phi := p.phiQ[(hh*s.N+i0)*f:]
			for r := range nr {
				gradChain(g.dq[(row0+r)*d:][:d], acc[r*f:][:d], phi[r*f:][:d])
			}
		}
	}
	return nil
}

// keys computes dk and dv of pair n: the keys backward in chunks, with
// R = Σ φ(q_i) u'_iᵀ over the queries (of every head of the group) that
// see every key of the chunk, and a masked block for the queries that see
// only some.
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
	clear(w.r)
	folded := s.N // queries [folded, N) are in R
	for j0 := (kend - 1) / c * c; j0 >= 0 && kend > 0; j0 -= c {
		if err := ctx.Err(); err != nil {
			return err
		}
		j1 := min(j0+c, kend)
		nk := j1 - j0
		ia, ib := start(j0), start(j1-1) // [ib, N) see the whole chunk, [ia, ib) part of it
		if ib < folded {
			for hh := range gs {
				simd.Gemm(f, e, folded-ib, p.phiQT[hh*f*g.np+ib:], g.np, p.u[(hh*s.N+ib)*e:], e, w.r, e, true)
			}
			folded = ib
		}
		transpose(w.st, f, w.r, e, f, e)
		accF, accE := w.accF[:nk*f], w.accE[:nk*e]
		simd.Gemm(nk, e, f, p.phiK[j0*f:], f, w.r, e, accE, e, false)
		simd.Gemm(nk, f, e, p.vx[j0*e:], e, w.st, f, accF, f, false)
		for hh := range gs {
			for r0 := ia; r0 < ib; r0 += c {
				nr := min(c, ib-r0)
				// Aᵀ = φ(k)·φ(q)ᵀ and (u'·v'ᵀ)ᵀ = v'·u'ᵀ for the chunk's
				// keys and queries [r0, r0+nr), each key's invisible
				// queries (a prefix) set to 0.
				simd.Gemm(nk, pad(nr), f, p.phiK[j0*f:], f, p.phiQT[hh*f*g.np+r0:], g.np, w.blk, cp, false)
				simd.Gemm(nk, pad(nr), e, p.vx[j0*e:], e, p.uT[hh*e*g.np+r0:], g.np, w.blk2, cp, false)
				for r := range nr {
					w.ends[r] = g.o.VisibleKeys(s, b, r0+r)
				}
				first := 0
				for jj := range nk {
					for first < nr && w.ends[first] <= j0+jj {
						first++
					}
					clear(w.blk[jj*cp:][:first])
					clear(w.blk2[jj*cp:][:first])
				}
				simd.Gemm(nk, e, nr, w.blk, cp, p.u[(hh*s.N+r0)*e:], e, accE, e, true)
				simd.Gemm(nk, f, nr, w.blk2, cp, p.phiQ[(hh*s.N+r0)*f:], f, accF, f, true)
			}
		}
		for jj := range nk {
			row := base + (j0+jj)*d
			gradChain(g.dk[row:][:d], accF[jj*f:][:d], p.phiK[(j0+jj)*f:][:d])
			copy(g.dv[row:][:d], accE[jj*e:][:d])
		}
	}
	return nil
}

// gradChain sets dst = dphi ∘ φ'(x) for φ = elu+1, from phi = φ(x):
// φ'(x) = exp(x) = φ(x) below 0 and 1 from 0 on, that is min(φ(x), 1).
func gradChain(dst, dphi, phi []float32) {
	dphi, phi = dphi[:len(dst)], phi[:len(dst)]
	for c := range dst {
		dst[c] = dphi[c] * min(phi[c], 1)
	}
}
