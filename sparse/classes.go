package sparse

import (
	"cmp"
	"slices"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// classPart runs a pattern in which query p and key j can meet only when
// p ≡ j (mod d): the dilated window and the stride columns of the
// Sparse Transformer. Queries and keys are regrouped by residue class r
// (p = r + a·d, j = r + t·d), and within a class query a sees key t when
//
//	-lb <= t-a <= rb  and  |t-a| > e      (e < 0: no hole)
//
// which is a band, so the regrouped problem runs with contiguous key
// ranges: no key outside the pattern is read and no tile is mostly
// masked. Padding is applied by gathering only the valid keys, the causal
// mask by rb <= 0. The cost of the regrouping is one copy of Q, K and V.
func classPart(s attn.Shape, d, lb, rb, e int) part {
	shift := s.M - s.N // absolute position of query 0
	rows := make([]int, s.N)
	for i := range rows {
		rows[i] = i
	}
	slices.SortStableFunc(rows, func(x, y int) int {
		return cmp.Compare(floorMod(shift+x, d), floorMod(shift+y, d))
	})
	cls := make([]int, s.N)
	idx := make([]int, s.N)
	for k, i := range rows {
		cls[k], idx[k] = floorMod(shift+i, d), floorDiv(shift+i, d)
	}
	return perBatch(func(b, valid int) gathered {
		nc := min(d, valid)
		keyStart := make([]int, nc+1)
		keys := make([]int, 0, valid)
		for r := range nc {
			keyStart[r] = len(keys)
			for j := r; j < valid; j += d {
				keys = append(keys, j)
			}
		}
		keyStart[nc] = len(keys)
		return gathered{rows: rows, keys: keys, pat: &classPattern{
			off: len(keys) - s.N, cls: cls, idx: idx, keyStart: keyStart,
			lb: lb, rb: rb, e: e,
		}}
	})
}

// classPattern is the pattern of a regrouped problem (see classPart):
// row k holds the query of class cls[k] with index idx[k] in its class;
// the keys of class r are [keyStart[r], keyStart[r+1]), key t of its
// class at keyStart[r]+t.
type classPattern struct {
	off       int // M'-N': a row's position minus its index
	cls, idx  []int
	keyStart  []int
	lb, rb, e int
}

func (c *classPattern) Visible(p, j int) bool {
	k := p - c.off
	r := c.cls[k]
	if r+1 >= len(c.keyStart) || j < c.keyStart[r] || j >= c.keyStart[r+1] {
		return false
	}
	dt := j - c.keyStart[r] - c.idx[k]
	return dt >= -c.lb && dt <= c.rb && (dt > c.e || dt < -c.e)
}

func (c *classPattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	var buf [8]flash.Range
	cands := buf[:0]
	var band [4]flash.Range
	for k := p0 - c.off; k < p1-c.off; {
		// One run of rows of the same class: consecutive indices.
		k0, r, a0 := k, c.cls[k], c.idx[k]
		k1 := k + 1
		for k1 < p1-c.off && c.cls[k1] == r {
			k1++
		}
		a1 := c.idx[k1-1]
		k = k1
		if r+1 >= len(c.keyStart) {
			continue // a class with no keys
		}
		ks, cnt := c.keyStart[r], c.keyStart[r+1]-c.keyStart[r]
		bs := band[:0]
		if c.e < 0 {
			bs = bandRanges(bs, a0, a1, -c.lb, c.rb)
		} else {
			bs = bandRanges(bs, a0, a1, -c.lb, -c.e-1)
			bs = bandRanges(bs, a0, a1, c.e+1, c.rb)
		}
		// Keys of one class are invisible to the rows of any other, so
		// Full holds only when this run is all the rows.
		alone := k0 == p0-c.off && k1 == p1-c.off
		for _, x := range bs {
			lo, hi := max(x.Lo, 0), min(x.Hi, cnt)
			if lo < hi {
				cands = append(cands, flash.Range{Lo: ks + lo, Hi: ks + hi, Full: x.Full && alone})
			}
		}
	}
	return appendRanges(dst, cands, m)
}
