//go:build !purego

package simd

// The NEON kernels of neon_arm64.s. The loops over panels, blocks of rows
// and columns are in Go: each assembly call does a block's whole k loop,
// so the call costs little next to it, and slicing the operands here
// bounds what the assembly can touch.

//go:noescape
func dotNEON(x, y []float32) float32

//go:noescape
func axpyNEON(a float32, x, y []float32)

//go:noescape
func scaleNEON(x []float32, c float32)

//go:noescape
func maxNEON(x []float32) float32

//go:noescape
func readSumNEON(x []float32) float32

//go:noescape
func fmaPeakNEON(iters int) float32

//go:noescape
func expNEON(dst, x []float32)

//go:noescape
func expSumNEON(x []float32, shift float32) float32

//go:noescape
func expMulNEON(p, g []float32)

// softmaxPanelNEON is OnlineSoftmax on one panel: s holds n·Panel
// logits, lim is empty or Panel limits, m and l hold Panel values and acc
// dacc·Panel.
//
//go:noescape
func softmaxPanelNEON(s []float32, n int, lim, m, l, acc []float32, dacc int)

// gemm6x16NEON and gemm1x16NEON compute a block of 6 rows (1 row) × 16
// columns of C = A·B or C += A·B: A[i][p] at a[i·ar + p·ac], B[p][j] at
// b[p·ldb + j], C[i][j] at c[i·ldc + j].
//
//go:noescape
func gemm6x16NEON(k int, a []float32, ar, ac int, b []float32, ldb int, c []float32, ldc int, accumulate bool)

//go:noescape
func gemm1x16NEON(k int, a []float32, ar, ac int, b []float32, ldb int, c []float32, ldc int, accumulate bool)

// dotRows4NEON is DotRows for rows = 4 and d > 0.
//
//go:noescape
func dotRows4NEON(s []float32, lds int, q []float32, ldq int, k []float32, ldk, n, d int)

// gemmBlocksNEON runs the 16-column block of C at c (ldc apart) over m
// rows: blocks of 6 rows, then single rows. A[i][p] is a[i·ar + p·ac].
func gemmBlocksNEON(m, k int, a []float32, ar, ac int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	i := 0
	for ; i+6 <= m; i += 6 {
		gemm6x16NEON(k, a[i*ar:][:5*ar+(k-1)*ac+1], ar, ac, b[:(k-1)*ldb+16], ldb, c[i*ldc:][:5*ldc+16], ldc, accumulate)
	}
	for ; i < m; i++ {
		gemm1x16NEON(k, a[i*ar:][:(k-1)*ac+1], ar, ac, b[:(k-1)*ldb+16], ldb, c[i*ldc:][:16], ldc, accumulate)
	}
}

func gemmNEON(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		if !accumulate {
			for i := range m {
				clear(c[i*ldc:][:n])
			}
		}
		return
	}
	for j := 0; j < n; j += 16 {
		gemmBlocksNEON(m, k, a, lda, 1, b[j:], ldb, c[j:], ldc, accumulate)
	}
}

// gemmPFNEON is Gemm with n a multiple of 8; the 8 columns past the last
// multiple of 16, which the 16-column blocks cannot take, go through the
// Go kernel.
func gemmPFNEON(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool, _ []float32) {
	n16 := n &^ 15
	gemmNEON(m, n16, k, a, lda, b, ldb, c, ldc, accumulate)
	if n16 < n && m > 0 {
		if k == 0 {
			b = nil
		} else {
			b = b[n16:]
		}
		gemmGeneric(m, n-n16, k, a, lda, b, ldb, c[n16:], ldc, accumulate)
	}
}

func gemmPanelsNEON(m, n, k int, a []float32, ar, ac int, b []float32, pb int, c []float32, pc int, accumulate bool) {
	if m == 0 || n == 0 {
		return
	}
	for jp := range n / Panel {
		cp := c[jp*pc:][:m*Panel]
		if k == 0 {
			if !accumulate {
				clear(cp)
			}
			continue
		}
		gemmBlocksNEON(m, k, a, ar, ac, b[jp*pb:][:k*Panel], Panel, cp, Panel, accumulate)
	}
}

func onlineSoftmaxNEON(s []float32, ps, n, np int, lim, m, l, acc []float32, pacc, dacc int) {
	for q := range np {
		var sp, lp, ap []float32
		if n > 0 {
			sp = s[q*ps:][:n*Panel]
		}
		if len(lim) > 0 {
			lp = lim[q*Panel:][:Panel]
		}
		if dacc > 0 {
			ap = acc[q*pacc:][:dacc*Panel]
		}
		softmaxPanelNEON(sp, n, lp, m[q*Panel:][:Panel], l[q*Panel:][:Panel], ap, dacc)
	}
}

