package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The bfloat16 decode kernels of AVX512-BF16: DotRowsBF16 and GemmBF16
// with the products of pairs of bfloat16 done by VDPBF16PS, 32 products a
// zmm instruction where an FMA does 16 and the keys or values widened
// first. VDPBF16PS multiplies bfloat16 by bfloat16, so the float32
// operand, the queries or the probabilities, is rounded to bfloat16 first
// (VCVTNE2PS2BF16, to nearest even), into a buffer in the frame: once a
// call for the queries of DotRowsBF16, once a block of rows and of k for
// the probabilities of GemmBF16.

// dotBF16MaxD is the longest part of a row of q the frame buffer of the
// DotRowsBF16 kernels holds: longer rows go in parts, the scores of each
// part added to those of the parts before. qbRow is the bytes of a row in
// the buffer.
const (
	dotBF16MaxD = 512
	qbRow       = 2 * dotBF16MaxD
)

// dotRowsBF16DP emits the DotRowsBF16 kernel with VDPBF16PS, with withPF
// a last parameter pf, a prefetch hint (three quarters of the lines a
// pass over 32 columns of a block reads).
// The rows of q go in groups of 4, 2 or 1 (3 rows make a group of 4 whose
// missing row repeats the last and is not stored), and d in parts of up
// to dotBF16MaxD: the part of a group's rows is rounded to bfloat16 into
// the frame, zero-padded to a multiple of 32 values. Then blocks of R
// rows × 16/R keys keep 16 accumulators over the part, one load of 32
// values of a key for R VDPBF16PS, the last d%32 values of a key read
// with a masked load; the keys left take blocks of R × 4, the last n%4
// keys a block whose missing keys repeat the last one, stored under a
// mask. The parts after the first add their scores to those stored.
func dotRowsBF16DP(name string, split, withPF bool, doc ...string) {
	sig := "func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int"
	if withPF {
		sig += ", pf []uint16"
	}
	// Not NOSPLIT: the frame holds the rounded queries.
	TEXT(name, 0, sig+")")
	Pragma("noescape")
	Doc(doc...)
	var pf *prefetcher
	if withPF {
		pf = newPrefetcher("pf", 2)
	}
	rowsBuf := 4
	if split {
		rowsBuf = 8
	}
	fr := dotBF16Frame{
		split: split,
		qb:    AllocLocal(rowsBuf * qbRow),
		qg:    AllocLocal(8), sg: AllocLocal(8), left: AllocLocal(8),
		dFull: AllocLocal(8), rlast: AllocLocal(8), dc: AllocLocal(8), dlen: AllocLocal(8),
		pf: pf,
	}

	m := Load(Param("rows"), GP64())
	TESTQ(m, m)
	JZ(LabelRef("done"))
	nn := Load(Param("n"), GP64())
	TESTQ(nn, nn)
	JZ(LabelRef("done"))
	MOVQ(m, fr.left)
	{
		q := Load(Param("q").Base(), GP64())
		MOVQ(q, fr.qg)
		s := Load(Param("s").Base(), GP64())
		MOVQ(s, fr.sg)
	}

	Label("group")
	{
		rl := GP64()
		MOVQ(fr.left, rl)
		CMPQ(rl, U8(2))
		JE(LabelRef("g2"))
		JL(LabelRef("g1"))
		JMP(LabelRef("g4"))
	}
	for _, R := range []int{4, 2, 1} {
		Label(fmt.Sprintf("g%d", R))
		dotBF16Group(R, fr)
		// Next group: R rows on (4 for a group of 3, which ends it all).
		ldq := Load(Param("ldq"), GP64())
		SHLQ(U8(2+log2(R)), ldq)
		ADDQ(ldq, fr.qg)
		lds := Load(Param("lds"), GP64())
		SHLQ(U8(2+log2(R)), lds)
		ADDQ(lds, fr.sg)
		SUBQ(U8(R), fr.left)
		JG(LabelRef("group"))
		JMP(LabelRef("done"))
	}

	Label("done")
	VZEROUPPER()
	RET()
}

func log2(x int) uint8 { return map[int]uint8{1: 0, 2: 1, 4: 2}[x] }

