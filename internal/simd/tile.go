package simd

// MR is the height of the register block of GemmPanels and
// AttendPanels: 6 rows of A × Panel columns of B.
const MR = 6

// GemmPanels computes C = A·B (accumulate false) or C += A·B (accumulate
// true) for an m×k matrix A, a k×n matrix B and an m×n matrix C, with B
// and C stored in panels of Panel columns, each row after row with Panel
// values a row: B[p][j] is b[(j/Panel)·pb + p·Panel + j%Panel] and C[i][j]
// is c[(j/Panel)·pc + i·Panel + j%Panel]. A is a strided matrix, A[i][p]
// at a[i·ar + p·ac], with ac = 1 (its rows one after the other, ar apart)
// or ar = 1 (its columns one after the other, ac apart), so that a
// row-major matrix can be read as it lies as A or as Aᵀ.
//
// The kernel computes C one panel after the other and, inside a panel,
// one block of MR rows after the other, so a panel of B stays in the L1
// cache while A streams past; every load of B is sequential. n must be a
// multiple of Panel; m and k may be anything, including 0. With
// accumulate false, C is only written.
//
// GemmPanels panics if a size or stride is negative, neither ar nor ac
// is 1, n is not a multiple of Panel, a panel stride is too short for its panel (pb < Panel·k or pc
// < Panel·m where there is more than one panel) or a slice is too short
// for its matrix.
func GemmPanels(m, n, k int, a []float32, ar, ac int, b []float32, pb int, c []float32, pc int, accumulate bool) {
	checkGemmPanels(m, n, k, len(a), ar, ac, len(b), pb, len(c), pc)
	active.gemmPanels(m, n, k, a, ar, ac, b, pb, c, pc, accumulate)
}

func checkGemmPanels(m, n, k, la, ar, ac, lb, pb, lc, pc int) {
	if m < 0 || n < 0 || k < 0 || ar < 0 || ac < 0 {
		panic("simd: GemmPanels with a negative size or stride")
	}
	if n%Panel != 0 {
		panic("simd: GemmPanels with n not a multiple of Panel")
	}
	if m == 0 || n == 0 {
		return
	}
	panels := n / Panel
	if (panels > 1 && pc < Panel*m) || lc < (panels-1)*pc+Panel*m {
		panic("simd: GemmPanels with C too short or pc < Panel·m")
	}
	if k == 0 {
		return
	}
	if ar != 1 && ac != 1 {
		panic("simd: GemmPanels with neither ar nor ac 1")
	}
	if la <= (m-1)*ar+(k-1)*ac {
		panic("simd: GemmPanels with A too short")
	}
	if (panels > 1 && pb < Panel*k) || lb < (panels-1)*pb+Panel*k {
		panic("simd: GemmPanels with B too short or pb < Panel·k")
	}
}

// OnlineSoftmax does one step of the online softmax of attention on np
// panels of Panel queries each, with the queries along the vector lanes.
//
// Panel q holds the logits of queries x = q·Panel … q·Panel+Panel-1
// against n keys, key after key: the logit of key j for query x is
// s[q·ps + j·Panel + x%Panel]. Key j is visible to query x when lim is
// empty or j < lim[x] (lim must not hold NaN). For each query, with
//
//	mx = max(m[x], the largest visible logit),
//	ms = mx, or 0 where mx is -Inf,
//	c  = exp(m[x] - ms),
//
// OnlineSoftmax sets each visible logit to exp(logit - ms) and every
// other one to 0, l[x] to l[x]·c plus the sum of the panel's new values
// for x, and m[x] to mx; and where c is not 1 for some query of a
// panel, it multiplies that panel's accumulator rows by the queries'
// factors: acc[q·pacc + i·Panel + x%Panel] *= c for i < dacc. A query
// that has seen no key (m = -Inf, l = 0) and sees none now keeps m =
// -Inf and l = 0, with c = 0: nothing becomes NaN.
//
// The exponentials are 2^((x - ms)·log2 e), by a degree-5 polynomial
// within about 2 ulp of the exact 2^ of the rounded product; with the
// rounding of that product the relative error is below 3e-7 +
// 6e-8·|x - ms|. Arguments below -127/log2 e (about -88.03) give 0,
// -Inf gives exactly 0 and 0 exactly 1. A NaN logit makes its query's l
// NaN (its m may or may not be NaN). Logits above ms + 88 (which the
// maximum rules out) are not supported.
//
// OnlineSoftmax panics if a size is negative, a panel stride is too
// short (ps < Panel·n or pacc < Panel·dacc where np > 1) or a slice is
// too short.
func OnlineSoftmax(s []float32, ps, n, np int, lim, m, l, acc []float32, pacc, dacc int) {
	checkOnlineSoftmax(len(s), ps, n, np, len(lim), len(m), len(l), len(acc), pacc, dacc)
	active.onlineSoftmax(s, ps, n, np, lim, m, l, acc, pacc, dacc)
}

