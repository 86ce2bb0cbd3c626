package gguf

import (
	"bufio"
	"fmt"
	"io"
	"math"

	"github.com/attnkit/attn"
)

// Tensor is a tensor to write: float32 values encoded as Type, or bytes
// already in Type's encoding.
type Tensor struct {
	Name string // at most 63 bytes, as ggml allows
	// Dims innermost first, as in TensorInfo.
	Dims []uint64
	Type TensorType
	// Data is encoded by Encode, so Type must be Supported.
	Data []float32
	// Raw, when not nil, is written as it is instead of Data (which must
	// then be nil): ggml's encoding of the tensor, EncodedLen(Type,
	// values) bytes, for types Encode does not produce (the k-quants, …).
	Raw []byte
}

// Write writes a version 3 GGUF file with the metadata kv (in order) and
// the tensors (in order, each at the next aligned offset). The alignment is
// general.alignment when kv sets it, else 32. Metadata values must have one
// of the Go types listed at KV.
func Write(w io.Writer, kv []KV, tensors []Tensor) error {
	align := uint64(DefaultAlignment)
	seen := map[string]bool{}
	for _, e := range kv {
		if seen[e.Key] {
			return fmt.Errorf("%w: gguf: metadata key %q given twice", attn.ErrInput, e.Key)
		}
		seen[e.Key] = true
		if e.Key == "general.alignment" {
			a, ok := asUint(e.Value)
			if !ok || a == 0 || a&(a-1) != 0 || a > maxAlignment {
				return fmt.Errorf("%w: gguf: general.alignment = %v, want a power of two up to %d", attn.ErrInput, e.Value, maxAlignment)
			}
			align = a
		}
	}
	hdr := []byte(Magic)
	hdr = appendLE32(hdr, 3)
	hdr = appendLE64(hdr, uint64(len(tensors)))
	hdr = appendLE64(hdr, uint64(len(kv)))
	var err error
	for _, e := range kv {
		hdr = appendString(hdr, e.Key)
		if hdr, err = appendValue(hdr, e.Value, true, 0); err != nil {
			return fmt.Errorf("gguf: metadata %q: %w", e.Key, err)
		}
	}
	names := map[string]bool{}
	offsets := make([]uint64, len(tensors))
	var off uint64
	for i, t := range tensors {
		if names[t.Name] {
			return fmt.Errorf("%w: gguf: tensor %q given twice", attn.ErrInput, t.Name)
		}
		names[t.Name] = true
		if len(t.Name) > maxNameLen {
			return fmt.Errorf("%w: gguf: tensor name %q is longer than ggml's %d bytes", attn.ErrInput, clip(t.Name), maxNameLen)
		}
		if len(t.Dims) == 0 || len(t.Dims) > maxDims {
			return fmt.Errorf("%w: gguf: tensor %q has %d dimensions, want 1 to %d", attn.ErrInput, t.Name, len(t.Dims), maxDims)
		}
		n, err := tensorBytes(t)
		if err != nil {
			return err
		}
		offsets[i] = off
		off = alignUp(off+n, align)
		hdr = appendString(hdr, t.Name)
		hdr = appendLE32(hdr, uint32(len(t.Dims)))
		for _, d := range t.Dims {
			hdr = appendLE64(hdr, d)
		}
		hdr = appendLE32(hdr, uint32(t.Type))
		hdr = appendLE64(hdr, offsets[i])
	}
	hdr = append(hdr, make([]byte, alignUp(uint64(len(hdr)), align)-uint64(len(hdr)))...)
	bw := bufio.NewWriterSize(w, 1<<20)
	if _, err := bw.Write(hdr); err != nil {
		return err
	}
	var written uint64
	var buf []byte
	for i, t := range tensors {
		if pad := offsets[i] - written; pad > 0 {
			if _, err := bw.Write(make([]byte, pad)); err != nil {
				return err
			}
			written += pad
		}
		if t.Raw != nil {
			if _, err := bw.Write(t.Raw); err != nil {
				return err
			}
			written += uint64(len(t.Raw))
			continue
		}
		// Encode a chunk at a time: the file never needs a second copy of
		// a large tensor in memory.
		vals, _, _ := t.Type.BlockSize()
		chunk := max(vals, (1<<20)/vals*vals)
		for j := 0; j < len(t.Data); j += chunk {
			buf, err = Encode(buf[:0], t.Data[j:min(j+chunk, len(t.Data))], t.Type)
			if err != nil {
				return err
			}
			if _, err := bw.Write(buf); err != nil {
				return err
			}
			written += uint64(len(buf))
		}
	}
	if pad := alignUp(written, align) - written; pad > 0 && len(tensors) > 0 {
		if _, err := bw.Write(make([]byte, pad)); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// tensorBytes checks t's data against its dimensions and type and
// returns the bytes it takes in the file.
func tensorBytes(t Tensor) (uint64, error) {
	l, known := layouts[t.Type]
	if t.Raw == nil && !t.Type.Supported() || !known {
		return 0, fmt.Errorf("%w: gguf: tensor %q of type %v: Write encodes F32, F16, BF16 and Q8_0 from Data, and writes the bytes of any ggml type from Raw",
			attn.ErrUnsupported, t.Name, t.Type)
	}
	info := TensorInfo{Name: t.Name, Dims: t.Dims, Type: t.Type}
	// The product of the dimensions can overflow; a tensor this package
	// would not read back is refused.
	var elems uint64 = 1
	for _, d := range t.Dims {
		if d != 0 && elems > maxElements/d {
			return 0, fmt.Errorf("%w: gguf: tensor %q has more than %d values", attn.ErrInput, t.Name, uint64(maxElements))
		}
		elems *= d
	}
	if t.Dims[0]%uint64(l.vals) != 0 {
		return 0, fmt.Errorf("%w: gguf: tensor %q of type %v needs rows of a multiple of %d values, has %d", attn.ErrInput, t.Name, t.Type, l.vals, t.Dims[0])
	}
	n := elems / uint64(l.vals) * uint64(l.bytes)
	if t.Raw != nil {
		if t.Data != nil {
			return 0, fmt.Errorf("%w: gguf: tensor %q has both Data and Raw", attn.ErrInput, t.Name)
		}
		if uint64(len(t.Raw)) != n {
			return 0, fmt.Errorf("%w: gguf: tensor %q (%v, %v) needs %d bytes of Raw, has %d", attn.ErrInput, t.Name, t.Type, t.Dims, n, len(t.Raw))
		}
		return n, nil
	}
	if m := info.Elems(); m != uint64(len(t.Data)) {
		return 0, fmt.Errorf("%w: gguf: tensor %q has dimensions %v (%d values) but %d values of data", attn.ErrInput, t.Name, t.Dims, m, len(t.Data))
	}
	return n, nil
}

func appendString(b []byte, s string) []byte {
	return append(appendLE64(b, uint64(len(s))), s...)
}

// appendValue appends v, with its type tag when tagged (arrays' elements
// carry none).
func appendValue(b []byte, v any, tagged bool, depth int) ([]byte, error) {
	tag := func(t ValueType) {
		if tagged {
			b = appendLE32(b, uint32(t))
		}
	}
	switch x := v.(type) {
	case uint8:
		tag(TypeUint8)
		b = append(b, x)
	case int8:
		tag(TypeInt8)
		b = append(b, byte(x))
	case uint16:
		tag(TypeUint16)
		b = appendLE16(b, x)
	case int16:
		tag(TypeInt16)
		b = appendLE16(b, uint16(x))
	case uint32:
		tag(TypeUint32)
		b = appendLE32(b, x)
	case int32:
		tag(TypeInt32)
		b = appendLE32(b, uint32(x))
	case float32:
		tag(TypeFloat32)
		b = appendLE32(b, math.Float32bits(x))
	case bool:
		tag(TypeBool)
		if x {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	case string:
		tag(TypeString)
		b = appendString(b, x)
	case uint64:
		tag(TypeUint64)
		b = appendLE64(b, x)
	case int64:
		tag(TypeInt64)
		b = appendLE64(b, uint64(x))
	case float64:
		tag(TypeFloat64)
		b = appendLE64(b, math.Float64bits(x))
	case []uint8:
		return appendArray(b, tagged, TypeUint8, x, depth)
	case []int8:
		return appendArray(b, tagged, TypeInt8, x, depth)
	case []uint16:
		return appendArray(b, tagged, TypeUint16, x, depth)
	case []int16:
		return appendArray(b, tagged, TypeInt16, x, depth)
	case []uint32:
		return appendArray(b, tagged, TypeUint32, x, depth)
	case []int32:
		return appendArray(b, tagged, TypeInt32, x, depth)
	case []float32:
		return appendArray(b, tagged, TypeFloat32, x, depth)
	case []bool:
		return appendArray(b, tagged, TypeBool, x, depth)
	case []string:
		return appendArray(b, tagged, TypeString, x, depth)
	case []uint64:
		return appendArray(b, tagged, TypeUint64, x, depth)
	case []int64:
		return appendArray(b, tagged, TypeInt64, x, depth)
	case []float64:
		return appendArray(b, tagged, TypeFloat64, x, depth)
	case []any:
		return appendArray(b, tagged, TypeArray, x, depth)
	default:
		return b, fmt.Errorf("%w: value of Go type %T has no GGUF type", attn.ErrInput, v)
	}
	return b, nil
}

func appendArray[T any](b []byte, tagged bool, et ValueType, xs []T, depth int) ([]byte, error) {
	if depth+1 > maxDepth {
		return b, fmt.Errorf("%w: arrays nested more than %d deep", attn.ErrInput, maxDepth)
	}
	if tagged {
		b = appendLE32(b, uint32(TypeArray))
	}
	b = appendLE32(b, uint32(et))
	b = appendLE64(b, uint64(len(xs)))
	var err error
	for _, x := range xs {
		if et == TypeArray {
			// The element of an array of arrays is itself a tagged-less
			// array: element type, count, elements.
			if b, err = appendNested(b, any(x), depth+1); err != nil {
				return b, err
			}
			continue
		}
		if b, err = appendValue(b, any(x), false, depth+1); err != nil {
			return b, err
		}
	}
	return b, nil
}

// appendNested appends an array that is an element of an array.
func appendNested(b []byte, v any, depth int) ([]byte, error) {
	switch v.(type) {
	case []uint8, []int8, []uint16, []int16, []uint32, []int32, []float32, []bool, []string, []uint64, []int64, []float64, []any:
		return appendValue(b, v, false, depth)
	}
	return b, fmt.Errorf("%w: element %T of an array of arrays is not an array", attn.ErrInput, v)
}
