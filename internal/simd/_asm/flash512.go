package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The AVX-512 kernels of the fused attention tile: gemmPanelsAVX512,
// onlineSoftmaxAVX512 and attendPanelsAVX512, the algorithms of flash.go
// with a panel of 16 queries in one zmm register. A panel's maxima, sums
// and rescale factors are single registers, the lanes a key's logits,
// and the register blocks of the products are maxRows512 rows high.

// maxRows512 is the height of the register block of the AVX-512 panel
// products: 8 rows of A, 8 zmm accumulators, so 8 FMA chains, as many as
// a core with two 512-bit FMA pipes of latency 4 keeps busy (a core
// with one pipe needs 4).
const maxRows512 = 8

// panelGemm512 is panelGemm with one zmm of B and C a row.
type panelGemm512 struct {
	pre     string
	m, k    Op
	a, b, c Op // base addresses of A, the B panel and the C panel
	cols    bool
	stride  Op
	// accumulate: a memory operand holding the flag, or nil for accStatic.
	accumulate Op
	accStatic  bool
	// epilogue, when not nil, is called after each block's store with the
	// block's height, the panel (0, or 1 of two) and that panel's
	// accumulators (free to overwrite).
	epilogue func(r, panel int, acc []VecVirtual)
	// b2 and c2, when not nil, hold the byte offsets of a second panel of
	// B and of C, computed in the same blocks from the same loads of A:
	// each broadcast of A then feeds two FMAs, where with one panel it
	// feeds one and the loads (nine a step for eight FMAs) bound the
	// block below the FMA peak.
	b2, c2 Op
	// pf, when not nil, is a frame slot with a pointer to memory to
	// prefetch into L2, a line every four steps of k, up to the address
	// in pfEnd (where it stays).
	pf, pfEnd *Mem
}

func (g panelGemm512) emit() {
	aBlk, cBlk, rem := GP64(), GP64(), GP64()
	MOVQ(g.a, aBlk)
	MOVQ(g.c, cBlk)
	MOVQ(g.m, rem)
	ld := GP64()
	MOVQ(g.stride, ld)
	SHLQ(U8(2), ld)
	Label(g.pre + "rows8")
	CMPQ(rem, U8(maxRows512))
	JL(LabelRef(g.pre + "tail"))
	g.block(maxRows512, aBlk, cBlk, ld)
	if g.cols {
		ADDQ(U8(4*maxRows512), aBlk)
	} else {
		LEAQ(Mem{Base: aBlk, Index: ld, Scale: 8}, aBlk)
	}
	ADDQ(U32(maxRows512*64), cBlk)
	SUBQ(U8(maxRows512), rem)
	JMP(LabelRef(g.pre + "rows8"))

	Label(g.pre + "tail")
	for r := maxRows512 - 1; r >= 1; r-- {
		CMPQ(rem, U8(r))
		JE(LabelRef(fmt.Sprintf("%srows%d", g.pre, r)))
	}
	JMP(LabelRef(g.pre + "end"))
	for r := 1; r < maxRows512; r++ {
		Label(fmt.Sprintf("%srows%d", g.pre, r))
		g.block(r, aBlk, cBlk, ld)
		JMP(LabelRef(g.pre + "end"))
	}
	Label(g.pre + "end")
}

// emitRowsOrCols emits g twice, for A read by rows (row stride rows)
// where sel holds 1 and by columns (column stride cols) otherwise, and
// the test between them.
func (g panelGemm512) emitRowsOrCols(sel, rows, cols Op) {
	pre := g.pre
	CMPQ(sel, U8(1))
	JNE(LabelRef(pre + "bycols"))
	g.pre, g.stride = pre+"r", rows
	g.emit()
	JMP(LabelRef(pre + "end"))
	Label(pre + "bycols")
	g.pre, g.stride, g.cols = pre+"c", cols, true
	g.emit()
	Label(pre + "end")
}

// floatBytes returns a frame slot holding the int parameter name times
// 4: a count of float32s as bytes.
func floatBytes(name string) Mem {
	slot := AllocLocal(8)
	t := Load(Param(name), GP64())
	SHLQ(U8(2), t)
	MOVQ(t, slot)
	return slot
}

