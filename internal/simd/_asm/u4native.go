package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The int4 decode kernels of the avx512bf16 family on CPUs with
// AVX512-VNNI: the 4-bit codes multiplied as integers or bfloat16, not
// widened to float32 one by one.
//
// dotRowsU4Q8AVX512BF16 rounds each query row to int8 (one scale a row)
// and multiplies it with the codes by VPDPBUSD, 64 byte products an
// instruction. Its lanes must be keys, not channels, or every score would
// need a sum across a register: 16 packed rows are loaded and transposed
// as 16×16 dwords, so that dword k of every row (4 bytes: codes of
// channels 4k…4k+3 in the low nibbles, pw+4k… in the high ones) sits in
// one register, which meets the query's 4 bytes broadcast from memory.
// The transpose is shared by all the query rows of a call.
//
// gemmU4BF16{Lo,Hi}AVX512BF16 multiply the probabilities, times the
// rows' scales and rounded to bfloat16, with the codes as bfloat16 by VDPBF16PS: two rows of codes
// are interleaved byte by byte, a nibble kept, and each code becomes its
// bfloat16 value by two VPSHUFB table lookups (its high and low bytes),
// 32 products an instruction.

// The frame of dotRowsU4Q8: q8Rows rows of int8 queries, each a low half
// (channels [0, pw)) and a high half (channels [pw, d)) of q8Half bytes,
// so that pw may be up to q8Half.
const (
	q8Half = 256
	q8Row  = 2 * q8Half
	q8Rows = 4
	// u4KC and u4Rows bound k and m of a gemmU4BF16 call (the Go caller
	// splits larger products).
	u4KC   = 256
	u4Rows = 4
	// u4Ahead is how many rows ahead the kernels prefetch the keys
	// (and half as many the values, read by two calls a row).
	u4Ahead = 64
)

var (
	nib0F   Mem // 64 bytes 0x0F
	bf16Lo  Mem // the low byte of the bfloat16 of 0…15, 4 times
	bf16Hi  Mem // its high byte
	q8Tiny  Mem // the least row maximum a query row is scaled by
	c127    Mem // 127
	u4Mid   Mem // 8, the code DotRowsU4Q8 centres the codes on
	absMask Mem // 0x7fffffff
)

func declareU4Consts() {
	table := func(name string, f func(c int) byte) Mem {
		m := GLOBL(name, RODATA|NOPTR)
		for i := 0; i < 64; i++ {
			DATA(i, U8(f(i%16)))
		}
		return m
	}
	nib0F = table("nib0F", func(int) byte { return 0x0f })
	bf16Lo = table("bf16Lo", func(c int) byte { return byte(math.Float32bits(float32(c)) >> 16) })
	bf16Hi = table("bf16Hi", func(c int) byte { return byte(math.Float32bits(float32(c)) >> 24) })
	q8Tiny = vecConst("q8Tiny", 0x1p-100)
	c127 = vecConst("c127", 127)
	u4Mid = vecConst("u4Mid", 8)
	absMask = GLOBL("absMask", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		DATA(4*i, U32(0x7fffffff))
	}
}

// u4Native emits the kernels of this file.
func u4Native() {
	dotRowsU4Q8()
	for _, k := range u4Halves {
		gemmU4BF16(k.half, k.nibbles)
	}
}

// dotRowsU4Q8 emits dotRowsU4Q8AVX512BF16 (see DotRowsU4Q8): rows ≤ 4,
// pw ≤ q8Half, checked by the Go caller.
func dotRowsU4Q8() {
	TEXT("dotRowsU4Q8AVX512BF16", 0, "func(s []float32, lds int, q []float32, ldq, rows int, scale, zero []float32, k []uint8, ldk, n, d, pw int)")
	Pragma("noescape")
	Doc("dotRowsU4Q8AVX512BF16 is DotRowsU4Q8 for rows ≤ 4 and pw ≤ 256 with VPDPBUSD;",
		"the Go caller checks the sizes.")
	q8 := AllocLocal(q8Rows * q8Row)
	qs, qz, qo := AllocLocal(4*q8Rows), AllocLocal(4*q8Rows), AllocLocal(4*q8Rows)
	rows := Load(Param("rows"), GP64())
	TESTQ(rows, rows)
	JZ(LabelRef("done"))
	n := Load(Param("n"), GP64())
	TESTQ(n, n)
	JZ(LabelRef("done"))
	CMPQ(rows, U8(2))
	JL(LabelRef("r1"))
	JE(LabelRef("r2"))
	JMP(LabelRef("r4"))
	for _, R := range []int{4, 2, 1} {
		Label(fmt.Sprintf("r%d", R))
		u4q8Rows(R, q8, qs, qz, qo)
		JMP(LabelRef("done"))
	}
	Label("done")
	VZEROUPPER()
	RET()
}

