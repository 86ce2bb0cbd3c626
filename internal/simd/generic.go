package simd

import "math"

// gemmGeneric is the plain Go Gemm. It keeps a 2-row × 4-column block of
// C in 8 local accumulators across the k loop (a 1 × 4 block for an odd
// last row). The values of B are read from memory for each product
// rather than held in locals: with them the loop needs more than the 15
// float registers the compiler has on amd64, and spills cost more than
// the extra loads (figures: results/2026-12-07, "Figures moved out of code comments").
func gemmGeneric(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	if m == 0 || n == 0 {
		return
	}
	i := 0
	for ; i+2 <= m; i += 2 {
		c0 := c[i*ldc:][:n]
		c1 := c[(i+1)*ldc:][:n]
		if !accumulate {
			clear(c0)
			clear(c1)
		}
		if k == 0 {
			continue
		}
		a0 := a[i*lda:][:k]
		a1 := a[(i+1)*lda:][:k]
		for j := 0; j < n; j += 4 {
			s00, s01, s02, s03 := c0[j], c0[j+1], c0[j+2], c0[j+3]
			s10, s11, s12, s13 := c1[j], c1[j+1], c1[j+2], c1[j+3]
			for p, x0 := range a0 {
				x1 := a1[p]
				bp := b[p*ldb+j:][:4]
				s00 += x0 * bp[0]
				s01 += x0 * bp[1]
				s02 += x0 * bp[2]
				s03 += x0 * bp[3]
				s10 += x1 * bp[0]
				s11 += x1 * bp[1]
				s12 += x1 * bp[2]
				s13 += x1 * bp[3]
			}
			c0[j], c0[j+1], c0[j+2], c0[j+3] = s00, s01, s02, s03
			c1[j], c1[j+1], c1[j+2], c1[j+3] = s10, s11, s12, s13
		}
	}
	if i < m {
		c0 := c[i*ldc:][:n]
		if !accumulate {
			clear(c0)
		}
		if k == 0 {
			return
		}
		a0 := a[i*lda:][:k]
		for j := 0; j < n; j += 4 {
			s0, s1, s2, s3 := c0[j], c0[j+1], c0[j+2], c0[j+3]
			for p, x := range a0 {
				bp := b[p*ldb+j:][:4]
				s0 += x * bp[0]
				s1 += x * bp[1]
				s2 += x * bp[2]
				s3 += x * bp[3]
			}
			c0[j], c0[j+1], c0[j+2], c0[j+3] = s0, s1, s2, s3
		}
	}
}

// The exp constants, shared with the assembly (see _asm/exp.go).
const (
	expLog2e = 1.44269504088896340735992468100189214 // log2(e)
	expLn2Hi = 0.693145751953125                     // ln 2 to 16 bits: n·expLn2Hi is exact for |n| < 2^8
	expLn2Lo = 1.428606765330187045e-06              // ln 2 - expLn2Hi
	// exp(r) ≈ 1 + r + r²·(c0 + c1·r + … + c5·r⁵) for |r| ≤ ln2/2.
	expC0 = 0.5
	expC1 = 0.166666671633720397949219
	expC2 = 0.0416664853692054748535156
	expC3 = 0.00833336077630519866943359
	expC4 = 0.00139304355252534151077271
	expC5 = 0.000198527617612853646278381
	// roundMagic is 1.5·2^23: adding and subtracting it rounds a float32
	// of magnitude below 2^22 to an integer, ties to even.
	roundMagic = 12582912
)

var (
	// expLo is the smallest float32 x with exp(x) >= 2^-126, the least
	// normal float32; below it exp gives 0.
	expLo = math.Float32frombits(0xc2aeac4f) // -87.33654
	// expHi is the largest float32 x with exp(x) <= MaxFloat32; above it
	// exp gives +Inf.
	expHi = math.Float32frombits(0x42b17217) // 88.72283
)

// expf is exp(x) in float32 by the same algorithm as the assembly (see
// expVec in _asm/exp.go): round x·log2 e to n, reduce x by n·ln 2 in two
// parts, a polynomial for exp(r), and n added to the exponent field.
// Results that would be subnormal are 0.
func expf(x float32) float32 {
	switch {
	case x != x:
		return x
	case x < expLo:
		return 0
	case x > expHi:
		return float32(math.Inf(1))
	}
	n := x*expLog2e + roundMagic - roundMagic
	r := x - n*expLn2Hi
	r -= n * expLn2Lo
	p := float32(expC5)
	p = p*r + expC4
	p = p*r + expC3
	p = p*r + expC2
	p = p*r + expC1
	p = p*r + expC0
	p = p*(r*r) + r
	p++
	return math.Float32frombits(math.Float32bits(p) + uint32(int32(n))<<23)
}

