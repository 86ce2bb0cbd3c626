package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// attendTilesAMX is the exact-attention tile of the amx family: one call
// folds every key block a tile of up to 64 query rows sees into the
// tile's running maxima, sums and output accumulator, the products on
// the AMX tiles (TDPBF16PS) and the softmax in zmm registers. The
// layouts, all of them fixed by simd's AMX constants and packing
// functions (amx.go), are those of the tiles:
//
//   - qb, Qᵀ as TDPBF16PS's second operand: for each chunk of 32 of the
//     dp (D rounded up to 32) columns and each panel of 16 queries, 16
//     rows of 16 pairs (Q[n][2r], Q[n][2r+1]), 1 KiB; 4 panels a chunk.
//   - kb, the keys of the blocks, 128 a block, rows of dp bfloat16: the
//     first operand, 16 keys × 32 columns, read in place.
//   - vb, the values of the blocks transposed, Vᵀ: dp rows of 128 keys,
//     the first operand of Oᵀ += Vᵀ·Pᵀ, 16 columns × 32 keys.
//   - st, the logits Sᵀ = K·Qᵀ of one block, for each panel 128 keys ×
//     16 queries (one zmm a key), in float32.
//   - pb, the probabilities of a block as the second operand of the
//     product with Vᵀ: for each panel 64 rows of 16 pairs (P[n][2j],
//     P[n][2j+1]).
//   - acc, the accumulator Oᵀ: for each panel dp rows of 16 float32.
//
// A panel's softmax is that of onlineSoftmaxAVX512 (the maximum and the
// sum of a query are the same lane of every key) but for two things. The
// logits are scaled by c = scale·log2 e inside the FMA that subtracts
// the maximum, and m is kept in those units. And the running maximum is
// not raised unless some query's block maximum exceeds it by more than
// amxThreshold (FlashAttention-4's conditional rescaling): then only
// those lanes change, and the accumulator and the sums are rescaled.
// Otherwise the exponentials of the block may reach 2^amxThreshold, which
// float32 and bfloat16 hold with room to spare, and the result is exact
// in the end all the same, because the accumulator and the sum use the
// same maximum. Rescales then happen a few times a row rather than at
// every block where the maximum grows.
const (
	amxKeys      = 128 // keys a block
	amxPanels    = 4   // panels of 16 queries a tile, at most
	amxThreshold = 8   // in log2 units: a factor of 256
)

var (
	amxTileCfg Mem // the tile configuration: tmm0 … tmm7, 16 rows of 64 bytes
	amxPairs   Mem // VPERMW's indices that interleave two 16-word halves
	amxThr     Mem // amxThreshold
)

func declareAMXConsts() {
	amxTileCfg = GLOBL("amxTileCfg", RODATA|NOPTR)
	DATA(0, U8(1)) // palette 1
	for i := 1; i < 16; i++ {
		DATA(i, U8(0)) // start row 0, reserved
	}
	for t := range 16 {
		colsb := 0
		if t < 8 {
			colsb = 64
		}
		DATA(16+2*t, U16(colsb))
	}
	for t := range 16 {
		rows := 0
		if t < 8 {
			rows = 16
		}
		DATA(48+t, U8(rows))
	}
	amxPairs = GLOBL("amxPairs", RODATA|NOPTR)
	for n := range 16 {
		DATA(4*n, U16(n))
		DATA(4*n+2, U16(16+n))
	}
	amxThr = vecConst("amxThreshold", amxThreshold)
}