func checkOnlineSoftmax(ls, ps, n, np, llim, lm, ll, lacc, pacc, dacc int) {
	if n < 0 || np < 0 || dacc < 0 {
		panic("simd: OnlineSoftmax with a negative size")
	}
	if np == 0 {
		return
	}
	q := np * Panel
	if lm < q || ll < q || (llim != 0 && llim < q) {
		panic("simd: OnlineSoftmax with m, l or lim too short")
	}
	if n > 0 && ((np > 1 && ps < Panel*n) || ls < (np-1)*ps+Panel*n) {
		panic("simd: OnlineSoftmax with s too short or ps < Panel·n")
	}
	if dacc > 0 && ((np > 1 && pacc < Panel*dacc) || lacc < (np-1)*pacc+Panel*dacc) {
		panic("simd: OnlineSoftmax with acc too short or pacc < Panel·dacc")
	}
}

// AttendPanels runs the two products and the softmax of an unmasked
// attention tile, np panels of Panel queries against n keys with head
// size d, one panel after the other. It is equivalent to
//
//	for q := range np {
//		GemmPanels(n, Panel, d, k, kr, kc, qt[q*pq:], pq, st, Panel*n, false)
//		OnlineSoftmax(st, Panel*n, n, 1, nil, m[q*Panel:], l[q*Panel:], acc[q*pacc:], pacc, d)
//		GemmPanels(d, Panel, n, v, vr, vc, st, Panel*n, acc[q*pacc:], pacc, true)
//	}
//
// that is Sᵀ = K·Qᵀ for the panel's queries (element c of key j at
// k[j·kr + c·kc], with kc = 1 for rows of keys or kr = 1 for a transposed
// copy; qt: the queries, each panel d lines of Panel values, pq floats
// apart), the online-softmax step, and Oᵀ += Vᵀ·Pᵀ (element c of value j
// at v[c·vr + j·vc], with vr = 1: rows of values, vc apart; acc: each
// panel d lines of Panel values, pacc floats apart), with st (n·Panel floats) holding one panel's logits
// at a time, so that they stay in the L1 cache. Where st holds 2·n·Panel
// floats a kernel may take the panels two at a time, the second panel's
// logits in st[n·Panel:], with the same results: the AVX-512 kernels do,
// since with one panel of 16 queries, one zmm register, every broadcast
// of K or V feeds one FMA and the loads bound the products; with two it
// feeds two. The assembly takes the
// maximum of the logits as it stores them, saving the softmax's first
// pass; results may differ from the three calls in the order of
// additions only, and in one more: the exponentials of the assembly add
// 2^n into the exponent field as an integer, so that a logit 126/log2 e
// (87.3) or more below its query's maximum weighs some value below
// 2^-126 instead of exactly 0 (the tile is unmasked: its logits are
// finite, and such a weight is lost next to the maximum's 1). On return
// st holds the last panel's probabilities (in st[n·Panel:] when it was
// the second of two taken together).
//
// pfk and pfv are hints, which may be nil: memory (in practice the keys
// and values of the next tile) that the assembly prefetches into the L2
// cache a line at a time while it computes, pfk during the first
// products and pfv during the second. Keys that are read as rows of a
// large K, six rows at a time, are not fetched ahead by the hardware as
// well as a single sequential stream would be.
//
// AttendPanels panics if a size or stride is negative, neither kr nor kc
// is 1, vr is not 1, or a slice or a panel stride is too short, as those
// calls would.
func AttendPanels(np, n, d int, k []float32, kr, kc int, qt []float32, pq int, st, v []float32, vr, vc int, m, l, acc []float32, pacc int, pfk, pfv []float32) {
	checkAttendPanels(np, n, d, len(k), kr, kc, len(qt), pq, len(st), len(v), vr, vc, len(m), len(l), len(acc), pacc)
	active.attendPanels(np, n, d, k, kr, kc, qt, pq, st, v, vr, vc, m, l, acc, pacc, pfk, pfv)
}

