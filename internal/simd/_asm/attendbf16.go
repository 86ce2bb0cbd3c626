package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// attendTilesAVX512BF16 is attendTilesAMX for CPUs with AVX512-BF16 and
// no AMX: the same contract (simd.AttendAMX) on the same packed
// operands, with the products done by VDPBF16PS in zmm registers instead
// of TDPBF16PS on the tiles. The layouts of the tiles suit VDPBF16PS as
// they are: a line of qb (or of pb) is one zmm of 16 pairs, one pair a
// query, and a pair of a key's columns (or of a column's keys in Vᵀ) is
// one 32-bit broadcast. With the vector units doing the products as well
// as the softmax there is nothing to overlap, so each block runs in
// order: its logits, the softmax's three phases of attendTilesAMX (the
// same code), and its product with the values.
//
// Register blocks: 8 keys × 2 panels for the logits (16 accumulators; a
// step of a pair of columns loads 2 lines of qb and broadcasts 8 pairs
// of K for 16 VDPBF16PS) and 8 columns × 2 panels for the values (2
// lines of pb and 8 pairs of Vᵀ for 16). Sixteen chains of a latency of
// a few cycles keep two VDPBF16PS pipes busy.
func attendBF16DP() {
	TEXT("attendTilesAVX512BF16", 0, "func(npp, nfull, nblk, dp int, qb, kb, vb []uint16, st []float32, pb []uint16, lim []int32, m, l, acc []float32, c float32)")
	Pragma("noescape")
	Doc(
		"attendTilesAVX512BF16 is attendTilesAMX with VDPBF16PS in zmm registers for the",
		"products (see AttendAMX). The slices must be long enough (the Go caller checks).",
	)
	nblk := Load(Param("nblk"), GP64())
	TESTQ(nblk, nblk)
	JZ(LabelRef("done"))
	a := amxFrame{vector: true}
	a.blk = AllocLocal(8)
	a.f, a.grow, a.sum = AllocLocal(4*64), AllocLocal(4*8), AllocLocal(4*64)
	f := dpFrame{pp: AllocLocal(8), g: AllocLocal(8), base: AllocLocal(8), st: AllocLocal(8)}
	{
		z := GP64()
		XORQ(z, z)
		MOVQ(z, a.blk)
	}
	Label("block")
	for _, phase := range []func(Register){
		f.logits,
		a.maxima,
		a.exponentials,
		func(Register) { a.rescale() },
		f.values,
	} {
		b := GP64()
		MOVQ(a.blk, b)
		phase(b)
	}
	a.nextBlock()
	Label("done")
	VZEROUPPER()
	RET()
}

// dpFrame holds the loop state of attendTilesAVX512BF16's products that
// does not stay in registers: the pair of panels, the group of keys (or
// columns), and two pointers.
type dpFrame struct {
	pp, g, base, st Mem
}

// blockBytes returns a register with the bytes of a block of kb or vb
// (amxKeys keys of dp bfloat16) times b.
func blockBytes(b Register) Register {
	t := GP64()
	MOVQ(addr(Param("dp")), t)
	SHLQ(U8(amxKeysLog+1), t)
	IMULQ(b, t)
	return t
}

// logits emits Sᵀ = K·Qᵀ of block b (a register) for every panel, into
// the half of st of b's parity: for each pair of panels and each group of
// 8 keys, 16 accumulators through the dp/32 chunks of qb, 16 pairs of
// columns a chunk.
// loop emits a product of block b (a register) over every pair of
// panels and, inside, every group of its register block, body emitting
// a group's work, with base the block of the operand named (kb or vb)
// and st the half of st (or of pb, with pb set) of b's parity. last
// compares the next group's number (a register) with the number of
// groups.
func (f dpFrame) loop(pre, operand string, pb bool, b Register, last func(g Register), body func()) {
	{
		x := blockBytes(b)
		ADDQ(addr(Param(operand).Base()), x)
		MOVQ(x, f.base)
		MOVQ(stHalf(b, pb), f.st)
		z := GP64()
		XORQ(z, z)
		MOVQ(z, f.pp)
	}
	Label(pre + "pp")
	{
		z := GP64()
		XORQ(z, z)
		MOVQ(z, f.g)
	}
	Label(pre + "group")
	body()
	{
		g := GP64()
		MOVQ(f.g, g)
		INCQ(g)
		MOVQ(g, f.g)
		last(g)
		JL(LabelRef(pre + "group"))
	}
	{
		pp := GP64()
		MOVQ(f.pp, pp)
		INCQ(pp)
		MOVQ(pp, f.pp)
		CMPQ(pp, addr(Param("npp")))
		JL(LabelRef(pre + "pp"))
	}
}

func (f dpFrame) logits(b Register) {
	f.loop("l", "kb", false, b, func(g Register) { CMPQ(g, U8(amxKeys/8)) }, f.logitsGroup)
}

