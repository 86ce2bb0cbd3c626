package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The kernels of the KV-cache decode step: widening 16-bit cache rows to
// float32, and the scores of a group of query rows against a tile of
// keys.

// widenBF16 emits widenBF16AVX2: a bfloat16 is the upper half of a
// float32, so each group of 8 is zero-extended to 32-bit lanes and
// shifted left by 16.
func widenBF16() {
	widen("widenBF16AVX2",
		"widenBF16AVX2 sets dst[i] to the float32 whose bits are src[i]<<16; len(dst) >= len(src).",
		func(src Mem, v VecVirtual) {
			VPMOVZXWD(src, v)
			VPSLLD(U8(16), v, v)
		},
		func(src, dst Mem) {
			t := GP32()
			MOVWLZX(src, t)
			SHLL(U8(16), t)
			MOVL(t, dst)
		})
}

// widenF16 emits widenF16AVX2 with the F16C conversion, which is exact:
// subnormal halves become normal floats, Inf stays Inf, and a NaN keeps
// its sign and payload, a signalling one being quietened.
func widenF16() {
	widen("widenF16AVX2",
		"widenF16AVX2 sets dst[i] to the binary16 value src[i] as a float32; len(dst) >= len(src). It needs F16C.",
		func(src Mem, v VecVirtual) {
			VCVTPH2PS(src, v)
		},
		func(src, dst Mem) {
			t := GP32()
			MOVWLZX(src, t)
			x := XMM()
			VMOVD(t, x)
			VCVTPH2PS(x, x)
			VMOVSS(x, dst)
		})
}

// widen emits a loop converting 32 and then 8 values of src to float32
// per step with conv, which reads 16 bytes of src into 8 lanes. A tail of
// len%8 values is done again as the last 8 values of the slices, which
// overlap the previous group, when the slices hold at least 8; shorter
// slices go one value at a time through scalar.
func widen(name, doc string, conv func(src Mem, v VecVirtual), scalar func(src, dst Mem)) {
	TEXT(name, NOSPLIT, "func(dst []float32, src []uint16)")
	Pragma("noescape")
	Doc(doc)
	d := Mem{Base: Load(Param("dst").Base(), GP64())}
	s := Mem{Base: Load(Param("src").Base(), GP64())}
	n := Load(Param("src").Len(), GP64())

	Label("loop32")
	CMPQ(n, U8(32))
	JL(LabelRef("loop8"))
	for u := 0; u < 4; u++ {
		v := YMM()
		conv(s.Offset(16*u), v)
		VMOVUPS(v, d.Offset(32*u))
	}
	ADDQ(U8(64), s.Base)
	ADDQ(U32(128), d.Base)
	SUBQ(U8(32), n)
	JMP(LabelRef("loop32"))

	Label("loop8")
	CMPQ(n, U8(8))
	JL(LabelRef("tail"))
	{
		v := YMM()
		conv(s, v)
		VMOVUPS(v, d)
	}
	ADDQ(U8(16), s.Base)
	ADDQ(U8(32), d.Base)
	SUBQ(U8(8), n)
	JMP(LabelRef("loop8"))

	Label("tail")
	TESTQ(n, n)
	JZ(LabelRef("end"))
	total := Load(Param("src").Len(), GP64())
	CMPQ(total, U8(8))
	JL(LabelRef("scalar"))
	// The last 8 values: back up by 8-n of them.
	LEAQ(Mem{Base: s.Base, Index: n, Scale: 2, Disp: -16}, s.Base)
	LEAQ(Mem{Base: d.Base, Index: n, Scale: 4, Disp: -32}, d.Base)
	{
		v := YMM()
		conv(s, v)
		VMOVUPS(v, d)
	}
	JMP(LabelRef("end"))

	Label("scalar")
	scalar(s, d)
	ADDQ(U8(2), s.Base)
	ADDQ(U8(4), d.Base)
	DECQ(n)
	JNZ(LabelRef("scalar"))

	Label("end")
	VZEROUPPER()
	RET()
}

