package model

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
)

// quantTypes are the quantised tensor types GGUF models are published in,
// with the byte offsets of each block's binary16 scales.
var quantTypes = []struct {
	typ    gguf.TensorType
	scales []int
}{
	{gguf.Q4_0, []int{0}}, {gguf.Q4_1, []int{0, 2}}, {gguf.Q5_0, []int{0}}, {gguf.Q5_1, []int{0, 2}},
	{gguf.Q8_0, []int{0}}, {gguf.Q2_K, []int{80, 82}}, {gguf.Q3_K, []int{108}}, {gguf.Q4_K, []int{0, 2}},
	{gguf.Q5_K, []int{0, 2}}, {gguf.Q6_K, []int{208}}, {gguf.IQ4_NL, []int{0}}, {gguf.IQ4_XS, []int{0}},
}

// quantBytes is n values of typ as random blocks whose scales are small
// finite binary16 values, as a quantiser would leave them.
func quantBytes(rng *rand.Rand, typ gguf.TensorType, scales []int, n int) []byte {
	vals, size, _ := typ.BlockSize()
	raw := make([]byte, n/vals*size)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	for b := 0; b < len(raw); b += size {
		for _, o := range scales {
			h := uint16(rng.IntN(2))<<15 | uint16(4+rng.IntN(4))<<10 | uint16(rng.IntN(1024))
			raw[b+o], raw[b+o+1] = byte(h), byte(h>>8)
		}
	}
	return raw
}

// TestReadGGUFQuantised writes a model whose matrices are stored in each
// quantised type (from raw blocks, through gguf.Write) and loads it: every
// weight must be the tensor's dequantisation, and the model must run.
func TestReadGGUFQuantised(t *testing.T) {
	// Rows of 256 and 512 values: whole blocks for every type.
	cfg := Config{Dim: 256, Hidden: 512, Layers: 1, Heads: 4, KVHeads: 2, Vocab: 270, SeqLen: 16}
	w, err := RandomWeights(cfg, 5)
	if err != nil {
		t.Fatal(err)
	}
	var base bytes.Buffer
	if err := WriteGGUF(&base, w, testTokenizer(t, cfg.Vocab), gguf.F32, "quantised"); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Read(bytes.NewReader(base.Bytes()), int64(base.Len()))
	if err != nil {
		t.Fatal(err)
	}
	seed := uint64(11)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 12))
	// quantised rewrites the model with its matrices as typ.
	quantised := func(typ gguf.TensorType, raw func(n int) []byte) ([]byte, map[string][]byte) {
		var ts []gguf.Tensor
		raws := map[string][]byte{}
		for _, ti := range f.Tensors {
			tt := gguf.Tensor{Name: ti.Name, Dims: ti.Dims, Type: gguf.F32}
			if len(ti.Dims) == 2 {
				tt.Type, tt.Raw = typ, raw(int(ti.Elems()))
				raws[ti.Name] = tt.Raw
			} else if tt.Data, err = f.ReadTensor(ti.Name); err != nil {
				t.Fatal(err)
			}
			ts = append(ts, tt)
		}
		var buf bytes.Buffer
		if err := gguf.Write(&buf, f.KV, ts); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes(), raws
	}
	for _, q := range quantTypes {
		file, raws := quantised(q.typ, func(n int) []byte { return quantBytes(rng, q.typ, q.scales, n) })
		back, tok, err := ReadGGUF(bytes.NewReader(file), int64(len(file)))
		if err != nil {
			t.Fatalf("%v: %v", q.typ, err)
		}
		if tok == nil || back.Config != w.Config.WithDefaults() {
			t.Errorf("%v: config %+v, tokenizer %v", q.typ, back.Config, tok != nil)
		}
		for _, bt := range back.Tensors() {
			raw, ok := raws[bt.Name]
			if !ok {
				continue
			}
			want := make([]float32, len(*bt.Data))
			if err := gguf.Decode(want, raw, q.typ); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(*bt.Data, want) {
				t.Errorf("%v: tensor %s is not its dequantisation", q.typ, bt.Name)
			}
		}
		m, err := New(back, Options{})
		if err != nil {
			t.Fatal(err)
		}
		smp, _ := NewSampler(0, 0, 1)
		if _, err := m.Generate(context.Background(), []int{1, 2, 3}, 2, smp, -1, func(int) error { return nil }); err != nil {
			t.Errorf("%v: generating: %v", q.typ, err)
		}
	}
	// A type ggml defines but this package does not decode is refused,
	// naming the type.
	iq2 := gguf.TensorType(16)
	file, _ := quantised(iq2, func(n int) []byte { return make([]byte, n/256*66) })
	if _, _, err := ReadGGUF(bytes.NewReader(file), int64(len(file))); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("IQ2_XXS: %v", err)
	}
}
