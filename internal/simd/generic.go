package simd

import "math"

// The plain Go products. Go keeps few values in registers: a block of C
// in more than a few accumulators, or a loop with many live indices,
// spills to the stack, and a loop counter spilled there puts a store and
// a load on every iteration's path. So the products copy a chunk of B,
// up to Panel columns × gemmKC rows, into columns (bt), and each row of A
// then takes its dot products with six columns at a time (dot6, then
// dot4 and dotGeneric for the rest: small functions, so that their
// loops hold nothing else), where every load is sequential and the
// bounds checks are proven away. A chunk of B is copied once for all
// the rows of A, so the copy costs about one row's worth of work.
const gemmKC = 128

// gemmGeneric is the plain Go Gemm.
func gemmGeneric(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	if m == 0 || n == 0 {
		return
	}
	if !accumulate {
		for i := range m {
			clear(c[i*ldc:][:n])
		}
	}
	var bt [Panel * gemmKC]float32
	for j0 := 0; j0 < n; j0 += Panel {
		w := min(Panel, n-j0)
		for p0 := 0; p0 < k; p0 += gemmKC {
			kk := min(gemmKC, k-p0)
			for p := range kk {
				for j, v := range b[(p0+p)*ldb+j0:][:w] {
					bt[j*kk+p] = v
				}
			}
			for i := range m {
				rowTimesCols(a[i*lda+p0:][:kk], bt[:w*kk], c[i*ldc+j0:][:w])
			}
		}
	}
}

// rowTimesCols adds to c[j] the dot product of x with column j of bt,
// bt[j·len(x):][:len(x)], for every j < len(c).
func rowTimesCols(x, bt, c []float32) {
	kk, j := len(x), 0
	for ; j+6 <= len(c); j += 6 {
		dot6(x, bt[j*kk:], kk, (*[6]float32)(c[j:]))
	}
	if j+4 <= len(c) {
		dot4(x, bt[j*kk:], kk, (*[4]float32)(c[j:]))
		j += 4
	}
	for ; j < len(c); j++ {
		c[j] += dotGeneric(x, bt[j*kk:][:kk])
	}
}

// dot6 adds to c[j] the dot product of x with b[j·ld:][:len(x)], j < 6.
//
//go:noinline
func dot6(x, b []float32, ld int, c *[6]float32) {
	n := len(x)
	b0, b1, b2 := b[:n], b[ld:][:n], b[2*ld:][:n]
	b3, b4, b5 := b[3*ld:][:n], b[4*ld:][:n], b[5*ld:][:n]
	s0, s1, s2, s3, s4, s5 := c[0], c[1], c[2], c[3], c[4], c[5]
	for p, v := range x {
		s0 += v * b0[p]
		s1 += v * b1[p]
		s2 += v * b2[p]
		s3 += v * b3[p]
		s4 += v * b4[p]
		s5 += v * b5[p]
	}
	c[0], c[1], c[2], c[3], c[4], c[5] = s0, s1, s2, s3, s4, s5
}

