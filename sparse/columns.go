package sparse

import (
	"sort"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// columnsPart runs a set of key columns that every query may see except
// those in a hole around itself (which another part covers): the summary
// columns of the fixed Sparse Transformer pattern and Longformer's global
// keys. The columns of one batch row are gathered, so the work is
// proportional to their number, however they are spread over M.
// cols(valid) returns the columns below valid, ascending.
func columnsPart(s attn.Shape, causal bool, h hole, cols func(valid int) []int) part {
	return perBatch(func(b, valid int) gathered {
		keys := cols(valid)
		return gathered{keys: keys, pat: &columnsPattern{
			off: len(keys) - s.N, shift: s.M - s.N, cols: keys, causal: causal, hole: h,
		}}
	})
}

// hole is the interval of keys [lo, hi] a query at position p does not
// take from a columnsPattern: its block of Block keys when Block > 0, else
// [p-Left, p+Right]. Both ends are nondecreasing in p and lo <= p <= hi.
type hole struct{ block, left, right int }

func (h hole) at(p int) (lo, hi int) {
	if h.block > 0 {
		lo = floorDiv(p, h.block) * h.block
		return lo, lo + h.block - 1
	}
	return p - h.left, p + h.right
}

// columnsPattern is the pattern of a gathered columns problem with all N
// query rows in order: query row i (at sub-problem position M'-N+i, at
// absolute position shift+i) sees gathered key t, the column cols[t],
// unless it lies in the row's hole or, causal, after the row.
type columnsPattern struct {
	off    int   // M'-N: a row's sub-problem position minus its index
	shift  int   // M-N: a row's absolute position minus its index
	cols   []int // absolute key positions, ascending
	causal bool
	hole   hole
}

// abs returns the absolute position of the query at sub-problem position p.
func (c *columnsPattern) abs(p int) int { return p - c.off + c.shift }

func (c *columnsPattern) Visible(p, t int) bool {
	p = c.abs(p)
	j := c.cols[t]
	if lo, hi := c.hole.at(p); j >= lo && j <= hi {
		return false
	}
	return !c.causal || j <= p
}

func (c *columnsPattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	first, last := c.abs(p0), c.abs(p1-1)
	lo, _ := c.hole.at(first)
	_, hi := c.hole.at(last)
	// Columns before every hole are seen by all (they are before every
	// query too); columns in the holes' span by some; columns after it
	// by all, or by none when causal (the holes reach past each query).
	a := sort.SearchInts(c.cols, lo)
	z := sort.SearchInts(c.cols, hi+1)
	if c.causal {
		z = min(z, sort.SearchInts(c.cols, last+1))
	}
	cands := []flash.Range{{Lo: 0, Hi: a, Full: true}, {Lo: a, Hi: z}}
	if !c.causal {
		cands = append(cands, flash.Range{Lo: z, Hi: len(c.cols), Full: true})
	}
	return appendRanges(dst, cands, m)
}
