package gguf

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// Limits on what a header may describe; anything larger is malformed.
const (
	maxDims       = 4             // GGML_MAX_DIMS
	maxDepth      = 3             // arrays of arrays of arrays
	maxKeyLen     = 1 << 16       // bytes in a metadata key
	maxNameLen    = 63            // bytes in a tensor name: ggml's GGML_MAX_NAME less its NUL
	maxElements   = attn.MaxElems // values in one tensor
	maxAlignment  = 1 << 20
	decodeChunkKB = 4 << 10 // tensor data is read and decoded 4 MiB at a time
)

// KV is one metadata entry. Value is a Go value whose type gives the GGUF
// type: uint8, int8, uint16, int16, uint32, int32, float32, bool, string,
// uint64, int64, float64; an array is a slice of one of these ([]string,
// []float32, []int32, …) or, for arrays of arrays, an []any whose
// elements are such slices.
type KV struct {
	Key   string
	Value any
}

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name string
	// Dims are the dimensions innermost first (ggml's ne): a row-major
	// [rows][cols] matrix has Dims = {cols, rows}.
	Dims   []uint64
	Type   TensorType
	Offset uint64 // from the start of the data section
}

// Elems returns the number of values.
func (t TensorInfo) Elems() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is a parsed GGUF header with access to the tensors' data.
type File struct {
	Version   uint32
	Alignment uint64
	KV        []KV
	Tensors   []TensorInfo
	// DataOffset is where the data section starts in the file.
	DataOffset int64

	r      io.ReaderAt
	size   int64
	keys   map[string]int
	byName map[string]int
}