// clampRow returns min(r, rows-1) in a new register.
func clampRow(r int) Register {
	last := Load(Param("rows"), GP64())
	DECQ(last)
	idx := GP64()
	MOVQ(U32(r), idx)
	CMPQ(idx, last)
	CMOVQGT(last, idx)
	return idx
}

// u4q8Rows emits the work for R query rows (the missing ones repeat the
// last and are not stored): the rows rounded into the frame, then the
// keys in blocks of 16.
func u4q8Rows(R int, q8, qs, qz, qo Mem) {
	pre := fmt.Sprintf("r%d", R)
	for r := 0; r < R; r++ {
		Commentf("Query row %d to int8.", r)
		src := clampRow(r)
		IMULQ(addr(Param("ldq")), src)
		SHLQ(U8(2), src)
		ADDQ(addr(Param("q").Base()), src)
		quantRowQ8(fmt.Sprintf("%sq%d", pre, r), src, q8.Offset(r*q8Row), qs.Offset(4*r), qz.Offset(4*r), qo.Offset(4*r))
	}
	kp, sp, j := GP64(), GP64(), GP64()
	Load(Param("k").Base(), kp)
	Load(Param("s").Base(), sp)
	Load(Param("n"), j)
	Label(pre + "blk")
	CMPQ(j, U8(16))
	JL(LabelRef(pre + "tail"))
	u4q8Block(pre+"f", R, true, kp, sp, j, q8, qs, qz, qo)
	ldk := Load(Param("ldk"), GP64())
	SHLQ(U8(4), ldk)
	ADDQ(ldk, kp)
	ADDQ(U8(64), sp)
	SUBQ(U8(16), j)
	JMP(LabelRef(pre + "blk"))
	Label(pre + "tail")
	TESTQ(j, j)
	JZ(LabelRef(pre + "end"))
	u4q8Block(pre+"t", R, false, kp, sp, j, q8, qs, qz, qo)
	Label(pre + "end")
}

