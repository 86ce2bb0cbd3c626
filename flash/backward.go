package flash

import (
	"context"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// The backward pass's tiles. They are its own, not Config's: a backward
// tile holds the positions of one query head (the forward's hold a whole
// GQA group), and its products have other shapes.
const (
	// gradTileRows is the number of query positions of one head per
	// tile; a multiple of simd.Panel, since queries run along the vector
	// lanes.
	gradTileRows = 64
	// gradTileKeys is the number of keys per key tile.
	gradTileKeys = 64
	// gradTasks is the number of tasks Backward aims for: when there are
	// fewer (batch row, kv head) pairs, each pair's query heads are split
	// and then its key tiles cut into runs, so that two cores shared with
	// other work stay balanced. 32 rather than 16: with runs of
	// decreasing work, the last tasks handed out are then small enough
	// that the workers finish within about a millisecond of each other
	// at B = 1, H = 8, N = M = 2048.
	gradTasks = 32
	// gradPartialFloats bounds the memory of the partials: no more head
	// subsets than fit their dK and dV, and no more runs than fit their
	// dQ, in 2^26 floats (256 MiB).
	gradPartialFloats = 1 << 26
)

// Backward computes the gradients of exact attention in the manner of
// FlashAttention-2 (Dao, 2023, Algorithm 2). Given the inputs q, k, v of
// a forward pass, its out and lse (as Forward, or ForwardPattern with the
// same pat, wrote them) and dout, the gradient of a loss with respect to
// out, it writes the gradients of the loss with respect to q, k and v
// into dq, dk and dv. The shape, the options and the pattern (nil means
// dense attention) must be those of the forward pass; dq and dout are laid
// out like q, dk and dv like k. dq, dk and dv are overwritten, never
// read, and must not overlap the inputs.
//
// The probabilities are recomputed tile by tile from q, k and lse,
// P = exp(scale·Q·Kᵀ − lse), and never stored whole:
//
//	D_i = rowsum(dO_i ∘ O_i)
//	dV += Pᵀ·dO;  dP = dO·Vᵀ;  dS = P ∘ (dP − D)
//	dQ += scale·dS·K;  dK += scale·dSᵀ·Q
//
// each product a simd.Gemm on a tile of one head's query positions and a
// tile of keys. dK and dV of a kv head sum over the query heads of its
// GQA group; K and V are never expanded. Keys a query cannot see under
// the causal, padding and pattern masks get probability 0 and add
// nothing: a row that sees no key (lse −Inf) gets dq 0, a key no row sees
// gets dk and dv 0, and a padded key is never read. On the tiles that the
// causal and padding masks cut (the diagonal of a causal mask), the
// products skip the blocks of 16 keys × 16 queries that are wholly
// masked, as the forward pass does.
//
// # Work split and determinism
//
// The unit of work is a run of key tiles of one (batch row, kv head)
// against a subset of the group's query heads. It accumulates those
// keys' dK and dV in tiles while it walks every query tile of its heads
// that sees them (four key tiles at a time, so that each query tile is
// read once for the four); its contributions to dQ go to a dQ partial of
// its run. With at least 32 (batch row, kv head) pairs each pair is one
// unit. With fewer, the group's query heads are first split into up to
// ⌈32/pairs⌉ subsets, each with dK and dV partials (the size of K and
// V), and if that is not enough the key tiles are cut into runs of
// decreasing work (r runs weigh r, r−1, …, 1 parts), each with a dQ
// partial (the size of Q, of which a run writes only the query tiles it
// visits); the partials, at most 2^26 floats of each kind, are added in a
// fixed order at the end. Units are handed to goroutines largest first,
// so that the last ones are small and the goroutines finish together
// even on cores shared with other work. The split and every order
// of summation depend only on the shape, the options and the pattern,
// not on the worker count or the scheduling: a call gives the same bits
// with any Options.Workers and on any machine with the same kernels.
//
// # Cost
//
// 10·B·H·N·M·D flops for dense attention (about half of it causal): five
// products the size of the forward's two, plus one exp per visible
// (query, key) pair. Extra memory is O(B·H·N·D), never O(N·M): the
// queries and output gradients packed as the products read them (2
// copies, 4 when D is not a multiple of 16), one transposed dQ per run of
// keys and, when the heads are split, dK and dV per subset; plus O(gradTileKeys·(gradTileRows+D)) floats per
// worker (about 330 KB at D = 64). The packed copies, the partials and
// the workers' scratch come from pools that keep them between calls
// (until the garbage collector drops them), so that repeated calls of
// one shape allocate almost nothing.
//
// Errors wrap attn.ErrShape or attn.ErrInput as for Forward (a nil lse or
// a wrong length of dout, dq, dk or dv is an attn.ErrShape error). A
// cancelled ctx stops the pass and returns its error, the outputs then
// being partly written.
func (kn *Kernel) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, pat Pattern, dq, dk, dv []float32) error {
	return backward(ctx, s, q, k, v, out, lse, dout, o, pat, dq, dk, dv, gradTileRows, gradTileKeys)
}