// attendAMX emits attendTilesAMX.
func attendAMX() {
	TEXT("attendTilesAMX", NOSPLIT, "func(npp, nfull, nblk, dp int, qb, kb, vb []uint16, st []float32, pb []uint16, lim []int32, m, l, acc []float32, c float32)")
	Pragma("noescape")
	Doc(
		"attendTilesAMX folds key blocks 0 … nblk-1 into npp pairs of panels of a query tile",
		"(see AttendAMX): blocks from nfull on under the limits lim. The slices must be long",
		"enough (the Go caller checks). It loads the tile configuration first and releases the",
		"tiles before it returns, as the goroutine may run on another thread next time.",
	)
	nblk := Load(Param("nblk"), GP64())
	TESTQ(nblk, nblk)
	JZ(LabelRef("done"))
	{
		cfg := GP64()
		LEAQ(amxTileCfg, cfg)
		ldTileCfg(Mem{Base: cfg})
	}
	// The loop state lives in the frame, leaving the registers to the
	// loops inside a block.
	blk, kblk, vblk := AllocLocal(8), AllocLocal(8), AllocLocal(8)
	{
		z := GP64()
		XORQ(z, z)
		MOVQ(z, blk)
		k := Load(Param("kb").Base(), GP64())
		MOVQ(k, kblk)
		v := Load(Param("vb").Base(), GP64())
		MOVQ(v, vblk)
	}

	Label("block")
	amxLogits(kblk)
	amxSoftmax(blk)
	amxValues(vblk)

	// Next block: 128 keys of dp columns further on in K and in Vᵀ.
	{
		step := Load(Param("dp"), GP64())
		SHLQ(U8(8), step) // 128 keys · 2 bytes
		ADDQ(step, kblk)
		ADDQ(step, vblk)
		b := GP64()
		MOVQ(blk, b)
		INCQ(b)
		MOVQ(b, blk)
		CMPQ(b, addr(Param("nblk")))
		JL(LabelRef("block"))
	}
	tileRelease()

	Label("done")
	VZEROUPPER()
	RET()
}

// amxLogits emits Sᵀ = K·Qᵀ for the block at kblk (a frame slot): for
// each 32 keys and each pair of panels, four tiles of 16 keys × 16
// queries, a step of 32 columns two loads of K and two of Qᵀ for four
// TDPBF16PS, stored to st.
func amxLogits(kblk Mem) {
	s64, kstr := GP64(), GP64()
	MOVQ(U32(64), s64)
	MOVQ(addr(Param("dp")), kstr)
	SHLQ(U8(1), kstr) // bytes a key
	ka := GP64()
	MOVQ(kblk, ka)
	stp := Load(Param("st").Base(), GP64())
	sb := GP64()
	MOVQ(U32(amxKeys/32), sb)
	Label("lsub")
	{
		kb := GP64()
		MOVQ(kstr, kb)
		SHLQ(U8(4), kb)
		ADDQ(ka, kb) // key 16 of the 32
		qp := Load(Param("qb").Base(), GP64())
		sp := GP64()
		MOVQ(stp, sp)
		pp := Load(Param("npp"), GP64())
		Label("lpair")
		{
			for t := range 4 {
				tileZero(t)
			}
			k0, k1, q := GP64(), GP64(), GP64()
			MOVQ(ka, k0)
			MOVQ(kb, k1)
			MOVQ(qp, q)
			ch := Load(Param("dp"), GP64())
			SHRQ(U8(5), ch)
			Label("lchunk")
			tileLoad(Mem{Base: k0, Index: kstr, Scale: 1}, 4)
			tileLoad(Mem{Base: k1, Index: kstr, Scale: 1}, 5)
			tileLoad(Mem{Base: q, Index: s64, Scale: 1}, 6)
			tileLoad(Mem{Base: q, Index: s64, Scale: 1, Disp: 1024}, 7)
			tdpbf16ps(6, 4, 0)
			tdpbf16ps(7, 4, 1)
			tdpbf16ps(6, 5, 2)
			tdpbf16ps(7, 5, 3)
			ADDQ(U8(64), k0)
			ADDQ(U8(64), k1)
			ADDQ(U32(amxPanels*1024), q)
			DECQ(ch)
			JNZ(LabelRef("lchunk"))
			// Panel 2pp at sp, 2pp+1 a panel (128 keys of 64 bytes) on.
			tileStore(0, Mem{Base: sp, Index: s64, Scale: 1})
			tileStore(1, Mem{Base: sp, Index: s64, Scale: 1, Disp: amxKeys * 64})
			tileStore(2, Mem{Base: sp, Index: s64, Scale: 1, Disp: 1024})
			tileStore(3, Mem{Base: sp, Index: s64, Scale: 1, Disp: amxKeys*64 + 1024})
		}
		ADDQ(U32(2048), qp)
		ADDQ(U32(2*amxKeys*64), sp)
		DECQ(pp)
		JNZ(LabelRef("lpair"))
	}
	// The next 32 keys.
	LEAQ(Mem{Base: ka, Index: kstr, Scale: 8}, ka)
	LEAQ(Mem{Base: ka, Index: kstr, Scale: 8}, ka)
	LEAQ(Mem{Base: ka, Index: kstr, Scale: 8}, ka)
	LEAQ(Mem{Base: ka, Index: kstr, Scale: 8}, ka)
	ADDQ(U32(32*64), stp)
	DECQ(sb)
	JNZ(LabelRef("lsub"))
}