// quantRowQ8 rounds the d values at src, times the channel scales, to
// int8 into the frame row dst: y = q·scale, m = max(max |y|, q8Tiny),
// code = round(y·(127/m)), the low half (values [0, min(d, pw))) at dst,
// the high one (values [pw, d)) at dst+q8Half, the bytes the blocks read
// past them zeroed; at qs the scale m/127, NaN if a y is NaN or
// infinite, at qz the sum Σ q·(zero + 8·scale) in 16 lanes added by
// reduceAdd's tree, and at qo -8·Σ q8 as a float32 (exact), added to
// each key's sum so that the codes count as code-8 (see DotRowsU4Q8).
func quantRowQ8(pre string, src Register, dst, qs, qz, qo Mem) {
	mx, bad, zs, z, s8 := ZMM(), ZMM(), ZMM(), ZMM(), ZMM()
	VPXORD(mx, mx, mx)
	VPXORD(bad, bad, bad)
	VPXORD(zs, zs, zs)
	VPXORD(z, z, z)
	VPXORD(s8, s8, s8)
	abs := ZMM()
	VMOVDQU32(absMask, abs)
	sc, ze := Load(Param("scale").Base(), GP64()), Load(Param("zero").Base(), GP64())
	i, cnt := GP64(), GP64()
	XORQ(i, i)
	Load(Param("d"), cnt)
	// Whole chunks of 16 values unmasked, then the last under a mask.
	maxBody := func(km Register) {
		x, y, w := ZMM(), ZMM(), ZMM()
		maskedLoad(Mem{Base: src, Index: i, Scale: 4}, km, x)
		maskedLoad(Mem{Base: sc, Index: i, Scale: 4}, km, y)
		maskedLoad(Mem{Base: ze, Index: i, Scale: 4}, km, w)
		// w = zero + 8·scale, one rounding: 8·scale is exact.
		VFMADD231PS_BCST(u4Mid, y, w)
		VMULPS(y, x, y)
		VMULPS(w, x, w)
		VADDPS(w, zs, zs)
		VANDPS(abs, y, w)
		VMAXPS(w, mx, mx)
		// y·0 is NaN exactly where y is NaN or infinite.
		VFMADD231PS(z, y, bad)
	}
	Label(pre + "max")
	CMPQ(cnt, U8(16))
	JL(LabelRef(pre + "maxt"))
	maxBody(nil)
	ADDQ(U8(16), i)
	SUBQ(U8(16), cnt)
	JMP(LabelRef(pre + "max"))
	Label(pre + "maxt")
	TESTQ(cnt, cnt)
	JLE(LabelRef(pre + "maxd"))
	maxBody(maskUpTo16(cnt))
	Label(pre + "maxd")
	VMOVSS(reduce16(zs, false), qz)
	m := reduce16(mx, true)
	b := reduce16(bad, false)
	VMAXSS(q8Tiny, m, m)
	inv, s, c := XMM(), XMM(), XMM()
	VMOVSS(c127, c)
	VDIVSS(m, c, inv)
	VDIVSS(c, m, s)
	VADDSS(b, s, s)
	VMOVSS(s, qs)
	invB := ZMM()
	VBROADCASTSS(inv, invB)
	// half writes count values from channel c0 on, zeroing first the
	// 64-byte chunks from the one the last written byte is in to the end
	// of what the blocks read (pw rounded up to 64).
	half := func(name string, c0, count Register, to Mem) {
		d, e := GP64(), GP64()
		LEAQ(to, d)
		MOVQ(count, e)
		ADDQ(U8(15), e)
		ANDQ(I8(-64), e)
		end := Load(Param("pw"), GP64())
		ADDQ(U8(63), end)
		ANDQ(I8(-64), end)
		Label(pre + name + "z")
		CMPQ(e, end)
		JGE(LabelRef(pre + name))
		VMOVDQU64(z, Mem{Base: d, Index: e, Scale: 1})
		ADDQ(U8(64), e)
		JMP(LabelRef(pre + name + "z"))
		body := func(km Register) {
			x, y := ZMM(), ZMM()
			maskedLoad(Mem{Base: src, Index: c0, Scale: 4}, km, x)
			maskedLoad(Mem{Base: sc, Index: c0, Scale: 4}, km, y)
			VMULPS(y, x, x)
			VMULPS(invB, x, x)
			VCVTPS2DQ(x, x)
			VPADDD(x, s8, s8)
			VPMOVSDB(x, Mem{Base: d})
		}
		Label(pre + name)
		CMPQ(count, U8(16))
		JL(LabelRef(pre + name + "t"))
		body(nil)
		ADDQ(U8(16), c0)
		ADDQ(U8(16), d)
		SUBQ(U8(16), count)
		JMP(LabelRef(pre + name))
		Label(pre + name + "t")
		TESTQ(count, count)
		JLE(LabelRef(pre + name + "end"))
		body(maskUpTo16(count))
		Label(pre + name + "end")
	}
	// Low half: min(d, pw) values from channel 0.
	lo := Load(Param("d"), GP64())
	pw := Load(Param("pw"), GP64())
	CMPQ(lo, pw)
	CMOVQGT(pw, lo)
	c0 := GP64()
	XORQ(c0, c0)
	half("lo", c0, lo, dst)
	// High half: max(d - pw, 0) values from channel pw.
	hi := Load(Param("d"), GP64())
	c1 := Load(Param("pw"), GP64())
	SUBQ(c1, hi)
	none := GP64()
	XORQ(none, none)
	TESTQ(hi, hi)
	CMOVQLT(none, hi)
	half("hi", c1, hi, dst.Offset(q8Half))
	// qo = -8·Σ q8: each lane's sum is an integer below 2^24, and so is
	// the total, so reduce16's float sums are exact.
	VCVTDQ2PS(s8, s8)
	x8 := reduce16(s8, false)
	VMULSS(u4Mid, x8, x8)
	VSUBSS(x8, z.AsX(), x8)
	VMOVSS(x8, qo)
}