// attendPanelsNEON is AttendPanels by its definition, on the NEON
// kernels; it ignores the prefetch hints.
func attendPanelsNEON(np, n, d int, k []float32, kr, kc int, qt []float32, pq int, st, v []float32, vr, vc int, m, l, acc []float32, pacc int, _, _ []float32) {
	for q := range np {
		gemmPanelsNEON(n, Panel, d, k, kr, kc, qt[q*pq:], pq, st, Panel*n, false)
		onlineSoftmaxNEON(st, Panel*n, n, 1, nil, m[q*Panel:], l[q*Panel:], acc[q*pacc:], pacc, d)
		gemmPanelsNEON(d, Panel, n, v, vr, vc, st, Panel*n, acc[q*pacc:], pacc, true)
	}
}

func dotRowsNEON(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int) {
	if rows == 0 || n == 0 {
		return
	}
	if d == 0 { // q and k may be empty
		for r := range rows {
			clear(s[r*lds:][:n])
		}
		return
	}
	k = k[:(n-1)*ldk+d]
	r := 0
	for ; r+4 <= rows; r += 4 {
		dotRows4NEON(s[r*lds:][:3*lds+n], lds, q[r*ldq:][:3*ldq+d], ldq, k, ldk, n, d)
	}
	for ; r < rows; r++ {
		qr, sr := q[r*ldq:][:d], s[r*lds:][:n]
		for j := range sr {
			sr[j] = dotNEON(qr, k[j*ldk:][:d])
		}
	}
}

func dotRowsPFNEON(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int, _ []float32) {
	dotRowsNEON(s, lds, q, ldq, rows, k, ldk, n, d)
}

func dotNEONChecked(x, y []float32) float32 { return dotNEON(x, y[:len(x)]) }

func axpyNEONChecked(a float32, x, y []float32) { axpyNEON(a, x, y[:len(x)]) }

func expNEONChecked(dst, x []float32) { expNEON(dst[:len(x)], x) }

func expMulNEONChecked(p, g []float32) { expMulNEON(p, g[:len(p)]) }

// The 16-bit, int8 and 4-bit kernels widen a block of the keys or of B
// into an array on the stack with the widenRows kernels, then run the
// float32 kernels on it: the block is small enough to stay in L1, and
// the float32 kernels already have their register blocking. The results
// are those of the float32 kernels on the widened values.

// widenRows*NEON set dst[r*ldd+c] to the float32 value of src[r*lds+c]
// for r < rows and c < cols: a bfloat16, a binary16, an int8, or the low
// or high nibble of a byte.
//
//go:noescape
func widenRowsBF16NEON(dst []float32, ldd int, src []uint16, lds, rows, cols int)

//go:noescape
func widenRowsF16NEON(dst []float32, ldd int, src []uint16, lds, rows, cols int)

//go:noescape
func widenRowsI8NEON(dst []float32, ldd int, src []int8, lds, rows, cols int)

//go:noescape
func widenRowsU4LoNEON(dst []float32, ldd int, src []uint8, lds, rows, cols int)

//go:noescape
func widenRowsU4HiNEON(dst []float32, ldd int, src []uint8, lds, rows, cols int)

// neonCodes says what the values of a narrow source are.
type neonCodes int

const (
	neonBF16 neonCodes = iota
	neonF16
	neonI8
	neonU4Lo
	neonU4Hi
)

// widenBlockNEON is the widenRows kernel of what, with dst and src cut to
// the block it covers. The type switch, not a func value, picks the
// kernel, so that the callers' arrays stay on the stack.
func widenBlockNEON[T uint16 | int8 | uint8](dst []float32, ldd int, src []T, lds, rows, cols int, what neonCodes) {
	if rows == 0 || cols == 0 {
		return
	}
	dst = dst[:(rows-1)*ldd+cols]
	src = src[:(rows-1)*lds+cols]
	switch s := any(src).(type) {
	case []uint16:
		if what == neonF16 {
			widenRowsF16NEON(dst, ldd, s, lds, rows, cols)
		} else {
			widenRowsBF16NEON(dst, ldd, s, lds, rows, cols)
		}
	case []int8:
		widenRowsI8NEON(dst, ldd, s, lds, rows, cols)
	case []uint8:
		if what == neonU4Hi {
			widenRowsU4HiNEON(dst, ldd, s, lds, rows, cols)
		} else {
			widenRowsU4LoNEON(dst, ldd, s, lds, rows, cols)
		}
	}
}

// neonDotChunk is the number of key values dotRowsCodesNEON widens at
// once; neonGemmChunk that of B values gemmCodesNEON widens, a block of
// up to neonGemmCols columns.
const (
	neonDotChunk  = 1024
	neonGemmChunk = 4096
	neonGemmCols  = 64
)

