package decstore

import (
	"math"

	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/simd"
)

// i8Row is the layout of a position of int8 storage, in bytes: the key's
// D codes, the value's D codes, padding to a multiple of 4 (at pw), then
// three float32: the key's scale, the value's scale and the norm of the
// key as read back (KeyNorm), which a rule reading scattered rows would
// otherwise dequantise the key for. Every position carries its own
// scales, so a gathered row is complete.
type i8Row struct{ pw, size int }

func i8Layout(d int) i8Row {
	pw := (2*d + 3) &^ 3
	return i8Row{pw: pw, size: pw + 12}
}

// paramsI8 returns the key scale, value scale and key norm of position j.
func (h *Head) paramsI8(j int) []float32 {
	l := i8Layout(h.d)
	return floatsAt(h.KV8[j*l.size+l.pw:], 3)
}

// rowI8 writes position j's key (value false) or value into dst (D
// values), read back as float32 (code·scale).
func (h *Head) rowI8(dst []float32, j int, value bool) []float32 {
	l := i8Layout(h.d)
	off, x := j*l.size, 0
	if value {
		off, x = off+h.d, 1
	}
	simd.WidenI8(dst, h.KV8[off:][:h.d], h.paramsI8(j)[x:][:1], h.d)
	return dst
}

// columnI8 sets dst[i] to param x (0 key scale, 1 value scale) of
// position j+i, for i < len(dst).
func (h *Head) columnI8(dst []float32, j, x int) {
	l := i8Layout(h.d)
	floatColumn(dst, h.KV8[j*l.size+l.pw+4*x:], l.size)
}

// dotKeysI8 is DotKeys for int8 rows: the dot products with the codes,
// read in place (simd.DotRowsI8), then each column times its key's
// scale, as kvcache applies them.
func (h *Head) dotKeysI8(s []float32, lds int, q []float32, ldq, rows, j, n, next, nn int) {
	l := i8Layout(h.d)
	k := h.KV8[j*l.size:][:(n-1)*l.size+h.d]
	if nn > 0 {
		simd.DotRowsI8PF(s, lds, q, ldq, rows, k, l.size, n, h.d, h.KV8[next*l.size:][:nn*l.size])
	} else {
		simd.DotRowsI8(s, lds, q, ldq, rows, k, l.size, n, h.d)
	}
	sc := h.scratch(n)
	h.columnI8(sc, j, 0)
	simd.ScaleColumns(s, lds, rows, sc)
}

// addValuesI8 is AddValues for int8 rows (D a multiple of 8): the
// probabilities times each row's value scale, then their product with
// the codes in place (simd.GemmI8).
func (h *Head) addValuesI8(p []float32, ldp, rows, j, n int, acc []float32, next, nn int) {
	l := i8Layout(h.d)
	tmp := h.scratch(rows*n + n)
	pt, vs := tmp[:rows*n], tmp[rows*n:]
	h.columnI8(vs, j, 1)
	for r := range rows {
		pr, ptr := p[r*ldp:][:n], pt[r*n:][:n]
		for i, w := range pr {
			ptr[i] = w * vs[i]
		}
	}
	v := h.KV8[j*l.size+h.d:][:(n-1)*l.size+h.d]
	var pf []int8
	if nn > 0 {
		pf = h.KV8[next*l.size+h.d:][:nn*l.size-h.d]
	}
	simd.GemmI8(rows, h.d, n, pt, n, v, l.size, acc, h.d, true, pf)
}

// appendI8 appends int8 rows for key and value rows k and v, each row
// quantised on its own (lowbit.QuantI8), as kvcache's I8 does.
func (h *Head) appendI8(k, v []float32, maxLen int) {
	l, d := i8Layout(h.d), h.d
	n := len(k) / d
	buf := grow8(h.KV8, len(h.KV8)+n*l.size, 256*l.size, maxLen*l.size)
	base := len(buf)
	h.KV8 = buf[:base+n*l.size]
	x := h.scratch(d)
	for i := range n {
		off := base + i*l.size
		p := h.paramsI8(base/l.size + i)
		p[0] = lowbit.QuantI8(h.KV8[off:][:d], k[i*d:][:d])
		p[1] = lowbit.QuantI8(h.KV8[off+d:][:d], v[i*d:][:d])
		clear(h.KV8[off+2*d : off+l.pw])
		simd.WidenI8(x, h.KV8[off:][:d], p[:1], d)
		p[2] = float32(math.Sqrt(float64(simd.Dot(x, x))))
	}
}
