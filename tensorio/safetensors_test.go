package tensorio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// stFile builds a safetensors file from a header taken as is and the data.
func stFile(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func readST(b []byte) (map[string]*Tensor, map[string]string, error) {
	return ReadSafetensors(bytes.NewReader(b), int64(len(b)))
}

func TestSafetensorsRoundTrip(t *testing.T) {
	in := map[string]*Tensor{
		"scalar":       {Shape: []int{}, Data: []float32{2.5}},
		"empty":        {Shape: []int{0, 4}, Data: []float32{}},
		"also.empty":   {Shape: []int{3, 0}, Data: []float32{}},
		"specials":     {Shape: []int{len(specials)}, Data: specials},
		"big":          {Shape: []int{3, 50000}, Data: seq(150000, func(i int) float32 { return float32(i) })},
		`q"u<o>te\&é`:  {Shape: []int{1, 2}, Data: []float32{1, 2}, DType: BF16}, // DType is ignored
		"layers.0.w_q": {Shape: []int{2, 2, 2}, Data: seq(8, func(i int) float32 { return -float32(i) })},
	}
	for _, meta := range []map[string]string{nil, {}, {"format": "pt", "note": "\"quoted\"\n"}} {
		var buf bytes.Buffer
		if err := WriteSafetensors(&buf, in, meta); err != nil {
			t.Fatal(err)
		}
		if n := binary.LittleEndian.Uint64(buf.Bytes()); n%8 != 0 {
			t.Errorf("header length %d is not a multiple of 8", n)
		}
		got, gotMeta, err := readST(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if len(meta) == 0 && gotMeta != nil || len(meta) > 0 && !maps.Equal(meta, gotMeta) {
			t.Errorf("metadata %v, want %v", gotMeta, meta)
		}
		if len(got) != len(in) {
			t.Fatalf("%d tensors, want %d", len(got), len(in))
		}
		for name, want := range in {
			g := got[name]
			if g == nil || !slices.Equal(g.Shape, want.Shape) || g.DType != F32 || !sameBits(g.Data, want.Data) {
				t.Errorf("%q: got %v", name, g)
			}
		}
	}
}

// Byte vectors from the reference implementation's tests
// (huggingface/safetensors, safetensors/src/tensor.rs): our writer must
// produce them and our reader accept them.
func TestSafetensorsReferenceBytes(t *testing.T) {
	data := []float32{0, 1, 2, 3, 4, 5}
	cases := []struct {
		tensors map[string]*Tensor
		meta    map[string]string
		header  string
	}{
		{map[string]*Tensor{"attn.0": {Shape: []int{1, 2, 3}, Data: data}}, nil,
			`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`},
		{map[string]*Tensor{"attn0": {Shape: []int{1, 1, 2, 3}, Data: data}}, nil,
			`{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       `},
		{nil, nil, `{}      `},
		{nil, map[string]string{"framework": "pt"}, `{"__metadata__":{"framework":"pt"}}     `},
	}
	for _, c := range cases {
		var want []byte
		if len(c.tensors) > 0 {
			want = stFile(c.header, []byte{0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64})
		} else {
			want = stFile(c.header, nil)
		}
		var buf bytes.Buffer
		if err := WriteSafetensors(&buf, c.tensors, c.meta); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("got  %q\nwant %q", buf.Bytes(), want)
		}
		got, meta, err := readST(want)
		if err != nil || len(got) != len(c.tensors) || !maps.Equal(meta, c.meta) {
			t.Errorf("%s: %v %v %v", c.header, got, meta, err)
		}
	}
}

// A hand-built file with the other dtypes, tensors in a different order in
// the header than in the data, and metadata.
func TestSafetensorsDTypes(t *testing.T) {
	var data []byte
	for _, h := range []uint16{0x3c00, 0xc000, 0x7c00, 0x0001} { // f16: 1, -2, +Inf, 2^-24
		data = binary.LittleEndian.AppendUint16(data, h)
	}
	for _, f := range []float64{0.1, 1e300} {
		data = binary.LittleEndian.AppendUint64(data, math.Float64bits(f))
	}
	for _, b := range []uint16{0x3f80, 0xc0a0, 0x0001} { // bf16: 1, -5, 2^-133
		data = binary.LittleEndian.AppendUint16(data, b)
	}
	hdr := `{"b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]},` +
		`"__metadata__":{"format":"pt"},` +
		`"d":{"dtype":"F64","shape":[2,1],"data_offsets":[8,24]},` +
		`"h":{"shape":[2,2],"data_offsets":[0,8],"dtype":"F16","extra":{"ignored":[1]}}}`
	got, meta, err := readST(stFile(hdr, data))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*Tensor{
		"h": {Shape: []int{2, 2}, DType: F16, Data: []float32{1, -2, float32(math.Inf(1)), 0x1p-24}},
		"d": {Shape: []int{2, 1}, DType: F64, Data: []float32{0.1, float32(math.Inf(1))}},
		"b": {Shape: []int{3}, DType: BF16, Data: []float32{1, -5, 0x1p-133}},
	}
	for name, w := range want {
		g := got[name]
		if g == nil || !slices.Equal(g.Shape, w.Shape) || g.DType != w.DType || !sameBits(g.Data, w.Data) {
			t.Errorf("%s: got %+v, want %+v", name, g, w)
		}
	}
	if len(got) != 3 || meta["format"] != "pt" || len(meta) != 1 {
		t.Errorf("got %d tensors, metadata %v", len(got), meta)
	}
	// A null __metadata__ is the reference's "none".
	if _, meta, err := readST(stFile(`{"__metadata__":null}`, nil)); err != nil || meta != nil {
		t.Errorf("null metadata: %v, %v", meta, err)
	}
}

func TestReadSafetensorsErrors(t *testing.T) {
	one := func(entry string) string { return `{"t":` + entry + `}` }
	f32x2 := make([]byte, 8)
	cases := []struct {
		name string
		file []byte
		want string
		eof  bool
	}{
		{"short", []byte{1, 0, 0}, "too short", true},
		{"header too large", binary.LittleEndian.AppendUint64(nil, 100_000_001), "exceeds 100000000", false},
		{"header past end", stFile("{}", nil)[:9], "exceeds the 1 bytes", false},
		{"huge header length", binary.LittleEndian.AppendUint64(nil, math.MaxUint64), "exceeds", false},
		{"not utf-8", stFile("{\"\xff\":1}", nil), "utf-8", false},
		{"not json", stFile(`{"t":`, nil), "header", false},
		{"not an object", stFile(`[]`, nil), "not a JSON object", false},
		{"empty header", stFile(``, nil), "header", false},
		{"trailing text", stFile(`{} x`, nil), "after the JSON object", false},
		{"unclosed", stFile(`{"__metadata__":{}`, nil), "header", false},
		{"number key", stFile(`{1:2}`, nil), "header", false},
		{"two objects", stFile(`{}{}`, nil), "after the JSON object", false},
		{"duplicate tensor", stFile(`{"t":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"t":{"dtype":"F32","shape":[],"data_offsets":[4,8]}}`, f32x2), `duplicate key "t"`, false},
		{"metadata not object", stFile(`{"__metadata__":5}`, nil), "not a JSON object", false},
		{"metadata bad json", stFile(`{"__metadata__":{"a":}}`, nil), "header", false},
		{"metadata not string", stFile(`{"__metadata__":{"a":1}}`, nil), `metadata "a": value is not a string`, false},
		{"metadata duplicate", stFile(`{"__metadata__":{"a":"1","a":"2"}}`, nil), `duplicate metadata key "a"`, false},
		{"entry null", stFile(one(`null`), nil), "not a JSON object", false},
		{"entry array", stFile(one(`[1]`), nil), "not a JSON object", false},
		{"duplicate field", stFile(one(`{"dtype":"F32","dtype":"F32","shape":[],"data_offsets":[0,4]}`), f32x2[:4]), `duplicate field "dtype"`, false},
		{"field case", stFile(one(`{"DTYPE":"F32","shape":[],"data_offsets":[0,4]}`), f32x2[:4]), "missing dtype", false},
		{"missing dtype", stFile(one(`{"shape":[],"data_offsets":[0,4]}`), f32x2[:4]), "missing dtype", false},
		{"missing shape", stFile(one(`{"dtype":"F32","data_offsets":[0,4]}`), f32x2[:4]), "missing shape", false},
		{"null shape", stFile(one(`{"dtype":"F32","shape":null,"data_offsets":[0,4]}`), f32x2[:4]), "missing shape", false},
		{"missing offsets", stFile(one(`{"dtype":"F32","shape":[]}`), f32x2[:4]), "data_offsets must be", false},
		{"three offsets", stFile(one(`{"dtype":"F32","shape":[],"data_offsets":[0,4,8]}`), f32x2[:4]), "data_offsets must be", false},
		{"dtype not string", stFile(one(`{"dtype":4,"shape":[],"data_offsets":[0,4]}`), f32x2[:4]), "dtype is not a string", false},
		{"dtype I32", stFile(one(`{"dtype":"I32","shape":[],"data_offsets":[0,4]}`), f32x2[:4]), `unsupported dtype "I32"`, false},
		{"dtype unknown", stFile(one(`{"dtype":"f32","shape":[],"data_offsets":[0,4]}`), f32x2[:4]), `unsupported dtype "f32"`, false},
		{"shape float", stFile(one(`{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}`), f32x2[:4]), `element "1.5" is not an integer`, false},
		{"shape negative", stFile(one(`{"dtype":"F32","shape":[-1,-1],"data_offsets":[0,4]}`), f32x2[:4]), `element "-1" is not an integer`, false},
		{"shape not array", stFile(one(`{"dtype":"F32","shape":{},"data_offsets":[0,4]}`), f32x2[:4]), "shape: not an array", false},
		{"65 dimensions", stFile(one(`{"dtype":"F32","shape":[`+strings.Repeat("1,", 64)+`1],"data_offsets":[0,4]}`), f32x2[:4]), "more than 64 elements", false},
		{"shape overflow", stFile(one(`{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}`), f32x2[:4]), "too many elements", false},
		{"negative begin", stFile(one(`{"dtype":"F32","shape":[],"data_offsets":[-4,0]}`), f32x2[:4]), `element "-4" is not an integer`, false},
		{"offsets past int64", stFile(one(`{"dtype":"F32","shape":[],"data_offsets":[0,9223372036854775808]}`), f32x2[:4]), "not an integer from 0 to 9223372036854775807", false},
		{"end before begin", stFile(one(`{"dtype":"F32","shape":[0],"data_offsets":[4,0]}`), f32x2[:4]), "not an increasing pair", false},
		{"size mismatch", stFile(one(`{"dtype":"F32","shape":[2],"data_offsets":[0,4]}`), f32x2[:4]), "shape [2] of F32 needs 8", false},
		{"past the data", stFile(one(`{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`), f32x2[:4]), "exceed the 4-byte data section", false},
		{"huge offsets", stFile(one(`{"dtype":"F32","shape":[],"data_offsets":[9223372036854775803,9223372036854775807]}`), f32x2[:4]), "exceed", false},
		{"overlap", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32x2), `"b" at [4, 8] overlaps tensor "a"`, false},
		{"same place", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32x2[:4]), "overlaps", false},
		{"gap", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32x2), `4 unused bytes before tensor "a"`, false},
		{"trailing data", stFile(one(`{"dtype":"F32","shape":[1],"data_offsets":[0,4]}`), f32x2), "4 bytes after the last tensor", false},
		{"data but no tensors", stFile(`{}`, f32x2), "8 bytes after", false},
	}
	for _, c := range cases {
		_, _, err := readST(c.file)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) ||
			errors.Is(err, io.ErrUnexpectedEOF) != c.eof || !strings.HasPrefix(err.Error(), "tensorio: safetensors: ") {
			t.Errorf("%s: err = %v, want ErrFormat with %q (unexpected EOF: %v)", c.name, err, c.want, c.eof)
		}
	}
}

