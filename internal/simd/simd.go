package simd

import (
	"math"
	"unsafe"
)

// Panel is the column width Gemm works in: n must be a multiple of it.
const Panel = 16

// Gemm computes C = A·B (accumulate false) or C += A·B (accumulate true)
// for an m×k matrix A with row stride lda, a k×n matrix B with row stride
// ldb and an m×n matrix C with row stride ldc. n must be a multiple of
// Panel; m and k may be anything, including 0.
//
// With accumulate false, C is only written, never read. Gemm panics if a
// size is negative, n is not a multiple of Panel, a stride is shorter
// than its row or a slice is too short for its matrix.
func Gemm(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	checkGemm(m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	active.gemm(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

func checkGemm(m, n, k, la, lda, lb, ldb, lc, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic("simd: Gemm with a negative size")
	}
	if n%Panel != 0 {
		panic("simd: Gemm with n not a multiple of Panel")
	}
	if m > 0 && n > 0 && (ldc < n || lc < (m-1)*ldc+n) {
		panic("simd: Gemm with C too short or ldc < n")
	}
	if m > 0 && n > 0 && k > 0 && (lda < k || la < (m-1)*lda+k) {
		panic("simd: Gemm with A too short or lda < k")
	}
	if m > 0 && n > 0 && k > 0 && (ldb < n || lb < (k-1)*ldb+n) {
		panic("simd: Gemm with B too short or ldb < n")
	}
}

// ExpSum sets x[i] = exp(x[i] - shift) and returns the sum of the new
// values. Callers pass shift >= max(x), so every result is in [0, 1].
// The results are those of Exp on x[i]-shift; the sum is added in
// float32 lanes, in an unspecified order.
func ExpSum(x []float32, shift float32) float32 { return active.expSum(x, shift) }

// Exp sets dst[i] = exp(x[i]) for every i. Results that would be
// subnormal (x < -87.33654) are 0, results beyond the float32 range
// (x > 88.72283) are +Inf, and NaN gives NaN; the others are within 4 ulp
// (in practice 2) of the exact value. dst and x may be the same slice.
// Exp panics if len(dst) != len(x).
func Exp(dst, x []float32) {
	if len(dst) != len(x) {
		panic("simd: Exp with len(dst) != len(x)")
	}
	active.exp(dst, x)
}

// ELU1 sets dst[i] = elu(x[i]) + 1 for every i: exp(x[i]) where x[i] has
// its sign bit set (-0 and negative NaNs included), x[i] + 1 elsewhere.
// The exponentials are Exp's, bit for bit. It is the feature map of
// linear attention (Katharopoulos et al., 2020). dst and x may be the
// same slice. ELU1 panics if len(dst) != len(x).
func ELU1(dst, x []float32) {
	if len(dst) != len(x) {
		panic("simd: ELU1 with len(dst) != len(x)")
	}
	active.elu1Of(dst, x)
}

// elu1Of is ELU1 with impl's kernels: its own where it has one, else its
// Exp and the selection in Go.
func (impl *implementation) elu1Of(dst, x []float32) {
	if impl.elu1 != nil {
		impl.elu1(dst, x)
		return
	}
	if len(x) == 0 {
		return
	}
	// Exp may write dst in place of x: keep each x+1 (or its sign) first.
	// Both run in blocks, so that the copy stays in cache.
	var buf [256]float32
	for i := 0; i < len(x); i += len(buf) {
		n := min(len(buf), len(x)-i)
		xs, ds := x[i:i+n], dst[i:i+n]
		copy(buf[:n], xs)
		impl.exp(ds, xs)
		for c, v := range buf[:n] {
			// All ones if v's sign bit is set: the selection goes without
			// branches, which random signs would defeat.
			neg := uint32(int32(math.Float32bits(v)) >> 31)
			ds[c] = math.Float32frombits(math.Float32bits(ds[c])&neg | math.Float32bits(v+1)&^neg)
		}
	}
}

// ExpMul sets p[i] = exp(p[i]) and then g[i] *= p[i] for every i: the
// element-wise step of the attention backward pass, which turns logits
// less their log-sum-exp into probabilities P and the gradient of P less
// the row's correction into dS = P ∘ (dP − D), reading and writing each
// slice once. Each g[i] is the float32 product of the old g[i] and the
// new p[i], one rounding. p and g must not overlap. ExpMul panics if
// len(p) != len(g).
//
// The exponential is that of OnlineSoftmax, cheaper than Exp's: 2^t for
// t = p[i]·log2 e rounded to float32, within 2.5e-7 relative of 2^t
// (so within about 2.5e-7 + 6e-8·|p[i]| of exp(p[i])) wherever 2^t is a
// normal float32. t ≤ -127 gives 0, -Inf included, and t between -127
// and -126 gives 0 or a subnormal; t ≥ 127.5 gives +Inf; exp(0) is
// exactly 1 and NaN stays NaN.
func ExpMul(p, g []float32) {
	if len(p) != len(g) {
		panic("simd: ExpMul with len(p) != len(g)")
	}
	active.expMul(p, g)
}

// Max returns the largest element of x, -Inf for an empty x and NaN if x
// holds a NaN.
func Max(x []float32) float32 { return active.max(x) }

// Scale multiplies x by c in place.
func Scale(x []float32, c float32) { active.scale(x, c) }

// Dot returns the sum of x[i]·y[i], added in an unspecified order. It
// panics if len(x) != len(y).
func Dot(x, y []float32) float32 {
	if len(x) != len(y) {
		panic("simd: Dot with len(x) != len(y)")
	}
	return active.dot(x, y)
}

// Axpy sets y[i] += a·x[i]. It panics if len(x) != len(y).
func Axpy(a float32, x, y []float32) {
	if len(x) != len(y) {
		panic("simd: Axpy with len(x) != len(y)")
	}
	active.axpy(a, x, y)
}

// PeakFlopsPerIter is the number of floating-point operations FMAPeak
// does per iteration: 12 independent FMAs on 8 float32 lanes.
const PeakFlopsPerIter = 12 * 8 * 2

// FMAPeak runs iters iterations of 12 independent chains of 8-lane
// fused multiply-adds (PeakFlopsPerIter flops each) and returns a value
// computed from them, so that nothing can be skipped. It measures the
// floating-point peak of one core for the kernels in use: with the AVX2
// kernels, the FMA pipes of the CPU with ymm FMAs; with the AVX-512 ones,
// with zmm FMAs (a round of 12 of them is two iterations), which some
// CPUs run at twice the flops; with the NEON ones, 24 chains of 4-lane
// FMAs an iteration, the same flops; with the Go ones, scalar
// multiply-adds.
func FMAPeak(iters int) float32 { return active.fmaPeak(iters) }

// ReadSum returns the sum of x, added in an unspecified order: a
// sequential read of every line of x at the speed of the memory, which
// is its use (MeasureReadGBps, and bringing a block of a KV cache into
// the caches before the kernels read it in another order).
func ReadSum(x []float32) float32 { return active.readSum(x) }

// Prefetch asks the processor to bring the cache lines of x into its
// caches, without waiting for them (PREFETCHT0 on amd64; nothing with
// purego or on arm64): a walk of scattered lists or rows can then request
// the next ones while it computes on the current.
func Prefetch[T any](x []T) {
	if len(x) > 0 {
		active.prefetch((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(x[0])))
	}
}

// WidenBF16 sets dst[i] to the float32 whose bits are src[i]<<16: src
// holds bfloat16 values, the upper halves of float32s, and the widening
// is exact. dst and src must not overlap. It panics if len(dst) !=
// len(src).
func WidenBF16(dst []float32, src []uint16) {
	if len(dst) != len(src) {
		panic("simd: WidenBF16 with len(dst) != len(src)")
	}
	active.widenBF16(dst, src)
}

// WidenF16 sets dst[i] to the IEEE 754 binary16 value src[i] as a
// float32, exactly: subnormal halves become normal floats, ±Inf stays
// ±Inf, and a NaN keeps its sign and payload (shifted to the top of the
// float32 mantissa), a signalling NaN being made quiet as the F16C
// instruction VCVTPH2PS does. dst and src must not overlap. It panics if
// len(dst) != len(src).
func WidenF16(dst []float32, src []uint16) {
	if len(dst) != len(src) {
		panic("simd: WidenF16 with len(dst) != len(src)")
	}
	active.widenF16(dst, src)
}

// DotRows sets s[r*lds+j] to the dot product of row r of q (q[r*ldq:],
// d values) and row j of k (k[j*ldk:], d values) for every r < rows and
// j < n: the scores of rows query heads against n cached keys. Each key
// row is read from memory once for all the query rows, which makes it
// the kernel of a memory-bound decode step with grouped-query attention.
// The sums are added in an unspecified order.
//
// Any d works, with no read past the d values of a row; d = 0 gives
// zeros. s must not overlap q or k. DotRows panics if a size is
// negative, a stride is shorter than its row (lds < n, ldq < d, ldk < d)
// or a slice is too short for its rows.
func DotRows(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRows(s, lds, q, ldq, rows, k, ldk, n, d)
}

// DotRowsBF16 is DotRows with the keys in bfloat16 (see WidenBF16),
// widened to float32 as they are read: the scores are those of DotRows
// on the widened k, up to the order of additions and, with the avx512bf16
// kernels, which split each query value into two bfloat16 halves and
// multiply them with VDPBF16PS, to the split's error: the halves add up
// to within 2^-18 of the value, so each term q_c·k_c is within 2^-18 of
// itself (DotRowsBF16Native rounds q to one bfloat16 instead, faster).
// It panics as DotRows does.
func DotRowsBF16(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsBF16(s, lds, q, ldq, rows, k, ldk, n, d)
}

// DotRowsF16 is DotRows with the keys in IEEE 754 binary16 (see
// WidenF16), widened to float32 as they are read: the scores are those of
// DotRows on the widened k. It panics as DotRows does.
func DotRowsF16(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int) {
	checkDotRows(len(s), lds, len(q), ldq, rows, len(k), ldk, n, d)
	active.dotRowsF16(s, lds, q, ldq, rows, k, ldk, n, d)
}

func checkDotRows(ls, lds, lq, ldq, rows, lk, ldk, n, d int) {
	if rows < 0 || n < 0 || d < 0 {
		panic("simd: DotRows with a negative size")
	}
	if rows == 0 || n == 0 {
		return
	}
	if lds < n || ls < (rows-1)*lds+n {
		panic("simd: DotRows with s too short or lds < n")
	}
	if d == 0 {
		return
	}
	if ldq < d || lq < (rows-1)*ldq+d {
		panic("simd: DotRows with q too short or ldq < d")
	}
	if ldk < d || lk < (n-1)*ldk+d {
		panic("simd: DotRows with k too short or ldk < d")
	}
}