// dotRowsKeys lists the key-block widths of a group of r query rows,
// widest first: the widest is the loop over the keys, the others take
// the n%widest keys left, each at most once. The widest blocks have 8 to
// 12 accumulators, so 8 to 12 FMA chains (FMA latency 4 × 2 pipes is 8),
// and with the vectors held for 8 columns and a temporary fill the 16
// ymm registers. They measured faster than narrower blocks (4×2, 3×2,
// 2×4; figures: results/2026-12-07, "Figures moved out of code comments"): the horizontal sums at the end of a
// block cost a good part of its FMAs at d = 64, and wider blocks do fewer
// of them per key.
func dotRowsKeys(r int) []int {
	switch r {
	case 1:
		return []int{8, 4, 2, 1}
	case 2:
		return []int{6, 4, 2, 1}
	case 3:
		return []int{4, 2, 1}
	default:
		return []int{3, 2, 1}
	}
}

// kElem describes the element type of k for the dotRows generator: its
// size in bytes and how 8 values at a memory operand become 8 float32
// lanes of a ymm register.
type kElem struct {
	size int
	// load reads 8 values of k at m into v as float32.
	load func(m Mem, v VecVirtual)
	// direct says whether m may instead be the memory operand of an FMA
	// (float32 keys).
	direct bool
}

var (
	kF32 = kElem{4, func(m Mem, v VecVirtual) { VMOVUPS(m, v) }, true}
	// kBF16 zero-extends 8 bfloat16 values to 32-bit lanes and shifts
	// them to the upper half, which is exact.
	kBF16 = kElem{2, func(m Mem, v VecVirtual) {
		VPMOVZXWD(m, v)
		VPSLLD(U8(16), v, v)
	}, false}
	// kF16 converts 8 binary16 values with F16C, exactly.
	kF16 = kElem{2, func(m Mem, v VecVirtual) { VCVTPH2PS(m, v) }, false}
	// kI8 sign-extends 8 int8 values to 32-bit lanes (VPMOVSXBD reads 8
	// bytes) and converts them to float32, exactly.
	kI8 = kElem{1, func(m Mem, v VecVirtual) {
		VPMOVSXBD(m, v)
		VCVTDQ2PS(v, v)
	}, false}
)

// log2Size returns log2 of size, an element size of 1, 2 or 4 bytes:
// the shift that turns a count of elements into bytes.
func log2Size(size int) uint8 {
	return map[int]uint8{1: 0, 2: 1, 4: 2}[size]
}

// shlSize multiplies r, a count of elements of size bytes, by size.
func shlSize(r Register, size int) {
	if sh := log2Size(size); sh > 0 {
		SHLQ(U8(sh), r)
	}
}

// dotRows emits dotRowsAVX2 and its variants with 16-bit keys widened in
// registers, dotRowsBF16AVX2 and dotRowsF16AVX2: the same code but for the
// loads of k.
func dotRows() {
	dotRowsKernel("dotRowsAVX2", "[]float32", kF32, false,
		"dotRowsAVX2 sets s[r*lds+j] = Σ_c q[r*ldq+c]·k[j*ldk+c] for r < rows, j < n, c < d",
		"(see DotRows); the Go caller checks the sizes.",
	)
	dotRowsKernel("dotRowsBF16AVX2", "[]uint16", kBF16, false,
		"dotRowsBF16AVX2 is dotRowsAVX2 with k in bfloat16, widened in registers",
		"(see DotRowsBF16); the Go caller checks the sizes.",
	)
	dotRowsKernel("dotRowsF16AVX2", "[]uint16", kF16, false,
		"dotRowsF16AVX2 is dotRowsAVX2 with k in binary16, widened in registers with F16C",
		"(see DotRowsF16); the Go caller checks the sizes.",
	)
}