// dotBF16Frame holds the frame slots of the DotRowsBF16 kernels: the
// rounded queries, the group's row pointers and rows left, the part of d
// (start dc, length dlen, bytes of its whole 32-value chunks dFull), the
// index of the group's last real row, and the prefetcher.
type dotBF16Frame struct {
	qb, qg, sg, left, dFull, rlast, dc, dlen Mem
	pf                                       *prefetcher
	// split: q is held as two bfloat16 halves, the second 4 rows on.
	split bool
}

// dotBF16Group emits the work of a group of R rows of q at fr.qg, whose
// scores go to the rows of s at fr.sg.
func dotBF16Group(R int, fr dotBF16Frame) {
	pre := fmt.Sprintf("g%d", R)
	Commentf("Group of %d query rows.", R)
	{
		rl := GP64()
		MOVQ(fr.left, rl)
		CMPQ(rl, U8(R))
		JLE(LabelRef(pre + "small"))
		MOVQ(U32(R), rl)
		Label(pre + "small")
		DECQ(rl)
		MOVQ(rl, fr.rlast)
		z := GP64()
		XORQ(z, z)
		MOVQ(z, fr.dc)
	}

	Label(pre + "dchunk")
	{
		dl := Load(Param("d"), GP64())
		SUBQ(fr.dc, dl)
		lim := GP64()
		MOVQ(U32(dotBF16MaxD), lim)
		CMPQ(dl, lim)
		CMOVQGT(lim, dl)
		MOVQ(dl, fr.dlen)
		SHRQ(U8(5), dl)
		SHLQ(U8(6), dl)
		MOVQ(dl, fr.dFull)
	}
	// Round the part of the group's rows of q (the last one repeated for
	// a missing row) to bfloat16.
	for r := 0; r < R; r++ {
		p := fmt.Sprintf("%scv%d", pre, r)
		src, dst, cnt := GP64(), GP64(), GP64()
		MOVQ(U32(r), src)
		CMPQ(src, fr.rlast)
		CMOVQGT(fr.rlast, src)
		IMULQ(addr(Param("ldq")), src)
		ADDQ(fr.dc, src)
		SHLQ(U8(2), src)
		ADDQ(fr.qg, src)
		LEAQ(fr.qb.Offset(r*qbRow), dst)
		MOVQ(fr.dlen, cnt)
		loOff := 0
		if fr.split {
			loOff = 4 * qbRow
		}
		roundRowBF16(p, src, dst, cnt, loOff)
	}

	kp := Load(Param("k").Base(), GP64())
	{
		dc := GP64()
		MOVQ(fr.dc, dc)
		LEAQ(Mem{Base: kp, Index: dc, Scale: 2}, kp)
	}
	sp := GP64()
	MOVQ(fr.sg, sp)
	j := Load(Param("n"), GP64())
	// Blocks of 16/R keys, then of 4, then the last n%4.
	widths := []int{16 / R, 4}
	if R == 4 {
		widths = widths[:1]
	}
	for _, J := range widths {
		b := fmt.Sprintf("%sk%d", pre, J)
		Label(b)
		CMPQ(j, U8(J))
		JL(LabelRef(fmt.Sprintf("%sk%dend", pre, J)))
		dotBF16Block(b, R, J, true, kp, sp, j, fr)
		ldk := Load(Param("ldk"), GP64())
		IMUL3Q(U32(2*J), ldk, ldk)
		ADDQ(ldk, kp)
		ADDQ(U8(4*J), sp)
		SUBQ(U8(J), j)
		JMP(LabelRef(b))
		Label(fmt.Sprintf("%sk%dend", pre, J))
	}
	TESTQ(j, j)
	JZ(LabelRef(pre + "dnext"))
	dotBF16Block(pre+"kt", R, 4, false, kp, sp, j, fr)
	Label(pre + "dnext")
	ADDQ(U32(dotBF16MaxD), fr.dc)
	{
		d := Load(Param("d"), GP64())
		CMPQ(fr.dc, d)
		JL(LabelRef(pre + "dchunk"))
	}
}

