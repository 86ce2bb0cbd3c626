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

// The ggml types this package decodes (see the package documentation for
// each one's layout). Other ggml types are named in errors and their
// extents are checked, but their data is not decoded.
const (
	F32    TensorType = 0
	F16    TensorType = 1
	Q4_0   TensorType = 2
	Q4_1   TensorType = 3
	Q5_0   TensorType = 6
	Q5_1   TensorType = 7
	Q8_0   TensorType = 8
	Q2_K   TensorType = 10
	Q3_K   TensorType = 11
	Q4_K   TensorType = 12
	Q5_K   TensorType = 13
	Q6_K   TensorType = 14
	IQ4_NL TensorType = 20
	IQ4_XS TensorType = 23
	BF16   TensorType = 30
)

// ggmlNames names the ggml types, so that an error can say which one a
// file holds.
var ggmlNames = map[TensorType]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
	10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
	16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
	22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
	29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

func (t TensorType) String() string {
	if s, ok := ggmlNames[t]; ok {
		return s
	}
	return fmt.Sprintf("ggml type %d", uint32(t))
}

// Q8Block is the number of values in one Q8_0 block.
const Q8Block = 32

// qkK is the number of values in a k-quant (and IQ4_XS) super-block,
// ggml's QK_K.
const qkK = 256

// layout is how ggml stores a type: blocks of vals values taking bytes
// bytes. decode widens whole blocks; it is nil for the types whose layout
// is known (so that a file's tensors can be checked to fit and not to
// overlap) but whose data this package does not decode.
type layout struct {
	vals, bytes int
	decode      func(dst []float32, src []byte)
}

// layouts holds ggml's block sizes (ggml_blck_size, ggml_type_size) for
// every type it defines that GGUF files may hold.
var layouts = map[TensorType]layout{
	F32:    {1, 4, decodeF32},
	F16:    {1, 2, decodeF16},
	BF16:   {1, 2, decodeBF16},
	Q4_0:   {32, 18, decodeQ4_0},
	Q4_1:   {32, 20, decodeQ4_1},
	Q5_0:   {32, 22, decodeQ5_0},
	Q5_1:   {32, 24, decodeQ5_1},
	Q8_0:   {Q8Block, 2 + Q8Block, decodeQ8_0},
	Q2_K:   {qkK, 84, decodeQ2_K},
	Q3_K:   {qkK, 110, decodeQ3_K},
	Q4_K:   {qkK, 144, decodeQ4_K},
	Q5_K:   {qkK, 176, decodeQ5_K},
	Q6_K:   {qkK, 210, decodeQ6_K},
	IQ4_NL: {32, 18, decodeIQ4_NL},
	IQ4_XS: {qkK, 136, decodeIQ4_XS},
	9:      {32, 36, nil},   // Q8_1
	15:     {qkK, 292, nil}, // Q8_K
	16:     {qkK, 66, nil},  // IQ2_XXS
	17:     {qkK, 74, nil},  // IQ2_XS
	18:     {qkK, 98, nil},  // IQ3_XXS
	19:     {qkK, 50, nil},  // IQ1_S
	21:     {qkK, 110, nil}, // IQ3_S
	22:     {qkK, 82, nil},  // IQ2_S
	24:     {1, 1, nil},     // I8
	25:     {1, 2, nil},     // I16
	26:     {1, 4, nil},     // I32
	27:     {1, 8, nil},     // I64
	28:     {1, 8, nil},     // F64
	29:     {qkK, 56, nil},  // IQ1_M
	34:     {qkK, 54, nil},  // TQ1_0
	35:     {qkK, 66, nil},  // TQ2_0
	39:     {32, 17, nil},   // MXFP4
}

// maxExpansion bounds the float32 bytes a decoded tensor takes per byte
// of its encoding, over the types this package decodes (Q2_K's
// 4·256/84 is the largest). Read rejects overlapping tensors, so reading
// every tensor of a file allocates at most maxExpansion times its size.
const maxExpansion = 13

// Supported reports whether this package both decodes and encodes t (F32,
// F16, BF16, Q8_0). Every supported type is Readable.
func (t TensorType) Supported() bool {
	switch t {
	case F32, F16, BF16, Q8_0:
		return true
	}
	return false
}

// Readable reports whether Decode and File.ReadTensor widen t to float32.
func (t TensorType) Readable() bool { return layouts[t].decode != nil }

// BlockSize returns the number of values per block of t and the bytes a
// block takes; ok is false for types this package does not decode.
func (t TensorType) BlockSize() (values, bytes int, ok bool) {
	l := layouts[t]
	if l.decode == nil {
		return 0, 0, false
	}
	return l.vals, l.bytes, true
}

// readableNames lists the decoded types for error messages.
const readableNames = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS"

// errUnsupportedType is the error for data of a type this package does not
// decode.
func errUnsupportedType(name string, t TensorType) error {
	if name == "" {
		return fmt.Errorf("%w: gguf: type %v is not decoded; readable: %s", attn.ErrUnsupported, t, readableNames)
	}
	return fmt.Errorf("%w: gguf: tensor %q has type %v; readable: %s", attn.ErrUnsupported, clip(name), t, readableNames)
}

// Decode widens len(dst) values of type t from src to float32, as ggml's
// dequantize_row_* does. len(dst) must be a whole number of t's blocks and
// src must hold exactly their encoding (EncodedLen bytes).
func Decode(dst []float32, src []byte, t TensorType) error {
	l := layouts[t]
	if l.decode == nil {
		return errUnsupportedType("", t)
	}
	if len(dst)%l.vals != 0 || len(src) != len(dst)/l.vals*l.bytes {
		return fmt.Errorf("%w: %d bytes of %v for %d values", ErrFormat, len(src), t, len(dst))
	}
	l.decode(dst, src)
	return nil
}

// EncodedLen returns the bytes n values of type t take, or an error if
// ggml's layout of t is unknown here or n is not a whole number of
// blocks. It knows the layouts of types that are not Readable too.
func EncodedLen(t TensorType, n int) (int, error) {
	l, ok := layouts[t]
	if !ok {
		return 0, errUnsupportedType("", t)
	}
	if n < 0 || n%l.vals != 0 {
		return 0, fmt.Errorf("%w: %d values are not whole %v blocks of %d", attn.ErrInput, n, t, l.vals)
	}
	return n / l.vals * l.bytes, nil
}

// Encode appends src encoded as type t to dst. F16 and BF16 round to
// nearest even; Q8_0 follows llama.cpp's reference quantiser: per block of
// 32, d = max|x|/127 (stored as binary16) and q = round(x/d), ties away
// from zero, with q = 0 when d = 0.
func Encode(dst []byte, src []float32, t TensorType) ([]byte, error) {
	if !t.Supported() {
		return dst, fmt.Errorf("%w: gguf: Encode writes F32, F16, BF16 and Q8_0, not %v (Tensor.Raw writes any type's bytes)", attn.ErrUnsupported, t)
	}
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