// sets512 is the number of sets of accumulators of an r-row block, used
// in turn on the steps of k so that short blocks have 4 to 8 FMA chains.
func sets512(r int) int {
	switch {
	case r <= 2:
		return 4
	case r <= 4:
		return 2
	}
	return 1
}

// rowAddr8 addresses row i (0..7) of a block from pointers to its rows 0
// and 4, the row stride ld and 3·ld, in bytes.
func rowAddr8(p0, p4, ld, ld3 Register, i int) Mem {
	base := p0
	if i >= 4 {
		base, i = p4, i-4
	}
	switch i {
	case 0:
		return Mem{Base: base}
	case 1:
		return Mem{Base: base, Index: ld, Scale: 1}
	case 2:
		return Mem{Base: base, Index: ld, Scale: 2}
	default:
		return Mem{Base: base, Index: ld3, Scale: 1}
	}
}

// block emits the k loop of one r-row block, as panelGemm.block does, each
// step of k one load of B and r FMAs with A broadcast from memory.
func (g panelGemm512) block(r int, aBlk, cBlk, ld Register) {
	pre := fmt.Sprintf("%sb%d", g.pre, r)
	sets := sets512(r)
	acc := make([][]VecVirtual, sets)
	for s := range acc {
		acc[s] = newZMMs(r)
	}
	two := g.b2 != nil
	var acc2 [][]VecVirtual
	if two {
		acc2 = make([][]VecVirtual, sets)
		for s := range acc2 {
			acc2[s] = newZMMs(r)
		}
	}
	// c2Blk addresses the second panel's C block (a temporary).
	c2Blk := func() Register {
		t := GP64()
		MOVQ(g.c2, t)
		ADDQ(cBlk, t)
		return t
	}
	Commentf("Block of %d rows.", r)
	load := func() {
		for i := 0; i < r; i++ {
			VMOVUPS(Mem{Base: cBlk, Disp: 64 * i}, acc[0][i])
		}
		if two {
			c2 := c2Blk()
			for i := 0; i < r; i++ {
				VMOVUPS(Mem{Base: c2, Disp: 64 * i}, acc2[0][i])
			}
		}
	}
	zero := func() {
		for i := 0; i < r; i++ {
			VXORPS(acc[0][i], acc[0][i], acc[0][i])
			if two {
				VXORPS(acc2[0][i], acc2[0][i], acc2[0][i])
			}
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
			VXORPS(acc[s][i], acc[s][i], acc[s][i])
			if two {
				VXORPS(acc2[s][i], acc2[s][i], acc2[s][i])
			}
		}
	}

	p0, bp, kk := GP64(), GP64(), GP64()
	MOVQ(aBlk, p0)
	var p4, ld3 Register
	if g.cols || r > 3 {
		ld3 = GP64()
		LEAQ(Mem{Base: ld, Index: ld, Scale: 2}, ld3)
	}
	if !g.cols && r > 4 {
		p4 = GP64()
		LEAQ(Mem{Base: p0, Index: ld, Scale: 4}, p4)
	}
	MOVQ(g.b, bp)
	MOVQ(g.k, kk)
	var bp2 Register
	if two {
		bp2 = GP64()
		MOVQ(g.b2, bp2)
		ADDQ(bp, bp2)
	}

	aAddr := func(i, u int) Mem {
		if !g.cols {
			return rowAddr8(p0, p4, ld, ld3, i).Offset(4 * u)
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
		bv := ZMM()
		VMOVUPS(Mem{Base: bp, Disp: 64 * u}, bv)
		if !two {
			for i := 0; i < r; i++ {
				VFMADD231PS_BCST(aAddr(i, u), bv, acc[s][i])
			}
			return
		}
		bv2 := ZMM()
		VMOVUPS(Mem{Base: bp2, Disp: 64 * u}, bv2)
		for i := 0; i < r; i++ {
			x := ZMM()
			VBROADCASTSS(aAddr(i, u), x)
			VFMADD231PS(x, bv, acc[s][i])
			VFMADD231PS(x, bv2, acc2[s][i])
		}
	}
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
		if p4 != nil {
			ADDQ(U8(4*u), p4)
		}
	}

	SUBQ(U8(kUnroll), kk)
	JL(LabelRef(pre + "k1"))
	Label(pre + "k4")
	if g.pf != nil {
		// Two panels take half the steps over the same data: two lines
		// a step keep the prefetch as far ahead.
		lines := 1
		if two {
			lines = 2
		}
		t := GP64()
		MOVQ(*g.pf, t)
		for l := 0; l < lines; l++ {
			PREFETCHT1(Mem{Base: t, Disp: 64 * l})
		}
		ADDQ(U8(64*lines), t)
		CMPQ(t, *g.pfEnd)
		CMOVQGT(*g.pfEnd, t)
		MOVQ(t, *g.pf)
	}
	for u := 0; u < kUnroll; u++ {
		step(u%sets, u)
	}
	advance(kUnroll)
	ADDQ(U32(64*kUnroll), bp)
	if two {
		ADDQ(U32(64*kUnroll), bp2)
	}
	SUBQ(U8(kUnroll), kk)
	JGE(LabelRef(pre + "k4"))
	Label(pre + "k1")
	ADDQ(U8(kUnroll), kk)
	JZ(LabelRef(pre + "store"))
	Label(pre + "k1loop")
	step(0, 0)
	advance(1)
	ADDQ(U8(64), bp)
	if two {
		ADDQ(U8(64), bp2)
	}
	DECQ(kk)
	JNZ(LabelRef(pre + "k1loop"))

	Label(pre + "store")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			VADDPS(acc[s][i], acc[0][i], acc[0][i])
			if two {
				VADDPS(acc2[s][i], acc2[0][i], acc2[0][i])
			}
		}
	}
	for i := 0; i < r; i++ {
		VMOVUPS(acc[0][i], Mem{Base: cBlk, Disp: 64 * i})
	}
	if two {
		c2 := c2Blk()
		for i := 0; i < r; i++ {
			VMOVUPS(acc2[0][i], Mem{Base: c2, Disp: 64 * i})
		}
	}
	if g.epilogue != nil {
		g.epilogue(r, 0, acc[0])
		if two {
			g.epilogue(r, 1, acc2[0])
		}
	}
}

