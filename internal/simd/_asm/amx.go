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
//   - kb, the keys of the blocks, amxKeys a block, rows of dp bfloat16: the
//     first operand, 16 keys × 32 columns, read in place.
//   - vb, the values of the blocks transposed, Vᵀ: dp rows of amxKeys keys,
//     the first operand of Oᵀ += Vᵀ·Pᵀ, 16 columns × 32 keys.
//   - st, the logits Sᵀ = K·Qᵀ of two blocks (those of even blocks, then
//     of odd ones), for each panel amxKeys keys × 16 queries (one zmm a
//     key), in float32.
//   - pb, the probabilities of two blocks as the second operand of the
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
	amxKeys = 1 << amxKeysLog // keys a block: simd.AMXKeys
	// 64 and 256 work too, with simd.AMXKeys changed to match: larger
	// blocks load and store the accumulator less often a key, but waste
	// more keys at the edge of a mask.
	amxKeysLog   = 7
	amxPanels    = 4 // panels of 16 queries a tile, at most
	amxThreshold = 8 // in log2 units: a factor of 256
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

// amxFrame is the frame of attendTilesAMX: the block loop's counter and
// the cursors of the two streams of tile work that run interleaved with
// the softmax of a block.
type amxFrame struct {
	// vector is set in attendTilesAVX512BF16, which has no tiles: its
	// softmax then issues no tile steps and no prefetches.
	vector bool
	blk    Mem
	// Sᵀ = K·Qᵀ of the next block: steps left, the chunk of 32 columns
	// and the pair of panels of the next step, and the row of K and the
	// place in st of its 32 keys.
	sLeft, sCh, sPP, sK, sSt Mem
	// Oᵀ += Vᵀ·Pᵀ of the block before: steps left, the 32 keys and the
	// pair of panels of the next step, the rows of the accumulator and
	// of Vᵀ of its 32 columns, and the probabilities.
	vLeft, vKC, vPP, vAcc, vV, vP Mem
	// The steps are spread over the iterations of the softmax: credit
	// grows by steps every iteration, and a step takes iters from it.
	credit, steps, iters Mem
	// For each panel: the rescale factor (a zmm), whether any lane has
	// one other than 1, and the sum of the block's p (a zmm).
	f, grow, sum Mem
	// The lines of K and of Vᵀ to fetch into L2 next, and the last ones.
	pfK, pfKEnd, pfV, pfVEnd Mem
}

