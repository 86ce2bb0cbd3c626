package tensorio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

// streamOnly hides any Seek method, forcing ReadNPY onto its path for
// streams of unknown length.
type streamOnly struct{ r io.Reader }

func (s streamOnly) Read(p []byte) (int, error) { return s.r.Read(p) }

// sameBits reports whether a and b hold the same float32 bit patterns, so
// NaNs compare equal and -0 differs from +0.
func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func seq(n int, f func(i int) float32) []float32 {
	d := make([]float32, n)
	for i := range d {
		d[i] = f(i)
	}
	return d
}

// specials are values whose bits a round trip must keep.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -2.5, float32(math.Inf(1)), float32(math.Inf(-1)),
	float32(math.NaN()), math.Float32frombits(1), math.MaxFloat32, math.SmallestNonzeroFloat32}

func TestNPYRoundTrip(t *testing.T) {
	shapes := [][]int{{}, {5}, {0}, {0, 3}, {3, 0, 2}, {2, 3}, {2, 1, 3, 4}, {len(specials)}, {70000}}
	writers := []struct {
		name  string
		write func(io.Writer, *Tensor) error
		dtype string
	}{{"f4", WriteNPY, F32}, {"f8", WriteNPYFloat64, F64}}
	for _, shape := range shapes {
		in := &Tensor{Shape: shape}
		if len(shape) == 1 && shape[0] == len(specials) {
			in.Data = specials
		} else {
			in.Data = seq(in.Len(), func(i int) float32 { return float32(i)*0.25 - 3 })
		}
		for _, w := range writers {
			var buf bytes.Buffer
			if err := w.write(&buf, in); err != nil {
				t.Fatalf("%s %v: %v", w.name, shape, err)
			}
			if buf.Len()%4 != 0 {
				t.Errorf("%s %v: file length %d", w.name, shape, buf.Len())
			}
			for _, r := range []io.Reader{bytes.NewReader(buf.Bytes()), streamOnly{bytes.NewReader(buf.Bytes())}, iotest.HalfReader(bytes.NewReader(buf.Bytes()))} {
				out, err := ReadNPY(r)
				if err != nil {
					t.Fatalf("%s %v: %T: %v", w.name, shape, r, err)
				}
				if !slices.Equal(out.Shape, shape) || out.DType != w.dtype || !sameBits(out.Data, in.Data) {
					t.Fatalf("%s %v: %T: got shape %v dtype %s, data equal %v", w.name, shape, r, out.Shape, out.DType, sameBits(out.Data, in.Data))
				}
			}
		}
	}
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The fixtures in testdata were written by NumPy 1.24.2 (see gen_npy.py).
func TestNPYNumpyFixtures(t *testing.T) {
	// f4_big_dim0.npy has shape (123456789012, 0): empty, but its first
	// dimension does not fit a 32-bit int.
	var big int64 = 123456789012
	bigDim := int(big)
	if strconv.IntSize < 64 {
		t.Skip("the fixtures include a dimension beyond 32 bits")
	}
	a23 := []float32{-1.25, -0.75, -0.25, 0.25, 0.75, 1.25}
	cases := []struct {
		file  string
		shape []int
		dtype string
		data  []float32
		exact bool // WriteNPY must reproduce the file byte for byte
	}{
		{"f4_2x3.npy", []int{2, 3}, F32, a23, true},
		{"f4_0d.npy", []int{}, F32, []float32{3.5}, true},
		{"f4_1d.npy", []int{5}, F32, []float32{1, -2, 0.1, float32(math.Inf(1)), float32(math.Copysign(0, -1))}, true},
		{"f4_0x3.npy", []int{0, 3}, F32, []float32{}, true},
		{"f4_4d.npy", []int{2, 1, 3, 4}, F32, seq(24, func(i int) float32 { return float32(i) / 8 }), true},
		{"f4_14d.npy", []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 100}, F32, seq(100, func(i int) float32 { return float32(i) }), true},
		{"f4_big_dim0.npy", []int{bigDim, 0}, F32, []float32{}, true},
		{"f4_2x3_v2.npy", []int{2, 3}, F32, a23, false},
		{"f4_2x3_v3.npy", []int{2, 3}, F32, a23, false},
		{"f8_2x3_v3.npy", []int{2, 3}, F64, a23, false},
		// 1e300 overflows to +Inf, 1e-50 underflows to 0, 0.1 rounds to
		// nearest, and 3+2^-23 is a tie that rounds to even, 3.
		{"f8_1d.npy", []int{5}, F64, []float32{0.1, -2.5, float32(math.Inf(1)), 0, 3}, false},
		// 6e-8 was stored as the smallest float16 subnormal, 2^-24.
		{"f2_1d.npy", []int{5}, F16, []float32{1, -2, 65504, 0x1p-24, float32(math.Inf(1))}, false},
	}
	for _, c := range cases {
		raw := readFixture(t, c.file)
		got, err := ReadNPY(bytes.NewReader(raw))
		if err != nil {
			t.Errorf("%s: %v", c.file, err)
			continue
		}
		if !slices.Equal(got.Shape, c.shape) || got.DType != c.dtype || !sameBits(got.Data, c.data) {
			t.Errorf("%s: got %v %s %v, want %v %s %v", c.file, got.Shape, got.DType, got.Data, c.shape, c.dtype, c.data)
		}
		if fromFile, err := ReadNPYFile(filepath.Join("testdata", c.file)); err != nil || !sameBits(fromFile.Data, c.data) {
			t.Errorf("ReadNPYFile(%s) = %v, %v", c.file, fromFile, err)
		}
		if !c.exact {
			continue
		}
		var buf bytes.Buffer
		if err := WriteNPY(&buf, got); err != nil {
			t.Fatalf("%s: WriteNPY: %v", c.file, err)
		}
		if !bytes.Equal(buf.Bytes(), raw) {
			t.Errorf("%s: WriteNPY differs from numpy:\n got %q\nwant %q", c.file, buf.Bytes(), raw)
		}
	}
}

