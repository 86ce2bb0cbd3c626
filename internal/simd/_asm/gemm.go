package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// maxRows is the height of the register block: 6 rows × 2 ymm of C are
// 12 accumulators, which with 2 ymm of B and one broadcast of A fill 15
// of the 16 ymm registers.
const maxRows = 6

// kUnroll is how many steps of k one pass of the inner loop does.
const kUnroll = 4

// gemm emits gemmAVX2. Row blocks of 6 rows are the outer loop; inside
// each, 16-column panels of C are computed one after the other, so the
// block's rows of A stay in L1 while B streams past. The last m%6 rows
// take a block of their own height (1..5).
func gemm() {
	TEXT("gemmAVX2", NOSPLIT, "func(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool)")
	Pragma("noescape")
	Doc(
		"gemmAVX2 computes C = A·B or C += A·B (see Gemm) with AVX2 and FMA.",
		"n must be a multiple of 16; the slices must be long enough (the Go caller checks).",
	)
	g := gemmRegs{}
	g.m = Load(Param("m"), GP64())
	n := Load(Param("n"), GP64())
	TESTQ(g.m, g.m)
	JZ(LabelRef("done"))
	TESTQ(n, n)
	JZ(LabelRef("done"))

	g.aRow = Load(Param("a").Base(), GP64())
	g.cRow = Load(Param("c").Base(), GP64())
	g.lda = Load(Param("lda"), GP64())
	g.ldb = Load(Param("ldb"), GP64())
	g.ldc = Load(Param("ldc"), GP64())
	SHLQ(U8(2), g.lda)
	SHLQ(U8(2), g.ldb)
	SHLQ(U8(2), g.ldc)

	Label("rows6")
	CMPQ(g.m, U8(maxRows))
	JL(LabelRef("tail"))
	g.block(maxRows)
	// aRow += 6 rows, cRow += 6 rows.
	LEAQ(Mem{Base: g.aRow, Index: g.lda, Scale: 4}, g.aRow)
	LEAQ(Mem{Base: g.aRow, Index: g.lda, Scale: 2}, g.aRow)
	LEAQ(Mem{Base: g.cRow, Index: g.ldc, Scale: 4}, g.cRow)
	LEAQ(Mem{Base: g.cRow, Index: g.ldc, Scale: 2}, g.cRow)
	SUBQ(U8(maxRows), g.m)
	JMP(LabelRef("rows6"))

	Label("tail")
	for r := maxRows - 1; r >= 1; r-- {
		CMPQ(g.m, U8(r))
		JE(LabelRef(fmt.Sprintf("rows%d", r)))
	}
	JMP(LabelRef("done"))
	for r := 1; r < maxRows; r++ {
		Label(fmt.Sprintf("rows%d", r))
		g.block(r)
		JMP(LabelRef("done"))
	}

	Label("done")
	VZEROUPPER()
	RET()
}

type gemmRegs struct {
	m, aRow, cRow, lda, ldb, ldc Register
}

// rowAddr addresses row i (0..5) of a block given pointers to its rows 0
// and 3 and the row stride in bytes.
func rowAddr(p0, p3, ld Register, i int) Mem {
	base := p0
	if i >= 3 {
		base, i = p3, i-3
	}
	switch i {
	case 0:
		return Mem{Base: base}
	case 1:
		return Mem{Base: base, Index: ld, Scale: 1}
	default:
		return Mem{Base: base, Index: ld, Scale: 2}
	}
}

// row3 returns a register pointing 3 rows past p.
func row3(p, ld Register) Register {
	r := GP64()
	LEAQ(Mem{Base: p, Index: ld, Scale: 2}, r)
	ADDQ(ld, r)
	return r
}