// dotRowsPF emits the DotRows kernels with a prefetch hint: the same code
// with a line of pf (two for float32 keys) prefetched every pass over 16
// columns of a block of keys (see dotRowsBlock, pfLinesPerPass).
func dotRowsPF() {
	dotRowsKernel("dotRowsPFAVX2", "[]float32", kF32, true,
		"dotRowsPFAVX2 is dotRowsAVX2 prefetching pf a line at a time (see DotRowsPF).",
	)
	dotRowsKernel("dotRowsBF16PFAVX2", "[]uint16", kBF16, true,
		"dotRowsBF16PFAVX2 is dotRowsBF16AVX2 prefetching pf a line at a time (see DotRowsBF16PF).",
	)
	dotRowsKernel("dotRowsF16PFAVX2", "[]uint16", kF16, true,
		"dotRowsF16PFAVX2 is dotRowsF16AVX2 prefetching pf a line at a time (see DotRowsF16PF).",
	)
}

// dotRowsKernel emits one DotRows kernel with keys of type ke, and with
// withPF a last parameter pf, a prefetch hint (see prefetcher). The rows of
// q go in groups of 4 (the last group has rows%4), and for each group the
// keys in blocks (see dotRowsKeys). A block of R rows × J keys keeps R·J
// accumulators over the whole length d: for each 8 columns, each of the J
// key rows is loaded once and multiplied into the R query rows (or the
// other way round when R < J), the loads of the other operand coming from
// L1. Blends and adds (see reduceMany) turn the R·J accumulators into
// vectors of results at the end of the block. Groups after the first
// read the keys again, from L1 or L2 for the tiles of a decode step.
func dotRowsKernel(name, kType string, ke kElem, withPF bool, doc ...string) {
	sig := "func(s []float32, lds int, q []float32, ldq, rows int, k " + kType + ", ldk, n, d int"
	if withPF {
		sig += ", pf " + kType
	}
	TEXT(name, NOSPLIT, sig+")")
	Pragma("noescape")
	Doc(doc...)
	var pf *prefetcher
	if withPF {
		pf = newPrefetcher("pf", ke.size)
	}
	var buf Mem
	if !ke.direct {
		// The d%8 last values of a key row, zero-padded to 8.
		buf = AllocLocal(16)
	}
	m := Load(Param("rows"), GP64())
	TESTQ(m, m)
	JZ(LabelRef("done"))
	nn := Load(Param("n"), GP64())
	TESTQ(nn, nn)
	JZ(LabelRef("done"))
	qg := Load(Param("q").Base(), GP64())
	sg := Load(Param("s").Base(), GP64())

	Label("rows4")
	CMPQ(m, U8(4))
	JL(LabelRef("rowsTail"))
	dotRowsGroup(4, qg, sg, ke, buf, pf)
	ldq := Load(Param("ldq"), GP64())
	SHLQ(U8(4), ldq) // 4 rows of 4 bytes
	ADDQ(ldq, qg)
	lds := Load(Param("lds"), GP64())
	SHLQ(U8(4), lds)
	ADDQ(lds, sg)
	SUBQ(U8(4), m)
	JMP(LabelRef("rows4"))

	Label("rowsTail")
	for r := 3; r >= 1; r-- {
		CMPQ(m, U8(r))
		JE(LabelRef(fmt.Sprintf("rows%d", r)))
	}
	JMP(LabelRef("done"))
	for r := 3; r >= 1; r-- {
		Label(fmt.Sprintf("rows%d", r))
		dotRowsGroup(r, qg, sg, ke, buf, pf)
		JMP(LabelRef("done"))
	}

	Label("done")
	VZEROUPPER()
	RET()
}