// WriteNPYFloat64 must write numpy's header for '<f8'; the data cannot be
// compared because the fixture's float64 values are not all float32.
func TestWriteNPYFloat64Header(t *testing.T) {
	raw := readFixture(t, "f8_1d.npy")
	var buf bytes.Buffer
	if err := WriteNPYFloat64(&buf, &Tensor{Shape: []int{5}, Data: make([]float32, 5)}); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != len(raw) || !bytes.Equal(buf.Bytes()[:128], raw[:128]) {
		t.Errorf("header:\n got %q\nwant %q", buf.Bytes()[:128], raw[:128])
	}
}

func TestNPYNumpyRejects(t *testing.T) {
	for file, want := range map[string]string{
		"f4_fortran.npy":   "fortran_order",
		"f4_bigendian.npy": `">f4"`,
		"i4_1d.npy":        `"<i4"`,
	} {
		_, err := ReadNPY(bytes.NewReader(readFixture(t, file)))
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want ErrFormat mentioning %s", file, err, want)
		}
	}
}

// npyRaw builds a .npy file around a header taken as is, unpadded.
func npyRaw(major byte, header string, data []byte) []byte {
	b := append([]byte(npyMagic), major, 0)
	if major == 1 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(header)))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(header)))
	}
	return append(append(b, header...), data...)
}

func npyDict(descr, fortran, shape string) string {
	return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }"
}

func TestReadNPYHeaderVariants(t *testing.T) {
	data := make([]byte, 24)
	for i := range 6 {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(i)))
	}
	for _, c := range []struct {
		major byte
		hdr   string
	}{
		{1, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}"},
		{1, "  {\"descr\":\"<f4\",'fortran_order':False,'shape':(2,3)}\n"},
		{1, "{\n\t'descr' : '<f4' ,\r\n 'fortran_order' : False , 'shape' : ( 2 , 3 , ) , }   \n"},
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }"}, // Python 2 longs
		{2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2l, +3), }"},
		{3, "{'descr': '<\\f4', 'fortran_order': False, 'shape': ((2), 3), }"}, // escape, parenthesised int
	} {
		got, err := ReadNPY(bytes.NewReader(npyRaw(c.major, c.hdr, data)))
		if err != nil {
			t.Errorf("%q: %v", c.hdr, err)
			continue
		}
		if !slices.Equal(got.Shape, []int{2, 3}) || got.Data[5] != 5 {
			t.Errorf("%q: got %v", c.hdr, got)
		}
	}
}

