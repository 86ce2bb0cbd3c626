package gguf

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"testing"

	"github.com/attnkit/attn"
)

// TestDecodeDefinitions checks each type against its definition on bytes
// written by hand.
func TestDecodeDefinitions(t *testing.T) {
	// F16: sign, 5 exponent bits (bias 15), 10 mantissa bits.
	f16 := map[uint16]float32{
		0x3c00: 1, 0xc000: -2, 0x7bff: 65504, 0x0001: 1.0 / (1 << 24), 0x0400: 1.0 / (1 << 14),
		0x3555: 0.333251953125, 0x8000: float32(math.Copysign(0, -1)), 0x7c00: float32(math.Inf(1)),
	}
	for h, want := range f16 {
		var got [1]float32
		if err := Decode(got[:], []byte{byte(h), byte(h >> 8)}, F16); err != nil {
			t.Fatal(err)
		}
		if math.Float32bits(got[0]) != math.Float32bits(want) {
			t.Errorf("F16 %#04x = %v, want %v", h, got[0], want)
		}
	}
	// BF16: the upper half of a float32.
	var bf [2]float32
	if err := Decode(bf[:], []byte{0x80, 0x3f, 0x49, 0xc0}, BF16); err != nil {
		t.Fatal(err)
	}
	if bf[0] != 1 || bf[1] != math.Float32frombits(0xc0490000) {
		t.Errorf("BF16 = %v", bf)
	}
	// Q8_0: a binary16 scale d, then 32 int8 q; value d·q.
	blk := make([]byte, 2*34)
	blk[0], blk[1] = 0x00, 0x38 // d = 0.5
	blk[34], blk[35] = 0x00, 0xbc
	for i := range 32 {
		blk[2+i] = byte(int8(i - 16))
		blk[36+i] = byte(int8(127 - 8*i))
	}
	got := make([]float32, 64)
	if err := Decode(got, blk, Q8_0); err != nil {
		t.Fatal(err)
	}
	for i := range 32 {
		if want := 0.5 * float32(i-16); got[i] != want {
			t.Errorf("Q8_0 block 0 value %d = %v, want %v", i, got[i], want)
		}
		if want := -1 * float32(int8(127-8*i)); got[32+i] != want {
			t.Errorf("Q8_0 block 1 value %d = %v, want %v", i, got[32+i], want)
		}
	}
	if err := Decode(got[:31], blk[:34], Q8_0); !errors.Is(err, ErrFormat) {
		t.Errorf("Q8_0 of 31 values: %v", err)
	}
	if err := Decode(make([]float32, 256), make([]byte, 66), TensorType(16)); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("IQ2_XXS: %v", err)
	}
}

// TestQ8Quantiser checks Encode against llama.cpp's reference quantiser.
func TestQ8Quantiser(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 96)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	clear(x[64:]) // an all-zero block: d = 0, q = 0
	enc, err := Encode(nil, x, Q8_0)
	if err != nil {
		t.Fatal(err)
	}
	back := make([]float32, len(x))
	if err := Decode(back, enc, Q8_0); err != nil {
		t.Fatal(err)
	}
	for b := range 3 {
		var amax float32
		for _, v := range x[32*b : 32*b+32] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		for i := 32 * b; i < 32*b+32; i++ {
			// |error| <= d/2 for d = amax/127, plus the binary16 rounding
			// of d (relative 2^-11) times |q| <= 127.
			if e := math.Abs(float64(back[i] - x[i])); e > float64(amax)/127*(0.5+127.0/2048)+1e-7 {
				t.Errorf("value %d: %v back as %v", i, x[i], back[i])
			}
		}
	}
	if _, err := Encode(nil, x[:33], Q8_0); !errors.Is(err, attn.ErrInput) {
		t.Errorf("33 values: %v", err)
	}
}