// backward is Backward with the tile sizes as parameters, for the tests:
// bq query positions (a multiple of simd.Panel) and bk keys per tile.
func backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, pat Pattern,
	dq, dk, dv []float32, bq, bk int) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
		return err
	}
	if pat == nil {
		pat = dense{}
	}
	p := newGradPlan(s, q, k, v, out, lse, dout, o, pat, dq, dk, dv, bq, bk)
	defer gradArenas.Put(p.arena)
	procs := runtime.GOMAXPROCS(0)
	tiles := s.B * s.H * p.qTiles
	if err := parallel.For(ctx, o.WorkerCount(procs, tiles), tiles,
		func() *gradPanel { return newGradPanel(s.D) },
		func(pn *gradPanel, it int) error { p.prepare(pn, it); return nil }); err != nil {
		return err
	}
	tasks := p.tasks()
	var mu sync.Mutex
	var works []*gradWork
	defer func() {
		for _, w := range works {
			gradWorks.Put(w)
		}
	}()
	if err := parallel.For(ctx, o.WorkerCount(procs, len(tasks)), len(tasks),
		func() *gradWork {
			w := getGradWork(s.D, p.dp, bq, bk)
			mu.Lock()
			works = append(works, w)
			mu.Unlock()
			return w
		},
		func(w *gradWork, n int) error { return p.run(ctx, w, tasks[n]) }); err != nil {
		return err
	}
	if err := parallel.For(ctx, o.WorkerCount(procs, tiles), tiles,
		func() *gradPanel { return newGradPanel(s.D) },
		func(pn *gradPanel, it int) error { p.gatherDQ(pn, it); return nil }); err != nil {
		return err
	}
	if p.subs == 1 {
		return nil
	}
	rows := (s.B*s.HKV*s.M + 63) / 64
	return parallel.For(ctx, o.WorkerCount(procs, rows), rows,
		func() struct{} { return struct{}{} },
		func(_ struct{}, n int) error { p.gatherKV(n); return nil })
}

// gradPlan is one Backward call's state. The workers read it and write
// only disjoint parts of its buffers and of the outputs.
type gradPlan struct {
	s                       attn.Shape
	o                       attn.Options
	pat                     Pattern
	q, k, v, out, lse, dout []float32
	dq, dk, dv              []float32
	scale                   float32
	bq, bk                  int // query positions and keys per tile
	dp                      int // D rounded up to simd.Panel
	qTiles, kTiles          int // tiles per head
	subs                    int // subsets of a group's query heads
	segs                    int // runs of key tiles per (batch row, kv head)

	// Per query tile it = (b·H + h)·qTiles + qt, with bq lanes a tile
	// (lanes past the last position hold 0 but for row D of qsT):
	qsT []float32 // [it][D+1][bq]: scale·Q transposed, then the row lse
	doT []float32 // [it][D+1][bq]: dO transposed, then the row D_i = dO_i·O_i
	qp  []float32 // [it][bq][dp]: Q padded; nil when D = dp (q serves)
	dop []float32 // [it][bq][dp]: dO padded; nil when D = dp (dout serves)
	// [segs][it][D][bq]: unscaled dQ partials, transposed; a run's hold
	// values only in the query tiles it visits.
	dqT []float32
	// With subs > 1, per subset of the query heads:
	dkp []float32 // [subs][B·Hkv·M·D]: unscaled dK partials
	dvp []float32 // [subs][B·Hkv·M·D]: dV partials

	keys map[int]*gradKeys // the visits of each distinct key length

	arena *[]float32 // the buffers above, back to gradArenas at the end
}

// gradArenas keeps the buffers of finished Backward calls for the next
// ones, so that a training loop does not allocate (and the OS zero and
// map) some tens of MB on every step. A pooled arena is dropped at the
// second garbage collection that finds it unused.
var gradArenas sync.Pool // of *[]float32

// getGradArena returns n floats, of unspecified values, from a pooled
// arena when one is large enough, else newly allocated.
func getGradArena(n int) *[]float32 {
	if a, ok := gradArenas.Get().(*[]float32); ok && cap(*a) >= n {
		*a = (*a)[:n]
		return a
	}
	a := make([]float32, n)
	return &a
}