// gemmPanels512 emits gemmPanelsAVX512: panelGemm512 for two panels at a
// time, and for the last one when their number is odd.
func gemmPanels512() {
	TEXT("gemmPanelsAVX512", NOSPLIT, "func(m, n, k int, a []float32, ar, ac int, b []float32, pb int, c []float32, pc int, accumulate bool)")
	Pragma("noescape")
	Doc(
		"gemmPanelsAVX512 is gemmPanelsAVX2 with AVX-512 (see GemmPanels): n must be a multiple",
		"of 16; the slices must be long enough (the Go caller checks).",
	)
	m := Load(Param("m"), GP64())
	j := Load(Param("n"), GP64())
	TESTQ(m, m)
	JZ(LabelRef("done"))
	TESTQ(j, j)
	JZ(LabelRef("done"))
	bPanel := Load(Param("b").Base(), GP64())
	cPanel := Load(Param("c").Base(), GP64())
	// The byte offsets of the next panel of B and of C.
	pbBytes, pcBytes := floatBytes("pb"), floatBytes("pc")
	gemm := func(pre string, two bool) {
		g := panelGemm512{
			pre: pre, m: m, k: addr(Param("k")),
			a: addr(Param("a").Base()), b: bPanel, c: cPanel,
			accumulate: addr(Param("accumulate")),
		}
		if two {
			g.b2, g.c2 = pbBytes, pcBytes
		}
		g.emitRowsOrCols(addr(Param("ac")), addr(Param("ar")), addr(Param("ac")))
	}

	Label("pair")
	CMPQ(j, U8(32))
	JL(LabelRef("single"))
	gemm("two", true)
	for range 2 {
		ADDQ(pbBytes, bPanel)
		ADDQ(pcBytes, cPanel)
	}
	SUBQ(U8(32), j)
	JMP(LabelRef("pair"))

	Label("single")
	TESTQ(j, j)
	JZ(LabelRef("done"))
	gemm("one", false)

	Label("done")
	VZEROUPPER()
	RET()
}

