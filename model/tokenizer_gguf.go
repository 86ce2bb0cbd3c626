package model

import (
	"fmt"
	"io"
	"os"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// The tokenizer's GGUF metadata keys besides those in ggufio.go.
const (
	keyTokPre = "tokenizer.ggml.pre"
	keyMerges = "tokenizer.ggml.merges"
	keyAddBOS = "tokenizer.ggml.add_bos_token"
	keyAddEOS = "tokenizer.ggml.add_eos_token"
)

// OpenTokenizer reads the tokenizer of the GGUF file at path from its
// metadata alone: a model's weights are not read, and a vocabulary-only
// file (no tensors, as llama.cpp's ggml-vocab-*.gguf test files are)
// works. A file without tokenizer metadata is an error wrapping ErrFormat.
func OpenTokenizer(path string) (*tokenizer.Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	tok, err := ReadTokenizer(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tok, nil
}

// ReadTokenizer is OpenTokenizer on a GGUF file of size bytes read
// through r.
func ReadTokenizer(r io.ReaderAt, size int64) (*tokenizer.Tokenizer, error) {
	f, err := gguf.Read(r, size)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizerFromGGUF(f)
	if err == nil && tok == nil {
		err = fmt.Errorf("%w: no tokenizer (%s) in the metadata", ErrFormat, keyTokens)
	}
	return tok, err
}

// OpenTokenizerFor reads a tokenizer for a model of vocab pieces: the
// metadata of a GGUF file (recognised by its magic; OpenTokenizer), or else
// llama2.c's tokenizer.bin. Either must have vocab pieces. It is how a
// tokenizer given on its own replaces a model file's.
func OpenTokenizerFor(path string, vocab int) (*tokenizer.Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head := make([]byte, 4)
	n, _ := f.ReadAt(head, 0)
	if !isGGUF(head[:n]) {
		return tokenizer.ReadLlama2C(f, vocab)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	tok, err := ReadTokenizer(f, st.Size())
	if err == nil && tok.Len() != vocab {
		err = fmt.Errorf("%w: %d tokenizer pieces for a vocabulary of %d", ErrFormat, tok.Len(), vocab)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tok, nil
}

// tokenizerFromGGUF makes the tokenizer f's metadata describes, as
// llama.cpp's llama_vocab::load reads it, or returns nil when f has none
// (no tokenizer.ggml.tokens). tokenizer.ggml.model "llama" is
// SentencePiece (tokens, scores, token_type, add_space_prefix), "gpt2"
// byte-level BPE (tokens, token_type, merges, pre); both take the BOS,
// EOS and unknown ids and add_bos_token and add_eos_token. Other models
// wrap attn.ErrUnsupported; values of the wrong type or length wrap
// ErrFormat.
func tokenizerFromGGUF(f *gguf.File) (*tokenizer.Tokenizer, error) {
	v, ok := f.Value(keyTokens)
	if !ok {
		return nil, nil
	}
	pieces, ok := v.([]string)
	if !ok {
		return nil, fmt.Errorf("%w: %s is %T, want an array of strings", ErrFormat, keyTokens, v)
	}
	mdl, err := f.String(keyTokModel)
	if err != nil {
		return nil, err
	}
	var kinds []tokenizer.Kind
	if v, ok := f.Value(keyTokenType); ok {
		ts, ok := v.([]int32)
		if !ok || len(ts) != len(pieces) {
			return nil, fmt.Errorf("%w: %s is %s, want %d int32", ErrFormat, keyTokenType, describe(v), len(pieces))
		}
		kinds = make([]tokenizer.Kind, len(ts))
		for i, t := range ts {
			kinds[i] = tokenizer.Kind(t)
		}
	}
	var tok *tokenizer.Tokenizer
	switch mdl {
	case tokenizer.SentencePiece:
		var scores []float32
		if v, ok := f.Value(keyScores); ok {
			if scores, ok = v.([]float32); !ok || len(scores) != len(pieces) {
				return nil, fmt.Errorf("%w: %s is %s, want %d float32", ErrFormat, keyScores, describe(v), len(pieces))
			}
		}
		if tok, err = tokenizer.New(pieces, scores, kinds); err != nil {
			return nil, err
		}
		if err := getBool(f, keySpacePrefix, &tok.AddSpacePrefix); err != nil {
			return nil, err
		}
	case tokenizer.ByteBPE:
		v, ok := f.Value(keyMerges)
		merges, isStrings := v.([]string)
		if !ok || !isStrings {
			return nil, fmt.Errorf("%w: %s is %s, want an array of strings", ErrFormat, keyMerges, describe(v))
		}
		pre := ""
		if _, ok := f.Value(keyTokPre); ok {
			if pre, err = f.String(keyTokPre); err != nil {
				return nil, err
			}
		}
		if tok, err = tokenizer.NewBPE(pieces, kinds, merges, pre); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: tokenizer model %q (this package reads %q, SentencePiece, and %q, byte-level BPE)",
			attn.ErrUnsupported, clipName(mdl), tokenizer.SentencePiece, tokenizer.ByteBPE)
	}
	for _, s := range []struct {
		key string
		dst *int
	}{{keyBOS, &tok.BOS}, {keyEOS, &tok.EOS}, {keyUnknown, &tok.Unknown}} {
		if _, ok := f.Value(s.key); !ok {
			continue
		}
		id, err := f.Uint(s.key)
		if err != nil {
			return nil, err
		}
		if id >= uint64(tok.Len()) {
			return nil, fmt.Errorf("%w: %s = %d outside the vocabulary of %d", ErrFormat, s.key, id, tok.Len())
		}
		*s.dst = int(id)
	}
	if err := getBool(f, keyAddBOS, &tok.AddBOS); err != nil {
		return nil, err
	}
	if err := getBool(f, keyAddEOS, &tok.AddEOS); err != nil {
		return nil, err
	}
	return tok, nil
}

// getBool sets *dst to the bool value of key when f has it.
func getBool(f *gguf.File, key string, dst *bool) error {
	v, ok := f.Value(key)
	if !ok {
		return nil
	}
	b, ok := v.(bool)
	if !ok {
		return fmt.Errorf("%w: %s is %s, want a bool", ErrFormat, key, describe(v))
	}
	*dst = b
	return nil
}

// describe names a metadata value's type, and its length for an array,
// for an error message.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "missing"
	case []string:
		return fmt.Sprintf("%d strings", len(x))
	case []int32:
		return fmt.Sprintf("%d int32", len(x))
	case []float32:
		return fmt.Sprintf("%d float32", len(x))
	}
	return fmt.Sprintf("%T", v)
}

// tokenizerKV is tok as GGUF metadata, read back by tokenizerFromGGUF and
// by llama.cpp.
func tokenizerKV(tok *tokenizer.Tokenizer) []gguf.KV {
	types := make([]int32, tok.Len())
	for i, k := range tok.Kinds() {
		types[i] = int32(k)
	}
	kv := []gguf.KV{{Key: keyTokModel, Value: tok.Model()}}
	if tok.Model() == tokenizer.ByteBPE {
		kv = append(kv,
			gguf.KV{Key: keyTokPre, Value: tok.Pre()},
			gguf.KV{Key: keyTokens, Value: tok.Pieces()},
			gguf.KV{Key: keyTokenType, Value: types},
			gguf.KV{Key: keyMerges, Value: tok.Merges()},
		)
	} else {
		kv = append(kv,
			gguf.KV{Key: keyTokens, Value: tok.Pieces()},
			gguf.KV{Key: keyScores, Value: tok.Scores()},
			gguf.KV{Key: keyTokenType, Value: types},
			gguf.KV{Key: keySpacePrefix, Value: tok.AddSpacePrefix},
		)
	}
	for _, s := range []struct {
		key string
		id  int
	}{{keyBOS, tok.BOS}, {keyEOS, tok.EOS}, {keyUnknown, tok.Unknown}} {
		if s.id >= 0 {
			kv = append(kv, gguf.KV{Key: s.key, Value: uint32(s.id)})
		}
	}
	return append(kv, gguf.KV{Key: keyAddBOS, Value: tok.AddBOS}, gguf.KV{Key: keyAddEOS, Value: tok.AddEOS})
}
