//go:build arm64 && !purego

package simd

import "golang.org/x/sys/cpu"

// asmImplementations returns the neon family of neon_arm64.s: the
// generic kernels with the float32 ones replaced by Advanced SIMD
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
	return []implementation{a}
}
