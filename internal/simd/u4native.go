package simd

import "math"

// The decode kernels of int4 caches in the integer and bfloat16
// arithmetic of the CPU: DotRowsU4Q8 multiplies keys' codes with queries
// rounded to int8, GemmU4BF16 values' codes with probabilities rounded to
// bfloat16, as llama.cpp's quantised dot products and FlashAttention's
// P·V do. Every family computes the same numbers (the Go versions are
// the definition); only the avx512bf16 family on a CPU with AVX512-VNNI
// runs them in assembly, fast (NativeU4), where the other families are
// better served by DotRowsU4 and GemmU4 on float32 queries and
// probabilities.

// u4MaxPW is the longest half of a packed row DotRowsU4Q8 takes: rows of
// up to 512 codes.
const u4MaxPW = 256

// NativeU4 reports whether DotRowsU4Q8 and GemmU4BF16 run in the
// integer and bfloat16 instructions of the CPU, rather than as the Go
// definitions (many times slower than DotRowsU4 and GemmU4).
func NativeU4() bool { return active.u4Native }

// DotRowsU4Q8 sets s[r*lds+j], for the rows query rows of q (row stride
// ldq, d values) and the n packed key rows of k (row stride ldk bytes,
// pw bytes a row: value c of a row in the low nibble of byte c when
// c < pw, in the high nibble of byte c-pw otherwise, so d ≤ 2·pw) whose
// values are zero_c + scale_c·code_c (int4 keys quantised per channel),
// to the product of the query row with them:
//
//	float32(float32(Σ_c q8_c·(code_c - 8)) · qs) + z
//
// The query times the scales, y_c = q_c·scale_c, is rounded to int8:
// m = max(max_c |y_c|, 2^-100), q8_c = round(y_c·(127/m)) to nearest
// even, qs = m/127, all in float32. The integer sum is exact; rounding y
// changes each term by up to m/254, the error int8 queries bring to
// llama.cpp's int4 dot products. The codes are centred on 8, as
// llama.cpp's q4_0 centres them, so that this error multiplies |code-8|
// ≤ 8 rather than codes up to 15: the part of it that the codes' mean
// carries is the same for all the keys of a call, but differs between
// key groups (and the float32 keys a cache has not yet quantised), so
// the softmax would not cancel it. z = Σ_c q_c·w_c, w_c =
// float32(zero_c + 8·scale_c) the value of code 8, each product rounded,
// summed in 16 lanes (lane c%16) in order of c and the lanes added as
// reduceAdd does. A NaN or infinite y_c makes the row's scores NaN. pw
// must be a multiple of 8 and at most 256. It panics on sizes that do
// not fit.
func DotRowsU4Q8(s []float32, lds int, q []float32, ldq, rows int, scale, zero []float32, k []uint8, ldk, n, d, pw int) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, min(d, pw))
	if pw < 0 || pw%8 != 0 || pw > u4MaxPW || d > 2*pw || (n > 0 && ldk < pw) || (n > 0 && len(k) < (n-1)*ldk+pw) {
		panic("simd: DotRowsU4Q8 with pw not a multiple of 8 in [0, 256], d > 2·pw or k too short")
	}
	if rows > 0 && n > 0 && d > 0 && (ldq < d || len(q) < (rows-1)*ldq+d) {
		panic("simd: DotRowsU4Q8 with q too short or ldq < d")
	}
	if len(scale) < d || len(zero) < d {
		panic("simd: DotRowsU4Q8 with scale or zero shorter than d")
	}
	if rows == 0 || n == 0 {
		return
	}
	for r0 := 0; r0 < rows; r0 += 4 {
		active.dotRowsU4Q8(s[r0*lds:], lds, q[r0*ldq:], ldq, min(4, rows-r0), scale, zero, k, ldk, n, d, pw)
	}
}