// attendAMX emits attendTilesAMX.
//
// The tile work of a block is the product Sᵀ = K·Qᵀ, before its softmax,
// and Oᵀ += Vᵀ·Pᵀ, after. Run in that order, the tiles and the vector
// units would take turns; instead the kernel is software-pipelined: while
// the softmax of block b runs in zmm registers, its loop issues, a few
// instructions every few iterations, the tile steps (two loads of each
// operand and four TDPBF16PS) of the logits of block b+1 and of the
// product with the values of block b-1, which the tiles then execute
// alongside. The logits and the probabilities are double-buffered (st and
// pb hold two blocks each) so that the three never touch the same memory.
// A block's softmax is in three phases: the maxima (and the masks) of
// every panel, which fix m and the rescale factors; the exponentials,
// with the tile work; and, once the tiles have added the block before,
// the rescale of the accumulator where a maximum was raised, and of l.
func attendAMX() {
	TEXT("attendTilesAMX", 0, "func(npp, nfull, nblk, dp int, qb, kb, vb []uint16, st []float32, pb []uint16, lim []int32, m, l, acc []float32, c float32)")
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
	var a amxFrame
	for _, m := range []*Mem{&a.blk, &a.sLeft, &a.sCh, &a.sPP, &a.sK, &a.sSt, &a.vLeft, &a.vKC, &a.vPP, &a.vAcc, &a.vV, &a.vP, &a.credit, &a.steps, &a.iters} {
		*m = AllocLocal(8)
	}
	a.f, a.grow, a.sum = AllocLocal(4*64), AllocLocal(4*8), AllocLocal(4*64)
	a.pfK, a.pfKEnd, a.pfV, a.pfVEnd = AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)

	// The logits of block 0, alone.
	{
		z := GP64()
		XORQ(z, z)
		MOVQ(z, a.blk)
		MOVQ(z, a.vLeft)
		a.startLogits(z)
		a.flush("pro")
	}

	Label("block")
	{
		b := GP64()
		MOVQ(a.blk, b)
		a.maxima(b)
	}
	// Start the tile work: the logits of the next block, the values of
	// the one before, where there are such blocks.
	{
		b, z := GP64(), GP64()
		MOVQ(a.blk, b)
		XORQ(z, z)
		MOVQ(z, a.sLeft)
		MOVQ(z, a.vLeft)
		INCQ(b)
		CMPQ(b, addr(Param("nblk")))
		JGE(LabelRef("nonext"))
		a.startLogits(b)
		Label("nonext")
		MOVQ(a.blk, b)
		TESTQ(b, b)
		JZ(LabelRef("noprev"))
		DECQ(b)
		a.startValues(b)
		Label("noprev")
		n := GP64()
		MOVQ(a.sLeft, n)
		ADDQ(a.vLeft, n)
		MOVQ(n, a.steps)
		MOVQ(addr(Param("npp")), n)
		SHLQ(U8(amxKeysLog-1), n) // 2·npp panels of amxKeys/4 iterations
		MOVQ(n, a.iters)
		SHRQ(U8(1), n)
		MOVQ(n, a.credit)
	}
	a.startPrefetch()
	{
		b := GP64()
		MOVQ(a.blk, b)
		a.exponentials(b)
	}
	a.flush("blk")
	a.rescale()
	a.nextBlock()

	// The values of the last block, alone.
	{
		b := GP64()
		MOVQ(a.blk, b)
		DECQ(b)
		a.startValues(b)
		a.flush("epi")
	}
	tileRelease()

	Label("done")
	VZEROUPPER()
	RET()
}

// nextBlock emits the end of the block loop: the block counter up by
// one, and back to "block" while blocks are left.
func (a *amxFrame) nextBlock() {
	b := GP64()
	MOVQ(a.blk, b)
	INCQ(b)
	MOVQ(b, a.blk)
	CMPQ(b, addr(Param("nblk")))
	JL(LabelRef("block"))
}

// startPrefetch points the prefetches of block blk's softmax at the keys
// of block blk+2, whose logits the next block's softmax has the tiles
// compute, and at the values of block blk, which they multiply then: a
// block each, into L2. Past the last block they fetch nothing new.
func (a *amxFrame) startPrefetch() {
	b, bytes, p := GP64(), GP64(), GP64()
	MOVQ(addr(Param("dp")), bytes)
	SHLQ(U8(amxKeysLog+1), bytes) // bytes a block
	MOVQ(a.blk, b)
	ADDQ(U8(2), b)
	MOVQ(addr(Param("kb").Base()), p)
	CMPQ(b, addr(Param("nblk")))
	JGE(LabelRef("pfnok"))
	IMULQ(bytes, b)
	ADDQ(b, p)
	MOVQ(p, a.pfK)
	LEAQ(Mem{Base: p, Index: bytes, Scale: 1, Disp: -64}, p)
	MOVQ(p, a.pfKEnd)
	JMP(LabelRef("pfv"))
	Label("pfnok")
	MOVQ(p, a.pfK)
	MOVQ(p, a.pfKEnd)
	Label("pfv")
	MOVQ(a.blk, b)
	IMULQ(bytes, b)
	MOVQ(addr(Param("vb").Base()), p)
	ADDQ(b, p)
	MOVQ(p, a.pfV)
	LEAQ(Mem{Base: p, Index: bytes, Scale: 1, Disp: -64}, p)
	MOVQ(p, a.pfVEnd)
}

