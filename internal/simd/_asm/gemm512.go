package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// gemm512 emits gemmAVX512 (Gemm, n a multiple of 16) and, with n a
// multiple of 8 and a prefetch hint, gemmPFAVX512 (GemmPF) and
// gemmF16AVX512 and gemmI8AVX512 (GemmF16 and GemmI8, B widened in
// registers as it is loaded): gemm's loops with zmm registers. (GemmBF16
// keeps gemmBF16AVX2, whose even and odd columns widen 16 values with a
// shift and a mask where the zmm loads here take a shuffle and a shift
// per 16, and which ran faster.) Row blocks of maxRows512 rows are the outer loop; inside
// each, blocks of 32 columns (2 zmm of C a row, 16 accumulators: each
// step of k loads 2 vectors of B and broadcasts 8 values of A for 16
// FMAs, 10 loads where the AVX2 block needs 13 for as many flops), then
// one of 16 columns (an FMA with A broadcast from memory) and, for the
// kernels with n a multiple of 8, the last 8 columns under a mask. The
// last m%8 rows take a block of their own height, with several sets of
// accumulators below 8.
func gemm512() {
	gemm512Kernel("gemmAVX512", kF32x16, false,
		"gemmAVX512 is gemmAVX2 with AVX-512 (see Gemm). n must be a multiple of 16; the",
		"slices must be long enough (the Go caller checks).",
	)
	for _, g := range []struct {
		name string
		ke   kElem512
	}{{"gemmPF", kF32x16}, {"gemmF16", kF16x16}, {"gemmI8", kI8x16}} {
		gemm512Kernel(g.name+"AVX512", g.ke, true,
			fmt.Sprintf("%sAVX512 is %sAVX2 with AVX-512. n must be a multiple of 8;", g.name, g.name),
			"the slices must be long enough (the Go caller checks).",
		)
	}
}

func gemm512Kernel(name string, ke kElem512, pfKernel bool, doc ...string) {
	gemm512KernelOf(name, map[int]string{1: "[]int8", 2: "[]uint16", 4: "[]float32"}[ke.size], ke, pfKernel, doc...)
}

// gemm512KernelOf is gemm512Kernel with B's Go type bType.
func gemm512KernelOf(name, bType string, ke kElem512, pfKernel bool, doc ...string) {
	sig := "func(m, n, k int, a []float32, lda int, b " + bType + ", ldb int, c []float32, ldc int, accumulate bool"
	if pfKernel {
		sig += ", pf " + bType
	}
	TEXT(name, NOSPLIT, sig+")")
	Pragma("noescape")
	Doc(doc...)
	var pf *prefetcher
	if pfKernel {
		pf = newPrefetcher("pf", ke.size)
	}
	left, aRow, cRow := AllocLocal(8), AllocLocal(8), AllocLocal(8)
	m := Load(Param("m"), GP64())
	TESTQ(m, m)
	JZ(LabelRef("done"))
	n := Load(Param("n"), GP64())
	TESTQ(n, n)
	JZ(LabelRef("done"))
	MOVQ(m, left)
	{
		a := Load(Param("a").Base(), GP64())
		MOVQ(a, aRow)
		c := Load(Param("c").Base(), GP64())
		MOVQ(c, cRow)
	}
	Label("rows")
	{
		rl := GP64()
		MOVQ(left, rl)
		CMPQ(rl, U8(maxRows512))
		JGE(LabelRef(fmt.Sprintf("rows%d", maxRows512)))
		for r := maxRows512 - 1; r >= 1; r-- {
			CMPQ(rl, U8(r))
			JE(LabelRef(fmt.Sprintf("rows%d", r)))
		}
		JMP(LabelRef("done"))
	}
	for r := maxRows512; r >= 1; r-- {
		pre := fmt.Sprintf("r%d", r)
		Label(fmt.Sprintf("rows%d", r))
		Commentf("Blocks of %d rows.", r)
		bp, cp, j := GP64(), GP64(), GP64()
		Load(Param("b").Base(), bp)
		MOVQ(cRow, cp)
		Load(Param("n"), j)
		for _, w := range []int{2, 1} {
			l := fmt.Sprintf("%sw%d", pre, w)
			Label(l)
			CMPQ(j, U8(16*w))
			JL(LabelRef(l + "end"))
			gemm512Block(l+"b", r, w, false, ke, bp, cp, aRow, pf)
			ADDQ(U8(16*ke.size*w), bp)
			ADDQ(U8(64*w), cp)
			SUBQ(U8(16*w), j)
			if w == 2 {
				JMP(LabelRef(l))
			}
			Label(l + "end")
		}
		if pfKernel {
			TESTQ(j, j)
			JZ(LabelRef(pre + "next"))
			gemm512Block(pre+"h", r, 1, true, ke, bp, cp, aRow, pf)
		}
		Label(pre + "next")
		lda := Load(Param("lda"), GP64())
		IMUL3Q(U32(4*r), lda, lda)
		ADDQ(lda, aRow)
		ldc := Load(Param("ldc"), GP64())
		IMUL3Q(U32(4*r), ldc, ldc)
		ADDQ(ldc, cRow)
		SUBQ(U8(r), left)
		JG(LabelRef("rows"))
		JMP(LabelRef("done"))
	}

	Label("done")
	VZEROUPPER()
	RET()
}

