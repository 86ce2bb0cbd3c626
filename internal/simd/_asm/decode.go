package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The product O += P·V of the KV-cache decode step: gemm's register
// blocks with B (the values) read in place as 16-bit rows, widened in
// registers, and a prefetch hint for the next block of the cache.

// gemm16 emits gemmBF16AVX2 and gemmF16AVX2, Gemm with B stored in 16
// bits and widened in registers as it is read (see kElem), with no
// float32 copy of it, and gemmPFAVX2, the same code for float32 B. All
// three take n a multiple of 8 and a prefetch hint pf.
func gemm16() {
	hiHalves = GLOBL("hiHalves", RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(0xffff0000))
	}
	gemm16Kernel("gemmBF16AVX2", kBF16, true,
		"gemmBF16AVX2 computes C = A·B or C += A·B with B in bfloat16, widened in registers",
		"(see GemmBF16). n must be a multiple of 8; the slices must be long enough",
		"(the Go caller checks).",
	)
	gemm16Kernel("gemmF16AVX2", kF16, false,
		"gemmF16AVX2 computes C = A·B or C += A·B with B in binary16, widened in registers",
		"with F16C (see GemmF16). n must be a multiple of 8; the slices must be long",
		"enough (the Go caller checks).",
	)
	gemm16Kernel("gemmPFAVX2", kF32, false,
		"gemmPFAVX2 computes C = A·B or C += A·B (see GemmPF). n must be a multiple of 8;",
		"the slices must be long enough (the Go caller checks).",
	)
}

// gemm16Kernel emits one such kernel: the row blocks and register blocks
// of gemm (6 rows × 16 columns, fewer rows with several sets of
// accumulators), each step of k loading (and widening) the 16 values of B
// it multiplies, and a last panel of 8 columns when n%16 is 8. Each pass
// of the k loop (4 steps) prefetches 2 lines of pf: for a 16-bit B, as
// many lines as the pass reads of B, so that a decode step's call brings
// in the next block's values as it goes (a float32 B gets half of them
// in; the decode step touches the rest).
//
// With split (bfloat16 B), a 16-column panel widens the 16 values of a
// step from one 32-byte load without shuffles: a shift left by 16 of the
// 32-bit lanes gives the values of the even columns, a mask of their
// upper halves those of the odd ones, so its two accumulators of a row
// hold the even and the odd columns of C. The panel splits C that way
// when it loads it and interleaves it back when it stores it (shuffles
// once a panel, not once a step). VPMOVZXWD and a shift per 8 values,
// four instructions for the shuffle and shift ports per 16 values where
// the split has one, ran the decode step's 4 × 16 blocks markedly slower
// (figures: results/2026-12-07, "Figures moved out of code comments").
func gemm16Kernel(name string, ke kElem, split bool, doc ...string) {
	gemm16KernelOf(name, map[int]string{1: "[]int8", 2: "[]uint16", 4: "[]float32"}[ke.size], ke, split, doc...)
}