// shortReaderAt claims more bytes than it has, as a file truncated after
// it was measured would; or fails with err at offset failAt.
type shortReaderAt struct {
	data   []byte
	failAt int64
	err    error
}

func (r shortReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if r.err != nil && off+int64(len(p)) > r.failAt {
		return 0, r.err
	}
	if off >= int64(len(r.data)) {
		return 0, io.EOF
	}
	n := copy(p, r.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func TestReadSafetensorsReaderErrors(t *testing.T) {
	var buf bytes.Buffer
	in := map[string]*Tensor{"a": {Shape: []int{40000}, Data: make([]float32, 40000)}}
	if err := WriteSafetensors(&buf, in, nil); err != nil {
		t.Fatal(err)
	}
	file := buf.Bytes()
	size := int64(len(file))
	// Truncated after being measured: the header length, header, or data
	// (in the first or a later chunk) ends early.
	for _, n := range []int{4, 20, 100, len(file) - 1} {
		_, _, err := ReadSafetensors(shortReaderAt{data: file[:n]}, size)
		if !errors.Is(err, ErrFormat) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("truncated at %d: err = %v", n, err)
		}
	}
	// The reader's own errors come back without ErrFormat.
	boom := errors.New("boom")
	for _, at := range []int64{0, 20, 200, size - 1} {
		_, _, err := ReadSafetensors(shortReaderAt{data: file, failAt: at, err: boom}, size)
		if !errors.Is(err, boom) || errors.Is(err, ErrFormat) {
			t.Errorf("failing at %d: err = %v", at, err)
		}
	}
}

func TestWriteSafetensorsErrors(t *testing.T) {
	ok := &Tensor{Shape: []int{1}, Data: []float32{1}}
	for _, c := range []struct {
		name    string
		tensors map[string]*Tensor
		meta    map[string]string
	}{
		{"nil tensor", map[string]*Tensor{"a": nil}, nil},
		{"short data", map[string]*Tensor{"a": {Shape: []int{2}, Data: []float32{1}}}, nil},
		{"reserved name", map[string]*Tensor{metadataKey: ok}, nil},
		{"bad utf-8 name", map[string]*Tensor{"\xff": ok}, nil},
		{"bad utf-8 key", map[string]*Tensor{"a": ok}, map[string]string{"\xff": "v"}},
		{"bad utf-8 value", map[string]*Tensor{"a": ok}, map[string]string{"k": "\xfe"}},
	} {
		if err := WriteSafetensors(io.Discard, c.tensors, c.meta); !errors.Is(err, ErrInvalidTensor) {
			t.Errorf("%s: err = %v, want ErrInvalidTensor", c.name, err)
		}
	}
	boom := errors.New("boom")
	in := map[string]*Tensor{"a": ok, "b": ok}
	for _, n := range []int{0, 100, 120} {
		if err := WriteSafetensors(&failWriter{n: n, err: boom}, in, nil); !errors.Is(err, boom) {
			t.Errorf("writer failing after %d bytes: err = %v", n, err)
		}
	}
}

func TestWriteSafetensorsHeaderLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 100 MB header")
	}
	in := map[string]*Tensor{strings.Repeat("n", maxSafetensorsHeader): {Shape: []int{}, Data: []float32{0}}}
	if err := WriteSafetensors(io.Discard, in, nil); !errors.Is(err, ErrInvalidTensor) {
		t.Errorf("err = %v, want ErrInvalidTensor", err)
	}
}

func TestSafetensorsFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	in := map[string]*Tensor{"w": {Shape: []int{2}, Data: []float32{3, 4}}}
	if err := WriteSafetensorsFile(path, in, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	got, meta, err := ReadSafetensorsFile(path)
	if err != nil || !slices.Equal(got["w"].Data, in["w"].Data) || meta["k"] != "v" {
		t.Fatalf("round trip: %v %v %v", got, meta, err)
	}

	bad := filepath.Join(dir, "bad.safetensors")
	if err := os.WriteFile(bad, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadSafetensorsFile(bad); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), bad) {
		t.Errorf("short file: err = %v", err)
	}
	missing := filepath.Join(dir, "missing", "m.safetensors")
	if _, _, err := ReadSafetensorsFile(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: err = %v", err)
	}
	if err := WriteSafetensorsFile(missing, in, nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write into a missing directory: err = %v", err)
	}
	invalid := filepath.Join(dir, "invalid.safetensors")
	if err := WriteSafetensorsFile(invalid, map[string]*Tensor{"x": nil}, nil); !errors.Is(err, ErrInvalidTensor) {
		t.Errorf("invalid tensor: err = %v", err)
	}
	if _, err := os.Stat(invalid); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an invalid tensor still created %s", invalid)
	}
}

// /dev/full accepts the open and fails the write, which the file writers
// only see when they flush.
func TestWriteFilesDeviceFull(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	x := &Tensor{Shape: []int{1}, Data: []float32{1}}
	if err := WriteNPYFile("/dev/full", x); err == nil {
		t.Error("WriteNPYFile to /dev/full succeeded")
	}
	if err := WriteSafetensorsFile("/dev/full", map[string]*Tensor{"x": x}, nil); err == nil {
		t.Error("WriteSafetensorsFile to /dev/full succeeded")
	}
}

