package kvcache

import (
	"math"

	"github.com/attnkit/attn/internal/simd"
)

// fusedDecode is a decode worker's scratch for large groups (g >
// streamGroup, such as Hkv = 1 of H = 32), which do 2g flops for every
// cached value they read: the step is then bound by arithmetic, not by
// memory. Such a group's queries fill ⌈g/16⌉ panels of simd.Panel rows,
// and the fused tile kernel of package flash (simd.AttendPanels: both
// products register-blocked, the softmax in between on logits still in
// L1) runs them against each block of rows. The row-at-a-time path
// (dot products, a softmax call per query, then a product) reaches about
// half of the FMA peak there.
type fusedDecode struct {
	np   int
	qt   []float32 // [np][D][Panel] scaled queries
	acc  []float32 // [np][D][Panel] unnormalised output
	st   []float32 // [2][decodeBlock][Panel] two panels' logits (simd.AttendPanels may take two at a time)
	m, l []float32 // running max and sum per query row
	kb   []float32 // [decodeBlock][stride] widened keys of a 16-bit or int8 cache
	vb   []float32 // the same for values
	off  []int
	inv  []float32
}

func newFusedDecode(g, stride int) *fusedDecode {
	const P = simd.Panel
	np := (g + P - 1) / P
	return &fusedDecode{
		np:  np,
		qt:  make([]float32, np*P*stride),
		acc: make([]float32, np*P*stride),
		st:  make([]float32, 2*P*decodeBlock),
		m:   make([]float32, np*P),
		l:   make([]float32, np*P),
		kb:  make([]float32, decodeBlock*stride),
		vb:  make([]float32, decodeBlock*stride),
		off: make([]int, P),
		inv: make([]float32, P),
	}
}

// span attends the group's g queries (q: g rows of D, unscaled) to rows
// [lo, hi) of head bh, all of which they see, and writes each query's
// partial output to out (g rows of D) and its lse to lse.
func (f *fusedDecode) span(c *Cache, q []float32, scale float32, bh, lo, hi int, out, lse []float32) {
	const P = simd.Panel
	d, st := c.cfg.D, c.stride
	g := len(lse)
	pq := d * P
	for p := range f.np {
		rows := min(P, g-p*P)
		off := f.off[:rows]
		for x := range off {
			off[x] = (p*P + x) * d
		}
		simd.PanelFromRows(f.qt[p*pq:][:pq], q, off, d, scale)
	}
	clear(f.acc[:f.np*pq])
	for r := range f.m {
		f.m[r] = float32(math.Inf(-1))
		f.l[r] = 0
	}
	base := bh * c.cap * st
	for j0 := lo; j0 < hi; j0 += decodeBlock {
		nb := min(decodeBlock, hi-j0)
		at := base + j0*st
		var k, v, pfk, pfv []float32
		switch c.cfg.DType {
		case F32:
			k, v = c.kf[at:][:(nb-1)*st+d], c.vf[at:][:(nb-1)*st+d]
			// The next block, fetched into L2 as this one is computed.
			if next := j0 + nb; next < hi {
				nn := min(decodeBlock, hi-next) * st
				pfk, pfv = c.kf[base+next*st:][:nn], c.vf[base+next*st:][:nn]
			}
		default:
			c.widenRows(f.kb, false, at, nb)
			c.widenRows(f.vb, true, at, nb)
			k, v = f.kb[:(nb-1)*st+d], f.vb[:(nb-1)*st+d]
			// No prefetch hints: a 16-bit or int8 block is read in one
			// sequential pass, which the hardware prefetcher follows
			// (hints for the next block measured no different).
		}
		simd.AttendPanels(f.np, nb, d, k, st, 1, f.qt, pq, f.st, v, 1, st, f.m, f.l, f.acc, pq, pfk, pfv)
	}
	for p := range f.np {
		rows := min(P, g-p*P)
		off := f.off[:rows]
		for x := range off {
			r := p*P + x
			off[x] = r * d
			f.inv[x] = 0
			lse[r] = float32(math.Inf(-1))
			if l := f.l[r]; l != 0 {
				f.inv[x] = 1 / l
				lse[r] = f.m[r] + float32(math.Log(float64(l)))
			}
		}
		simd.RowsFromPanel(out, off, f.acc[p*pq:][:pq], f.inv, d)
	}
}
