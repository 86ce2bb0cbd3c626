package hyper

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

var _ attn.Differentiable = (*Attention)(nil)

// Backward writes into dq, dk and dv the gradients of a loss with respect
// to q, k and v, given dout, its gradient with respect to out, and the out
// and lse that Forward wrote for the same shape, inputs and options. The
// gradient is that of the estimate Forward computed for this seed: the
// sortLSH buckets, key blocks and samples are drawn again from the seed,
// and are constants of the gradient, as are the sample weights.
//
// Every query attends, across the parts Forward merged by their lse (its
// key block, the samples outside it, the rectangles and leaves of the
// causal recursion), to a set of keys j with weights w_j (1 in a block, a
// leaf or an exact rectangle, rest/kept for a sample): out = Σ_j p_j·v_j
// with p_j = w_j·e^{s_j−L} and L = log Σ_j w_j·e^{s_j}, the lse Forward
// returned. Its gradient is that of softmax attention, with the merged L
// in p_j and the merged out in the row term D = rowsum(dout∘out), so each
// part's is the exact backward pass of package flash on that part's keys
// with L − log w_j for the row's lse: the causal leaves in one
// block-sparse call on the whole tensors, each job's key blocks in a
// block-diagonal one on its query rows gathered by block and its keys in
// sort order, and its samples in one more, each block's run of samples
// masked out. No buffer holds N·M values; the gathered rows go in chunks
// of a bounded size. The parts add into dq, dk and dv in a fixed order (the
// leaves, then the phases in turn, the jobs of a phase in turn and within
// a job the chunks in turn, blocks before samples), and each flash call
// is itself deterministic, so the result does not depend on
// Options.Workers.
//
// A call that Forward computes exactly (see Fallback) gets the exact
// gradient. Value-norm sampling whose estimate is used returns an error
// wrapping attn.ErrUnsupported: its output is a numerator and a
// normaliser from independent samples, clipped, not a softmax over
// weighted keys. Bad arguments return errors as Forward's do, a nil lse
// among them (attn.CheckBackward); a cancelled ctx returns its error, the
// gradients then being partly written. dq, dk and dv are overwritten,
// never read, and must not overlap the inputs.
func (a *Attention) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return err
	}
	if s.N > math.MaxInt32 || s.M > math.MaxInt32 || s.Group()*s.N > math.MaxInt32 {
		return fmt.Errorf("%w: hyper: lengths N = %d, M = %d (or N times the group of %d) past 2^31-1",
			attn.ErrUnsupported, s.N, s.M, s.Group())
	}
	if a.sampling == ValueNorm && a.Fallback(s, o) == "" {
		return fmt.Errorf("%w: hyper: no backward pass for value-norm sampling: its output is a numerator and a normaliser from independent samples, clipped, not a softmax over weighted keys",
			attn.ErrUnsupported)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return ctxErr(ctx, a.backward(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv))
}