// prefetch emits the prefetches of an iteration of the softmax, which
// has 64·npp of them a block: four lines of K and four of Vᵀ, a block of
// up to 128 columns in time for a tile of 64 rows. With dp ≤ 64 there
// are none: the softmax, the same for any dp, then takes longer than the
// tiles, and the prefetches only lengthen it.
func (a *amxFrame) prefetch() {
	CMPQ(addr(Param("dp")), U8(64))
	JLE(LabelRef("nopf"))
	for _, x := range []struct{ p, end Mem }{{a.pfK, a.pfKEnd}, {a.pfV, a.pfVEnd}} {
		t := GP64()
		MOVQ(x.p, t)
		for i := range 4 {
			PREFETCHT1(Mem{Base: t, Disp: 64 * i})
		}
		ADDQ(U32(256), t)
		CMPQ(t, x.end)
		CMOVQGT(x.end, t)
		MOVQ(t, x.p)
	}
	Label("nopf")
}

// startLogits sets the cursor of the logits to the start of block b (a
// register): 4·npp·dp/32 steps, into the half of st of b's parity.
func (a *amxFrame) startLogits(b Register) {
	n, t := GP64(), GP64()
	MOVQ(addr(Param("npp")), n)
	MOVQ(addr(Param("dp")), t)
	SHRQ(U8(5), t)
	IMULQ(t, n)
	SHLQ(U8(amxKeysLog-5), n) // a step every 32 keys
	MOVQ(n, a.sLeft)
	XORQ(n, n)
	MOVQ(n, a.sCh)
	MOVQ(n, a.sPP)
	MOVQ(addr(Param("dp")), t)
	SHLQ(U8(amxKeysLog+1), t) // bytes a block: amxKeys keys of dp bfloat16
	IMULQ(b, t)
	ADDQ(addr(Param("kb").Base()), t)
	MOVQ(t, a.sK)
	MOVQ(b, t)
	ANDQ(U8(1), t)
	SHLQ(U8(amxKeysLog+8), t) // AMXStLen/2 float32
	ADDQ(addr(Param("st").Base()), t)
	MOVQ(t, a.sSt)
}

// startValues sets the cursor of the values to the start of block b (a
// register): dp/32·npp·4 steps, from the half of pb of b's parity.
func (a *amxFrame) startValues(b Register) {
	n, t := GP64(), GP64()
	MOVQ(addr(Param("npp")), n)
	MOVQ(addr(Param("dp")), t)
	SHRQ(U8(5), t)
	IMULQ(t, n)
	SHLQ(U8(amxKeysLog-5), n) // a step every 32 keys
	MOVQ(n, a.vLeft)
	XORQ(n, n)
	MOVQ(n, a.vKC)
	MOVQ(n, a.vPP)
	MOVQ(addr(Param("acc").Base()), t)
	MOVQ(t, a.vAcc)
	MOVQ(addr(Param("dp")), t)
	SHLQ(U8(amxKeysLog+1), t)
	IMULQ(b, t)
	ADDQ(addr(Param("vb").Base()), t)
	MOVQ(t, a.vV)
	MOVQ(b, t)
	ANDQ(U8(1), t)
	SHLQ(U8(amxKeysLog+7), t) // AMXPLen/2 bfloat16
	ADDQ(addr(Param("pb").Base()), t)
	MOVQ(t, a.vP)
}

// flush runs the tile steps left.
func (a *amxFrame) flush(pre string) {
	Label(pre + "flush")
	n := GP64()
	MOVQ(a.sLeft, n)
	ADDQ(a.vLeft, n)
	JZ(LabelRef(pre + "flushed"))
	a.step(pre + "f")
	JMP(LabelRef(pre + "flush"))
	Label(pre + "flushed")
}

