package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// expMul emits expMulAVX2, the element-wise step of the attention
// backward pass: p[i] = exp(p[i]) by the exponential of the online
// softmax, 2^t with t = min(p[i]·log2 e, 128) (exp2Lanes), and g[i] *=
// p[i], the new p[i], one rounding. Four vectors a pass go through the
// stages of exp2Lanes together, each constant loaded once for the four;
// then single vectors, then a masked tail through the same code, so that
// a value gives the same bits wherever it lies in the slice.
func expMul() {
	// 128: t is clamped to it, so that every t from 127.5 up gives +Inf
	// (exp2Lanes wants t ≤ 128).
	exp2Max := vecConst("exp2Max", 128)

	TEXT("expMulAVX2", NOSPLIT, "func(p, g []float32)")
	Pragma("noescape")
	Doc("expMulAVX2 sets p[i] = exp(p[i]) and g[i] *= p[i] for i < len(p); len(g) >= len(p) (see ExpMul).")
	p := Mem{Base: Load(Param("p").Base(), GP64())}
	g := Mem{Base: Load(Param("g").Base(), GP64())}
	n := Load(Param("p").Len(), GP64())
	clamp := YMM()
	VMOVUPS(exp2Min, clamp)

	// exps replaces the vectors ts by their exponentials.
	exps := func(ts []VecVirtual) {
		c := YMM()
		VMOVUPS(expLog2e, c)
		for _, t := range ts {
			VMULPS(c, t, t)
		}
		VMOVUPS(exp2Max, c)
		for _, t := range ts {
			VMINPS(t, c, t) // NaN stays NaN: VMINPS returns t when t is NaN
		}
		exp2Lanes(ts, clamp)
	}

	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop8"))
	{
		ts := newYMMs(4)
		for i, t := range ts {
			VMOVUPS(p.Offset(32*i), t)
		}
		exps(ts)
		for i, t := range ts {
			VMOVUPS(t, p.Offset(32*i))
			VMULPS(g.Offset(32*i), t, t)
			VMOVUPS(t, g.Offset(32*i))
		}
		ADDQ(U8(128), p.Base)
		ADDQ(U8(128), g.Base)
		SUBQ(U8(32), n)
		JMP(LabelRef("loop32"))
	}
	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	{
		t := YMM()
		VMOVUPS(p, t)
		exps([]VecVirtual{t})
		VMOVUPS(t, p)
		VMULPS(g, t, t)
		VMOVUPS(t, g)
		ADDQ(U8(32), p.Base)
		ADDQ(U8(32), g.Base)
		SUBQ(U8(8), n)
		JMP(LabelRef("loop8"))
	}
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("end"))
	{
		mask := loadTailMask(n)
		t, w := YMM(), YMM()
		VMASKMOVPS(p, mask, t)
		exps([]VecVirtual{t})
		VMASKMOVPS(t, mask, p)
		VMASKMOVPS(g, mask, w)
		VMULPS(w, t, t)
		VMASKMOVPS(t, mask, g)
	}
	Label("end")
	VZEROUPPER()
	RET()
}
