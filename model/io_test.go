package model

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// testTokenizer has <unk>, <s>, </s>, the 256 byte pieces and a few
// letters and merges: vocab pieces in all.
func testTokenizer(t testing.TB, vocab int) *tokenizer.Tokenizer {
	pieces := []string{"<unk>", "<s>", "</s>"}
	for b := range 256 {
		pieces = append(pieces, fmt.Sprintf("<0x%02X>", b))
	}
	extra := []string{tokenizer.Space, "a", "b", "c", "e", "h", "l", "o", "t", tokenizer.Space + "t", "th", "he", tokenizer.Space + "the"}
	for i := 0; len(pieces) < vocab; i++ {
		if i < len(extra) {
			pieces = append(pieces, extra[i])
		} else {
			pieces = append(pieces, fmt.Sprintf("x%d", i))
		}
	}
	scores := make([]float32, len(pieces))
	for i := range scores {
		scores[i] = -float32(i)
	}
	tok, err := tokenizer.New(pieces[:vocab], scores[:vocab], nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

var fileConfigs = []Config{
	{Dim: 64, Hidden: 96, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 300, SeqLen: 32},
	{Dim: 48, Hidden: 40, Layers: 1, Heads: 2, KVHeads: 1, Vocab: 270, SeqLen: 16, TiedOutput: true, RopeBase: 500000, NormEps: 1e-6},
}

func TestGGUFRoundTrip(t *testing.T) {
	for ci, cfg := range fileConfigs {
		w, _ := RandomWeights(cfg, uint64(ci))
		w.Config = cfg.WithDefaults()
		tok := testTokenizer(t, cfg.Vocab)
		for _, typ := range []gguf.TensorType{gguf.F32, gguf.F16, gguf.BF16, gguf.Q8_0} {
			var buf bytes.Buffer
			if err := WriteGGUF(&buf, w, tok, typ, "test"); err != nil {
				t.Fatal(err)
			}
			back, btok, err := ReadGGUF(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
			if err != nil {
				t.Fatalf("config %d, %v: %v", ci, typ, err)
			}
			if back.Config != cfg.WithDefaults() {
				t.Errorf("config read back as %+v, want %+v", back.Config, cfg.WithDefaults())
			}
			want := w.Tensors()
			for i, bt := range back.Tensors() {
				wt := want[i]
				// What the type keeps of each value; norms are always F32,
				// and Q8_0 falls back to F32 for rows not of 32.
				tt := typ
				if len(wt.Shape) == 1 || (typ == gguf.Q8_0 && wt.Shape[1]%32 != 0) {
					tt = gguf.F32
				}
				enc, _ := gguf.Encode(nil, *wt.Data, tt)
				dec := make([]float32, len(*wt.Data))
				gguf.Decode(dec, enc, tt)
				if !slices.Equal(*bt.Data, dec) {
					t.Errorf("config %d, %v: tensor %s differs after a round trip", ci, typ, bt.Name)
				}
			}
			if typ == gguf.F32 && !reflect.DeepEqual(back, w) {
				t.Errorf("config %d: F32 weights do not read back identically", ci)
			}
			if !slices.Equal(btok.Pieces(), tok.Pieces()) || !slices.Equal(btok.Scores(), tok.Scores()) ||
				!slices.Equal(btok.Kinds(), tok.Kinds()) || btok.BOS != tok.BOS || btok.EOS != tok.EOS || btok.Unknown != tok.Unknown {
				t.Errorf("config %d: tokenizer differs after a round trip", ci)
			}
		}
	}
}

func TestLlama2CRoundTrip(t *testing.T) {
	for ci, cfg := range fileConfigs[:1] {
		for _, tied := range []bool{false, true} {
			cfg.TiedOutput = tied
			w, _ := RandomWeights(cfg, uint64(ci))
			w.Config = w.Config.WithDefaults()
			var buf bytes.Buffer
			if err := WriteLlama2C(&buf, w); err != nil {
				t.Fatal(err)
			}
			back, err := ReadLlama2C(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, w) {
				t.Errorf("tied = %v: weights differ after a round trip", tied)
			}
			raw := buf.Bytes()
			for _, n := range []int{0, 27, 28, len(raw) - 4, len(raw) - 1} {
				if _, err := ReadLlama2C(bytes.NewReader(raw[:n]), int64(n)); !errors.Is(err, ErrFormat) {
					t.Errorf("%d of %d bytes: %v, want ErrFormat", n, len(raw), err)
				}
			}
		}
	}
	w, _ := RandomWeights(fileConfigs[1], 1) // RopeBase 500000
	if err := WriteLlama2C(&bytes.Buffer{}, w); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("RopeBase 500000: %v", err)
	}
	ak42 := []byte{0x32, 0x34, 0x6b, 0x61, 1, 0, 0, 0}
	ak42 = append(ak42, make([]byte, 248)...)
	if _, err := ReadLlama2C(bytes.NewReader(ak42), int64(len(ak42))); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("ak42 export: %v", err)
	}
}

// TestLlama2CLayout writes a checkpoint by hand, value by value in run.c's
// order, and checks where each lands.
func TestLlama2CLayout(t *testing.T) {
	hd, kv := 2, 2
	var buf bytes.Buffer
	for _, v := range []int32{4, 6, 2, 2, 1, -5, 3} {
		buf.Write([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})
	}
	next := float32(0)
	put := func(n int) []float32 {
		var xs []float32
		for range n {
			next++
			xs = append(xs, next)
			b := make([]byte, 4)
			u := math.Float32bits(next)
			b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			buf.Write(b)
		}
		return xs
	}
	emb := put(5 * 4)
	attnNorm := put(2 * 4)
	wq := put(2 * 16)
	wk := put(2 * kv * 4)
	wv := put(2 * kv * 4)
	wo := put(2 * 16)
	mlpNorm := put(2 * 4)
	w1 := put(2 * 24)
	w2 := put(2 * 24)
	w3 := put(2 * 24)
	norm := put(4)
	put(3 * hd) // rotary tables
	out := put(5 * 4)
	w, err := ReadLlama2C(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if w.Config.TiedOutput || w.Config.Vocab != 5 || w.Config.KVHeads != 1 {
		t.Errorf("config %+v", w.Config)
	}
	for _, c := range []struct {
		name      string
		got, want []float32
	}{
		{"embed", w.Embed, emb}, {"attn norm 1", w.Layers[1].AttnNorm, attnNorm[4:]},
		{"wq 0", w.Layers[0].Wq, wq[:16]}, {"wk 1", w.Layers[1].Wk, wk[8:]}, {"wv 0", w.Layers[0].Wv, wv[:8]},
		{"wo 1", w.Layers[1].Wo, wo[16:]}, {"mlp norm 0", w.Layers[0].MLPNorm, mlpNorm[:4]},
		{"w1 1", w.Layers[1].W1, w1[24:]}, {"w2 0", w.Layers[0].W2, w2[:24]}, {"w3 1", w.Layers[1].W3, w3[24:]},
		{"norm", w.Norm, norm}, {"output", w.Output, out},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	cfg := fileConfigs[0]
	w, _ := RandomWeights(cfg, 3)
	w.Config = w.Config.WithDefaults()
	tok := testTokenizer(t, cfg.Vocab)
	var g, c, tb bytes.Buffer
	if err := WriteGGUF(&g, w, tok, gguf.F32, "t"); err != nil {
		t.Fatal(err)
	}
	if err := WriteLlama2C(&c, w); err != nil {
		t.Fatal(err)
	}
	if err := tok.WriteLlama2C(&tb); err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gp, cp := write("m.gguf", g.Bytes()), write("m.bin", c.Bytes())
	for _, p := range []string{gp, cp} {
		_, tk, err := Open(p, "")
		if err != nil {
			t.Fatal(err)
		}
		if p == cp && tk != nil {
			t.Error("a tokenizer without tokenizer.bin")
		}
		if p == gp && tk == nil {
			t.Error("no tokenizer from the GGUF file")
		}
	}
	write("tokenizer.bin", tb.Bytes())
	ow, otok, err := Open(cp, "")
	if err != nil || otok == nil || !reflect.DeepEqual(ow, w) {
		t.Fatalf("llama2.c with tokenizer.bin: %v, tokenizer %v", err, otok != nil)
	}
	if !slices.Equal(otok.Encode("the hat", true), tok.Encode("the hat", true)) {
		t.Error("tokenizer.bin encodes differently")
	}
	if _, _, err := Open(cp, filepath.Join(dir, "nosuch.bin")); err == nil {
		t.Error("a missing -tokenizer is not an error")
	}
	if _, _, err := Open(filepath.Join(dir, "nosuch"), ""); err == nil {
		t.Error("a missing model is not an error")
	}
}

func TestReadGGUFErrors(t *testing.T) {
	cfg := fileConfigs[1]
	w, _ := RandomWeights(cfg, 1)
	build := func(edit func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)) []byte {
		var buf bytes.Buffer
		if err := WriteGGUF(&buf, w, nil, gguf.F32, "t"); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil {
			t.Fatal(err)
		}
		var ts []gguf.Tensor
		for _, ti := range f.Tensors {
			d, _ := f.ReadTensor(ti.Name)
			ts = append(ts, gguf.Tensor{Name: ti.Name, Dims: ti.Dims, Type: ti.Type, Data: d})
		}
		kv, ts := edit(slices.Clone(f.KV), ts)
		buf.Reset()
		if err := gguf.Write(&buf, kv, ts); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	set := func(key string, v any) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			for i := range kv {
				if kv[i].Key == key {
					if v == nil {
						return slices.Delete(kv, i, i+1), ts
					}
					kv[i].Value = v
					return kv, ts
				}
			}
			return append(kv, gguf.KV{Key: key, Value: v}), ts
		}
	}
	for name, c := range map[string]struct {
		edit func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)
		want error
	}{
		"architecture": {set(keyArch, "gpt2"), attn.ErrUnsupported},
		"no dim":       {set(keyDim, nil), gguf.ErrFormat},
		"dim type":     {set(keyDim, "wide"), gguf.ErrFormat},
		"experts":      {set("llama.expert_count", uint32(8)), attn.ErrUnsupported},
		"rope scaling": {set("llama.rope.scaling.type", "yarn"), attn.ErrUnsupported},
		"rope dim":     {set(keyRopeDim, uint32(8)), attn.ErrUnsupported},
		"heads":        {set(keyHeads, uint32(5)), ErrFormat},
		"vocab":        {set(keyVocabSize, uint32(7)), ErrFormat},
		"tokenizer":    {set(keyTokens, []string{"a"}), gguf.ErrFormat},
		"missing tensor": {func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kv, ts[:3]
		}, ErrFormat},
		"extra tensor": {func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kv, append(ts, gguf.Tensor{Name: "blk.0.attn_q.bias", Dims: []uint64{48}, Type: gguf.F32, Data: make([]float32, 48)})
		}, ErrFormat},
		"rope freqs zero": {func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kv, append(ts, gguf.Tensor{Name: "rope_freqs.weight", Dims: []uint64{12}, Type: gguf.F32, Data: make([]float32, 12)})
		}, ErrFormat},
		"rope freqs length": {func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kv, append(ts, gguf.Tensor{Name: "rope_freqs.weight", Dims: []uint64{11}, Type: gguf.F32, Data: make([]float32, 11)})
		}, ErrFormat},
		"shape": {func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			ts[3].Dims = []uint64{ts[3].Dims[1], ts[3].Dims[0]}
			return kv, ts
		}, ErrFormat},
		"nan": {func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			ts[1].Data[0] = float32(0) / float32(len(ts)-len(ts))
			return kv, ts
		}, ErrFormat},
	} {
		data := build(c.edit)
		_, _, err := ReadGGUF(bytes.NewReader(data), int64(len(data)))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func FuzzReadGGUF(f *testing.F) {
	w, _ := RandomWeights(Config{Dim: 8, Hidden: 8, Layers: 1, Heads: 2, Vocab: 260, SeqLen: 8}, 1)
	tok := testTokenizer(f, 260)
	for _, typ := range []gguf.TensorType{gguf.F32, gguf.Q8_0} {
		var buf bytes.Buffer
		WriteGGUF(&buf, w, tok, typ, "fuzz")
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		w, tok, err := ReadGGUF(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, gguf.ErrFormat) && !errors.Is(err, attn.ErrUnsupported) &&
				!errors.Is(err, tokenizer.ErrFormat) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		m, err := New(w, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ids := []int{0}
		if tok != nil {
			ids = append(ids, tok.Encode("the fuzz", false)...)
		}
		for i := range ids {
			ids[i] %= w.Config.Vocab
		}
		if err := m.Forward(context.Background(), ids, len(ids)-1, make([]float32, w.Config.Vocab)); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzReadLlama2C(f *testing.F) {
	w, _ := RandomWeights(Config{Dim: 8, Hidden: 8, Layers: 1, Heads: 2, Vocab: 5, SeqLen: 4}, 1)
	var buf bytes.Buffer
	WriteLlama2C(&buf, w)
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := ReadLlama2C(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, attn.ErrUnsupported) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if _, err := New(w, Options{}); err != nil {
			t.Fatal(err)
		}
	})
}