// dotRowsCodesNEON widens as many whole key rows as the buffer holds and
// runs dotRowsNEON on them; a key row longer than the buffer is widened
// a chunk at a time, each chunk's dot added to the scores, as
// dotRowsWidened does.
func dotRowsCodesNEON[T uint16 | int8 | uint8](s []float32, lds int, q []float32, ldq, rows int, k []T, ldk, n, d int, what neonCodes) {
	if rows == 0 || n == 0 || d == 0 { // nothing to widen: zero scores or none
		dotRowsNEON(s, lds, q, ldq, rows, nil, ldk, n, d)
		return
	}
	var buf [neonDotChunk]float32
	if d <= len(buf) {
		nb := len(buf) / d
		for j0 := 0; j0 < n; j0 += nb {
			b := min(nb, n-j0)
			widenBlockNEON(buf[:], d, k[j0*ldk:], ldk, b, d, what)
			dotRowsNEON(s[j0:], lds, q, ldq, rows, buf[:b*d], d, b, d)
		}
		return
	}
	for j := range n {
		for r := range rows {
			s[r*lds+j] = 0
		}
		for c0 := 0; c0 < d; c0 += len(buf) {
			w := buf[:min(len(buf), d-c0)]
			widenBlockNEON(w, 0, k[j*ldk+c0:], 0, 1, len(w), what)
			for r := range rows {
				s[r*lds+j] += dotNEON(q[r*ldq+c0:][:len(w)], w)
			}
		}
	}
}

// gemmCodesNEON widens blocks of up to neonGemmCols columns of B, as
// many rows as the buffer holds, and adds their product with A's
// columns to C with gemmPFNEON (n is a multiple of 8).
func gemmCodesNEON[T uint16 | int8 | uint8](m, n, k int, a []float32, lda int, b []T, ldb int, c []float32, ldc int, accumulate bool, what neonCodes) {
	if m == 0 || n == 0 || k == 0 { // nothing to widen: C cleared or kept
		gemmNEON(m, n, k, a, lda, nil, ldb, c, ldc, accumulate)
		return
	}
	var buf [neonGemmChunk]float32
	for j0 := 0; j0 < n; j0 += neonGemmCols {
		nw := min(neonGemmCols, n-j0)
		kc := len(buf) / nw
		for p0 := 0; p0 < k; p0 += kc {
			kb := min(kc, k-p0)
			widenBlockNEON(buf[:], nw, b[p0*ldb+j0:], ldb, kb, nw, what)
			gemmPFNEON(m, nw, kb, a[p0:], lda, buf[:kb*nw], nw, c[j0:], ldc, accumulate || p0 > 0, nil)
		}
	}
}

func widenBF16NEON(dst []float32, src []uint16) {
	widenBlockNEON(dst, 0, src, 0, 1, len(src), neonBF16)
}

func widenF16NEON(dst []float32, src []uint16) {
	widenBlockNEON(dst, 0, src, 0, 1, len(src), neonF16)
}

// widenI8NEON widens all the rows in one call, then scales each: the
// float32 product, one rounding, as widenI8Generic.
func widenI8NEON(dst []float32, src []int8, scale []float32, ld int) {
	widenBlockNEON(dst, ld, src, ld, len(scale), ld, neonI8)
	for r, f := range scale {
		scaleNEON(dst[r*ld:][:ld], f)
	}
}

func dotRowsBF16NEON(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonBF16)
}

func dotRowsBF16PFNEON(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, _ []uint16) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonBF16)
}

func dotRowsF16NEON(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonF16)
}

func dotRowsF16PFNEON(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, _ []uint16) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonF16)
}

func dotRowsI8NEON(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonI8)
}

func dotRowsI8PFNEON(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int, _ []int8) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonI8)
}

func dotRowsU4LoNEON(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonU4Lo)
}

func dotRowsU4HiNEON(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int) {
	dotRowsCodesNEON(s, lds, q, ldq, rows, k, ldk, n, d, neonU4Hi)
}

func gemmBF16NEON(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, _ []uint16) {
	gemmCodesNEON(m, n, k, a, lda, b, ldb, c, ldc, accumulate, neonBF16)
}

func gemmF16NEON(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, _ []uint16) {
	gemmCodesNEON(m, n, k, a, lda, b, ldb, c, ldc, accumulate, neonF16)
}

func gemmI8NEON(m, n, k int, a []float32, lda int, b []int8, ldb int, c []float32, ldc int, accumulate bool, _ []int8) {
	gemmCodesNEON(m, n, k, a, lda, b, ldb, c, ldc, accumulate, neonI8)
}

func gemmU4LoNEON(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, _ []uint8) {
	gemmCodesNEON(m, n, k, a, lda, b, ldb, c, ldc, accumulate, neonU4Lo)
}

func gemmU4HiNEON(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, _ []uint8) {
	gemmCodesNEON(m, n, k, a, lda, b, ldb, c, ldc, accumulate, neonU4Hi)
}
