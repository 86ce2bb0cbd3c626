package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/gotypes"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The kernels of the fused attention tile, all with the queries along the
// vector lanes: gemmPanelsAVX2, a matrix product with B and C in panels
// of 16 columns; onlineSoftmaxAVX2, one step of the online softmax on
// panels of logits; attendPanelsAVX2, which fuses the two products and
// the softmax of an unmasked tile panel by panel; panelFromRowsAVX2 and
// rowsFromPanelAVX2, which move rows into and out of a panel.

// panelGemm emits C = A·B or C += A·B for one 16-column panel of B and
// C: A is a strided m×k matrix, A[i][p] at a + 4·(i·ar + p·ac), with
// either ac = 1 (rows of A one after the other: rows of K, ar = D) or ar
// = 1 (columns of A one after the other: Vᵀ read from rows of V, ac = D,
// or a transposed copy of K); B is k rows of 16 values and C m rows of
// 16 values. The 6-row blocks of A stream past while the panel of B
// stays in L1; the last m%6 rows take a block of their own height.
type panelGemm struct {
	pre     string // label prefix, unique in the function
	m, k    Op     // sizes: registers or memory operands
	a, b, c Op     // base addresses of A, the B panel and the C panel
	// cols selects the layout of A: false for ac = 1 (stride is ar),
	// true for ar = 1 (stride is ac).
	cols       bool
	stride     Op // ar or ac, in floats
	accumulate Op // a memory operand holding the flag, or nil for accStatic
	accStatic  bool
	// epilogue, when not nil, is called after each block's store with
	// the block's height and its accumulators (free to overwrite).
	epilogue func(r int, acc [][2]VecVirtual)
	// pf, when not nil, points to memory to prefetch into L2, a line
	// every four steps of k, up to the address in pfEnd (where it stays).
	pf    Register
	pfEnd Mem
}

func (g panelGemm) emit() {
	aBlk, cBlk, rem := GP64(), GP64(), GP64()
	MOVQ(g.a, aBlk)
	MOVQ(g.c, cBlk)
	MOVQ(g.m, rem)
	// ld: bytes between rows of A (rows layout) or between its columns,
	// the steps of k (cols layout).
	ld := GP64()
	MOVQ(g.stride, ld)
	SHLQ(U8(2), ld)
	Label(g.pre + "rows6")
	CMPQ(rem, U8(maxRows))
	JL(LabelRef(g.pre + "tail"))
	g.block(maxRows, aBlk, cBlk, ld)
	if g.cols {
		ADDQ(U8(4*maxRows), aBlk)
	} else {
		LEAQ(Mem{Base: aBlk, Index: ld, Scale: 4}, aBlk)
		LEAQ(Mem{Base: aBlk, Index: ld, Scale: 2}, aBlk)
	}
	ADDQ(U32(maxRows*64), cBlk)
	SUBQ(U8(maxRows), rem)
	JMP(LabelRef(g.pre + "rows6"))

	Label(g.pre + "tail")
	for r := maxRows - 1; r >= 1; r-- {
		CMPQ(rem, U8(r))
		JE(LabelRef(fmt.Sprintf("%srows%d", g.pre, r)))
	}
	JMP(LabelRef(g.pre + "end"))
	for r := 1; r < maxRows; r++ {
		Label(fmt.Sprintf("%srows%d", g.pre, r))
		g.block(r, aBlk, cBlk, ld)
		JMP(LabelRef(g.pre + "end"))
	}
	Label(g.pre + "end")
}