// dotRowsGroup emits the loop over the keys for the R rows of q starting
// at qg, whose scores go to the rows of s starting at sg.
func dotRowsGroup(R int, qg, sg Register, ke kElem, buf Mem, pf *prefetcher) {
	Commentf("Group of %d query rows.", R)
	// The row pointers point past the last whole 8 columns; the block
	// loops index them with a negative offset that counts up to 0.
	dFull := Load(Param("d"), GP64())
	SHRQ(U8(3), dFull)
	SHLQ(U8(5), dFull)
	ldq := Load(Param("ldq"), GP64())
	SHLQ(U8(2), ldq)
	qp := make([]Register, R)
	for r := range qp {
		qp[r] = GP64()
		if r == 0 {
			LEAQ(Mem{Base: qg, Index: dFull, Scale: 1}, qp[r])
		} else {
			LEAQ(Mem{Base: qp[r-1], Index: ldq, Scale: 1}, qp[r])
		}
	}
	kp := Load(Param("k").Base(), GP64())
	sp := GP64()
	MOVQ(sg, sp)
	j := Load(Param("n"), GP64())
	keys := dotRowsKeys(R)
	for i, J := range keys {
		pre := fmt.Sprintf("g%dk%d", R, J)
		next := "done"
		if i+1 < len(keys) {
			next = fmt.Sprintf("g%dk%d", R, keys[i+1])
		} else if R == 4 {
			next = fmt.Sprintf("g%dend", R)
		}
		Label(pre)
		CMPQ(j, U8(J))
		JL(LabelRef(next))
		dotRowsBlock(R, J, pre, qp, kp, sp, ke, buf, pf)
		ldk := Load(Param("ldk"), GP64())
		IMUL3Q(U32(ke.size*J), ldk, ldk)
		ADDQ(ldk, kp)
		ADDQ(U8(4*J), sp)
		SUBQ(U8(J), j)
		if i == 0 {
			JMP(LabelRef(pre))
		}
	}
	if R == 4 {
		Label(fmt.Sprintf("g%dend", R))
	}
}