// TestSafetensorsHostileHeaders: headers of megabytes built to be costly
// (a shape of millions of dimensions, names, dtypes and numbers of
// megabytes, deep nesting) are refused with a short error, reading them
// allocates little beyond the header and the names in it, and many tiny
// tensors cost
// a few times the header.
func TestSafetensorsHostileHeaders(t *testing.T) {
	const n = 4 << 20
	one := func(entry string) string { return `{"t":` + entry + `}` }
	big := strings.Repeat("x", n)
	cases := []struct {
		name, header, want string
	}{
		{"millions of dimensions", one(`{"dtype":"F32","shape":[` + strings.Repeat("1,", n) + `1],"data_offsets":[0,8]}`), "more than 64 elements"},
		{"millions of offsets", one(`{"dtype":"F32","shape":[],"data_offsets":[` + strings.Repeat("0,", n) + `0]}`), "more than 2 elements"},
		{"long name", `{"` + big + `":{"dtype":"I8","shape":[],"data_offsets":[0,1]}}`, `unsupported dtype "I8"`},
		{"long dtype", one(`{"dtype":"` + big + `","shape":[],"data_offsets":[0,4]}`), "unsupported dtype"},
		{"long number", one(`{"dtype":"F32","shape":[` + strings.Repeat("9", n) + `],"data_offsets":[0,4]}`), "is not an integer"},
		{"long metadata key", `{"__metadata__":{"` + big + `":1}}`, "value is not a string"},
		{"deep nesting", one(`{"dtype":"F32","shape":[],"data_offsets":[0,4],"x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`), "header"},
		{"duplicate long names", `{"` + big + `":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"` + big + `":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}`, "duplicate key"},
	}
	for _, c := range cases {
		file := stFile(c.header, make([]byte, 8))
		alloc := allocated(func() {
			_, _, err := readST(file)
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) || len(err.Error()) > 300 {
				t.Errorf("%s: err = %.300v (%d bytes), want ErrFormat with %q, short", c.name, err, len(fmt.Sprint(err)), c.want)
			}
		})
		if alloc > 3*uint64(len(file)) {
			t.Errorf("%s: %d bytes allocated for a %d-byte file", c.name, alloc, len(file))
		}
	}
	var b strings.Builder
	b.WriteString("{")
	for i := range 100000 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}`, i)
	}
	b.WriteString("}")
	file := stFile(b.String(), nil)
	var got map[string]*Tensor
	alloc := allocated(func() {
		var err error
		if got, _, err = readST(file); err != nil {
			t.Fatal(err)
		}
	})
	if len(got) != 100000 || alloc > 8*uint64(len(file)) {
		t.Errorf("100000 empty tensors: %d read, %d bytes allocated for a %d-byte file", len(got), alloc, len(file))
	}
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}