// block emits the k loop of one r-row block: C rows of 16 values at
// cBlk+64i, A from aBlk, B rows of 16 values from the panel. The
// addresses of the four unrolled steps are displacements (rows layout)
// or indexed by ld, 2·ld and 3·ld (cols layout), so the loop adds to its
// pointers once every four steps. As in gemm, blocks of fewer than 4 rows
// keep several sets of accumulators to have enough FMA chains in flight.
func (g panelGemm) block(r int, aBlk, cBlk, ld Register) {
	pre := fmt.Sprintf("%sb%d", g.pre, r)
	sets := 1
	switch {
	case r == 1:
		sets = 4
	case r <= 3:
		sets = 2
	}
	acc := make([][][2]VecVirtual, sets)
	for s := range acc {
		acc[s] = make([][2]VecVirtual, r)
		for i := range acc[s] {
			acc[s][i] = [2]VecVirtual{YMM(), YMM()}
		}
	}
	Commentf("Block of %d rows.", r)
	load := func() {
		for i := 0; i < r; i++ {
			VMOVUPS(Mem{Base: cBlk, Disp: 64 * i}, acc[0][i][0])
			VMOVUPS(Mem{Base: cBlk, Disp: 64*i + 32}, acc[0][i][1])
		}
	}
	zero := func() {
		for i := 0; i < r; i++ {
			VXORPS(acc[0][i][0], acc[0][i][0], acc[0][i][0])
			VXORPS(acc[0][i][1], acc[0][i][1], acc[0][i][1])
		}
	}
	switch {
	case g.accumulate != nil:
		flag := GP8()
		MOVB(g.accumulate, flag)
		TESTB(flag, flag)
		JZ(LabelRef(pre + "zero"))
		load()
		JMP(LabelRef(pre + "init"))
		Label(pre + "zero")
		zero()
		Label(pre + "init")
	case g.accStatic:
		load()
	default:
		zero()
	}
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			VXORPS(acc[s][i][0], acc[s][i][0], acc[s][i][0])
			VXORPS(acc[s][i][1], acc[s][i][1], acc[s][i][1])
		}
	}

	p0, bp, kk := GP64(), GP64(), GP64()
	MOVQ(aBlk, p0)
	var p3, ld3 Register
	if g.cols {
		ld3 = GP64()
		LEAQ(Mem{Base: ld, Index: ld, Scale: 2}, ld3)
	} else if r > 3 {
		p3 = row3(p0, ld)
	}
	MOVQ(g.b, bp)
	MOVQ(g.k, kk)

	// aAddr is the address of A[i][u] relative to the pointers.
	aAddr := func(i, u int) Mem {
		if !g.cols {
			return rowAddr(p0, p3, ld, i).Offset(4 * u)
		}
		switch u {
		case 0:
			return Mem{Base: p0, Disp: 4 * i}
		case 1:
			return Mem{Base: p0, Index: ld, Scale: 1, Disp: 4 * i}
		case 2:
			return Mem{Base: p0, Index: ld, Scale: 2, Disp: 4 * i}
		default:
			return Mem{Base: p0, Index: ld3, Scale: 1, Disp: 4 * i}
		}
	}
	step := func(s, u int) {
		b0, b1 := YMM(), YMM()
		VMOVUPS(Mem{Base: bp, Disp: 64 * u}, b0)
		VMOVUPS(Mem{Base: bp, Disp: 64*u + 32}, b1)
		for i := 0; i < r; i++ {
			t := YMM()
			VBROADCASTSS(aAddr(i, u), t)
			VFMADD231PS(b0, t, acc[s][i][0])
			VFMADD231PS(b1, t, acc[s][i][1])
		}
	}
	// advance moves the A pointers u steps of k on.
	advance := func(u int) {
		if g.cols {
			if u == kUnroll {
				LEAQ(Mem{Base: p0, Index: ld, Scale: 4}, p0)
			} else {
				ADDQ(ld, p0)
			}
			return
		}
		ADDQ(U8(4*u), p0)
		if r > 3 {
			ADDQ(U8(4*u), p3)
		}
	}

	SUBQ(U8(kUnroll), kk)
	JL(LabelRef(pre + "k1"))
	Label(pre + "k4")
	if g.pf != nil {
		PREFETCHT1(Mem{Base: g.pf})
		ADDQ(U8(64), g.pf)
		CMPQ(g.pf, g.pfEnd)
		CMOVQGT(g.pfEnd, g.pf)
	}
	for u := 0; u < kUnroll; u++ {
		step(u%sets, u)
	}
	advance(kUnroll)
	ADDQ(U32(64*kUnroll), bp)
	SUBQ(U8(kUnroll), kk)
	JGE(LabelRef(pre + "k4"))
	Label(pre + "k1")
	ADDQ(U8(kUnroll), kk)
	JZ(LabelRef(pre + "store"))
	Label(pre + "k1loop")
	step(0, 0)
	advance(1)
	ADDQ(U8(64), bp)
	DECQ(kk)
	JNZ(LabelRef(pre + "k1loop"))

	Label(pre + "store")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			VADDPS(acc[s][i][0], acc[0][i][0], acc[0][i][0])
			VADDPS(acc[s][i][1], acc[0][i][1], acc[0][i][1])
		}
	}
	for i := 0; i < r; i++ {
		VMOVUPS(acc[0][i][0], Mem{Base: cBlk, Disp: 64 * i})
		VMOVUPS(acc[0][i][1], Mem{Base: cBlk, Disp: 64*i + 32})
	}
	if g.epilogue != nil {
		g.epilogue(r, acc[0])
	}
}

// addr is the memory operand of a parameter (or a part of one, such as
// a slice's base) in the argument frame.
func addr(c gotypes.Component) Mem {
	b, err := c.Resolve()
	if err != nil {
		panic(err)
	}
	return b.Addr
}

// gemmPanels emits gemmPanelsAVX2: panelGemm for each 16-column panel of
// B and C in turn.
func gemmPanels() {
	TEXT("gemmPanelsAVX2", NOSPLIT, "func(m, n, k int, a []float32, ar, ac int, b []float32, pb int, c []float32, pc int, accumulate bool)")
	Pragma("noescape")
	Doc(
		"gemmPanelsAVX2 computes C = A·B or C += A·B with B and C in panels (see GemmPanels)",
		"with AVX2 and FMA. n must be a multiple of 16; the slices must be long enough",
		"(the Go caller checks).",
	)
	m := Load(Param("m"), GP64())
	j := Load(Param("n"), GP64())
	TESTQ(m, m)
	JZ(LabelRef("done"))
	TESTQ(j, j)
	JZ(LabelRef("done"))
	bPanel := Load(Param("b").Base(), GP64())
	cPanel := Load(Param("c").Base(), GP64())

	// ac = 1: A by rows; otherwise (ar = 1) by columns.
	Label("panel")
	ac := Load(Param("ac"), GP64())
	CMPQ(ac, U8(1))
	JNE(LabelRef("bycols"))
	panelGemm{
		pre: "r", m: m, k: addr(Param("k")),
		a: addr(Param("a").Base()), b: bPanel, c: cPanel, stride: addr(Param("ar")),
		accumulate: addr(Param("accumulate")),
	}.emit()
	JMP(LabelRef("next"))
	Label("bycols")
	panelGemm{
		pre: "c", m: m, k: addr(Param("k")),
		a: addr(Param("a").Base()), b: bPanel, c: cPanel, stride: addr(Param("ac")), cols: true,
		accumulate: addr(Param("accumulate")),
	}.emit()
	Label("next")
	pb := Load(Param("pb"), GP64())
	SHLQ(U8(2), pb)
	ADDQ(pb, bPanel)
	pc := Load(Param("pc"), GP64())
	SHLQ(U8(2), pc)
	ADDQ(pc, cPanel)
	SUBQ(U8(16), j)
	JNZ(LabelRef("panel"))

	Label("done")
	VZEROUPPER()
	RET()
}