// dotRowsBlock emits the scores of R query rows (pointers qp, offset to
// the end of the whole 8-column groups) against the J keys at kp, stored
// at sp (row r at sp + r·lds, key i at +4i).
//
// For each 8 columns, the smaller of the two sides is held in registers
// and the other streamed: loaded into a register when it meets several
// held vectors, used as the memory operand of the FMA when there is only
// one (and it is not a key to widen). Blocks with fewer than 8
// accumulators keep two sets, used on alternate 8-column groups, so that
// they too have 4 to 12 FMA chains. With a prefetcher, each pass of the
// loop over pairs of 8-column groups prefetches pfLinesPerPass lines of
// its hint.
func dotRowsBlock(R, J int, pre string, qp []Register, kp, sp Register, ke kElem, buf Mem, pf *prefetcher) {
	Commentf("Block of %d rows × %d keys.", R, J)
	sets := 1
	if R*J < 8 {
		sets = 2
	}
	acc := make([][][]VecVirtual, sets)
	for s := range acc {
		acc[s] = make([][]VecVirtual, R)
		for r := range acc[s] {
			acc[s][r] = newYMMs(J)
			for _, a := range acc[s][r] {
				VXORPS(a, a, a)
			}
		}
	}

	// kq[i] points past the whole 8-column groups of key i, c counts
	// the bytes of k in those groups up from minus their length to 0;
	// the offset in q is c·qs.
	qs := 4 / ke.size
	c := Load(Param("d"), GP64())
	SHRQ(U8(3), c)
	SHLQ(U8(3+log2Size(ke.size)), c)
	ldk := Load(Param("ldk"), GP64())
	shlSize(ldk, ke.size)
	kq := make([]Register, J)
	for i := range kq {
		kq[i] = GP64()
		if i == 0 {
			LEAQ(Mem{Base: kp, Index: c, Scale: 1}, kq[i])
		} else {
			LEAQ(Mem{Base: kq[i-1], Index: ldk, Scale: 1}, kq[i])
		}
	}
	NEGQ(c)

	// step does 8 columns, the u-th of a pair, into accumulator set s.
	step := func(s, u int) {
		qAt := func(r int) Mem { return Mem{Base: qp[r], Index: c, Scale: uint8(qs), Disp: 32 * u} }
		kAt := func(i int) Mem { return Mem{Base: kq[i], Index: c, Scale: 1, Disp: 8 * ke.size * u} }
		if J <= R { // hold the keys, stream the query rows
			kv := newYMMs(J)
			for i := range kv {
				ke.load(kAt(i), kv[i])
			}
			for r := 0; r < R; r++ {
				if J == 1 {
					VFMADD231PS(qAt(r), kv[0], acc[s][r][0])
					continue
				}
				t := YMM()
				VMOVUPS(qAt(r), t)
				for i := range kv {
					VFMADD231PS(t, kv[i], acc[s][r][i])
				}
			}
			return
		}
		qv := newYMMs(R) // hold the query rows, stream the keys
		for r := range qv {
			VMOVUPS(qAt(r), qv[r])
		}
		for i := 0; i < J; i++ {
			if R == 1 && ke.direct {
				VFMADD231PS(kAt(i), qv[0], acc[s][0][i])
				continue
			}
			t := YMM()
			ke.load(kAt(i), t)
			for r := range qv {
				VFMADD231PS(t, qv[r], acc[s][r][i])
			}
		}
	}

	// An odd number of whole 8-column groups: one first, then pairs.
	d := Load(Param("d"), GP64())
	TESTQ(U32(8), d)
	JZ(LabelRef(pre + "pairs"))
	step(0, 0)
	ADDQ(U8(8*ke.size), c)
	Label(pre + "pairs")
	TESTQ(c, c)
	JZ(LabelRef(pre + "tail"))
	Label(pre + "loop")
	if pf != nil {
		pf.next(pfLinesPerPass(ke))
	}
	step(0, 0)
	step(1%sets, 1)
	ADDQ(U8(16*ke.size), c)
	JNZ(LabelRef(pre + "loop"))

	// The d%8 last columns, with masked loads that leave 0 in the other
	// lanes and read nothing past the rows; one vector of q and one of k
	// at a time, as the mask takes a register. 16-bit and 8-bit keys
	// have no masked load: their d%8 last values are copied one by one to
	// the zeroed buf, read from there.
	Label(pre + "tail")
	rem := Load(Param("d"), GP64())
	ANDQ(U8(7), rem)
	JZ(LabelRef(pre + "reduce"))
	mask := loadTailMask(rem)
	for i := 0; i < J; i++ {
		kv := YMM()
		if ke.direct {
			VMASKMOVPS(Mem{Base: kq[i]}, mask, kv)
		} else {
			z := XMM()
			VXORPS(z, z, z)
			VMOVUPS(z, buf)
			e := Load(Param("d"), GP64())
			ANDQ(U8(7), e)
			t := GP32()
			Label(fmt.Sprintf("%scopy%d", pre, i))
			if ke.size == 1 {
				MOVBLZX(Mem{Base: kq[i], Index: e, Scale: 1, Disp: -1}, t)
				MOVB(t.As8(), buf.Idx(e, 1).Offset(-1))
			} else {
				MOVWLZX(Mem{Base: kq[i], Index: e, Scale: 2, Disp: -2}, t)
				MOVW(t.As16(), buf.Idx(e, 2).Offset(-2))
			}
			DECQ(e)
			JNZ(LabelRef(fmt.Sprintf("%scopy%d", pre, i)))
			ke.load(buf, kv)
		}
		for r := 0; r < R; r++ {
			t := YMM()
			VMASKMOVPS(Mem{Base: qp[r]}, mask, t)
			VFMADD231PS(t, kv, acc[0][r][i])
		}
	}

	Label(pre + "reduce")
	for r := 0; r < R; r++ {
		for i := 0; i < J; i++ {
			for s := 1; s < sets; s++ {
				VADDPS(acc[s][r][i], acc[0][r][i], acc[0][r][i])
			}
		}
	}
	lds := Load(Param("lds"), GP64())
	SHLQ(U8(2), lds)
	var s3 Register
	if R > 3 {
		s3 = row3(sp, lds)
	}
	at := func(l lane) Mem { return rowAddr(sp, s3, lds, l.r).Offset(4 * l.i) }
	for _, g := range laneGroups(R, J) {
		list := make([]VecVirtual, len(g))
		for l, x := range g {
			list[l] = acc[0][x.r][x.i]
		}
		storeLanes(reduceMany(list), g, at)
	}
}

