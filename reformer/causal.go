package reformer

import (
	"context"
	"math"
	"runtime"
	"slices"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// rule is the causal rule of Forward and the decoders: the keys a query
// at position p attends to when it may see the keys [0, vis). They are,
// each once, the window (the Window latest visible keys, p itself
// included) and, per round, the 2·Bucket latest visible keys filed under
// the query's bucket, without the query's own position under the self
// rule (unless nothing else is left). Every one of them is at or before
// p, and the buckets of a key depend on that key alone, so the choice,
// like the keys and values chosen, is a function of positions <= p: the
// output at p does not change with later tokens, nor with the length of
// the pass.
type rule struct {
	rounds      int
	per         int // keys taken per round: 2·Bucket
	window      int
	excludeSelf bool
}

func (cfg Config) rule() rule {
	return rule{rounds: cfg.Hashes, per: 2 * cfg.Bucket, window: cfg.Window, excludeSelf: cfg.ExcludeSelf}
}

// maxCandidates bounds the keys of one query row: its window and rounds,
// never more than the vis keys it may see.
func (ru rule) maxCandidates(vis int) int {
	return min(ru.rounds*ru.per+ru.window, vis)
}

// seen is a set of positions for removing duplicates: pos is in it when
// stamp[pos] == gen, so that emptying it costs nothing.
type seen struct {
	stamp []uint32
	gen   uint32
}

// reset empties the set and makes room for positions below n.
func (st *seen) reset(n int) {
	if len(st.stamp) < n {
		st.stamp = append(st.stamp, make([]uint32, n-len(st.stamp))...)
	}
	st.gen++
	if st.gen == 0 { // wrapped: old stamps could collide
		clear(st.stamp)
		st.gen = 1
	}
}

// gather returns, in cand's memory, the positions the query at p attends
// to when it may see the keys [0, vis): first the window from the latest
// key down, then round by round the latest keys of lists[r] (the round's
// keys in the query's bucket, by ascending position; later ones are
// ignored) from the latest down, each position where it first appears.
// Forward and the decoders both build the candidates here, in this order,
// so that they add up the same terms in the same order.
func (ru rule) gather(cand []int32, st *seen, p, vis int, lists [][]int32) []int32 {
	cand = cand[:0]
	if vis <= 0 {
		return cand
	}
	st.reset(vis)
	stamp, gen := st.stamp[:vis], st.gen
	self := int32(-1)
	if ru.excludeSelf && p < vis {
		self = int32(p)
	}
	for pos := min(p, vis-1); pos >= max(0, p-ru.window+1); pos-- {
		if int32(pos) != self {
			stamp[pos] = gen
			cand = append(cand, int32(pos))
		}
	}
	for _, l := range lists[:ru.rounds] {
		idx, _ := slices.BinarySearch(l, int32(vis))
		for _, pos := range slices.Backward(l[max(0, idx-ru.per):idx]) {
			if stamp[pos] != gen && pos != self {
				stamp[pos] = gen
				cand = append(cand, pos)
			}
		}
	}
	if len(cand) == 0 && self >= 0 {
		cand = append(cand, self) // the self rule's fallback
	}
	return cand
}

// attendRow writes to out the softmax attention of the query qh over the
// keys and values (rows of d floats, ld apart) at the positions cand,
// with logits scaled by scale, and returns the log-sum-exp. logits is
// scratch of at least len(cand) floats. With no candidate, out is 0 and
// the lse -Inf.
func attendRow(qh, keys, vals []float32, ld, d int, cand []int32, scale float32, logits, out []float32) float32 {
	clear(out)
	if len(cand) == 0 {
		return negInf
	}
	logits = logits[:len(cand)]
	for i, pos := range cand {
		logits[i] = simd.Dot(qh, keys[int(pos)*ld:][:d]) * scale
	}
	mx, sum := softmaxWeights(logits)
	for i, pos := range cand {
		simd.Axpy(logits[i], vals[int(pos)*ld:][:d], out)
	}
	simd.Scale(out, 1/sum)
	return mx + float32(math.Log(float64(sum)))
}

// softmaxWeights sets the logits to their exponentials less the largest,
// and returns that largest (the shift) and their sum.
func softmaxWeights(logits []float32) (mx, sum float32) {
	mx = simd.Max(logits)
	if math.IsInf(float64(mx), 0) || math.IsNaN(float64(mx)) {
		// Inf or NaN inputs: let IEEE arithmetic say so, as the exact
		// kernel does, rather than dividing 0 by 0 silently.
		mx = 0
	}
	return mx, simd.ExpSum(logits, mx)
}

// keyIndex files the valid keys of one (batch row, kv head) for the
// causal rule: per round, the keys sorted by (bucket, position), so that
// a bucket's keys are a run found by binary search, with no table over
// the buckets.
type keyIndex struct {
	n      int     // valid keys
	bucket []int32 // [rounds][n]: the bucket of each sorted key
	pos    []int32 // [rounds][n]: the position of each sorted key
}

// build hashes the first n keys of k (rows of d floats) and sorts them.
func (ix *keyIndex) build(hs *hasher, k []float32, n, d int, proj []float32) {
	R := hs.rounds
	ix.n = n
	kb := make([]int32, n*R)
	for j := range n {
		hs.hashRow(k[j*d:][:d], proj, kb[j*R:][:R])
	}
	ix.bucket = make([]int32, R*n)
	ix.pos = make([]int32, R*n)
	nb := hs.buckets
	var count []int32
	if nb <= 4*n+64 {
		count = make([]int32, nb+1)
	}
	for r := range R {
		bs, ps := ix.bucket[r*n:][:n], ix.pos[r*n:][:n]
		if count == nil {
			// Far more buckets than keys: a comparison sort costs less
			// than a pass over the buckets.
			for j := range n {
				ps[j] = int32(j)
			}
			slices.SortFunc(ps, func(a, b int32) int {
				if c := kb[int(a)*R+r] - kb[int(b)*R+r]; c != 0 {
					return int(c)
				}
				return int(a - b)
			})
		} else {
			// Counting sort; positions ascend within a bucket because
			// keys are visited in order.
			clear(count)
			for j := range n {
				count[kb[j*R+r]+1]++
			}
			for i := range nb {
				count[i+1] += count[i]
			}
			for j := range n {
				b := kb[j*R+r]
				ps[count[b]] = int32(j)
				count[b]++
			}
		}
		for x, j := range ps {
			bs[x] = kb[int(j)*R+r]
		}
	}
}

// list returns round r's keys in bucket b, by ascending position.
func (ix *keyIndex) list(r int, b int32) []int32 {
	lo, hi := ix.span(r, b)
	return ix.pos[r*ix.n+lo : r*ix.n+hi]
}

// span returns where round r's keys in bucket b lie in its sorted order:
// [lo, hi).
func (ix *keyIndex) span(r int, b int32) (lo, hi int) {
	bs := ix.bucket[r*ix.n:][:ix.n]
	lo, _ = slices.BinarySearch(bs, b)
	n, _ := slices.BinarySearch(bs[lo:], b+1)
	return lo, lo + n
}

// rowScratch is one goroutine's scratch for attending query rows by the
// causal rule.
type rowScratch struct {
	proj   []float32
	qb     []int32
	lists  [][]int32
	seen   seen
	cand   []int32
	logits []float32
}

func newRowScratch(hs *hasher, ru rule, vis int) *rowScratch {
	n := ru.maxCandidates(vis)
	return &rowScratch{
		proj:   hs.rowScratch(),
		qb:     make([]int32, hs.rounds),
		lists:  make([][]int32, hs.rounds),
		seen:   seen{stamp: make([]uint32, vis)},
		cand:   make([]int32, 0, n+1),
		logits: make([]float32, n+1),
	}
}

// logitsFor returns scratch for the logits of n candidates.
func (w *rowScratch) logitsFor(n int) []float32 {
	if len(w.logits) < n {
		w.logits = make([]float32, n+n/4)
	}
	return w.logits
}

// causalRows is the number of query rows of one task of causalForward.
const causalRows = 32

// causalForward is Forward under the causal mask by the causal rule, for
// every query row on its own: first the keys of every (batch row, kv
// head) are hashed and sorted, then each query is hashed, gathers its
// candidates and attends to them. A row's arithmetic depends on nothing
// but its own query and candidates, so the result is the same whatever
// the other rows, the length or the workers.
func (l *LSH) causalForward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, factors []int, out, lse []float32) error {
	cfg := l.cfg
	ru := cfg.rule()
	hs := newHasher(cfg.Seed, cfg.Hashes, s.D, factors)
	scale := o.ScaleFor(s.D)
	procs := runtime.GOMAXPROCS(0)
	heads, err := buildIndexes(ctx, s, k, o, hs)
	if err != nil {
		return err
	}
	blocks := (s.N + causalRows - 1) / causalRows
	tasks := s.B * s.H * blocks
	newScratch := func() *rowScratch { return newRowScratch(hs, ru, s.M) }
	return parallel.For(ctx, o.WorkerCount(procs, tasks), tasks, newScratch, func(w *rowScratch, t int) error {
		bh, blk := t/blocks, t%blocks
		b, h := bh/s.H, bh%s.H
		kvh := b*s.HKV + h/s.Group()
		ix := &heads[kvh]
		kb, vb := k[kvh*s.M*s.D:][:s.M*s.D], v[kvh*s.M*s.D:][:s.M*s.D]
		for i := blk * causalRows; i < min((blk+1)*causalRows, s.N); i++ {
			row := bh*s.N + i
			p := s.M - s.N + i
			vis := o.VisibleKeys(s, b, i)
			qh := q[row*s.D:][:s.D]
			if cfg.SharedQK {
				// Hashing the key of the same position (the normalised
				// query, N == M) gives the query its key's buckets.
				hs.hashRow(kb[p*s.D:][:s.D], w.proj, w.qb)
			} else {
				hs.hashRow(qh, w.proj, w.qb)
			}
			for r := range w.lists {
				w.lists[r] = ix.list(r, w.qb[r])
			}
			w.cand = ru.gather(w.cand, &w.seen, p, vis, w.lists)
			x := attendRow(qh, kb, vb, s.D, s.D, w.cand, scale, w.logitsFor(len(w.cand)), out[row*s.D:][:s.D])
			if lse != nil {
				lse[row] = x
			}
		}
		return nil
	})
}

// buildIndexes files the valid keys of every (batch row, kv head) for the
// causal rule.
func buildIndexes(ctx context.Context, s attn.Shape, k []float32, o attn.Options, hs *hasher) ([]keyIndex, error) {
	heads := make([]keyIndex, s.B*s.HKV)
	err := parallel.For(ctx, o.WorkerCount(runtime.GOMAXPROCS(0), len(heads)), len(heads), hs.rowScratch, func(proj []float32, i int) error {
		heads[i].build(hs, k[i*s.M*s.D:][:s.M*s.D], o.KeyEnd(s, i/s.HKV), s.D, proj)
		return nil
	})
	return heads, err
}
