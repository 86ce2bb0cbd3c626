package model

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// GGUF metadata keys of the llama architecture; other architectures' keys
// are these with their own prefix (archKey).
const (
	keyArch        = "general.architecture"
	keyContext     = "llama.context_length"
	keyDim         = "llama.embedding_length"
	keyLayers      = "llama.block_count"
	keyHidden      = "llama.feed_forward_length"
	keyRopeDim     = "llama.rope.dimension_count"
	keyHeads       = "llama.attention.head_count"
	keyKVHeads     = "llama.attention.head_count_kv"
	keyEps         = "llama.attention.layer_norm_rms_epsilon"
	keyRopeBase    = "llama.rope.freq_base"
	keyVocabSize   = "llama.vocab_size"
	keyRopeScaling = "llama.rope.scaling.type"
	keyRopeFactor  = "llama.rope.scaling.factor"
	keyRopeLinear  = "llama.rope.scale_linear" // the factor's older name
	keyWindow      = "llama.attention.sliding_window"
	keyExperts     = "llama.expert_count"
	keyKeyLen      = "llama.attention.key_length"
	keyValueLen    = "llama.attention.value_length"
	keyTokModel    = "tokenizer.ggml.model"
	keyTokens      = "tokenizer.ggml.tokens"
	keyScores      = "tokenizer.ggml.scores"
	keyTokenType   = "tokenizer.ggml.token_type"
	keyBOS         = "tokenizer.ggml.bos_token_id"
	keyEOS         = "tokenizer.ggml.eos_token_id"
	keyUnknown     = "tokenizer.ggml.unknown_token_id"
	keySpacePrefix = "tokenizer.ggml.add_space_prefix"
	// keyAttention names the attention a model was trained with when it
	// is not softmax attention (Config.Attention); attn's own key.
	keyAttention = "attn.attention"
	// tensorRopeFreqs holds Weights.RopeFreqs.
	tensorRopeFreqs = "rope_freqs.weight"
)

// archKey is a llama.* key for architecture arch.
func archKey(arch, key string) string {
	return arch + strings.TrimPrefix(key, "llama")
}

// ReadGGUF reads a GGUF file of architecture llama, mistral or qwen2: the
// weights and, when the file holds one, the tokenizer (nil otherwise;
// SentencePiece or byte-level BPE, read as OpenTokenizer reads it). The
// architecture's metadata sets the Config: sizes, context length, rope
// base, linear rope scaling (rope.scaling.type "linear" and
// rope.scaling.factor), the sliding window (attention.sliding_window) and
// RMSNorm's epsilon; qwen2 adds projection biases and NeoX-style rotary
// embedding, llama may have the biases too, and a rope_freqs.weight tensor
// (Llama 3.1 and later) gives Weights.RopeFreqs. A file without
// output.weight ties the output to token_embd.weight. The weights may be
// F32, F16, BF16 or any quantised type package gguf decodes (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, IQ4_NL, IQ4_XS); they are dequantised to
// float32 once, as ggml does, at load, so the model takes 4 bytes per
// weight in memory whatever the file's type. Other architectures,
// mixtures of experts, other rope scalings (YaRN, LongRoPE), partial
// rotary embeddings, head sizes other than the width over the heads and
// tensor types gguf does not decode are errors wrapping
// attn.ErrUnsupported; missing or misshapen tensors, tensors the
// architecture does not have and non-finite weights wrap ErrFormat (or
// gguf.ErrFormat for a malformed container), naming the tensor or key.
func ReadGGUF(r io.ReaderAt, size int64) (*Weights, *tokenizer.Tokenizer, error) {
	f, err := gguf.Read(r, size)
	if err != nil {
		return nil, nil, err
	}
	return readModel(f)
}

// readModel is ReadGGUF on a parsed file.
func readModel(f *gguf.File) (*Weights, *tokenizer.Tokenizer, error) {
	w, err := readWeights(f)
	if err != nil {
		return nil, nil, err
	}
	tok, err := ggufTokenizer(f, w.Config.Vocab)
	if err != nil {
		return nil, nil, err
	}
	return w, tok, nil
}

