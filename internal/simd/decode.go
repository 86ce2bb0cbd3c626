package simd

// The kernels of the KV-cache decode step that read the cache in place
// and prefetch its next block: the product O += P·V with 16-bit values
// widened in registers (GemmBF16, GemmF16) or float32 ones (GemmPF), and
// the scores with a prefetch hint (DotRowsPF, DotRowsBF16PF,
// DotRowsF16PF). See the package documentation.

// GemmBF16 is Gemm with B in bfloat16 (see WidenBF16), widened to float32
// in registers as it is read: C = A·B (accumulate false) or C += A·B for
// an m×k float32 matrix A (row stride lda), a k×n bfloat16 matrix B (row
// stride ldb) and an m×n float32 matrix C (row stride ldc). It is the
// product O += P·V of a decode step on the values of a 16-bit cache, read
// once at half the bytes of float32 with no widened copy (the neon
// family widens small blocks on the stack instead). The results are
// those of Gemm on the widened B, up to the order of additions and, with
// the avx512bf16 kernels, which split each value of A into two bfloat16
// halves and multiply them by VDPBF16PS, to the split's error: the halves
// add up to within 2^-18 of the value, so each term is within 2^-18 of
// itself (GemmBF16Native rounds A to one bfloat16 instead, faster).
//
// pf is a hint, which may be empty: memory (in practice the values of the
// next block of the cache) that the assembly prefetches a line at a time
// as it computes. It changes no result.
//
// n must be a multiple of 8 (not of Panel: the last 8 columns take a
// narrower block); m and k may be anything, including 0. GemmBF16 panics
// as Gemm does, but on an n that is not a multiple of 8.
func GemmBF16(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16) {
	checkGemm8(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	active.gemmBF16(m, n, k, a, lda, b, ldb, c, ldc, accumulate, pf)
}

// GemmF16 is GemmBF16 with B in IEEE 754 binary16 (see WidenF16).
func GemmF16(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16) {
	checkGemm8(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	active.gemmF16(m, n, k, a, lda, b, ldb, c, ldc, accumulate, pf)
}

// GemmPF is GemmBF16 with B in float32: Gemm with n a multiple of 8 and
// a prefetch hint.
func GemmPF(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool, pf []float32) {
	checkGemm8(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	active.gemmPF(m, n, k, a, lda, b, ldb, c, ldc, accumulate, pf)
}

// checkGemm8 is checkGemm with n a multiple of 8 instead of Panel.
func checkGemm8(m, n, k, la, lda, lb, ldb, lc, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic("simd: GemmBF16, GemmF16, GemmI8 or GemmPF with a negative size")
	}
	if n%8 != 0 {
		panic("simd: GemmBF16, GemmF16, GemmI8 or GemmPF with n not a multiple of 8")
	}
	if m > 0 && n > 0 && (ldc < n || lc < (m-1)*ldc+n) {
		panic("simd: GemmBF16, GemmF16, GemmI8 or GemmPF with C too short or ldc < n")
	}
	if m > 0 && n > 0 && k > 0 && (lda < k || la < (m-1)*lda+k) {
		panic("simd: GemmBF16, GemmF16, GemmI8 or GemmPF with A too short or lda < k")
	}
	if m > 0 && n > 0 && k > 0 && (ldb < n || lb < (k-1)*ldb+n) {
		panic("simd: GemmBF16, GemmF16, GemmI8 or GemmPF with B too short or ldb < n")
	}
}

// DotRowsBF16Native is DotRowsBF16PF in the bfloat16 arithmetic of the
// CPU, where it has one. With the avx512bf16 kernels (see Kernels) the
// queries are rounded to bfloat16 (to nearest even, subnormals to zero)
// and the products of pairs of bfloat16 added in float32 by VDPBF16PS:
// twice the products of an FMA an instruction, no key widened, about half
// the time of DotRowsBF16PF. Rounding q changes each term q_c·k_c by up
// to 2^-9 of itself, the error bfloat16 keys already carry: the scores
// are those of DotRows on the widened k with q rounded to bfloat16, up
// to the order of additions. With the other families (NativeBF16 false)
// it is DotRowsBF16PF. It panics as DotRows does.
func DotRowsBF16Native(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, pf []uint16) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsBF16Native(s, lds, q, ldq, rows, k, ldk, n, d, pf)
}

// GemmBF16Native is GemmBF16 in the bfloat16 arithmetic of the CPU, where
// it has one: with the avx512bf16 kernels A is rounded to bfloat16 (to
// nearest even, subnormals to zero) and the products of pairs added in
// float32 by VDPBF16PS, so that C is the product of the rounded A and B,
// up to the order of additions; the rounding changes each term by up to
// 2^-9 of itself. With the other families (NativeBF16 false) it is
// GemmBF16. It panics as GemmBF16 does.
func GemmBF16Native(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16) {
	checkGemm8(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	active.gemmBF16Native(m, n, k, a, lda, b, ldb, c, ldc, accumulate, pf)
}

// NativeBF16 reports whether DotRowsBF16Native and GemmBF16Native round
// their float32 operand to bfloat16: whether the kernels in use have
// bfloat16 arithmetic.
func NativeBF16() bool { return active.bf16Dot }

// DotRowsPF is DotRows with a prefetch hint pf, which may be empty:
// memory (in practice the keys of the next block of the cache) that the
// assembly prefetches a line at a time as it computes. It changes no
// result.
func DotRowsPF(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int, pf []float32) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsPF(s, lds, q, ldq, rows, k, ldk, n, d, pf)
}

// DotRowsBF16PF is DotRowsBF16 with the prefetch hint of DotRowsPF.
func DotRowsBF16PF(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, pf []uint16) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsBF16PF(s, lds, q, ldq, rows, k, ldk, n, d, pf)
}

