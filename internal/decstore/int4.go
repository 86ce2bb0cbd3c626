package decstore

import (
	"math"

	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/simd"
)

// scratch returns the Head's int4 memory, at least n values.
func (h *Head) scratch(n int) []float32 {
	if cap(h.tmp) < n {
		h.tmp = make([]float32, n)
	}
	return h.tmp[:n]
}

// rowI4 writes position j's key (value false) or value into dst (D
// values), read back as float32.
func (h *Head) rowI4(dst []float32, j int, value bool) []float32 {
	l := h.layout()
	off := j * l.size
	p := l.params(h.KV4, off)
	switch {
	case value:
		sc, z := l.values(p)
		lowbit.Dequant(dst, h.KV4[off+l.pw:][:l.pw], sc, z, 1)
	case h.kg == 0:
		lowbit.Dequant(dst, h.KV4[off:][:l.pw], p[:l.ng], p[l.ng:], 1)
	case j >= h.Settled():
		copy(dst, h.kres[(j-h.Settled())*h.d:][:h.d])
	default:
		g := h.kp[j/h.kg*2*h.d:][:2*h.d]
		lowbit.Dequant(dst, h.KV4[off:][:l.pw], g[:h.d], g[h.d:], 0)
	}
	return dst
}

// Settled returns the number of positions whose stored form is final:
// all of them, but for int4 keys quantised per channel, whose positions
// past the last complete group are kept in float32 until it completes
// (Settle).
func (h *Head) Settled() int {
	if h.kg == 0 {
		return h.Len()
	}
	return len(h.kp) / (2 * h.d) * h.kg
}

// Settle quantises the keys of the groups of positions that are complete
// (int4 keys per channel; otherwise it does nothing): per channel over
// the group, one scale and zero, as kvcache quantises keys.
func (h *Head) Settle() {
	if h.kg == 0 {
		return
	}
	d, g := h.d, h.kg
	l := h.layout()
	done := 0
	for ; (done+g)*d <= len(h.kres); done += g {
		p0 := h.Settled() // the group's first position
		at := len(h.kp)
		h.kp = append(h.kp, make([]float32, 2*d)...)
		lowbit.QuantColumns(h.KV4[p0*l.size:], l.size, l.pw, h.kp[at:][:d], h.kp[at+d:][:d], h.kres[done*d:], d, g, d)
	}
	if done > 0 {
		h.kres = h.kres[:copy(h.kres, h.kres[done*d:])]
	}
}

// dotKeysI4 is DotKeys for int4 rows.
func (h *Head) dotKeysI4(s []float32, lds int, q []float32, ldq, rows, j, n int) {
	if rows == 0 || n == 0 {
		return
	}
	if h.kg == 0 {
		h.dotKeysToken(s, lds, q, ldq, rows, j, n)
		return
	}
	d, set := h.d, h.Settled()
	for i := 0; i < n; {
		p := j + i
		if p >= set { // the float32 keys of the open groups
			simd.DotRows(s[i:], lds, q, ldq, rows, h.kres[(p-set)*d:], d, n-i, d)
			return
		}
		m := min(n-i, (p/h.kg+1)*h.kg-p, set-p)
		h.dotKeysGroup(s[i:], lds, q, ldq, rows, p, m)
		i += m
	}
}

// dotKeysGroup scores keys [j, j+n) of one group quantised per channel:
// the group's scales folded into the queries (q'_c = q_c·scale_c, as
// kvcache does), their dot products with the codes, plus Σ q_c·zero_c.
func (h *Head) dotKeysGroup(s []float32, lds int, q []float32, ldq, rows, j, n int) {
	l, d := h.layout(), h.d
	g := h.kp[j/h.kg*2*d:][:2*d]
	scale, zero := g[:d], g[d:]
	tmp := h.scratch(rows*d + rows*n)
	qf, part := tmp[:rows*d], tmp[rows*d:]
	for r := range rows {
		copy(qf[r*d:][:d], q[r*ldq:][:d])
	}
	simd.ScaleColumns(qf, d, rows, scale)
	k := h.KV4[j*l.size:]
	first := true
	lowbit.Halves(l.pw, 0, d, func(hi bool, b, p0, p1 int) {
		kk := k[b:][:(n-1)*l.size+p1-p0]
		if first {
			simd.DotRowsU4(s, lds, qf[p0:], d, rows, kk, l.size, n, p1-p0, hi)
			first = false
			return
		}
		simd.DotRowsU4(part, n, qf[p0:], d, rows, kk, l.size, n, p1-p0, hi)
		for r := range rows {
			simd.Axpy(1, part[r*n:][:n], s[r*lds:][:n])
		}
	})
	for r := range rows {
		z := simd.Dot(q[r*ldq:][:d], zero)
		for i := range s[r*lds:][:n] {
			s[r*lds+i] += z
		}
	}
}

