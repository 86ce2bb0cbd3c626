package model

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// byteText is GPT-2's bytes_to_unicode, as package tokenizer has it.
func byteText(b byte) string {
	switch {
	case '!' <= b && b <= '~', 0xA1 <= b && b <= 0xAC, 0xAE <= b:
		return string(rune(b))
	}
	n := 0
	for c := range int(b) {
		if !('!' <= c && c <= '~' || 0xA1 <= c && c <= 0xAC || 0xAE <= c) {
			n++
		}
	}
	return string(rune(256 + n))
}

// cl100kGGUF writes tiktoken's cl100k_base as a vocabulary-only GGUF file
// (the ranks from package tokenizer's testdata; merges derived as Hugging
// Face's converter derives them; the special tokens as control pieces),
// the form of llama.cpp's ggml-vocab-*.gguf test files, and returns its
// path.
func cl100kGGUF(t *testing.T) string {
	t.Helper()
	f, err := os.Open("tokenizer/testdata/cl100k_base.bin.gz")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(z)
	var ranks []string
	for {
		n, err := r.ReadByte()
		if err == io.EOF {
			break
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			t.Fatal(err)
		}
		ranks = append(ranks, string(b))
	}
	rank := map[string]int{}
	for i, s := range ranks {
		rank[s] = i
	}
	enc := func(s string) string {
		var b strings.Builder
		for i := range len(s) {
			b.WriteString(byteText(s[i]))
		}
		return b.String()
	}
	var pieces, merges []string
	var types []int32
	for _, s := range ranks {
		pieces = append(pieces, enc(s))
		types = append(types, int32(tokenizer.Normal))
	}
	for _, s := range ranks {
		type split struct{ l, r int }
		var local []split
		for k := 1; k < len(s); k++ {
			if l, ok := rank[s[:k]]; ok {
				if r, ok := rank[s[k:]]; ok {
					local = append(local, split{l, r})
				}
			}
		}
		slices.SortStableFunc(local, func(a, b split) int {
			if a.l != b.l {
				return a.l - b.l
			}
			return a.r - b.r
		})
		for _, sp := range local {
			merges = append(merges, pieces[sp.l]+" "+pieces[sp.r])
		}
	}
	special := map[int]string{100257: "<|endoftext|>", 100258: "<|fim_prefix|>", 100259: "<|fim_middle|>", 100260: "<|fim_suffix|>", 100276: "<|endofprompt|>"}
	for id := len(pieces); id <= 100276; id++ {
		if s, ok := special[id]; ok {
			pieces = append(pieces, s)
			types = append(types, int32(tokenizer.Control))
		} else {
			pieces = append(pieces, fmt.Sprintf("<|unused_%d|>", id))
			types = append(types, int32(tokenizer.Unused))
		}
	}
	kv := []gguf.KV{
		{Key: keyArch, Value: "llama"},
		{Key: keyTokModel, Value: "gpt2"},
		{Key: keyTokPre, Value: "llama-bpe"},
		{Key: keyTokens, Value: pieces},
		{Key: keyTokenType, Value: types},
		{Key: keyMerges, Value: merges},
		{Key: keyBOS, Value: uint32(100257)},
		{Key: keyEOS, Value: uint32(100257)},
		{Key: keyAddBOS, Value: false},
	}
	path := filepath.Join(t.TempDir(), "ggml-vocab-cl100k.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	bw := bufio.NewWriter(out)
	if err := gguf.Write(bw, kv, nil); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOpenTokenizerCL100k reads a vocabulary-only GGUF file of cl100k_base
// and encodes the test texts of package tokenizer as tiktoken does.
func TestOpenTokenizerCL100k(t *testing.T) {
	path := cl100kGGUF(t)
	tok, err := OpenTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Model() != tokenizer.ByteBPE || tok.Pre() != "llama-bpe" || tok.BOS != 100257 || tok.AddBOS {
		t.Fatalf("read as model %q, pre %q, BOS %d, AddBOS %v", tok.Model(), tok.Pre(), tok.BOS, tok.AddBOS)
	}
	data, err := os.ReadFile("tokenizer/testdata/cl100k_expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Text    string `json:"text"`
		CL100k  []int  `json:"cl100k"`
		Special []int  `json:"special"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if got := tok.Encode(c.Text, true); !slices.Equal(got, c.CL100k) {
			t.Errorf("%q:\n got %v\nwant %v", c.Text, got, c.CL100k)
		}
		if c.Special != nil {
			if got := tok.Tokenize(c.Text, false, true); !slices.Equal(got, c.Special) {
				t.Errorf("%q with special pieces:\n got %v\nwant %v", c.Text, got, c.Special)
			}
		}
	}
	// The same file as a -tokenizer for a model of its size, and of
	// another size.
	if _, err := OpenTokenizerFor(path, tok.Len()); err != nil {
		t.Error(err)
	}
	if _, err := OpenTokenizerFor(path, 1000); !errors.Is(err, ErrFormat) {
		t.Errorf("for 1000 pieces: %v, want ErrFormat", err)
	}
}

// bpeTokenizer is a small byte-level vocabulary: the 256 byte characters,
// merges and a control piece.
func bpeTokenizer(t testing.TB, vocab int) *tokenizer.Tokenizer {
	t.Helper()
	var pieces []string
	for b := range 256 {
		pieces = append(pieces, byteText(byte(b)))
	}
	var merges []string
	for _, m := range [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}} {
		merges = append(merges, m[0]+" "+m[1])
		pieces = append(pieces, m[0]+m[1])
	}
	kinds := make([]tokenizer.Kind, len(pieces))
	for i := range kinds {
		kinds[i] = tokenizer.Normal
	}
	for len(pieces) < vocab {
		pieces = append(pieces, fmt.Sprintf("<|x%d|>", len(pieces)))
		kinds = append(kinds, tokenizer.Control)
	}
	tok, err := tokenizer.NewBPE(pieces, kinds, merges, "qwen2")
	if err != nil {
		t.Fatal(err)
	}
	tok.BOS, tok.EOS, tok.AddEOS = len(pieces)-1, len(pieces)-2, true
	return tok
}

// TestGGUFByteBPERoundTrip writes a model with a byte-level tokenizer and
// reads both back, and the tokenizer alone.
func TestGGUFByteBPERoundTrip(t *testing.T) {
	cfg := fileConfigs[0]
	w, _ := RandomWeights(cfg, 1)
	w.Config = cfg.WithDefaults()
	tok := bpeTokenizer(t, cfg.Vocab)
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, w, tok, gguf.F32, "bpe"); err != nil {
		t.Fatal(err)
	}
	_, back, err := ReadGGUF(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	alone, err := ReadTokenizer(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []*tokenizer.Tokenizer{back, alone} {
		if b.Model() != tok.Model() || b.Pre() != tok.Pre() || !slices.Equal(b.Pieces(), tok.Pieces()) ||
			!slices.Equal(b.Kinds(), tok.Kinds()) || !slices.Equal(b.Merges(), tok.Merges()) ||
			b.BOS != tok.BOS || b.EOS != tok.EOS || b.Unknown != tok.Unknown || b.AddBOS != tok.AddBOS || b.AddEOS != tok.AddEOS {
			t.Fatalf("read back differently")
		}
		text := "hello world 2024<|x300|>"
		want := []string{"hello", "Ġwor", "l", "d", "Ġ", "2", "0", "2", "4", "<", "|", "x", "3", "0", "0", "|", ">", "<|x298|>"}
		var got []string
		for _, id := range b.Encode(text, true) {
			got = append(got, b.Piece(id))
		}
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %q, want %q", text, got, want)
		}
	}
}

func TestTokenizerGGUFErrors(t *testing.T) {
	tok := bpeTokenizer(t, 300)
	base := tokenizerKV(tok)
	with := func(key string, v any) []gguf.KV {
		kv := slices.Clone(base)
		for i := range kv {
			if kv[i].Key == key {
				if v == nil {
					return slices.Delete(kv, i, i+1)
				}
				kv[i].Value = v
				return kv
			}
		}
		return append(kv, gguf.KV{Key: key, Value: v})
	}
	for _, c := range []struct {
		name string
		kv   []gguf.KV
		want error
	}{
		{"no tokens", with(keyTokens, nil), ErrFormat},
		{"tokens of ints", with(keyTokens, []int32{1}), ErrFormat},
		{"no model", with(keyTokModel, nil), gguf.ErrFormat},
		{"bert", with(keyTokModel, "bert"), attn.ErrUnsupported},
		{"unknown pre", with(keyTokPre, "tekken"), attn.ErrUnsupported},
		{"pre of ints", with(keyTokPre, uint32(3)), gguf.ErrFormat},
		{"no merges", with(keyMerges, nil), ErrFormat},
		{"merges of ints", with(keyMerges, []int32{1}), ErrFormat},
		{"bad merge", with(keyMerges, []string{"x"}), tokenizer.ErrFormat},
		{"short token types", with(keyTokenType, []int32{1}), ErrFormat},
		{"bad token type", with(keyTokenType, slices.Repeat([]int32{9}, 300)), tokenizer.ErrFormat},
		{"BOS out of range", with(keyBOS, uint32(300)), ErrFormat},
		{"negative EOS", with(keyEOS, int32(-1)), gguf.ErrFormat},
		{"add_bos_token not bool", with(keyAddBOS, uint8(1)), ErrFormat},
		{"short scores", append(with(keyTokModel, "llama"), gguf.KV{Key: keyScores, Value: []float32{1}}), ErrFormat},
	} {
		var buf bytes.Buffer
		if err := gguf.Write(&buf, c.kv, nil); err != nil {
			t.Fatal(err)
		}
		_, err := ReadTokenizer(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzReadTokenizer reads arbitrary GGUF metadata as a tokenizer: no input
// may panic, every error wraps a sentinel, and what reads must encode.
func FuzzReadTokenizer(f *testing.F) {
	for _, tok := range []*tokenizer.Tokenizer{bpeTokenizer(f, 270), testTokenizer(f, 270)} {
		var buf bytes.Buffer
		if err := gguf.Write(&buf, tokenizerKV(tok), nil); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := ReadTokenizer(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, gguf.ErrFormat) && !errors.Is(err, tokenizer.ErrFormat) && !errors.Is(err, attn.ErrUnsupported) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		text := "hello world <|x269|> 123"
		for _, id := range tok.Tokenize(text, true, true) {
			if id < 0 || id >= tok.Len() {
				t.Fatalf("id %d of %d", id, tok.Len())
			}
		}
		tok.Decode(tok.Encode(text, true))
	})
}

// TestOpenOwnTokenizerUnsupported: a GGUF whose own tokenizer this package
// cannot read fails to open by itself, naming the tokenizer, and opens
// with another tokenizer given, which replaces it.
func TestOpenOwnTokenizerUnsupported(t *testing.T) {
	cfg := Config{Dim: 32, Hidden: 48, Layers: 1, Heads: 2, KVHeads: 1, Vocab: 300, SeqLen: 16}
	w, err := RandomWeights(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	tok := bpeTokenizer(t, 300)
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, w, tok, gguf.F32, "own"); err != nil {
		t.Fatal(err)
	}
	// The model's tokenizer type, a GGUF string, becomes one of the same
	// length that this package does not know.
	if n := bytes.Count(buf.Bytes(), []byte("gpt2")); n != 1 {
		t.Fatalf("%d copies of gpt2 in the file", n)
	}
	data := bytes.Replace(buf.Bytes(), []byte("gpt2"), []byte("bert"), 1)
	dir := t.TempDir()
	path, tokPath := filepath.Join(dir, "own.gguf"), filepath.Join(dir, "tok.gguf")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	if err := gguf.Write(&tb, tokenizerKV(tok), nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokPath, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path, ""); !errors.Is(err, attn.ErrUnsupported) || !strings.Contains(err.Error(), "bert") {
		t.Fatalf("own unsupported tokenizer: %v, want ErrUnsupported naming it", err)
	}
	got, gotTok, err := Open(path, tokPath)
	if err != nil {
		t.Fatalf("with -tokenizer: %v", err)
	}
	if gotTok == nil || got.Config.Vocab != 300 || !slices.Equal(gotTok.Encode("hello world", false), tok.Encode("hello world", false)) {
		t.Fatal("the given tokenizer does not replace the file's")
	}
}
