package decstore

import (
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/simd"
)

// halves calls f for the parts of channels [c0, c1) of packed rows of pw
// bytes that lie in the low (hi false) and the high nibbles: the part's
// first byte b in a row, and its channels [p0, p1).
func halves(pw, c0, c1 int, f func(hi bool, b, p0, p1 int)) {
	if c0 < pw {
		f(false, c0, c0, min(c1, pw))
	}
	if c1 > pw {
		p0 := max(c0, pw)
		f(true, p0-pw, p0, c1)
	}
}

// scratch returns the Head's int4 memory, at least n values.
func (h *Head) scratch(n int) []float32 {
	if cap(h.tmp) < n {
		h.tmp = make([]float32, n)
	}
	return h.tmp[:n]
}

// dotKeysI4 is DotKeys for int4 rows: per channel group, the query's dot
// products with the codes of each half (simd.DotRowsU4, in place), then
// score += scale·dot + zero·Σ q over the group.
func (h *Head) dotKeysI4(s []float32, lds int, q []float32, ldq, rows, j, n int) {
	l := rowI4(h.d)
	if rows == 0 || n == 0 {
		return
	}
	tmp := h.scratch(2*rows*n + rows)
	part, dot, qsum := tmp[:rows*n], tmp[rows*n:2*rows*n], tmp[2*rows*n:]
	k := h.KV4[j*l.size:]
	for r := range rows {
		clear(s[r*lds:][:n])
	}
	for cg := range l.ng {
		c0, c1 := cg*lowbit.ChanGroup, min(h.d, (cg+1)*lowbit.ChanGroup)
		first := true
		halves(l.pw, c0, c1, func(hi bool, b, p0, p1 int) {
			kk := k[b:][:(n-1)*l.size+p1-p0]
			out := dot
			if first {
				out = part
			}
			simd.DotRowsU4(out, n, q[p0:], ldq, rows, kk, l.size, n, p1-p0, hi)
			if !first {
				simd.Axpy(1, dot, part)
			}
			first = false
		})
		for r := range rows {
			var sum float32
			for _, x := range q[r*ldq+c0 : r*ldq+c1] {
				sum += x
			}
			qsum[r] = sum
		}
		for i := range n {
			p := l.params(h.KV4, (j+i)*l.size)
			sc, z := p[cg], p[l.ng+cg]
			for r := range rows {
				s[r*lds+i] += sc*part[r*n+i] + z*qsum[r]
			}
		}
	}
}

// addValuesI4 is AddValues for int4 rows (D a multiple of 8): per
// channel group, the probabilities times each row's scale through
// simd.GemmU4 on the codes in place, and Σ_i p_i·zero_i added to the
// group's channels.
func (h *Head) addValuesI4(p []float32, ldp, rows, j, n int, acc []float32) {
	l := rowI4(h.d)
	if rows == 0 || n == 0 {
		return
	}
	pt := h.scratch(rows * n)
	v := h.KV4[j*l.size+l.pw:]
	for cg := range l.ng {
		c0, c1 := cg*lowbit.ChanGroup, min(h.d, (cg+1)*lowbit.ChanGroup)
		for r := range rows {
			var zs float32
			for i, w := range p[r*ldp:][:n] {
				ps := l.params(h.KV4, (j+i)*l.size)
				pt[r*n+i] = w * ps[2*l.ng+cg]
				zs += w * ps[3*l.ng+cg]
			}
			for c := c0; c < c1; c++ {
				acc[r*h.d+c] += zs
			}
		}
		halves(l.pw, c0, c1, func(hi bool, b, p0, p1 int) {
			vb := v[b:][:(n-1)*l.size+p1-p0]
			simd.GemmU4(rows, p1-p0, n, pt, n, vb, l.size, acc[p0:], h.d, true, hi)
		})
	}
}

// appendI4 appends the int4 rows of key and value rows k and v to buf,
// growing it as appendRows does.
func appendI4(buf []uint8, d, maxLen int, k, v []float32) []uint8 {
	l := rowI4(d)
	n := len(k) / d
	buf = grow8(buf, len(buf)+n*l.size, 256*l.size, maxLen*l.size)
	buf = buf[:len(buf)+n*l.size]
	base := len(buf) - n*l.size
	for i := range n {
		off := base + i*l.size
		p := l.params(buf, off)
		lowbit.QuantRow(buf[off:][:l.pw], p[:l.ng], p[l.ng:2*l.ng], 1, k[i*d:][:d], l.pw)
		lowbit.QuantRow(buf[off+l.pw:][:l.pw], p[2*l.ng:3*l.ng], p[3*l.ng:], 1, v[i*d:][:d], l.pw)
	}
	return buf
}
