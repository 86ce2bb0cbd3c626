package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// exp2Max is 128: t is clamped to it, so that every t from 127.5 up gives
// +Inf (exp2Lanes wants t ≤ 128). expMul declares it; expMul512 uses it.
var exp2Max Mem

// expMul emits expMulAVX2, the element-wise step of the attention
// backward pass: p[i] = exp(p[i]) by the exponential of the online
// softmax, 2^t with t = min(p[i]·log2 e, 128) (exp2Lanes), and g[i] *=
// p[i], the new p[i], one rounding. Four vectors a pass go through the
// stages of exp2Lanes together, each constant loaded once for the four;
// then single vectors, then a masked tail through the same code, so that
// a value gives the same bits wherever it lies in the slice.
func expMul() {
	exp2Max = vecConst("exp2Max", 128)

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

// expMul512 emits expMulAVX512: expMulAVX2 on zmm registers, lane for lane
// the same instructions (exp2Lanes512), so that every element equals the
// avx2 kernel's: four vectors a pass, then single vectors, then the last
// n%16 under an opmask.
func expMul512() {
	TEXT("expMulAVX512", NOSPLIT, "func(p, g []float32)")
	Pragma("noescape")
	Doc("expMulAVX512 is expMulAVX2 with AVX-512.")
	p := Mem{Base: Load(Param("p").Base(), GP64())}
	g := Mem{Base: Load(Param("g").Base(), GP64())}
	n := Load(Param("p").Len(), GP64())
	e := loadExp2Consts512(false)
	log2e, tmax := bcastConst(expLog2e), bcastConst(exp2Max)
	exps := func(ts []VecVirtual) {
		for _, t := range ts {
			VMULPS(log2e, t, t)
		}
		for _, t := range ts {
			VMINPS(t, tmax, t) // NaN stays NaN: VMINPS returns t when t is NaN
		}
		exp2Lanes512(ts, e, false)
	}

	Label("loop64")
	CMPQ(n, U8(64))
	JL(LabelRef("loop16"))
	{
		ts := newZMMs(4)
		for i, t := range ts {
			VMOVUPS(p.Offset(64*i), t)
		}
		exps(ts)
		for i, t := range ts {
			VMOVUPS(t, p.Offset(64*i))
			VMULPS(g.Offset(64*i), t, t)
			VMOVUPS(t, g.Offset(64*i))
		}
		ADDQ(U32(256), p.Base)
		ADDQ(U32(256), g.Base)
		SUBQ(U8(64), n)
		JMP(LabelRef("loop64"))
	}
	Label("loop16")
	CMPQ(n, U8(16))
	JL(LabelRef("tail"))
	{
		t := ZMM()
		VMOVUPS(p, t)
		exps([]VecVirtual{t})
		VMOVUPS(t, p)
		VMULPS(g, t, t)
		VMOVUPS(t, g)
		ADDQ(U8(64), p.Base)
		ADDQ(U8(64), g.Base)
		SUBQ(U8(16), n)
		JMP(LabelRef("loop16"))
	}
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("end"))
	{
		km := maskUpTo16(n)
		t, w := ZMM(), ZMM()
		VMOVUPS_Z(p, km, t)
		exps([]VecVirtual{t})
		VMOVUPS(t, km, p)
		VMOVUPS_Z(g, km, w)
		VMULPS(w, t, t)
		VMOVUPS(t, km, g)
	}
	Label("end")
	VZEROUPPER()
	RET()
}
