//go:build amd64 && !purego

package simd

import "golang.org/x/sys/cpu"

// asmImplementations returns the assembly kernel families of
// simd_amd64.s that the CPU and the OS support: avx2 (AVX2 and FMA), then
// avx512 (AVX-512 F, BW, VL and DQ, with the zmm state enabled by the OS),
// avx512bf16 (AVX512-BF16 too; with AVX512-VNNI as well, the int4
// kernels of NativeU4) and amx (AMX-TILE and AMX-BF16 too, with
// the OS's permission to use the tiles: see amxPermission), each the one
// before with some kernels replaced or added. WidenF16, DotRowsF16 and GemmF16 also need F16C, which every
// CPU with AVX2 has (Intel since Ivy Bridge, AMD since Piledriver); should
// one lack it, the Go versions stand in.
func asmImplementations() []implementation {
	x := cpu.X86
	if !x.HasAVX || !x.HasAVX2 || !x.HasFMA {
		return nil
	}
	impls := []implementation{avx2Implementation()}
	// BMI2 (the masks of the tails) comes with every AVX-512 CPU.
	if !x.HasAVX512F || !x.HasAVX512BW || !x.HasAVX512VL || !x.HasAVX512DQ || !x.HasBMI2 {
		return impls
	}
	a := impls[0]
	a.name = "avx512"
	a.fmaPeak = fmaPeakAVX512
	a.gemm = gemmAVX512
	a.gemmPF, a.gemmI8 = gemmPFAVX512, gemmI8AVX512
	if x.HasF16C {
		a.gemmF16 = gemmF16AVX512
	}
	a.dotRows, a.dotRowsPF = dotRowsAVX512, dotRowsPFAVX512
	a.dotRowsBF16, a.dotRowsBF16PF, a.dotRowsBF16Native = dotRowsBF16AVX512, dotRowsBF16PFAVX512, dotRowsBF16PFAVX512
	if x.HasF16C {
		a.dotRowsF16, a.dotRowsF16PF = dotRowsF16AVX512, dotRowsF16PFAVX512
	}
	a.dotRowsI8, a.dotRowsI8PF = dotRowsI8AVX512, dotRowsI8PFAVX512
	a.dotRowsU4 = [2]func(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int){dotRowsU4LoAVX512, dotRowsU4HiAVX512}
	a.gemmU4 = [2]func(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, pf []uint8){gemmU4LoAVX512, gemmU4HiAVX512}
	a.gemmPanels = gemmPanelsAVX512
	a.onlineSoftmax = onlineSoftmaxAVX512
	a.expSum, a.exp, a.expMul, a.elu1 = expSumAVX512, expAVX512, expMulAVX512, elu1AVX512
	a.attendPanels = attendPanelsAVX512
	impls = append(impls, a)
	if !x.HasAVX512BF16 {
		return impls
	}
	b := a
	b.name = "avx512bf16"
	b.bf16Dot = true
	b.dotRowsBF16 = dotRowsBF16AVX512BF16
	b.dotRowsBF16PF = dotRowsBF16PFAVX512BF16
	b.gemmBF16 = gemmBF16AVX512BF16
	b.dotRowsBF16Native = dotRowsBF16NativeAVX512BF16
	b.gemmBF16Native = gemmBF16NativeAVX512BF16
	b.attendAMX = attendTilesAVX512BF16
	if x.HasAVX512VNNI {
		b.u4Native = true
		b.dotRowsU4Q8 = dotRowsU4Q8AVX512BF16
		b.gemmU4BF16 = [2]func(m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int){gemmU4BF16LoAVX512BF16, gemmU4BF16HiAVX512BF16}
	}
	impls = append(impls, b)
	if !x.HasAMXTile || !x.HasAMXBF16 {
		return impls
	}
	if err := amxPermission(); err != nil {
		amxNote = "the OS does not let this process use the AMX tiles: " + err.Error()
		return impls
	}
	c := b
	c.name = "amx"
	c.attendAMX = attendTilesAMX
	return append(impls, c)
}

func avx2Implementation() implementation {
	f16, dotF16, gemmF16, dotF16PF := widenF16Generic, dotRowsF16Generic, gemmF16Generic, dotRowsF16PFGeneric
	if cpu.X86.HasF16C {
		f16, dotF16, gemmF16, dotF16PF = widenF16AVX2, dotRowsF16AVX2, gemmF16AVX2, dotRowsF16PFAVX2
	}
	return implementation{
		name:     "avx2",
		gemm:     gemmAVX2,
		expSum:   expSumAVX2,
		exp:      expAVX2,
		expMul:   expMulAVX2,
		elu1:     elu1AVX2,
		max:      maxAVX2,
		scale:    scaleAVX2,
		dot:      dotAVX2,
		axpy:     axpyAVX2,
		readSum:  readSumAVX2,
		prefetch: prefetchT0,
		fmaPeak:  fmaPeakAVX2,

		widenBF16: widenBF16AVX2,
		widenF16:  f16,
		dotRows:   dotRowsAVX2,

		dotRowsBF16: dotRowsBF16AVX2,
		dotRowsF16:  dotF16,

		gemmBF16: gemmBF16AVX2,
		gemmF16:  gemmF16,

		gemmPF: gemmPFAVX2,

		dotRowsBF16Native: dotRowsBF16PFAVX2,
		gemmBF16Native:    gemmBF16AVX2,

		dotRowsPF:     dotRowsPFAVX2,
		dotRowsBF16PF: dotRowsBF16PFAVX2,
		dotRowsF16PF:  dotF16PF,

		dotRowsI8:    dotRowsI8AVX2,
		dotRowsI8PF:  dotRowsI8PFAVX2,
		gemmI8:       gemmI8AVX2,
		widenI8:      widenI8AVX2,
		dotRowsU4:    [2]func(s []float32, lds int, q []float32, ldq, rows int, k []uint8, ldk, n, d int){dotRowsU4LoAVX2, dotRowsU4HiAVX2},
		gemmU4:       [2]func(m, n, k int, a []float32, lda int, b []uint8, ldb int, c []float32, ldc int, accumulate bool, pf []uint8){gemmU4LoAVX2, gemmU4HiAVX2},
		scaleColumns: scaleColumnsAVX2,
		dotRowsU4Q8:  dotRowsU4Q8Generic,
		gemmU4BF16:   genericImpl.gemmU4BF16,

		gemmPanels:    gemmPanelsAVX2,
		onlineSoftmax: onlineSoftmaxAVX2,
		attendPanels:  attendPanelsAVX2,
		panelFromRows: panelFromRowsAVX2,
		rowsFromPanel: rowsFromPanelAVX2,
	}
}