func expSumGeneric(x []float32, shift float32) float32 {
	var sum float32
	for i, v := range x {
		e := expf(v - shift)
		x[i] = e
		sum += e
	}
	return sum
}

func expGeneric(dst, x []float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = expf(v)
	}
}

// expMulGeneric is ExpMul by the steps of the assembly: t = p[i]·log2 e
// in float32, at most 128, then exp2Tile.
func expMulGeneric(p, g []float32) {
	g = g[:len(p)]
	for i, x := range p {
		e := exp2Tile(min(x*expLog2e, 128))
		p[i] = e
		g[i] *= e
	}
}

func maxGeneric(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v)
	}
	return m
}

func scaleGeneric(x []float32, c float32) {
	for i := range x {
		x[i] *= c
	}
}

func dotGeneric(x, y []float32) float32 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * y[i]
		s1 += x[i+1] * y[i+1]
		s2 += x[i+2] * y[i+2]
		s3 += x[i+3] * y[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func axpyGeneric(a float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += a * v
	}
}

func readSumGeneric(x []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i]
		s1 += x[i+1]
		s2 += x[i+2]
		s3 += x[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// fmaPeakGeneric does the work of fmaPeakAVX2 in scalar Go: per round, 8
// multiply-adds on each of 12 independent chains (192 flops). The chains
// converge to 2, so they stay normal floats.
func fmaPeakGeneric(iters int) float32 {
	const x, y = 0.5, 1
	a0, a1, a2, a3, a4, a5 := float32(1), float32(2), float32(3), float32(4), float32(5), float32(6)
	a6, a7, a8, a9, a10, a11 := float32(7), float32(8), float32(9), float32(10), float32(11), float32(12)
	for range iters {
		for range 8 {
			a0 = a0*x + y
			a1 = a1*x + y
			a2 = a2*x + y
			a3 = a3*x + y
			a4 = a4*x + y
			a5 = a5*x + y
			a6 = a6*x + y
			a7 = a7*x + y
			a8 = a8*x + y
			a9 = a9*x + y
			a10 = a10*x + y
			a11 = a11*x + y
		}
	}
	return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11
}

func widenBF16Generic(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

func widenF16Generic(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = f16ToF32(h)
	}
}

// f16ToF32 widens a binary16 value exactly, as VCVTPH2PS does: a NaN
// keeps its sign and payload and is made quiet.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	em := uint32(h & 0x7fff) // exponent and mantissa
	var bits uint32
	switch {
	case em >= 0x7c00: // Inf or NaN
		bits = 0x7f800000 | (em&0x3ff)<<13
		if em != 0x7c00 {
			bits |= 0x00400000 // quiet
		}
	case em >= 0x0400: // normal: rebias the exponent from 15 to 127
		bits = em<<13 + (127-15)<<23
	default: // zero or subnormal em·2^-24, a normal float32 (or 0)
		bits = math.Float32bits(float32(em) * 0x1p-24)
	}
	return math.Float32frombits(sign | bits)
}

// dotRowsGeneric computes DotRows two query rows × two keys at a time,
// four sums over the columns, so that each value loaded serves two
// products; an odd last row or key goes through dotGeneric.
func dotRowsGeneric(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int) {
	if rows == 0 || n == 0 {
		return
	}
	if d == 0 { // q and k may be empty
		for r := range rows {
			clear(s[r*lds:][:n])
		}
		return
	}
	r := 0
	for ; r+2 <= rows; r += 2 {
		q0 := q[r*ldq:][:d]
		q1 := q[(r+1)*ldq:][:d]
		s0 := s[r*lds:][:n]
		s1 := s[(r+1)*lds:][:n]
		j := 0
		for ; j+2 <= n; j += 2 {
			k0 := k[j*ldk:][:d]
			k1 := k[(j+1)*ldk:][:d]
			var a00, a01, a10, a11 float32
			for c, x0 := range q0 {
				x1, y0, y1 := q1[c], k0[c], k1[c]
				a00 += x0 * y0
				a01 += x0 * y1
				a10 += x1 * y0
				a11 += x1 * y1
			}
			s0[j], s0[j+1] = a00, a01
			s1[j], s1[j+1] = a10, a11
		}
		if j < n {
			kj := k[j*ldk:][:d]
			s0[j] = dotGeneric(q0, kj)
			s1[j] = dotGeneric(q1, kj)
		}
	}
	if r < rows {
		q0 := q[r*ldq:][:d]
		s0 := s[r*lds:][:n]
		for j := range s0 {
			s0[j] = dotGeneric(q0, k[j*ldk:][:d])
		}
	}
}