// softmaxStep emits the part of the online softmax of one panel that
// follows the maximum: given mx (the new maximum of the 16 queries,
// m included) it sets ms = mx, or 0 where mx is -Inf (a query that has
// seen no key yet, so that 2^((x - ms)·log2 e) is 0 for x = -Inf and
// never NaN), c = 2^((m - ms)·log2 e), l = l·c, m = mx, rescales the
// panel's accumulator rows when some c is not 1, replaces the n logits
// (rows of 16 at s) by their exponentials (exp2LanesFast's when fast is
// set) and adds their sum to l. The difference x - ms is taken before
// the multiply by log2 e, so that it is exact for the large logits of
// keys near the maximum; folding log2 e into the queries instead would
// save the multiply but round every query element, an error of about
// |x|·2^-24 in each logit (1e-3 at the logits of 1.6e4 of flash's
// TestLargeLogits, whose output error it took from 1e-7 to 1.5e-5).
func softmaxStep(pre string, mx [2]VecVirtual, mp, lp, accp, s Register, n, dacc Op, fast bool) {
	ms := newYMMs(2)
	clamp := YMM()
	VMOVUPS(exp2Min, clamp)
	bits := GP32()
	XORL(bits, bits)
	msMem := AllocLocal(64)
	var cs [2]VecVirtual
	for h := 0; h < 2; h++ {
		eq := YMM()
		VCMPPS(U8(0), negInf, mx[h], eq)
		VANDNPS(mx[h], eq, ms[h])
		VMOVUPS(ms[h], msMem.Offset(32*h))
		c := YMM()
		VMOVUPS(Mem{Base: mp, Disp: 32 * h}, c)
		VSUBPS(ms[h], c, c)
		VMULPS(expLog2e, c, c)
		exp2Vec(c, clamp)
		VMOVUPS(mx[h], Mem{Base: mp, Disp: 32 * h})
		lv := YMM()
		VMULPS(Mem{Base: lp, Disp: 32 * h}, c, lv)
		VMOVUPS(lv, Mem{Base: lp, Disp: 32 * h})
		// Lanes whose factor is not 1 (NaN included) need a rescale.
		ne := YMM()
		VCMPPS(U8(4), one, c, ne)
		b := GP32()
		VMOVMSKPS(ne, b)
		ORL(b, bits)
		cs[h] = c
	}
	TESTL(bits, bits)
	JZ(LabelRef(pre + "exp"))
	{
		d, ap := GP64(), GP64()
		MOVQ(dacc, d)
		MOVQ(accp, ap)
		TESTQ(d, d)
		JZ(LabelRef(pre + "exp"))
		Label(pre + "rescale")
		for h := 0; h < 2; h++ {
			v := YMM()
			VMULPS(Mem{Base: ap, Disp: 32 * h}, cs[h], v)
			VMOVUPS(v, Mem{Base: ap, Disp: 32 * h})
		}
		ADDQ(U8(64), ap)
		DECQ(d)
		JNZ(LabelRef(pre + "rescale"))
	}

	// s = 2^((s - ms)·log2 e), summed into l, two keys (four vectors) a
	// step with the four exponentials computed stage by stage, so that
	// the out-of-order core always has independent work at hand. ms is
	// read from the stack to leave the registers to them.
	Label(pre + "exp")
	sum := newYMMs(2)
	VXORPS(sum[0], sum[0], sum[0])
	VXORPS(sum[1], sum[1], sum[1])
	nn, sp := GP64(), GP64()
	MOVQ(n, nn)
	MOVQ(s, sp)
	expRows := func(rows int) {
		ts := newYMMs(2 * rows)
		for i, t := range ts {
			VMOVUPS(Mem{Base: sp, Disp: 32 * i}, t)
		}
		for h := 0; h < 2; h++ {
			msr := YMM()
			VMOVUPS(msMem.Offset(32*h), msr)
			for i := h; i < len(ts); i += 2 {
				VSUBPS(msr, ts[i], ts[i])
			}
		}
		lg := YMM()
		VMOVUPS(expLog2e, lg)
		for _, t := range ts {
			VMULPS(lg, t, t)
		}
		if fast {
			exp2LanesFast(ts)
		} else {
			exp2Lanes(ts, clamp)
		}
		for i, t := range ts {
			VMOVUPS(t, Mem{Base: sp, Disp: 32 * i})
		}
		// Add the keys of a half together first: one add a step on
		// each sum's chain.
		for i := 2; i < len(ts); i++ {
			VADDPS(ts[i], ts[i%2], ts[i%2])
		}
		VADDPS(ts[0], sum[0], sum[0])
		VADDPS(ts[1], sum[1], sum[1])
	}
	Label(pre + "e2")
	CMPQ(nn, U8(2))
	JL(LabelRef(pre + "e1"))
	expRows(2)
	ADDQ(U32(128), sp)
	SUBQ(U8(2), nn)
	JMP(LabelRef(pre + "e2"))
	Label(pre + "e1")
	TESTQ(nn, nn)
	JZ(LabelRef(pre + "sumdone"))
	expRows(1)
	Label(pre + "sumdone")
	for h := 0; h < 2; h++ {
		VADDPS(Mem{Base: lp, Disp: 32 * h}, sum[h], sum[h])
		VMOVUPS(sum[h], Mem{Base: lp, Disp: 32 * h})
	}
}