// gradKeys is what the batch rows with one key length share: which query
// tiles visit each key tile, and the visible key ends of every position.
type gradKeys struct {
	visits [][]gradVisit // [kTiles]: query tiles in ascending order
	ends   []int32       // [qTiles·bq]: visible keys [0, end) per position
	weight []int         // [kTiles]: (query, key) pairs visited per head
	runs   [][2]int      // [segs]: key tiles [lo, hi) of each run
	runW   []int         // [segs]: weight of each run
	runQT  [][]bool      // [segs][qTiles]: the query tiles each run visits
}

// gradVisit is the part [c0, c1) of a key tile that query tile qt reads.
// When full is false the pattern masks it key by key.
type gradVisit struct {
	qt, c0, c1 int32
	full       bool
}

func padPanel(n int) int { return (n + simd.Panel - 1) / simd.Panel * simd.Panel }

func newGradPlan(s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, pat Pattern,
	dq, dk, dv []float32, bq, bk int) *gradPlan {
	p := &gradPlan{
		s: s, o: o, pat: pat,
		q: q, k: k, v: v, out: out, lse: lse, dout: dout,
		dq: dq, dk: dk, dv: dv,
		scale: o.ScaleFor(s.D),
		bq:    bq, bk: bk,
		dp:     padPanel(s.D),
		qTiles: (s.N + bq - 1) / bq,
		kTiles: (s.M + bk - 1) / bk,
	}
	tiles := s.B * s.H * p.qTiles
	tsz := tiles * s.D * bq
	// Tasks beyond one per pair come first from splitting the group's
	// query heads, whose partials are the size of dK and dV, then from
	// cutting the keys into runs, whose partials are the size of dQ.
	pairs := s.B * s.HKV
	p.subs = min(max(1, (gradTasks+pairs-1)/pairs), s.Group(), max(1, gradPartialFloats/(2*s.KVLen())))
	p.segs = min(max(1, (gradTasks+pairs*p.subs-1)/(pairs*p.subs)), p.kTiles, max(1, gradPartialFloats/tsz))
	// The buffers are carved from one arena, which need not be zero:
	// prepare writes all of qsT, doT, qp and dop before they are read,
	// run every row of dkp and dvp, and the first visit of a query tile
	// in a run its dQ partial, which gatherDQ reads only for the query
	// tiles the run visits.
	ntT, npad, nkv := tiles*(s.D+1)*bq, 0, 0
	if p.dp != s.D {
		npad = tiles * bq * p.dp
	}
	if p.subs > 1 {
		nkv = p.subs * s.KVLen()
	}
	p.arena = getGradArena(2*ntT + 2*npad + p.segs*tsz + 2*nkv)
	buf := *p.arena
	carve := func(n int) []float32 {
		x := buf[:n:n]
		buf = buf[n:]
		return x
	}
	p.qsT, p.doT = carve(ntT), carve(ntT)
	if npad > 0 {
		p.qp, p.dop = carve(npad), carve(npad)
	}
	p.dqT = carve(p.segs * tsz)
	if nkv > 0 {
		p.dkp, p.dvp = carve(nkv), carve(nkv)
	}
	p.keys = make(map[int]*gradKeys)
	for b := range s.B {
		kend := o.KeyEnd(s, b)
		if p.keys[kend] == nil {
			p.keys[kend] = p.keyVisits(b)
		}
	}
	return p
}