func TestReadNPYErrors(t *testing.T) {
	f4 := "'<f4'"
	ok := func(shape string) string { return npyDict(f4, "False", shape) }
	deep := strings.Repeat("(", 20) + "1" + strings.Repeat(",)", 20)
	hugeShape := "(1099511627776,)" // 2^40
	if strconv.IntSize == 32 {
		hugeShape = "(67108864,)" // 2^26, still far more than the data
	}
	cases := []struct {
		name string
		in   []byte
		want string // in the message
		eof  bool   // wraps io.ErrUnexpectedEOF
	}{
		{"short magic", []byte("\x93NUM"), "magic", true},
		{"bad magic", []byte("PK\x03\x04\x14\x00\x00\x00"), "not a .npy", false},
		{"version 4.0", []byte(npyMagic + "\x04\x00\x10\x00"), "version 4.0", false},
		{"version 1.1", []byte(npyMagic + "\x01\x01\x10\x00"), "version 1.1", false},
		{"short v1 length", []byte(npyMagic + "\x01\x00\x10"), "header length", true},
		{"short v2 length", []byte(npyMagic + "\x02\x00\x10\x00"), "header length", true},
		{"huge v2 header", []byte(npyMagic + "\x02\x00\x00\x00\x00\x40"), "exceeds", false},
		{"short header", npyRaw(1, ok("(1,)"), nil)[:30], "header", true},
		{"v3 not utf-8", npyRaw(3, "{'descr': '\xff'}", nil), "utf-8", false},
		{"not a dict", npyRaw(1, "['descr']", nil), "start with '{'", false},
		{"empty header", npyRaw(1, "", nil), "start with '{'", false},
		{"no colon", npyRaw(1, "{'descr' '<f4'}", nil), "expected ':'", false},
		{"no comma", npyRaw(1, "{'descr': '<f4' 'shape': ()}", nil), "expected ',' or '}'", false},
		{"int key", npyRaw(1, "{1: 2}", nil), "not a string", false},
		{"bad key", npyRaw(1, "{@: 2}", nil), "unexpected character", false},
		{"duplicate key", npyRaw(1, "{'shape': (), 'shape': ()}", nil), "duplicate", false},
		{"unterminated", npyRaw(1, "{'descr': '<f4}", nil), "unterminated", false},
		{"newline in string", npyRaw(1, "{'descr': '<f4\n'}", nil), "newline", false},
		{"bad char", npyRaw(1, "{'descr': @}", nil), "unexpected character", false},
		{"bad name", npyRaw(1, "{'descr': float32}", nil), "unexpected name", false},
		{"lone sign", npyRaw(1, ok("(-,)"), nil), "sign without digits", false},
		{"float dim", npyRaw(1, ok("(2.5,)"), nil), "malformed number", false},
		{"L in v3", npyRaw(3, ok("(2L,)"), nil), "malformed number", false},
		{"huge int", npyRaw(1, ok("(99999999999999999999,)"), nil), "out of range", false},
		{"too deep", npyRaw(1, ok(deep), nil), "nested too deeply", false},
		{"tuple no comma", npyRaw(1, ok("(2 3)"), nil), "expected ','", false},
		{"end of header", npyRaw(1, "{'descr':", nil), "unexpected end", false},
		{"text after dict", npyRaw(1, ok("()")+" x", nil), "after the header dict", false},
		{"unknown key", npyRaw(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'z': 1, 'a': 2}", nil), `unexpected header key "a"`, false},
		{"missing key", npyRaw(1, "{'descr': '<f4', 'fortran_order': False}", nil), `lacks "shape"`, false},
		{"structured", npyRaw(1, npyDict("[('x', '<f4')]", "False", "()"), nil), "structured", false},
		{"big-endian", npyRaw(1, npyDict("'>f8'", "False", "()"), nil), `">f8"`, false},
		{"no byte order", npyRaw(1, npyDict("'|f4'", "False", "()"), nil), `"|f4"`, false},
		{"bool", npyRaw(1, npyDict("'|b1'", "False", "()"), nil), `"|b1"`, false},
		{"fortran", npyRaw(1, npyDict(f4, "True", "(2, 3)"), nil), "fortran_order is True", false},
		{"fortran not bool", npyRaw(1, npyDict(f4, "None", "()"), nil), "not a bool", false},
		{"shape list", npyRaw(1, ok("[2, 3]"), nil), "not a tuple", false},
		{"shape int", npyRaw(1, ok("(5)"), nil), "not a tuple", false},
		{"shape str", npyRaw(1, ok("('2',)"), nil), "not an integer", false},
		{"negative dim", npyRaw(1, ok("(2, -3)"), nil), "negative", false},
		{"overflow", npyRaw(1, ok("(1099511627776, 1099511627776)"), nil), "too many", false},
		{"huge dim with zero", npyRaw(1, ok("(0, 9223372036854775807)"), nil), "too many", false},
		// 2^40 elements declared, 8 bytes present: an error, not a 4 TiB
		// allocation, whether or not the reader can seek.
		{"2^40 elements", npyRaw(1, ok(hugeShape), make([]byte, 8)), "truncated data", true},
		{"short data", npyRaw(1, ok("(2, 3)"), make([]byte, 23)), "truncated data", true},
	}
	for _, c := range cases {
		for _, r := range []io.Reader{bytes.NewReader(c.in), streamOnly{bytes.NewReader(c.in)}} {
			_, err := ReadNPY(r)
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) ||
				errors.Is(err, io.ErrUnexpectedEOF) != c.eof || !strings.HasPrefix(err.Error(), "tensorio: npy: ") {
				t.Errorf("%s (%T): err = %v, want ErrFormat with %q (unexpected EOF: %v)", c.name, r, err, c.want, c.eof)
			}
		}
	}
}

