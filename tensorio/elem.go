package tensorio

import (
	"encoding/binary"
	"math"
)

// elemType is one little-endian element encoding the readers understand.
type elemType struct {
	dtype  string // the Tensor.DType it yields
	size   int    // bytes per element
	decode func(dst []float32, src []byte)
}

var (
	elemF32  = elemType{F32, 4, decodeF32}
	elemF64  = elemType{F64, 8, decodeF64}
	elemF16  = elemType{F16, 2, decodeF16}
	elemBF16 = elemType{BF16, 2, decodeBF16}
)

// The decoders fill dst from src, which holds exactly len(dst) elements.

func decodeF32(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func decodeF64(dst []float32, src []byte) {
	for i := range dst {
		// Go's conversion rounds to nearest even and overflows to ±Inf, as
		// numpy's astype(float32) does.
		dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
	}
}

func decodeF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = f16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

func decodeBF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = bf16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// f16ToF32 widens an IEEE 754 binary16 value. The conversion is exact:
// float32 has more exponent and mantissa bits, so even binary16 subnormals
// become normal float32 values. NaN payloads and signs are kept.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN: all-ones exponent, payload shifted up.
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal: rebias the exponent from 15 to 127.
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0: // ±0
		return math.Float32frombits(sign)
	}
	// Subnormal: mant·2^-24. Shift the leading 1 up to the implicit bit
	// position (bit 10), lowering the exponent once per shift; 2^-14 has
	// biased float32 exponent 113.
	e := uint32(127 - 14)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}

// bf16ToF32 widens a bfloat16 value, which is the upper half of a float32.
func bf16ToF32(b uint16) float32 {
	return math.Float32frombits(uint32(b) << 16)
}
