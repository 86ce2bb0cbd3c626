package hyper

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
)

// call is one Forward call's state, shared by its workers.
type call struct {
	a                 *Attention
	s                 attn.Shape
	o                 attn.Options
	q, k, v, out, lse []float32
	scale             float32

	// Buckets of every query row [B][H][N] and every valid key row
	// [B][Hkv][M], computed once, before the first phase that sorts.
	qb, kb []uint32

	// fresh says that out and lse hold nothing yet and each row gets one
	// result: it is written, not merged.
	fresh bool
	// grad says that the call plans a backward pass, which runs only where
	// value-norm sampling changes nothing: its samples are not drawn.
	grad bool

	workers []*worker // scratch per worker slot, made on first use
}

// job is one rectangle for one batch row and key/value head: the whole GQA
// group of query heads against the keys [r.k0, r.k0+nk).
type job struct {
	r      rect
	b, kvh int
	nk     int  // keys left after padding
	exact  bool // below Min: plain exact attention
	nb     int  // key blocks (approximate, 0 without a block part) or row chunks (exact)
	stream uint64

	// Filled by prepare for approximate jobs. Offsets are relative to
	// r.k0 and r.q0; nil keys means the identity order.
	keys []int32 // keys sorted by bucket
	// rows holds the group's query rows, x = r·g + hh for query offset r
	// of head hh, grouped by the key block they attend to and in
	// increasing x within a block; pieces cut it into the batches of the
	// exact calls, largest first.
	rows   []int32
	pieces []piece
	// start[bl] is the first entry of rows of key block bl, start[nb] =
	// len(rows); without a block part, [0, len(rows)].
	start []int32

	// The sampled columns, shared by the job's blocks: sorted positions in
	// increasing order and their gathered key and value rows.
	uniform      []int32
	uniK, uniV   []float32
	byNorm       []int32   // ValueNorm: drawn by squared value norm
	normK, normV []float32 // ValueNorm: normV weighted by 1/(Samples·p)
	vlo, vhi     []float32 // ValueNorm: each coordinate's range over the job's values
}

// piece is a run rows[r0:r1] of query rows that attend to key block bl
// (-1 without a block part).
type piece struct {
	bl, r0, r1 int
}

// pieceRows bounds the query rows of a piece: a block that many queries
// chose is cut into several, so that tasks stay small enough to balance.
const pieceRows = 256

// exactChunk is the number of query positions per task of an exact
// rectangle.
const exactChunk = 256

// runPhase computes every rectangle of one phase and merges the results
// into out and lse.
func (c *call) runPhase(ctx context.Context, rects []rect) error {
	jobs, err := c.plan(ctx, rects)
	if err != nil {
		return err
	}
	// The pieces exist once prepared: how many there are depends on where
	// the queries fall.
	type task struct {
		j    *job
		part int
	}
	var tasks []task
	for _, j := range jobs {
		parts := j.nb
		if !j.exact {
			parts = (len(j.pieces) + piecesPerCall - 1) / piecesPerCall
		}
		for p := range parts {
			tasks = append(tasks, task{j, p})
		}
	}
	return c.parallel(ctx, len(tasks), func(w *worker, i int) error {
		t := tasks[i]
		if t.j.exact {
			return c.exactChunk(ctx, w, t.j, t.part)
		}
		p0 := t.part * piecesPerCall
		return c.group(ctx, w, t.j, t.j.pieces[p0:min(p0+piecesPerCall, len(t.j.pieces))])
	})
}