// step emits one step of tile work, of the logits while some are left,
// else of the values, if any.
//
// A step of the logits: for 32 keys and a pair of panels, the tiles
// 0 … 3 (keys 0-15 and 16-31 × the two panels) are zeroed at the first
// chunk of columns, get K's two tiles of the chunk times Qᵀ's two, and
// are stored to st after the last. A step of the values: for 32 columns
// and a pair of panels, the tiles of the accumulator are loaded at the
// first 32 keys, get Vᵀ's two tiles of the 32 keys times P's two, and
// are stored after the last (the fourth).
func (a *amxFrame) step(pre string) {
	left := GP64()
	MOVQ(a.sLeft, left)
	TESTQ(left, left)
	JZ(LabelRef(pre + "values"))
	DECQ(left)
	MOVQ(left, a.sLeft)
	{
		ch := GP64()
		MOVQ(a.sCh, ch)
		TESTQ(ch, ch)
		JNZ(LabelRef(pre + "snz"))
		for t := range 4 {
			tileZero(t)
		}
		Label(pre + "snz")
		kstr, k0, k1, q, t, s64 := GP64(), GP64(), GP64(), GP64(), GP64(), GP64()
		MOVQ(addr(Param("dp")), kstr)
		SHLQ(U8(1), kstr) // bytes a key
		MOVQ(ch, k0)
		SHLQ(U8(6), k0)
		ADDQ(a.sK, k0) // the chunk's columns
		MOVQ(kstr, k1)
		SHLQ(U8(4), k1)
		ADDQ(k0, k1) // 16 keys on
		MOVQ(ch, q)
		SHLQ(U8(12), q) // 4 panels of 1 KiB a chunk
		MOVQ(a.sPP, t)
		SHLQ(U8(11), t) // 2 panels
		ADDQ(t, q)
		ADDQ(addr(Param("qb").Base()), q)
		MOVQ(U32(64), s64)
		tileLoad(Mem{Base: k0, Index: kstr, Scale: 1}, 4)
		tileLoad(Mem{Base: k1, Index: kstr, Scale: 1}, 5)
		tileLoad(Mem{Base: q, Index: s64, Scale: 1}, 6)
		tileLoad(Mem{Base: q, Index: s64, Scale: 1, Disp: 1024}, 7)
		tdpbf16ps(6, 4, 0)
		tdpbf16ps(7, 4, 1)
		tdpbf16ps(6, 5, 2)
		tdpbf16ps(7, 5, 3)
		INCQ(ch)
		MOVQ(addr(Param("dp")), t)
		SHRQ(U8(5), t)
		CMPQ(ch, t)
		JL(LabelRef(pre + "skeep"))
		// The last chunk: store panel 2pp at sp, 2pp+1 a panel (amxKeys keys
		// of 64 bytes) on, and move to the next pair or the next 32 keys.
		sp, pp := GP64(), GP64()
		MOVQ(a.sPP, pp)
		MOVQ(pp, sp)
		SHLQ(U8(amxKeysLog+7), sp) // 2 panels of amxKeys keys
		ADDQ(a.sSt, sp)
		tileStore(0, Mem{Base: sp, Index: s64, Scale: 1})
		tileStore(1, Mem{Base: sp, Index: s64, Scale: 1, Disp: amxKeys * 64})
		tileStore(2, Mem{Base: sp, Index: s64, Scale: 1, Disp: 1024})
		tileStore(3, Mem{Base: sp, Index: s64, Scale: 1, Disp: amxKeys*64 + 1024})
		XORQ(ch, ch)
		INCQ(pp)
		CMPQ(pp, addr(Param("npp")))
		JL(LabelRef(pre + "sppkeep"))
		XORQ(pp, pp)
		SHLQ(U8(5), kstr) // 32 keys
		ADDQ(kstr, a.sK)
		ADDQ(U32(32*64), a.sSt)
		Label(pre + "sppkeep")
		MOVQ(pp, a.sPP)
		Label(pre + "skeep")
		MOVQ(ch, a.sCh)
		JMP(LabelRef(pre + "done"))
	}

	Label(pre + "values")
	MOVQ(a.vLeft, left)
	TESTQ(left, left)
	JZ(LabelRef(pre + "done"))
	DECQ(left)
	MOVQ(left, a.vLeft)
	{
		kc, pstr, a0, a1, s64 := GP64(), GP64(), GP64(), GP64(), GP64()
		MOVQ(addr(Param("dp")), pstr)
		SHLQ(U8(6), pstr) // bytes a panel of the accumulator
		MOVQ(a.vPP, a0)
		IMULQ(pstr, a0)
		SHLQ(U8(1), a0)
		ADDQ(a.vAcc, a0)
		LEAQ(Mem{Base: a0, Index: pstr, Scale: 1}, a1)
		MOVQ(U32(64), s64)
		MOVQ(a.vKC, kc)
		TESTQ(kc, kc)
		JNZ(LabelRef(pre + "vnz"))
		tileLoad(Mem{Base: a0, Index: s64, Scale: 1}, 0)
		tileLoad(Mem{Base: a1, Index: s64, Scale: 1}, 1)
		tileLoad(Mem{Base: a0, Index: s64, Scale: 1, Disp: 1024}, 2)
		tileLoad(Mem{Base: a1, Index: s64, Scale: 1, Disp: 1024}, 3)
		Label(pre + "vnz")
		v, p, vstr, t := GP64(), GP64(), GP64(), GP64()
		MOVQ(kc, v)
		SHLQ(U8(6), v) // 32 keys
		ADDQ(a.vV, v)
		MOVQ(kc, p)
		SHLQ(U8(10), p) // 16 rows of pairs
		MOVQ(a.vPP, t)
		SHLQ(U8(amxKeysLog+6), t) // 2 panels of amxKeys/2 rows
		ADDQ(t, p)
		ADDQ(a.vP, p)
		MOVQ(U32(amxKeys*2), vstr)
		tileLoad(Mem{Base: v, Index: vstr, Scale: 1}, 4)
		tileLoad(Mem{Base: v, Index: vstr, Scale: 1, Disp: 16 * amxKeys * 2}, 5)
		tileLoad(Mem{Base: p, Index: s64, Scale: 1}, 6)
		tileLoad(Mem{Base: p, Index: s64, Scale: 1, Disp: amxKeys * 32}, 7)
		tdpbf16ps(6, 4, 0)
		tdpbf16ps(7, 4, 1)
		tdpbf16ps(6, 5, 2)
		tdpbf16ps(7, 5, 3)
		INCQ(kc)
		CMPQ(kc, U8(amxKeys/32))
		JL(LabelRef(pre + "vkeep"))
		tileStore(0, Mem{Base: a0, Index: s64, Scale: 1})
		tileStore(1, Mem{Base: a1, Index: s64, Scale: 1})
		tileStore(2, Mem{Base: a0, Index: s64, Scale: 1, Disp: 1024})
		tileStore(3, Mem{Base: a1, Index: s64, Scale: 1, Disp: 1024})
		XORQ(kc, kc)
		pp := GP64()
		MOVQ(a.vPP, pp)
		INCQ(pp)
		CMPQ(pp, addr(Param("npp")))
		JL(LabelRef(pre + "vppkeep"))
		XORQ(pp, pp)
		ADDQ(U32(32*64), a.vAcc)
		ADDQ(U32(32*amxKeys*2), a.vV)
		Label(pre + "vppkeep")
		MOVQ(pp, a.vPP)
		Label(pre + "vkeep")
		MOVQ(kc, a.vKC)
	}
	Label(pre + "done")
}