// keyVisits lists, for the key length of batch row b, the query tiles
// that visit each key tile, from the pattern's ranges clipped to the keys
// the causal and padding masks leave; and cuts the key tiles into runs of
// decreasing work.
func (p *gradPlan) keyVisits(b int) *gradKeys {
	s := p.s
	kk := &gradKeys{
		visits: make([][]gradVisit, p.kTiles),
		ends:   make([]int32, p.qTiles*p.bq),
		weight: make([]int, p.kTiles),
	}
	shift := s.M - s.N // absolute position of query 0
	var ranges []Range
	for qt := range p.qTiles {
		i0 := qt * p.bq
		i1 := min(i0+p.bq, s.N)
		for i := i0; i < i1; i++ {
			kk.ends[i] = int32(p.o.VisibleKeys(s, b, i))
		}
		// Visible ends never fall with the position: the last row's is
		// the tile's largest.
		maxEnd := int(kk.ends[i1-1])
		ranges = p.pat.KeyRanges(ranges[:0], shift+i0, shift+i1, s.M)
		cur := gradVisit{qt: int32(qt)}
		curTile := -1
		flush := func() {
			if curTile >= 0 {
				kk.visits[curTile] = append(kk.visits[curTile], cur)
				kk.weight[curTile] += int(cur.c1-cur.c0) * (i1 - i0)
			}
		}
		for _, rg := range ranges {
			lo, hi := max(rg.Lo, 0), min(rg.Hi, maxEnd)
			for j := lo; j < hi; {
				kt := j / p.bk
				c0, c1 := j-kt*p.bk, min(hi-kt*p.bk, p.bk)
				if kt == curTile {
					// A second range in the same tile: the keys between
					// the two are outside both, so the tile is masked.
					cur.full = cur.full && rg.Full && int32(c0) == cur.c1
					cur.c1 = int32(c1)
				} else {
					flush()
					curTile = kt
					cur = gradVisit{qt: int32(qt), c0: int32(c0), c1: int32(c1), full: rg.Full}
				}
				j = kt*p.bk + c1
			}
		}
		flush()
	}

	// Cut the key tiles into segs runs of decreasing weight (see
	// gradRunCum), each at least one tile, and note the query tiles each
	// visits.
	total := 0
	for _, w := range kk.weight {
		total += w
	}
	lo, acc := 0, 0
	for r := range p.segs {
		hi := lo + 1
		acc += kk.weight[lo]
		left := p.segs - 1 - r // runs still to come, each needing a tile
		for hi < p.kTiles-left && (r == p.segs-1 || acc+kk.weight[hi] <= total*gradRunCum(r, p.segs)/gradRunCum(p.segs-1, p.segs)) {
			acc += kk.weight[hi]
			hi++
		}
		if r == p.segs-1 {
			hi = p.kTiles
		}
		w := 0
		for _, x := range kk.weight[lo:hi] {
			w += x
		}
		qts := make([]bool, p.qTiles)
		for _, vis := range kk.visits[lo:hi] {
			for _, vi := range vis {
				qts[vi.qt] = true
			}
		}
		kk.runs = append(kk.runs, [2]int{lo, hi})
		kk.runW = append(kk.runW, w)
		kk.runQT = append(kk.runQT, qts)
		lo = hi
	}
	return kk
}

// gradRunCum is the weight of the runs 0..r of segs, in parts: run i
// weighs segs − i parts, so that the units handed out last (the last runs
// of every pair) are the lightest.
func gradRunCum(r, segs int) int { return (r+1)*segs - r*(r+1)/2 }

// prepare packs query tile it: scale·Q and dO transposed (and padded
// copies when D is not a multiple of simd.Panel), each with one more row:
// lse under scale·Qᵀ and D_i under dOᵀ. The key tiles get a last column
// of -1 (gradBlock.kp, vp), so that the products give S − lse and
// dP − D directly. Where a lane has no query or its query sees no key,
// the lse row holds +Inf, which makes every P of the lane exp(-Inf) = 0,
// and every other row 0. It writes every float of the tile's part of
// qsT, doT, qp and dop.
func (p *gradPlan) prepare(pn *gradPanel, it int) {
	s, d, bq := p.s, p.s.D, p.bq
	bh, qt := it/p.qTiles, it%p.qTiles
	i0 := qt * bq
	nr := min(bq, s.N-i0)
	row0 := bh*s.N + i0
	qsT := p.qsT[it*(d+1)*bq:][:(d+1)*bq]
	doT := p.doT[it*(d+1)*bq:][:(d+1)*bq]
	shift := qsT[d*bq:]
	delta := doT[d*bq:]
	inf := float32(math.Inf(1))
	pn.toLanes(qsT, bq, p.q, row0*d, nr, p.scale)
	pn.toLanes(doT, bq, p.dout, row0*d, nr, 1)
	if nr < bq {
		for c := range d {
			clear(qsT[c*bq+nr : (c+1)*bq])
			clear(doT[c*bq+nr : (c+1)*bq])
		}
	}
	if p.qp != nil {
		qp := p.qp[it*bq*p.dp:][:bq*p.dp]
		dop := p.dop[it*bq*p.dp:][:bq*p.dp]
		clear(qp)
		clear(dop)
		for r := range nr {
			copy(qp[r*p.dp:][:d], p.q[(row0+r)*d:][:d])
			copy(dop[r*p.dp:][:d], p.dout[(row0+r)*d:][:d])
		}
	}
	for r := range nr {
		l := p.lse[row0+r]
		if math.IsInf(float64(l), -1) {
			// The row saw no key: its output is the constant 0.
			shift[r], delta[r] = inf, 0
			continue
		}
		shift[r] = l
		delta[r] = simd.Dot(p.dout[(row0+r)*d:][:d], p.out[(row0+r)*d:][:d])
	}
	for r := nr; r < bq; r++ {
		shift[r], delta[r] = inf, 0
	}
}