// backward is Backward on checked arguments.
func (a *Attention) backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if a.exact(s.N, s.M) {
		return a.kn.Backward(ctx, s, q, k, v, out, lse, dout, o, nil, dq, dk, dv)
	}
	c := &call{
		a: a, s: s, o: o, q: q, k: k, v: v, out: out, lse: lse,
		scale: o.ScaleFor(s.D), grad: true,
	}
	leaves, phases := a.layout(s, o.Causal)
	if o.Causal {
		// The leaves write every entry of dq, dk and dv (0 where they see
		// nothing); the phases add to them.
		if err := a.kn.Backward(ctx, s, q, k, v, out, lse, dout, o, leaves, dq, dk, dv); err != nil {
			return err
		}
	}
	g := &grads{call: c, dout: dout, dq: dq, dk: dk, dv: dv}
	if !o.Causal {
		for _, x := range [][]float32{dq, dk, dv} {
			g.rows(len(x)/s.D, func(lo, hi int) { clear(x[lo*s.D : hi*s.D]) })
		}
	}
	if sc, ok := gatheredPool.Get().(*gathered); ok {
		g.gathered = *sc
	}
	defer func() {
		sc := g.gathered
		gatheredPool.Put(&sc)
	}()
	for _, ph := range phases {
		jobs, err := c.plan(ctx, ph)
		if err != nil {
			return err
		}
		for _, j := range jobs {
			if j.exact {
				err = g.exact(ctx, j)
			} else {
				err = g.approx(ctx, j)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// gradChunkRows bounds the query rows of one flash call on gathered rows,
// and so the memory of the gathered copies and of the kernel's partials.
// It depends on nothing else, so neither do the sums. A variable so that
// the tests can cut small inputs into several chunks.
var gradChunkRows = 8192

// grads is one Backward call's state beyond the plan: the gradients it
// adds to and the gathered copies of one chunk.
type grads struct {
	*call
	dout, dq, dk, dv []float32
	gathered
}

// gathered holds the gathered copies of a chunk. Every use writes what it
// reads, so they are kept from one Backward call to the next
// (gatheredPool): tens of megabytes at 131072 positions, allocated afresh
// each call before.
type gathered struct {
	// Gathered query rows [R][D]: queries, outputs, output gradients,
	// the rows' lse (twice: the sampled part's less its log weight), and
	// the kernel's dQ.
	gq, gout, gdout, glse, glse2, gdq []float32
	// Gathered keys [nk][D] and their gradients.
	gk, gv, gdk, gdv []float32
}

var gatheredPool sync.Pool // of *gathered

// opts are the options of the flash calls on gathered rows: no mask but
// the pattern's, the call's scale and workers.
func (g *grads) opts() attn.Options {
	return attn.Options{Scale: g.scale, Workers: g.o.Workers}
}

// exact adds the gradient of an exact rectangle: the group's query heads
// [q0, q1) against the rectangle's keys, unmasked.
func (g *grads) exact(ctx context.Context, j *job) error {
	s := g.s
	d, gr := s.D, s.Group()
	nq := j.r.q1 - j.r.q0
	rows := gr * nq
	g.growRows(rows)
	g.rows(rows, func(lo, hi int) { g.headRuns(j, lo, hi, g.gather) })
	kv := ((j.b*s.HKV+j.kvh)*s.M + j.r.k0) * d
	n := j.nk * d
	g.gdk, g.gdv = grow(g.gdk, n), grow(g.gdv, n)
	shape := attn.Shape{B: 1, H: gr, HKV: 1, N: nq, M: j.nk, D: d}
	if err := g.a.kn.Backward(ctx, shape, g.gq, g.k[kv:kv+n], g.v[kv:kv+n], g.gout, g.glse, g.gdout,
		g.opts(), nil, g.gdq, g.gdk, g.gdv); err != nil {
		return err
	}
	g.rows(rows, func(lo, hi int) {
		g.headRuns(j, lo, hi, func(x, row, n int) {
			simd.Axpy(1, g.gdq[x*d:][:n*d], g.dq[row*d:][:n*d])
		})
	})
	g.rows(j.nk, func(lo, hi int) {
		simd.Axpy(1, g.gdk[lo*d:hi*d], g.dk[kv+lo*d:kv+hi*d])
		simd.Axpy(1, g.gdv[lo*d:hi*d], g.dv[kv+lo*d:kv+hi*d])
	})
	return nil
}

// headRuns calls f(x, row, n) for the rows [lo, hi) of exact job j's
// gathered queries (the group's heads one after the other, the job's
// query positions each) in runs of n that are consecutive in the tensors
// too: gathered row x is row row of q.
func (g *grads) headRuns(j *job, lo, hi int, f func(x, row, n int)) {
	s := g.s
	nq := j.r.q1 - j.r.q0
	for x := lo; x < hi; {
		hh, t := x/nq, x%nq
		n := min(hi-x, nq-t)
		f(x, (j.b*s.H+j.kvh*s.Group()+hh)*s.N+j.r.q0+t, n)
		x += n
	}
}

// growRows sizes the gathered query rows for n rows.
func (g *grads) growRows(n int) {
	d := g.s.D
	g.gq, g.gout, g.gdout, g.gdq = grow(g.gq, n*d), grow(g.gout, n*d), grow(g.gdout, n*d), grow(g.gdq, n*d)
	g.glse, g.glse2 = grow(g.glse, n), grow(g.glse2, n)
}

// gather copies n consecutive rows from row of Q, out, dout and lse to
// gathered row at.
func (g *grads) gather(at, row, n int) {
	d := g.s.D
	copy(g.gq[at*d:][:n*d], g.q[row*d:])
	copy(g.gout[at*d:][:n*d], g.out[row*d:])
	copy(g.gdout[at*d:][:n*d], g.dout[row*d:])
	copy(g.glse[at:at+n], g.lse[row:])
}

// approx adds the gradient of an approximate job, its query rows (in the
// order of j.rows, grouped by key block) in chunks of gradChunkRows. A
// key block whose rows two chunks share gets the sum of both.
func (g *grads) approx(ctx context.Context, j *job) error {
	for r0 := 0; r0 < len(j.rows); r0 += gradChunkRows {
		if err := g.chunk(ctx, j, r0, min(r0+gradChunkRows, len(j.rows))); err != nil {
			return err
		}
	}
	return nil
}

// chunk adds the gradient of the rows j.rows[r0:r1]: of their key blocks,
// then of their samples.
func (g *grads) chunk(ctx context.Context, j *job, r0, r1 int) error {
	s, a := g.s, g.a
	d, gr := s.D, s.Group()
	nr := r1 - r0
	g.growRows(nr)
	g.rows(nr, func(lo, hi int) {
		for t, x := range j.rows[r0+lo : r0+hi] {
			g.gather(lo+t, g.queryRow(j, int(x), gr), 1)
		}
	})
	// The blocks [bl0, bl1) the rows fall in, and where each one's rows
	// start among them (clipped to the chunk).
	bl0, bl1 := 0, 1
	if a.block > 0 {
		bl0 = sort.Search(j.nb, func(bl int) bool { return int(j.start[bl+1]) > r0 })
		bl1 = sort.Search(j.nb, func(bl int) bool { return int(j.start[bl]) >= r1 })
	}
	nbc := bl1 - bl0
	rs := make([]int, nbc+1)
	for i := range rs {
		rs[i] = min(max(int(j.start[bl0+i])-r0, 0), nr)
	}
	rs[0], rs[nbc] = 0, nr
	kv := (j.b*s.HKV+j.kvh)*s.M + j.r.k0 // first key row of the job
	shape := attn.Shape{B: 1, H: 1, HKV: 1, N: nr, D: d}

	if a.block > 0 {
		// Block part: the keys of the blocks in sort order, each block's
		// rows seeing its keys only.
		ks := make([]int, nbc+1)
		for i := range nbc {
			ks[i], _ = span(j.nk, j.nb, bl0+i)
		}
		_, ks[nbc] = span(j.nk, j.nb, bl1-1)
		ka := ks[0]
		for i := range ks {
			ks[i] -= ka
		}
		nk := ks[nbc]
		g.growKeys(nk)
		g.rows(nk, func(lo, hi int) {
			for p := lo; p < hi; p++ {
				key := kv + j.key(ka+p)
				copy(g.gk[p*d:][:d], g.k[key*d:][:d])
				copy(g.gv[p*d:][:d], g.v[key*d:][:d])
			}
		})
		shape.M = nk
		pat := &blockPattern{shift: nk - nr, rows: rs, keys: ks}
		if err := a.kn.Backward(ctx, shape, g.gq, g.gk[:nk*d], g.gv[:nk*d], g.gout, g.glse, g.gdout,
			g.opts(), pat, g.gdq, g.gdk[:nk*d], g.gdv[:nk*d]); err != nil {
			return err
		}
		g.scatterQ(j, r0, r1)
		g.rows(nk, func(lo, hi int) {
			for p := lo; p < hi; p++ {
				key := kv + j.key(ka+p)
				simd.Axpy(1, g.gdk[p*d:][:d], g.dk[key*d:][:d])
				simd.Axpy(1, g.gdv[p*d:][:d], g.dv[key*d:][:d])
			}
		})
	}

	// Sampled part: every row against the job's samples but the run inside
	// its own block, with the row's lse less the samples' log weight, so
	// that the kernel's probabilities are w·e^{s−L}.
	ns := len(j.uniform)
	if ns == 0 {
		return nil
	}
	sp := &samplePattern{shift: ns - nr, rows: rs, lo: make([]int, nbc), hi: make([]int, nbc)}
	sees := false
	copy(g.glse2, g.glse)
	for i := range nbc {
		bl := bl0 + i
		if a.block <= 0 {
			bl = -1
		}
		o := j.outside(bl)
		sp.lo[i], sp.hi[i] = o.lo, o.hi
		if o.kept == 0 {
			sp.lo[i], sp.hi[i] = 0, ns // nothing to see
			continue
		}
		sees = sees || rs[i] < rs[i+1]
		for r := rs[i]; r < rs[i+1]; r++ {
			g.glse2[r] -= o.logw // -Inf stays -Inf
		}
	}
	if !sees {
		return nil
	}
	g.growKeys(ns)
	shape.M = ns
	if err := a.kn.Backward(ctx, shape, g.gq, j.uniK, j.uniV, g.gout, g.glse2, g.gdout,
		g.opts(), sp, g.gdq, g.gdk[:ns*d], g.gdv[:ns*d]); err != nil {
		return err
	}
	g.scatterQ(j, r0, r1)
	g.rows(ns, func(lo, hi int) {
		for t, p := range j.uniform[lo:hi] {
			key := kv + j.key(int(p))
			simd.Axpy(1, g.gdk[(lo+t)*d:][:d], g.dk[key*d:][:d])
			simd.Axpy(1, g.gdv[(lo+t)*d:][:d], g.dv[key*d:][:d])
		}
	})
	return nil
}

// growKeys sizes the gathered keys for n keys.
func (g *grads) growKeys(n int) {
	d := g.s.D
	g.gk, g.gv, g.gdk, g.gdv = grow(g.gk, n*d), grow(g.gv, n*d), grow(g.gdk, n*d), grow(g.gdv, n*d)
}

// scatterQ adds the gathered dQ of rows j.rows[r0:r1] to dq.
func (g *grads) scatterQ(j *job, r0, r1 int) {
	d, gr := g.s.D, g.s.Group()
	g.rows(r1-r0, func(lo, hi int) {
		for t, x := range j.rows[r0+lo : r0+hi] {
			row := g.queryRow(j, int(x), gr)
			simd.Axpy(1, g.gdq[(lo+t)*d:][:d], g.dq[row*d:][:d])
		}
	})
}

// rowSpan is the least number of rows that rows hands one goroutine:
// enough that starting it costs little beside the copies. A variable so
// that the tests can split small inputs.
var rowSpan = 1024

// rows runs f on the ranges [lo, hi) that cover [0, n), on the call's
// workers. The gathers and scatters are memory-bound copies that would
// otherwise run on one core between the parallel kernel calls. Every f
// here writes each destination row once (a chunk's rows, a block's keys
// and the samples are distinct), so the result is the same however the
// ranges fall.
func (g *grads) rows(n int, f func(lo, hi int)) {
	parts := n / rowSpan
	nw := g.o.WorkerCount(runtime.GOMAXPROCS(0), parts)
	if nw <= 1 {
		f(0, n)
		return
	}
	// The errors are ctx's alone, and the caller's next kernel call
	// reports a cancellation.
	_ = parallel.ForWorker(context.Background(), nw, parts, func(_, i int) error {
		f(i*n/parts, (i+1)*n/parts)
		return nil
	})
}

// blockPattern is the block-diagonal pattern of a chunk's key blocks: the
// query rows [rows[i], rows[i+1]) see the keys [keys[i], keys[i+1]).
// Query row r is at position shift + r.
type blockPattern struct {
	shift      int
	rows, keys []int
}

var _ flash.Pattern = (*blockPattern)(nil)

// blockOf returns the block of query row r, the last one starting at or
// before it (blocks without rows are skipped so).
func blockOf(rows []int, r int) int {
	return sort.SearchInts(rows, r+1) - 1
}

func (bp *blockPattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	r0, r1 := max(p0-bp.shift, 0), min(p1-bp.shift, bp.rows[len(bp.rows)-1])
	if r0 >= r1 {
		return dst
	}
	i0, i1 := blockOf(bp.rows, r0), blockOf(bp.rows, r1-1)
	for i := i0; i <= i1; i++ {
		if bp.rows[i] < bp.rows[i+1] && bp.keys[i] < bp.keys[i+1] {
			dst = append(dst, flash.Range{Lo: bp.keys[i], Hi: bp.keys[i+1], Full: i0 == i1})
		}
	}
	return dst
}

func (bp *blockPattern) Visible(p, j int) bool {
	i := blockOf(bp.rows, p-bp.shift)
	return bp.keys[i] <= j && j < bp.keys[i+1]
}

// MaskRow hides from the query at position p the keys outside its block.
func (bp *blockPattern) MaskRow(p, j0 int, s []float32) {
	i := blockOf(bp.rows, p-bp.shift)
	hideOutside(s, j0, bp.keys[i], bp.keys[i+1])
}

// hideOutside sets s[j] to -Inf for the keys j0+j outside [lo, hi).
func hideOutside(s []float32, j0, lo, hi int) {
	for j := range s {
		if key := j0 + j; key < lo || key >= hi {
			s[j] = negInf
		}
	}
}

// samplePattern is the sampled part of a chunk: the query rows [rows[i],
// rows[i+1]) see every sample but the run [lo[i], hi[i]) inside their own
// block. Query row r is at position shift + r.
type samplePattern struct {
	shift  int
	rows   []int
	lo, hi []int
}

var _ flash.Pattern = (*samplePattern)(nil)

func (sp *samplePattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	r0, r1 := max(p0-sp.shift, 0), min(p1-sp.shift, sp.rows[len(sp.rows)-1])
	if r0 >= r1 {
		return dst
	}
	i0, i1 := blockOf(sp.rows, r0), blockOf(sp.rows, r1-1)
	if i0 == i1 {
		if lo := sp.lo[i0]; lo > 0 {
			dst = append(dst, flash.Range{Lo: 0, Hi: lo, Full: true})
		}
		if hi := sp.hi[i0]; hi < m {
			dst = append(dst, flash.Range{Lo: hi, Hi: m, Full: true})
		}
		return dst
	}
	return append(dst, flash.Range{Lo: 0, Hi: m})
}

func (sp *samplePattern) Visible(p, j int) bool {
	i := blockOf(sp.rows, p-sp.shift)
	return j < sp.lo[i] || j >= sp.hi[i]
}

// MaskRow hides from the query at position p the samples inside its block.
func (sp *samplePattern) MaskRow(p, j0 int, s []float32) {
	i := blockOf(sp.rows, p-sp.shift)
	lo, hi := max(sp.lo[i]-j0, 0), min(sp.hi[i]-j0, len(s))
	for j := lo; j < hi; j++ {
		s[j] = negInf
	}
}