// plan lists the jobs of the rectangles of one phase and prepares the
// approximate ones: it hashes every row (once per call), sorts each job's
// keys, sends its query rows to their key blocks and draws its samples.
// Forward and Backward both start from it, so that the gradient is that of
// the very choices the forward pass made for the same seed and inputs.
// When c.fresh, the rows of rectangles without keys get their result here.
func (c *call) plan(ctx context.Context, rects []rect) ([]*job, error) {
	s, a := c.s, c.a
	var jobs, prep []*job
	sorts := false
	for _, r := range rects {
		nq := r.q1 - r.q0
		for b := range s.B {
			nk := min(r.k1, c.o.KeyEnd(s, b)) - r.k0
			if nk <= 0 || nq <= 0 {
				if c.fresh {
					c.noKeys(b, r)
				}
				continue
			}
			for kvh := range s.HKV {
				j := &job{r: r, b: b, kvh: kvh, nk: nk, exact: a.exact(nq, nk)}
				switch {
				case j.exact:
					j.nb = (nq + exactChunk - 1) / exactChunk
				case a.block > 0:
					j.nb = (nk + a.block - 1) / a.block
					sorts = true
				}
				if !j.exact {
					prep = append(prep, j)
				}
				j.stream = jobStream(b, kvh, r.q0, r.q1, r.k0, r.k0+nk)
				jobs = append(jobs, j)
			}
		}
	}
	if sorts && c.qb == nil {
		if err := c.hash(ctx); err != nil {
			return nil, err
		}
	}
	err := c.parallel(ctx, len(prep), func(w *worker, i int) error {
		c.prepare(w, prep[i])
		return nil
	})
	if err != nil {
		return nil, err
	}
	return jobs, nil
}

// noKeys writes the result of rows that see no key, out 0 and lse -Inf, for
// the queries of r in batch row b.
func (c *call) noKeys(b int, r rect) {
	s := c.s
	for h := range s.H {
		row := (b*s.H+h)*s.N + r.q0
		clear(c.out[row*s.D : (row+r.q1-r.q0)*s.D])
		for i := range r.q1 - r.q0 {
			c.lse[row+i] = negInf
		}
	}
}

// emit hands one result row to out and lse.
func (c *call) emit(row int, out []float32, lse float32) {
	if c.fresh {
		copy(c.out[row*c.s.D:][:c.s.D], out)
		c.lse[row] = lse
		return
	}
	attn.MergeRow(c.out[row*c.s.D:][:c.s.D], &c.lse[row], out, lse)
}

// jobStream names the random stream of a job: a hash of the batch row, the
// key/value head, its queries [q0, q1) and its keys [k0, k1) after padding.
func jobStream(b, kvh, q0, q1, k0, k1 int) uint64 {
	h := uint64(0x243f6a8885a308d3)
	for _, x := range []int{b, kvh, q0, q1, k0, k1} {
		h = mix64(h ^ uint64(x))
	}
	return h
}

// mix64 is the SplitMix64 finaliser.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// hash fills c.qb and c.kb with the sortLSH bucket of every query row and
// every valid key row.
func (c *call) hash(ctx context.Context) error {
	s := c.s
	lsh, err := NewSortLSH(c.a.projs, s.D, c.a.seed)
	if err != nil {
		return err
	}
	c.qb = make([]uint32, s.B*s.H*s.N)
	c.kb = make([]uint32, s.B*s.HKV*s.M)
	const rows = 4096
	type part struct {
		x   []float32
		dst []uint32
	}
	var parts []part
	add := func(x []float32, dst []uint32) {
		for r0 := 0; r0 < len(dst); r0 += rows {
			r1 := min(r0+rows, len(dst))
			parts = append(parts, part{x[r0*s.D : r1*s.D], dst[r0:r1]})
		}
	}
	for b := range s.B {
		for h := range s.H {
			row := (b*s.H + h) * s.N
			add(c.q[row*s.D:], c.qb[row:row+s.N])
		}
		for kvh := range s.HKV {
			row := (b*s.HKV + kvh) * s.M
			add(c.k[row*s.D:], c.kb[row:row+c.o.KeyEnd(s, b)])
		}
	}
	return c.parallel(ctx, len(parts), func(w *worker, i int) error {
		w.proj = lsh.buckets(parts[i].dst, parts[i].x, w.proj)
		return nil
	})
}