// Read parses the header of a GGUF file of size bytes read through r and
// checks that every tensor of a type whose layout ggml defines is whole
// blocks, lies inside the file and overlaps no other tensor. The data is
// read later, by ReadTensor, from r.
func Read(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("%w: negative size %d", attn.ErrInput, size)
	}
	// A small file gets a small buffer: reading costs memory in proportion.
	d := &decoder{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), int(min(size, 64<<10))), size: size}
	f := &File{r: r, size: size, keys: map[string]int{}, byName: map[string]int{}}
	magic := d.bytes(4)
	if d.err != nil {
		return nil, fmt.Errorf("%w: %d bytes is too short for a GGUF header", ErrFormat, size)
	}
	if string(magic) != Magic {
		return nil, fmt.Errorf("%w: magic %q, want %q", ErrFormat, magic, Magic)
	}
	f.Version = d.u32()
	switch {
	case d.err != nil:
		return nil, d.fail("version")
	case f.Version == 1:
		return nil, fmt.Errorf("%w: gguf version 1 (32-bit counts) is not read; convert the file to version 3", attn.ErrUnsupported)
	case f.Version == 0x03000000 || f.Version == 0x02000000:
		return nil, fmt.Errorf("%w: big-endian gguf files are not read", attn.ErrUnsupported)
	case f.Version != 2 && f.Version != 3:
		return nil, fmt.Errorf("%w: gguf version %d (this reader knows 2 and 3)", attn.ErrUnsupported, f.Version)
	}
	nTensors, nKV := d.u64(), d.u64()
	if d.err != nil {
		return nil, d.fail("counts")
	}
	// Each metadata entry takes at least 12 bytes and each tensor
	// description at least 24: counts the file cannot hold are malformed.
	if nKV > uint64(size)/12 || nTensors > uint64(size)/24 {
		return nil, fmt.Errorf("%w: %d tensors and %d metadata entries cannot fit in %d bytes", ErrFormat, nTensors, nKV, size)
	}
	f.KV = make([]KV, 0, nKV)
	for i := range nKV {
		key := d.str(maxKeyLen)
		if d.err != nil {
			return nil, d.fail(fmt.Sprintf("key of metadata entry %d", i))
		}
		if _, dup := f.keys[key]; dup {
			return nil, fmt.Errorf("%w: metadata key %q appears twice", ErrFormat, clip(key))
		}
		t := ValueType(d.u32())
		v := d.value(t, 0)
		if d.err != nil {
			return nil, d.fail(fmt.Sprintf("value of %q", clip(key)))
		}
		f.keys[key] = len(f.KV)
		f.KV = append(f.KV, KV{key, v})
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.Value("general.alignment"); ok {
		a, ok := asUint(v)
		if !ok || a == 0 || a&(a-1) != 0 || a > maxAlignment {
			return nil, fmt.Errorf("%w: general.alignment = %s, want a power of two up to %d", ErrFormat, short(v), maxAlignment)
		}
		f.Alignment = a
	}
	f.Tensors = make([]TensorInfo, 0, nTensors)
	for i := range nTensors {
		var t TensorInfo
		t.Name = d.str(maxKeyLen)
		nd := d.u32()
		if d.err != nil {
			return nil, d.fail(fmt.Sprintf("tensor description %d", i))
		}
		if len(t.Name) > maxNameLen {
			return nil, fmt.Errorf("%w: tensor %d's name %q is %d bytes; ggml allows %d", ErrFormat, i, clip(t.Name), len(t.Name), maxNameLen)
		}
		if nd == 0 || nd > maxDims {
			return nil, fmt.Errorf("%w: tensor %q has %d dimensions, want 1 to %d", ErrFormat, t.Name, nd, maxDims)
		}
		t.Dims = make([]uint64, nd)
		n := uint64(1)
		for j := range t.Dims {
			t.Dims[j] = d.u64()
			if t.Dims[j] > maxElements || (t.Dims[j] != 0 && n > maxElements/t.Dims[j]) {
				return nil, fmt.Errorf("%w: tensor %q has more than %d values", ErrFormat, t.Name, uint64(maxElements))
			}
			n *= t.Dims[j]
		}
		t.Type = TensorType(d.u32())
		t.Offset = d.u64()
		if d.err != nil {
			return nil, d.fail(fmt.Sprintf("tensor description %q", t.Name))
		}
		if _, dup := f.byName[t.Name]; dup {
			return nil, fmt.Errorf("%w: tensor %q appears twice", ErrFormat, t.Name)
		}
		if t.Offset%f.Alignment != 0 {
			return nil, fmt.Errorf("%w: tensor %q at offset %d, not a multiple of the alignment %d", ErrFormat, t.Name, t.Offset, f.Alignment)
		}
		f.byName[t.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	f.DataOffset = int64(alignUp(uint64(d.off), f.Alignment))
	if err := f.checkExtents(); err != nil {
		return nil, err
	}
	return f, nil
}

// checkExtents checks that every tensor of a known layout is whole rows
// of blocks, lies inside the data section and overlaps no other. Without
// the last check a small file whose tensors all point at the same bytes
// would make reading them allocate without bound; with it, the tensors'
// encodings sum to at most the file's size, so decoding them all
// allocates at most maxExpansion times that.
func (f *File) checkExtents() error {
	data := uint64(f.size - min(f.DataOffset, f.size))
	type span struct {
		start, end uint64
		i          int
	}
	spans := make([]span, 0, len(f.Tensors))
	for i, t := range f.Tensors {
		l, ok := layouts[t.Type]
		if !ok {
			continue // described, not read: ReadTensor reports it
		}
		if t.Dims[0]%uint64(l.vals) != 0 {
			return fmt.Errorf("%w: tensor %q of type %v has rows of %d values, not a multiple of %d",
				ErrFormat, t.Name, t.Type, t.Dims[0], l.vals)
		}
		// Elems is at most maxElements and bytes/vals at most 8, so this cannot
		// overflow.
		n := t.Elems() / uint64(l.vals) * uint64(l.bytes)
		if t.Offset > data || n > data-t.Offset {
			return fmt.Errorf("%w: tensor %q (%v, %v) ends past the %d bytes of data",
				ErrFormat, t.Name, t.Type, t.Dims, data)
		}
		if n > 0 {
			spans = append(spans, span{t.Offset, t.Offset + n, i})
		}
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.start != b.start {
			return cmpU64(a.start, b.start)
		}
		return cmpU64(a.end, b.end)
	})
	for k := 1; k < len(spans); k++ {
		if a, b := spans[k-1], spans[k]; b.start < a.end {
			return fmt.Errorf("%w: tensors %q and %q overlap (data bytes %d to %d and %d to %d)", ErrFormat,
				f.Tensors[a.i].Name, f.Tensors[b.i].Name, a.start, a.end, b.start, b.end)
		}
	}
	return nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

// Value returns the metadata value of key.
func (f *File) Value(key string) (any, bool) {
	i, ok := f.keys[key]
	if !ok {
		return nil, false
	}
	return f.KV[i].Value, true
}

// String returns the string value of key.
func (f *File) String(key string) (string, error) {
	v, ok := f.Value(key)
	if !ok {
		return "", fmt.Errorf("%w: no metadata key %q", ErrFormat, clip(key))
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: %s is %T, want a string", ErrFormat, clip(key), v)
	}
	return s, nil
}

// Uint returns the value of key, which must be a non-negative integer of
// any width.
func (f *File) Uint(key string) (uint64, error) {
	v, ok := f.Value(key)
	if !ok {
		return 0, fmt.Errorf("%w: no metadata key %q", ErrFormat, clip(key))
	}
	u, ok := asUint(v)
	if !ok {
		return 0, fmt.Errorf("%w: %s = %s (%T), want a non-negative integer", ErrFormat, clip(key), short(v), v)
	}
	return u, nil
}

// Float returns the value of key, which must be a number.
func (f *File) Float(key string) (float64, error) {
	v, ok := f.Value(key)
	if !ok {
		return 0, fmt.Errorf("%w: no metadata key %q", ErrFormat, clip(key))
	}
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	}
	if u, ok := asUint(v); ok {
		return float64(u), nil
	}
	return 0, fmt.Errorf("%w: %s = %s (%T), want a number", ErrFormat, clip(key), short(v), v)
}

func asUint(v any) (uint64, bool) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8:
		return uint64(x), x >= 0
	case int16:
		return uint64(x), x >= 0
	case int32:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

// Tensor returns the description of the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}

// ReadTensor reads the tensor called name and returns its values as
// float32, innermost dimension fastest: quantised types are dequantised
// as ggml does, so the result takes 4 bytes per value whatever the file
// stores.
func (f *File) ReadTensor(name string) ([]float32, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("%w: no tensor %q", ErrFormat, clip(name))
	}
	vals, bytes, ok := t.Type.BlockSize()
	if !ok {
		return nil, errUnsupportedType(name, t.Type)
	}
	n := t.Elems()
	out := make([]float32, n)
	// Read and decode a chunk of whole blocks at a time, so that the raw
	// bytes never need a second copy of the tensor; the chunks of a large
	// tensor are decoded on every CPU (an embedding is most of a load).
	// Each value depends on its own block only, so the count changes
	// nothing.
	blocks := n / uint64(vals)
	blocksPer := uint64(max(1, decodeChunkKB<<10/bytes))
	chunks := int((blocks + blocksPer - 1) / blocksPer)
	errs := make([]error, chunks)
	newBuf := func() []byte { return make([]byte, min(blocksPer, blocks)*uint64(bytes)) }
	_ = parallel.For(context.Background(), runtime.GOMAXPROCS(0), chunks, newBuf, func(buf []byte, c int) error {
		b := uint64(c) * blocksPer
		nb := min(blocksPer, blocks-b)
		raw := buf[:nb*uint64(bytes)]
		if _, err := f.r.ReadAt(raw, f.DataOffset+int64(t.Offset)+int64(b)*int64(bytes)); err != nil {
			errs[c] = fmt.Errorf("%w: reading tensor %q: %v", ErrFormat, clip(name), err)
			return nil
		}
		errs[c] = Decode(out[b*uint64(vals):][:nb*uint64(vals)], raw, t.Type)
		return nil
	})
	// The first chunk's error in file order, whatever the worker count.
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// decoder reads the header, remembering the first error and the offset.
type decoder struct {
	r    *bufio.Reader
	size int64
	off  int64
	err  error
	buf  [8]byte
}

func (d *decoder) fail(what string) error {
	if d.err == io.EOF || d.err == io.ErrUnexpectedEOF {
		return fmt.Errorf("%w: file ends in the %s (offset %d of %d)", ErrFormat, what, d.off, d.size)
	}
	return fmt.Errorf("%w: %s (offset %d): %v", ErrFormat, what, d.off, d.err)
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if int64(n) > d.size-d.off {
		d.err = io.ErrUnexpectedEOF
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		d.err = err
		return nil
	}
	d.off += int64(n)
	return b
}

func (d *decoder) fixed(n int) []byte {
	if d.err != nil {
		return d.buf[:n:n]
	}
	if _, err := io.ReadFull(d.r, d.buf[:n]); err != nil {
		d.err = err
		clear(d.buf[:])
	}
	d.off += int64(n)
	return d.buf[:n]
}

func (d *decoder) u8() uint8   { return d.fixed(1)[0] }
func (d *decoder) u16() uint16 { return le16(d.fixed(2)) }
func (d *decoder) u32() uint32 { return le32(d.fixed(4)) }
func (d *decoder) u64() uint64 { return le64(d.fixed(8)) }

// str reads a string of at most limit bytes.
func (d *decoder) str(limit int) string {
	n := d.u64()
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(d.size-d.off) {
		d.err = fmt.Errorf("string of %d bytes (limit %d, %d bytes left)", n, limit, d.size-d.off)
		return ""
	}
	return string(d.bytes(int(n)))
}

// value reads one value of type t; depth counts enclosing arrays.
func (d *decoder) value(t ValueType, depth int) any {
	switch t {
	case TypeUint8:
		return d.u8()
	case TypeInt8:
		return int8(d.u8())
	case TypeUint16:
		return d.u16()
	case TypeInt16:
		return int16(d.u16())
	case TypeUint32:
		return d.u32()
	case TypeInt32:
		return int32(d.u32())
	case TypeFloat32:
		return math.Float32frombits(d.u32())
	case TypeBool:
		b := d.u8()
		if b > 1 && d.err == nil {
			d.err = fmt.Errorf("bool value %d", b)
		}
		return b == 1
	case TypeString:
		return d.str(math.MaxInt32)
	case TypeUint64:
		return d.u64()
	case TypeInt64:
		return int64(d.u64())
	case TypeFloat64:
		return math.Float64frombits(d.u64())
	case TypeArray:
		return d.array(depth + 1)
	}
	if d.err == nil {
		d.err = fmt.Errorf("unknown value type %d", uint32(t))
	}
	return nil
}

func (d *decoder) array(depth int) any {
	et := ValueType(d.u32())
	n := d.u64()
	if d.err != nil {
		return nil
	}
	if depth > maxDepth {
		d.err = fmt.Errorf("arrays nested more than %d deep", maxDepth)
		return nil
	}
	// Every element takes at least one byte (strings and arrays at least
	// 8 and 12): a count the rest of the file cannot hold is malformed.
	size := et.scalarSize()
	switch et {
	case TypeString:
		size = 8
	case TypeArray:
		size = 12
	}
	if size < 0 {
		d.err = fmt.Errorf("array of unknown value type %d", uint32(et))
		return nil
	}
	minSize := uint64(size)
	if n > uint64(d.size-d.off)/minSize {
		d.err = fmt.Errorf("array of %d %v cannot fit in the %d bytes left", n, et, d.size-d.off)
		return nil
	}
	switch et {
	case TypeString:
		return readArray[string](d, n, func() string { return d.str(math.MaxInt32) })
	case TypeUint8:
		return readArray(d, n, d.u8)
	case TypeInt8:
		return readArray(d, n, func() int8 { return int8(d.u8()) })
	case TypeUint16:
		return readArray(d, n, d.u16)
	case TypeInt16:
		return readArray(d, n, func() int16 { return int16(d.u16()) })
	case TypeUint32:
		return readArray(d, n, d.u32)
	case TypeInt32:
		return readArray(d, n, func() int32 { return int32(d.u32()) })
	case TypeFloat32:
		return readArray(d, n, func() float32 { return math.Float32frombits(d.u32()) })
	case TypeBool:
		return readArray(d, n, func() bool { return d.value(TypeBool, depth).(bool) })
	case TypeUint64:
		return readArray(d, n, d.u64)
	case TypeInt64:
		return readArray(d, n, func() int64 { return int64(d.u64()) })
	case TypeFloat64:
		return readArray(d, n, func() float64 { return math.Float64frombits(d.u64()) })
	case TypeArray:
		return readArray(d, n, func() any { return d.array(depth + 1) })
	}
	return nil
}

func readArray[T any](d *decoder, n uint64, next func() T) []T {
	out := make([]T, 0, n)
	for range n {
		v := next()
		if d.err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

// Describe returns a short listing of the file: version, metadata keys
// with scalar values or array lengths, and tensors.
func (f *File) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "GGUF v%d, %d metadata entries, %d tensors, alignment %d\n", f.Version, len(f.KV), len(f.Tensors), f.Alignment)
	for _, kv := range f.KV {
		fmt.Fprintf(&b, "  %s = %s\n", kv.Key, short(kv.Value))
	}
	for _, t := range f.Tensors {
		fmt.Fprintf(&b, "  tensor %s %v %v\n", t.Name, t.Type, t.Dims)
	}
	return b.String()
}

// clip shortens s for an error message: a key or name in a malformed
// file may be megabytes long.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// short describes a metadata value in a few words: a string's start, an
// array's type and length.
func short(v any) string {
	switch x := v.(type) {
	case string:
		if len(x) > 40 {
			return fmt.Sprintf("%q…", x[:40])
		}
		return fmt.Sprintf("%q", x)
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice {
		return fmt.Sprintf("%T of %d", v, rv.Len())
	}
	return fmt.Sprint(v)
}