// maskedLoad loads 16 float32 at m, only those of km (the others zero)
// when it is not nil.
func maskedLoad(m Mem, km Register, v VecVirtual) {
	if km == nil {
		VMOVUPS(m, v)
		return
	}
	VMOVUPS_Z(m, km, v)
}

// maskUpTo16 returns an opmask of the first min(cnt, 16) lanes (cnt > 0).
func maskUpTo16(cnt Register) Register {
	// BZHI reads only the low byte of its index: clamp it to 16.
	bits, ones := GP32(), GP32()
	MOVL(U32(0xffff), ones)
	n, lim := GP64(), GP64()
	MOVQ(cnt, n)
	MOVQ(U32(16), lim)
	CMPQ(n, lim)
	CMOVQGT(lim, n)
	BZHIL(n.As32(), ones, bits)
	km := K()
	KMOVW(bits, km)
	return km
}

// clamp64 sets r to min(r, 64): BZHI reads only the low byte of its
// index, so that 256 would clear every bit.
func clamp64(r Register) {
	lim := GP64()
	MOVQ(U32(64), lim)
	CMPQ(r, lim)
	CMOVQGT(lim, r)
}

// reduce16 returns, in the low lane of an xmm register, the sum (or the
// largest, with useMax) of the 16 lanes of z, by reduceAdd's tree (lanes
// i and i+8, then i and i+4, i and i+2, 0 and 1) with instructions that
// take any of the 32 registers.
func reduce16(z VecVirtual, useMax bool) VecVirtual {
	op, ops := VADDPS, VADDSS
	if useMax {
		op, ops = VMAXPS, VMAXSS
	}
	h8 := YMM()
	VEXTRACTF32X8(U8(1), z, h8)
	y := z.AsY()
	op(h8, y, y)
	h4 := XMM()
	VEXTRACTF32X4(U8(1), y, h4)
	x := z.AsX()
	op(h4, x, x)
	h2 := XMM()
	VMOVHLPS(x, x, h2)
	op(h2, x, x)
	h1 := XMM()
	VMOVSHDUP(x, h1)
	ops(h1, x, x)
	return x.(VecVirtual)
}

// hiFrom is the first dword of a chunk whose high nibbles' products go to
// their own accumulators (see u4q8Block); at least u4Rows.
const hiFrom = 4