// roundRowBF16 emits the rounding of cnt float32 at src to bfloat16 at
// dst, 32 at a time, the last cnt%32 read under a mask and zero-padded to
// 32. With loOff > 0 it also stores at dst+loOff the rounding of what
// that leaves, x - bf16(x): the two halves of a split whose sum is within
// 2^-18 of |x| (relative error 2^-9 of a remainder itself within 2^-9 of
// |x|). It changes src, dst and cnt.
func roundRowBF16(pre string, src, dst, cnt Register, loOff int) {
	convert := func(lo, hi VecVirtual) {
		z := ZMM()
		vcvtne2ps2bf16(lo, hi, z)
		VMOVUPS(z, Mem{Base: dst})
		if loOff == 0 {
			return
		}
		t0, t1, y := ZMM(), ZMM(), YMM()
		VPMOVZXWD(z.AsY(), t0)
		VPSLLD(U8(16), t0, t0)
		VEXTRACTI64X4(U8(1), z, y)
		VPMOVZXWD(y, t1)
		VPSLLD(U8(16), t1, t1)
		VSUBPS(t0, lo, lo)
		VSUBPS(t1, hi, hi)
		vcvtne2ps2bf16(lo, hi, z)
		VMOVUPS(z, Mem{Base: dst, Disp: loOff})
	}
	Label(pre + "loop")
	CMPQ(cnt, U8(32))
	JL(LabelRef(pre + "tail"))
	{
		lo, hi := ZMM(), ZMM()
		VMOVUPS(Mem{Base: src}, lo)
		VMOVUPS(Mem{Base: src, Disp: 64}, hi)
		convert(lo, hi)
	}
	ADDQ(U32(128), src)
	ADDQ(U8(64), dst)
	SUBQ(U8(32), cnt)
	JMP(LabelRef(pre + "loop"))
	Label(pre + "tail")
	TESTQ(cnt, cnt)
	JZ(LabelRef(pre + "end"))
	{
		bits, ones := GP32(), GP32()
		MOVL(U32(0xffffffff), ones)
		BZHIL(cnt.(GPVirtual).As32(), ones, bits)
		klo, khi := K(), K()
		KMOVW(bits, klo)
		SHRL(U8(16), bits)
		KMOVW(bits, khi)
		lo, hi := ZMM(), ZMM()
		VMOVUPS_Z(Mem{Base: src}, klo, lo)
		VMOVUPS_Z(Mem{Base: src, Disp: 64}, khi, hi)
		convert(lo, hi)
	}
	Label(pre + "end")
}

