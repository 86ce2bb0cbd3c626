package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// unpack4 emits unpack4AVX2, which widens rows of packed 4-bit codes
// (see Unpack4) to a byte a code: per 32 bytes of a row, one load, a
// 16-bit shift by 4 (which brings every byte's high nibble down; the
// bits it brings in from the next byte are masked off) and two masks
// with 0x0F; rows are a whole number of 8-byte words, the last ones
// done 8 bytes at a time in xmm registers.
func unpack4() {
	TEXT("unpack4AVX2", NOSPLIT, "func(dst, src []uint8, rows, pw int)")
	Pragma("noescape")
	Doc("unpack4AVX2 is Unpack4; the Go caller checks the sizes (pw a positive multiple of 8).")
	d := Mem{Base: Load(Param("dst").Base(), GP64())}
	s := Mem{Base: Load(Param("src").Base(), GP64())}
	rows := Load(Param("rows"), GP64())
	pw := Load(Param("pw"), GP64())
	hi := Mem{Base: GP64()}
	n8 := GP64() // bytes of the row left

	t := GP32()
	MOVL(U32(0x0F0F0F0F), t)
	mask := YMM()
	VMOVD(t, mask.AsX())
	VPBROADCASTD(mask.AsX(), mask)

	Label("row")
	TESTQ(rows, rows)
	JZ(LabelRef("end"))
	MOVQ(pw, n8)
	LEAQ(Mem{Base: d.Base, Index: pw, Scale: 1}, hi.Base)

	// step widens n bytes of the row: mov loads and stores them, x and
	// y hold the low and high nibbles, mask is 0x0F in their width.
	step := func(n int, mov func(Op, Op), x, y, mask Op) {
		mov(s, x)
		VPSRLW(U8(4), x, y)
		VPAND(mask, x, x)
		VPAND(mask, y, y)
		mov(x, d)
		mov(y, hi)
		for _, r := range []Register{s.Base, d.Base, hi.Base} {
			ADDQ(U8(n), r)
		}
		SUBQ(U8(n), n8)
	}

	Label("loop32")
	CMPQ(n8, U8(32))
	JL(LabelRef("loop8"))
	step(32, func(a, b Op) { VMOVDQU(a, b) }, YMM(), YMM(), mask)
	JMP(LabelRef("loop32"))

	Label("loop8")
	TESTQ(n8, n8)
	JZ(LabelRef("next"))
	step(8, func(a, b Op) { VMOVQ(a, b) }, XMM(), XMM(), mask.AsX())
	JMP(LabelRef("loop8"))

	Label("next")
	// The high nibbles ended where the next row starts.
	MOVQ(hi.Base, d.Base)
	DECQ(rows)
	JMP(LabelRef("row"))

	Label("end")
	VZEROUPPER()
	RET()
}
