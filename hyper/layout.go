package hyper

import (
	"sort"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// rect is one unmasked sub-problem: queries [q0, q1) (indices into the N
// queries) against keys [k0, k1), before key padding clips the keys.
type rect struct {
	q0, q1, k0, k1 int
}

// layout splits a call into the exact causal leaves and the phases of
// unmasked rectangles. Rectangles of one phase cover disjoint queries, so
// their results merge into out concurrently; phases run one after another.
//
// Without a causal mask there is one rectangle, all queries against all
// keys. With one, query i sits at position p = M-N+i and sees keys j <= p:
// the keys before the first query position, [0, M-N), form one unmasked
// rectangle (when N < M), and the positions [max(M-N, 0), M) a causal
// square. A square of n positions is split at lo + n/2 into two causal
// halves and the unmasked rectangle of the lower half's queries against
// the upper half's keys; halving stops (a leaf, computed exactly) when n < 2,
// when a half would be below Min, or when a half fits in one block, so that
// the rectangle would be exact anyway. Any n works: halves differ by at
// most one.
func (a *Attention) layout(s attn.Shape, causal bool) (leaves *leafPattern, phases [][]rect) {
	if !causal {
		return nil, [][]rect{{{0, s.N, 0, s.M}}}
	}
	shift := s.M - s.N // position of query 0
	start := max(shift, 0)
	leaves = &leafPattern{bounds: []int{start}}
	var split func(lo, hi, depth int)
	split = func(lo, hi, depth int) {
		n := hi - lo
		if n < 2 || (a.min > 0 && n < 2*a.min) || (a.block > 0 && n/2 <= a.block) {
			leaves.bounds = append(leaves.bounds, hi)
			return
		}
		mid := lo + n/2
		for len(phases) <= depth {
			phases = append(phases, nil)
		}
		phases[depth] = append(phases[depth], rect{q0: mid - shift, q1: hi - shift, k0: lo, k1: mid})
		split(lo, mid, depth+1)
		split(mid, hi, depth+1)
	}
	split(start, s.M, 0)
	if shift > 0 {
		phases = append(phases, []rect{{q0: 0, q1: s.N, k0: 0, k1: shift}})
	}
	return leaves, phases
}

// leafPattern is the block-diagonal pattern of the causal leaves: leaf t
// holds positions [bounds[t], bounds[t+1]) and each query sees the keys of
// its own leaf only (the kernel adds the causal mask).
type leafPattern struct {
	bounds []int
}

var _ flash.Pattern = (*leafPattern)(nil)

// leaf returns the leaf holding position p, or -1.
func (lp *leafPattern) leaf(p int) int {
	b := lp.bounds
	if p < b[0] || p >= b[len(b)-1] {
		return -1
	}
	return sort.SearchInts(b, p+1) - 1
}

// KeyRanges returns the leaves that queries at positions [p0, p1) fall in.
func (lp *leafPattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	b := lp.bounds
	p0, p1 = max(p0, b[0]), min(p1, b[len(b)-1])
	if p0 >= p1 {
		return dst
	}
	t0, t1 := lp.leaf(p0), lp.leaf(p1-1)
	for t := t0; t <= t1; t++ {
		dst = append(dst, flash.Range{Lo: b[t], Hi: b[t+1], Full: t0 == t1})
	}
	return dst
}

// Visible reports whether key j is in the leaf of position p.
func (lp *leafPattern) Visible(p, j int) bool {
	t := lp.leaf(p)
	return t >= 0 && lp.bounds[t] <= j && j < lp.bounds[t+1]
}

// span returns part i of n items cut into parts of as equal sizes as
// possible: [i·n/parts, (i+1)·n/parts).
func span(n, parts, i int) (lo, hi int) {
	return i * n / parts, (i + 1) * n / parts
}