// onlineSoftmax emits onlineSoftmaxAVX2. For each panel of 16 queries
// (two ymm of lanes) it makes two passes over the keys: the first finds
// the new maximum (and, with limits, writes -Inf over the keys past each
// query's limit), the second (softmaxStep) replaces every logit by its
// exponential and adds them up. The maxima, sums and rescale factors of
// the 16 queries are ymm registers all along: no reduction across lanes
// is needed.
func onlineSoftmax() {
	TEXT("onlineSoftmaxAVX2", NOSPLIT, "func(s []float32, ps, n, np int, lim, m, l, acc []float32, pacc, dacc int)")
	Pragma("noescape")
	Doc(
		"onlineSoftmaxAVX2 does one step of the online softmax on np panels of 16 queries",
		"(see OnlineSoftmax). The slices must be long enough (the Go caller checks).",
	)
	np := Load(Param("np"), GP64())
	TESTQ(np, np)
	JZ(LabelRef("done"))
	sPanel := Load(Param("s").Base(), GP64())
	mp := Load(Param("m").Base(), GP64())
	lp := Load(Param("l").Base(), GP64())
	accPanel := Load(Param("acc").Base(), GP64())
	limp := Load(Param("lim").Base(), GP64())

	Label("panel")
	mx := newYMMs(2)
	VMOVUPS(Mem{Base: mp}, mx[0])
	VMOVUPS(Mem{Base: mp, Disp: 32}, mx[1])
	n := Load(Param("n"), GP64())
	sp := GP64()
	MOVQ(sPanel, sp)
	masked := Load(Param("lim").Len(), GP64())
	TESTQ(masked, masked)
	JNZ(LabelRef("masked"))

	// Pass 1 without limits: the maximum over the keys, two keys a
	// step into four chains.
	{
		mx2 := newYMMs(2)
		VMOVUPS(mx[0], mx2[0])
		VMOVUPS(mx[1], mx2[1])
		Label("max2")
		CMPQ(n, U8(2))
		JL(LabelRef("max1"))
		VMAXPS(Mem{Base: sp}, mx[0], mx[0])
		VMAXPS(Mem{Base: sp, Disp: 32}, mx[1], mx[1])
		VMAXPS(Mem{Base: sp, Disp: 64}, mx2[0], mx2[0])
		VMAXPS(Mem{Base: sp, Disp: 96}, mx2[1], mx2[1])
		ADDQ(U32(128), sp)
		SUBQ(U8(2), n)
		JMP(LabelRef("max2"))
		Label("max1")
		TESTQ(n, n)
		JZ(LabelRef("maxdone"))
		VMAXPS(Mem{Base: sp}, mx[0], mx[0])
		VMAXPS(Mem{Base: sp, Disp: 32}, mx[1], mx[1])
		Label("maxdone")
		VMAXPS(mx2[0], mx[0], mx[0])
		VMAXPS(mx2[1], mx[1], mx[1])
		JMP(LabelRef("step"))
	}

	// Pass 1 with limits: key j of a lane is visible when j < lim; the
	// others are set to -Inf in s.
	Label("masked")
	{
		lim := newYMMs(2)
		VMOVUPS(Mem{Base: limp}, lim[0])
		VMOVUPS(Mem{Base: limp, Disp: 32}, lim[1])
		jv, ninf := YMM(), YMM()
		VXORPS(jv, jv, jv)
		VMOVUPS(negInf, ninf)
		TESTQ(n, n)
		JZ(LabelRef("step"))
		Label("mloop")
		for h := 0; h < 2; h++ {
			x, inv := YMM(), YMM()
			VMOVUPS(Mem{Base: sp, Disp: 32 * h}, x)
			VCMPPS(U8(2), jv, lim[h], inv) // lim <= j: hidden
			VBLENDVPS(inv, ninf, x, x)
			VMOVUPS(x, Mem{Base: sp, Disp: 32 * h})
			VMAXPS(x, mx[h], mx[h])
		}
		VADDPS(one, jv, jv)
		ADDQ(U8(64), sp)
		DECQ(n)
		JNZ(LabelRef("mloop"))
	}

	Label("step")
	softmaxStep("s", [2]VecVirtual{mx[0], mx[1]}, mp, lp, accPanel, sPanel, addr(Param("n")), addr(Param("dacc")), false)

	// Next panel.
	ps := Load(Param("ps"), GP64())
	SHLQ(U8(2), ps)
	ADDQ(ps, sPanel)
	pacc := Load(Param("pacc"), GP64())
	SHLQ(U8(2), pacc)
	ADDQ(pacc, accPanel)
	ADDQ(U8(64), mp)
	ADDQ(U8(64), lp)
	ADDQ(U8(64), limp)
	DECQ(np)
	JNZ(LabelRef("panel"))

	Label("done")
	VZEROUPPER()
	RET()
}