// gemm16KernelOf is gemm16Kernel with B's Go type bType.
func gemm16KernelOf(name, bType string, ke kElem, split bool, doc ...string) {
	TEXT(name, NOSPLIT, "func(m, n, k int, a []float32, lda int, b "+bType+", ldb int, c []float32, ldc int, accumulate bool, pf "+bType+")")
	Pragma("noescape")
	Doc(doc...)
	g := gemmRegs{}
	pf := newPrefetcher("pf", ke.size)
	g.m = Load(Param("m"), GP64())
	n := Load(Param("n"), GP64())
	TESTQ(g.m, g.m)
	JZ(LabelRef("done"))
	TESTQ(n, n)
	JZ(LabelRef("done"))

	g.aRow = Load(Param("a").Base(), GP64())
	g.cRow = Load(Param("c").Base(), GP64())
	g.lda = Load(Param("lda"), GP64())
	g.ldb = Load(Param("ldb"), GP64())
	g.ldc = Load(Param("ldc"), GP64())
	SHLQ(U8(2), g.lda)
	shlSize(g.ldb, ke.size)
	SHLQ(U8(2), g.ldc)

	Label("rows6")
	CMPQ(g.m, U8(maxRows))
	JL(LabelRef("tail"))
	g.block16(maxRows, ke, pf, split)
	LEAQ(Mem{Base: g.aRow, Index: g.lda, Scale: 4}, g.aRow)
	LEAQ(Mem{Base: g.aRow, Index: g.lda, Scale: 2}, g.aRow)
	LEAQ(Mem{Base: g.cRow, Index: g.ldc, Scale: 4}, g.cRow)
	LEAQ(Mem{Base: g.cRow, Index: g.ldc, Scale: 2}, g.cRow)
	SUBQ(U8(maxRows), g.m)
	JMP(LabelRef("rows6"))

	Label("tail")
	for r := maxRows - 1; r >= 1; r-- {
		CMPQ(g.m, U8(r))
		JE(LabelRef(fmt.Sprintf("rows%d", r)))
	}
	JMP(LabelRef("done"))
	for r := 1; r < maxRows; r++ {
		Label(fmt.Sprintf("rows%d", r))
		g.block16(r, ke, pf, split)
		JMP(LabelRef("done"))
	}

	Label("done")
	VZEROUPPER()
	RET()
}

// block16 emits the loop over the 16-column panels of an r-row block
// with B in 16 bits, then the 8-column panel left when n%16 is 8.
func (g gemmRegs) block16(r int, ke kElem, pf *prefetcher, split bool) {
	pre := fmt.Sprintf("r%d", r)
	Commentf("Block of %d rows: loop over 16-column panels.", r)
	bPanel := Load(Param("b").Base(), GP64())
	cp := GP64()
	MOVQ(g.cRow, cp)
	j := Load(Param("n"), GP64())

	Label(pre + "panel")
	CMPQ(j, U8(16))
	JL(LabelRef(pre + "half"))
	g.panel16(r, 2, pre+"w16", ke, bPanel, cp, pf, split)
	ADDQ(U8(16*ke.size), bPanel)
	ADDQ(U8(64), cp)
	SUBQ(U8(16), j)
	JMP(LabelRef(pre + "panel"))

	Label(pre + "half")
	TESTQ(j, j)
	JZ(LabelRef(pre + "end"))
	g.panel16(r, 1, pre+"w8", ke, bPanel, cp, pf, false)
	Label(pre + "end")
}