// exp2Consts512 holds the constants of the base-2 exponentials in zmm
// registers, loaded once for a loop.
type exp2Consts512 struct {
	clamp, magic VecVirtual
	c            [5]VecVirtual
	one          VecVirtual
}

// loadExp2Consts512 broadcasts the constants of exp2Lanes (fast false) or
// exp2LanesFast (fast true).
func loadExp2Consts512(fast bool) exp2Consts512 {
	var e exp2Consts512
	if fast {
		e.clamp, e.magic = bcastConst(exp2MinFast), bcastConst(exp2MagicFast)
	} else {
		e.clamp, e.magic = bcastConst(exp2Min), bcastConst(exp2Magic)
	}
	for i := range e.c {
		e.c[i] = bcastConst(exp2C[i])
	}
	e.one = bcastConst(one)
	return e
}

// exp2Lanes512 sets each of ts to 2^t lane by lane, stage by stage for all
// of them as exp2Lanes does: with fast false the steps of exp2Vec (t
// clamped at -127, 2^n made by a shift and multiplied in, exactly 0 at
// -127), with fast true those of exp2LanesFast (t clamped at -126, n << 23
// added to the bits of 2^r). The lanes get the bits the AVX2 kernels give.
func exp2Lanes512(ts []VecVirtual, e exp2Consts512, fast bool) {
	ks, ps := newZMMs(len(ts)), newZMMs(len(ts))
	for _, t := range ts {
		VMAXPS(t, e.clamp, t)
	}
	for i, t := range ts {
		VADDPS(e.magic, t, ks[i])
	}
	for i := range ts {
		VSUBPS(e.magic, ks[i], ps[i])
	}
	for i, t := range ts {
		VSUBPS(ps[i], t, t) // r
	}
	for i := range ts {
		VMOVAPS(e.c[4], ps[i])
	}
	for c := 3; c >= -1; c-- {
		cr := e.one
		if c >= 0 {
			cr = e.c[c]
		}
		for i, t := range ts {
			VFMADD213PS(cr, t, ps[i])
		}
	}
	for i, t := range ts {
		VPSLLD(U8(23), ks[i], ks[i])
		if fast {
			VPADDD(ks[i], ps[i], t)
		} else {
			VMULPS(ks[i], ps[i], t)
		}
	}
}