func TestReadNPYEmptyStream(t *testing.T) {
	if _, err := ReadNPY(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("err = %v, want io.EOF", err)
	}
}

// Arrays saved one after another to one stream read back one by one.
func TestReadNPYSequence(t *testing.T) {
	var buf bytes.Buffer
	for i := range 3 {
		if err := WriteNPY(&buf, &Tensor{Shape: []int{i}, Data: seq(i, func(j int) float32 { return float32(j) })}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []io.Reader{bytes.NewReader(buf.Bytes()), streamOnly{bytes.NewReader(buf.Bytes())}} {
		for i := range 3 {
			got, err := ReadNPY(r)
			if err != nil || got.Len() != i {
				t.Fatalf("array %d: %v, %v", i, got, err)
			}
		}
		if _, err := ReadNPY(r); err != io.EOF {
			t.Fatalf("after the last array: %v, want io.EOF", err)
		}
	}
}

// errAfter returns its data, then err.
type errAfter struct {
	data []byte
	err  error
}

func (r *errAfter) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestReadNPYReaderErrors(t *testing.T) {
	boom := errors.New("boom")
	var buf bytes.Buffer
	if err := WriteNPY(&buf, &Tensor{Shape: []int{4}, Data: make([]float32, 4)}); err != nil {
		t.Fatal(err)
	}
	full := buf.Bytes()
	for _, n := range []int{0, 4, 9, 100, len(full) - 1} {
		_, err := ReadNPY(&errAfter{full[:n], boom})
		if !errors.Is(err, boom) || errors.Is(err, ErrFormat) {
			t.Errorf("failing after %d bytes: err = %v, want boom without ErrFormat", n, err)
		}
	}
}

// badSeeker can seek to the end but not back.
type badSeeker struct {
	*bytes.Reader
	failAt int // which call fails: 1 = the first
	calls  int
}

func (s *badSeeker) Seek(off int64, whence int) (int64, error) {
	if s.calls++; s.calls == s.failAt {
		return 0, errors.New("cannot seek")
	}
	return s.Reader.Seek(off, whence)
}

func TestReadNPYSeekErrors(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteNPY(&buf, &Tensor{Shape: []int{1}, Data: []float32{7}}); err != nil {
		t.Fatal(err)
	}
	// A Seeker that cannot seek at all is read as a plain stream.
	for _, failAt := range []int{1, 2} {
		got, err := ReadNPY(&badSeeker{Reader: bytes.NewReader(buf.Bytes()), failAt: failAt})
		if err != nil || got.Data[0] != 7 {
			t.Errorf("seek %d fails: %v, %v", failAt, got, err)
		}
	}
	// One that moved to the end and cannot come back must not read on.
	_, err := ReadNPY(&badSeeker{Reader: bytes.NewReader(buf.Bytes()), failAt: 3})
	if err == nil || !strings.Contains(err.Error(), "seeking back") {
		t.Errorf("seek back fails: err = %v", err)
	}
}

func TestWriteNPYErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		t    *Tensor
	}{
		{"nil", nil},
		{"short data", &Tensor{Shape: []int{2, 3}, Data: make([]float32, 5)}},
		{"long data", &Tensor{Shape: []int{}, Data: make([]float32, 2)}},
		{"negative dim", &Tensor{Shape: []int{-1, -1}, Data: make([]float32, 1)}},
		{"overflow", &Tensor{Shape: []int{maxElems, 2}}},
		{"header too long", &Tensor{Shape: slices.Repeat([]int{1}, 350_000), Data: []float32{1}}},
	} {
		for _, write := range []func(io.Writer, *Tensor) error{WriteNPY, WriteNPYFloat64} {
			if err := write(io.Discard, c.t); !errors.Is(err, ErrInvalidTensor) {
				t.Errorf("%s: err = %v, want ErrInvalidTensor", c.name, err)
			}
		}
	}
	// Errors from the writer come back, header or data alike.
	boom := errors.New("boom")
	in := &Tensor{Shape: []int{100000}, Data: make([]float32, 100000)}
	for _, n := range []int{0, 128, 128 + ioChunk} {
		if err := WriteNPY(&failWriter{n: n, err: boom}, in); !errors.Is(err, boom) {
			t.Errorf("writer failing after %d bytes: err = %v", n, err)
		}
	}
}