// dotBF16Block emits one block of R query rows × J keys at kp, the scores
// stored at sp (or added to those there, for the parts of d after the
// first). With full false, J is 4 and j (1 … 3) keys are left: the others
// repeat the last and are not stored.
func dotBF16Block(pre string, R, J int, full bool, kp, sp, j Register, fr dotBF16Frame) {
	Commentf("Block of %d rows × %d keys%s.", R, J, map[bool]string{true: "", false: ", the last keys"}[full])
	// Key i at kb[i/4] + (i%4)·ldk, the pointers moving 32 values a chunk.
	ldk, ldk3 := Load(Param("ldk"), GP64()), GP64()
	SHLQ(U8(1), ldk)
	LEAQ(Mem{Base: ldk, Index: ldk, Scale: 2}, ldk3)
	var kb []Register
	keyAt := func(i int) Mem {
		if !full {
			return Mem{Base: kb[i]}
		}
		b := kb[i/4]
		switch i % 4 {
		case 0:
			return Mem{Base: b}
		case 1:
			return Mem{Base: b, Index: ldk, Scale: 1}
		case 2:
			return Mem{Base: b, Index: ldk, Scale: 2}
		}
		return Mem{Base: b, Index: ldk3, Scale: 1}
	}
	if full {
		kb = make([]Register, J/4)
		for g := range kb {
			kb[g] = GP64()
			if g == 0 {
				MOVQ(kp, kb[g])
			} else {
				LEAQ(Mem{Base: kb[g-1], Index: ldk, Scale: 4}, kb[g])
			}
		}
	} else {
		// kp + min(i, j-1)·ldk
		last := GP64()
		MOVQ(j, last)
		DECQ(last)
		kb = make([]Register, 4)
		for i := range kb {
			kb[i] = GP64()
			if i == 0 {
				MOVQ(kp, kb[i])
				continue
			}
			idx := GP64()
			MOVQ(U32(i), idx)
			CMPQ(idx, last)
			CMOVQGT(last, idx)
			IMULQ(ldk, idx)
			LEAQ(Mem{Base: kp, Index: idx, Scale: 1}, kb[i])
		}
	}
	acc := make([][]VecVirtual, R)
	for r := range acc {
		acc[r] = newZMMs(J)
		for _, a := range acc[r] {
			VXORPS(a, a, a)
		}
	}
	qp, c := GP64(), GP64()
	LEAQ(fr.qb, qp)
	MOVQ(fr.dFull, c)
	chunk := func(mask Op) {
		halves := 1
		if fr.split {
			halves = 2
		}
		qv := make([][]VecVirtual, halves)
		for h := range qv {
			qv[h] = newZMMs(R)
			for r := range qv[h] {
				VMOVUPS(Mem{Base: qp, Disp: (4*h + r) * qbRow}, qv[h][r])
			}
		}
		for i := 0; i < J; i++ {
			kv := ZMM()
			if mask == nil {
				VMOVUPS(keyAt(i), kv)
			} else {
				VMOVDQU16_Z(keyAt(i), mask, kv)
			}
			for h := range qv {
				for r := range qv[h] {
					vdpbf16ps(kv, qv[h][r], acc[r][i])
				}
			}
		}
	}
	TESTQ(c, c)
	JZ(LabelRef(pre + "ctail"))
	Label(pre + "c")
	if fr.pf != nil {
		fr.pf.next(3 * J / 4)
	}
	chunk(nil)
	for _, b := range kb {
		ADDQ(U8(64), b)
	}
	ADDQ(U8(64), qp)
	SUBQ(U8(64), c)
	JNZ(LabelRef(pre + "c"))
	Label(pre + "ctail")
	{
		rem := GP64()
		MOVQ(fr.dlen, rem)
		ANDQ(U8(31), rem)
		JZ(LabelRef(pre + "reduce"))
		bits, ones := GP32(), GP32()
		MOVL(U32(0xffffffff), ones)
		BZHIL(rem.As32(), ones, bits)
		km := K()
		KMOVD(bits, km)
		chunk(km)
	}

	Label(pre + "reduce")
	// The R·J sums in lanes r·J + i, padded to 16 vectors.
	var list []VecVirtual
	for r := range acc {
		list = append(list, acc[r]...)
	}
	for len(list) < 16 {
		list = append(list, list[0])
	}
	res := reduce4x4([][]VecVirtual{list[0:4], list[4:8], list[8:12], list[12:16]})
	lds := Load(Param("lds"), GP64())
	SHLQ(U8(2), lds)
	var km Register
	if !full {
		bits, ones := GP32(), GP32()
		MOVL(U32(0xf), ones)
		BZHIL(j.(GPVirtual).As32(), ones, bits)
		km = K()
		KMOVW(bits, km)
	}
	// Store the scores, or add them to those of the parts before.
	for _, add := range []bool{false, true} {
		p := pre + map[bool]string{false: "st", true: "add"}[add]
		if !add {
			CMPQ(fr.dc, U8(0))
			JNE(LabelRef(pre + "add"))
		} else {
			Label(p)
		}
		row := GP64()
		MOVQ(sp, row)
		for r := 0; r < R; r++ {
			if r > 0 {
				CMPQ(fr.rlast, U8(r))
				JL(LabelRef(pre + "stored"))
				ADDQ(lds, row)
			}
			storeScores(res, r, J, add, km, Mem{Base: row})
		}
		JMP(LabelRef(pre + "stored"))
	}
	Label(pre + "stored")
}