// prepare sorts an approximate job's keys by bucket, sends each query row
// to its key block, cuts the rows into pieces, and draws and gathers the
// job's sampled columns.
func (c *call) prepare(w *worker, j *job) {
	s, a := c.s, c.a
	if a.block > 0 {
		kb := c.kb[(j.b*s.HKV+j.kvh)*s.M+j.r.k0:][:j.nk]
		j.keys = make([]int32, j.nk)
		w.counts, w.keys = sortByBucket(j.keys, kb, a.projs, w.counts, w.keys)
		w.sorted = grow(w.sorted, j.nk)
		for p, key := range j.keys {
			w.sorted[p] = kb[key]
		}
	}
	c.assign(w, j)
	if a.samples <= 0 {
		return
	}
	d := s.D
	kv := ((j.b*s.HKV + j.kvh) * s.M) * d
	kBase, vBase := c.k[kv:], c.v[kv:]
	w.pcg.Seed(a.seed, j.stream)

	// Uniform: min(Samples, nk) distinct sorted positions, kept in
	// increasing order so that the samples inside any key block are one
	// run of them.
	ns := min(a.samples, j.nk)
	j.uniform = slices.Clone(w.choose(j.nk, ns))
	slices.Sort(j.uniform)
	j.uniK, j.uniV = make([]float32, ns*d), make([]float32, ns*d)
	for t, p := range j.uniform {
		key := j.r.k0 + j.key(int(p))
		copy(j.uniK[t*d:][:d], kBase[key*d:][:d])
		copy(j.uniV[t*d:][:d], vBase[key*d:][:d])
	}
	if a.sampling != ValueNorm || ns == j.nk || c.grad {
		return // with every column sampled the result is exact
	}

	// Value norm: Samples positions drawn with replacement with
	// probability p = |v|²/W over all keys of the job, the value rows
	// scaled by the importance weight 1/(Samples·p) = W/(Samples·|v|²),
	// which does not depend on the block that later excludes some.
	norm := make([]float64, j.nk)
	cum := make([]float64, j.nk+1)
	j.vlo, j.vhi = make([]float32, d), make([]float32, d)
	for i := range d {
		j.vlo[i], j.vhi[i] = float32(math.Inf(1)), float32(math.Inf(-1))
	}
	for p := range j.nk {
		key := j.r.k0 + j.key(p)
		var n2 float64
		for i, x := range vBase[key*d:][:d] {
			n2 += float64(x) * float64(x)
			j.vlo[i], j.vhi[i] = min(j.vlo[i], x), max(j.vhi[i], x)
		}
		norm[p] = n2
		cum[p+1] = cum[p] + n2
	}
	total := cum[j.nk]
	if !(total > 0) {
		return // all-zero values (or NaN): no numerator samples
	}
	ns = a.samples
	j.byNorm = make([]int32, ns)
	for t := range ns {
		j.byNorm[t] = int32(pickByNorm(norm, cum, w.rng.Float64()*total))
	}
	slices.Sort(j.byNorm)
	j.normK, j.normV = make([]float32, ns*d), make([]float32, ns*d)
	for t, p := range j.byNorm {
		key := j.r.k0 + j.key(int(p))
		copy(j.normK[t*d:][:d], kBase[key*d:][:d])
		f := float32(total / (float64(ns) * norm[p]))
		for i, x := range vBase[key*d:][:d] {
			j.normV[t*d+i] = f * x
		}
	}
}