// u4q8Block emits one block of 16 keys (full) or of the j < 16 left (the
// missing rows repeat the last, their scores not stored) against the R
// query rows in the frame: for each 64-byte chunk of the packed rows, the
// 16 rows loaded (bytes past pw zeroed), transposed and multiplied.
func u4q8Block(pre string, R int, full bool, kp, sp, j Register, q8, qs, qz, qo Mem) {
	Commentf("Block of 16 keys%s, %d query rows.", map[bool]string{true: "", false: " (the last ones)"}[full], R)
	ldk := Load(Param("ldk"), GP64())
	var ldk3, b4, b8, b12 Register
	var ahead Register
	if full {
		ahead = GP64()
		IMUL3Q(U32(u4Ahead), ldk, ahead)
		ldk3, b4, b8, b12 = GP64(), GP64(), GP64(), GP64()
		LEAQ(Mem{Base: ldk, Index: ldk, Scale: 2}, ldk3)
		LEAQ(Mem{Base: kp, Index: ldk, Scale: 4}, b4)
		LEAQ(Mem{Base: b4, Index: ldk, Scale: 4}, b8)
		LEAQ(Mem{Base: b8, Index: ldk, Scale: 4}, b12)
	}
	acc := newZMMs(R)
	for _, a := range acc {
		VPXORD(a, a, a)
	}
	off, qc := GP64(), GP64()
	XORQ(off, off)
	LEAQ(q8, qc)
	// Whole 64-byte chunks load unmasked: masked loads, on the AMD CPUs
	// measured, kept the hardware prefetcher from streaming the rows.
	chunk := func(masked bool) {
		var km Register
		if masked {
			// Bytes [off, pw) of each row.
			km = K()
			rem := Load(Param("pw"), GP64())
			SUBQ(off, rem)
			ones, bits := GP64(), GP64()
			MOVQ(I32(-1), ones)
			BZHIQ(rem, ones, bits)
			KMOVQ(bits, km)
		}
		rowsV := newZMMs(16)
		for i := 0; i < 16; i++ {
			var at Mem
			if full {
				base := []Register{kp, b4, b8, b12}[i/4]
				switch i % 4 {
				case 0:
					at = Mem{Base: base, Index: off, Scale: 1}
				case 1:
					p := GP64()
					LEAQ(Mem{Base: base, Index: ldk, Scale: 1}, p)
					at = Mem{Base: p, Index: off, Scale: 1}
				case 2:
					p := GP64()
					LEAQ(Mem{Base: base, Index: ldk, Scale: 2}, p)
					at = Mem{Base: p, Index: off, Scale: 1}
				default:
					p := GP64()
					LEAQ(Mem{Base: base, Index: ldk3, Scale: 1}, p)
					at = Mem{Base: p, Index: off, Scale: 1}
				}
				// The same line u4Ahead rows on: the rows come from DRAM
				// faster than the hardware prefetcher fetches them.
				pa := GP64()
				LEAQ(at, pa)
				PREFETCHT0(Mem{Base: pa, Index: ahead, Scale: 1})
			} else {
				// Row min(i, j-1).
				idx, last := GP64(), GP64()
				MOVQ(j, last)
				DECQ(last)
				MOVQ(U32(i), idx)
				CMPQ(idx, last)
				CMOVQGT(last, idx)
				IMULQ(ldk, idx)
				ADDQ(kp, idx)
				at = Mem{Base: idx, Index: off, Scale: 1}
			}
			if masked {
				VMOVDQU8_Z(at, km, rowsV[i])
			} else {
				VMOVDQU64(at, rowsV[i])
			}
		}
		t := transpose16x16(rowsV)
		m0F := ZMM()
		VMOVDQU64(nib0F, m0F)
		// From dword hiFrom on, the high nibbles' products go to a second
		// accumulator a row, added in at the end of the chunk: with one,
		// each row's VPDPBUSD formed a single chain, 32 long, that waited
		// on its latency. The second takes the registers of the first
		// dwords, already used (R ≤ hiFrom); new ones failed avo's
		// register allocation. More accumulators measured no faster.
		accHi := acc
		for k := 0; k < 16; k++ {
			if k == hiFrom {
				accHi = t[:R]
				for _, a := range accHi {
					VPXORD(a, a, a)
				}
			}
			lo, hi := ZMM(), ZMM()
			VPANDD(m0F, t[k], lo)
			VPSRLD(U8(4), t[k], hi)
			VPANDD(m0F, hi, hi)
			for r := 0; r < R; r++ {
				VPDPBUSD_BCST(Mem{Base: qc, Disp: r*q8Row + 4*k}, lo, acc[r])
				VPDPBUSD_BCST(Mem{Base: qc, Disp: r*q8Row + q8Half + 4*k}, hi, accHi[r])
			}
		}
		for r := range acc {
			VPADDD(accHi[r], acc[r], acc[r])
		}
	}
	Label(pre + "chunk")
	{
		rem := Load(Param("pw"), GP64())
		SUBQ(off, rem)
		CMPQ(rem, U8(64))
		JL(LabelRef(pre + "part"))
	}
	chunk(false)
	JMP(LabelRef(pre + "next"))
	Label(pre + "part")
	chunk(true)
	Label(pre + "next")
	ADDQ(U8(64), qc)
	ADDQ(U8(64), off)
	{
		pw := Load(Param("pw"), GP64())
		CMPQ(off, pw)
		JL(LabelRef(pre + "chunk"))
	}
	// s = float(sum)·scale + Σ q·(zero + 8·scale), rounded twice (see
	// DotRowsU4Q8).
	var ks Register
	if !full {
		ks = maskUpTo16(j)
	}
	lds := Load(Param("lds"), GP64())
	SHLQ(U8(2), lds)
	row := GP64()
	MOVQ(sp, row)
	for r := 0; r < R; r++ {
		if r > 0 {
			last := Load(Param("rows"), GP64())
			CMPQ(last, U8(r))
			JLE(LabelRef(pre + "stored"))
			ADDQ(lds, row)
		}
		f, sc, ad := ZMM(), ZMM(), ZMM()
		VCVTDQ2PS(acc[r], f)
		// The codes from 8 on: both terms are integers below 2^24, so
		// that the float sum is exact. Added here, not as the sums'
		// start, so that the chunks need not wait for quantRowQ8.
		VBROADCASTSS(qo.Offset(4*r), sc)
		VADDPS(sc, f, f)
		VBROADCASTSS(qs.Offset(4*r), sc)
		VMULPS(sc, f, f)
		VBROADCASTSS(qz.Offset(4*r), ad)
		VADDPS(ad, f, f)
		if full {
			VMOVUPS(f, Mem{Base: row})
		} else {
			VMOVUPS(f, ks, Mem{Base: row})
		}
	}
	Label(pre + "stored")
}

