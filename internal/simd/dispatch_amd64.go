//go:build amd64 && !purego

package simd

import "golang.org/x/sys/cpu"

// asmImplementations returns the assembly kernels of simd_amd64.s when
// the CPU and the OS support AVX2 and FMA. WidenF16, DotRowsF16 and GemmF16
// also need F16C, which every CPU with AVX2 has (Intel since Ivy Bridge, AMD
// since Piledriver); should one lack it, the Go versions stand in.
func asmImplementations() []implementation {
	if !cpu.X86.HasAVX || !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		return nil
	}
	f16, dotF16, gemmF16, dotF16PF := widenF16Generic, dotRowsF16Generic, gemmF16Generic, dotRowsF16PFGeneric
	if cpu.X86.HasF16C {
		f16, dotF16, gemmF16, dotF16PF = widenF16AVX2, dotRowsF16AVX2, gemmF16AVX2, dotRowsF16PFAVX2
	}
	return []implementation{{
		name:    "avx2",
		gemm:    gemmAVX2,
		expSum:  expSumAVX2,
		exp:     expAVX2,
		expMul:  expMulAVX2,
		max:     maxAVX2,
		scale:   scaleAVX2,
		dot:     dotAVX2,
		axpy:    axpyAVX2,
		readSum: readSumAVX2,
		fmaPeak: fmaPeakAVX2,

		widenBF16: widenBF16AVX2,
		widenF16:  f16,
		dotRows:   dotRowsAVX2,

		dotRowsBF16: dotRowsBF16AVX2,
		dotRowsF16:  dotF16,

		gemmBF16: gemmBF16AVX2,
		gemmF16:  gemmF16,

		gemmPF: gemmPFAVX2,

		dotRowsPF:     dotRowsPFAVX2,
		dotRowsBF16PF: dotRowsBF16PFAVX2,
		dotRowsF16PF:  dotF16PF,

		dotRowsI8:    dotRowsI8AVX2,
		dotRowsI8PF:  dotRowsI8PFAVX2,
		gemmI8:       gemmI8AVX2,
		widenI8:      widenI8AVX2,
		scaleColumns: scaleColumnsAVX2,

		gemmPanels:    gemmPanelsAVX2,
		onlineSoftmax: onlineSoftmaxAVX2,
		attendPanels:  attendPanelsAVX2,
		panelFromRows: panelFromRowsAVX2,
		rowsFromPanel: rowsFromPanelAVX2,
	}}
}