// amxSoftmax emits the softmax step of every panel on the logits of the
// block in st, which it turns into the probabilities in pb: from block
// nfull on, keys at or past a query's limit are set to -Inf first.
func amxSoftmax(blk Mem) {
	panel := AllocLocal(8)
	np := Load(Param("npp"), GP64())
	SHLQ(U8(1), np)
	MOVQ(np, panel)
	stp, pbp, mp, lp, limp, accp := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	for _, x := range []struct {
		name string
		m    Mem
	}{{"st", stp}, {"pb", pbp}, {"m", mp}, {"l", lp}, {"lim", limp}, {"acc", accp}} {
		r := Load(Param(x.name).Base(), GP64())
		MOVQ(r, x.m)
	}
	cv := ZMM()
	VBROADCASTSS(addr(Param("c")), cv)

	Label("spanel")
	mx := ZMM()
	sp := GP64()
	MOVQ(stp, sp)
	{
		b := GP64()
		MOVQ(blk, b)
		CMPQ(b, addr(Param("nfull")))
		JGE(LabelRef("smasked"))
	}
	// The maximum over the keys, four chains.
	{
		mxs := newZMMs(3)
		VMOVUPS(Mem{Base: sp}, mx)
		VMOVUPS(Mem{Base: sp, Disp: 64}, mxs[0])
		VMOVUPS(Mem{Base: sp, Disp: 128}, mxs[1])
		VMOVUPS(Mem{Base: sp, Disp: 192}, mxs[2])
		all := []VecVirtual{mx, mxs[0], mxs[1], mxs[2]}
		for j := 4; j < amxKeys; j++ {
			VMAXPS(Mem{Base: sp, Disp: 64 * j}, all[j%4], all[j%4])
		}
		VMAXPS(mxs[0], mx, mx)
		VMAXPS(mxs[2], mxs[1], mxs[1])
		VMAXPS(mxs[1], mx, mx)
		JMP(LabelRef("sgrow"))
	}
	// The same with limits: key j of a lane is visible when j < lim; the
	// others become -Inf in st.
	Label("smasked")
	{
		lim, jv, ninf, o := ZMM(), ZMM(), bcastConst(negInf), ZMM()
		p := GP64()
		MOVQ(limp, p)
		VMOVDQU32(Mem{Base: p}, lim)
		j0 := GP64()
		MOVQ(blk, j0)
		SHLQ(U8(7), j0) // 128 keys a block
		VPBROADCASTD(j0.As32(), jv)
		one32 := GP32()
		MOVL(U32(1), one32)
		VPBROADCASTD(one32, o)
		VMOVAPS(ninf, mx)
		n := GP64()
		MOVQ(U32(amxKeys), n)
		Label("smloop")
		x, hidden := ZMM(), K()
		VMOVUPS(Mem{Base: sp}, x)
		VPCMPD(U8(5), lim, jv, hidden) // j >= lim: hidden
		VMOVAPS(ninf, hidden, x)
		VMOVUPS(x, Mem{Base: sp})
		VMAXPS(x, mx, mx)
		VPADDD(o, jv, jv)
		ADDQ(U8(64), sp)
		DECQ(n)
		JNZ(LabelRef("smloop"))
	}

	// Raise the running maximum where the block's exceeds it by more than
	// the threshold, and rescale what was summed before.
	Label("sgrow")
	mold := ZMM()
	{
		p := GP64()
		MOVQ(mp, p)
		VMOVUPS(Mem{Base: p}, mold)
		VMULPS(cv, mx, mx)
		lo, grow := ZMM(), K()
		VADDPS_BCST(amxThr, mold, lo)
		VCMPPS(U8(0x1e), lo, mx, grow) // mx > m + threshold, ordered
		KORTESTW(grow, grow)
		JZ(LabelRef("sexp"))
		mnew, f := ZMM(), ZMM()
		VMOVAPS(mold, mnew)
		VMOVAPS(mx, grow, mnew)
		// f = 2^(m - m'), exactly 1 in the lanes that keep their maximum
		// (0 from the zero-masked subtraction) and 0 where m was -Inf.
		VSUBPS_Z(mnew, mold, grow, f)
		exp2Lanes512([]VecVirtual{f}, loadExp2Consts512(false), false)
		VMOVUPS(mnew, Mem{Base: p})
		VMOVAPS(mnew, mold)
		q := GP64()
		MOVQ(lp, q)
		lv := ZMM()
		VMULPS(Mem{Base: q}, f, lv)
		VMOVUPS(lv, Mem{Base: q})
		ap, d := GP64(), GP64()
		MOVQ(accp, ap)
		Load(Param("dp"), d)
		SHRQ(U8(2), d)
		Label("srescale")
		for i := range 4 {
			v := ZMM()
			VMULPS(Mem{Base: ap, Disp: 64 * i}, f, v)
			VMOVUPS(v, Mem{Base: ap, Disp: 64 * i})
		}
		ADDQ(U32(256), ap)
		DECQ(d)
		JNZ(LabelRef("srescale"))
	}

	// p = 2^(s·c - m), with m taken as 0 where it is -Inf (no key seen
	// yet: then s is -Inf too, and p 0); summed into l and stored in
	// pairs of keys as bfloat16.
	Label("sexp")
	{
		keep, ms := K(), ZMM()
		VCMPPS_BCST(U8(4), negInf, mold, keep)
		VMOVAPS_Z(mold, keep, ms)
		e := loadExp2Consts512(false)
		perm := ZMM()
		VMOVDQU16(amxPairs, perm)
		sum := newZMMs(2)
		VXORPS(sum[0], sum[0], sum[0])
		VXORPS(sum[1], sum[1], sum[1])
		sp, pp, n := GP64(), GP64(), GP64()
		MOVQ(stp, sp)
		MOVQ(pbp, pp)
		MOVQ(U32(amxKeys/4), n)
		Label("seloop")
		ts := newZMMs(4)
		for i, t := range ts {
			VMOVUPS(Mem{Base: sp, Disp: 64 * i}, t)
			VFMSUB213PS(ms, cv, t) // t = s·c - m
		}
		exp2Lanes512(ts, e, false)
		VADDPS(ts[0], sum[0], sum[0])
		VADDPS(ts[1], sum[1], sum[1])
		VADDPS(ts[2], sum[0], sum[0])
		VADDPS(ts[3], sum[1], sum[1])
		for i := 0; i < 4; i += 2 {
			w := ZMM()
			vcvtne2ps2bf16(ts[i], ts[i+1], w)
			VPERMW(w, perm, w)
			VMOVDQU16(w, Mem{Base: pp, Disp: 32 * i})
		}
		ADDQ(U32(256), sp)
		ADDQ(U32(128), pp)
		DECQ(n)
		JNZ(LabelRef("seloop"))
		VADDPS(sum[1], sum[0], sum[0])
		q := GP64()
		MOVQ(lp, q)
		VADDPS(Mem{Base: q}, sum[0], sum[0])
		VMOVUPS(sum[0], Mem{Base: q})
	}

	// The next panel.
	{
		for _, x := range []struct {
			m    Mem
			step int
		}{{stp, amxKeys * 64}, {pbp, amxKeys * 32}, {mp, 64}, {lp, 64}, {limp, 64}} {
			r := GP64()
			MOVQ(x.m, r)
			ADDQ(U32(x.step), r)
			MOVQ(r, x.m)
		}
		d, r := GP64(), GP64()
		Load(Param("dp"), d)
		SHLQ(U8(6), d) // dp rows of 64 bytes
		MOVQ(accp, r)
		ADDQ(d, r)
		MOVQ(r, accp)
		n := GP64()
		MOVQ(panel, n)
		DECQ(n)
		MOVQ(n, panel)
		JNZ(LabelRef("spanel"))
	}
}

