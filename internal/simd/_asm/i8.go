package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
)

// The decode kernels of an int8 KV cache: rows of codes with a float32
// scale each. The codes are widened in registers (VPMOVSXBD from memory,
// then VCVTDQ2PS: exact, as every int8 is a float32) by the DotRows and
// Gemm generators with the key type kI8; the caller applies the scales,
// to the scores after DotRowsI8 and to the probabilities before GemmI8.
// WidenI8 widens whole rows and multiplies them by their scales, for the
// fused tile kernel that wants float32 blocks.

// dotRowsI8 emits dotRowsI8AVX2 and dotRowsI8PFAVX2.
func dotRowsI8() {
	dotRowsKernel("dotRowsI8AVX2", "[]int8", kI8, false,
		"dotRowsI8AVX2 is dotRowsAVX2 with k in int8, widened in registers",
		"(see DotRowsI8); the Go caller checks the sizes.",
	)
	dotRowsKernel("dotRowsI8PFAVX2", "[]int8", kI8, true,
		"dotRowsI8PFAVX2 is dotRowsI8AVX2 prefetching pf a line at a time (see DotRowsI8PF).",
	)
}

// gemmI8 emits gemmI8AVX2, gemm16Kernel with B in int8: each step of k
// widens the 16 values of B of a panel with two VPMOVSXBD from memory and
// two VCVTDQ2PS, and each pass of 4 steps prefetches one line of the
// hint, the bytes the pass reads of B.
func gemmI8() {
	gemm16Kernel("gemmI8AVX2", kI8, false,
		"gemmI8AVX2 computes C = A·B or C += A·B with B in int8, widened in registers",
		"(see GemmI8). n must be a multiple of 8; the slices must be long enough",
		"(the Go caller checks).",
	)
}

// widenI8 emits widenI8AVX2: each row of ld codes becomes float32 times
// its row's scale, 32 and then 8 values a step. A row's tail of ld%8
// values is done again as the row's last 8 values when ld >= 8, which
// overlap the previous group; shorter rows go one value at a time.
func widenI8() {
	TEXT("widenI8AVX2", NOSPLIT, "func(dst []float32, src []int8, scale []float32, ld int)")
	Pragma("noescape")
	Doc("widenI8AVX2 sets dst[r*ld+i] = float32(src[r*ld+i])·scale[r] for r < len(scale), i < ld;",
		"the Go caller checks the sizes.")
	d := Mem{Base: Load(Param("dst").Base(), GP64())}
	s := Mem{Base: Load(Param("src").Base(), GP64())}
	sc := Mem{Base: Load(Param("scale").Base(), GP64())}
	rows := Load(Param("scale").Len(), GP64())
	ld := Load(Param("ld"), GP64())
	TESTQ(rows, rows)
	JZ(LabelRef("end"))
	TESTQ(ld, ld)
	JZ(LabelRef("end"))

	f := YMM()
	n := GP64()
	conv := func(off int) {
		v := YMM()
		VPMOVSXBD(s.Offset(8*off), v)
		VCVTDQ2PS(v, v)
		VMULPS(f, v, v)
		VMOVUPS(v, d.Offset(32*off))
	}

	Label("row")
	VBROADCASTSS(sc, f)
	MOVQ(ld, n)

	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop8"))
	for u := 0; u < 4; u++ {
		conv(u)
	}
	ADDQ(U8(32), s.Base)
	ADDQ(U32(128), d.Base)
	SUBQ(U8(32), n)
	JMP(LabelRef("loop32"))

	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	conv(0)
	ADDQ(U8(8), s.Base)
	ADDQ(U8(32), d.Base)
	SUBQ(U8(8), n)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("next"))
	CMPQ(ld, U8(8))
	JL(LabelRef("scalar"))
	// The row's last 8 values: back up by 8-n of them, then step past
	// the end of the row.
	LEAQ(Mem{Base: s.Base, Index: n, Scale: 1, Disp: -8}, s.Base)
	LEAQ(Mem{Base: d.Base, Index: n, Scale: 4, Disp: -32}, d.Base)
	conv(0)
	ADDQ(U8(8), s.Base)
	ADDQ(U8(32), d.Base)
	JMP(LabelRef("next"))

	Label("scalar")
	{
		t := GP32()
		x := XMM()
		MOVBLSX(s, t)
		VXORPS(x, x, x)
		VCVTSI2SSL(t, x, x)
		VMULSS(f.AsX(), x, x)
		VMOVSS(x, d)
	}
	ADDQ(U8(1), s.Base)
	ADDQ(U8(4), d.Base)
	DECQ(n)
	JNZ(LabelRef("scalar"))

	Label("next")
	ADDQ(U8(4), sc.Base)
	DECQ(rows)
	JNZ(LabelRef("row"))

	Label("end")
	VZEROUPPER()
	RET()
}

// scaleColumns emits scaleColumnsAVX2: the scales of an int8 cache's rows
// applied to a block of scores or probabilities, row by row, 32 and then
// 8 columns a step and a masked tail.
func scaleColumns() {
	TEXT("scaleColumnsAVX2", NOSPLIT, "func(s []float32, lds, rows int, f []float32)")
	Pragma("noescape")
	Doc("scaleColumnsAVX2 sets s[r*lds+j] *= f[j] for r < rows, j < len(f); the Go caller checks the sizes.")
	sp := Load(Param("s").Base(), GP64())
	lds := Load(Param("lds"), GP64())
	SHLQ(U8(2), lds)
	rows := Load(Param("rows"), GP64())
	fp := Load(Param("f").Base(), GP64())
	n := Load(Param("f").Len(), GP64())
	TESTQ(rows, rows)
	JZ(LabelRef("end"))
	TESTQ(n, n)
	JZ(LabelRef("end"))
	// The mask of the n%8 last columns, the same for every row.
	rem := GP64()
	MOVQ(n, rem)
	ANDQ(U8(7), rem)
	mask := YMM()
	VXORPS(mask, mask, mask)
	JZ(LabelRef("row"))
	VMOVUPS(loadTailMaskMem(rem), mask)

	p := Mem{Base: GP64()}
	q := Mem{Base: GP64()}
	j := GP64()
	Label("row")
	MOVQ(sp, p.Base)
	MOVQ(fp, q.Base)
	MOVQ(n, j)

	Label("loop32")
	CMPQ(j, U8(32))
	JL(LabelRef("loop8"))
	for u := 0; u < 4; u++ {
		v := YMM()
		VMOVUPS(q.Offset(32*u), v)
		VMULPS(p.Offset(32*u), v, v)
		VMOVUPS(v, p.Offset(32*u))
	}
	ADDQ(U32(128), p.Base)
	ADDQ(U32(128), q.Base)
	SUBQ(U8(32), j)
	JMP(LabelRef("loop32"))

	Label("loop8")
	CMPQ(j, U8(8))
	JL(LabelRef("tail"))
	{
		v := YMM()
		VMOVUPS(q, v)
		VMULPS(p, v, v)
		VMOVUPS(v, p)
	}
	ADDQ(U8(32), p.Base)
	ADDQ(U8(32), q.Base)
	SUBQ(U8(8), j)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(j, j)
	JZ(LabelRef("next"))
	{
		v, w := YMM(), YMM()
		VMASKMOVPS(q, mask, v)
		VMASKMOVPS(p, mask, w)
		VMULPS(w, v, v)
		VMASKMOVPS(v, mask, p)
	}

	Label("next")
	ADDQ(lds, sp)
	DECQ(rows)
	JNZ(LabelRef("row"))

	Label("end")
	VZEROUPPER()
	RET()
}
