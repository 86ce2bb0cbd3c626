package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// maxKernel emits maxAVX2. VMAXPS does not propagate NaN (it returns its
// second source when either is NaN), so NaNs are tracked apart: nan[u] =
// unordered(nan[u], v) is all ones, itself a NaN, once any lane met a
// NaN, and stays so.
func maxKernel() {
	TEXT("maxAVX2", NOSPLIT, "func(x []float32) float32")
	Pragma("noescape")
	Doc("maxAVX2 returns the largest element of x, -Inf if x is empty, NaN if x holds a NaN.")
	p := Mem{Base: Load(Param("x").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	acc, nan := newYMMs(4), newYMMs(4)
	for u := range acc {
		VMOVUPS(negInf, acc[u])
		VXORPS(nan[u], nan[u], nan[u])
	}
	step := func(v VecVirtual, u int) {
		VMAXPS(v, acc[u], acc[u])
		VCMPPS(U8(3), v, nan[u], nan[u])
	}

	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop8"))
	for u := 0; u < 4; u++ {
		v := YMM()
		VMOVUPS(p.Offset(32*u), v)
		step(v, u)
	}
	ADDQ(U32(128), p.Base)
	SUBQ(U8(32), n)
	JMP(LabelRef("loop32"))

	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	v := YMM()
	VMOVUPS(p, v)
	step(v, 0)
	ADDQ(U8(32), p.Base)
	SUBQ(U8(8), n)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("reduce"))
	{
		mask := loadTailMask(n)
		v, inf := YMM(), YMM()
		VMASKMOVPS(p, mask, v)
		VMOVUPS(negInf, inf)
		VBLENDVPS(mask, v, inf, v) // masked-off lanes: -Inf
		step(v, 1)
	}

	Label("reduce")
	for u := 1; u < 4; u++ {
		VMAXPS(acc[u], acc[0], acc[0])
		VORPS(nan[u], nan[0], nan[0])
	}
	bits := GP32()
	VMOVMSKPS(nan[0], bits)
	res := reduceMax(acc[0])
	TESTL(bits, bits)
	JZ(LabelRef("ret"))
	VMOVSS(nanBit, res)
	Label("ret")
	Store(res, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

func scaleKernel() {
	TEXT("scaleAVX2", NOSPLIT, "func(x []float32, c float32)")
	Pragma("noescape")
	Doc("scaleAVX2 multiplies x by c in place.")
	p := Mem{Base: Load(Param("x").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	cx := Load(Param("c"), XMM())
	c := YMM()
	VBROADCASTSS(cx, c)

	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop8"))
	for u := 0; u < 4; u++ {
		v := YMM()
		VMULPS(p.Offset(32*u), c, v)
		VMOVUPS(v, p.Offset(32*u))
	}
	ADDQ(U32(128), p.Base)
	SUBQ(U8(32), n)
	JMP(LabelRef("loop32"))

	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	v := YMM()
	VMULPS(p, c, v)
	VMOVUPS(v, p)
	ADDQ(U8(32), p.Base)
	SUBQ(U8(8), n)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("end"))
	mask := loadTailMask(n)
	w := YMM()
	VMASKMOVPS(p, mask, w)
	VMULPS(w, c, w)
	VMASKMOVPS(w, mask, p)
	Label("end")
	VZEROUPPER()
	RET()
}

// dot emits dotAVX2 with four accumulators: two loads per FMA limit it
// to one FMA a cycle, and four chains cover the FMA latency.
func dot() {
	TEXT("dotAVX2", NOSPLIT, "func(x, y []float32) float32")
	Pragma("noescape")
	Doc("dotAVX2 returns the sum of x[i]·y[i]; len(y) >= len(x) (the Go caller checks).")
	x := Mem{Base: Load(Param("x").Base(), GP64())}
	y := Mem{Base: Load(Param("y").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	acc := newYMMs(4)
	for _, a := range acc {
		VXORPS(a, a, a)
	}

	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop8"))
	for u := 0; u < 4; u++ {
		v := YMM()
		VMOVUPS(x.Offset(32*u), v)
		VFMADD231PS(y.Offset(32*u), v, acc[u])
	}
	ADDQ(U32(128), x.Base)
	ADDQ(U32(128), y.Base)
	SUBQ(U8(32), n)
	JMP(LabelRef("loop32"))

	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	v := YMM()
	VMOVUPS(x, v)
	VFMADD231PS(y, v, acc[0])
	ADDQ(U8(32), x.Base)
	ADDQ(U8(32), y.Base)
	SUBQ(U8(8), n)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("reduce"))
	{
		mask := loadTailMask(n)
		v, w := YMM(), YMM()
		VMASKMOVPS(x, mask, v)
		VMASKMOVPS(y, mask, w)
		VFMADD231PS(w, v, acc[1])
	}

	Label("reduce")
	VADDPS(acc[1], acc[0], acc[0])
	VADDPS(acc[3], acc[2], acc[2])
	VADDPS(acc[2], acc[0], acc[0])
	Store(reduceAdd(acc[0]), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

func axpy() {
	TEXT("axpyAVX2", NOSPLIT, "func(a float32, x, y []float32)")
	Pragma("noescape")
	Doc("axpyAVX2 sets y[i] += a·x[i]; len(y) >= len(x) (the Go caller checks).")
	ax := Load(Param("a"), XMM())
	a := YMM()
	VBROADCASTSS(ax, a)
	x := Mem{Base: Load(Param("x").Base(), GP64())}
	y := Mem{Base: Load(Param("y").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())

	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop8"))
	for u := 0; u < 4; u++ {
		v := YMM()
		VMOVUPS(x.Offset(32*u), v)
		VFMADD213PS(y.Offset(32*u), a, v) // v = v·a + y
		VMOVUPS(v, y.Offset(32*u))
	}
	ADDQ(U32(128), x.Base)
	ADDQ(U32(128), y.Base)
	SUBQ(U8(32), n)
	JMP(LabelRef("loop32"))

	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	v := YMM()
	VMOVUPS(x, v)
	VFMADD213PS(y, a, v)
	VMOVUPS(v, y)
	ADDQ(U8(32), x.Base)
	ADDQ(U8(32), y.Base)
	SUBQ(U8(8), n)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("end"))
	mask := loadTailMask(n)
	v, w := YMM(), YMM()
	VMASKMOVPS(x, mask, v)
	VMASKMOVPS(y, mask, w)
	VFMADD213PS(w, a, v)
	VMASKMOVPS(v, mask, y)
	Label("end")
	VZEROUPPER()
	RET()
}

// prefetch emits prefetchT0: PREFETCHT0 for each line of [p, p+n), a
// request that retires at once, where a load of the line would hold the
// reorder buffer until the line arrives.
func prefetch() {
	TEXT("prefetchT0", NOSPLIT, "func(p *byte, n int)")
	Pragma("noescape")
	Doc("prefetchT0 asks for the cache lines of the n bytes at p.")
	p := Load(Param("p"), GP64())
	n := Load(Param("n"), GP64())
	end := GP64()
	LEAQ(Mem{Base: p, Index: n, Scale: 1}, end)
	// From the line p is in: an unaligned p would otherwise leave out
	// the last line.
	ANDQ(I32(-64), p)
	Label("prefetchLoop")
	CMPQ(p, end)
	JAE(LabelRef("prefetchDone"))
	PREFETCHT0(Mem{Base: p})
	ADDQ(U8(64), p)
	JMP(LabelRef("prefetchLoop"))
	Label("prefetchDone")
	RET()
}

// readSum emits readSumAVX2, the streaming read of MeasureReadGBps: each
// 32-byte load is added into one of 8 accumulators (FP add latency 3,
// two add pipes, two loads a cycle).
func readSum() {
	TEXT("readSumAVX2", NOSPLIT, "func(x []float32) float32")
	Pragma("noescape")
	Doc("readSumAVX2 returns the sum of x, added in an unspecified order.")
	p := Mem{Base: Load(Param("x").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	acc := newYMMs(8)
	for _, a := range acc {
		VXORPS(a, a, a)
	}

	Label("loop64")
	CMPQ(n, U8(64))
	JL(LabelRef("loop8"))
	for u := 0; u < 8; u++ {
		VADDPS(p.Offset(32*u), acc[u], acc[u])
	}
	ADDQ(U32(256), p.Base)
	SUBQ(U8(64), n)
	JMP(LabelRef("loop64"))

	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	VADDPS(p, acc[0], acc[0])
	ADDQ(U8(32), p.Base)
	SUBQ(U8(8), n)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("reduce"))
	{
		mask := loadTailMask(n)
		v := YMM()
		VMASKMOVPS(p, mask, v)
		VADDPS(v, acc[1], acc[1])
	}

	Label("reduce")
	for s := 4; s >= 1; s /= 2 {
		for u := 0; u < s; u++ {
			VADDPS(acc[u+s], acc[u], acc[u])
		}
	}
	Store(reduceAdd(acc[0]), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// peakChains is the number of independent FMA chains of fmaPeakAVX2:
// more than the FMA latency (4 cycles on the x86 cores of today) × FMA
// pipes (2).
const peakChains = 12

// fmaPeak emits fmaPeakAVX2: iters rounds of one VFMADD231PS on each of
// 12 accumulators, started at 1..12 so that no two chains are the same
// computation.
func fmaPeak() {
	TEXT("fmaPeakAVX2", NOSPLIT, "func(iters int) float32")
	Doc(
		"fmaPeakAVX2 runs iters rounds of 12 independent ymm FMAs",
		"(192 flops a round) and returns a sum of the results.",
	)
	n := Load(Param("iters"), GP64())
	acc := newYMMs(peakChains)
	VMOVUPS(one, acc[0])
	for i := 1; i < peakChains; i++ {
		VADDPS(one, acc[i-1], acc[i])
	}
	x, y := YMM(), YMM()
	VMOVUPS(expC[0], x) // 0.5
	VMOVUPS(expC[4], y) // about 0.0014: the sums stay normal floats
	TESTQ(n, n)
	JLE(LabelRef("reduce"))
	Label("loop")
	for _, a := range acc {
		VFMADD231PS(x, y, a)
	}
	DECQ(n)
	JNZ(LabelRef("loop"))

	Label("reduce")
	for i := 1; i < peakChains; i++ {
		VADDPS(acc[i], acc[0], acc[0])
	}
	Store(reduceAdd(acc[0]), ReturnIndex(0))
	VZEROUPPER()
	RET()
}