// panel16 emits C[0:r][cp:cp+8w] (+)= A[0:r][:]·widen(B[:][bPanel:+8w])
// for w ymm of C per row (w = 2: 16 columns, w = 1: 8), prefetching a
// line of pf every other step of k.
func (g gemmRegs) panel16(r, w int, pre string, ke kElem, bPanel, cp Register, pf *prefetcher, split bool) {
	sets := 1
	switch {
	case r == 1:
		sets = 4
	case r <= 3 || w == 1:
		sets = 2
	}
	acc := make([][][]VecVirtual, sets)
	for s := range acc {
		acc[s] = make([][]VecVirtual, r)
		for i := range acc[s] {
			acc[s][i] = newYMMs(w)
		}
	}

	flag := Load(Param("accumulate"), GP8())
	TESTB(flag, flag)
	JZ(LabelRef(pre + "zero"))
	{
		var c3 Register
		if r > 3 {
			c3 = row3(cp, g.ldc)
		}
		for i := 0; i < r; i++ {
			addr := rowAddr(cp, c3, g.ldc, i)
			if split {
				// Even columns: 0, 2 of each 4 of C[0:8] and
				// C[8:16], then the 64-bit pairs in order.
				c0, c1 := YMM(), YMM()
				VMOVUPS(addr, c0)
				VMOVUPS(addr.Offset(32), c1)
				VSHUFPS(U8(0x88), c1, c0, acc[0][i][0])
				VSHUFPS(U8(0xdd), c1, c0, acc[0][i][1])
				VPERMPD(U8(0xd8), acc[0][i][0], acc[0][i][0])
				VPERMPD(U8(0xd8), acc[0][i][1], acc[0][i][1])
				continue
			}
			for u := 0; u < w; u++ {
				VMOVUPS(addr.Offset(32*u), acc[0][i][u])
			}
		}
		JMP(LabelRef(pre + "init"))
	}
	Label(pre + "zero")
	for i := 0; i < r; i++ {
		for u := 0; u < w; u++ {
			VXORPS(acc[0][i][u], acc[0][i][u], acc[0][i][u])
		}
	}
	Label(pre + "init")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			for u := 0; u < w; u++ {
				VXORPS(acc[s][i][u], acc[s][i][u], acc[s][i][u])
			}
		}
	}

	ap := GP64()
	MOVQ(g.aRow, ap)
	var a3 Register
	if r > 3 {
		a3 = row3(ap, g.lda)
	}
	bp := GP64()
	MOVQ(bPanel, bp)
	kk := Load(Param("k"), GP64())

	// step emits one step of k: C[i][0:8w] += A[i][p] · widen(B[p][0:8w]).
	step := func(s, disp int) {
		bv := newYMMs(w)
		if split {
			VMOVDQU(Mem{Base: bp}, bv[1])
			VPSLLD(U8(16), bv[1], bv[0])
			VPAND(hiHalves, bv[1], bv[1])
		} else {
			for u := range bv {
				ke.load(Mem{Base: bp, Disp: 8 * ke.size * u}, bv[u])
			}
		}
		for i := 0; i < r; i++ {
			t := YMM()
			VBROADCASTSS(rowAddr(ap, a3, g.lda, i).Offset(disp), t)
			for u := range bv {
				VFMADD231PS(bv[u], t, acc[s][i][u])
			}
		}
		ADDQ(g.ldb, bp)
	}
	advanceA := func(bytes int) {
		ADDQ(U8(bytes), ap)
		if r > 3 {
			ADDQ(U8(bytes), a3)
		}
	}

	SUBQ(U8(kUnroll), kk)
	JL(LabelRef(pre + "k1"))
	Label(pre + "k4")
	// As many lines as the pass reads of a 16-bit B (half those of a
	// float32 one); one, the pass's, for an 8-bit B.
	pf.next(min(2, ke.size))
	for u := 0; u < kUnroll; u++ {
		step(u%sets, 4*u)
	}
	advanceA(4 * kUnroll)
	SUBQ(U8(kUnroll), kk)
	JGE(LabelRef(pre + "k4"))
	Label(pre + "k1")
	ADDQ(U8(kUnroll), kk)
	JZ(LabelRef(pre + "store"))
	Label(pre + "k1loop")
	step(0, 0)
	advanceA(4)
	DECQ(kk)
	JNZ(LabelRef(pre + "k1loop"))

	Label(pre + "store")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			for u := 0; u < w; u++ {
				VADDPS(acc[s][i][u], acc[0][i][u], acc[0][i][u])
			}
		}
	}
	var c3 Register
	if r > 3 {
		c3 = row3(cp, g.ldc)
	}
	for i := 0; i < r; i++ {
		addr := rowAddr(cp, c3, g.ldc, i)
		if split {
			e, o := acc[0][i][0], acc[0][i][1]
			VPERMPD(U8(0xd8), e, e)
			VPERMPD(U8(0xd8), o, o)
			c0, c1 := YMM(), YMM()
			VUNPCKLPS(o, e, c0)
			VUNPCKHPS(o, e, c1)
			VMOVUPS(c0, addr)
			VMOVUPS(c1, addr.Offset(32))
			continue
		}
		for u := 0; u < w; u++ {
			VMOVUPS(acc[0][i][u], addr.Offset(32*u))
		}
	}
}

// hiHalves masks the upper 16 bits of each 32-bit lane.
var hiHalves Mem