// assign fills j.rows and j.pieces. A query row goes to the key block that
// holds the middle of its bucket's run in the sorted keys (or the place
// the run would take, between its neighbours in Gray order, when no key
// has that bucket): which block a query joins depends on that query and
// the keys alone, never on the other queries. (The paper sorts the queries
// too and pairs the b-th block of each; a query's block then moves with
// every other query, later ones included, and the causal result at a
// position would depend on the future.) Within a block the rows keep their
// order r·g + hh, positions first, so the gathered rows of earlier
// positions come first whatever later queries join.
func (c *call) assign(w *worker, j *job) {
	s, a := c.s, c.a
	g := s.Group()
	nq := j.r.q1 - j.r.q0
	rows := g * nq
	j.rows = make([]int32, rows)
	if a.block <= 0 {
		for x := range j.rows {
			j.rows[x] = int32(x)
		}
		for r0 := 0; r0 < rows; r0 += pieceRows {
			j.pieces = append(j.pieces, piece{-1, r0, min(r0+pieceRows, rows)})
		}
		j.start = []int32{0, int32(rows)}
		return
	}
	sorted := w.sorted[:j.nk]
	w.block = grow(w.block, rows)
	for hh := range g {
		qb := c.qb[(j.b*s.H+j.kvh*g+hh)*s.N+j.r.q0:][:nq]
		for r, bucket := range qb {
			lo, _ := slices.BinarySearch(sorted, bucket)
			hi, _ := slices.BinarySearch(sorted[lo:], bucket+1)
			p := min(lo+hi/2, j.nk-1)
			w.block[r*g+hh] = int32(((p+1)*j.nb - 1) / j.nk)
		}
	}
	// A counting sort of the rows by block, stable in x.
	start := grow(w.start, j.nb+1)
	clear(start)
	for _, bl := range w.block {
		start[bl+1]++
	}
	for bl := range j.nb {
		start[bl+1] += start[bl]
	}
	next := grow(w.next, j.nb)
	copy(next, start)
	for x, bl := range w.block {
		j.rows[next[bl]] = int32(x)
		next[bl]++
	}
	for bl := range j.nb {
		for r0 := int(start[bl]); r0 < int(start[bl+1]); r0 += pieceRows {
			j.pieces = append(j.pieces, piece{bl, r0, min(r0+pieceRows, int(start[bl+1]))})
		}
	}
	w.start, w.next = start, next
	j.start = slices.Clone(start)
	// Largest first, so that the pieces sharing an exact call (padded to
	// the largest) are of similar sizes and the long tasks start early.
	slices.SortStableFunc(j.pieces, func(x, y piece) int { return (y.r1 - y.r0) - (x.r1 - x.r0) })
}

// pickByNorm returns the position whose interval [cum[p], cum[p+1]) holds
// u, for u in [0, cum[len(norm)]): position p with probability
// norm[p]/total.
func pickByNorm(norm, cum []float64, u float64) int {
	p := sort.Search(len(norm), func(p int) bool { return cum[p+1] > u })
	if p == len(norm) { // u rounded up to the total: the last positive row
		p--
		for p > 0 && !(norm[p] > 0) {
			p--
		}
	}
	return p
}

// key returns the offset of the key at sorted position p.
func (j *job) key(p int) int {
	if j.keys == nil {
		return p
	}
	return int(j.keys[p])
}

// piecesPerCall is the number of pieces one task computes, as the batch
// dimension of each exact call: per-call costs of the kernel are paid once
// for them all. It does not depend on the number of workers, so neither
// does the output.
const piecesPerCall = 8