// failWriter accepts n bytes, then fails.
type failWriter struct {
	n   int
	err error
}

func (w *failWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		k := w.n
		w.n = 0
		return k, w.err
	}
	w.n -= len(p)
	return len(p), nil
}

// A header over 65535 bytes switches to format 2.0, still 64-aligned, and
// reads back.
func TestWriteNPYVersion2(t *testing.T) {
	in := &Tensor{Shape: slices.Repeat([]int{1}, 22000), Data: []float32{42}}
	var buf bytes.Buffer
	if err := WriteNPY(&buf, in); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	hlen := int(binary.LittleEndian.Uint32(b[8:]))
	if b[6] != 2 || (12+hlen)%64 != 0 || hlen <= math.MaxUint16 || b[12+hlen-1] != '\n' || len(b) != 12+hlen+4 {
		t.Fatalf("version %d, header length %d, file length %d", b[6], hlen, len(b))
	}
	got, err := ReadNPY(bytes.NewReader(b))
	if err != nil || len(got.Shape) != 22000 || got.Data[0] != 42 {
		t.Fatalf("read back: %v", err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// npyPreamble follows numpy's rule: pad = 64 - (prefix+hlen)%64, never 0.
func TestNPYPreamblePadding(t *testing.T) {
	fullPads := 0
	for nd := range 40 {
		for _, last := range []int{1, 10, 100, 1000} {
			shape := slices.Repeat([]int{1}, nd)
			if nd > 0 {
				shape[nd-1] = last
			}
			pre, err := npyPreamble("<f4", shape)
			if err != nil {
				t.Fatal(err)
			}
			dictEnd := bytes.LastIndexByte(pre, '}') + 1
			growth := 0
			if nd > 0 {
				growth = npyGrowthDigits - len(strconv.Itoa(shape[0]))
			}
			pad := len(pre) - dictEnd - growth - 1
			if len(pre)%64 != 0 || pad < 1 || pad > 64 || pre[len(pre)-1] != '\n' {
				t.Fatalf("shape %v: preamble length %d, padding %d", shape, len(pre), pad)
			}
			fullPads += btoi(pad == 64)
		}
	}
	if fullPads == 0 {
		t.Error("no shape hit the case of a header ending on the boundary")
	}
}

func TestNPYFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.npy")
	in := &Tensor{Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}}
	if err := WriteNPYFile(path, in); err != nil {
		t.Fatal(err)
	}
	got, err := ReadNPYFile(path)
	if err != nil || !slices.Equal(got.Data, in.Data) || got.DType != F32 {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	raw, _ := os.ReadFile(path)

	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for name, c := range map[string]struct {
		data []byte
		want string
		eof  bool
	}{
		"trailing.npy":  {append(slices.Clone(raw), 0), "1 bytes after", false},
		"empty.npy":     {nil, "empty file", true},
		"truncated.npy": {raw[:len(raw)-1], "truncated data", true},
	} {
		p := write(name, c.data)
		_, err := ReadNPYFile(p)
		if !errors.Is(err, ErrFormat) || errors.Is(err, io.ErrUnexpectedEOF) != c.eof ||
			!strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v, want ErrFormat with %q and the path", name, err, c.want)
		}
	}

	missing := filepath.Join(dir, "missing", "a.npy")
	if _, err := ReadNPYFile(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: err = %v", err)
	}
	if _, err := ReadNPYFile(dir); err == nil || errors.Is(err, ErrFormat) {
		t.Errorf("directory: err = %v, want a read error", err)
	}
	if err := WriteNPYFile(missing, in); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write into a missing directory: err = %v", err)
	}
	bad := filepath.Join(dir, "bad.npy")
	if err := WriteNPYFile(bad, &Tensor{Shape: []int{3}}); !errors.Is(err, ErrInvalidTensor) {
		t.Errorf("invalid tensor: err = %v", err)
	}
	if _, err := os.Stat(bad); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an invalid tensor still created %s", bad)
	}
}