// storeScores stores (or with add, adds to memory) the J lanes r·J … of
// res at at, under the mask km when it is not nil (J = 4).
func storeScores(res VecVirtual, r, J int, add bool, km Register, at Mem) {
	var x VecVirtual
	switch J {
	case 16:
		x = res
	case 8:
		x = YMM()
		VEXTRACTF32X8(U8(r), res, x)
	default:
		x = XMM()
		VEXTRACTF32X4(U8(r), res, x)
	}
	if add {
		if km == nil {
			VADDPS(at, x, x)
		} else {
			old := XMM()
			VMOVUPS_Z(at, km, old)
			VADDPS(old, x, x)
		}
	}
	if km == nil {
		VMOVUPS(x, at)
	} else {
		VMOVUPS(x, km, at)
	}
}

// reduce4x4 returns the sums of the 16 lanes of each acc[a][b] in one zmm
// register, that of acc[a][b] in lane 4a+b: pairs of vectors combined by
// two shuffles and an add, halving the lanes each sums over, then the
// 128-bit lanes of pairs.
func reduce4x4(acc [][]VecVirtual) VecVirtual {
	// combine returns, in each 128-bit lane, x0+x1, x2+x3, y0+y1, y2+y3.
	combine := func(x, y VecVirtual) VecVirtual {
		a, b := ZMM(), ZMM()
		VSHUFPS(U8(0x88), y, x, a)
		VSHUFPS(U8(0xdd), y, x, b)
		VADDPS(b, a, a)
		return a
	}
	// lanes returns, for 128-bit lanes of x and y, x.L0+x.L1, x.L2+x.L3,
	// y.L0+y.L1, y.L2+y.L3.
	lanes := func(x, y VecVirtual) VecVirtual {
		a, b := ZMM(), ZMM()
		VSHUFF32X4(U8(0x88), y, x, a)
		VSHUFF32X4(U8(0xdd), y, x, b)
		VADDPS(b, a, a)
		return a
	}
	rows := make([]VecVirtual, 4)
	for r := range rows {
		// Each 128-bit lane: a part of the sum of each of the 4.
		rows[r] = combine(combine(acc[r][0], acc[r][1]), combine(acc[r][2], acc[r][3]))
	}
	return lanes(lanes(rows[0], rows[1]), lanes(rows[2], rows[3]))
}

// gemmKC is the number of steps of k of GemmBF16 whose probabilities are
// rounded into the frame at a time, and abRow the bytes of a row there.
const (
	gemmKC = 256
	abRow  = 2 * gemmKC
)

// gemmBF16DP emits gemmBF16AVX512BF16: C = A·B or C += A·B with B in
// bfloat16 and A rounded to bfloat16, VDPBF16PS multiplying the pairs of
// A[i][p], A[i][p+1] (one 32-bit broadcast) and B[p][j], B[p+1][j] (two
// rows of B interleaved by VPUNPCKLWD and VPUNPCKHWD). Row blocks of up
// to 6 rows go through k in chunks of gemmKC, each chunk of their A
// rounded into the frame; then blocks of 6 rows × 32 columns, two
// accumulators a row (the interleaving leaves columns 0-3, 8-11, 16-19,
// 24-27 in one and the others in the other, so C is split that way as it
// is loaded and merged back as it is stored), and a last block of n%32
// columns under masks. Two lines of pf are prefetched every two steps of
// k: as many as the block reads of B.
func gemmBF16DP(name string, split bool, doc ...string) {
	TEXT(name, 0, "func(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16)")
	Pragma("noescape")
	Doc(doc...)
	pf := newPrefetcher("pf", 2)
	halves := 1
	if split {
		halves = 2
	}
	ab := AllocLocal(halves * maxRows * abRow)
	aRowM, cRowM, leftM, k0M, kcM, flagM := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	m := Load(Param("m"), GP64())
	TESTQ(m, m)
	JZ(LabelRef("done"))
	n := Load(Param("n"), GP64())
	TESTQ(n, n)
	JZ(LabelRef("done"))
	MOVQ(m, leftM)
	{
		a := Load(Param("a").Base(), GP64())
		MOVQ(a, aRowM)
		c := Load(Param("c").Base(), GP64())
		MOVQ(c, cRowM)
	}
	Label("rows")
	{
		rl := GP64()
		MOVQ(leftM, rl)
		CMPQ(rl, U8(maxRows))
		JGE(LabelRef("rows6"))
		for r := maxRows - 1; r >= 1; r-- {
			CMPQ(rl, U8(r))
			JE(LabelRef(fmt.Sprintf("rows%d", r)))
		}
		JMP(LabelRef("done"))
	}
	for r := maxRows; r >= 1; r-- {
		Label(fmt.Sprintf("rows%d", r))
		gemmBF16Rows(r, split, ab, aRowM, cRowM, k0M, kcM, flagM, pf)
		// Next row block.
		lda := Load(Param("lda"), GP64())
		IMUL3Q(U32(4*r), lda, lda)
		ADDQ(lda, aRowM)
		ldc := Load(Param("ldc"), GP64())
		IMUL3Q(U32(4*r), ldc, ldc)
		ADDQ(ldc, cRowM)
		SUBQ(U8(r), leftM)
		JG(LabelRef("rows"))
		JMP(LabelRef("done"))
	}

	Label("done")
	VZEROUPPER()
	RET()
}

