package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The DotRows kernels of the avx512 family: the blocks of the VDPBF16PS
// kernels (decode512.go), R query rows × 16/R keys with 16 zmm
// accumulators, with FMAs on 16 columns at a time, the keys widened from
// their type as they are loaded and the queries read in place; the last
// d%16 columns of both under a mask.

// kElem512 is kElem for zmm registers: 16 values of k at m become 16
// float32 lanes of v, only those of the mask when it is not nil.
type kElem512 struct {
	size int
	load func(m Mem, mask Op, v VecVirtual)
}

// The masked loads go through VMOVDQU16 and VMOVDQU8, whose masked-out
// elements are never read, not even to fault.
var (
	kF32x16 = kElem512{4, func(m Mem, mask Op, v VecVirtual) {
		if mask == nil {
			VMOVUPS(m, v)
		} else {
			VMOVUPS_Z(m, mask, v)
		}
	}}
	kBF16x16 = kElem512{2, func(m Mem, mask Op, v VecVirtual) {
		if mask == nil {
			VPMOVZXWD(m, v)
		} else {
			y := YMM()
			VMOVDQU16_Z(m, mask, y)
			VPMOVZXWD(y, v)
		}
		VPSLLD(U8(16), v, v)
	}}
	kF16x16 = kElem512{2, func(m Mem, mask Op, v VecVirtual) {
		if mask == nil {
			VCVTPH2PS(m, v)
		} else {
			y := YMM()
			VMOVDQU16_Z(m, mask, y)
			VCVTPH2PS(y, v)
		}
	}}
	kI8x16 = kElem512{1, func(m Mem, mask Op, v VecVirtual) {
		if mask == nil {
			VPMOVSXBD(m, v)
		} else {
			x := XMM()
			VMOVDQU8_Z(m, mask, x)
			VPMOVSXBD(x, v)
		}
		VCVTDQ2PS(v, v)
	}}
)

// dotRows512 emits the DotRows kernels of the avx512 family.
func dotRows512() {
	for _, k := range []struct {
		name, typ string
		ke        kElem512
	}{
		{"dotRows", "[]float32", kF32x16},
		{"dotRowsBF16", "[]uint16", kBF16x16},
		{"dotRowsF16", "[]uint16", kF16x16},
		{"dotRowsI8", "[]int8", kI8x16},
	} {
		for _, pf := range []bool{false, true} {
			name := k.name + map[bool]string{false: "AVX512", true: "PFAVX512"}[pf]
			plain := k.name + "AVX2"
			if pf {
				plain = k.name + "PFAVX2"
			}
			dotRows512Kernel(name, k.typ, k.ke, pf, fmt.Sprintf("%s is %s with AVX-512; the Go caller checks the sizes.", name, plain))
		}
	}
}