// A header that declares far more data than follows costs no more memory
// than the data that is there, seekable or not.
func TestReadNPYHugeShapeAllocation(t *testing.T) {
	shape := "(1099511627776,)" // 2^40 float64: 8 TiB
	if strconv.IntSize == 32 {
		shape = "(67108864,)"
	}
	in := npyRaw(1, npyDict("'<f8'", "False", shape), make([]byte, 1<<20))
	for _, r := range []io.Reader{bytes.NewReader(in), streamOnly{bytes.NewReader(in)}} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := ReadNPY(r)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%T: err = %v", r, err)
		}
		// 1 MiB of float64 is 512 KiB of float32, grown by doubling.
		if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
			t.Errorf("%T: allocated %d bytes for a 1 MiB input", r, got)
		}
	}
}

// TestNPYLongHeaderErrors: a header of a megabyte, a shape of hundreds of
// thousands of dimensions or a long key, gets an error of a line.
func TestNPYLongHeaderErrors(t *testing.T) {
	file := func(h string) []byte {
		h += strings.Repeat(" ", 63-(len(h)+12)%64) + "\n"
		b := binary.LittleEndian.AppendUint32([]byte("\x93NUMPY\x02\x00"), uint32(len(h)))
		return append(append(b, h...), make([]byte, 16)...)
	}
	long := strings.Repeat("2,", 300000)
	for _, h := range []string{
		"{'descr': '<f4', 'fortran_order': False, 'shape': (" + long + "), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (" + strings.Repeat("1,", 300000) + "8), }", // data too short
		"{'descr': '<f4', 'fortran_order': False, 'shape': [" + long + "], }",
		"{'descr': '" + strings.Repeat("x", 500000) + "', 'fortran_order': False, 'shape': (), }",
		"{'descr': '<f4', 'fortran_order': (" + long + "), 'shape': (), }",
		"{'" + strings.Repeat("k", 500000) + "': 1, 'descr': '<f4', 'fortran_order': False, 'shape': (), }",
		"{(" + long + "): 1}",
	} {
		_, err := ReadNPY(bytes.NewReader(file(h)))
		if !errors.Is(err, ErrFormat) || len(err.Error()) > 300 {
			t.Errorf("err = %.300v (%d bytes), want a short ErrFormat", err, len(fmt.Sprint(err)))
		}
	}
}