// stHalf returns a register with the address of the half of st (or pb,
// with pb set) of block b's parity.
func stHalf(b Register, pb bool) Register {
	t := GP64()
	MOVQ(b, t)
	ANDQ(U8(1), t)
	if pb {
		SHLQ(U8(amxKeysLog+7), t)
		ADDQ(addr(Param("pb").Base()), t)
	} else {
		SHLQ(U8(amxKeysLog+8), t)
		ADDQ(addr(Param("st").Base()), t)
	}
	return t
}

// maxima emits the first phase of the softmax of block b (a register):
// for each panel the maximum of its logits (those of hidden keys set to
// -Inf first from block nfull on), and where it exceeds m by more than
// the threshold the new m and the factor 2^(m-m'), 1 elsewhere.
func (a *amxFrame) maxima(b Register) {
	sp := stHalf(b, false)
	np, p := GP64(), GP64()
	MOVQ(addr(Param("npp")), np)
	SHLQ(U8(1), np)
	XORQ(p, p) // panel
	cv := ZMM()
	VBROADCASTSS(addr(Param("c")), cv)
	Label("mpanel")
	mx := ZMM()
	CMPQ(b, addr(Param("nfull")))
	JGE(LabelRef("mmasked"))
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
		JMP(LabelRef("mgrow"))
	}
	// With limits: key j of a lane is visible when j < lim; the others
	// become -Inf in st.
	Label("mmasked")
	{
		lim, jv, ninf, o := ZMM(), ZMM(), bcastConst(negInf), ZMM()
		lp := GP64()
		MOVQ(p, lp)
		SHLQ(U8(6), lp)
		ADDQ(addr(Param("lim").Base()), lp)
		VMOVDQU32(Mem{Base: lp}, lim)
		j0 := GP64()
		MOVQ(b, j0)
		SHLQ(U8(amxKeysLog), j0)
		VPBROADCASTD(j0.As32(), jv)
		one32 := GP32()
		MOVL(U32(1), one32)
		VPBROADCASTD(one32, o)
		VMOVAPS(ninf, mx)
		n, s := GP64(), GP64()
		MOVQ(sp, s)
		MOVQ(U32(amxKeys), n)
		Label("mmloop")
		x, hidden := ZMM(), K()
		VMOVUPS(Mem{Base: s}, x)
		VPCMPD(U8(5), lim, jv, hidden) // j >= lim: hidden
		VMOVAPS(ninf, hidden, x)
		VMOVUPS(x, Mem{Base: s})
		VMAXPS(x, mx, mx)
		VPADDD(o, jv, jv)
		ADDQ(U8(64), s)
		DECQ(n)
		JNZ(LabelRef("mmloop"))
	}

	// Raise m where the block's maximum exceeds it by more than the
	// threshold.
	Label("mgrow")
	{
		mp, fp, gp := GP64(), GP64(), GP64()
		MOVQ(p, mp)
		SHLQ(U8(6), mp)
		LEAQ(a.f, fp)
		ADDQ(mp, fp)
		ADDQ(addr(Param("m").Base()), mp)
		LEAQ(a.grow, gp)
		mold := ZMM()
		VMOVUPS(Mem{Base: mp}, mold)
		VMULPS(cv, mx, mx)
		lo, grow := ZMM(), K()
		VADDPS_BCST(amxThr, mold, lo)
		VCMPPS(U8(0x1e), lo, mx, grow) // mx > m + threshold, ordered
		fv := bcastConst(one)
		g := GP64()
		XORQ(g, g)
		KORTESTW(grow, grow)
		JZ(LabelRef("mkeep"))
		INCQ(g)
		mnew := ZMM()
		VMOVAPS(mold, mnew)
		VMOVAPS(mx, grow, mnew)
		// f = 2^(m - m'), exactly 1 in the lanes that keep their maximum
		// (0 from the zero-masked subtraction) and 0 where m was -Inf.
		VSUBPS_Z(mnew, mold, grow, fv)
		exp2Lanes512([]VecVirtual{fv}, loadExp2Consts512(false), false)
		VMOVUPS(mnew, Mem{Base: mp})
		Label("mkeep")
		VMOVUPS(fv, Mem{Base: fp})
		MOVQ(g, Mem{Base: gp, Index: p, Scale: 8})
	}
	ADDQ(U32(amxKeys*64), sp)
	INCQ(p)
	CMPQ(p, np)
	JL(LabelRef("mpanel"))
}

