package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The exp constants; generic.go's expf uses the same values.
var (
	expLog2e Mem // log2(e)
	expLn2Hi Mem // ln 2 rounded to 16 bits: n·ln2Hi is exact for |n| < 2^8
	expLn2Lo Mem // ln 2 - ln2Hi
	expC     [6]Mem
	expLo    Mem // below this, exp(x) < 2^-126: the result is 0
	expHi    Mem // above this, exp(x) > MaxFloat32: the result is +Inf
)

func declareExpConsts() {
	expLog2e = vecConst("expLog2e", float32(math.Log2E))
	expLn2Hi = vecConst("expLn2Hi", 0.693145751953125)
	expLn2Lo = vecConst("expLn2Lo", 1.428606765330187045e-06)
	// exp(r) ≈ 1 + r + r²·(c0 + c1·r + … + c5·r⁵) on |r| ≤ ln2/2 (SLEEF's
	// expf coefficients, about 1 ulp).
	coef := [6]float32{
		0.5,
		0.166666671633720397949219,
		0.0416664853692054748535156,
		0.00833336077630519866943359,
		0.00139304355252534151077271,
		0.000198527617612853646278381,
	}
	names := [6]string{"expC0", "expC1", "expC2", "expC3", "expC4", "expC5"}
	for i, c := range coef {
		expC[i] = vecConst(names[i], c)
	}
	expLo = vecConst("expLo", math.Float32frombits(0xc2aeac4f)) // -87.33654
	expHi = vecConst("expHi", math.Float32frombits(0x42b17217)) // 88.72283
}

// expVec returns exp(x) lane by lane; x is not changed.
//
// n = round(x·log2 e), r = x - n·ln 2 in two parts (Cody–Waite), so
// |r| ≤ ln2/2 and exp(x) = 2^n·exp(r). The polynomial gives exp(r) in
// [0.70, 1.42]; adding n to its exponent field multiplies by 2^n exactly
// whenever the result is a normal float, which holds for all x in
// [expLo, expHi] (at both ends the true result is more than 30 ulp inside
// the normal range, far more than the polynomial's error). Outside it,
// compares on x pick 0 or +Inf, so whatever the integer add made of a
// huge or infinite x is discarded. A NaN x fails both compares and
// stays NaN through the arithmetic (its n converts to 0x80000000, which
// shifts to 0).
func expVec(x VecVirtual) VecVirtual {
	t := YMM()
	VMULPS(expLog2e, x, t)
	VROUNDPS(U8(0), t, t) // to nearest, ties to even
	r := YMM()
	VMOVAPS(x, r)
	VFNMADD231PS(expLn2Hi, t, r) // r = x - n·ln2Hi, exact
	VFNMADD231PS(expLn2Lo, t, r) // r -= n·ln2Lo
	p := YMM()
	VMOVUPS(expC[5], p)
	for i := 4; i >= 0; i-- {
		VFMADD213PS(expC[i], r, p) // p = p·r + c[i]
	}
	r2 := YMM()
	VMULPS(r, r, r2)
	VFMADD213PS(r, r2, p) // p = p·r² + r
	VADDPS(one, p, p)
	VCVTTPS2DQ(t, t)
	VPSLLD(U8(23), t, t)
	VPADDD(t, p, p) // p·2^n
	m := YMM()
	VCMPPS(U8(0x11), expLo, x, m) // x < lo, ordered
	VANDNPS(p, m, p)
	VCMPPS(U8(0x1e), expHi, x, m) // x > hi, ordered
	VBLENDVPS(m, posInf, p, p)
	return p
}