// attendPanels emits attendPanelsAVX2: for each panel of 16 queries,
// Sᵀ = K·Qᵀ into the one-panel buffer st with the running maximum of
// every block of 6 keys taken as it is stored (no pass over the keys),
// the softmax step, and Oᵀ += Vᵀ·Pᵀ, while st is in L1.
func attendPanels() {
	TEXT("attendPanelsAVX2", NOSPLIT, "func(np, n, d int, k []float32, kr, kc int, qt []float32, pq int, st, v []float32, vr, vc int, m, l, acc []float32, pacc int, pfk, pfv []float32)")
	Pragma("noescape")
	Doc(
		"attendPanelsAVX2 runs the products and the softmax of an unmasked attention tile",
		"on np panels of 16 queries (see AttendPanels). The slices must be long enough",
		"(the Go caller checks).",
	)
	np := Load(Param("np"), GP64())
	TESTQ(np, np)
	JZ(LabelRef("done"))
	npMem := AllocLocal(8)
	MOVQ(np, npMem)
	qtp := Load(Param("qt").Base(), GP64())
	accp := Load(Param("acc").Base(), GP64())
	mp := Load(Param("m").Base(), GP64())
	lp := Load(Param("l").Base(), GP64())
	mxMem := AllocLocal(64)
	n, st := addr(Param("n")), addr(Param("st").Base())
	// The prefetch pointers run over pfk during the products Sᵀ = K·Qᵀ
	// and over pfv during Oᵀ += Vᵀ·Pᵀ, stopping at their last line.
	pfk, pfv := GP64(), GP64()
	pfkEnd, pfvEnd := AllocLocal(8), AllocLocal(8)
	for _, x := range []struct {
		name string
		p    Register
		end  Mem
	}{{"pfk", pfk, pfkEnd}, {"pfv", pfv, pfvEnd}} {
		Load(Param(x.name).Base(), x.p)
		e := Load(Param(x.name).Len(), GP64())
		LEAQ(Mem{Base: x.p, Index: e, Scale: 4, Disp: -64}, e)
		CMPQ(e, x.p)
		CMOVQLT(x.p, e) // fewer than 16 floats: stay at the start
		MOVQ(e, x.end)
	}

	Label("panel")
	// The running maximum starts at m.
	for h := 0; h < 2; h++ {
		v := YMM()
		VMOVUPS(Mem{Base: mp, Disp: 32 * h}, v)
		VMOVUPS(v, mxMem.Offset(32*h))
	}
	CMPQ(n, U8(0))
	JE(LabelRef("step"))
	{
		epi := func(r int, acc [][2]VecVirtual) {
			for h := 0; h < 2; h++ {
				for i := 1; i < r; i++ {
					VMAXPS(acc[i][h], acc[0][h], acc[0][h])
				}
				VMAXPS(mxMem.Offset(32*h), acc[0][h], acc[0][h])
				VMOVUPS(acc[0][h], mxMem.Offset(32*h))
			}
		}
		// kc = 1: keys as rows; otherwise (kr = 1) transposed.
		CMPQ(addr(Param("kc")), U8(1))
		JNE(LabelRef("qkcols"))
		panelGemm{
			pre: "qkr", m: n, k: addr(Param("d")),
			a: addr(Param("k").Base()), b: qtp, c: st, stride: addr(Param("kr")),
			pf: pfk, pfEnd: pfkEnd, epilogue: epi,
		}.emit()
		JMP(LabelRef("step"))
		Label("qkcols")
		panelGemm{
			pre: "qkc", m: n, k: addr(Param("d")),
			a: addr(Param("k").Base()), b: qtp, c: st, stride: addr(Param("kc")), cols: true,
			pf: pfk, pfEnd: pfkEnd, epilogue: epi,
		}.emit()
	}

	Label("step")
	mx := newYMMs(2)
	VMOVUPS(mxMem, mx[0])
	VMOVUPS(mxMem.Offset(32), mx[1])
	st2 := Load(Param("st").Base(), GP64())
	softmaxStep("s", [2]VecVirtual{mx[0], mx[1]}, mp, lp, accp, st2, n, addr(Param("d")), true)

	CMPQ(n, U8(0))
	JE(LabelRef("next"))
	panelGemm{
		pre: "pv", m: addr(Param("d")), k: n,
		a: addr(Param("v").Base()), b: st, c: accp, stride: addr(Param("vc")), cols: true,
		accStatic: true, pf: pfv, pfEnd: pfvEnd,
	}.emit()

	Label("next")
	pq := Load(Param("pq"), GP64())
	SHLQ(U8(2), pq)
	ADDQ(pq, qtp)
	pacc := Load(Param("pacc"), GP64())
	SHLQ(U8(2), pacc)
	ADDQ(pacc, accp)
	ADDQ(U8(64), mp)
	ADDQ(U8(64), lp)
	DECQ(npMem)
	JNZ(LabelRef("panel"))

	Label("done")
	VZEROUPPER()
	RET()
}