// softmaxStep512 is softmaxStep for a panel in one zmm register: given mx,
// the new maximum of the panel's 16 queries (m included), it updates m and
// l, rescales the panel's dacc accumulator rows at accp where some factor
// is not 1, replaces the n logits at s (a key a row) by their
// exponentials (exp2LanesFast's when fast) and adds their sum to l. mp, lp
// and accp are registers or memory operands holding the addresses.
func softmaxStep512(pre string, mx VecVirtual, mp, lp, accp, s, n, dacc Op, fast bool) {
	m, l := GP64(), GP64()
	MOVQ(mp, m)
	MOVQ(lp, l)
	// ms = mx, or 0 where mx is -Inf (NaN stays).
	keep, ms := K(), ZMM()
	VCMPPS_BCST(U8(4), negInf, mx, keep)
	VMOVAPS_Z(mx, keep, ms)
	c := ZMM()
	VMOVUPS(Mem{Base: m}, c)
	VSUBPS(ms, c, c)
	VMULPS_BCST(expLog2e, c, c)
	exp2Lanes512([]VecVirtual{c}, loadExp2Consts512(false), false)
	VMOVUPS(mx, Mem{Base: m})
	lv := ZMM()
	VMULPS(Mem{Base: l}, c, lv)
	VMOVUPS(lv, Mem{Base: l})
	// Lanes whose factor is not 1 (NaN included) need a rescale.
	ne := K()
	VCMPPS_BCST(U8(4), one, c, ne)
	KORTESTW(ne, ne)
	JZ(LabelRef(pre + "exp"))
	{
		d, ap := GP64(), GP64()
		MOVQ(dacc, d)
		MOVQ(accp, ap)
		TESTQ(d, d)
		JZ(LabelRef(pre + "exp"))
		Label(pre + "rescale")
		v := ZMM()
		VMULPS(Mem{Base: ap}, c, v)
		VMOVUPS(v, Mem{Base: ap})
		ADDQ(U8(64), ap)
		DECQ(d)
		JNZ(LabelRef(pre + "rescale"))
	}

	// s = 2^((s - ms)·log2 e), summed into l, four keys a step.
	Label(pre + "exp")
	e := loadExp2Consts512(fast)
	lg := bcastConst(expLog2e)
	sum := newZMMs(2)
	VXORPS(sum[0], sum[0], sum[0])
	VXORPS(sum[1], sum[1], sum[1])
	nn, sp := GP64(), GP64()
	MOVQ(n, nn)
	MOVQ(s, sp)
	expRows := func(rows int) {
		ts := newZMMs(rows)
		for i, t := range ts {
			VMOVUPS(Mem{Base: sp, Disp: 64 * i}, t)
			VSUBPS(ms, t, t)
			VMULPS(lg, t, t)
		}
		exp2Lanes512(ts, e, fast)
		for i, t := range ts {
			VMOVUPS(t, Mem{Base: sp, Disp: 64 * i})
		}
		for i := 2; i < len(ts); i++ {
			VADDPS(ts[i], ts[i%2], ts[i%2])
		}
		VADDPS(ts[0], sum[0], sum[0])
		if len(ts) > 1 {
			VADDPS(ts[1], sum[1], sum[1])
		}
	}
	Label(pre + "e4")
	CMPQ(nn, U8(4))
	JL(LabelRef(pre + "e1"))
	expRows(4)
	ADDQ(U32(256), sp)
	SUBQ(U8(4), nn)
	JMP(LabelRef(pre + "e4"))
	Label(pre + "e1")
	TESTQ(nn, nn)
	JZ(LabelRef(pre + "sumdone"))
	expRows(1)
	ADDQ(U8(64), sp)
	DECQ(nn)
	JMP(LabelRef(pre + "e1"))
	Label(pre + "sumdone")
	VADDPS(sum[1], sum[0], sum[0])
	VADDPS(Mem{Base: l}, sum[0], sum[0])
	VMOVUPS(sum[0], Mem{Base: l})
}

// onlineSoftmax512 emits onlineSoftmaxAVX512, onlineSoftmaxAVX2 with a
// panel in one zmm register and the limits applied with an opmask.
func onlineSoftmax512() {
	TEXT("onlineSoftmaxAVX512", NOSPLIT, "func(s []float32, ps, n, np int, lim, m, l, acc []float32, pacc, dacc int)")
	Pragma("noescape")
	Doc(
		"onlineSoftmaxAVX512 is onlineSoftmaxAVX2 with AVX-512 (see OnlineSoftmax).",
		"The slices must be long enough (the Go caller checks).",
	)
	np := Load(Param("np"), GP64())
	TESTQ(np, np)
	JZ(LabelRef("done"))
	// The panel pointers live in the frame, leaving the registers to the
	// softmax step.
	sPanel, mp, lp, accPanel, limp := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	npMem := AllocLocal(8)
	MOVQ(np, npMem)
	for _, x := range []struct {
		name string
		m    Mem
	}{{"s", sPanel}, {"m", mp}, {"l", lp}, {"acc", accPanel}, {"lim", limp}} {
		r := Load(Param(x.name).Base(), GP64())
		MOVQ(r, x.m)
	}

	Label("panel")
	mx := ZMM()
	{
		p := GP64()
		MOVQ(mp, p)
		VMOVUPS(Mem{Base: p}, mx)
	}
	n := Load(Param("n"), GP64())
	sp := GP64()
	MOVQ(sPanel, sp)
	masked := Load(Param("lim").Len(), GP64())
	TESTQ(masked, masked)
	JNZ(LabelRef("masked"))

	// Pass 1 without limits: the maximum over the keys, four chains.
	{
		mxs := newZMMs(3)
		for _, x := range mxs {
			VMOVAPS(mx, x)
		}
		all := []VecVirtual{mx, mxs[0], mxs[1], mxs[2]}
		Label("max4")
		CMPQ(n, U8(4))
		JL(LabelRef("max1"))
		for i, x := range all {
			VMAXPS(Mem{Base: sp, Disp: 64 * i}, x, x)
		}
		ADDQ(U32(256), sp)
		SUBQ(U8(4), n)
		JMP(LabelRef("max4"))
		Label("max1")
		TESTQ(n, n)
		JZ(LabelRef("maxdone"))
		VMAXPS(Mem{Base: sp}, mx, mx)
		ADDQ(U8(64), sp)
		DECQ(n)
		JMP(LabelRef("max1"))
		Label("maxdone")
		for _, x := range mxs {
			VMAXPS(x, mx, mx)
		}
		JMP(LabelRef("step"))
	}

	// Pass 1 with limits: key j of a lane is visible when j < lim; the
	// others are set to -Inf in s.
	Label("masked")
	{
		lim, jv, ninf, o := ZMM(), ZMM(), bcastConst(negInf), bcastConst(one)
		p := GP64()
		MOVQ(limp, p)
		VMOVUPS(Mem{Base: p}, lim)
		VXORPS(jv, jv, jv)
		TESTQ(n, n)
		JZ(LabelRef("step"))
		Label("mloop")
		x, hidden := ZMM(), K()
		VMOVUPS(Mem{Base: sp}, x)
		VCMPPS(U8(2), jv, lim, hidden) // lim <= j: hidden
		VMOVAPS(ninf, hidden, x)
		VMOVUPS(x, Mem{Base: sp})
		VMAXPS(x, mx, mx)
		VADDPS(o, jv, jv)
		ADDQ(U8(64), sp)
		DECQ(n)
		JNZ(LabelRef("mloop"))
	}

	Label("step")
	softmaxStep512("s", mx, mp, lp, accPanel, sPanel, addr(Param("n")), addr(Param("dacc")), false)

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
	DECQ(npMem)
	JNZ(LabelRef("panel"))

	Label("done")
	VZEROUPPER()
	RET()
}