// group computes the pieces ps of an approximate job: for each, exact
// attention of its query rows against its key block, merged with the
// estimate from the job's sampled columns outside that key block. The
// results go to out.
//
// The pieces are the batch of each exact call: queries [pieces][qmax][D]
// (the rows of every head of the group together, one kernel head), keys
// [pieces][kmax][D], zero past each piece's own length, and each key
// block's length its valid length (Options.KVLen). Rows past a piece's
// length are computed and dropped; every row's result is that of its own
// lane of the kernel, whatever shares the call.
func (c *call) group(ctx context.Context, w *worker, j *job, ps []piece) error {
	s, a := c.s, c.a
	d, g := s.D, s.Group()
	nbl := len(ps)
	qmax, kmax := 0, 0
	for _, pc := range ps {
		qmax = max(qmax, pc.r1-pc.r0)
		if pc.bl >= 0 {
			ka, kz := span(j.nk, j.nb, pc.bl)
			kmax = max(kmax, kz-ka)
		}
	}
	if qmax == 0 {
		return nil
	}
	rows := nbl * qmax // rows of every call, padding included
	w.q = grow(w.q, rows*d)
	for i, pc := range ps {
		dst := w.q[i*qmax*d:][:qmax*d]
		for t, x := range j.rows[pc.r0:pc.r1] {
			copy(dst[t*d:][:d], c.q[c.queryRow(j, int(x), g)*d:][:d])
		}
		clear(dst[(pc.r1-pc.r0)*d:])
	}
	shape := attn.Shape{B: nbl, H: 1, HKV: 1, N: qmax, D: d}
	opts := attn.Options{Scale: c.scale, Workers: 1}
	w.kvlen = grow(w.kvlen, nbl)
	w.out, w.lse = grow(w.out, rows*d), grow(w.lse, rows)
	have := false
	if kmax > 0 {
		// Gathered here, not packed by the kernel straight through the
		// sort order (flash.ForwardKV): the copy measured faster than the
		// kernel's transposing pack from scattered rows.
		kv := ((j.b*s.HKV+j.kvh)*s.M + j.r.k0) * d
		kBase, vBase := c.k[kv:], c.v[kv:]
		w.k, w.v = grow(w.k, nbl*kmax*d), grow(w.v, nbl*kmax*d)
		for i, pc := range ps {
			ka, kz := 0, 0
			if pc.bl >= 0 {
				ka, kz = span(j.nk, j.nb, pc.bl)
			}
			dk, dv := w.k[i*kmax*d:][:kmax*d], w.v[i*kmax*d:][:kmax*d]
			for t := range kz - ka {
				key := j.key(ka + t)
				copy(dk[t*d:][:d], kBase[key*d:][:d])
				copy(dv[t*d:][:d], vBase[key*d:][:d])
			}
			clear(dk[(kz-ka)*d:])
			clear(dv[(kz-ka)*d:])
			w.kvlen[i] = kz - ka
		}
		shape.M = kmax
		opts.KVLen = w.kvlen
		if err := a.bk.Forward(ctx, shape, w.q, w.k, w.v, opts, w.out, w.lse); err != nil {
			return err
		}
		have = true
	}
	w.out2, w.lse2 = grow(w.out2, rows*d), grow(w.lse2, rows)
	sampled, err := c.sampled(ctx, w, j, ps, shape)
	if err != nil {
		return err
	}
	switch {
	case sampled && have:
		if err := attn.Merge(w.out, w.lse, w.out2, w.lse2, d); err != nil {
			return err
		}
	case sampled:
		w.out, w.out2 = w.out2, w.out
		w.lse, w.lse2 = w.lse2, w.lse
	case !have: // no key block and no sample: the rows see nothing
		clear(w.out)
		for i := range w.lse {
			w.lse[i] = negInf
		}
	}
	for i, pc := range ps {
		for t, x := range j.rows[pc.r0:pc.r1] {
			y := i*qmax + t
			c.emit(c.queryRow(j, int(x), g), w.out[y*d:][:d], w.lse[y])
		}
	}
	return nil
}

// queryRow returns the row in Q[B][H][N] of row x = r·g + hh of job j.
func (c *call) queryRow(j *job, x, g int) int {
	s := c.s
	return (j.b*s.H+j.kvh*g+x%g)*s.N + j.r.q0 + x/g
}