// The constants of exp2Vec; generic.go's exp2Tile uses the same values.
var (
	exp2Magic Mem // 1.5·2^23 + 127: adding it rounds to an integer n and leaves n+127 in the low bits
	exp2Min   Mem // -127: the clamp below which the result is 0
	// exp2LanesFast's: 1.5·2^23, after whose addition the low bits hold
	// n itself, and its clamp -126.
	exp2MagicFast, exp2MinFast Mem
	exp2C                      [5]Mem // 2^r ≈ 1 + r·(c1 + r·(c2 + r·(c3 + r·(c4 + r·c5)))) on |r| ≤ 1/2
)

func declareExp2Consts() {
	exp2Magic = vecConst("exp2Magic", 12583039)
	exp2Min = vecConst("exp2Min", -127)
	exp2MagicFast = vecConst("exp2MagicFast", 12582912)
	exp2MinFast = vecConst("exp2MinFast", -126)
	// A minimax fit of the relative error of 2^r on [-1/2, 1/2]: 1.7e-7
	// (1.4 ulp) evaluated in float32 with FMAs.
	coef := [5]uint32{0x3f317215, 0x3e75fcde, 0x3d635ba9, 0x3c1e7544, 0x3aaddd0c}
	for i, c := range coef {
		exp2C[i] = vecConst(fmt.Sprintf("exp2C%d", i+1), math.Float32frombits(c))
	}
}

// exp2Vec sets t to 2^t lane by lane, given clamp holding -127 in every
// lane. A lane below -127 (-Inf included) counts as -127, whose result
// is exactly 0: n = round(t) is found by adding 1.5·2^23 + 127, which
// leaves n + 127 (0 … 127 for t in [-127, 0]) in the low mantissa bits,
// and shifting those bits to the exponent field makes 2^n, or +0 for
// n = -127. r = t - n is exact and in [-1/2, 1/2]; a degree-5
// polynomial gives 2^r. NaN stays NaN (VMAXPS returns its second source,
// t, when t is NaN). t must not exceed 128.
func exp2Vec(t, clamp VecVirtual) {
	VMAXPS(t, clamp, t)
	k, nf := YMM(), YMM()
	VADDPS(exp2Magic, t, k)
	VSUBPS(exp2Magic, k, nf)
	VSUBPS(nf, t, t) // r
	p := YMM()
	VMOVUPS(exp2C[4], p)
	for i := 3; i >= 0; i-- {
		VFMADD213PS(exp2C[i], t, p) // p = p·r + c
	}
	VFMADD213PS(one, t, p)
	VPSLLD(U8(23), k, k)
	VMULPS(k, p, t)
}

// exp2Lanes is exp2Vec on several vectors at once, one stage of the
// computation for all of them before the next: the stages of one vector
// depend on each other (about 35 cycles from first to last), those of
// different vectors do not. Each constant is loaded once into a register
// for all the vectors: with memory operands the loads (10 of 32 bytes a
// vector) become the bottleneck.
func exp2Lanes(ts []VecVirtual, clamp VecVirtual) {
	ks, ps := newYMMs(len(ts)), newYMMs(len(ts))
	for _, t := range ts {
		VMAXPS(t, clamp, t)
	}
	magic := YMM()
	VMOVUPS(exp2Magic, magic)
	for i, t := range ts {
		VADDPS(magic, t, ks[i])
	}
	for i := range ts {
		VSUBPS(magic, ks[i], ps[i])
	}
	for i, t := range ts {
		VSUBPS(ps[i], t, t) // r
	}
	c5 := YMM()
	VMOVUPS(exp2C[4], c5)
	for i := range ts {
		VMOVAPS(c5, ps[i])
	}
	for c := 3; c >= -1; c-- {
		cr := YMM()
		if c >= 0 {
			VMOVUPS(exp2C[c], cr)
		} else {
			VMOVUPS(one, cr)
		}
		for i, t := range ts {
			VFMADD213PS(cr, t, ps[i])
		}
	}
	for i := range ts {
		VPSLLD(U8(23), ks[i], ks[i])
	}
	for i, t := range ts {
		VMULPS(ks[i], ps[i], t)
	}
}

// exp2LanesFast is exp2Lanes for the unmasked tiles of AttendPanels, with
// one fewer instruction on the FMA ports a vector (which bound the
// softmax where a core has two): 2^n is added
// into the exponent field of 2^r as an integer, n << 23, rather than
// multiplied in. t is clamped at -126 so that the sum never reaches
// below the smallest exponent: a lane at or below -126 gives a value in
// [0, 2^-126), not exactly 0, which a tile whose logits are all finite
// cannot tell from 0 next to its maximum's 1 (-Inf logits, the masks,
// go through exp2Lanes). t must not exceed 127; NaN stays NaN. It gives
// the bits of exp2Lanes wherever that result is a normal float32.
func exp2LanesFast(ts []VecVirtual) {
	ks, ps := newYMMs(len(ts)), newYMMs(len(ts))
	c := YMM()
	VMOVUPS(exp2MinFast, c)
	for _, t := range ts {
		VMAXPS(t, c, t)
	}
	VMOVUPS(exp2MagicFast, c)
	for i, t := range ts {
		VADDPS(c, t, ks[i])
	}
	for i := range ts {
		VSUBPS(c, ks[i], ps[i])
	}
	for i, t := range ts {
		VSUBPS(ps[i], t, t) // r
	}
	VMOVUPS(exp2C[4], c)
	for i := range ts {
		VMOVAPS(c, ps[i])
	}
	for k := 3; k >= -1; k-- {
		if k >= 0 {
			VMOVUPS(exp2C[k], c)
		} else {
			VMOVUPS(one, c)
		}
		for i, t := range ts {
			VFMADD213PS(c, t, ps[i])
		}
	}
	for i, t := range ts {
		VPSLLD(U8(23), ks[i], ks[i])
		VPADDD(ks[i], ps[i], t)
	}
}