// dotRowsBF16Generic is DotRowsBF16 in Go: widenBF16Generic, then
// dotRowsWidened.
func dotRowsBF16Generic(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int) {
	dotRowsWidened(s, lds, q, ldq, rows, k, ldk, n, d, false)
}

// dotRowsF16Generic is DotRowsF16 in Go: widenF16Generic, then
// dotRowsWidened.
func dotRowsF16Generic(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int) {
	dotRowsWidened(s, lds, q, ldq, rows, k, ldk, n, d, true)
}

// widenChunk is the number of key values dotRowsWidened widens at once,
// into an array on the stack: the kernels do not allocate.
const widenChunk = 256

// dotRowsWidened widens each key row (binary16 if f16, else bfloat16) by
// chunks of widenChunk values and adds the dotGeneric of each query row
// with the chunk to its score. The widenings are called directly, not
// through a func value, so that buf stays on the stack.
func dotRowsWidened(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, f16 bool) {
	if rows == 0 || n == 0 {
		return
	}
	var buf [widenChunk]float32
	for j := range n {
		for r := range rows {
			s[r*lds+j] = 0
		}
		for c0 := 0; c0 < d; c0 += widenChunk {
			w := buf[:min(widenChunk, d-c0)]
			if f16 {
				widenF16Generic(w, k[j*ldk+c0:][:len(w)])
			} else {
				widenBF16Generic(w, k[j*ldk+c0:][:len(w)])
			}
			for r := range rows {
				s[r*lds+j] += dotGeneric(q[r*ldq+c0:][:len(w)], w)
			}
		}
	}
}

// gemmPanelsGeneric is the plain Go GemmPanels: for each panel, blocks
// of 2 rows × 4 columns of C in 8 local accumulators, as in gemmGeneric.
func gemmPanelsGeneric(m, n, k int, a []float32, ar, ac int, b []float32, pb int, c []float32, pc int, accumulate bool) {
	if m == 0 || n == 0 {
		return
	}
	for jp := range n / Panel {
		cp := c[jp*pc:][:m*Panel]
		if !accumulate {
			clear(cp)
		}
		if k == 0 {
			continue
		}
		bp := b[jp*pb:][:k*Panel]
		i := 0
		for ; i+2 <= m; i += 2 {
			a0 := a[i*ar:][:(k-1)*ac+1]
			a1 := a[(i+1)*ar:][:(k-1)*ac+1]
			c0 := cp[i*Panel:][:Panel]
			c1 := cp[(i+1)*Panel:][:Panel]
			for j := 0; j < Panel; j += 4 {
				s00, s01, s02, s03 := c0[j], c0[j+1], c0[j+2], c0[j+3]
				s10, s11, s12, s13 := c1[j], c1[j+1], c1[j+2], c1[j+3]
				for p := range k {
					x0, x1 := a0[p*ac], a1[p*ac]
					bb := bp[p*Panel+j:][:4]
					s00 += x0 * bb[0]
					s01 += x0 * bb[1]
					s02 += x0 * bb[2]
					s03 += x0 * bb[3]
					s10 += x1 * bb[0]
					s11 += x1 * bb[1]
					s12 += x1 * bb[2]
					s13 += x1 * bb[3]
				}
				c0[j], c0[j+1], c0[j+2], c0[j+3] = s00, s01, s02, s03
				c1[j], c1[j+1], c1[j+2], c1[j+3] = s10, s11, s12, s13
			}
		}
		if i < m {
			a0 := a[i*ar:][:(k-1)*ac+1]
			c0 := cp[i*Panel:][:Panel]
			for j := 0; j < Panel; j += 4 {
				s0, s1, s2, s3 := c0[j], c0[j+1], c0[j+2], c0[j+3]
				for p := range k {
					x := a0[p*ac]
					bb := bp[p*Panel+j:][:4]
					s0 += x * bb[0]
					s1 += x * bb[1]
					s2 += x * bb[2]
					s3 += x * bb[3]
				}
				c0[j], c0[j+1], c0[j+2], c0[j+3] = s0, s1, s2, s3
			}
		}
	}
}