// exponentials emits the second phase of the softmax of block b (a
// register): p = 2^(s·c - m), with m taken as 0 where it is -Inf (no key
// seen yet: then s is -Inf too, and p 0), summed into the panel's sum
// and stored in pairs of keys as bfloat16, with the tile steps spread
// over the iterations.
func (a *amxFrame) exponentials(b Register) {
	sp, pp := stHalf(b, false), stHalf(b, true)
	np, p := GP64(), GP64()
	MOVQ(addr(Param("npp")), np)
	SHLQ(U8(1), np)
	XORQ(p, p)
	cv := ZMM()
	VBROADCASTSS(addr(Param("c")), cv)
	e := loadExp2Consts512(false)
	perm := ZMM()
	VMOVDQU16(amxPairs, perm)
	Label("epanel")
	ms := ZMM()
	{
		mp := GP64()
		MOVQ(p, mp)
		SHLQ(U8(6), mp)
		ADDQ(addr(Param("m").Base()), mp)
		keep := K()
		VMOVUPS(Mem{Base: mp}, ms)
		VCMPPS_BCST(U8(4), negInf, ms, keep)
		VMOVAPS_Z(ms, keep, ms)
	}
	sum := newZMMs(2)
	VXORPS(sum[0], sum[0], sum[0])
	VXORPS(sum[1], sum[1], sum[1])
	n := GP64()
	MOVQ(U32(amxKeys/4), n)
	Label("eloop")
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
	if !a.vector {
		a.prefetch()
		a.creditSteps()
	}
	ADDQ(U32(256), sp)
	ADDQ(U32(128), pp)
	DECQ(n)
	JNZ(LabelRef("eloop"))
	{
		s := GP64()
		MOVQ(p, s)
		SHLQ(U8(6), s)
		LEAQ(a.sum, n)
		ADDQ(n, s)
		VADDPS(sum[1], sum[0], sum[0])
		VMOVUPS(sum[0], Mem{Base: s})
	}
	INCQ(p)
	CMPQ(p, np)
	JL(LabelRef("epanel"))
}