// readWeights reads the weights of a parsed file and not its tokenizer,
// so that a model whose tokenizer this package cannot read still loads
// with another one (Open's tokPath).
func readWeights(f *gguf.File) (*Weights, error) {
	arch, err := f.String(keyArch)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(Archs, arch) {
		return nil, fmt.Errorf("%w: architecture %q (this package runs %s)", attn.ErrUnsupported, clipName(arch), strings.Join(Archs, ", "))
	}
	cfg, err := ggufConfig(f, arch)
	if err != nil {
		return nil, err
	}
	w := &Weights{Config: cfg, Layers: make([]Layer, cfg.Layers)}
	ts := w.Tensors()
	if _, ok := f.Tensor(tensorRopeFreqs); ok {
		ts = append(ts, Tensor{tensorRopeFreqs, []int{cfg.HeadDim() / 2}, &w.RopeFreqs})
	}
	want := map[string]bool{}
	for _, t := range ts {
		want[t.Name] = true
	}
	for _, t := range f.Tensors {
		if !want[t.Name] && !strings.HasPrefix(t.Name, trainPrefix) {
			return nil, fmt.Errorf("%w: tensor %s is not part of a %s model%s", ErrFormat, t.Name, arch, extraHint(t.Name, cfg))
		}
	}
	for _, t := range ts {
		info, ok := f.Tensor(t.Name)
		if !ok {
			return nil, fmt.Errorf("%w: no tensor %s (a %s model of %d layers has %d tensors)", ErrFormat, t.Name, arch, cfg.Layers, len(ts))
		}
		if !slices.Equal(info.Dims, ggufDims(t.Shape)) {
			return nil, fmt.Errorf("%w: tensor %s has dimensions %v, want %v", ErrFormat, t.Name, info.Dims, ggufDims(t.Shape))
		}
	}
	// Dequantising is most of a load; ReadTensor spreads each tensor over
	// the CPUs, so the tensors go one after the other.
	for _, t := range ts {
		if *t.Data, err = f.ReadTensor(t.Name); err != nil {
			return nil, err
		}
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return w, nil
}

// extraHint says why a tensor a model does not expect may be there.
func extraHint(name string, c Config) string {
	if strings.HasSuffix(name, ".bias") && !c.QKVBias {
		return " (projection biases are read when blk.0.attn_q.bias is present; other biases are not supported)"
	}
	return ""
}

// clipName shortens a string from a file for an error message.
func clipName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// ggufDims is a row-major shape as GGUF dimensions, innermost first.
func ggufDims(shape []int) []uint64 {
	d := make([]uint64, len(shape))
	for i, s := range shape {
		d[len(shape)-1-i] = uint64(s)
	}
	return d
}

func ggufConfig(f *gguf.File, arch string) (Config, error) {
	c := Config{}
	if arch != "llama" {
		c.Arch = arch
	}
	key := func(k string) string { return archKey(arch, k) }
	geti := func(k string, dst *int, required bool) error {
		k = key(k)
		u, err := f.Uint(k)
		if err != nil {
			if _, ok := f.Value(k); !ok && !required {
				return nil
			}
			return err
		}
		if u > math.MaxInt32 {
			return fmt.Errorf("%w: %s = %d is too large", ErrFormat, k, u)
		}
		*dst = int(u)
		return nil
	}
	getf := func(k string, dst *float32) error {
		k = key(k)
		if _, ok := f.Value(k); !ok {
			return nil
		}
		x, err := f.Float(k)
		if err != nil {
			return err
		}
		*dst = float32(x)
		return nil
	}
	var ropeDim, vocab, experts, keyLen, valLen int
	var factor, linear float32
	errs := []error{
		geti(keyDim, &c.Dim, true), geti(keyHidden, &c.Hidden, true), geti(keyLayers, &c.Layers, true),
		geti(keyHeads, &c.Heads, true), geti(keyKVHeads, &c.KVHeads, false), geti(keyContext, &c.SeqLen, false),
		geti(keyRopeDim, &ropeDim, false), geti(keyVocabSize, &vocab, false),
		geti(keyExperts, &experts, false),
		geti(keyKeyLen, &keyLen, false), geti(keyValueLen, &valLen, false),
		geti(keyWindow, &c.SlidingWindow, false),
		getf(keyRopeBase, &c.RopeBase), getf(keyEps, &c.NormEps),
		getf(keyRopeFactor, &factor), getf(keyRopeLinear, &linear),
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if experts > 0 {
		return c, fmt.Errorf("%w: a mixture of %d experts (%s)", attn.ErrUnsupported, experts, key(keyExperts))
	}
	// As llama.cpp: the scaling type defaults to linear, whose factor is
	// rope.scaling.factor or the older rope.scale_linear; "none" ignores
	// the factor.
	scaling := "linear"
	if _, ok := f.Value(key(keyRopeScaling)); ok {
		s, err := f.String(key(keyRopeScaling))
		if err != nil {
			return c, err
		}
		scaling = s
	}
	if factor == 0 {
		factor = linear
	}
	switch scaling {
	case "none", "":
	case "linear":
		if factor != 0 && factor != 1 {
			c.RopeScale = factor
		}
	default:
		return c, fmt.Errorf("%w: rope scaling %q (%s; this package reads none and linear)", attn.ErrUnsupported, clipName(scaling), key(keyRopeScaling))
	}
	// The vocabulary size is the embedding's row count.
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 || emb.Dims[1] > math.MaxInt32 {
		return c, fmt.Errorf("%w: no 2-d tensor token_embd.weight", ErrFormat)
	}
	c.Vocab = int(emb.Dims[1])
	if vocab != 0 && vocab != c.Vocab {
		return c, fmt.Errorf("%w: %s = %d but token_embd.weight has %d rows", ErrFormat, key(keyVocabSize), vocab, c.Vocab)
	}
	if _, ok := f.Value(keyAttention); ok {
		a, err := f.String(keyAttention)
		if err != nil {
			return c, err
		}
		c.Attention = a
	}
	_, hasOut := f.Tensor("output.weight")
	c.TiedOutput = !hasOut
	// qwen2 always has the biases (WithDefaults); llama-style files may.
	_, hasBias := f.Tensor("blk.0.attn_q.bias")
	c.QKVBias = hasBias
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return c, err
	}
	for _, x := range []struct {
		key string
		v   int
	}{{keyRopeDim, ropeDim}, {keyKeyLen, keyLen}, {keyValueLen, valLen}} {
		if x.v != 0 && x.v != c.HeadDim() {
			return c, fmt.Errorf("%w: %s = %d differs from the head size %d = %s / %s", attn.ErrUnsupported,
				key(x.key), x.v, c.HeadDim(), key(keyDim), key(keyHeads))
		}
	}
	return c, nil
}

func ggufTokenizer(f *gguf.File, vocab int) (*tokenizer.Tokenizer, error) {
	tok, err := tokenizerFromGGUF(f)
	if err != nil || tok == nil {
		return nil, err
	}
	if tok.Len() != vocab {
		return nil, fmt.Errorf("%w: %d tokenizer pieces for a vocabulary of %d", ErrFormat, tok.Len(), vocab)
	}
	return tok, nil
}

// WriteGGUF writes w, and tok when not nil, as a GGUF file of w's
// architecture (Config.Arch) that ReadGGUF (and llama.cpp) read. Matrices
// are stored as typ (F32, F16, BF16 or Q8_0); norm weights, biases and
// rope frequency factors are always F32, as llama.cpp stores them, and so
// is a Q8_0 matrix whose rows are not a multiple of 32. name goes to
// general.name.
func WriteGGUF(out io.Writer, w *Weights, tok *tokenizer.Tokenizer, typ gguf.TensorType, name string) error {
	return writeGGUF(out, w, tok, typ, name, nil, nil)
}

// writeGGUF is WriteGGUF with extra metadata and tensors after the model's.
func writeGGUF(out io.Writer, w *Weights, tok *tokenizer.Tokenizer, typ gguf.TensorType, name string, meta []gguf.KV, extra []gguf.Tensor) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if !typ.Supported() {
		return fmt.Errorf("%w: gguf tensor type %v (want F32, F16, BF16 or Q8_0)", attn.ErrUnsupported, typ)
	}
	c := w.Config.WithDefaults()
	key := func(k string) string { return archKey(c.arch(), k) }
	kv := []gguf.KV{
		{Key: keyArch, Value: c.arch()},
		{Key: "general.name", Value: name},
		{Key: key(keyContext), Value: uint32(c.SeqLen)},
		{Key: key(keyDim), Value: uint32(c.Dim)},
		{Key: key(keyLayers), Value: uint32(c.Layers)},
		{Key: key(keyHidden), Value: uint32(c.Hidden)},
		{Key: key(keyRopeDim), Value: uint32(c.HeadDim())},
		{Key: key(keyHeads), Value: uint32(c.Heads)},
		{Key: key(keyKVHeads), Value: uint32(c.KVHeads)},
		{Key: key(keyEps), Value: c.NormEps},
		{Key: key(keyRopeBase), Value: c.RopeBase},
		{Key: key(keyVocabSize), Value: uint32(c.Vocab)},
	}
	if c.ropeScale() != 1 {
		kv = append(kv, gguf.KV{Key: key(keyRopeScaling), Value: "linear"}, gguf.KV{Key: key(keyRopeFactor), Value: c.RopeScale})
	}
	if c.SlidingWindow > 0 {
		kv = append(kv, gguf.KV{Key: key(keyWindow), Value: uint32(c.SlidingWindow)})
	}
	if c.Attention != "" && c.Attention != "exact" {
		kv = append(kv, gguf.KV{Key: keyAttention, Value: c.Attention})
	}
	if tok != nil {
		if tok.Len() != c.Vocab {
			return fmt.Errorf("%w: tokenizer of %d pieces for a vocabulary of %d", attn.ErrInput, tok.Len(), c.Vocab)
		}
		kv = append(kv, tokenizerKV(tok)...)
	}
	var ts []gguf.Tensor
	for _, t := range w.Tensors() {
		tt := typ
		if len(t.Shape) == 1 || (typ == gguf.Q8_0 && t.Shape[len(t.Shape)-1]%gguf.Q8Block != 0) {
			tt = gguf.F32
		}
		ts = append(ts, gguf.Tensor{Name: t.Name, Dims: ggufDims(t.Shape), Type: tt, Data: *t.Data})
	}
	if w.RopeFreqs != nil {
		ts = append(ts, gguf.Tensor{Name: tensorRopeFreqs, Dims: []uint64{uint64(len(w.RopeFreqs))}, Type: gguf.F32, Data: w.RopeFreqs})
	}
	return gguf.Write(out, append(kv, meta...), append(ts, extra...))
}

// isGGUF reports whether head starts a GGUF file.
func isGGUF(head []byte) bool { return strings.HasPrefix(string(head), gguf.Magic) }
