package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The exp kernels of the avx512 family: expVec's arithmetic on 16 lanes,
// lane for lane the same instructions (VRNDSCALEPS for VROUNDPS, opmasks
// for the blends), so that every element equals the avx2 kernels'; only
// the sums of ExpSum add in another order.

func exp512() {
	TEXT("expSumAVX512", NOSPLIT, "func(x []float32, shift float32) float32")
	Pragma("noescape")
	Doc("expSumAVX512 is expSumAVX2 with AVX-512.")
	p := Mem{Base: Load(Param("x").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	sx := Load(Param("shift"), XMM())
	shift := ZMM()
	VBROADCASTSS(sx, shift)
	s := expLoop512(p, p, n, shift, true, nil)
	Store(reduce16(s, false), ReturnIndex(0))
	VZEROUPPER()
	RET()

	TEXT("expAVX512", NOSPLIT, "func(dst, x []float32)")
	Pragma("noescape")
	Doc("expAVX512 is expAVX2 with AVX-512.")
	d := Mem{Base: Load(Param("dst").Base(), GP64())}
	x := Mem{Base: Load(Param("x").Base(), GP64())}
	n = Load(Param("x").Len(), GP64())
	expLoop512(d, x, n, nil, false, nil)
	VZEROUPPER()
	RET()

	TEXT("elu1AVX512", NOSPLIT, "func(dst, x []float32)")
	Pragma("noescape")
	Doc("elu1AVX512 is elu1AVX2 with AVX-512.")
	d = Mem{Base: Load(Param("dst").Base(), GP64())}
	x = Mem{Base: Load(Param("x").Base(), GP64())}
	n = Load(Param("x").Len(), GP64())
	expLoop512(d, x, n, nil, false, func(x, e VecVirtual) VecVirtual {
		neg := K()
		VPMOVD2M(x, neg) // the sign bits
		t := ZMM()
		VADDPS_BCST(one, x, t)
		VBLENDMPS(e, t, neg, t)
		return t
	})
	VZEROUPPER()
	RET()
}

// expVec512 is expVec on a zmm register.
func expVec512(x VecVirtual) VecVirtual {
	t := ZMM()
	VMULPS_BCST(expLog2e, x, t)
	VRNDSCALEPS(U8(0), t, t) // to nearest, ties to even
	r := ZMM()
	VMOVAPS(x, r)
	VFNMADD231PS_BCST(expLn2Hi, t, r) // r = x - n·ln2Hi, exact
	VFNMADD231PS_BCST(expLn2Lo, t, r) // r -= n·ln2Lo
	p := ZMM()
	VBROADCASTSS(expC[5], p)
	for i := 4; i >= 0; i-- {
		VFMADD213PS_BCST(expC[i], r, p) // p = p·r + c[i]
	}
	r2 := ZMM()
	VMULPS(r, r, r2)
	VFMADD213PS(r, r2, p) // p = p·r² + r
	VADDPS_BCST(one, p, p)
	VCVTTPS2DQ(t, t)
	VPSLLD(U8(23), t, t)
	VPADDD(t, p, p) // p·2^n
	lo, hi := K(), K()
	VCMPPS_BCST(U8(0x11), expLo, x, lo) // x < lo, ordered
	VCMPPS_BCST(U8(0x1e), expHi, x, hi) // x > hi, ordered
	z, inf := ZMM(), ZMM()
	VPXORD(z, z, z)
	VBROADCASTSS(posInf, inf)
	VBLENDMPS(z, p, lo, p)
	VBLENDMPS(inf, p, hi, p)
	return p
}

// expLoop512 is expLoop with zmm registers: 32 values an iteration in
// two chains, then 16, then the last n%16 under a mask.
func expLoop512(dst, src Mem, n Register, shift VecVirtual, sum bool, post func(x, e VecVirtual) VecVirtual) VecVirtual {
	var sums []VecVirtual
	if sum {
		sums = newZMMs(2)
		for _, s := range sums {
			VPXORD(s, s, s)
		}
	}
	step := func(v VecVirtual, acc int) VecVirtual {
		if shift != nil {
			VSUBPS(shift, v, v)
		}
		e := expVec512(v)
		if post != nil {
			e = post(v, e)
		}
		if sum {
			VADDPS(e, sums[acc], sums[acc])
		}
		return e
	}
	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop16"))
	{
		v0, v1 := ZMM(), ZMM()
		VMOVUPS(src, v0)
		VMOVUPS(src.Offset(64), v1)
		e0 := step(v0, 0)
		e1 := step(v1, 1)
		VMOVUPS(e0, dst)
		VMOVUPS(e1, dst.Offset(64))
		ADDQ(U8(128), src.Base)
		if dst.Base != src.Base {
			ADDQ(U8(128), dst.Base)
		}
		SUBQ(U8(32), n)
		JMP(LabelRef("loop32"))
	}
	Label("loop16")
	CMPQ(n, U8(16))
	JL(LabelRef("tail"))
	{
		v := ZMM()
		VMOVUPS(src, v)
		e := step(v, 0)
		VMOVUPS(e, dst)
		ADDQ(U8(64), src.Base)
		if dst.Base != src.Base {
			ADDQ(U8(64), dst.Base)
		}
		SUBQ(U8(16), n)
	}
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("end"))
	{
		km := maskUpTo16(n)
		v := ZMM()
		VMOVUPS_Z(src, km, v)
		if shift != nil {
			VSUBPS(shift, v, v)
		}
		e := expVec512(v)
		if post != nil {
			e = post(v, e)
		}
		VMOVUPS(e, km, dst)
		if sum {
			// The masked-off lanes hold exp(0 - shift): add the others.
			VADDPS(e, sums[0], km, sums[0])
		}
	}
	Label("end")
	if !sum {
		return nil
	}
	VADDPS(sums[1], sums[0], sums[0])
	return sums[0]
}
