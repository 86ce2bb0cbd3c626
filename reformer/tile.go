package reformer

import (
	"math"

	"github.com/attnkit/attn/internal/simd"
)

// tileRows is the most query rows attended together. A chunk holds about
// Bucket·H/Hkv queries; 128 lets most chunks of the default 64 run as one
// tile, so the window's keys are gathered once.
const tileRows = 128

var negInf = float32(math.Inf(-1))

// tile is one worker's scratch for attending a run of query rows to the
// keys of a window, with online softmax over key tiles of bk keys:
// O(tileRows·(D+bk) + bk·D) floats.
type tile struct {
	capRows, rows int
	nk            int // keys in the window
	d, dp, bk     int // head size, head size padded to simd.Panel, keys per tile
	rounds        int
	q             []float32 // [rows][d], scaled queries
	qpos          []int32   // absolute position of each row's query
	qc            []int32   // [rows][rounds], each row's chunk in every round
	orow          []int     // output row of each tile row
	kt            []float32 // [d][bk], the window's keys transposed; columns past nk are stale, never read
	vp            []float32 // [bk][dp], the window's values, zero past column d
	kpos          []int32   // position of each key of the window
	kc            []int32   // [rounds][bk], each key's chunk in every round
	cnt           []uint8   // [rows][bk], other rounds sharing each pair
	head, next    []int32   // keys filed by chunk: lists head[chunk], next[key]
	stamp         []int32   // stamp[chunk] == epoch: head[chunk] is current
	epoch         int32
	s             []float32 // [rows][bk], logits then probabilities
	acc           []float32 // [rows][dp], unnormalised output
	m, l          []float32 // running max and sum per row
	res           []float32 // [d], one normalised output row
}

// newTile returns scratch for tiles of up to rows queries of size d, key
// tiles of bk keys, and chunk ids below chunks.
func newTile(rows, d, bk, rounds, chunks int) *tile {
	dp := (d + simd.Panel - 1) / simd.Panel * simd.Panel
	return &tile{
		capRows: rows, d: d, dp: dp, bk: bk, rounds: rounds,
		q:     make([]float32, rows*d),
		qpos:  make([]int32, rows),
		qc:    make([]int32, rows*rounds),
		orow:  make([]int, rows),
		kt:    make([]float32, d*bk),
		vp:    make([]float32, bk*dp),
		kpos:  make([]int32, bk),
		kc:    make([]int32, bk*rounds),
		cnt:   make([]uint8, rows*bk),
		head:  make([]int32, chunks),
		next:  make([]int32, bk),
		stamp: make([]int32, chunks),
		s:     make([]float32, rows*bk),
		acc:   make([]float32, rows*dp),
		m:     make([]float32, rows),
		l:     make([]float32, rows),
		res:   make([]float32, d),
	}
}

func (t *tile) reset() {
	clear(t.acc[:t.rows*t.dp])
	for x := range t.rows {
		t.m[x] = negInf
		t.l[x] = 0
	}
}

// appendKeys gathers the keys at positions keys (sorted order) after the
// t.nk keys of the window: K transposed, V padded, positions and chunk ids.
func (t *tile) appendKeys(hp *headPlan, keys []int32, kBase, vBase []float32) {
	n0 := t.nk
	gatherKV(t.kt[n0:], t.bk, t.vp[n0*t.dp:], t.dp, kBase, vBase, t.d, keys)
	t.keyIDs(hp, keys, n0)
	t.nk += len(keys)
}

// keyIDs writes the positions and the chunks in every round of the keys
// at positions keys to the window's places from n0 on.
func (t *tile) keyIDs(hp *headPlan, keys []int32, n0 int) {
	bk, R := t.bk, t.rounds
	for j, pos := range keys {
		kp := int(pos)
		t.kpos[n0+j] = pos
		for i, c := range hp.keyChunk[kp*R : (kp+1)*R] {
			t.kc[i*bk+n0+j] = c
		}
	}
}

// dropFront removes the first n keys of the window.
func (t *tile) dropFront(n int) {
	if n == 0 {
		return
	}
	keep := t.nk - n
	for c := range t.d {
		row := t.kt[c*t.bk:]
		copy(row[:keep], row[n:t.nk])
	}
	copy(t.vp[:keep*t.dp], t.vp[n*t.dp:t.nk*t.dp])
	copy(t.kpos[:keep], t.kpos[n:t.nk])
	for i := range t.rounds {
		row := t.kc[i*t.bk:]
		copy(row[:keep], row[n:t.nk])
	}
	t.nk = keep
}

// attend folds the t.nk keys of the window into every row of the tile, for
// round r. maxPos is the largest query position of the tile: under the
// causal mask a window entirely after it is skipped.
//
// A pair is masked when the key is after the query (causal) or is the
// query's own position (self rule). A visible pair that also shares a
// window in c rounds has log c subtracted from its logit, so that summed
// over the rounds it counts once: the merged result is then attention over
// the union of the rounds' windows.
func (t *tile) attend(p *plan, r, maxPos int) {
	nk := t.nk
	if nk == 0 {
		return
	}
	causal, excl := p.o.Causal, p.excludeSelf
	kpos := t.kpos[:nk]
	minKey, maxKey := int32(math.MaxInt32), int32(-1)
	for _, pos := range kpos {
		minKey, maxKey = min(minKey, pos), max(maxKey, pos)
	}
	if causal && int(minKey) > maxPos {
		return
	}
	dp, bk, R := t.dp, t.bk, t.rounds
	// Only whole panels up to nk: columns past it are never read.
	np := (nk + simd.Panel - 1) / simd.Panel * simd.Panel
	simd.Gemm(t.rows, np, t.d, t.q, t.d, t.kt, bk, t.s, bk, false)

	if R > 1 {
		t.duplicates(p.logStep, r, nk)
	}
	for x := range t.rows {
		s := t.s[x*bk:][:nk]
		qp := t.qpos[x]
		// Masks: key after the query (causal) or at its position (self
		// rule). A row that sees every key of the window skips the loop.
		if (causal && maxKey > qp) || excl {
			for j, kp := range kpos {
				if (causal && kp > qp) || (excl && kp == qp) {
					s[j] = negInf
				}
			}
		}
		mx := max(t.m[x], simd.Max(s))
		if mx == negInf {
			clear(s) // nothing visible to this row yet
			continue
		}
		if mx > t.m[x] {
			// The row max grew: bring the old sum and accumulator to the
			// new reference point (on the first tile both are 0).
			c := float32(math.Exp(float64(t.m[x] - mx)))
			t.l[x] *= c
			simd.Scale(t.acc[x*dp:][:dp], c)
			t.m[x] = mx
		}
		t.l[x] += simd.ExpSum(s, mx)
	}
	simd.Gemm(t.rows, dp, nk, t.s, bk, t.vp, dp, t.acc, dp, true)
}

