package gguf

import (
	"errors"
	"fmt"
	"math"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/half"
)

// ErrFormat is wrapped by every error about a file that is not valid GGUF:
// a bad magic, a count or length past the end of the file, a value of
// an unknown type, overlapping names, misaligned offsets.
var ErrFormat = errors.New("gguf: malformed file")

// ValueType is the type of a metadata value.
type ValueType uint32

// The metadata value types of GGUF.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32",
	"float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("ValueType(%d)", uint32(t))
}

// scalarSize is the encoded size of a fixed-size value type, 0 for
// strings and arrays, -1 for unknown types.
func (t ValueType) scalarSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	case TypeString, TypeArray:
		return 0
	}
	return -1
}

// TensorType is a ggml element type.
type TensorType uint32

// The ggml types this package reads and writes. Others are named in
// errors but not decoded.
const (
	F32  TensorType = 0
	F16  TensorType = 1
	Q8_0 TensorType = 8
	BF16 TensorType = 30
)

// ggmlNames names the ggml types, so that an error can say which one a
// file holds.
var ggmlNames = map[TensorType]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
	10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
	16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
	22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
	29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0",
}

func (t TensorType) String() string {
	if s, ok := ggmlNames[t]; ok {
		return s
	}
	return fmt.Sprintf("ggml type %d", uint32(t))
}

// Q8Block is the number of values in one Q8_0 block.
const Q8Block = 32

// q8BlockBytes is the size of a Q8_0 block: a binary16 scale and 32 int8.
const q8BlockBytes = 2 + Q8Block

// Supported reports whether this package decodes and encodes t.
func (t TensorType) Supported() bool {
	switch t {
	case F32, F16, BF16, Q8_0:
		return true
	}
	return false
}

// BlockSize returns the number of values per block of t and the bytes a
// block takes; ok is false for types this package does not decode.
func (t TensorType) BlockSize() (values, bytes int, ok bool) {
	switch t {
	case F32:
		return 1, 4, true
	case F16, BF16:
		return 1, 2, true
	case Q8_0:
		return Q8Block, q8BlockBytes, true
	}
	return 0, 0, false
}

// errUnsupportedType is the error for data of a type this package does not
// decode.
func errUnsupportedType(name string, t TensorType) error {
	return fmt.Errorf("%w: gguf: tensor %q has type %v; supported: F32, F16, BF16, Q8_0", attn.ErrUnsupported, name, t)
}

// Decode widens len(dst) values of type t from src to float32. src must
// hold exactly the encoded values: len(dst)·size for F32, F16 and BF16,
// len(dst)/32 blocks of 34 bytes for Q8_0 (len(dst) a multiple of 32).
func Decode(dst []float32, src []byte, t TensorType) error {
	vals, bytes, ok := t.BlockSize()
	if !ok {
		return errUnsupportedType("", t)
	}
	if len(dst)%vals != 0 || len(src) != len(dst)/vals*bytes {
		return fmt.Errorf("%w: %d bytes of %v for %d values", ErrFormat, len(src), t, len(dst))
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = half.F16ToF32(le16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = half.BF16ToF32(le16(src[2*i:]))
		}
	case Q8_0:
		for b := range len(dst) / Q8Block {
			blk := src[b*q8BlockBytes:][:q8BlockBytes]
			d := half.F16ToF32(le16(blk))
			out := dst[b*Q8Block:][:Q8Block]
			for i, q := range blk[2:] {
				out[i] = d * float32(int8(q))
			}
		}
	}
	return nil
}

// EncodedLen returns the bytes n values of type t take, or an error if t
// is not supported or n is not a whole number of blocks.
func EncodedLen(t TensorType, n int) (int, error) {
	vals, bytes, ok := t.BlockSize()
	if !ok {
		return 0, errUnsupportedType("", t)
	}
	if n%vals != 0 {
		return 0, fmt.Errorf("%w: %d values are not whole %v blocks of %d", attn.ErrInput, n, t, vals)
	}
	return n / vals * bytes, nil
}

// Encode appends src encoded as type t to dst. F16 and BF16 round to
// nearest even; Q8_0 follows llama.cpp's reference quantiser: per block of
// 32, d = max|x|/127 (stored as binary16) and q = round(x/d), ties away
// from zero, with q = 0 when d = 0.
func Encode(dst []byte, src []float32, t TensorType) ([]byte, error) {
	n, err := EncodedLen(t, len(src))
	if err != nil {
		return dst, err
	}
	dst = growBytes(dst, n)
	switch t {
	case F32:
		for _, x := range src {
			dst = appendLE32(dst, math.Float32bits(x))
		}
	case F16:
		for _, x := range src {
			dst = appendLE16(dst, half.F32ToF16(x))
		}
	case BF16:
		for _, x := range src {
			dst = appendLE16(dst, half.F32ToBF16(x))
		}
	case Q8_0:
		for b := 0; b < len(src); b += Q8Block {
			blk := src[b : b+Q8Block]
			var amax float32
			for _, x := range blk {
				amax = max(amax, float32(math.Abs(float64(x))))
			}
			d := amax / 127
			var id float32
			if d != 0 {
				id = 1 / d
			}
			dst = appendLE16(dst, half.F32ToF16(d))
			for _, x := range blk {
				q := math.Round(float64(x * id))
				dst = append(dst, byte(int8(max(-127, min(127, q)))))
			}
		}
	}
	return dst, nil
}

func growBytes(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), len(b)+n)
		copy(nb, b)
		return nb
	}
	return b
}

func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func le64(b []byte) uint64 { return uint64(le32(b)) | uint64(le32(b[4:]))<<32 }

func appendLE16(b []byte, v uint16) []byte { return append(b, byte(v), byte(v>>8)) }
func appendLE32(b []byte, v uint32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}
func appendLE64(b []byte, v uint64) []byte {
	return appendLE32(appendLE32(b, uint32(v)), uint32(v>>32))
}