// gradPanel is a worker's scratch for moving rows of d values into and
// out of the transposed tiles (rows along the lanes, bq or bk lanes a
// row) a simd.Panel of rows at a time, through simd.PanelFromRows and
// simd.RowsFromPanel.
type gradPanel struct {
	d   int
	off [simd.Panel]int
	f   [simd.Panel]float32
	buf []float32 // [d][Panel]
}

func newGradPanel(d int) *gradPanel {
	return &gradPanel{d: d, buf: make([]float32, d*simd.Panel)}
}

// toLanes sets dst[c·ld + x] = src[off0 + x·d + c]·scale for the n rows
// x < n and the columns c < d: n consecutive rows of src transposed.
func (pn *gradPanel) toLanes(dst []float32, ld int, src []float32, off0, n int, scale float32) {
	d := pn.d
	for x0 := 0; x0 < n; x0 += simd.Panel {
		w := min(simd.Panel, n-x0)
		off := pn.off[:w]
		for x := range off {
			off[x] = off0 + (x0+x)*d
		}
		simd.PanelFromRows(pn.buf, src, off, d, scale)
		for c := range d {
			copy(dst[c*ld+x0:][:w], pn.buf[c*simd.Panel:][:w])
		}
	}
}

// fromLanes is the converse of toLanes: dst[off0 + x·d + c] = src[c·ld +
// x]·scale for x < n and c < d.
func (pn *gradPanel) fromLanes(dst []float32, off0, n int, src []float32, ld int, scale float32) {
	d := pn.d
	for x0 := 0; x0 < n; x0 += simd.Panel {
		w := min(simd.Panel, n-x0)
		off, f := pn.off[:w], pn.f[:w]
		for x := range off {
			off[x] = off0 + (x0+x)*d
			f[x] = scale
		}
		for c := range d {
			copy(pn.buf[c*simd.Panel:][:w], src[c*ld+x0:][:w])
		}
		simd.RowsFromPanel(dst, off, pn.buf, f, d)
	}
}

// gradTask is one run of key tiles [kt0, kt1) of one (batch row, kv
// head) against the group's query heads [h0, h1) (absolute head numbers)
// of subset sub, writing its dQ contributions to partial seg and, when
// the heads are split, its dK and dV to partial sub.
type gradTask struct {
	b, kvh, sub, h0, h1, seg, kt0, kt1, weight int
}

// tasks lists the runs, heaviest first (ties in a fixed order).
func (p *gradPlan) tasks() []gradTask {
	var ts []gradTask
	for b := range p.s.B {
		kk := p.keys[p.o.KeyEnd(p.s, b)]
		for kvh := range p.s.HKV {
			g := p.s.Group()
			for sub := range p.subs {
				h0, h1 := kvh*g+sub*g/p.subs, kvh*g+(sub+1)*g/p.subs
				for r, run := range kk.runs {
					ts = append(ts, gradTask{b: b, kvh: kvh, sub: sub, h0: h0, h1: h1, seg: r,
						kt0: run[0], kt1: run[1], weight: kk.runW[r] * (h1 - h0)})
				}
			}
		}
	}
	slices.SortStableFunc(ts, func(a, b gradTask) int { return b.weight - a.weight })
	return ts
}

// gradWork is one worker's scratch: O(gradGroup·bk·(bq + D)) floats.
// Every float of it is written before it is read.
type gradWork struct {
	d, dp, bq, bk int       // the sizes it was made for
	st            []float32 // [bk][bq]: logits less lse, then probabilities Pᵀ
	dst           []float32 // [bk][bq]: dPᵀ less D, then dSᵀ
	line          []float32 // [bk]: one query's logits, for the pattern
	// dqSet says, per (head of the task, query tile), whether the task
	// has written its dQ partial yet: the first visit sets it, the
	// next ones add to it.
	dqSet []bool
	keys  []gradBlock // [gradGroup]
	pn    *gradPanel
}

// gradBlock is one key tile of a group being computed.
type gradBlock struct {
	j0, nk int       // keys [j0, j0+nk)
	dk     []float32 // [bk][dp]: the tile's unscaled dK
	dv     []float32 // [bk][dp]: the tile's dV
	kp     []float32 // [bk][D+1]: the keys, each followed by -1
	vp     []float32 // [bk][D+1]: the values, each followed by -1
	kt     []float32 // [D][bk]: the keys transposed
}

// gradGroup is the number of key tiles a worker computes together: it
// walks the query tiles once for all of them, so that a query tile's
// operands and dQ partial are read from memory once per group (and then
// from cache) rather than once per key tile.
const gradGroup = 4