// gemmBF16Rows emits the work of one block of r rows of A and C.
func gemmBF16Rows(r int, split bool, ab, aRowM, cRowM, k0M, kcM, flagM Mem, pf *prefetcher) {
	pre := fmt.Sprintf("r%d", r)
	Commentf("Block of %d rows.", r)
	{
		z := GP64()
		XORQ(z, z)
		MOVQ(z, k0M)
	}
	Label(pre + "kchunk")
	{
		// kc = min(k - k0, gemmKC); the flag: accumulate, or k0 > 0.
		kc := Load(Param("k"), GP64())
		SUBQ(k0M, kc)
		lim := GP64()
		MOVQ(U32(gemmKC), lim)
		CMPQ(kc, lim)
		CMOVQGT(lim, kc)
		MOVQ(kc, kcM)
		f := GP64()
		MOVBQZX(addr(Param("accumulate")), f)
		k0 := GP64()
		MOVQ(k0M, k0)
		one := GP64()
		MOVQ(U32(1), one)
		TESTQ(k0, k0)
		CMOVQNE(one, f)
		MOVQ(f, flagM)
	}
	// Round the chunk of the block's rows of A to bfloat16.
	for i := 0; i < r; i++ {
		p := fmt.Sprintf("%scv%d", pre, i)
		src, dst, cnt := GP64(), GP64(), GP64()
		MOVQ(U32(i), src)
		IMULQ(addr(Param("lda")), src)
		ADDQ(k0M, src)
		SHLQ(U8(2), src)
		ADDQ(aRowM, src)
		LEAQ(ab.Offset(i*abRow), dst)
		MOVQ(kcM, cnt)
		loOff := 0
		if split {
			loOff = maxRows * abRow
		}
		roundRowBF16(p, src, dst, cnt, loOff)
	}

	// The column blocks, B from row k0.
	bp, cp, jn := GP64(), GP64(), GP64()
	Load(Param("ldb"), bp)
	IMULQ(k0M, bp)
	SHLQ(U8(1), bp)
	ADDQ(addr(Param("b").Base()), bp)
	MOVQ(cRowM, cp)
	Load(Param("n"), jn)
	// Blocks of 32·w columns, w such that the block has at least 6
	// accumulators (chains of VDPBF16PS in flight), then of 32, then the
	// masked n%32 last.
	ws := []int{1}
	switch {
	case r == 1:
		ws = []int{4, 2, 1}
	case r == 2:
		ws = []int{2, 1}
	}
	for _, w := range ws {
		l := fmt.Sprintf("%scols%d", pre, w)
		Label(l)
		CMPQ(jn, U8(32*w))
		JL(LabelRef(l + "end"))
		gemmBF16Cols(r, w, split, fmt.Sprintf("%sw%d", pre, w), nil, bp, cp, ab, kcM, flagM, pf)
		ADDQ(U32(64*w), bp)
		ADDQ(U32(128*w), cp)
		SUBQ(U8(32*w), jn)
		JMP(LabelRef(l))
		Label(l + "end")
	}
	TESTQ(jn, jn)
	JZ(LabelRef(pre + "knext"))
	gemmBF16Cols(r, 1, split, pre+"t", jn, bp, cp, ab, kcM, flagM, pf)

	Label(pre + "knext")
	ADDQ(U32(gemmKC), k0M)
	{
		k := Load(Param("k"), GP64())
		CMPQ(k0M, k)
		JL(LabelRef(pre + "kchunk"))
	}
}

