// Package lowbit is the arithmetic of the low-bit KV caches that
// packages kvcache and decstore share: asymmetric 4-bit codes, x ≈ zero +
// scale·code with code in 0…15 and a float32 scale and zero per group of
// values (after KIVI, Liu et al. 2024); symmetric 8-bit codes, one
// float32 scale a row (QuantI8); and the Hadamard rotation that spreads
// a channel of outliers over its block before quantisation (after
// QuaRot, Ashkboos et al. 2024).
//
// Two codes share a byte, split rather than interleaved: byte i of a
// packed row of pw = Stride(D)/2 bytes holds channel i in its low nibble
// and channel i+pw in its high one, so that each half of a row is pw
// bytes read in place, one nibble each, by the kernels of package simd
// (DotRowsU4, GemmU4 and their native forms), with no unpacked copy
// written and read back.
package lowbit

// MaxError returns the largest error of a value in [lo, hi] read back
// from its code under scale (see Params): half a step, plus the float32
// rounding of zero + scale·code (half an ulp of 15·scale and of the
// largest magnitude).
func MaxError(scale, lo, hi float32) float64 {
	m := max(abs64(lo), abs64(hi))
	return float64(scale)*(0.5+15*0x1p-24) + m*0x1p-24
}

func abs64(x float32) float64 {
	if x < 0 {
		return -float64(x)
	}
	return float64(x)
}
