package gguf

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
)

type rawInfo struct {
	name string
	dims []uint64
	typ  TensorType
	off  uint64
}

// rawFile writes a GGUF header by hand, with any offsets, then data bytes
// of data.
func rawFile(kv []KV, infos []rawInfo, data []byte) []byte {
	b := appendLE32([]byte(Magic), 3)
	b = appendLE64(b, uint64(len(infos)))
	b = appendLE64(b, uint64(len(kv)))
	for _, e := range kv {
		b = appendString(b, e.Key)
		b, _ = appendValue(b, e.Value, true, 0)
	}
	for _, t := range infos {
		b = appendString(b, t.name)
		b = appendLE32(b, uint32(len(t.dims)))
		for _, d := range t.dims {
			b = appendLE64(b, d)
		}
		b = appendLE32(b, uint32(t.typ))
		b = appendLE64(b, t.off)
	}
	b = append(b, make([]byte, int(alignUp(uint64(len(b)), DefaultAlignment))-len(b))...)
	return append(b, data...)
}

// decodedBytes is what reading every readable tensor of f allocates.
func decodedBytes(f *File) uint64 {
	var n uint64
	for _, t := range f.Tensors {
		if t.Type.Readable() {
			n += 4 * t.Elems()
		}
	}
	return n
}

// TestOverlappingTensors: tensors that share bytes are refused, so that
// a small file cannot make reading its tensors allocate without bound.
func TestOverlappingTensors(t *testing.T) {
	same := make([]rawInfo, 200)
	for i := range same {
		same[i] = rawInfo{name: "t" + strings.Repeat("x", i%50) + string(rune('a'+i/50)), dims: []uint64{1024}, typ: F32}
	}
	sameQ := slices.Clone(same)
	for i := range sameQ {
		sameQ[i].typ, sameQ[i].dims = Q2_K, []uint64{256, 4}
	}
	f32 := func(name string, n, off uint64) rawInfo { return rawInfo{name, []uint64{n}, F32, off} }
	for name, c := range map[string]struct {
		infos []rawInfo
		ok    bool
	}{
		"all at 0":          {same, false},
		"Q2_K all at 0":     {sameQ, false},
		"partly":            {[]rawInfo{f32("a", 64, 0), f32("b", 64, 224)}, false},
		"inside":            {[]rawInfo{f32("a", 1024, 0), f32("b", 8, 512)}, false},
		"second first":      {[]rawInfo{f32("a", 64, 256), f32("b", 128, 0)}, false},
		"undecoded type":    {[]rawInfo{f32("a", 64, 0), {"b", []uint64{256}, TensorType(16), 0}}, false},
		"adjacent":          {[]rawInfo{f32("a", 64, 0), f32("b", 64, 256), f32("c", 8, 512)}, true},
		"out of order":      {[]rawInfo{f32("a", 64, 256), f32("b", 64, 0)}, true},
		"empty at 0":        {[]rawInfo{f32("a", 64, 0), {"b", []uint64{0, 7}, F32, 0}, {"c", []uint64{0}, Q4_K, 0}}, true},
		"unknown type at 0": {[]rawInfo{f32("a", 64, 0), {"b", []uint64{64}, TensorType(99), 0}}, true},
	} {
		data := make([]byte, 4096)
		raw := rawFile(nil, c.infos, data)
		f, err := Read(bytes.NewReader(raw), int64(len(raw)))
		if c.ok != (err == nil) {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Errorf("%s: %v does not wrap ErrFormat", name, err)
			}
			if len(err.Error()) > 300 {
				t.Errorf("%s: error of %d bytes", name, len(err.Error()))
			}
			continue
		}
		if n := decodedBytes(f); n > maxExpansion*uint64(len(raw)) {
			t.Errorf("%s: %d bytes decode to %d", name, len(raw), n)
		}
		for _, ti := range f.Tensors {
			if _, err := f.ReadTensor(ti.Name); err != nil && !(errors.Is(err, attn.ErrUnsupported) && !ti.Type.Readable()) {
				t.Errorf("%s: tensor %s: %v", name, ti.Name, err)
			}
		}
	}
}