// transpose16x16 returns the transpose of 16 registers of 16 dwords: out[k]
// holds dword k of in[0], …, in[15], in that order.
func transpose16x16(in []VecVirtual) []VecVirtual {
	t := newZMMs(16)
	for i := 0; i < 8; i++ {
		VPUNPCKLDQ(in[2*i+1], in[2*i], t[2*i])
		VPUNPCKHDQ(in[2*i+1], in[2*i], t[2*i+1])
	}
	// u[4g+m], in each 128-bit lane L: dword 4L+m of rows 4g … 4g+3.
	u := newZMMs(16)
	for g := 0; g < 4; g++ {
		VPUNPCKLQDQ(t[4*g+2], t[4*g], u[4*g])
		VPUNPCKHQDQ(t[4*g+2], t[4*g], u[4*g+1])
		VPUNPCKLQDQ(t[4*g+3], t[4*g+1], u[4*g+2])
		VPUNPCKHQDQ(t[4*g+3], t[4*g+1], u[4*g+3])
	}
	out := make([]VecVirtual, 16)
	for m := 0; m < 4; m++ {
		x := []VecVirtual{u[m], u[4+m], u[8+m], u[12+m]}
		y := newZMMs(4)
		VSHUFI32X4(U8(0x44), x[1], x[0], y[0])
		VSHUFI32X4(U8(0xee), x[1], x[0], y[1])
		VSHUFI32X4(U8(0x44), x[3], x[2], y[2])
		VSHUFI32X4(U8(0xee), x[3], x[2], y[3])
		o := newZMMs(4)
		VSHUFI32X4(U8(0x88), y[2], y[0], o[0])
		VSHUFI32X4(U8(0xdd), y[2], y[0], o[1])
		VSHUFI32X4(U8(0x88), y[3], y[1], o[2])
		VSHUFI32X4(U8(0xdd), y[3], y[1], o[3])
		for L := 0; L < 4; L++ {
			out[4*L+m] = o[L]
		}
	}
	return out
}

// roundScaledBF16 writes the cnt values at src times those of the
// parameter rs, rounded to bfloat16, at dst, zero-padded to a multiple
// of 32.
func roundScaledBF16(pre string, src, dst, cnt Register) {
	rs := Load(Param("rs").Base(), GP64())
	Label(pre + "loop")
	km := maskUpTo16(cnt)
	lo, hi, s := ZMM(), ZMM(), ZMM()
	VMOVUPS_Z(Mem{Base: src}, km, lo)
	VMOVUPS_Z(Mem{Base: rs}, km, s)
	VMULPS(s, lo, lo)
	rest := GP64()
	MOVQ(cnt, rest)
	SUBQ(U8(16), rest)
	none := GP64()
	XORQ(none, none)
	CMPQ(rest, none)
	CMOVQLT(none, rest)
	kh := maskUpTo16(rest)
	VMOVUPS_Z(Mem{Base: src, Disp: 64}, kh, hi)
	VMOVUPS_Z(Mem{Base: rs, Disp: 64}, kh, s)
	VMULPS(s, hi, hi)
	z := ZMM()
	vcvtne2ps2bf16(lo, hi, z)
	VMOVUPS(z, Mem{Base: dst})
	ADDQ(U32(128), src)
	ADDQ(U32(128), rs)
	ADDQ(U8(64), dst)
	SUBQ(U8(32), cnt)
	JG(LabelRef(pre + "loop"))
}

