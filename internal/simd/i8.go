package simd

// The kernels of the decode step on an int8 KV cache, whose rows are
// int8 codes with one float32 scale a row (the row is code·scale):
// DotRowsI8 and GemmI8 widen the codes in registers and leave the scales
// to the caller (ScaleColumns applies them to a block of scores or
// probabilities), WidenI8 widens whole rows times their scales.
// DotRowsU4 and GemmU4 do the same for 4-bit codes, two a byte, read in
// place: each takes one nibble of every byte, so a packed row is two
// calls.

// DotRowsI8 is DotRows with the keys in int8, widened to float32 as they
// are read: s[r*lds+j] is the dot product of row r of q with the codes of
// key row j, and the caller multiplies it by that row's scale (one
// multiply a score, where applying the scale inside would cost one a
// value of the row). The scores are those of DotRows on float32(k); it
// panics as DotRows does.
func DotRowsI8(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsI8(s, lds, q, ldq, rows, k, ldk, n, d)
}

// DotRowsI8PF is DotRowsI8 with the prefetch hint of DotRowsPF.
func DotRowsI8PF(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int, pf []int8) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsI8PF(s, lds, q, ldq, rows, k, ldk, n, d, pf)
}

// GemmI8 is GemmBF16 with B in int8, widened to float32 in registers as
// it is read: C = A·B or C += A·B with B's values float32(b). For the
// product O += P·V of a decode step on an int8 cache the caller first
// multiplies column j of P by the scale of value row j, so that
// Σ_j (p_j·s_j)·b_j is the product with the dequantised values. pf is the
// prefetch hint of GemmBF16. GemmI8 panics as GemmBF16 does.
func GemmI8(m, n, k int, a []float32, lda int, b []int8, ldb int, c []float32, ldc int, accumulate bool, pf []int8) {
	checkGemm8(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	active.gemmI8(m, n, k, a, lda, b, ldb, c, ldc, accumulate, pf)
}

// WidenI8 dequantises rows of int8 codes: for each row r < len(scale) of
// ld values, dst[r*ld+i] = float32(src[r*ld+i])·scale[r], the float32
// product (one rounding). dst and src must not overlap. It panics if ld
// is negative or len(dst) != len(src) or len(src) != len(scale)·ld.
func WidenI8(dst []float32, src []int8, scale []float32, ld int) {
	if ld < 0 || len(dst) != len(src) || len(src) != len(scale)*ld {
		panic("simd: WidenI8 with ld < 0, len(dst) != len(src) or len(src) != len(scale)·ld")
	}
	active.widenI8(dst, src, scale, ld)
}

// ScaleColumns multiplies column j of rows × len(f) matrix s (row stride
// lds) by f[j]: s[r*lds+j] *= f[j] for r < rows, j < len(f). It applies the
// scales of an int8 cache's rows to a block of scores (after DotRowsI8) or
// of probabilities (before GemmI8). It panics if rows is negative, lds <
// len(f) or s is too short for its rows.
func ScaleColumns(s []float32, lds, rows int, f []float32) {
	if rows < 0 {
		panic("simd: ScaleColumns with rows < 0")
	}
	if rows > 0 && len(f) > 0 && (lds < len(f) || len(s) < (rows-1)*lds+len(f)) {
		panic("simd: ScaleColumns with s too short or lds < len(f)")
	}
	active.scaleColumns(s, lds, rows, f)
}

// The Go versions.

func scaleColumnsGeneric(s []float32, lds, rows int, f []float32) {
	if len(f) == 0 {
		return
	}
	for r := range rows {
		row := s[r*lds:][:len(f)]
		for j, x := range f {
			row[j] *= x
		}
	}
}

func widenI8Generic(dst []float32, src []int8, scale []float32, ld int) {
	for r, f := range scale {
		d := dst[r*ld:][:ld]
		for i, c := range src[r*ld:][:ld] {
			d[i] = float32(c) * f
		}
	}
}

// The Go kernels of int8 and 4-bit codes share one body each: byteCodes
// says what a byte holds.
type byteCodes int

const (
	wholeByte  byteCodes = iota // an int8 code
	lowNibble                   // a 4-bit code, 0…15, in bits 0–3
	highNibble                  // a 4-bit code in bits 4–7
)

// widenCodes sets w[i] to the code of src[i] that what names. It is
// called directly, not through a func value, so that the callers' w
// stays on the stack.
func widenCodes[T int8 | uint8](w []float32, src []T, what byteCodes) {
	src = src[:len(w)]
	switch what {
	case wholeByte:
		for i, c := range src {
			w[i] = float32(c)
		}
	case lowNibble:
		for i, c := range src {
			w[i] = float32(c & 15)
		}
	default:
		for i, c := range src {
			w[i] = float32(c >> 4 & 15)
		}
	}
}

// dotRowsCodes widens each key row by chunks of widenChunk values into an
// array on the stack and adds the dotGeneric of each query row with the
// chunk to its score, as dotRowsWidened does.
func dotRowsCodes[T int8 | uint8](s []float32, lds int, q []float32, ldq, rows int, k []T, ldk, n, d int, what byteCodes) {
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
			widenCodes(w, k[j*ldk+c0:], what)
			for r := range rows {
				s[r*lds+j] += dotGeneric(q[r*ldq+c0:][:len(w)], w)
			}
		}
	}
}