// duplicates lowers the logit of every pair of the tile's rows and its nk
// keys (in round r's window) by log c, where c is the number of rounds
// whose window holds the pair.
//
// Comparing chunk ids pair by pair would cost rounds operations per pair,
// more than both matrix products together. Instead, for each other round
// i, the keys are filed by their chunk in round i, and each row walks only
// the keys filed under its own chunk and the one before: the pairs that do
// share round i's window. Each such pair's logit drops by
// log(n+1) - log(n) at its n-th shared round, which adds up to log c.
func (t *tile) duplicates(logStep []float32, r, nk int) {
	R, bk := t.rounds, t.bk
	cnt := t.cnt[:t.rows*bk]
	clear(cnt)
	for i := range R {
		if i == r {
			continue
		}
		t.epoch++
		if t.epoch == 0 { // wrapped: forget every stamp
			clear(t.stamp)
			t.epoch = 1
		}
		kc := t.kc[i*bk:][:nk]
		for j := nk - 1; j >= 0; j-- {
			c := kc[j]
			if t.stamp[c] != t.epoch {
				t.stamp[c] = t.epoch
				t.head[c] = -1
			}
			t.next[j] = t.head[c]
			t.head[c] = int32(j)
		}
		for x := range t.rows {
			qc := t.qc[x*R+i]
			s := t.s[x*bk:][:nk]
			n := cnt[x*bk:][:nk]
			for _, c := range [2]int32{qc, qc - 1} {
				if c < 0 || t.stamp[c] != t.epoch {
					continue
				}
				for j := t.head[c]; j >= 0; j = t.next[j] {
					s[j] -= logStep[n[j]]
					n[j]++
				}
			}
		}
	}
}

// finish leaves the normalised output of row x in t.res and returns its
// lse, or false when the row saw no key.
func (t *tile) finish(x int) (float32, bool) {
	if t.l[x] == 0 {
		return 0, false
	}
	inv := 1 / t.l[x]
	for i, a := range t.acc[x*t.dp:][:t.d] {
		t.res[i] = a * inv
	}
	return t.m[x] + float32(math.Log(float64(t.l[x]))), true
}

// gatherKV writes row rows[j] of k (rows of d floats) to column j of kt
// (row stride ldk) and row rows[j] of v to row j of vp (row stride ldv).
// Eight keys at a time: each write to kt then fills consecutive floats of
// one row (faster than one key at a time, whose strided writes each touch
// a new cache line; figures: results/2026-12-07, "Figures moved out of code comments"), and the reads of
// sixteen rows are in flight together, which matters when they miss the
// cache.
func gatherKV(kt []float32, ldk int, vp []float32, ldv int, k, v []float32, d int, rows []int32) {
	j := 0
	for ; j+8 <= len(rows); j += 8 {
		p := rows[j : j+8]
		k0, k1, k2, k3 := k[int(p[0])*d:][:d], k[int(p[1])*d:][:d], k[int(p[2])*d:][:d], k[int(p[3])*d:][:d]
		k4, k5, k6, k7 := k[int(p[4])*d:][:d], k[int(p[5])*d:][:d], k[int(p[6])*d:][:d], k[int(p[7])*d:][:d]
		v0, v1, v2, v3 := v[int(p[0])*d:][:d], v[int(p[1])*d:][:d], v[int(p[2])*d:][:d], v[int(p[3])*d:][:d]
		v4, v5, v6, v7 := v[int(p[4])*d:][:d], v[int(p[5])*d:][:d], v[int(p[6])*d:][:d], v[int(p[7])*d:][:d]
		o := vp[j*ldv:]
		o0, o1, o2, o3 := o[:d], o[ldv:][:d], o[2*ldv:][:d], o[3*ldv:][:d]
		o4, o5, o6, o7 := o[4*ldv:][:d], o[5*ldv:][:d], o[6*ldv:][:d], o[7*ldv:][:d]
		for c := range d {
			t := kt[c*ldk+j:][:8]
			t[0], t[1], t[2], t[3] = k0[c], k1[c], k2[c], k3[c]
			t[4], t[5], t[6], t[7] = k4[c], k5[c], k6[c], k7[c]
			o0[c], o1[c], o2[c], o3[c] = v0[c], v1[c], v2[c], v3[c]
			o4[c], o5[c], o6[c], o7[c] = v4[c], v5[c], v6[c], v7[c]
		}
	}
	for ; j < len(rows); j++ {
		kr := k[int(rows[j])*d:][:d]
		for c, x := range kr {
			kt[c*ldk+j] = x
		}
		copy(vp[j*ldv:][:d], v[int(rows[j])*d:][:d])
	}
}