// lane is the result of query row r and key i of a block.
type lane struct{ r, i int }

// laneGroups splits the R·J results of a block into groups of at most 8
// for reduceMany: slices of keys, as wide as 8 lanes allow, each in row
// order, so that the results of a row are in neighbouring lanes.
func laneGroups(R, J int) [][]lane {
	width := 1
	for 2*width*R <= 8 {
		width *= 2
	}
	var groups [][]lane
	for i0 := 0; i0 < J; i0 += width {
		var g []lane
		for r := 0; r < R; r++ {
			for i := i0; i < min(i0+width, J); i++ {
				g = append(g, lane{r, i})
			}
		}
		groups = append(groups, g)
	}
	return groups
}

// storeLanes stores lane l of res at at(lanes[l]), as few stores as
// possible: 8, 4 or 2 lanes at once where they are neighbours in a row
// of s.
func storeLanes(res VecVirtual, lanes []lane, at func(lane) Mem) {
	run := func(l, cnt int) bool {
		if l%cnt != 0 || l+cnt > len(lanes) {
			return false
		}
		for t := 1; t < cnt; t++ {
			if lanes[l+t] != (lane{lanes[l].r, lanes[l].i + t}) {
				return false
			}
		}
		return true
	}
	if run(0, 8) {
		VMOVUPS(res, at(lanes[0]))
		return
	}
	x := res.AsX()
	var hi VecVirtual
	if len(lanes) > 4 {
		hi = XMM()
		VEXTRACTF128(U8(1), res, hi)
	}
	for l := 0; l < len(lanes); {
		part, pl := x, l
		if l >= 4 {
			part, pl = hi, l-4
		}
		addr := at(lanes[l])
		switch {
		case run(l, 4):
			VMOVUPS(part, addr)
			l += 4
		case run(l, 2) && pl == 0:
			VMOVLPS(part, addr)
			l += 2
		case run(l, 2):
			VMOVHPS(part, addr)
			l += 2
		case pl == 0:
			VMOVSS(part, addr)
			l++
		default:
			VEXTRACTPS(U8(pl), part, addr)
			l++
		}
	}
}

// reduceMany returns the sums of the 8 lanes of each vector of a, the
// sum of a[l] in lane l: a ymm for 5 to 8 vectors, an xmm for fewer.
//
// Its step combines two vectors x and y into one of their sums of
// neighbouring lanes (or lanes 2 apart), x's in the even lanes (pairs of
// lanes) and y's in the odd ones: two blends, a permute within 128-bit
// lanes and an add, no slow horizontal add. For 8 vectors, folding the
// 128-bit halves of pairs first leaves 4 vectors of 4 lanes each.
func reduceMany(a []VecVirtual) VecVirtual {
	if len(a) == 1 {
		return reduceAdd(a[0])
	}
	size := 2
	for size < len(a) {
		size *= 2
	}
	for len(a) < size {
		a = append(a, a[0]) // lanes nobody reads
	}
	// combine returns the blend of x and y by bl (y where bl has ones)
	// plus the other blend with its lanes permuted by pm.
	combine := func(x, y VecVirtual, bl, pm uint8) VecVirtual {
		u, v := YMM(), YMM()
		VBLENDPS(U8(bl), y, x, u)
		VBLENDPS(U8(bl), x, y, v)
		VPERMILPS(U8(pm), v, v)
		VADDPS(v, u, u)
		return u
	}
	// foldHalves adds the two 128-bit halves of y.
	foldHalves := func(y VecVirtual) VecVirtual {
		x, hi := XMM(), XMM()
		VEXTRACTF128(U8(1), y, hi)
		VADDPS(hi, y.AsX(), x)
		return x
	}
	switch size {
	case 2:
		// a[0] 0+1, a[1] 0+1, a[0] 2+3, a[1] 2+3 | the same for 4..7.
		s := foldHalves(combine(a[0], a[1], 0xaa, 0xb1))
		t := XMM()
		VPERMILPS(U8(0x4e), s, t)
		VADDPS(t, s, s)
		return s
	case 4:
		// a[0..3] summed over lanes 0..3 | a[0..3] over lanes 4..7.
		s01 := combine(a[0], a[1], 0xaa, 0xb1)
		s23 := combine(a[2], a[3], 0xaa, 0xb1)
		return foldHalves(combine(s01, s23, 0xcc, 0x4e))
	}
	// b[i] lanes: a[i] 0+4, 1+5, 2+6, 3+7 | a[i+4] 0+4, ...
	b := make([]VecVirtual, 4)
	for i := range b {
		u, v := YMM(), YMM()
		VBLENDPS(U8(0xf0), a[i+4], a[i], u)   // a[i] low | a[i+4] high
		VPERM2F128(U8(0x21), a[i+4], a[i], v) // a[i] high | a[i+4] low
		VADDPS(v, u, u)
		b[i] = u
	}
	s01 := combine(b[0], b[1], 0xaa, 0xb1)
	s23 := combine(b[2], b[3], 0xaa, 0xb1)
	return combine(s01, s23, 0xcc, 0x4e)
}