// gradWorks keeps the scratch of finished Backward calls for the next
// ones, as gradArenas does the buffers.
var gradWorks sync.Pool // of *gradWork

// getGradWork returns a pooled scratch of these sizes, or a new one.
func getGradWork(d, dp, bq, bk int) *gradWork {
	if w, ok := gradWorks.Get().(*gradWork); ok && w.d == d && w.dp == dp && w.bq == bq && w.bk == bk {
		return w
	}
	return newGradWork(d, dp, bq, bk)
}

func newGradWork(d, dp, bq, bk int) *gradWork {
	w := &gradWork{
		d: d, dp: dp, bq: bq, bk: bk,
		st:   make([]float32, bk*bq),
		dst:  make([]float32, bk*bq),
		line: make([]float32, bk),
		keys: make([]gradBlock, gradGroup),
		pn:   newGradPanel(d),
	}
	for i := range w.keys {
		w.keys[i] = gradBlock{
			dk: make([]float32, bk*dp),
			dv: make([]float32, bk*dp),
			kp: make([]float32, bk*(d+1)),
			vp: make([]float32, bk*(d+1)),
			kt: make([]float32, d*bk),
		}
	}
	return w
}

// run computes task t, gradGroup key tiles at a time: it packs them, then
// for every query head of the group and every query tile in ascending
// order, folds the visits of that query tile to the group's key tiles
// (in ascending order), and finally writes the tiles' dK and dV. Every
// sum is thus taken in a fixed order: dK and dV of a tile over (head,
// query tile), dQ of a query tile over key tiles.
func (p *gradPlan) run(ctx context.Context, w *gradWork, t gradTask) error {
	s, d, dp, bk := p.s, p.s.D, p.dp, p.bk
	kk := p.keys[p.o.KeyEnd(s, t.b)]
	base := (t.b*s.HKV + t.kvh) * s.M // first key row of the pair
	tsz := s.B * s.H * p.qTiles * d * p.bq
	dqT := p.dqT[t.seg*tsz:][:tsz]
	if n := (t.h1 - t.h0) * p.qTiles; cap(w.dqSet) < n {
		w.dqSet = make([]bool, n)
	} else {
		w.dqSet = w.dqSet[:n]
		clear(w.dqSet)
	}
	for kt0 := t.kt0; kt0 < t.kt1; kt0 += gradGroup {
		if err := ctx.Err(); err != nil {
			return err
		}
		blocks := w.keys[:min(gradGroup, t.kt1-kt0)]
		for x := range blocks {
			kb := &blocks[x]
			kb.j0 = (kt0 + x) * bk
			kb.nk = min(bk, s.M-kb.j0)
			clear(kb.dk[:kb.nk*dp])
			clear(kb.dv[:kb.nk*dp])
			if len(kk.visits[kt0+x]) == 0 {
				continue
			}
			w.pn.toLanes(kb.kt, bk, p.k, (base+kb.j0)*d, kb.nk, 1)
			for j := range kb.nk {
				kr := p.k[(base+kb.j0+j)*d:][:d]
				copy(kb.kp[j*(d+1):], kr)
				copy(kb.vp[j*(d+1):], p.v[(base+kb.j0+j)*d:][:d])
				kb.kp[j*(d+1)+d] = -1
				kb.vp[j*(d+1)+d] = -1
			}
		}
		for h := t.h0; h < t.h1; h++ {
			// Merge the tiles' visit lists, each sorted by query tile.
			var next [gradGroup]int
			for {
				qt := int32(math.MaxInt32)
				for x := range blocks {
					if vis := kk.visits[kt0+x]; next[x] < len(vis) {
						qt = min(qt, vis[next[x]].qt)
					}
				}
				if qt == math.MaxInt32 {
					break
				}
				for x := range blocks {
					if vis := kk.visits[kt0+x]; next[x] < len(vis) && vis[next[x]].qt == qt {
						set := &w.dqSet[(h-t.h0)*p.qTiles+int(qt)]
						p.visit(w, &blocks[x], kk, t.b, h, vis[next[x]], dqT, *set)
						*set = true
						next[x]++
					}
				}
			}
		}
		dk, dv := p.dk, p.dv
		if p.subs > 1 {
			dk, dv = p.dkp[t.sub*s.KVLen():][:s.KVLen()], p.dvp[t.sub*s.KVLen():][:s.KVLen()]
		}
		for x := range blocks {
			kb := &blocks[x]
			for j := range kb.nk {
				row := (base + kb.j0 + j) * d
				copy(dk[row:][:d], kb.dk[j*dp:][:d])
				copy(dv[row:][:d], kb.dv[j*dp:][:d])
				if p.subs == 1 {
					simd.Scale(dk[row:][:d], p.scale)
				}
			}
		}
	}
	return nil
}