// TestShortErrors: no error quotes a large part of a file.
func TestShortErrors(t *testing.T) {
	big := strings.Repeat("k", 60000) // keys may be up to 64 KiB
	longName := strings.Repeat("n", 60000)
	blob := make([]uint8, 1<<20)
	cases := map[string][]byte{
		"duplicate key": rawFile([]KV{{big, uint8(1)}, {big, uint8(2)}}, nil, nil),
		"alignment":     rawFile([]KV{{"general.alignment", blob}}, nil, nil),
		"alignment str": rawFile([]KV{{"general.alignment", big}}, nil, nil),
		"long name":     rawFile(nil, []rawInfo{{longName, []uint64{1}, F32, 0}}, make([]byte, 32)),
		"name 64":       rawFile(nil, []rawInfo{{strings.Repeat("n", 64), []uint64{1}, F32, 0}}, make([]byte, 32)),
		"bad value":     append(rawFile([]KV{{big, uint8(1)}}, nil, nil)[:24+8+len(big)], 99, 0, 0, 0),
	}
	for name, raw := range cases {
		_, err := Read(bytes.NewReader(raw), int64(len(raw)))
		if !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(err.Error()) > 300 {
			t.Errorf("%s: error of %d bytes", name, len(err.Error()))
		}
	}
	raw := rawFile([]KV{{"arr", blob}, {big, blob}}, nil, nil)
	f, err := Read(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"arr", big, big + "x"} {
		_, err1 := f.Uint(key)
		_, err2 := f.Float(key)
		_, err3 := f.String(key)
		for _, err := range []error{err1, err2, err3} {
			if err == nil {
				t.Errorf("key of %d bytes: no error", len(key))
			} else if len(err.Error()) > 300 {
				t.Errorf("key of %d bytes: error of %d bytes", len(key), len(err.Error()))
			}
		}
	}
	if _, err := f.ReadTensor(big); err == nil || len(err.Error()) > 300 {
		t.Errorf("ReadTensor of a long name: %.300v", err)
	}
}

// randomBlocks is n values of type typ as random bytes, with every
// binary16 scale set to a small finite value.
func randomBlocks(rng *rand.Rand, typ TensorType, n int) []byte {
	l := layouts[typ]
	raw := make([]byte, n/l.vals*l.bytes)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	scales := map[TensorType][]int{Q4_0: {0}, Q4_1: {0, 2}, Q5_0: {0}, Q5_1: {0, 2}, Q8_0: {0},
		Q2_K: {80, 82}, Q3_K: {108}, Q4_K: {0, 2}, Q5_K: {0, 2}, Q6_K: {208}, IQ4_NL: {0}, IQ4_XS: {0}}[typ]
	for b := 0; b < len(raw); b += l.bytes {
		for _, o := range scales {
			copy(raw[b+o:], le16b(uint16(rng.IntN(2))<<15|uint16(8+rng.IntN(4))<<10|uint16(rng.IntN(1024))))
		}
	}
	return raw
}

// TestWriteRaw writes tensors of every type from their bytes and reads
// them back.
func TestWriteRaw(t *testing.T) {
	seed := uint64(7)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 8))
	var ts []Tensor
	for _, s := range qspecs {
		dims := []uint64{uint64(s.n * 3), 5}
		ts = append(ts, Tensor{Name: "w." + s.t.String(), Dims: dims, Type: s.t, Raw: randomBlocks(rng, s.t, 15*s.n)})
	}
	ts = append(ts,
		Tensor{Name: "iq2", Dims: []uint64{256}, Type: TensorType(16), Raw: make([]byte, 66)},
		Tensor{Name: "f", Dims: []uint64{3}, Type: F16, Data: []float32{1, 2, 3}})
	var buf bytes.Buffer
	if err := Write(&buf, nil, ts); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	f, err := Read(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range ts {
		got, err := f.ReadTensor(want.Name)
		if !want.Type.Readable() {
			if !errors.Is(err, attn.ErrUnsupported) {
				t.Errorf("%s: %v", want.Name, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if want.Raw == nil {
			want.Raw, _ = Encode(nil, want.Data, want.Type)
		}
		dec := make([]float32, len(got))
		if err := Decode(dec, want.Raw, want.Type); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, dec) {
			t.Errorf("%s reads back other values", want.Name)
		}
	}
	for name, c := range map[string]struct {
		ts   []Tensor
		want error
	}{
		"short raw":    {[]Tensor{{Name: "t", Dims: []uint64{256}, Type: Q4_K, Raw: make([]byte, 143)}}, attn.ErrInput},
		"raw and data": {[]Tensor{{Name: "t", Dims: []uint64{32}, Type: Q8_0, Raw: make([]byte, 34), Data: make([]float32, 32)}}, attn.ErrInput},
		"q4_k data":    {[]Tensor{{Name: "t", Dims: []uint64{256}, Type: Q4_K, Data: make([]float32, 256)}}, attn.ErrUnsupported},
		"unknown type": {[]Tensor{{Name: "t", Dims: []uint64{1}, Type: TensorType(99), Raw: make([]byte, 4)}}, attn.ErrUnsupported},
		"k row":        {[]Tensor{{Name: "t", Dims: []uint64{128, 2}, Type: Q6_K, Raw: make([]byte, 210)}}, attn.ErrInput},
		"long name":    {[]Tensor{{Name: strings.Repeat("n", 64), Dims: []uint64{1}, Type: F32, Data: []float32{1}}}, attn.ErrInput},
		"huge":         {[]Tensor{{Name: "t", Dims: []uint64{1 << 32, 1 << 32}, Type: F32}}, attn.ErrInput},
	} {
		if err := Write(&bytes.Buffer{}, nil, c.ts); !errors.Is(err, c.want) {
			t.Errorf("Write %s: %v, want %v", name, err, c.want)
		}
	}
}