// creditSteps emits, in an iteration of the softmax, the tile steps this
// iteration's share of credit pays for.
func (a *amxFrame) creditSteps() {
	c := GP64()
	MOVQ(a.credit, c)
	ADDQ(a.steps, c)
	MOVQ(c, a.credit)
	Label("ecredit")
	MOVQ(a.credit, c)
	CMPQ(c, a.iters)
	JL(LabelRef("epaid"))
	SUBQ(a.iters, c)
	MOVQ(c, a.credit)
	a.step("e")
	JMP(LabelRef("ecredit"))
	Label("epaid")
}

// rescale emits the last phase of the softmax of a block, once the tiles
// have added the block before: for each panel acc *= f where some lane's
// maximum was raised, and l = l·f + the block's sum.
func (a *amxFrame) rescale() {
	np, p := GP64(), GP64()
	MOVQ(addr(Param("npp")), np)
	SHLQ(U8(1), np)
	XORQ(p, p)
	ap := Load(Param("acc").Base(), GP64())
	Label("rpanel")
	f := ZMM()
	{
		o := GP64()
		MOVQ(p, o)
		SHLQ(U8(6), o)
		fp, lp, sp := GP64(), GP64(), GP64()
		LEAQ(a.f, fp)
		ADDQ(o, fp)
		LEAQ(a.sum, sp)
		ADDQ(o, sp)
		VMOVUPS(Mem{Base: fp}, f)
		MOVQ(addr(Param("l").Base()), lp)
		ADDQ(o, lp)
		lv := ZMM()
		VMOVUPS(Mem{Base: sp}, lv)
		VFMADD231PS(Mem{Base: lp}, f, lv) // l·f + sum
		VMOVUPS(lv, Mem{Base: lp})
		gp := GP64()
		LEAQ(a.grow, gp)
		CMPQ(Mem{Base: gp, Index: p, Scale: 8}, U8(0))
	}
	JE(LabelRef("rnext"))
	{
		q, d := GP64(), GP64()
		MOVQ(ap, q)
		Load(Param("dp"), d)
		SHRQ(U8(2), d)
		Label("rrows")
		for i := range 4 {
			v := ZMM()
			VMULPS(Mem{Base: q, Disp: 64 * i}, f, v)
			VMOVUPS(v, Mem{Base: q, Disp: 64 * i})
		}
		ADDQ(U32(256), q)
		DECQ(d)
		JNZ(LabelRef("rrows"))
	}
	Label("rnext")
	{
		d := GP64()
		Load(Param("dp"), d)
		SHLQ(U8(6), d) // dp rows of 64 bytes
		ADDQ(d, ap)
	}
	INCQ(p)
	CMPQ(p, np)
	JL(LabelRef("rpanel"))
}