func sample() ([]KV, []Tensor) {
	rng := rand.New(rand.NewPCG(3, 4))
	data := func(n int) []float32 {
		d := make([]float32, n)
		for i := range d {
			d[i] = float32(rng.NormFloat64())
		}
		return d
	}
	kv := []KV{
		{"general.architecture", "test"},
		{"u8", uint8(7)}, {"i8", int8(-7)}, {"u16", uint16(700)}, {"i16", int16(-700)},
		{"u32", uint32(70000)}, {"i32", int32(-70000)}, {"f32", float32(1.5)}, {"bool", true},
		{"u64", uint64(1) << 40}, {"i64", int64(-1) << 40}, {"f64", math.Pi},
		{"strings", []string{"a", "", "ünï"}}, {"floats", []float32{1, 2, 3}}, {"ints", []int32{-1, 2}},
		{"nested", []any{[]uint8{1, 2}, []string{"x"}}}, {"empty", []uint64{}},
		{"general.alignment", uint32(64)},
	}
	ts := []Tensor{
		{Name: "a", Dims: []uint64{5, 3}, Type: F32, Data: data(15)},
		{Name: "b", Dims: []uint64{7}, Type: F16, Data: data(7)},
		{Name: "c", Dims: []uint64{64, 2}, Type: Q8_0, Data: data(128)},
		{Name: "d", Dims: []uint64{3, 1, 2}, Type: BF16, Data: data(6)},
	}
	return kv, ts
}

func TestRoundTrip(t *testing.T) {
	kv, ts := sample()
	var buf bytes.Buffer
	if err := Write(&buf, kv, ts); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	f, err := Read(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 3 || f.Alignment != 64 || f.DataOffset%64 != 0 {
		t.Errorf("version %d, alignment %d, data at %d", f.Version, f.Alignment, f.DataOffset)
	}
	if !reflect.DeepEqual(f.KV, kv) {
		t.Errorf("metadata read back as %v, want %v", f.KV, kv)
	}
	for _, want := range ts {
		got, err := f.ReadTensor(want.Name)
		if err != nil {
			t.Fatal(err)
		}
		enc, _ := Encode(nil, want.Data, want.Type)
		dec := make([]float32, len(want.Data))
		if err := Decode(dec, enc, want.Type); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, dec) {
			t.Errorf("tensor %s read back as %v, want %v", want.Name, got, dec)
		}
		info, _ := f.Tensor(want.Name)
		if !reflect.DeepEqual(info.Dims, want.Dims) || info.Type != want.Type || info.Offset%64 != 0 {
			t.Errorf("tensor %s described as %+v", want.Name, info)
		}
	}
	if s, err := f.String("general.architecture"); s != "test" || err != nil {
		t.Errorf("String = %q, %v", s, err)
	}
	if u, err := f.Uint("u16"); u != 700 || err != nil {
		t.Errorf("Uint = %d, %v", u, err)
	}
	if _, err := f.Uint("i8"); !errors.Is(err, ErrFormat) {
		t.Errorf("Uint of a negative value: %v", err)
	}
	if x, err := f.Float("f32"); x != 1.5 || err != nil {
		t.Errorf("Float = %v, %v", x, err)
	}
	if _, err := f.ReadTensor("nosuch"); !errors.Is(err, ErrFormat) {
		t.Errorf("missing tensor: %v", err)
	}
	if f.Describe() == "" {
		t.Error("empty description")
	}
	// Every truncation is an error (the data of the last tensor may end
	// before its padding).
	for n := range len(raw) {
		if _, err := Read(bytes.NewReader(raw[:n]), int64(n)); err == nil {
			f, _ := Read(bytes.NewReader(raw[:n]), int64(n))
			if _, err := f.ReadTensor("d"); err == nil && n < len(raw)-64 {
				t.Fatalf("%d of %d bytes read without error", n, len(raw))
			}
		} else if !errors.Is(err, ErrFormat) {
			t.Fatalf("%d bytes: %v does not wrap ErrFormat", n, err)
		}
	}
}