// block emits the loop over the 16-column panels of an r-row block.
// Blocks of fewer than 4 rows keep several sets of accumulators, used
// in turn on the steps of k, so that 6 to 12 FMA chains are in flight
// (FMA latency 4, two FMA pipes); the sets are added before the store.
func (g gemmRegs) block(r int) {
	pre := fmt.Sprintf("r%d", r)
	sets := 1
	switch {
	case r == 1:
		sets = 4
	case r <= 3:
		sets = 2
	}
	acc := make([][][2]VecVirtual, sets)
	for s := range acc {
		acc[s] = make([][2]VecVirtual, r)
		for i := range acc[s] {
			acc[s][i] = [2]VecVirtual{YMM(), YMM()}
		}
	}

	Commentf("Block of %d rows: loop over 16-column panels.", r)
	bPanel := Load(Param("b").Base(), GP64())
	cp := GP64()
	MOVQ(g.cRow, cp)
	j := Load(Param("n"), GP64())

	Label(pre + "panel")
	flag := Load(Param("accumulate"), GP8())
	TESTB(flag, flag)
	JZ(LabelRef(pre + "zero"))
	{
		var c3 Register
		if r > 3 {
			c3 = row3(cp, g.ldc)
		}
		for i := 0; i < r; i++ {
			addr := rowAddr(cp, c3, g.ldc, i)
			VMOVUPS(addr, acc[0][i][0])
			VMOVUPS(addr.Offset(32), acc[0][i][1])
		}
		JMP(LabelRef(pre + "init"))
	}
	Label(pre + "zero")
	for i := 0; i < r; i++ {
		VXORPS(acc[0][i][0], acc[0][i][0], acc[0][i][0])
		VXORPS(acc[0][i][1], acc[0][i][1], acc[0][i][1])
	}
	Label(pre + "init")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			VXORPS(acc[s][i][0], acc[s][i][0], acc[s][i][0])
			VXORPS(acc[s][i][1], acc[s][i][1], acc[s][i][1])
		}
	}

	ap := GP64()
	MOVQ(g.aRow, ap)
	var a3 Register
	if r > 3 {
		a3 = row3(ap, g.lda)
	}
	bp := GP64()
	MOVQ(bPanel, bp)
	kk := Load(Param("k"), GP64())

	// step emits one step of k: C[i][0:16] += A[i][p] · B[p][0:16].
	step := func(s, disp int) {
		b0, b1 := YMM(), YMM()
		VMOVUPS(Mem{Base: bp}, b0)
		VMOVUPS(Mem{Base: bp, Disp: 32}, b1)
		for i := 0; i < r; i++ {
			t := YMM()
			VBROADCASTSS(rowAddr(ap, a3, g.lda, i).Offset(disp), t)
			VFMADD231PS(b0, t, acc[s][i][0])
			VFMADD231PS(b1, t, acc[s][i][1])
		}
		ADDQ(g.ldb, bp)
	}
	advanceA := func(bytes int) {
		ADDQ(U8(bytes), ap)
		if r > 3 {
			ADDQ(U8(bytes), a3)
		}
	}

	SUBQ(U8(kUnroll), kk)
	JL(LabelRef(pre + "k1"))
	Label(pre + "k4")
	for u := 0; u < kUnroll; u++ {
		step(u%sets, 4*u)
	}
	advanceA(4 * kUnroll)
	SUBQ(U8(kUnroll), kk)
	JGE(LabelRef(pre + "k4"))
	Label(pre + "k1")
	ADDQ(U8(kUnroll), kk)
	JZ(LabelRef(pre + "store"))
	Label(pre + "k1loop")
	step(0, 0)
	advanceA(4)
	DECQ(kk)
	JNZ(LabelRef(pre + "k1loop"))

	Label(pre + "store")
	for s := 1; s < sets; s++ {
		for i := 0; i < r; i++ {
			VADDPS(acc[s][i][0], acc[0][i][0], acc[0][i][0])
			VADDPS(acc[s][i][1], acc[0][i][1], acc[0][i][1])
		}
	}
	var c3 Register
	if r > 3 {
		c3 = row3(cp, g.ldc)
	}
	for i := 0; i < r; i++ {
		addr := rowAddr(cp, c3, g.ldc, i)
		VMOVUPS(acc[0][i][0], addr)
		VMOVUPS(acc[0][i][1], addr.Offset(32))
	}
	ADDQ(U8(64), bPanel)
	ADDQ(U8(64), cp)
	SUBQ(U8(16), j)
	JNZ(LabelRef(pre + "panel"))
}