// dotRows512Kernel emits one kernel: the rows of q in groups of 4, 2 or 1
// (3 rows: a group of 4 whose missing row repeats the last and is not
// stored), each group's keys in blocks of R × 16/R, then R × 4, then the
// last n%4 in a block whose missing keys repeat the last one, stored
// under a mask. With withPF, each pass of a block over 16 columns
// prefetches two thirds of the lines it reads of k, rounded up.
func dotRows512Kernel(name, kType string, ke kElem512, withPF bool, doc ...string) {
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
	fr := dotBF16Frame{
		qg: AllocLocal(8), sg: AllocLocal(8), left: AllocLocal(8), rlast: AllocLocal(8),
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
		pre := fmt.Sprintf("g%d", R)
		Label(pre)
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
		}
		kp := Load(Param("k").Base(), GP64())
		sp := GP64()
		MOVQ(fr.sg, sp)
		j := Load(Param("n"), GP64())
		widths := []int{16 / R, 4}
		if R == 4 {
			widths = widths[:1]
		}
		for _, J := range widths {
			b := fmt.Sprintf("%sk%d", pre, J)
			Label(b)
			CMPQ(j, U8(J))
			JL(LabelRef(b + "end"))
			dotRows512Block(b, R, J, true, ke, kp, sp, j, fr)
			ldk := Load(Param("ldk"), GP64())
			IMUL3Q(U32(ke.size*J), ldk, ldk)
			ADDQ(ldk, kp)
			ADDQ(U8(4*J), sp)
			SUBQ(U8(J), j)
			JMP(LabelRef(b))
			Label(b + "end")
		}
		TESTQ(j, j)
		JZ(LabelRef(pre + "next"))
		dotRows512Block(pre+"kt", R, 4, false, ke, kp, sp, j, fr)
		Label(pre + "next")
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

// dotRows512Block emits one block of R query rows (from fr.qg, the missing
// ones repeating the last) × J keys at kp, the scores stored at sp. With
// full false, J is 4 and j (1 … 3) keys are left: the others repeat the
// last and are not stored.
func dotRows512Block(pre string, R, J int, full bool, ke kElem512, kp, sp, j Register, fr dotBF16Frame) {
	Commentf("Block of %d rows × %d keys%s.", R, J, map[bool]string{true: "", false: ", the last keys"}[full])
	ldk, ldk3 := Load(Param("ldk"), GP64()), GP64()
	shlSize(ldk, ke.size)
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
	// Query row r at qp[r]: fr.qg + min(r, rlast)·ldq.
	qp := make([]Register, R)
	{
		ldq := Load(Param("ldq"), GP64())
		SHLQ(U8(2), ldq)
		for r := range qp {
			qp[r] = GP64()
			MOVQ(fr.qg, qp[r])
			if r == 0 {
				continue
			}
			idx := GP64()
			MOVQ(U32(r), idx)
			CMPQ(idx, fr.rlast)
			CMOVQGT(fr.rlast, idx)
			IMULQ(ldq, idx)
			ADDQ(idx, qp[r])
		}
	}
	acc := make([][]VecVirtual, R)
	for r := range acc {
		acc[r] = newZMMs(J)
		for _, a := range acc[r] {
			VXORPS(a, a, a)
		}
	}
	chunk := func(mask Op) {
		qv := newZMMs(R)
		for r := range qv {
			if mask == nil {
				VMOVUPS(Mem{Base: qp[r]}, qv[r])
			} else {
				VMOVUPS_Z(Mem{Base: qp[r]}, mask, qv[r])
			}
		}
		for i := 0; i < J; i++ {
			kv := ZMM()
			ke.load(keyAt(i), mask, kv)
			for r := range qv {
				VFMADD231PS(kv, qv[r], acc[r][i])
			}
		}
	}
	c := Load(Param("d"), GP64())
	SHRQ(U8(4), c)
	JZ(LabelRef(pre + "ctail"))
	Label(pre + "c")
	if fr.pf != nil {
		lines := J * 16 * ke.size / 64
		fr.pf.next((2*lines + 2) / 3)
	}
	chunk(nil)
	for _, b := range kb {
		ADDQ(U8(16*ke.size), b)
	}
	for _, p := range qp {
		ADDQ(U8(64), p)
	}
	DECQ(c)
	JNZ(LabelRef(pre + "c"))
	Label(pre + "ctail")
	{
		rem := Load(Param("d"), GP64())
		ANDQ(U8(15), rem)
		JZ(LabelRef(pre + "reduce"))
		bits, ones := GP32(), GP32()
		MOVL(U32(0xffff), ones)
		BZHIL(rem.(GPVirtual).As32(), ones, bits)
		km := K()
		KMOVW(bits, km)
		chunk(km)
	}

	Label(pre + "reduce")
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
	row := GP64()
	MOVQ(sp, row)
	for r := 0; r < R; r++ {
		if r > 0 {
			CMPQ(fr.rlast, U8(r))
			JL(LabelRef(pre + "stored"))
			ADDQ(lds, row)
		}
		storeScores(res, r, J, false, km, Mem{Base: row})
	}
	Label(pre + "stored")
}