// GemmU4BF16 is GemmU4 with C += A'·B always, where A' is A with each
// column p times rs[p] (the scale of value row p of an int4 cache),
// rounded to bfloat16 (to nearest even, subnormals to zero): for each
// column of C, the products of the steps p, p+1 of k (p even; a missing
// last step counts 0) are added to a float32 sum, that of p+1 first,
// each addition rounded and subnormal sums flushed to zero, over chunks
// of 256 steps, each chunk's sum then added to C. The codes are exact in
// bfloat16, so only the rounding of A', 2^-9 of each term, separates it
// from GemmU4. It panics as GemmU4 does.
func GemmU4BF16(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int, hi bool) {
	checkGemm8(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if m == 0 || n == 0 || k == 0 {
		return
	}
	if len(rs) < k {
		panic("simd: GemmU4BF16 with rs shorter than k")
	}
	f := active.gemmU4BF16[b2i(hi)]
	for i0 := 0; i0 < m; i0 += 4 {
		for p0 := 0; p0 < k; p0 += 256 {
			f(min(4, m-i0), n, min(256, k-p0), a[i0*lda+p0:], lda, rs[p0:], b[p0*ldb:], ldb, c[i0*ldc:], ldc)
		}
	}
}

// dotRowsU4Q8Generic is the definition of DotRowsU4Q8.
func dotRowsU4Q8Generic(s []float32, lds int, q []float32, ldq, rows int, scale, zero []float32, k []uint8, ldk, n, d, pw int) {
	q8 := make([]int32, d)
	w := make([]float32, d)
	for c := range w {
		w[c] = zero[c] + 8*scale[c]
	}
	for r := range rows {
		qr := q[r*ldq:][:d]
		qs := quantQ8(q8, qr, scale[:d])
		z := laneSum(qr, w)
		for j := range n {
			row := k[j*ldk:][:pw]
			var sum int32
			for c, v := range q8 {
				if c < pw {
					sum += v * (int32(row[c]&15) - 8)
				} else {
					sum += v * (int32(row[c-pw]>>4) - 8)
				}
			}
			s[r*lds+j] = float32(float32(sum)*qs) + z
		}
	}
}

// quantQ8 rounds x times scale to int8 into q8 as DotRowsU4Q8 does and
// returns the scale of the codes.
func quantQ8(q8 []int32, x, scale []float32) float32 {
	var m float32
	bad := false
	for c, v := range x {
		y := float32(v * scale[c])
		if math.IsNaN(float64(y)) || math.IsInf(float64(y), 0) {
			bad = true
		}
		m = max(m, float32(math.Abs(float64(y))))
	}
	m = max(m, 0x1p-100)
	inv := float32(127) / m
	for c, v := range x {
		y := float32(v * scale[c])
		q8[c] = int32(max(-128, min(127, math.RoundToEven(float64(float32(y*inv))))))
	}
	if bad {
		return float32(math.NaN())
	}
	return m / 127
}

// laneSum returns Σ x_c·y_c as DotRowsU4Q8 adds it: each product rounded
// to float32, lane c%16 summing its products in order of c (the last
// chunk's missing values adding +0), then the lanes added pairwise: i
// and i+8, then i and i+4, i and i+2, 0 and 1.
func laneSum(x, y []float32) float32 {
	var lane [16]float32
	for c0 := 0; c0 < len(x); c0 += 16 {
		for i := range lane {
			var p float32
			if c := c0 + i; c < len(x) {
				p = float32(x[c] * y[c])
			}
			lane[i] += p
		}
	}
	for w := 8; w >= 1; w /= 2 {
		for i := range w {
			lane[i] += lane[i+w]
		}
	}
	return lane[0]
}

// gemmU4BF16LoGeneric and gemmU4BF16HiGeneric are the definition of
// GemmU4BF16 for k ≤ 256.
func gemmU4BF16LoGeneric(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int) {
	gemmU4BF16Generic(m, n, k, a, lda, rs, b, ldb, c, ldc, false)
}

func gemmU4BF16HiGeneric(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int) {
	gemmU4BF16Generic(m, n, k, a, lda, rs, b, ldb, c, ldc, true)
}

func gemmU4BF16Generic(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int, hi bool) {
	code := func(p, j int) float32 {
		v := b[p*ldb+j]
		if hi {
			return float32(v >> 4)
		}
		return float32(v & 15)
	}
	ar := make([]float32, k)
	for i := range m {
		for p, v := range a[i*lda:][:k] {
			ar[p] = RoundBF16(float32(v * rs[p]))
		}
		for j := range n {
			var acc float32
			for p := 0; p < k; p += 2 {
				if p+1 < k {
					acc = ftz(acc + ar[p+1]*code(p+1, j))
				}
				acc = ftz(acc + ar[p]*code(p, j))
			}
			c[i*ldc+j] += acc
		}
	}
}

// RoundBF16 returns x rounded to bfloat16 as VCVTNE2PS2BF16 rounds it:
// to nearest even, a subnormal x to zero of its sign, a NaN to a quiet
// NaN.
func RoundBF16(x float32) float32 {
	b := math.Float32bits(x)
	switch {
	case x != x:
		return math.Float32frombits((b | 0x400000) &^ 0xffff)
	case b&0x7f800000 == 0:
		return math.Float32frombits(b & 0x80000000)
	}
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

// ftz flushes a subnormal result to zero of its sign, as VDPBF16PS does.
func ftz(x float32) float32 {
	if b := math.Float32bits(x); b&0x7f800000 == 0 {
		return math.Float32frombits(b & 0x80000000)
	}
	return x
}
