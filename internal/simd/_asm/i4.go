package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The 4-bit codes of a packed row are read in place by the DotRows and
// Gemm generators with the element types below, so that no unpacked copy
// is written and read back: a half of a row (the low nibbles hold
// channels [0, pw), the high ones [pw, 2·pw)) is a row of pw bytes whose
// values are one nibble of each. Each load zero-extends 8 (or 16) bytes
// to 32-bit lanes, like the int8 kernels' VPMOVSXBD, and keeps one nibble
// with shifts, which need no constant in a register: the low nibble is
// shifted to the top and back, the high one down by 4. The int32 codes
// 0…15 then convert to float32 exactly.
var (
	kU4Lo = kElem{1, func(m Mem, v VecVirtual) {
		VPMOVZXBD(m, v)
		VPSLLD(U8(28), v, v)
		VPSRLD(U8(28), v, v)
		VCVTDQ2PS(v, v)
	}, false}
	kU4Hi = kElem{1, func(m Mem, v VecVirtual) {
		VPMOVZXBD(m, v)
		VPSRLD(U8(4), v, v)
		VCVTDQ2PS(v, v)
	}, false}
	kU4Lox16 = kElem512{1, func(m Mem, mask Op, v VecVirtual) {
		loadU8x16(m, mask, v)
		VPSLLD(U8(28), v, v)
		VPSRLD(U8(28), v, v)
		VCVTDQ2PS(v, v)
	}}
	kU4Hix16 = kElem512{1, func(m Mem, mask Op, v VecVirtual) {
		loadU8x16(m, mask, v)
		VPSRLD(U8(4), v, v)
		VCVTDQ2PS(v, v)
	}}
)

// loadU8x16 zero-extends 16 bytes at m (those of mask when it is not nil)
// to the 32-bit lanes of v.
func loadU8x16(m Mem, mask Op, v VecVirtual) {
	if mask == nil {
		VPMOVZXBD(m, v)
		return
	}
	x := XMM()
	VMOVDQU8_Z(m, mask, x)
	VPMOVZXBD(x, v)
}

// u4Halves are the two halves of a packed row, as the kernels' names, the
// element types and the doc comments call them.
var u4Halves = []struct {
	half    string
	ke      kElem
	ke512   kElem512
	nibbles string
}{{"Lo", kU4Lo, kU4Lox16, "low"}, {"Hi", kU4Hi, kU4Hix16, "high"}}

// dotRowsU4 emits the DotRowsU4 kernels: dotRowsU4LoAVX2, dotRowsU4HiAVX2
// and their AVX-512 forms. (With the prefetch hint of DotRowsPF, the
// next block's rows passed to the first half's call, and GemmU4 given a
// share of the next values each, the decode step measured no faster.)
func dotRowsU4() {
	for _, k := range u4Halves {
		name := "dotRowsU4" + k.half
		dotRowsKernel(name+"AVX2", "[]uint8", k.ke, false,
			name+"AVX2 is dotRowsAVX2 with k the "+k.nibbles+" nibbles of bytes, read in place",
			"(see DotRowsU4); the Go caller checks the sizes.",
		)
		dotRows512Kernel(name+"AVX512", "[]uint8", k.ke512, false,
			name+"AVX512 is "+name+"AVX2 with AVX-512; the Go caller checks the sizes.")
	}
}

// gemmU4 emits the GemmU4 kernels: gemmU4LoAVX2, gemmU4HiAVX2 and their
// AVX-512 forms.
func gemmU4() {
	for _, k := range u4Halves {
		name := "gemmU4" + k.half
		gemm16KernelOf(name+"AVX2", "[]uint8", k.ke, false,
			name+"AVX2 computes C = A·B or C += A·B with B the "+k.nibbles+" nibbles of bytes,",
			"read in place (see GemmU4). n must be a multiple of 8; the slices must be",
			"long enough (the Go caller checks).",
		)
		gemm512KernelOf(name+"AVX512", "[]uint8", k.ke512, true,
			name+"AVX512 is "+name+"AVX2 with AVX-512. n must be a multiple of 8;",
			"the slices must be long enough (the Go caller checks).",
		)
	}
}
