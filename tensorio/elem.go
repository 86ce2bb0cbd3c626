package tensorio

import (
	"encoding/binary"
	"math"

	"github.com/attnkit/attn/internal/half"
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
		dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

func decodeBF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = half.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}