// dotKeysToken is DotKeys for int4 keys quantised per token: per channel
// group, the query's dot products with the codes of each half
// (simd.DotRowsU4, in place), then score += scale·dot + zero·Σ q over the
// group.
func (h *Head) dotKeysToken(s []float32, lds int, q []float32, ldq, rows, j, n int) {
	l := h.layout()
	tmp := h.scratch(2*rows*n + rows + 2*n)
	part, dot, qsum := tmp[:rows*n], tmp[rows*n:2*rows*n], tmp[2*rows*n:][:rows]
	sc, z := tmp[2*rows*n+rows:][:n], tmp[2*rows*n+rows+n:][:n]
	k := h.KV4[j*l.size:]
	for r := range rows {
		clear(s[r*lds:][:n])
	}
	for cg := range l.ng {
		c0, c1 := cg*lowbit.ChanGroup, min(h.d, (cg+1)*lowbit.ChanGroup)
		first := true
		lowbit.Halves(l.pw, c0, c1, func(hi bool, b, p0, p1 int) {
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
		h.column(sc, j, cg)
		h.column(z, j, l.ng+cg)
		for r := range rows {
			sr, pr, qs := s[r*lds:][:n], part[r*n:][:n], qsum[r]
			for i := range sr {
				sr[i] += sc[i]*pr[i] + z[i]*qs
			}
		}
	}
}

// addValuesI4 is AddValues for int4 rows (D a multiple of 8): per
// channel group, the probabilities times each row's scale through
// simd.GemmU4 on the codes in place, and Σ_i p_i·zero_i added to the
// group's channels.
func (h *Head) addValuesI4(p []float32, ldp, rows, j, n int, acc []float32) {
	l := h.layout()
	if rows == 0 || n == 0 {
		return
	}
	tmp := h.scratch(rows*n + 2*n)
	pt, vs, vz := tmp[:rows*n], tmp[rows*n:][:n], tmp[rows*n+n:][:n]
	v := h.KV4[j*l.size+l.pw:]
	for cg := range l.ng {
		c0, c1 := cg*lowbit.ChanGroup, min(h.d, (cg+1)*lowbit.ChanGroup)
		h.column(vs, j, 2*l.tok*l.ng+cg)
		h.column(vz, j, (2*l.tok+1)*l.ng+cg)
		for r := range rows {
			pr, ptr := p[r*ldp:][:n], pt[r*n:][:n]
			for i, w := range pr {
				ptr[i] = w * vs[i]
			}
			zs := simd.Dot(pr, vz)
			for c := c0; c < c1; c++ {
				acc[r*h.d+c] += zs
			}
		}
		lowbit.Halves(l.pw, c0, c1, func(hi bool, b, p0, p1 int) {
			vb := v[b:][:(n-1)*l.size+p1-p0]
			simd.GemmU4(rows, p1-p0, n, pt, n, vb, l.size, acc[p0:], h.d, true, hi)
		})
	}
}

// column sets dst[i] to param x (an index into i4Row.params) of the int4
// row of position j+i, for i < len(dst).
func (h *Head) column(dst []float32, j, x int) {
	l := h.layout()
	floatColumn(dst, h.KV4[j*l.size+2*l.pw+4*x:], l.size)
}

// appendI4 appends int4 rows for key and value rows k and v: values
// quantised per token; keys per token too, or, per channel, kept in
// float32 until their group completes (Settle).
func (h *Head) appendI4(k, v []float32, maxLen int) {
	l, d := h.layout(), h.d
	n := len(k) / d
	buf := grow8(h.KV4, len(h.KV4)+n*l.size, 256*l.size, maxLen*l.size)
	buf = buf[:len(buf)+n*l.size]
	base := len(buf) - n*l.size
	for i := range n {
		off := base + i*l.size
		p := l.params(buf, off)
		if h.kg == 0 {
			lowbit.QuantRow(buf[off:][:l.pw], p[:l.ng], p[l.ng:2*l.ng], 1, k[i*d:][:d], l.pw)
			x := h.scratch(d) // the key as read back, for its norm
			lowbit.Dequant(x, buf[off:][:l.pw], p[:l.ng], p[l.ng:2*l.ng], 1)
			p[4*l.ng] = float32(math.Sqrt(float64(simd.Dot(x, x))))
		} else {
			clear(buf[off:][:l.pw]) // Settle ORs the codes in
		}
		vs, vz := l.values(p)
		lowbit.QuantRow(buf[off+l.pw:][:l.pw], vs, vz, 1, v[i*d:][:d], l.pw)
	}
	h.KV4 = buf
	if h.kg > 0 {
		h.kres = append(h.kres, k[:n*d]...)
	}
}

// truncateI4 keeps the first n positions. Keys quantised per channel
// cannot be taken back past the last complete group, but to none.
func (h *Head) truncateI4(n int) {
	h.KV4 = h.KV4[:n*h.layout().size]
	if h.kg == 0 {
		return
	}
	set := h.Settled()
	switch {
	case n == 0:
		h.kp, h.kres = h.kp[:0], h.kres[:0]
	case n < set:
		panic("decstore: Truncate into int4 keys already quantised")
	default:
		h.kres = h.kres[:(n-set)*h.d]
	}
}
