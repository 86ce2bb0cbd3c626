// Package half converts between float32 and the two 16-bit float formats
// used for compact storage: IEEE 754 binary16 ("f16") and bfloat16
// ("bf16", the upper half of a float32). Narrowing rounds to nearest,
// ties to even, as the hardware conversions (F16C, AVX512-BF16) do;
// widening is exact.
package half

import "math"

// F16ToF32 widens a binary16 value exactly; NaN payloads and signs are
// kept.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal: rebias the exponent from 15 to 127
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal mant·2^-24: exact in float32, whose range is wider.
	f := float32(mant) * (1.0 / (1 << 24))
	return math.Float32frombits(sign | math.Float32bits(f))
}

// F32ToF16 narrows x to binary16, rounding to nearest even. Values beyond
// the binary16 range become ±Inf, tiny ones subnormals or ±0, NaN stays a
// (quiet) NaN.
func F32ToF16(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff:
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13) // quiet NaN, payload kept
		}
		return sign | 0x7c00
	case exp-127 > 15:
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // binary16 biased exponent
	if e <= 0 {
		// Subnormal or zero: the value is m·2^(e-1-24+...); shift the
		// full significand (with its implicit bit) right and round.
		if e < -10 {
			return sign // below half the smallest subnormal
		}
		m := mant | 0x800000
		shift := uint(14 - e) // 13 to drop the extra mantissa bits, 1-e for the exponent
		return sign | uint16(roundShift(m, shift))
	}
	// Normal: round the mantissa to 10 bits; a carry into the exponent is
	// correct, including the overflow to Inf.
	v := uint32(e)<<10 | mant>>13
	return sign | uint16(roundBits(v, mant&0x1fff, 13))
}

// roundShift returns m >> shift rounded to nearest even.
func roundShift(m uint32, shift uint) uint32 {
	if shift >= 32 {
		return 0
	}
	return roundBits(m>>shift, m&(1<<shift-1), shift)
}

// roundBits rounds v, whose dropped low bits were rest (of width n), to
// nearest, ties to even.
func roundBits(v, rest uint32, n uint) uint32 {
	half := uint32(1) << (n - 1)
	if rest > half || (rest == half && v&1 == 1) {
		v++
	}
	return v
}

// BF16ToF32 widens a bfloat16 value exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 narrows x to bfloat16, rounding to nearest even; NaN stays a
// quiet NaN.
func F32ToBF16(x float32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // quiet NaN
	}
	return uint16(roundBits(b>>16, b&0xffff, 16))
}

// F32ToBF16Up narrows x to the least bfloat16 not below it (toward +Inf;
// a finite x past the largest bfloat16 becomes +Inf), and F32ToBF16Down
// to the greatest not above it: bounds that stay bounds at half the
// bytes. NaN stays a quiet NaN.
func F32ToBF16Up(x float32) uint16 { return bf16Directed(x, true) }

// F32ToBF16Down: see F32ToBF16Up.
func F32ToBF16Down(x float32) uint16 { return bf16Directed(x, false) }

func bf16Directed(x float32, up bool) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // quiet NaN
	}
	t := uint16(b >> 16) // toward zero
	if b&0xffff != 0 && up == (b>>31 == 0) {
		// Inexact, and the direction is away from zero: one step up in
		// magnitude (from the largest finite value, to Inf).
		t++
	}
	return t
}