// visit folds the keys [c0, c1) of key tile kb and one query tile of
// head h into the key tile's dK and dV and into the query tile's dQ
// partial (added to it, or written when dqAcc is false: the run's first
// visit of the query tile). Keys run down the rows of Sᵀ, Pᵀ, dPᵀ and dSᵀ and queries
// along their lanes, so that every product reads its operands where they
// lie:
//
//	Sᵀ − lse = [K, -1]·[scale·Q, lse]ᵀ,  dPᵀ − D = [V, -1]·[dO, D]ᵀ,
//	dV += Pᵀ·dO,  dK += dSᵀ·Q,  dQᵀ += Kᵀ·dSᵀ.
//
// The lanes a key is hidden from by the causal and padding masks are a
// prefix, one that grows with the key. Where it reaches a whole
// simd.Panel of lanes (the tiles on the diagonal of a causal mask), the
// keys go in blocks of simd.Panel and each product covers only the
// panels of lanes some key of the block is visible from: Sᵀ, dPᵀ, dV
// and dK per block of keys from its first such panel, dQᵀ per panel of
// lanes up to the last key one of its lanes sees. The masked entries it
// skips are zeros of Pᵀ and dSᵀ, which would add nothing.
func (p *gradPlan) visit(w *gradWork, kb *gradBlock, kk *gradKeys, b, h int, vi gradVisit, dqT []float32, dqAcc bool) {
	s, d, dp, bq, bk := p.s, p.s.D, p.dp, p.bq, p.bk
	j0 := kb.j0
	qt, c0, c1 := int(vi.qt), int(vi.c0), int(vi.c1)
	m := c1 - c0
	i0 := qt * bq
	nr := min(bq, s.N-i0)
	nrp := padPanel(nr)
	it := (b*s.H+h)*p.qTiles + qt
	st := w.st[c0*bq:]
	dst := w.dst[c0*bq:]
	qsT := p.qsT[it*(d+1)*bq:]
	doT := p.doT[it*(d+1)*bq:]
	qa, ldq := p.q[((b*s.H+h)*s.N+i0)*d:], d
	ga, ldg := p.dout[((b*s.H+h)*s.N+i0)*d:], d
	if p.qp != nil {
		qa, ldq = p.qp[it*bq*dp:], dp
		ga, ldg = p.dop[it*bq*dp:], dp
	}
	dq := dqT[it*d*bq:]
	ends := kk.ends[i0:][:nr]
	key0 := int32(j0 + c0)

	// hidden(j) is the number of lanes that cannot see key j of the visit.
	hidden := func(j int) int {
		return sort.Search(nr, func(r int) bool { return ends[r] > key0+int32(j) })
	}
	const P = simd.Panel
	if hidden(m-1) < P {
		// Every key is visible from some lane of the first panel: whole
		// products.
		simd.Gemm(m, nrp, d+1, kb.kp[c0*(d+1):], d+1, qsT, bq, st, bq, false)
		simd.Gemm(m, nrp, d+1, kb.vp[c0*(d+1):], d+1, doT, bq, dst, bq, false)
		if !vi.full {
			p.mask(w, st, m, nr, s.M-s.N+i0, j0+c0)
		}
		p.expMul(st, dst, m, nr, nrp, ends, key0, 0)
		simd.Gemm(m, dp, nr, st, bq, ga, ldg, kb.dv[c0*dp:], dp, true)
		simd.Gemm(m, dp, nr, dst, bq, qa, ldq, kb.dk[c0*dp:], dp, true)
		simd.Gemm(d, nrp, m, kb.kt[c0:], bk, dst, bq, dq, bq, dqAcc)
		return
	}
	for a := 0; a < m; a += P {
		mc := min(P, m-a)
		l := hidden(a) / P * P // first lane panel the block is visible from
		sa, da := st[a*bq+l:], dst[a*bq+l:]
		simd.Gemm(mc, nrp-l, d+1, kb.kp[(c0+a)*(d+1):], d+1, qsT[l:], bq, sa, bq, false)
		simd.Gemm(mc, nrp-l, d+1, kb.vp[(c0+a)*(d+1):], d+1, doT[l:], bq, da, bq, false)
		if !vi.full {
			p.mask(w, st[a*bq:], mc, nr, s.M-s.N+i0, j0+c0+a)
		}
		p.expMul(st[a*bq:], dst[a*bq:], mc, nr, nrp, ends, key0+int32(a), l)
		simd.Gemm(mc, dp, nr-l, sa, bq, ga[l*ldg:], ldg, kb.dv[(c0+a)*dp:], dp, true)
		simd.Gemm(mc, dp, nr-l, da, bq, qa[l*ldq:], ldq, kb.dk[(c0+a)*dp:], dp, true)
	}
	for l := 0; l < nrp; l += P {
		// The keys [0, n) are all that some lane of the panel sees.
		n := min(m, max(0, int(ends[min(l+P, nr)-1]-key0)))
		simd.Gemm(d, P, n, kb.kt[c0:], bk, dst[l:], bq, dq[l:], bq, dqAcc)
	}
}

