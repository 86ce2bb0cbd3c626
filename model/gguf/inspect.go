package gguf

import (
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/tensorio"
)

// What Summary shows of a long value.
const (
	summaryArray  = 8  // elements of an array
	summaryString = 72 // bytes of a string
)

// Summary writes what llama.cpp's gguf-dump shows: the header, every
// metadata entry with its type and value (strings past a few dozen bytes
// and arrays past a few elements abbreviated, with their lengths), and a
// table of the tensors with their type, dimensions (innermost first, as
// ggml's ne), bytes in the file and offset in the data section. Its length
// is bounded by the number of entries and tensors, not by their sizes.
func (f *File) Summary(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "GGUF version %d, alignment %d, %d metadata entries, %d tensors, data from byte %d of %d\n",
		f.Version, f.Alignment, len(f.KV), len(f.Tensors), f.DataOffset, f.size)
	if len(f.KV) > 0 {
		fmt.Fprintf(ew, "\nmetadata:\n")
		kw := 0
		for _, kv := range f.KV {
			kw = max(kw, min(len(kv.Key), 48))
		}
		for _, kv := range f.KV {
			fmt.Fprintf(ew, "  %-*s  %-14s %s\n", kw, clip(kv.Key), typeName(kv.Value), valueText(kv.Value))
		}
	}
	if len(f.Tensors) > 0 {
		fmt.Fprintf(ew, "\ntensors:\n")
		nw := len("name")
		for _, t := range f.Tensors {
			nw = max(nw, len(t.Name))
		}
		fmt.Fprintf(ew, "  %-*s  %-8s %-24s %14s %14s\n", nw, "name", "type", "dims", "bytes", "offset")
		var total uint64
		for _, t := range f.Tensors {
			dims := make([]string, len(t.Dims))
			for i, d := range t.Dims {
				dims[i] = fmt.Sprint(d)
			}
			size := "?"
			if n, ok := tensorBytesOf(t); ok {
				size = fmt.Sprint(n)
				total += n
			}
			fmt.Fprintf(ew, "  %-*s  %-8v %-24s %14s %14d\n", nw, t.Name, t.Type, strings.Join(dims, " x "), size, t.Offset)
		}
		fmt.Fprintf(ew, "  %d tensors, %d bytes of a known layout\n", len(f.Tensors), total)
	}
	return ew.err
}

// tensorBytesOf is the bytes t takes in the file, when its layout is known.
func tensorBytesOf(t TensorInfo) (uint64, bool) {
	l, ok := layouts[t.Type]
	if !ok || t.Dims[0]%uint64(l.vals) != 0 {
		return 0, false
	}
	return t.Elems() / uint64(l.vals) * uint64(l.bytes), true
}

// typeName is a metadata value's GGUF type: "string", "[float32]", ….
func typeName(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice {
		return fmt.Sprintf("%T", v)
	}
	if x, ok := v.([]any); ok {
		if len(x) > 0 {
			return "[" + typeName(x[0]) + "]"
		}
		return "[array]"
	}
	return "[" + rv.Type().Elem().String() + "]"
}

// valueText is a metadata value as Summary shows it.
func valueText(v any) string {
	if s, ok := v.(string); ok {
		return quoteClipped(s)
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice {
		return fmt.Sprint(v)
	}
	n := rv.Len()
	parts := make([]string, 0, min(n, summaryArray)+1)
	for i := range min(n, summaryArray) {
		e := rv.Index(i).Interface()
		if reflect.ValueOf(e).Kind() == reflect.Slice {
			parts = append(parts, fmt.Sprintf("[%d]", reflect.ValueOf(e).Len()))
		} else if s, ok := e.(string); ok {
			parts = append(parts, quoteClipped(s))
		} else {
			parts = append(parts, fmt.Sprint(e))
		}
	}
	if n > summaryArray {
		parts = append(parts, fmt.Sprintf("… (%d in all)", n))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// quoteClipped quotes s, its start only when long, at a character
// boundary, with its length.
func quoteClipped(s string) string {
	if len(s) <= summaryString {
		return fmt.Sprintf("%q", s)
	}
	cut := summaryString
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:cut], len(s))
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// TensorNPY reads the tensor called name as ReadTensor does (dequantised
// to float32) with the shape numpy gives it: the GGUF dimensions reversed,
// since ne[0] is the fastest-varying axis, the last of a C-order array. A
// name the file lacks wraps attn.ErrInput.
func (f *File) TensorNPY(name string) (*tensorio.Tensor, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("%w: gguf: no tensor %q among the file's %d", attn.ErrInput, clip(name), len(f.Tensors))
	}
	data, err := f.ReadTensor(name)
	if err != nil {
		return nil, err
	}
	shape := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		shape[len(shape)-1-i] = int(d) // at most maxElements
	}
	return &tensorio.Tensor{Shape: shape, Data: data, DType: tensorio.F32}, nil
}