func TestReadErrors(t *testing.T) {
	kv, ts := sample()
	var buf bytes.Buffer
	if err := Write(&buf, kv[:1], ts[:1]); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	patch := func(off int, b ...byte) []byte {
		d := bytes.Clone(good)
		copy(d[off:], b)
		return d
	}
	for name, c := range map[string]struct {
		data []byte
		want error
	}{
		"magic":       {patch(0, 'G', 'G', 'M', 'L'), ErrFormat},
		"version 1":   {patch(4, 1, 0, 0, 0), attn.ErrUnsupported},
		"version 4":   {patch(4, 4, 0, 0, 0), attn.ErrUnsupported},
		"big-endian":  {patch(4, 0, 0, 0, 3), attn.ErrUnsupported},
		"huge count":  {patch(8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f), ErrFormat},
		"huge kv":     {patch(16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f), ErrFormat},
		"huge key":    {patch(24, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f), ErrFormat},
		"value type":  {patch(24+8+20, 99, 0, 0, 0), ErrFormat},
		"empty":       {nil, ErrFormat},
		"short magic": {good[:3], ErrFormat},
	} {
		_, err := Read(bytes.NewReader(c.data), int64(len(c.data)))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// A tensor of a type this package does not decode is described but
	// not read: I32 has F32's size, so the file stays well formed.
	i32 := bytes.Clone(good)
	i := bytes.Index(i32, []byte{'a', 2, 0, 0, 0})
	copy(i32[i+1+4+16:], []byte{26, 0, 0, 0})
	f, err := Read(bytes.NewReader(i32), int64(len(i32)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadTensor("a"); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("I32 tensor: %v", err)
	}
	// Writer errors.
	for name, c := range map[string]struct {
		kv []KV
		ts []Tensor
	}{
		"dup key":     {[]KV{{"a", uint8(1)}, {"a", uint8(2)}}, nil},
		"bad value":   {[]KV{{"a", 1}}, nil},
		"alignment":   {[]KV{{"general.alignment", uint32(3)}}, nil},
		"dup tensor":  {nil, []Tensor{{Name: "t", Dims: []uint64{1}, Type: F32, Data: []float32{1}}, {Name: "t", Dims: []uint64{1}, Type: F32, Data: []float32{1}}}},
		"dims":        {nil, []Tensor{{Name: "t", Dims: []uint64{2}, Type: F32, Data: []float32{1}}}},
		"no dims":     {nil, []Tensor{{Name: "t", Dims: nil, Type: F32, Data: nil}}},
		"q8 row":      {nil, []Tensor{{Name: "t", Dims: []uint64{16, 2}, Type: Q8_0, Data: make([]float32, 32)}}},
		"unsupported": {nil, []Tensor{{Name: "t", Dims: []uint64{32}, Type: TensorType(2), Data: make([]float32, 32)}}},
		"deep":        {[]KV{{"a", []any{[]any{[]any{[]uint8{1}}}}}}, nil},
	} {
		if err := Write(&bytes.Buffer{}, c.kv, c.ts); err == nil {
			t.Errorf("Write %s: no error", name)
		}
	}
}

// FuzzRead: no input panics, every error wraps ErrFormat or
// ErrUnsupported, and reading a file and all its tensors allocates at
// most a fixed multiple of its size.
func FuzzRead(f *testing.F) {
	kv, ts := sample()
	var buf bytes.Buffer
	Write(&buf, kv, ts)
	f.Add(buf.Bytes())
	buf.Reset()
	Write(&buf, kv[:2], ts[2:3])
	f.Add(buf.Bytes())
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	// One small tensor of every quantised type, from random bytes.
	rng := rand.New(rand.NewPCG(5, 6))
	var qs []Tensor
	for _, s := range qspecs {
		qs = append(qs, Tensor{Name: s.t.String(), Dims: []uint64{uint64(s.n)}, Type: s.t, Raw: randomBlocks(rng, s.t, s.n)})
	}
	buf.Reset()
	Write(&buf, kv[:1], qs)
	f.Add(buf.Bytes())
	f.Add(rawFile(nil, []rawInfo{{"a", []uint64{256, 4}, Q2_K, 0}, {"b", []uint64{256, 4}, Q2_K, 0}}, make([]byte, 336)))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		r, err := Read(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, attn.ErrUnsupported) {
				t.Fatalf("error %v wraps neither ErrFormat nor ErrUnsupported", err)
			}
			if len(err.Error()) > 1000 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if n := decodedBytes(r); n > maxExpansion*uint64(len(data)) {
			t.Fatalf("%d bytes decode to %d", len(data), n)
		}
		r.Describe()
		for _, ti := range r.Tensors {
			if _, err := r.ReadTensor(ti.Name); err != nil && ti.Type.Readable() {
				t.Fatalf("tensor %q of %v: %v", ti.Name, ti.Type, err)
			}
		}
		runtime.ReadMemStats(&ms)
		if used := ms.TotalAlloc - before; used > 64*uint64(len(data))+1<<20 {
			t.Fatalf("%d bytes allocated %d", len(data), used)
		}
	})
}