// DotRowsF16PF is DotRowsF16 with the prefetch hint of DotRowsPF.
func DotRowsF16PF(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, pf []uint16) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsF16PF(s, lds, q, ldq, rows, k, ldk, n, d, pf)
}

// The Go versions: a prefetch hint means nothing to them.

// gemmBF16Generic is GemmBF16 in Go: see gemm16Generic.
func gemmBF16Generic(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, _ []uint16) {
	gemm16Generic(m, n, k, a, lda, b, ldb, c, ldc, accumulate, false)
}

// gemmF16Generic is GemmF16 in Go: see gemm16Generic.
func gemmF16Generic(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, _ []uint16) {
	gemm16Generic(m, n, k, a, lda, b, ldb, c, ldc, accumulate, true)
}

// gemm16Generic widens each row of B (binary16 if f16, else bfloat16) by
// chunks of widenChunk values into an array on the stack, once, and adds
// it times A[i][p] to each row i of C with axpyGeneric. The widenings are
// called directly, not through a func value, so that buf stays on the
// stack.
func gemm16Generic(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate, f16 bool) {
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
			if f16 {
				widenF16Generic(w, b[p*ldb+j0:][:len(w)])
			} else {
				widenBF16Generic(w, b[p*ldb+j0:][:len(w)])
			}
			for i := range m {
				axpyGeneric(a[i*lda+p], w, c[i*ldc+j0:][:len(w)])
			}
		}
	}
}

func gemmPFGeneric(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool, _ []float32) {
	gemmGeneric(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

func dotRowsPFGeneric(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int, _ []float32) {
	dotRowsGeneric(s, lds, q, ldq, rows, k, ldk, n, d)
}

func dotRowsBF16PFGeneric(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, _ []uint16) {
	dotRowsBF16Generic(s, lds, q, ldq, rows, k, ldk, n, d)
}

func dotRowsF16PFGeneric(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, _ []uint16) {
	dotRowsF16Generic(s, lds, q, ldq, rows, k, ldk, n, d)
}