// gemmBF16Cols emits one block of r rows × 32·w columns of C at cp, B
// from bp, kc steps of k; with tail not nil (w = 1), a register holding
// the columns left (8, 16 or 24), the loads and stores are masked to them.
func gemmBF16Cols(r, w int, split bool, pre string, tail Register, bp, cp Register, ab, kcM, flagM Mem, pf *prefetcher) {
	var kb, kc0, kc1 Register // masks: B's words, C's two halves
	if tail != nil {
		bits, ones := GP32(), GP32()
		MOVL(U32(0xffffffff), ones)
		BZHIL(tail.(GPVirtual).As32(), ones, bits)
		kb, kc0, kc1 = K(), K(), K()
		KMOVD(bits, kb)
		KMOVW(bits, kc0)
		SHRL(U8(16), bits)
		KMOVW(bits, kc1)
	}
	ldc := Load(Param("ldc"), GP64())
	SHLQ(U8(2), ldc)
	var c3 Register
	if r > 3 {
		c3 = row3(cp, ldc)
	}
	// acc[i][2g], acc[i][2g+1]: the two halves of columns 32g … 32g+31.
	acc := make([][]VecVirtual, r)
	for i := range acc {
		acc[i] = newZMMs(2 * w)
	}
	f := GP64()
	MOVQ(flagM, f)
	TESTQ(f, f)
	JNZ(LabelRef(pre + "load"))
	for i := range acc {
		for _, a := range acc[i] {
			VXORPS(a, a, a)
		}
	}
	JMP(LabelRef(pre + "init"))
	Label(pre + "load")
	for i := range acc {
		for g := 0; g < w; g++ {
			at := rowAddr(cp, c3, ldc, i).Offset(128 * g)
			c0, c1 := ZMM(), ZMM()
			if tail == nil {
				VMOVUPS(at, c0)
				VMOVUPS(at.Offset(64), c1)
			} else {
				VMOVUPS_Z(at, kc0, c0)
				VMOVUPS_Z(at.Offset(64), kc1, c1)
			}
			VSHUFF32X4(U8(0x88), c1, c0, acc[i][2*g])   // columns 0-3, 8-11, 16-19, 24-27
			VSHUFF32X4(U8(0xdd), c1, c0, acc[i][2*g+1]) // 4-7, 12-15, 20-23, 28-31
		}
	}
	Label(pre + "init")

	bq, pi, cnt, ldb := GP64(), GP64(), GP64(), GP64()
	MOVQ(bp, bq)
	XORQ(pi, pi)
	Load(Param("ldb"), ldb)
	SHLQ(U8(1), ldb)
	abp := GP64()
	LEAQ(ab, abp)
	MOVQ(kcM, cnt)
	SHRQ(U8(1), cnt)
	JZ(LabelRef(pre + "odd"))
	loadB := func(at Mem, v VecVirtual) {
		if tail == nil {
			VMOVUPS(at, v)
		} else {
			VMOVDQU16_Z(at, kb, v)
		}
	}
	halves := 1
	if split {
		halves = 2
	}
	// dots multiplies the interleaved pairs of rows of B, lohi[2g] and
	// lohi[2g+1] for the columns of group g, by each row's pair of A.
	dots := func(lohi []VecVirtual) {
		for h := 0; h < halves; h++ {
			for i := range acc {
				a := ZMM()
				VPBROADCASTD(Mem{Base: abp, Index: pi, Scale: 1, Disp: (h*maxRows + i) * abRow}, a)
				for x, v := range lohi {
					vdpbf16ps(v, a, acc[i][x])
				}
			}
		}
	}
	Label(pre + "pairs")
	pf.next(2)
	{
		lohi := newZMMs(2 * w)
		for g := 0; g < w; g++ {
			b0, b1 := ZMM(), ZMM()
			loadB(Mem{Base: bq, Disp: 64 * g}, b0)
			loadB(Mem{Base: bq, Index: ldb, Scale: 1, Disp: 64 * g}, b1)
			VPUNPCKLWD(b1, b0, lohi[2*g])
			VPUNPCKHWD(b1, b0, lohi[2*g+1])
		}
		dots(lohi)
	}
	LEAQ(Mem{Base: bq, Index: ldb, Scale: 2}, bq)
	ADDQ(U8(4), pi)
	DECQ(cnt)
	JNZ(LabelRef(pre + "pairs"))

	Label(pre + "odd")
	TESTQ(U32(1), kcM)
	JZ(LabelRef(pre + "store"))
	{
		z := ZMM()
		VXORPS(z, z, z)
		lohi := newZMMs(2 * w)
		for g := 0; g < w; g++ {
			b0 := ZMM()
			loadB(Mem{Base: bq, Disp: 64 * g}, b0)
			VPUNPCKLWD(z, b0, lohi[2*g])
			VPUNPCKHWD(z, b0, lohi[2*g+1])
		}
		dots(lohi)
	}

	Label(pre + "store")
	for i := range acc {
		for g := 0; g < w; g++ {
			at := rowAddr(cp, c3, ldc, i).Offset(128 * g)
			lo, hi := acc[i][2*g], acc[i][2*g+1]
			t0, t1 := ZMM(), ZMM()
			VSHUFF32X4(U8(0x44), hi, lo, t0) // lo.L0, lo.L1, hi.L0, hi.L1
			VSHUFF32X4(U8(0xee), hi, lo, t1) // lo.L2, lo.L3, hi.L2, hi.L3
			VSHUFF32X4(U8(0xd8), t0, t0, t0) // lo.L0, hi.L0, lo.L1, hi.L1
			VSHUFF32X4(U8(0xd8), t1, t1, t1)
			if tail == nil {
				VMOVUPS(t0, at)
				VMOVUPS(t1, at.Offset(64))
			} else {
				VMOVUPS(t0, kc0, at)
				VMOVUPS(t1, kc1, at.Offset(64))
			}
		}
	}
}