// The constants of exp2Tile, shared with the assembly (see exp2Vec in
// _asm/flash.go).
const exp2Magic = 12583039 // 1.5·2^23 + 127

// exp2C holds c1 … c5 of 2^r ≈ 1 + r·(c1 + r·(c2 + r·(c3 + r·(c4 +
// r·c5)))) on |r| ≤ 1/2.
var exp2C = [5]float32{
	math.Float32frombits(0x3f317215),
	math.Float32frombits(0x3e75fcde),
	math.Float32frombits(0x3d635ba9),
	math.Float32frombits(0x3c1e7544),
	math.Float32frombits(0x3aaddd0c),
}

// exp2Tile is 2^t by the steps of the assembly: t below -127 counts as
// -127, whose result is 0; n = round(t) comes from adding 1.5·2^23 + 127,
// which leaves n+127 in the low bits, shifted into the exponent field to
// make 2^n (or 0); r = t - n, and a polynomial gives 2^r. t must not
// exceed 128.
func exp2Tile(t float32) float32 {
	if t != t {
		return t
	}
	t = max(t, -127)
	k := t + exp2Magic
	nf := k - exp2Magic
	r := t - nf
	p := exp2C[4]
	p = p*r + exp2C[3]
	p = p*r + exp2C[2]
	p = p*r + exp2C[1]
	p = p*r + exp2C[0]
	p = p*r + 1
	return p * math.Float32frombits(math.Float32bits(k)<<23)
}

func onlineSoftmaxGeneric(s []float32, ps, n, np int, lim, m, l, acc []float32, pacc, dacc int) {
	negInf := float32(math.Inf(-1))
	for q := range np {
		var sp []float32
		if n > 0 {
			sp = s[q*ps:][:n*Panel]
		}
		var c [Panel]float32
		rescale := false
		for x := range Panel {
			i := q*Panel + x
			mx := m[i]
			for j := range n {
				v := &sp[j*Panel+x]
				if len(lim) > 0 && !(float32(j) < lim[i]) {
					*v = negInf
				}
				mx = max(mx, *v)
			}
			ms := mx
			if mx == negInf {
				ms = 0
			}
			cf := exp2Tile((m[i] - ms) * expLog2e)
			var sum float32
			for j := range n {
				e := exp2Tile((sp[j*Panel+x] - ms) * expLog2e)
				sp[j*Panel+x] = e
				sum += e
			}
			l[i] = l[i]*cf + sum
			m[i] = mx
			c[x] = cf
			rescale = rescale || cf != 1
		}
		if rescale {
			for r := range dacc {
				row := acc[q*pacc+r*Panel:][:Panel]
				for x := range row {
					row[x] *= c[x]
				}
			}
		}
	}
}

// attendPanelsGeneric is AttendPanels by its definition; it ignores the
// prefetch hints.
func attendPanelsGeneric(np, n, d int, k []float32, kr, kc int, qt []float32, pq int, st, v []float32, vr, vc int, m, l, acc []float32, pacc int, _, _ []float32) {
	for q := range np {
		gemmPanelsGeneric(n, Panel, d, k, kr, kc, qt[q*pq:], pq, st, Panel*n, false)
		onlineSoftmaxGeneric(st, Panel*n, n, 1, nil, m[q*Panel:], l[q*Panel:], acc[q*pacc:], pacc, d)
		gemmPanelsGeneric(d, Panel, n, v, vr, vc, st, Panel*n, acc[q*pacc:], pacc, true)
	}
}

func panelFromRowsGeneric(dst, src []float32, off []int, d int, scale float32) {
	dst = dst[:d*Panel]
	for x, o := range off {
		row := src[o:][:d]
		for c, v := range row {
			dst[c*Panel+x] = v * scale
		}
	}
	for x := len(off); x < Panel; x++ {
		for c := range d {
			dst[c*Panel+x] = 0
		}
	}
}

func rowsFromPanelGeneric(dst []float32, off []int, src, f []float32, d int) {
	src = src[:d*Panel]
	for x, o := range off {
		row := dst[o:][:d]
		fx := f[x]
		for c := range row {
			row[c] = src[c*Panel+x] * fx
		}
	}
}
