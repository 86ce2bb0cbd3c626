package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The AVX-512 kernels: the same algorithms as the AVX2 ones with 32 zmm
// registers of 16 lanes, opmask registers for the tails, and the bfloat16
// instructions of AVX512-BF16.
//
// The Go assembler does not know VDPBF16PS or VCVTNE2PS2BF16. The
// generator emits them as instructions of their own name, so that avo
// allocates their registers as for any other, and after avo has written
// the assembly, encodeBF16 replaces each by the BYTEs of its EVEX
// encoding, the instruction kept as a comment.

// vdpbf16ps emits VDPBF16PS src2, src1, dst (Go operand order): for each
// 32-bit lane i, dst[i] += src1.bf16[2i+1]·src2.bf16[2i+1] +
// src1.bf16[2i]·src2.bf16[2i], in float32.
func vdpbf16ps(src2, src1, dst VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VDPBF16PS",
		Operands: []Op{src2, src1, dst},
		Inputs:   []Op{src2, src1, dst},
		Outputs:  []Op{dst},
		ISA:      []string{"AVX512BF16"},
	})
}

// vcvtne2ps2bf16 emits VCVTNE2PS2BF16 lo, hi, dst (Go operand order):
// dst's 32 bfloat16 are lo's 16 float32 rounded to nearest even, then
// hi's (subnormal inputs count as 0).
func vcvtne2ps2bf16(lo, hi, dst VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VCVTNE2PS2BF16",
		Operands: []Op{lo, hi, dst},
		Inputs:   []Op{lo, hi},
		Outputs:  []Op{dst},
		ISA:      []string{"AVX512BF16"},
	})
}

// bf16Ops are the EVEX.512.W0 0F38 instructions encodeBF16 encodes: the
// prefix field pp and the opcode byte.
var bf16Ops = map[string]struct{ pp, op byte }{
	"VDPBF16PS":      {0b10, 0x52}, // F3
	"VCVTNE2PS2BF16": {0b11, 0x72}, // F2
	// VPDPWSSD is in the table only for the test of evex512: it has the
	// encoding of VDPBF16PS with the prefix 66 (pp = 01), and the Go
	// assembler knows it.
	"VPDPWSSD": {0b01, 0x52},
}

// evex512 returns the encoding of a 512-bit register-to-register EVEX
// instruction in map 0F38 with W0, no opmask and no broadcast: reg in
// ModRM.reg (the destination), vvvv the first source and rm the second,
// register numbers 0 … 31.
func evex512(pp, op byte, reg, vvvv, rm int) []byte {
	inv := func(v, bit int) byte { return byte(^(v >> bit) & 1) }
	p0 := inv(reg, 3)<<7 | inv(rm, 4)<<6 | inv(rm, 3)<<5 | inv(reg, 4)<<4 | 0b10
	p1 := byte(^vvvv&0xf)<<3 | 1<<2 | pp
	p2 := byte(0b10)<<5 | inv(vvvv, 4)<<3
	modrm := byte(0b11)<<6 | byte(reg&7)<<3 | byte(rm&7)
	return []byte{0x62, p0, p1, p2, op, modrm}
}

var bf16Line = regexp.MustCompile(`^\t(VDPBF16PS|VCVTNE2PS2BF16)\s+Z(\d+), Z(\d+), Z(\d+)$`)

// encodeBF16 replaces the lines of the instructions of bf16Ops in the
// assembly src by their encodings. It fails on such an instruction with
// operands other than three zmm registers.
func encodeBF16(src string) (string, error) {
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if _, ok := bf16Ops[f[0]]; !ok || f[0] == "VPDPWSSD" {
			continue
		}
		m := bf16Line.FindStringSubmatch(l)
		if m == nil {
			return "", fmt.Errorf("line %d: %q: only zmm register operands can be encoded", i+1, l)
		}
		var r [3]int
		for j := range r {
			r[j], _ = strconv.Atoi(m[2+j])
		}
		e := bf16Ops[m[1]]
		// Go order: rm, vvvv, reg.
		code := evex512(e.pp, e.op, r[2], r[1], r[0])
		bs := make([]string, len(code))
		for j, b := range code {
			bs[j] = fmt.Sprintf("BYTE $0x%02x", b)
		}
		lines[i] = fmt.Sprintf("\t%s // %s Z%d, Z%d, Z%d", strings.Join(bs, "; "), m[1], r[0], r[1], r[2])
	}
	return strings.Join(lines, "\n"), nil
}

// newZMMs returns n new zmm virtual registers.
func newZMMs(n int) []VecVirtual {
	v := make([]VecVirtual, n)
	for i := range v {
		v[i] = ZMM()
	}
	return v
}

// bcastConst returns a zmm register holding the float32 of a vector
// constant (its first lane) in all 16 lanes.
func bcastConst(c Mem) VecVirtual {
	z := ZMM()
	VBROADCASTSS(c, z)
	return z
}

// fmaPeak512 emits fmaPeakAVX512: fmaPeakAVX2's loop with zmm FMAs.
// FMAPeak counts PeakFlopsPerIter flops an iteration, those of 12 ymm
// FMAs, so a round of 12 zmm FMAs is two iterations; an odd iters ends
// with a round of 12 ymm FMAs.
func fmaPeak512() {
	TEXT("fmaPeakAVX512", NOSPLIT, "func(iters int) float32")
	Doc(
		"fmaPeakAVX512 runs iters/2 rounds of 12 independent zmm FMAs and, for an odd iters,",
		"a round of 12 ymm FMAs (192 flops an iteration), and returns a sum of the results.",
	)
	n := Load(Param("iters"), GP64())
	acc := newZMMs(peakChains)
	o := bcastConst(one)
	VMOVAPS(o, acc[0])
	for i := 1; i < peakChains; i++ {
		VADDPS(o, acc[i-1], acc[i])
	}
	x, y := bcastConst(expC[0]), bcastConst(expC[4])
	half := GP64()
	MOVQ(n, half)
	SARQ(U8(1), half)
	JLE(LabelRef("odd"))
	Label("loop")
	for _, a := range acc {
		VFMADD231PS(x, y, a)
	}
	DECQ(half)
	JNZ(LabelRef("loop"))
	Label("odd")
	TESTQ(U32(1), n)
	JZ(LabelRef("reduce"))
	for _, a := range acc {
		VFMADD231PS(x.AsY(), y.AsY(), a.AsY())
	}
	Label("reduce")
	for i := 1; i < peakChains; i++ {
		VADDPS(acc[i], acc[0], acc[0])
	}
	Store(reduceAdd(fold512(acc[0])), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// fold512 adds the upper 256 bits of z to its lower ones and returns
// them as a ymm register.
func fold512(z VecVirtual) VecVirtual {
	hi := YMM()
	VEXTRACTF32X8(U8(1), z, hi)
	y := z.AsY()
	VADDPS(hi, y, y)
	return y.(VecVirtual)
}