// decodeBF16 emits the AVX512-BF16 decode kernels: those of DotRowsBF16
// and GemmBF16 with the float32 operand split in two bfloat16 halves, two
// VDPBF16PS a product, and those of DotRowsBF16Native and GemmBF16Native
// with it rounded to bfloat16, one.
func decodeBF16() {
	dotRowsBF16DP("dotRowsBF16AVX512BF16", true, false,
		"dotRowsBF16AVX512BF16 is DotRowsBF16 with q split in two bfloat16 halves and",
		"VDPBF16PS; the slices must be long enough (the Go caller checks).",
	)
	dotRowsBF16DP("dotRowsBF16PFAVX512BF16", true, true,
		"dotRowsBF16PFAVX512BF16 is dotRowsBF16AVX512BF16 prefetching pf (see DotRowsBF16PF).",
	)
	dotRowsBF16DP("dotRowsBF16NativeAVX512BF16", false, true,
		"dotRowsBF16NativeAVX512BF16 is DotRowsBF16Native with q rounded to bfloat16 and",
		"VDPBF16PS; the slices must be long enough (the Go caller checks).",
	)
	gemmBF16DP("gemmBF16AVX512BF16", true,
		"gemmBF16AVX512BF16 computes C = A·B or C += A·B with B in bfloat16 and A split in",
		"two bfloat16 halves, with VDPBF16PS (see GemmBF16). n must be a multiple of 8; the",
		"slices must be long enough (the Go caller checks).",
	)
	gemmBF16DP("gemmBF16NativeAVX512BF16", false,
		"gemmBF16NativeAVX512BF16 computes C = A·B or C += A·B with B in bfloat16 and A rounded",
		"to bfloat16, with VDPBF16PS (see GemmBF16Native). n must be a multiple of 8; the",
		"slices must be long enough (the Go caller checks).",
	)
}