// pfLinesPerPass is the number of lines a DotRows kernel with keys ke
// prefetches each pass over 16 columns of a block: 2 for float32 keys, 1
// for narrower ones. A float32 block of keys and values takes twice as
// long to arrive as a 16-bit one for the same arithmetic, and at one line
// a pass DotRows prefetched at half the rate of memory while Gemm, at two
// lines per 4 steps of k, kept up with it. 2 lines made the float32 step
// faster and left the bf16 step where it was (figures: results/2026-12-07, "Figures moved out of code comments").
func pfLinesPerPass(ke kElem) int {
	if ke.size == 4 {
		return 2
	}
	return 1
}

// prefetcher walks a prefetch hint a line at a time with PREFETCHT0, its
// pointer and the address of its last line kept in the frame (the
// kernels use every general register); once at the last line it stays
// there.
//
// The rate is that of the kernels' inner loops: one line per pass over
// 16 columns of a DotRows block (J keys; two for float32 keys, see
// pfLinesPerPass), two per 4 steps of k of a Gemm block, about one line
// every 12 to 16 cycles for the decode step's shapes. Prefetching as many
// lines as the kernels read instead (2 a pass of DotRows, 3 for float32
// keys) stalls the kernels on the prefetches, once the core's misses in
// flight are at their limit, and the step was slower; PREFETCHT1,
// PREFETCHT2 and PREFETCHNTA did no better than PREFETCHT0. So with
// float32 blocks, kernels prefetching all of the next block and no touch
// streamed slower than the touch with these rates (figures:
// results/2026-12-07, "Figures moved out of code comments").
type prefetcher struct {
	p, end Mem
}

func newPrefetcher(param string, size int) *prefetcher {
	pf := &prefetcher{p: AllocLocal(8), end: AllocLocal(8)}
	p := Load(Param(param).Base(), GP64())
	e := Load(Param(param).Len(), GP64())
	LEAQ(Mem{Base: p, Index: e, Scale: uint8(size), Disp: -64}, e)
	CMPQ(e, p)
	CMOVQLT(p, e) // less than a line: stay at the start
	MOVQ(p, pf.p)
	MOVQ(e, pf.end)
	return pf
}

// next prefetches n lines and advances the pointer past them, up to the
// last line.
func (pf *prefetcher) next(n int) {
	t := GP64()
	MOVQ(pf.p, t)
	for i := 0; i < n; i++ {
		PREFETCHT0(Mem{Base: t, Disp: 64 * i})
	}
	ADDQ(U8(64*n), t)
	CMPQ(t, pf.end)
	CMOVQGT(pf.end, t)
	MOVQ(t, pf.p)
}