// logitsGroup emits the logits of one group of 8 keys and a pair of
// panels.
func (f dpFrame) logitsGroup() {
	acc := [8][2]VecVirtual{}
	for j := range acc {
		for x := range acc[j] {
			acc[j][x] = ZMM()
			VXORPS(acc[j][x], acc[j][x], acc[j][x])
		}
	}
	{
		// Keys 8g … 8g+7 of the block: rows k0, k0+rb, k0+2rb, k3,
		// k0+4rb, k5, k5+rb, k5+2rb.
		rb, k0, k3, k5, q, ch := GP64(), GP64(), GP64(), GP64(), GP64(), GP64()
		MOVQ(addr(Param("dp")), rb)
		SHLQ(U8(1), rb) // bytes a key
		MOVQ(f.g, k0)
		IMULQ(rb, k0)
		SHLQ(U8(3), k0)
		ADDQ(f.base, k0)
		LEAQ(Mem{Base: k0, Index: rb, Scale: 2}, k3)
		ADDQ(rb, k3)
		LEAQ(Mem{Base: k0, Index: rb, Scale: 4}, k5)
		ADDQ(rb, k5)
		MOVQ(f.pp, q)
		SHLQ(U8(11), q) // 2 panels of 1 KiB
		ADDQ(addr(Param("qb").Base()), q)
		MOVQ(addr(Param("dp")), ch)
		SHRQ(U8(5), ch)
		rows := []Mem{
			{Base: k0}, {Base: k0, Index: rb, Scale: 1}, {Base: k0, Index: rb, Scale: 2}, {Base: k3},
			{Base: k0, Index: rb, Scale: 4}, {Base: k5}, {Base: k5, Index: rb, Scale: 1}, {Base: k5, Index: rb, Scale: 2},
		}
		Label("lchunk")
		for i := range 16 {
			q0, q1 := ZMM(), ZMM()
			VMOVUPS(Mem{Base: q, Disp: 64 * i}, q0)
			VMOVUPS(Mem{Base: q, Disp: 1024 + 64*i}, q1)
			for j, r := range rows {
				kv := ZMM()
				r.Disp = 4 * i
				VPBROADCASTD(r, kv)
				vdpbf16ps(kv, q0, acc[j][0])
				vdpbf16ps(kv, q1, acc[j][1])
			}
		}
		ADDQ(U8(64), k0) // the next 32 columns
		ADDQ(U8(64), k3)
		ADDQ(U8(64), k5)
		ADDQ(U32(4096), q) // 4 panels of 1 KiB a chunk
		DECQ(ch)
		JNZ(LabelRef("lchunk"))
	}
	{
		s, g := GP64(), GP64()
		MOVQ(f.g, g)
		SHLQ(U8(9), g) // 8 keys of 64 bytes
		MOVQ(f.pp, s)
		SHLQ(U8(amxKeysLog+7), s) // 2 panels of amxKeys keys
		ADDQ(g, s)
		ADDQ(f.st, s)
		for j := range acc {
			VMOVUPS(acc[j][0], Mem{Base: s, Disp: 64 * j})
			VMOVUPS(acc[j][1], Mem{Base: s, Disp: amxKeys*64 + 64*j})
		}
	}
}

// values emits Oᵀ += Vᵀ·Pᵀ of block b (a register) for every panel: for
// each pair of panels and each group of 8 columns, 16 accumulators loaded
// from acc, through the amxKeys/2 pairs of keys of pb, and stored back.
func (f dpFrame) values(b Register) {
	last := func(g Register) {
		t := GP64()
		MOVQ(addr(Param("dp")), t)
		SHRQ(U8(3), t)
		CMPQ(g, t)
	}
	f.loop("v", "vb", true, b, last, f.valuesGroup)
}

// valuesGroup emits the values of one group of 8 columns and a pair of
// panels.
func (f dpFrame) valuesGroup() {
	{
		a0, a1, p, v, n, t := GP64(), GP64(), GP64(), GP64(), GP64(), GP64()
		// The accumulator's panels 2pp and 2pp+1 (dp lines of 64 bytes
		// each), at the group's 8 columns.
		MOVQ(addr(Param("dp")), t)
		SHLQ(U8(6), t) // bytes a panel of acc
		MOVQ(f.pp, a0)
		IMULQ(t, a0)
		SHLQ(U8(1), a0)
		ADDQ(addr(Param("acc").Base()), a0)
		MOVQ(f.g, n)
		SHLQ(U8(9), n) // 8 lines
		ADDQ(n, a0)
		LEAQ(Mem{Base: a0, Index: t, Scale: 1}, a1)
		acc := [8][2]VecVirtual{}
		for c := range acc {
			acc[c][0], acc[c][1] = ZMM(), ZMM()
			VMOVUPS(Mem{Base: a0, Disp: 64 * c}, acc[c][0])
			VMOVUPS(Mem{Base: a1, Disp: 64 * c}, acc[c][1])
		}
		// Pᵀ's panels 2pp and 2pp+1 (amxKeys/2 lines of 64 bytes each)
		// and the group's 8 rows of Vᵀ (amxKeys bfloat16 each).
		MOVQ(f.pp, p)
		SHLQ(U8(amxKeysLog+6), p) // 2 panels of amxKeys/2 lines
		ADDQ(f.st, p)
		MOVQ(f.g, v)
		SHLQ(U8(amxKeysLog+4), v) // 8 rows of amxKeys bfloat16
		ADDQ(f.base, v)
		MOVQ(U32(amxKeys/8), n) // 4 pairs of keys an iteration
		Label("vkeys")
		for u := range 4 {
			p0, p1 := ZMM(), ZMM()
			VMOVUPS(Mem{Base: p, Disp: 64 * u}, p0)
			VMOVUPS(Mem{Base: p, Disp: amxKeys*32 + 64*u}, p1)
			for c := range acc {
				vv := ZMM()
				VPBROADCASTD(Mem{Base: v, Disp: amxKeys*2*c + 4*u}, vv)
				vdpbf16ps(vv, p0, acc[c][0])
				vdpbf16ps(vv, p1, acc[c][1])
			}
		}
		ADDQ(U32(256), p)
		ADDQ(U8(16), v)
		DECQ(n)
		JNZ(LabelRef("vkeys"))
		for c := range acc {
			VMOVUPS(acc[c][0], Mem{Base: a0, Disp: 64 * c})
			VMOVUPS(acc[c][1], Mem{Base: a1, Disp: 64 * c})
		}
	}
}
