//go:build arm64 && !purego

package simd

import "golang.org/x/sys/cpu"

// asmImplementations returns the neon family of neon_arm64.s: the
// generic kernels with the float32 and decode ones replaced by Advanced SIMD
// versions (see the package documentation). ASIMD is part of the arm64
// baseline, so every arm64 Linux reports it; the check keeps a CPU or OS
// that does not from getting kernels it cannot run.
func asmImplementations() []implementation {
	if !cpu.ARM64.HasASIMD {
		return nil
	}
	a := genericImpl
	a.name = "neon"
	a.gemmPanels = gemmPanelsNEON
	a.onlineSoftmax = onlineSoftmaxNEON
	a.attendPanels = attendPanelsNEON
	a.gemm, a.gemmPF = gemmNEON, gemmPFNEON
	a.dotRows, a.dotRowsPF = dotRowsNEON, dotRowsPFNEON
	a.dot = dotNEONChecked
	a.axpy = axpyNEONChecked
	a.scale = scaleNEON
	a.max = maxNEON
	a.expSum = expSumNEON
	a.exp = expNEONChecked
	a.expMul = expMulNEONChecked
	a.readSum = readSumNEON
	a.fmaPeak = fmaPeakNEON
	// Without bfloat16 arithmetic the Native kernels are the widening
	// ones, as in the generic family: bf16Dot stays false.
	a.widenBF16, a.widenF16, a.widenI8 = widenBF16NEON, widenF16NEON, widenI8NEON
	a.dotRowsBF16, a.dotRowsBF16PF, a.dotRowsBF16Native = dotRowsBF16NEON, dotRowsBF16PFNEON, dotRowsBF16PFNEON
	a.gemmBF16, a.gemmBF16Native = gemmBF16NEON, gemmBF16NEON
	a.dotRowsF16, a.dotRowsF16PF, a.gemmF16 = dotRowsF16NEON, dotRowsF16PFNEON, gemmF16NEON
	a.dotRowsI8, a.dotRowsI8PF, a.gemmI8 = dotRowsI8NEON, dotRowsI8PFNEON, gemmI8NEON
	a.dotRowsU4 = [2]func(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int){dotRowsU4LoNEON, dotRowsU4HiNEON}
	a.gemmU4 = [2]func(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, pf []uint8){gemmU4LoNEON, gemmU4HiNEON}
	return []implementation{a}
}
