package reformer

import (
	"context"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// The causal rule's backward pass splits each query's keys by where gather
// takes them first: its window, else the first round whose band (the
// 2·Bucket latest visible keys of the query's bucket) holds them. Each
// (query, key) pair is then in exactly one part, and its gradient terms
// depend on the pair and on the row's lse and rowsum(dO ∘ O) alone, so
// the parts are computed apart and added:
//
//   - the window is a band of positions, flash's Backward with
//     windowPattern (given the rule's lse and output, it computes just
//     these pairs' terms);
//   - round r is a band in its (bucket, position) order: sorted by the
//     end of their bands, the rows of all buckets make runs whose keys
//     are contiguous in that order, attended in tiles with matrix
//     products as the sorted chunks are, less the pairs of the window and
//     of the earlier rounds.

// gradRunRows is the number of rows of one task of a round.
const gradRunRows = tileRows * chunkRun

// windowPattern is the window of the causal rule as a flash pattern: the
// query at position p sees the keys after p-w (up to p, by the causal
// mask), less p itself under the self rule.
type windowPattern struct {
	w    int
	excl bool
}

// KeyRanges implements flash.Pattern: the keys from p1-w on are seen by
// every query of [p0, p1) unless the self rule takes one from each.
func (wp windowPattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	if wp.excl {
		return append(dst, flash.Range{Lo: p0 - wp.w + 1, Hi: p1})
	}
	if lo, mid := p0-wp.w+1, p1-wp.w; mid > lo {
		dst = append(dst, flash.Range{Lo: lo, Hi: mid})
	}
	return append(dst, flash.Range{Lo: p1 - wp.w, Hi: p1, Full: true})
}

// Visible implements flash.Pattern.
func (wp windowPattern) Visible(p, j int) bool { return j > p-wp.w && !(wp.excl && j == p) }

// MaskRow implements flash.RowMasker.
func (wp windowPattern) MaskRow(p, j0 int, s []float32) {
	for j := range s {
		if key := j0 + j; key <= p-wp.w || (wp.excl && key == p) {
			s[j] = negInf
		}
	}
}

// causalPair is the backward pass's view of one (batch row, kv head)
// under the causal rule: the keys' places in every round's sorted order,
// the query rows' bands, and the rows of every round by band.
type causalPair struct {
	b, kvh int
	ix     *keyIndex
	rank   []int32   // [R][n]: the place of each valid key in round r's order
	lo, hi []int32   // [R][g·N]: the band of group row hl·N+i, places [lo, hi)
	order  [][]int32 // [R]: the group rows with a band, by its end
	runs   [][]int   // [R]: where in order[r] each task starts, and the end
	self   []bool    // [g·N], under the self rule: the row fell back on its own key
}

func (cp *causalPair) build(l *LSH, s attn.Shape, o attn.Options, q, k []float32, hs *hasher, proj []float32) {
	cfg := l.cfg
	R, per, gs := cfg.Hashes, 2*cfg.Bucket, s.Group()
	nq, n := gs*s.N, cp.ix.n
	ix := cp.ix
	cp.rank = make([]int32, R*n)
	for r := range R {
		for x, pos := range ix.pos[r*n:][:n] {
			cp.rank[r*n+int(pos)] = int32(x)
		}
	}
	cp.lo, cp.hi = make([]int32, R*nq), make([]int32, R*nq)
	if cfg.ExcludeSelf {
		cp.self = make([]bool, nq)
	}
	qb := make([]int32, R)
	kb := k[(cp.b*s.HKV+cp.kvh)*s.M*s.D:][:s.M*s.D]
	for hl := range gs {
		for i := range s.N {
			gr := hl*s.N + i
			row := (cp.b*s.H+cp.kvh*gs+hl)*s.N + i
			p, vis := s.M-s.N+i, o.VisibleKeys(s, cp.b, i)
			if vis == 0 {
				continue
			}
			if cfg.SharedQK {
				hs.hashRow(kb[p*s.D:][:s.D], proj, qb)
			} else {
				hs.hashRow(q[row*s.D:][:s.D], proj, qb)
			}
			other := false // a key besides p itself
			for r := range R {
				a, e := ix.span(r, qb[r])
				at, _ := slices.BinarySearch(ix.pos[r*n+a:r*n+e], int32(vis))
				hi := a + at
				lo := max(a, hi-per)
				cp.lo[r*nq+gr], cp.hi[r*nq+gr] = int32(lo), int32(hi)
				other = other || hi-lo > 1 || (hi-lo == 1 && ix.pos[r*n+lo] != int32(p))
			}
			if cp.self != nil && p >= 0 && p < vis {
				wlo, whi := max(0, p-cfg.Window+1), min(p, vis-1) // the window, [wlo, whi]
				other = other || whi > wlo || (whi == wlo && whi != p)
				cp.self[gr] = !other
			}
		}
	}
	// Counting sort of the rows with a band by its end, rows in order
	// within an end.
	count := make([]int32, n+2)
	cp.order = make([][]int32, R)
	cp.runs = make([][]int, R)
	for r := range R {
		clear(count)
		lo, hi := cp.lo[r*nq:][:nq], cp.hi[r*nq:][:nq]
		rows := 0
		for gr := range nq {
			if hi[gr] > lo[gr] {
				count[hi[gr]+1]++
				rows++
			}
		}
		for x := range n + 1 {
			count[x+1] += count[x]
		}
		order := make([]int32, rows)
		for gr := range nq {
			if hi[gr] > lo[gr] {
				order[count[hi[gr]]] = int32(gr)
				count[hi[gr]]++
			}
		}
		cp.order[r] = order
		for a := 0; a < rows; a += gradRunRows {
			cp.runs[r] = append(cp.runs[r], a)
		}
		cp.runs[r] = append(cp.runs[r], rows)
	}
}

// causalBackward is Backward by the causal rule.
func (l *LSH) causalBackward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options,
	factors []int, dq, dk, dv []float32) error {
	cfg := l.cfg
	if err := l.exact.Backward(ctx, s, q, k, v, out, lse, dout, o, windowPattern{cfg.Window, cfg.ExcludeSelf}, dq, dk, dv); err != nil {
		return err
	}
	hs := newHasher(cfg.Seed, cfg.Hashes, s.D, factors)
	heads, err := buildIndexes(ctx, s, k, o, hs)
	if err != nil {
		return err
	}
	procs := runtime.GOMAXPROCS(0)
	pairs := make([]causalPair, len(heads))
	err = parallel.For(ctx, o.WorkerCount(procs, len(pairs)), len(pairs), hs.rowScratch, func(proj []float32, i int) error {
		pairs[i] = causalPair{b: i / s.HKV, kvh: i % s.HKV, ix: &heads[i]}
		pairs[i].build(l, s, o, q, k, hs, proj)
		return nil
	})
	if err != nil {
		return err
	}
	R, per, d := cfg.Hashes, 2*cfg.Bucket, s.D
	bk := min((per+tileRows+simd.Panel-1)/simd.Panel*simd.Panel, maxKeyTile)
	none := func() struct{} { return struct{}{} }
	var ws []*gradTile
	for r := range R {
		// Tasks: the runs of every pair; every run but a pair's first
		// spills into the Bucket·2 places before its own.
		taskStart := make([]int, len(pairs)+1)
		spillStart := make([]int, len(pairs)+1)
		for i := range pairs {
			runs := len(pairs[i].runs[r]) - 1
			taskStart[i+1] = taskStart[i] + runs
			spillStart[i+1] = spillStart[i] + max(runs-1, 0)
		}
		tasks := taskStart[len(pairs)]
		if tasks == 0 {
			continue
		}
		sz := per * d
		spill := make([]float32, 2*sz*spillStart[len(pairs)])
		spillOf := func(i, u int) (dk, dv []float32) {
			if u == 0 {
				return nil, nil
			}
			x := 2 * sz * (spillStart[i] + u - 1)
			return spill[x:][:sz], spill[x+sz:][:sz]
		}
		workers := o.WorkerCount(procs, tasks)
		for len(ws) < workers {
			ws = append(ws, newGradTile(tileRows, d, bk, R, 1))
		}
		var next atomic.Int64
		err := parallel.For(ctx, workers, tasks, func() *gradTile { return ws[next.Add(1)-1] }, func(w *gradTile, t int) error {
			i := sort.SearchInts(taskStart, t+1) - 1
			u := t - taskStart[i]
			sk, sv := spillOf(i, u)
			l.causalRun(w, s, &pairs[i], r, u, q, k, v, out, lse, dout, o.ScaleFor(d), dq, dk, dv, sk, sv)
			return nil
		})
		if err != nil {
			return err
		}
		err = parallel.For(ctx, o.WorkerCount(procs, len(pairs)), len(pairs), none, func(_ struct{}, i int) error {
			cp := &pairs[i]
			n, nq := cp.ix.n, s.Group()*s.N
			base := (cp.b*s.HKV + cp.kvh) * s.M
			for u := 1; u < len(cp.runs[r])-1; u++ {
				sk, sv := spillOf(i, u)
				own := int(cp.hi[r*nq+int(cp.order[r][cp.runs[r][u]-1])])
				for si := max(own-per, 0); si < own; si++ {
					x := (si - (own - per)) * d
					row := (base + int(cp.ix.pos[r*n+si])) * d
					simd.Axpy(1, sk[x:][:d], dk[row:][:d])
					simd.Axpy(1, sv[x:][:d], dv[row:][:d])
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if !cfg.ExcludeSelf {
		return nil
	}
	return parallel.For(ctx, o.WorkerCount(procs, len(pairs)), len(pairs), none, func(_ struct{}, i int) error {
		cp := &pairs[i]
		gs := s.Group()
		for gr, fell := range cp.self {
			if !fell {
				continue
			}
			hl, x := gr/s.N, gr%s.N
			row := (cp.b*s.H+cp.kvh*gs+hl)*s.N + x
			p := s.M - s.N + x
			simd.Axpy(1, dout[row*d:][:d], dv[((cp.b*s.HKV+cp.kvh)*s.M+p)*d:][:d])
		}
		return nil
	})
}

// causalRun adds to dq, dk and dv the terms of round r's pairs of the
// rows of run u of cp: straight into the keys from the end of the
// previous run's last band on, the keys before that into spillK and
// spillV (2·Bucket rows of D each, nil for the first run), which the
// previous runs also reach.
func (l *LSH) causalRun(w *gradTile, s attn.Shape, cp *causalPair, r, u int, q, k, v, out, lse, dout []float32, scale float32,
	dq, dk, dv, spillK, spillV []float32) {
	cfg := l.cfg
	R, per, d, dp, bk := cfg.Hashes, 2*cfg.Bucket, s.D, w.dp, w.bk
	n, nq, gs := cp.ix.n, s.Group()*s.N, s.Group()
	rows := cp.order[r][cp.runs[r][u]:cp.runs[r][u+1]]
	own := 0
	if u > 0 {
		own = int(cp.hi[r*nq+int(cp.order[r][cp.runs[r][u]-1])])
	}
	clear(spillK)
	clear(spillV)
	base := (cp.b*s.HKV + cp.kvh) * s.M * d
	kBase, vBase := k[base:][:s.M*d], v[base:][:s.M*d]
	dkBase, dvBase := dk[base:][:s.M*d], dv[base:][:s.M*d]
	sorted := cp.ix.pos[r*n:][:n]
	for t0 := 0; t0 < len(rows); t0 += w.capRows {
		tr := rows[t0:min(t0+w.capRows, len(rows))]
		w.rows = len(tr)
		w.maxPos = math.MinInt32
		for x, gr := range tr {
			hl, i := int(gr)/s.N, int(gr)%s.N
			w.loadRow(x, (cp.b*s.H+cp.kvh*gs+hl)*s.N+i, s.M-s.N+i, q, dout, out, lse, scale)
			for r2 := range r + 1 {
				w.qc[x*R+r2] = cp.lo[r2*nq+int(gr)]
				w.qhi[x*R+r2] = cp.hi[r2*nq+int(gr)]
			}
		}
		// Bands start and end in the order of their ends.
		kLo, kHi := int(cp.lo[r*nq+int(tr[0])]), int(cp.hi[r*nq+int(tr[len(tr)-1])])
		for k0 := kLo; k0 < kHi; k0 += bk {
			keys := sorted[k0:min(k0+bk, kHi)]
			w.loadKeys(keys, kBase, vBase)
			for r2 := range r {
				for j, pos := range keys {
					w.kc[r2*bk+j] = cp.rank[r2*n+int(pos)]
				}
			}
			w.products()
			w.bandMask(r, k0, cfg.Window)
			w.fold(dq, scale)
			for j, pos := range keys {
				dkr, dvr := dkBase[int(pos)*d:][:d], dvBase[int(pos)*d:][:d]
				if si := k0 + j; si < own {
					x := (si - (own - per)) * d
					dkr, dvr = spillK[x:][:d], spillV[x:][:d]
				}
				simd.Axpy(1, w.dkw[j*dp:][:d], dkr)
				simd.Axpy(1, w.dvw[j*dp:][:d], dvr)
			}
		}
	}
}

// bandMask sets to -Inf the logits of the tile's pairs that are not round
// r's: keys (at places k0, k0+1, ... of its order) outside the row's band,
// in its window (after p-window, so p itself, which the self rule would
// take out, is never round r's), or in the row's band of an earlier
// round.
func (w *gradTile) bandMask(r, k0, window int) {
	nk, bk, R := w.nk, w.bk, w.rounds
	for x := range w.rows {
		sr := w.s[x*bk:][:nk]
		j0 := min(max(int(w.qc[x*R+r])-k0, 0), nk)
		j1 := min(max(int(w.qhi[x*R+r])-k0, j0), nk)
		for j := range j0 {
			sr[j] = negInf
		}
		for j := j1; j < nk; j++ {
			sr[j] = negInf
		}
		p := int(w.qpos[x])
		lo, hi := w.qc[x*R:][:r], w.qhi[x*R:][:r]
		for j := j0; j < j1; j++ {
			if int(w.kpos[j]) > p-window { // p itself included

				sr[j] = negInf
				continue
			}
			for r2 := range r {
				if rk := w.kc[r2*bk+j]; rk >= lo[r2] && rk < hi[r2] {
					sr[j] = negInf
					break
				}
			}
		}
	}
}
