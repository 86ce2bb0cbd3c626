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