// attendPanels512 emits attendPanelsAVX512, attendPanelsAVX2 with a panel
// in one zmm register: the running maximum of the logits is a register
// that each block of Sᵀ = K·Qᵀ updates as it is stored. Where st holds
// two panels' logits it takes the panels two at a time, each product
// one panelGemm512 over both, so that every load of K and V feeds two
// FMAs; the last panel of an odd number goes alone.
func attendPanels512() {
	TEXT("attendPanelsAVX512", NOSPLIT, "func(np, n, d int, k []float32, kr, kc int, qt []float32, pq int, st, v []float32, vr, vc int, m, l, acc []float32, pacc int, pfk, pfv []float32)")
	Pragma("noescape")
	Doc(
		"attendPanelsAVX512 is attendPanelsAVX2 with AVX-512 (see AttendPanels).",
		"The slices must be long enough (the Go caller checks).",
	)
	np := Load(Param("np"), GP64())
	TESTQ(np, np)
	JZ(LabelRef("done"))
	npMem := AllocLocal(8)
	MOVQ(np, npMem)
	// The panel pointers and the prefetch pointers live in the frame,
	// leaving the registers to the products.
	qtp, accp, mp, lp := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	for _, x := range []struct {
		name string
		m    Mem
	}{{"qt", qtp}, {"acc", accp}, {"m", mp}, {"l", lp}} {
		r := Load(Param(x.name).Base(), GP64())
		MOVQ(r, x.m)
	}
	pfk, pfv, pfkEnd, pfvEnd := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	for _, x := range []struct {
		name   string
		p, end Mem
	}{{"pfk", pfk, pfkEnd}, {"pfv", pfv, pfvEnd}} {
		p := Load(Param(x.name).Base(), GP64())
		e := Load(Param(x.name).Len(), GP64())
		LEAQ(Mem{Base: p, Index: e, Scale: 4, Disp: -64}, e)
		CMPQ(e, p)
		CMOVQLT(p, e) // fewer than 16 floats: stay at the start
		MOVQ(p, x.p)
		MOVQ(e, x.end)
	}
	n, st := addr(Param("n")), addr(Param("st").Base())
	// For the pairs: the byte offsets of the second panel of Qᵀ (pq),
	// of the logits (16·n) and of the accumulator (pacc), and the second
	// panel's pointers. pairs is 1 where st holds two panels.
	pqBytes, paccBytes := floatBytes("pq"), floatBytes("pacc")
	stBytes := AllocLocal(8)
	st2, mp2, lp2, accp2 := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	pairs := AllocLocal(8)
	{
		t := Load(Param("n"), GP64())
		SHLQ(U8(6), t)
		MOVQ(t, stBytes)
		u := GP64()
		MOVQ(st, u)
		ADDQ(t, u)
		MOVQ(u, st2)
		SHLQ(U8(1), t) // bytes of two panels of logits
		w, one := GP64(), GP64()
		XORQ(w, w)
		MOVQ(U32(1), one)
		ln := Load(Param("st").Len(), GP64())
		SHLQ(U8(2), ln)
		CMPQ(ln, t)
		CMOVQGE(one, w)
		MOVQ(w, pairs)
	}

	// visit emits the products and the softmax of one panel, or of two
	// (the second's pointers in mp2, lp2, accp2 and st2), and the step to
	// the next.
	visit := func(pre string, two bool) {
		panels := 1
		if two {
			panels = 2
			for _, x := range []struct {
				dst, src Mem
				off      Op
			}{{mp2, mp, U8(64)}, {lp2, lp, U8(64)}, {accp2, accp, paccBytes}} {
				t := GP64()
				MOVQ(x.src, t)
				if o, ok := x.off.(U8); ok {
					ADDQ(o, t)
				} else {
					ADDQ(x.off, t)
				}
				MOVQ(t, x.dst)
			}
		}
		mps := []Mem{mp, mp2}[:panels]
		mx := newZMMs(panels)
		for i, p := range mps {
			t := GP64()
			MOVQ(p, t)
			VMOVUPS(Mem{Base: t}, mx[i])
		}
		CMPQ(n, U8(0))
		JE(LabelRef(pre + "step"))
		qk := panelGemm512{
			pre: pre + "qk", m: n, k: addr(Param("d")),
			a: addr(Param("k").Base()), b: qtp, c: st,
			pf: &pfk, pfEnd: &pfkEnd,
			epilogue: func(r, panel int, acc []VecVirtual) {
				for i := 0; i < r; i++ {
					VMAXPS(acc[i], mx[panel], mx[panel])
				}
			},
		}
		pv := panelGemm512{
			pre: pre + "pv", m: addr(Param("d")), k: n,
			a: addr(Param("v").Base()), b: st, c: accp, stride: addr(Param("vc")), cols: true,
			accStatic: true, pf: &pfv, pfEnd: &pfvEnd,
		}
		if two {
			qk.b2, qk.c2 = pqBytes, stBytes
			pv.b2, pv.c2 = stBytes, paccBytes
		}
		qk.emitRowsOrCols(addr(Param("kc")), addr(Param("kr")), addr(Param("kc")))

		Label(pre + "step")
		softmaxStep512(pre+"s0", mx[0], mp, lp, accp, st, n, addr(Param("d")), true)
		if two {
			softmaxStep512(pre+"s1", mx[1], mp2, lp2, accp2, st2, n, addr(Param("d")), true)
		}

		CMPQ(n, U8(0))
		JE(LabelRef(pre + "next"))
		pv.emit()

		Label(pre + "next")
		for _, x := range []struct {
			step Mem
			p    Mem
		}{{pqBytes, qtp}, {paccBytes, accp}} {
			t := GP64()
			MOVQ(x.step, t)
			if two {
				SHLQ(U8(1), t)
			}
			ADDQ(t, x.p)
		}
		ADDQ(U8(64*panels), mp)
		ADDQ(U8(64*panels), lp)
		SUBQ(U8(panels), npMem)
		JNZ(LabelRef("panel"))
	}

	Label("panel")
	CMPQ(npMem, U8(2))
	JL(LabelRef("single"))
	CMPQ(pairs, U8(0))
	JE(LabelRef("single"))
	visit("p", true)
	JMP(LabelRef("done"))

	Label("single")
	visit("", false)

	Label("done")
	VZEROUPPER()
	RET()
}
