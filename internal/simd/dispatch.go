package simd

import "os"

//go:generate go run -C _asm . -out ../simd_amd64.s -stubs ../stubs_amd64.go -pkg simd

// implementation is one complete set of kernels.
type implementation struct {
	name string
	// bf16Dot is set where the bfloat16 kernels multiply with VDPBF16PS:
	// DotRowsBF16, DotRowsBF16PF and GemmBF16 split their float32 operand
	// into two bfloat16 halves, DotRowsBF16Native and GemmBF16Native
	// round it to one (see NativeBF16); the tests model both.
	bf16Dot bool
	gemm    func(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool)
	expSum  func(x []float32, shift float32) float32
	exp     func(dst, x []float32) // len(dst) >= len(x)
	expMul  func(p, g []float32)   // len(g) >= len(p)
	// elu1 is ELU1 (len(dst) >= len(x)); nil where the family has no
	// kernel of its own (see elu1Of).
	elu1    func(dst, x []float32)
	max     func(x []float32) float32
	scale   func(x []float32, c float32)
	dot     func(x, y []float32) float32    // len(y) >= len(x)
	axpy    func(a float32, x, y []float32) // len(y) >= len(x)
	readSum func(x []float32) float32
	// prefetch asks for the lines of the n bytes at p; a no-op where
	// there is no such instruction in the family.
	prefetch func(p *byte, n int)
	fmaPeak  func(iters int) float32

	widenBF16 func(dst []float32, src []uint16) // len(dst) >= len(src)
	widenF16  func(dst []float32, src []uint16) // len(dst) >= len(src)
	dotRows   func(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int)

	dotRowsBF16 func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int)
	dotRowsF16  func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int)

	gemmBF16 func(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16)
	gemmF16  func(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16)

	gemmPF func(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool, pf []float32)

	dotRowsBF16Native func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, pf []uint16)
	gemmBF16Native    func(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16)

	dotRowsPF     func(s []float32, lds int, q []float32, ldq, rows int, k []float32, ldk, n, d int, pf []float32)
	dotRowsBF16PF func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, pf []uint16)
	dotRowsF16PF  func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int, pf []uint16)

	dotRowsI8   func(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int)
	dotRowsI8PF func(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int, pf []int8)
	gemmI8      func(m, n, k int, a []float32, lda int, b []int8, ldb int, c []float32, ldc int, accumulate bool, pf []int8)
	widenI8     func(dst []float32, src []int8, scale []float32, ld int) // len(dst) >= len(scale)·ld
	// dotRowsU4 and gemmU4 read the low ([0]) or high ([1]) nibbles.
	dotRowsU4    [2]func(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int)
	gemmU4       [2]func(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, pf []uint8)
	scaleColumns func(s []float32, lds, rows int, f []float32)
	// dotRowsU4Q8 (rows ≤ 4) and gemmU4BF16 (m ≤ 4, k ≤ 256, low and
	// high nibbles) are the Go definitions but where u4Native says they
	// are the CPU's integer and bfloat16 instructions.
	u4Native    bool
	dotRowsU4Q8 func(s []float32, lds int, q []float32, ldq, rows int, scale, zero []float32, k []uint8, ldk, n, d, pw int)
	gemmU4BF16  [2]func(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int)

	gemmPanels    func(m, n, k int, a []float32, ar, ac int, b []float32, pb int, c []float32, pc int, accumulate bool)
	onlineSoftmax func(s []float32, ps, n, np int, lim, m, l, acc []float32, pacc, dacc int)
	attendPanels  func(np, n, d int, k []float32, kr, kc int, qt []float32, pq int, st, v []float32, vr, vc int, m, l, acc []float32, pacc int, pfk, pfv []float32)
	panelFromRows func(dst, src []float32, off []int, d int, scale float32)
	rowsFromPanel func(dst []float32, off []int, src, f []float32, d int)

	// attendAMX is the kernel of AttendAMX: nil but in the avx512bf16
	// (VDPBF16PS) and amx (the AMX tiles) families.
	attendAMX func(npp, nfull, nblk, dp int, qb, kb, vb []uint16, st []float32, pb []uint16, lim []int32, m, l, acc []float32, c float32)
}

var genericImpl = implementation{
	name:     "generic",
	gemm:     gemmGeneric,
	expSum:   expSumGeneric,
	exp:      expGeneric,
	expMul:   expMulGeneric,
	max:      maxGeneric,
	scale:    scaleGeneric,
	dot:      dotGeneric,
	axpy:     axpyGeneric,
	readSum:  readSumGeneric,
	prefetch: func(*byte, int) {},
	fmaPeak:  fmaPeakGeneric,

	widenBF16: widenBF16Generic,
	widenF16:  widenF16Generic,
	dotRows:   dotRowsGeneric,

	dotRowsBF16: dotRowsBF16Generic,
	dotRowsF16:  dotRowsF16Generic,

	gemmBF16: gemmBF16Generic,
	gemmF16:  gemmF16Generic,

	gemmPF: gemmPFGeneric,

	dotRowsBF16Native: dotRowsBF16PFGeneric,
	gemmBF16Native:    gemmBF16Generic,

	dotRowsPF:     dotRowsPFGeneric,
	dotRowsBF16PF: dotRowsBF16PFGeneric,
	dotRowsF16PF:  dotRowsF16PFGeneric,

	dotRowsI8:    dotRowsI8Generic,
	dotRowsI8PF:  dotRowsI8PFGeneric,
	gemmI8:       gemmI8Generic,
	widenI8:      widenI8Generic,
	dotRowsU4:    [2]func(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int){dotRowsU4LoGeneric, dotRowsU4HiGeneric},
	gemmU4:       [2]func(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, pf []uint8){gemmU4LoGeneric, gemmU4HiGeneric},
	scaleColumns: scaleColumnsGeneric,
	dotRowsU4Q8:  dotRowsU4Q8Generic,
	gemmU4BF16:   [2]func(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int){gemmU4BF16LoGeneric, gemmU4BF16HiGeneric},

	gemmPanels:    gemmPanelsGeneric,
	onlineSoftmax: onlineSoftmaxGeneric,
	attendPanels:  attendPanelsGeneric,
	panelFromRows: panelFromRowsGeneric,
	rowsFromPanel: rowsFromPanelGeneric,
}

// implementations lists every set of kernels this CPU can run, the
// generic one first and the most capable last. The tests run them all.
var implementations = append([]implementation{genericImpl}, asmImplementations()...)

// active is the set of kernels in use, called by the exported functions:
// the most capable one, or the one ATTN_KERNELS asks for.
var active, kernelsNote = chooseKernels(os.Getenv("ATTN_KERNELS"))