// transpose8 transposes the 8×8 block held in r (r[i] lane j = element
// (i, j)) and returns its columns (c[j] lane i = element (i, j)).
func transpose8(r []VecVirtual) []VecVirtual {
	t := newYMMs(8)
	for i := 0; i < 8; i += 2 {
		VUNPCKLPS(r[i+1], r[i], t[i])   // r_i0 r_i+1,0 r_i1 r_i+1,1 | … 4, 5
		VUNPCKHPS(r[i+1], r[i], t[i+1]) // … 2, 3 | … 6, 7
	}
	u := newYMMs(8)
	for g := 0; g < 8; g += 4 {
		VSHUFPS(U8(0x44), t[g+2], t[g], u[g])     // column 0 (and 4) of rows g … g+3
		VSHUFPS(U8(0xee), t[g+2], t[g], u[g+1])   // column 1 (and 5)
		VSHUFPS(U8(0x44), t[g+3], t[g+1], u[g+2]) // column 2 (and 6)
		VSHUFPS(U8(0xee), t[g+3], t[g+1], u[g+3]) // column 3 (and 7)
	}
	c := newYMMs(8)
	for j := 0; j < 4; j++ {
		VPERM2F128(U8(0x20), u[4+j], u[j], c[j])
		VPERM2F128(U8(0x31), u[4+j], u[j], c[4+j])
	}
	return c
}

// laneSetup loads, for the half h (lanes 8h … 8h+7) of a panel, the row
// pointers base + off[8h+i]·4 into ptrs (8 quadwords on the stack; lanes
// past the last row repeat its pointer) and returns the count nl of rows
// in the half (0 … 8), jumping to skip when it is 0.
func laneSetup(pre string, h int, base Register, ptrs Mem, skip string) Register {
	rows := Load(Param("off").Len(), GP64())
	nl := GP64()
	MOVQ(rows, nl)
	SUBQ(U8(8*h), nl)
	JLE(LabelRef(skip))
	CMPQ(nl, U8(8))
	JLE(LabelRef(pre + "nlok"))
	MOVQ(U32(8), nl)
	Label(pre + "nlok")
	offp := Load(Param("off").Base(), GP64())
	last := GP64()
	MOVQ(nl, last)
	DECQ(last)
	for i := 0; i < 8; i++ {
		idx := GP64()
		MOVQ(U32(i), idx)
		CMPQ(idx, last)
		CMOVQGT(last, idx)
		o := GP64()
		MOVQ(Mem{Base: offp, Index: idx, Scale: 8, Disp: 64 * h}, o)
		LEAQ(Mem{Base: base, Index: o, Scale: 4}, o)
		MOVQ(o, ptrs.Offset(8*i))
	}
	return nl
}