// sampled estimates, for the query rows of the pieces ps gathered in w.q,
// attention over the keys of the job outside each piece's key block, from
// the job's sampled columns outside it, into w.out2 and w.lse2. It reports
// false when no piece has anything to estimate.
func (c *call) sampled(ctx context.Context, w *worker, j *job, ps []piece, shape attn.Shape) (bool, error) {
	a := c.a
	d := c.s.D
	nbl := len(ps)
	ns := len(j.uniform)
	if ns == 0 {
		return false, nil
	}
	// The samples inside a key block are one run [lo, hi) of the sorted
	// samples; the others, kept, are a uniform sample of the rest of the
	// keys. Each piece gets its kept samples, packed.
	w.k2, w.v2 = grow(w.k2, nbl*ns*d), grow(w.v2, nbl*ns*d)
	w.kvlen2 = grow(w.kvlen2, nbl)
	w.logw = grow(w.logw, nbl)
	w.whole = grow(w.whole, nbl)
	anyKept, exact := false, true
	for i, pc := range ps {
		o := j.outside(pc.bl)
		w.kvlen2[i] = o.kept
		w.whole[i] = o.kept == o.rest
		w.logw[i] = o.logw
		if o.kept == 0 {
			continue
		}
		anyKept = true
		exact = exact && o.kept == o.rest
		lo, hi := o.lo, o.hi
		packRuns(w.k2[i*ns*d:][:ns*d], j.uniK, lo, hi, d)
		packRuns(w.v2[i*ns*d:][:ns*d], j.uniV, lo, hi, d)
	}
	if !anyKept {
		return false, nil
	}
	shape.M = ns
	opts := attn.Options{Scale: c.scale, Workers: 1, KVLen: w.kvlen2}
	if err := a.bk.Forward(ctx, shape, w.q, w.k2, w.v2, opts, w.out2, w.lse2); err != nil {
		return false, err
	}
	per := len(w.lse2) / nbl
	for i := range nbl {
		for r := range per {
			w.lse2[i*per+r] += w.logw[i] // -Inf stays -Inf
		}
	}
	if a.sampling != ValueNorm || exact {
		return true, nil // with every column of the rest sampled it is exact
	}

	// The product with V from the value-norm samples outside each block:
	// Σ_j e^{s_ij} v_j ≈ Σ_t e^{s_i j_t} v'_t with v' the weighted value
	// rows. The exact kernel returns that sum over Σ_t e^{s_i j_t}, which
	// its lse gives back; dividing by the uniform estimate of the
	// normaliser gives the output. A piece with no value-norm sample
	// outside its block (or all-zero values) gets a zero numerator: the
	// kernel's output 0 and lse -Inf do that.
	nv := len(j.byNorm)
	if nv == 0 { // all-zero values: the numerator is zero
		for i := range nbl {
			if !w.whole[i] {
				clear(w.out2[i*per*d : (i+1)*per*d])
			}
		}
		return true, nil
	}
	w.k2, w.v2 = grow(w.k2, nbl*nv*d), grow(w.v2, nbl*nv*d)
	w.kvlen3 = grow(w.kvlen3, nbl)
	for i, pc := range ps {
		lo, hi := 0, 0
		if pc.bl >= 0 {
			ka, kz := span(j.nk, j.nb, pc.bl)
			lo, _ = slices.BinarySearch(j.byNorm, int32(ka))
			hi, _ = slices.BinarySearch(j.byNorm, int32(kz))
		}
		w.kvlen3[i] = nv - (hi - lo)
		packRuns(w.k2[i*nv*d:][:nv*d], j.normK, lo, hi, d)
		packRuns(w.v2[i*nv*d:][:nv*d], j.normV, lo, hi, d)
	}
	w.out3, w.lse3 = grow(w.out3, len(w.out2)), grow(w.lse3, len(w.lse2))
	shape.M = nv
	opts.KVLen = w.kvlen3
	if err := a.bk.Forward(ctx, shape, w.q, w.k2, w.v2, opts, w.out3, w.lse3); err != nil {
		return false, err
	}
	for i := range nbl {
		if w.whole[i] || w.kvlen2[i] == 0 {
			continue // exact already, or no estimate of the normaliser
		}
		for r := range per {
			x := i*per + r
			ratio(w.out2[x*d:][:d], w.out3[x*d:][:d], float64(w.lse3[x])-float64(w.lse2[x]), j.vlo, j.vhi)
		}
	}
	return true, nil
}