// gemm512Block emits C[0:r][cp:cp+16w] (+)= A[0:r][:]·B[:][bp:bp+16w]
// for w zmm of C a row, B of element ke; with half, 8 columns (w = 1)
// under a mask.
func gemm512Block(pre string, r, w int, half bool, ke kElem512, bp, cp Register, aRow Mem, pf *prefetcher) {
	sets := 1
	for r*w*sets < 8 && sets < 4 {
		sets *= 2
	}
	acc := make([][][]VecVirtual, sets)
	for s := range acc {
		acc[s] = make([][]VecVirtual, r)
		for i := range acc[s] {
			acc[s][i] = newZMMs(w)
		}
	}
	var km Register
	if half {
		km = K()
		t := GP32()
		MOVL(U32(0xff), t)
		KMOVW(t, km)
	}
	// cRows calls f with the address of each row of C.
	cRows := func(f func(i int, at Mem)) {
		ldc, ldc3 := Load(Param("ldc"), GP64()), GP64()
		SHLQ(U8(2), ldc)
		LEAQ(Mem{Base: ldc, Index: ldc, Scale: 2}, ldc3)
		var c4 Register
		if r > 4 {
			c4 = GP64()
			LEAQ(Mem{Base: cp, Index: ldc, Scale: 4}, c4)
		}
		for i := 0; i < r; i++ {
			f(i, rowAddr8(cp, c4, ldc, ldc3, i))
		}
	}
	flag := Load(Param("accumulate"), GP8())
	TESTB(flag, flag)
	JZ(LabelRef(pre + "zero"))
	cRows(func(i int, at Mem) {
		for g := 0; g < w; g++ {
			if half {
				VMOVUPS_Z(at, km, acc[0][i][g])
			} else {
				VMOVUPS(at.Offset(64*g), acc[0][i][g])
			}
		}
	})
	JMP(LabelRef(pre + "init"))
	Label(pre + "zero")
	for i := 0; i < r; i++ {
		for _, a := range acc[0][i] {
			VXORPS(a, a, a)
		}
	}
	Label(pre + "init")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			for _, a := range acc[s][i] {
				VXORPS(a, a, a)
			}
		}
	}

	p0, bq, kk, lda, lda3, ldb := GP64(), GP64(), GP64(), GP64(), GP64(), GP64()
	MOVQ(aRow, p0)
	Load(Param("lda"), lda)
	SHLQ(U8(2), lda)
	LEAQ(Mem{Base: lda, Index: lda, Scale: 2}, lda3)
	var p4 Register
	if r > 4 {
		p4 = GP64()
		LEAQ(Mem{Base: p0, Index: lda, Scale: 4}, p4)
	}
	Load(Param("ldb"), ldb)
	shlSize(ldb, ke.size)
	MOVQ(bp, bq)
	Load(Param("k"), kk)

	step := func(s, u int) {
		bv := newZMMs(w)
		for g := range bv {
			if half {
				ke.load(Mem{Base: bq}, km, bv[g])
			} else {
				ke.load(Mem{Base: bq, Disp: 16 * ke.size * g}, nil, bv[g])
			}
		}
		for i := 0; i < r; i++ {
			at := rowAddr8(p0, p4, lda, lda3, i).Offset(4 * u)
			if w == 1 {
				VFMADD231PS_BCST(at, bv[0], acc[s][i][0])
				continue
			}
			t := ZMM()
			VBROADCASTSS(at, t)
			for g := range bv {
				VFMADD231PS(bv[g], t, acc[s][i][g])
			}
		}
		ADDQ(ldb, bq)
	}
	advance := func(bytes int) {
		ADDQ(U8(bytes), p0)
		if p4 != nil {
			ADDQ(U8(bytes), p4)
		}
	}
	SUBQ(U8(kUnroll), kk)
	JL(LabelRef(pre + "k1"))
	Label(pre + "k4")
	if pf != nil {
		// As gemm16Kernel: 2 lines every 4 steps of k of 16 columns, 1
		// for an 8-bit B.
		pf.next(min(2, ke.size) * w)
	}
	for u := 0; u < kUnroll; u++ {
		step(u%sets, u)
	}
	advance(4 * kUnroll)
	SUBQ(U8(kUnroll), kk)
	JGE(LabelRef(pre + "k4"))
	Label(pre + "k1")
	ADDQ(U8(kUnroll), kk)
	JZ(LabelRef(pre + "store"))
	Label(pre + "k1loop")
	step(0, 0)
	advance(4)
	DECQ(kk)
	JNZ(LabelRef(pre + "k1loop"))

	Label(pre + "store")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			for g := range acc[s][i] {
				VADDPS(acc[s][i][g], acc[0][i][g], acc[0][i][g])
			}
		}
	}
	cRows(func(i int, at Mem) {
		for g := 0; g < w; g++ {
			if half {
				VMOVUPS(acc[0][i][g], km, at)
			} else {
				VMOVUPS(acc[0][i][g], at.Offset(64*g))
			}
		}
	})
}