// panelFromRows emits panelFromRowsAVX2: dst[c*16+x] = src[off[x]+c]·scale
// for x < len(off), c < d, and 0 for the lanes past len(off). Each half
// panel is made of 8×8 blocks: 8 rows loaded, transposed, scaled,
// masked to the rows that exist and stored as 8 half lines.
func panelFromRows() {
	TEXT("panelFromRowsAVX2", NOSPLIT, "func(dst, src []float32, off []int, d int, scale float32)")
	Pragma("noescape")
	Doc("panelFromRowsAVX2 gathers up to 16 rows into a panel (see PanelFromRows); the Go caller checks.")
	ptrs := AllocLocal(64)
	for h := 0; h < 2; h++ {
		pre := fmt.Sprintf("h%d", h)
		src := Load(Param("src").Base(), GP64())
		nl := laneSetup(pre, h, src, ptrs, pre+"zero")
		lanes := GP64()
		MOVQ(nl, lanes)
		keep := YMM()
		CMPQ(lanes, U8(8))
		JE(LabelRef(pre + "all"))
		VMOVDQU(loadTailMaskMem(lanes), keep)
		JMP(LabelRef(pre + "cols"))
		Label(pre + "all")
		VPCMPEQD(keep, keep, keep)
		Label(pre + "cols")
		sx := Load(Param("scale"), XMM())
		sc := YMM()
		VBROADCASTSS(sx, sc)
		VANDPS(keep, sc, sc) // scale in the lanes that exist, 0 elsewhere
		dst := Load(Param("dst").Base(), GP64())
		if h == 1 {
			ADDQ(U8(32), dst)
		}
		co := GP64() // column offset in bytes
		XORQ(co, co)
		d := Load(Param("d"), GP64())
		Label(pre + "c8")
		CMPQ(d, U8(8))
		JL(LabelRef(pre + "ctail"))
		{
			r := newYMMs(8)
			for i := range r {
				p := GP64()
				MOVQ(ptrs.Offset(8*i), p)
				VMOVUPS(Mem{Base: p, Index: co, Scale: 1}, r[i])
			}
			c := transpose8(r)
			for j := range c {
				VMULPS(sc, c[j], c[j])
				VMOVUPS(c[j], Mem{Base: dst, Disp: 64 * j})
			}
			ADDQ(U32(8*64), dst)
			ADDQ(U8(32), co)
			SUBQ(U8(8), d)
			JMP(LabelRef(pre + "c8"))
		}
		Label(pre + "ctail")
		TESTQ(d, d)
		JZ(LabelRef(pre + "done"))
		{
			mask := YMM()
			VMOVDQU(loadTailMaskMem(d), mask)
			r := newYMMs(8)
			for i := range r {
				p := GP64()
				MOVQ(ptrs.Offset(8*i), p)
				VMASKMOVPS(Mem{Base: p, Index: co, Scale: 1}, mask, r[i])
			}
			c := transpose8(r)
			for j := range c {
				VMULPS(sc, c[j], c[j])
				VMOVUPS(c[j], Mem{Base: dst})
				ADDQ(U8(64), dst)
				DECQ(d)
				JZ(LabelRef(pre + "done"))
			}
			JMP(LabelRef(pre + "done"))
		}
		Label(pre + "zero")
		{
			// No rows in this half: zero half lines.
			z := YMM()
			VXORPS(z, z, z)
			dz := Load(Param("dst").Base(), GP64())
			if h == 1 {
				ADDQ(U8(32), dz)
			}
			n := Load(Param("d"), GP64())
			TESTQ(n, n)
			JZ(LabelRef(pre + "done"))
			Label(pre + "zloop")
			VMOVUPS(z, Mem{Base: dz})
			ADDQ(U8(64), dz)
			DECQ(n)
			JNZ(LabelRef(pre + "zloop"))
		}
		Label(pre + "done")
	}
	VZEROUPPER()
	RET()
}

// rowsFromPanel emits rowsFromPanelAVX2: dst[off[x]+c] = src[c*16+x]·f[x]
// for x < len(off), c < d: 8 half lines loaded and scaled, transposed,
// and stored as 8 rows (as many as exist).
func rowsFromPanel() {
	TEXT("rowsFromPanelAVX2", NOSPLIT, "func(dst []float32, off []int, src, f []float32, d int)")
	Pragma("noescape")
	Doc("rowsFromPanelAVX2 scatters a panel into up to 16 rows (see RowsFromPanel); the Go caller checks.")
	ptrs := AllocLocal(64)
	for h := 0; h < 2; h++ {
		pre := fmt.Sprintf("h%d", h)
		dst := Load(Param("dst").Base(), GP64())
		nl := laneSetup(pre, h, dst, ptrs, pre+"done")
		nlMem := AllocLocal(8)
		MOVQ(nl, nlMem)
		fp := Load(Param("f").Base(), GP64())
		fv := YMM()
		VMOVUPS(Mem{Base: fp, Disp: 32 * h}, fv)
		src := Load(Param("src").Base(), GP64())
		if h == 1 {
			ADDQ(U8(32), src)
		}
		co := GP64()
		XORQ(co, co)
		d := Load(Param("d"), GP64())
		// store writes row i's 8 (or, with mask, fewer) values for the
		// rows that exist.
		store := func(c []VecVirtual, mask VecVirtual, tag string) {
			n := GP64()
			MOVQ(nlMem, n)
			for i := range c {
				p := GP64()
				MOVQ(ptrs.Offset(8*i), p)
				if mask == nil {
					VMOVUPS(c[i], Mem{Base: p, Index: co, Scale: 1})
				} else {
					VMASKMOVPS(c[i], mask, Mem{Base: p, Index: co, Scale: 1})
				}
				if i < 7 {
					DECQ(n)
					JZ(LabelRef(pre + tag))
				}
			}
			Label(pre + tag)
		}
		Label(pre + "c8")
		CMPQ(d, U8(8))
		JL(LabelRef(pre + "ctail"))
		{
			r := newYMMs(8)
			for j := range r {
				VMULPS(Mem{Base: src, Disp: 64 * j}, fv, r[j])
			}
			store(transpose8(r), nil, "s8")
			ADDQ(U32(8*64), src)
			ADDQ(U8(32), co)
			SUBQ(U8(8), d)
			JMP(LabelRef(pre + "c8"))
		}
		Label(pre + "ctail")
		TESTQ(d, d)
		JZ(LabelRef(pre + "done"))
		{
			mask := YMM()
			VMOVDQU(loadTailMaskMem(d), mask)
			r := newYMMs(8)
			for j := range r {
				VXORPS(r[j], r[j], r[j])
			}
			n := GP64()
			MOVQ(d, n)
			for j := range r {
				VMULPS(Mem{Base: src, Disp: 64 * j}, fv, r[j])
				if j < 7 {
					DECQ(n)
					JZ(LabelRef(pre + "tload"))
				}
			}
			Label(pre + "tload")
			store(transpose8(r), mask, "st")
		}
		Label(pre + "done")
	}
	VZEROUPPER()
	RET()
}