// gemmU4BF16 emits gemmU4BF16<half>AVX512BF16 (see GemmU4BF16): m ≤ 4,
// k ≤ 256, checked by the Go caller.
func gemmU4BF16(half, nibbles string) {
	name := "gemmU4BF16" + half + "AVX512BF16"
	TEXT(name, 0, "func(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int)")
	Pragma("noescape")
	Doc(name+" is GemmU4BF16 on the "+nibbles+" nibbles for m ≤ 4 and k ≤ 256 with",
		"VDPBF16PS; the Go caller checks the sizes.")
	ab := AllocLocal(u4Rows * 2 * u4KC)
	m := Load(Param("m"), GP64())
	TESTQ(m, m)
	JZ(LabelRef("done"))
	n := Load(Param("n"), GP64())
	TESTQ(n, n)
	JZ(LabelRef("done"))
	k := Load(Param("k"), GP64())
	TESTQ(k, k)
	JZ(LabelRef("done"))
	for r := 1; r < u4Rows; r++ {
		CMPQ(m, U8(r))
		JE(LabelRef(fmt.Sprintf("r%d", r)))
	}
	JMP(LabelRef(fmt.Sprintf("r%d", u4Rows)))
	for R := u4Rows; R >= 1; R-- {
		Label(fmt.Sprintf("r%d", R))
		gemmU4BF16Rows(R, half == "Hi", ab)
		JMP(LabelRef("done"))
	}
	Label("done")
	VZEROUPPER()
	RET()
}