func checkAttendPanels(np, n, d, lk, kr, kc, lqt, pq, lst, lv, vr, vc, lm, ll, lacc, pacc int) {
	if np < 0 || n < 0 || d < 0 {
		panic("simd: AttendPanels with a negative size")
	}
	if np == 0 {
		return
	}
	if vr != 1 && n > 0 && d > 0 {
		panic("simd: AttendPanels with vr != 1")
	}
	if lst < Panel*n {
		panic("simd: AttendPanels with st too short")
	}
	// The three calls over all the panels at once, with st standing for
	// np panels of logits.
	n16, lsts := np*Panel, lst+(np-1)*Panel*n
	checkGemmPanels(n, n16, d, lk, kr, kc, lqt, pq, lsts, Panel*n)
	checkGemmPanels(d, n16, n, lv, vr, vc, lsts, Panel*n, lacc, pacc)
	checkOnlineSoftmax(lsts, Panel*n, n, np, 0, lm, ll, lacc, pacc, d)
}

// PanelFromRows gathers up to Panel rows of d values into one panel with
// the rows along the lanes, scaled: dst[c·Panel + x] = src[off[x] + c] ·
// scale for x < len(off) and c < d, and dst[c·Panel + x] = 0 for the
// lanes x ≥ len(off). It turns rows of queries into the B operand of
// GemmPanels and AttendPanels.
//
// PanelFromRows panics if len(off) > Panel, d < 0, dst is shorter than
// d·Panel or a row src[off[x]:off[x]+d] is out of range.
func PanelFromRows(dst, src []float32, off []int, d int, scale float32) {
	checkPanelRows(len(dst), len(src), off, d)
	active.panelFromRows(dst, src, off, d, scale)
}

// RowsFromPanel scatters a panel back into up to Panel rows, each scaled
// by its factor: dst[off[x] + c] = src[c·Panel + x] · f[x] for x <
// len(off) and c < d. The rows must not overlap one another (or src).
//
// RowsFromPanel panics if len(off) > Panel, d < 0, src is shorter than
// d·Panel, f is shorter than off or a row dst[off[x]:off[x]+d] is out of
// range.
func RowsFromPanel(dst []float32, off []int, src, f []float32, d int) {
	checkPanelRows(len(src), len(dst), off, d)
	if len(f) < len(off) {
		panic("simd: RowsFromPanel with f shorter than off")
	}
	active.rowsFromPanel(dst, off, src, f, d)
}

func checkPanelRows(lpanel, lrows int, off []int, d int) {
	if d < 0 || len(off) > Panel {
		panic("simd: panel with d < 0 or more than Panel rows")
	}
	if lpanel < d*Panel {
		panic("simd: panel shorter than d·Panel")
	}
	for _, o := range off {
		if o < 0 || o > lrows-d {
			panic("simd: panel row out of range")
		}
	}
}