// amxValues emits Oᵀ += Vᵀ·Pᵀ for the block of values at vblk (a frame
// slot): for each 32 columns and each pair of panels, four tiles of
// the accumulator loaded, a step of 32 keys two loads of Vᵀ and two of
// P for four TDPBF16PS, 16 a load and store of the four, and stored.
func amxValues(vblk Mem) {
	s64, vstr := GP64(), GP64()
	MOVQ(U32(64), s64)
	MOVQ(U32(amxKeys*2), vstr)
	vp := GP64()
	MOVQ(vblk, vp)
	accI := Load(Param("acc").Base(), GP64())
	pstr := Load(Param("dp"), GP64())
	SHLQ(U8(6), pstr) // bytes a panel of the accumulator
	i := Load(Param("dp"), GP64())
	SHRQ(U8(5), i)
	Label("vcols")
	{
		a0, pp, pbp := GP64(), Load(Param("npp"), GP64()), Load(Param("pb").Base(), GP64())
		MOVQ(accI, a0)
		Label("vpair")
		a1 := GP64()
		LEAQ(Mem{Base: a0, Index: pstr, Scale: 1}, a1)
		tileLoad(Mem{Base: a0, Index: s64, Scale: 1}, 0)
		tileLoad(Mem{Base: a1, Index: s64, Scale: 1}, 1)
		tileLoad(Mem{Base: a0, Index: s64, Scale: 1, Disp: 1024}, 2)
		tileLoad(Mem{Base: a1, Index: s64, Scale: 1, Disp: 1024}, 3)
		for kc := range amxKeys / 32 {
			tileLoad(Mem{Base: vp, Index: vstr, Scale: 1, Disp: 64 * kc}, 4)
			tileLoad(Mem{Base: vp, Index: vstr, Scale: 1, Disp: 16*amxKeys*2 + 64*kc}, 5)
			tileLoad(Mem{Base: pbp, Index: s64, Scale: 1, Disp: 1024 * kc}, 6)
			tileLoad(Mem{Base: pbp, Index: s64, Scale: 1, Disp: amxKeys*32 + 1024*kc}, 7)
			tdpbf16ps(6, 4, 0)
			tdpbf16ps(7, 4, 1)
			tdpbf16ps(6, 5, 2)
			tdpbf16ps(7, 5, 3)
		}
		tileStore(0, Mem{Base: a0, Index: s64, Scale: 1})
		tileStore(1, Mem{Base: a1, Index: s64, Scale: 1})
		tileStore(2, Mem{Base: a0, Index: s64, Scale: 1, Disp: 1024})
		tileStore(3, Mem{Base: a1, Index: s64, Scale: 1, Disp: 1024})
		// The next pair of panels: two panels on in the accumulator and
		// in P.
		LEAQ(Mem{Base: a1, Index: pstr, Scale: 1}, a0)
		ADDQ(U32(2*amxKeys*32), pbp)
		DECQ(pp)
		JNZ(LabelRef("vpair"))
	}
	// The next 32 columns: 32 rows of Vᵀ and of each panel of Oᵀ.
	ADDQ(U32(32*amxKeys*2), vp)
	ADDQ(U32(32*64), accI)
	DECQ(i)
	JNZ(LabelRef("vcols"))
}