// gemmU4BF16Rows emits the product for R rows: A rounded into the frame,
// then blocks of 64 columns, each with 4 accumulators a row that the
// interleaving leaves holding columns 16l+4x … 16l+4x+3 (lane l,
// accumulator x), put back in order by a 4×4 transpose of 128-bit lanes
// before they are added to C.
func gemmU4BF16Rows(R int, hi bool, ab Mem) {
	pre := fmt.Sprintf("r%d", R)
	for i := 0; i < R; i++ {
		src, dst, cnt := GP64(), GP64(), GP64()
		MOVQ(U32(i), src)
		IMULQ(addr(Param("lda")), src)
		SHLQ(U8(2), src)
		ADDQ(addr(Param("a").Base()), src)
		LEAQ(ab.Offset(i*2*u4KC), dst)
		Load(Param("k"), cnt)
		roundScaledBF16(fmt.Sprintf("%scv%d", pre, i), src, dst, cnt)
	}
	cb := GP64()
	XORQ(cb, cb)
	Label(pre + "cols")
	kb := K()
	colBits := GP64()
	{
		rem := Load(Param("n"), GP64())
		SUBQ(cb, rem)
		clamp64(rem)
		ones := GP64()
		MOVQ(I32(-1), ones)
		BZHIQ(rem, ones, colBits)
		KMOVQ(colBits, kb)
	}
	acc := make([][]VecVirtual, R)
	for r := range acc {
		acc[r] = newZMMs(4)
		for _, a := range acc[r] {
			VPXORD(a, a, a)
		}
	}
	m0F, tLo, tHi := ZMM(), ZMM(), ZMM()
	VMOVDQU64(nib0F, m0F)
	VMOVDQU64(bf16Lo, tLo)
	VMOVDQU64(bf16Hi, tHi)
	bp, ap, left, ldb := GP64(), GP64(), GP64(), GP64()
	Load(Param("b").Base(), bp)
	ADDQ(cb, bp)
	LEAQ(ab, ap)
	Load(Param("k"), left)
	Load(Param("ldb"), ldb)
	ahead := GP64()
	IMUL3Q(U32(u4Ahead/2), ldb, ahead)
	kloop := func(kp string, masked bool) {
		Label(kp)
		{
			// Rows p and p+1 (p itself again when k is odd and p+1 = k: its
			// probability there is 0).
			nxt := GP64()
			LEAQ(Mem{Base: bp, Index: ldb, Scale: 1}, nxt)
			CMPQ(left, U8(1))
			CMOVQEQ(bp, nxt)
			r0, r1 := ZMM(), ZMM()
			if masked {
				VMOVDQU8_Z(Mem{Base: bp}, kb, r0)
				VMOVDQU8_Z(Mem{Base: nxt}, kb, r1)
			} else {
				PREFETCHT0(Mem{Base: bp, Index: ahead, Scale: 1})
				PREFETCHT0(Mem{Base: nxt, Index: ahead, Scale: 1})
				VMOVDQU64(Mem{Base: bp}, r0)
				VMOVDQU64(Mem{Base: nxt}, r1)
			}
			av := newZMMs(R)
			for r := range av {
				VPBROADCASTD(Mem{Base: ap, Disp: r * 2 * u4KC}, av[r])
			}
			for x, pair := range []func(VecVirtual){
				func(d VecVirtual) { VPUNPCKLBW(r1, r0, d) },
				func(d VecVirtual) { VPUNPCKHBW(r1, r0, d) },
			} {
				v := ZMM()
				pair(v)
				if hi {
					VPSRLW(U8(4), v, v)
				}
				VPANDD(m0F, v, v)
				lo8, hi8 := ZMM(), ZMM()
				VPSHUFB(v, tLo, lo8)
				VPSHUFB(v, tHi, hi8)
				w0, w1 := ZMM(), ZMM()
				VPUNPCKLBW(hi8, lo8, w0)
				VPUNPCKHBW(hi8, lo8, w1)
				for r := range av {
					vdpbf16ps(w0, av[r], acc[r][2*x])
					vdpbf16ps(w1, av[r], acc[r][2*x+1])
				}
			}
		}
		LEAQ(Mem{Base: bp, Index: ldb, Scale: 2}, bp)
		ADDQ(U8(4), ap)
		SUBQ(U8(2), left)
		JG(LabelRef(kp))
	}
	// Whole blocks of 64 columns load unmasked (see u4q8Block).
	{
		rem := Load(Param("n"), GP64())
		SUBQ(cb, rem)
		CMPQ(rem, U8(64))
		JL(LabelRef(pre + "kpart"))
	}
	kloop(pre+"k", false)
	JMP(LabelRef(pre + "kend"))
	kloop(pre+"kpart", true)
	Label(pre + "kend")

	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)
	cp := GP64()
	Load(Param("c").Base(), cp)
	LEAQ(Mem{Base: cp, Index: cb, Scale: 4}, cp)
	for r := 0; r < R; r++ {
		if r > 0 {
			ADDQ(ldc, cp)
		}
		a := acc[r]
		y := newZMMs(4)
		VSHUFF32X4(U8(0x44), a[1], a[0], y[0])
		VSHUFF32X4(U8(0xee), a[1], a[0], y[1])
		VSHUFF32X4(U8(0x44), a[3], a[2], y[2])
		VSHUFF32X4(U8(0xee), a[3], a[2], y[3])
		for l, sel := range []struct {
			imm  uint8
			x, z int
		}{{0x88, 0, 2}, {0xdd, 0, 2}, {0x88, 1, 3}, {0xdd, 1, 3}} {
			o := ZMM()
			VSHUFF32X4(U8(sel.imm), y[sel.z], y[sel.x], o)
			bits := GP64()
			MOVQ(colBits, bits)
			SHRQ(U8(16*l), bits)
			kl := K()
			KMOVW(bits.As32(), kl)
			old := ZMM()
			at := Mem{Base: cp, Disp: 64 * l}
			VMOVUPS_Z(at, kl, old)
			VADDPS(o, old, old)
			VMOVUPS(old, kl, at)
		}
	}
	ADDQ(U8(64), cb)
	{
		n := Load(Param("n"), GP64())
		CMPQ(cb, n)
		JL(LabelRef(pre + "cols"))
	}
}
