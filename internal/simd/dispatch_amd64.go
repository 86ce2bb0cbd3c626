//go:build amd64 && !purego

package simd

import "golang.org/x/sys/cpu"

// asmImplementations returns the assembly kernels of simd_amd64.s when
// the CPU and the OS support AVX2 and FMA.
func asmImplementations() []implementation {
	if !cpu.X86.HasAVX || !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		return nil
	}
	return []implementation{{
		name:    "avx2",
		gemm:    gemmAVX2,
		expSum:  expSumAVX2,
		exp:     expAVX2,
		max:     maxAVX2,
		scale:   scaleAVX2,
		dot:     dotAVX2,
		axpy:    axpyAVX2,
		readSum: readSumAVX2,
		fmaPeak: fmaPeakAVX2,
	}}
}