// expLoop emits the loop shared by expSumAVX2 and expAVX2: for each
// 8-lane group of src, y = exp(src - shift) (no subtraction when shift is
// nil) is stored to dst and, when sum is true, added to a sum. The tail
// of len%8 elements goes through the same code with masked loads and
// stores. It returns the sum register (nil when sum is false).
//
// post, when not nil, turns each group's exponentials e of the inputs x
// into what is stored (and summed) instead.
func expLoop(dst, src Mem, n Register, shift VecVirtual, sum bool, post func(x, e VecVirtual) VecVirtual) VecVirtual {
	var sums []VecVirtual
	if sum {
		sums = newYMMs(2)
		for _, s := range sums {
			VXORPS(s, s, s)
		}
	}
	step := func(v VecVirtual, acc int) VecVirtual {
		if shift != nil {
			VSUBPS(shift, v, v)
		}
		e := expVec(v)
		if post != nil {
			e = post(v, e)
		}
		if sum {
			VADDPS(e, sums[acc], sums[acc])
		}
		return e
	}

	Label("loop16")
	CMPQ(n, U8(16))
	JL(LabelRef("loop8"))
	{
		v0, v1 := YMM(), YMM()
		VMOVUPS(src, v0)
		VMOVUPS(src.Offset(32), v1)
		e0 := step(v0, 0)
		e1 := step(v1, 1)
		VMOVUPS(e0, dst)
		VMOVUPS(e1, dst.Offset(32))
		ADDQ(U8(64), src.Base)
		if dst.Base != src.Base {
			ADDQ(U8(64), dst.Base)
		}
		SUBQ(U8(16), n)
		JMP(LabelRef("loop16"))
	}
	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	{
		v := YMM()
		VMOVUPS(src, v)
		e := step(v, 0)
		VMOVUPS(e, dst)
		ADDQ(U8(32), src.Base)
		if dst.Base != src.Base {
			ADDQ(U8(32), dst.Base)
		}
		SUBQ(U8(8), n)
	}
	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("end"))
	{
		mask := loadTailMask(n)
		v := YMM()
		VMASKMOVPS(src, mask, v)
		if shift != nil {
			VSUBPS(shift, v, v)
		}
		e := expVec(v)
		if post != nil {
			e = post(v, e)
		}
		VMASKMOVPS(e, mask, dst)
		if sum {
			// The masked-off lanes hold exp(0 - shift): drop them.
			VANDPS(mask, e, e)
			VADDPS(e, sums[0], sums[0])
		}
	}
	Label("end")
	if !sum {
		return nil
	}
	VADDPS(sums[1], sums[0], sums[0])
	return sums[0]
}

func expSum() {
	TEXT("expSumAVX2", NOSPLIT, "func(x []float32, shift float32) float32")
	Pragma("noescape")
	Doc("expSumAVX2 sets x[i] = exp(x[i]-shift) and returns their sum (see ExpSum).")
	p := Mem{Base: Load(Param("x").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	sx := Load(Param("shift"), XMM())
	shift := YMM()
	VBROADCASTSS(sx, shift)
	s := expLoop(p, p, n, shift, true, nil)
	Store(reduceAdd(s), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

func exp() {
	TEXT("expAVX2", NOSPLIT, "func(dst, x []float32)")
	Pragma("noescape")
	Doc("expAVX2 sets dst[i] = exp(x[i]) for i < len(x) (see Exp).")
	d := Mem{Base: Load(Param("dst").Base(), GP64())}
	x := Mem{Base: Load(Param("x").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	expLoop(d, x, n, nil, false, nil)
	VZEROUPPER()
	RET()
}

// elu1 emits elu1AVX2: exp's loop with each result where x ≥ 0 (its sign
// bit clear) replaced by x+1.
func elu1() {
	TEXT("elu1AVX2", NOSPLIT, "func(dst, x []float32)")
	Pragma("noescape")
	Doc("elu1AVX2 sets dst[i] = elu(x[i])+1 for i < len(x) (see ELU1).")
	d := Mem{Base: Load(Param("dst").Base(), GP64())}
	x := Mem{Base: Load(Param("x").Base(), GP64())}
	n := Load(Param("x").Len(), GP64())
	expLoop(d, x, n, nil, false, func(x, e VecVirtual) VecVirtual {
		t := YMM()
		VADDPS(one, x, t)
		VBLENDVPS(x, e, t, t) // e where x's sign bit is set
		return t
	})
	VZEROUPPER()
	RET()
}
