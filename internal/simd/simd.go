// Package simd holds the vector kernels of the attention code: a small
// matrix-multiply micro-kernel, a fused exp-and-sum, max, scale, dot and
// axpy. Each has a plain Go version (this file); faster versions in
// assembly are selected at start-up from the CPU's features, and the
// purego build tag keeps the Go ones.
package simd

// Panel is the column width Gemm works in: n must be a multiple of it.
const Panel = 16

// Gemm computes C = A·B (accumulate false) or C += A·B (accumulate true)
// for an m×k matrix A with row stride lda, a k×n matrix B with row stride
// ldb and an m×n matrix C with row stride ldc. n must be a multiple of
// Panel; m and k may be anything, including 0.
func Gemm(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	gemm(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

// ExpSum sets x[i] = exp(x[i] - shift) and returns the sum of the new
// values. Callers pass shift >= max(x), so every result is in [0, 1].
func ExpSum(x []float32, shift float32) float32 { return expSum(x, shift) }

// Max returns the largest element of x, or -Inf for an empty x.
func Max(x []float32) float32 { return maxOf(x) }

// Scale multiplies x by c in place.
func Scale(x []float32, c float32) { scale(x, c) }