// ratio sets dst to e^{dl}·src, the value-norm numerator over the uniform
// normaliser, each coordinate clipped to the range [lo, hi] of the values
// it estimates an average of. Where the two samples disagree by far
// (a large logit that only the numerator's sample caught) e^{dl} is past
// any float: unclipped, that is Inf, and Inf·0 NaN. The exact average lies
// in the range, so the clip never moves a coordinate away from it. NaN in
// src (from NaN inputs) stays NaN.
func ratio(dst, src []float32, dl float64, lo, hi []float32) {
	f := math.Exp(dl)
	for c, y := range src {
		var z float64
		if y != 0 {
			z = f * float64(y)
		}
		dst[c] = float32(min(max(z, float64(lo[c])), float64(hi[c])))
	}
}

// sampledRest is what the sampled part of the rows of one key block uses:
// the rest keys of the job outside the block, the run [lo, hi) of the
// sorted samples inside it (left out), the kept samples outside it and
// their log weight log(rest/kept).
type sampledRest struct {
	rest, lo, hi, kept int
	logw               float32
}

// outside returns the sampled part of key block bl of j (-1: no block
// part, every key is the rest). Given kept, the kept samples are a uniform
// sample of the rest, so each stands for rest/kept of its keys in the
// normaliser; the weight cancels in the normalised output of the part, not
// in its merge with the block.
func (j *job) outside(bl int) sampledRest {
	ns := len(j.uniform)
	o := sampledRest{rest: j.nk}
	if bl >= 0 {
		ka, kz := span(j.nk, j.nb, bl)
		o.rest -= kz - ka
		o.lo, _ = slices.BinarySearch(j.uniform, int32(ka))
		o.hi, _ = slices.BinarySearch(j.uniform, int32(kz))
	}
	o.kept = ns - (o.hi - o.lo)
	if o.rest == 0 {
		o.kept = 0 // nothing outside the block
	}
	if o.kept > 0 {
		o.logw = float32(math.Log(float64(o.rest) / float64(o.kept)))
	}
	return o
}

// packRuns copies the rows of src outside the run [lo, hi) to the front of
// dst and zeroes the rest of dst; rows have d elements.
func packRuns(dst, src []float32, lo, hi, d int) {
	n := copy(dst, src[:lo*d])
	n += copy(dst[n:], src[hi*d:])
	clear(dst[n:])
}

// exactChunk computes rows [part·exactChunk, …) of an exact job.
func (c *call) exactChunk(ctx context.Context, w *worker, j *job, part int) error {
	s := c.s
	d, g := s.D, s.Group()
	nq := j.r.q1 - j.r.q0
	qa, qz := part*exactChunk, min((part+1)*exactChunk, nq)
	qn := qz - qa
	w.q = grow(w.q, g*qn*d)
	for hh := range g {
		base := (j.b*s.H+j.kvh*g+hh)*s.N + j.r.q0 + qa
		copy(w.q[hh*qn*d:][:qn*d], c.q[base*d:])
	}
	kv := ((j.b*s.HKV+j.kvh)*s.M + j.r.k0) * d
	rows := g * qn
	w.out, w.lse = grow(w.out, rows*d), grow(w.lse, rows)
	shape := attn.Shape{B: 1, H: g, HKV: 1, N: qn, M: j.nk, D: d}
	opts := attn.Options{Scale: c.scale, Workers: 1}
	if err := c.a.bk.Forward(ctx, shape, w.q, c.k[kv:kv+j.nk*d], c.v[kv:kv+j.nk*d], opts, w.out, w.lse); err != nil {
		return err
	}
	for hh := range g {
		base := (j.b*s.H+j.kvh*g+hh)*s.N + j.r.q0 + qa
		for r := range qn {
			x := hh*qn + r
			c.emit(base+r, w.out[x*d:][:d], w.lse[x])
		}
	}
	return nil
}