// dot4 is dot6 for 4 columns.
//
//go:noinline
func dot4(x, b []float32, ld int, c *[4]float32) {
	n := len(x)
	b0, b1, b2, b3 := b[:n], b[ld:][:n], b[2*ld:][:n], b[3*ld:][:n]
	s0, s1, s2, s3 := c[0], c[1], c[2], c[3]
	for p, v := range x {
		s0 += v * b0[p]
		s1 += v * b1[p]
		s2 += v * b2[p]
		s3 += v * b3[p]
	}
	c[0], c[1], c[2], c[3] = s0, s1, s2, s3
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

// gemmPanelsGeneric is the plain Go GemmPanels, by the steps of
// gemmGeneric; a row of A whose values are ac apart is gathered first.
func gemmPanelsGeneric(m, n, k int, a []float32, ar, ac int, b []float32, pb int, c []float32, pc int, accumulate bool) {
	if m == 0 || n == 0 {
		return
	}
	var bt [Panel * gemmKC]float32
	var xs [gemmKC]float32
	for jp := range n / Panel {
		cp := c[jp*pc:][:m*Panel]
		if !accumulate {
			clear(cp)
		}
		if k == 0 {
			continue
		}
		bp := b[jp*pb:][:k*Panel]
		for p0 := 0; p0 < k; p0 += gemmKC {
			kk := min(gemmKC, k-p0)
			for p := range kk {
				for j, v := range bp[(p0+p)*Panel:][:Panel] {
					bt[j*kk+p] = v
				}
			}
			for i := range m {
				var x []float32
				if ac == 1 {
					x = a[i*ar+p0:][:kk]
				} else {
					x = xs[:kk]
					at := i*ar + p0*ac
					for p := range x {
						x[p] = a[at]
						at += ac
					}
				}
				rowTimesCols(x, bt[:Panel*kk], cp[i*Panel:][:Panel])
			}
		}
	}
}

// The constants of exp2Tile, shared with the assembly (see exp2Vec in
// _asm/flash.go).
const exp2Magic = 12583039 // 1.5·2^23 + 127

// exp2C1 … exp2C5 are c1 … c5 of 2^r ≈ 1 + r·(c1 + r·(c2 + r·(c3 + r·(c4
// + r·c5)))) on |r| ≤ 1/2: the float32 values 0x3f317215, 0x3e75fcde,
// 0x3d635ba9, 0x3c1e7544 and 0x3aaddd0c, written out so that exp2Tile is
// cheap enough to inline (TestExp2Constants checks the bits).
const (
	exp2C1 = 0.6931470036506653
	exp2C2 = 0.24022242426872253
	exp2C3 = 0.05550733581185341
	exp2C4 = 0.009671512991189957
	exp2C5 = 0.0013264729641377926
)

// exp2Tile is 2^t by the steps of the assembly: t below -127 counts as
// -127, whose result is 0; n = round(t) comes from adding 1.5·2^23 + 127,
// which leaves n+127 in the low bits, shifted into the exponent field to
// make 2^n (or 0); r = t - n, and a polynomial gives 2^r. t must not
// exceed 128.
func exp2Tile(t float32) float32 {
	t = max(t, -127) // NaN stays NaN, through max and the rest
	k := t + exp2Magic
	nf := k - exp2Magic
	r := t - nf
	p := ((((exp2C5*r+exp2C4)*r+exp2C3)*r+exp2C2)*r+exp2C1)*r + 1
	return p * math.Float32frombits(math.Float32bits(k)<<23)
}

// onlineSoftmaxGeneric walks each panel a row of Panel queries at a
// time, in the order the values lie, with a query's maximum, shift and
// sum in arrays; every query's sum still adds its keys in order.
func onlineSoftmaxGeneric(s []float32, ps, n, np int, lim, m, l, acc []float32, pacc, dacc int) {
	negInf := float32(math.Inf(-1))
	for q := range np {
		var sp []float32
		if n > 0 {
			sp = s[q*ps:][:n*Panel]
		}
		mq := (*[Panel]float32)(m[q*Panel:])
		lq := (*[Panel]float32)(l[q*Panel:])
		if len(lim) > 0 {
			lq := (*[Panel]float32)(lim[q*Panel:])
			for j := range n {
				row := (*[Panel]float32)(sp[j*Panel:])
				for x := range row {
					if !(float32(j) < lq[x]) {
						row[x] = negInf
					}
				}
			}
		}
		mx := *mq
		for j := range n {
			for x, v := range (*[Panel]float32)(sp[j*Panel:]) {
				mx[x] = max(mx[x], v)
			}
		}
		var ms, c, sum [Panel]float32
		rescale := false
		for x := range ms {
			ms[x] = mx[x]
			if mx[x] == negInf {
				ms[x] = 0
			}
			c[x] = exp2Tile((mq[x] - ms[x]) * expLog2e)
			rescale = rescale || c[x] != 1
		}
		for j := range n {
			row := (*[Panel]float32)(sp[j*Panel:])
			for x, v := range row {
				e := exp2Tile((v - ms[x]) * expLog2e)
				row[x] = e
				sum[x] += e
			}
		}
		for x := range lq {
			lq[x] = lq[x]*c[x] + sum[x]
		}
		*mq = mx
		if rescale {
			for r := range dacc {
				row := (*[Panel]float32)(acc[q*pacc+r*Panel:])
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