// expMul turns the m keys of Sᵀ − lse (st) and dPᵀ − D (dst), bq lanes a
// key from key0, into Pᵀ = exp(Sᵀ − lse) and dSᵀ = Pᵀ ∘ (dPᵀ − D) by
// simd.ExpMul, on the lanes [l, nrp): the lanes that cannot see a key,
// a prefix under the causal and padding masks, get 0 in both. The keys
// every lane sees, a prefix of the rows, go in one call where rows are
// whole.
func (p *gradPlan) expMul(st, dst []float32, m, nr, nrp int, ends []int32, key0 int32, l int) {
	bq := p.bq
	first, j := 0, 0
	if nrp == bq && l == 0 {
		for ; j < m && ends[0] > key0+int32(j); j++ {
		}
		simd.ExpMul(st[:j*bq], dst[:j*bq])
	}
	for ; j < m; j++ {
		key := key0 + int32(j)
		for first < nr && ends[first] <= key {
			first++
		}
		pr := st[j*bq:][:nrp]
		dr := dst[j*bq:][:nrp]
		lo := max(first, l)
		clear(pr[l:lo])
		clear(dr[l:lo])
		simd.ExpMul(pr[lo:], dr[lo:])
	}
}

// mask sets to -Inf the logits in Sᵀ (m keys from key0, bq lanes a key)
// of the keys the pattern hides from each of the nr queries from
// absolute position pos0.
func (p *gradPlan) mask(w *gradWork, st []float32, m, nr, pos0, key0 int) {
	bq := p.bq
	rm, isRM := p.pat.(RowMasker)
	line := w.line[:m]
	ninf := float32(math.Inf(-1))
	for r := range nr {
		for j := range line {
			line[j] = st[j*bq+r]
		}
		if isRM {
			rm.MaskRow(pos0+r, key0, line)
		} else {
			for j := range line {
				if !p.pat.Visible(pos0+r, key0+j) {
					line[j] = ninf
				}
			}
		}
		for j, x := range line {
			st[j*bq+r] = x
		}
	}
}

// gatherKV writes dK and dV of key rows [64·n, 64·n+64) of the whole
// batch when the query heads were split: the partials added in subset
// order, dK scaled.
func (p *gradPlan) gatherKV(n int) {
	lo, hi := n*64*p.s.D, min((n+1)*64*p.s.D, p.s.KVLen())
	kv := p.s.KVLen()
	dk, dv := p.dk[lo:hi], p.dv[lo:hi]
	copy(dk, p.dkp[lo:hi])
	copy(dv, p.dvp[lo:hi])
	for sub := 1; sub < p.subs; sub++ {
		simd.Axpy(1, p.dkp[sub*kv+lo:sub*kv+hi], dk)
		simd.Axpy(1, p.dvp[sub*kv+lo:sub*kv+hi], dv)
	}
	simd.Scale(dk, p.scale)
}

// gatherDQ writes dQ of query tile it: the partials of the runs that
// visit it added in run order (into the first), transposed back and
// scaled; 0 where no run visits it (its rows see no key).
func (p *gradPlan) gatherDQ(pn *gradPanel, it int) {
	s, d, bq := p.s, p.s.D, p.bq
	bh, qt := it/p.qTiles, it%p.qTiles
	i0 := qt * bq
	nr := min(bq, s.N-i0)
	tsz := s.B * s.H * p.qTiles * d * bq
	kk := p.keys[p.o.KeyEnd(s, bh/s.H)]
	var acc []float32
	for seg := range p.segs {
		if !kk.runQT[seg][qt] {
			continue
		}
		part := p.dqT[seg*tsz+it*d*bq:][:d*bq]
		if acc == nil {
			acc = part
		} else {
			simd.Axpy(1, part, acc)
		}
	}
	if acc == nil {
		clear(p.dq[(bh*s.N+i0)*d:][:nr*d])
		return
	}
	pn.fromLanes(p.dq, (bh*s.N+i0)*d, nr, acc, bq, p.scale)
}