// gemmCodes widens each row of B by chunks of widenChunk values into an
// array on the stack, once, and adds it times A[i][p] to each row i of C
// with axpyGeneric, as gemm16Generic does.
func gemmCodes[T int8 | uint8](m, n, k int, a []float32, lda int, b []T, ldb int, c []float32, ldc int, accumulate bool, what byteCodes) {
	if m == 0 || n == 0 {
		return
	}
	if !accumulate {
		for i := range m {
			clear(c[i*ldc:][:n])
		}
	}
	var buf [widenChunk]float32
	for j0 := 0; j0 < n; j0 += widenChunk {
		w := buf[:min(widenChunk, n-j0)]
		for p := range k {
			widenCodes(w, b[p*ldb+j0:], what)
			for i := range m {
				axpyGeneric(a[i*lda+p], w, c[i*ldc+j0:][:len(w)])
			}
		}
	}
}

func dotRowsI8Generic(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int) {
	dotRowsCodes(s, lds, q, ldq, rows, k, ldk, n, d, wholeByte)
}

func dotRowsI8PFGeneric(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int, _ []int8) {
	dotRowsI8Generic(s, lds, q, ldq, rows, k, ldk, n, d)
}

func gemmI8Generic(m, n, k int, a []float32, lda int, b []int8, ldb int, c []float32, ldc int, accumulate bool, _ []int8) {
	gemmCodes(m, n, k, a, lda, b, ldb, c, ldc, accumulate, wholeByte)
}

// DotRowsU4 is DotRowsI8 with the keys 4-bit codes read in place from
// one half of packed rows: key value c of row j is the low nibble of
// k[j*ldk+c] (hi false) or its high one (hi true), 0…15. A row of 2·ldk
// codes packed with code i in the low nibble of byte i and code i+ldk in
// its high one (as kvcache's int4 rows are) is two halves of ldk bytes,
// two calls with the query columns of each half. It panics as DotRows
// does.
func DotRowsU4(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int, hi bool) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsU4[b2i(hi)](s, lds, q, ldq, rows, k, ldk, n, d)
}

// GemmU4 is GemmI8 with B the low (hi false) or high (hi true) nibbles of
// bytes, read in place: for the product O += P·V with values packed as
// DotRowsU4 reads keys. It panics as GemmI8 does.
func GemmU4(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate, hi bool) {
	checkGemm8(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	active.gemmU4[b2i(hi)](m, n, k, a, lda, b, ldb, c, ldc, accumulate, nil)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func dotRowsU4LoGeneric(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int) {
	dotRowsCodes(s, lds, q, ldq, rows, k, ldk, n, d, lowNibble)
}

func dotRowsU4HiGeneric(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int) {
	dotRowsCodes(s, lds, q, ldq, rows, k, ldk, n, d, highNibble)
}

func gemmU4LoGeneric(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, _ []uint8) {
	gemmCodes(m, n, k, a, lda, b, ldb, c, ldc, accumulate, lowNibble)
}

func gemmU4HiGeneric(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, _ []uint8) {
	gemmCodes(m, n, k, a, lda, b, ldb, c, ldc, accumulate, highNibble)
}