// parallel runs f(w, i) for i in [0, n) on up to o.Workers goroutines
// through the module's worker pool; each goroutine has its own worker
// scratch, kept in c across the call's phases.
func (c *call) parallel(ctx context.Context, n int, f func(w *worker, i int) error) error {
	nw := c.o.WorkerCount(runtime.GOMAXPROCS(0), n)
	for len(c.workers) < nw {
		c.workers = append(c.workers, nil)
	}
	return parallel.ForWorker(ctx, nw, n, func(wi, i int) error {
		if c.workers[wi] == nil {
			c.workers[wi] = newWorker()
		}
		return f(c.workers[wi], i)
	})
}

// worker is one goroutine's scratch, reused across tasks and phases.
type worker struct {
	q, k, v                []float32 // gathered queries, keys and values
	out, lse               []float32 // block part, then the merged result
	out2, lse2, out3, lse3 []float32 // sampled part
	proj                   []float32 // LSH projections
	counts                 []int32   // counting sort
	keys                   []uint64  // comparison sort
	k2, v2                 []float32 // the kept samples of each block
	kvlen, kvlen2, kvlen3  []int     // key counts of the blocks in a call
	logw                   []float32 // sample weight of each block
	whole                  []bool    // the block's samples are all of the rest
	sorted                 []uint32  // buckets of the sorted keys
	block, start, next     []int32   // key block of each query row; counting sort
	chooser
}

func newWorker() *worker { return &worker{chooser: newChooser()} }

// chooser draws sampled positions.
type chooser struct {
	pick, perm []int32
	seen       map[int32]struct{}
	pcg        *rand.PCG
	rng        *rand.Rand
}

func newChooser() chooser {
	pcg := rand.NewPCG(0, 0)
	return chooser{pcg: pcg, rng: rand.New(pcg), seen: map[int32]struct{}{}}
}

// picks returns the sample ranks of a decoded query at position p of
// key/value head kvh: ns distinct ranks of [0, nk) by choose, from
// PCG(seed, s) with s a SplitMix64 hash of kvh and p. The batch row is
// left out, so that a sequence gets the same samples whichever batch it
// is decoded in.
func (ch *chooser) picks(seed uint64, kvh, p, nk, ns int) []int32 {
	h := uint64(0x452821e638d01377)
	for _, x := range []int{kvh, p} {
		h = mix64(h ^ uint64(x))
	}
	ch.pcg.Seed(seed, h)
	return ch.choose(nk, ns)
}

// choose returns k distinct integers from [0, n), every k-subset equally
// likely, in the order drawn: all of them when k >= n, else a partial
// Fisher–Yates shuffle when k is a large part of n, else Floyd's algorithm.
func (w *chooser) choose(n, k int) []int32 {
	pick := w.pick[:0]
	switch {
	case k >= n:
		for i := range n {
			pick = append(pick, int32(i))
		}
	case k > n/8:
		w.perm = grow(w.perm, n)
		for i := range w.perm {
			w.perm[i] = int32(i)
		}
		for i := range k {
			t := i + w.rng.IntN(n-i)
			w.perm[i], w.perm[t] = w.perm[t], w.perm[i]
		}
		pick = append(pick, w.perm[:k]...)
	default:
		clear(w.seen)
		for i := n - k; i < n; i++ {
			t := int32(w.rng.IntN(i + 1))
			if _, dup := w.seen[t]; dup {
				t = int32(i)
			}
			w.seen[t] = struct{}{}
			pick = append(pick, t)
		}
	}
	return pick
}
