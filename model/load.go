package model

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// Open reads a model file: GGUF (recognised by its magic), whose tokenizer
// is inside it, or else a llama2.c checkpoint, whose tokenizer is read from
// tokPath or, when tokPath is "", from tokenizer.bin in the checkpoint's
// directory. The tokenizer is nil, without error, when a GGUF file has
// none or tokPath is "" and there is no tokenizer.bin; a tokPath given
// for a GGUF file replaces the file's own tokenizer.
func Open(path, tokPath string) (*Weights, *tokenizer.Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	head := make([]byte, 4)
	n, _ := f.ReadAt(head, 0)
	var w *Weights
	var tok *tokenizer.Tokenizer
	explicit := tokPath != ""
	switch {
	case isGGUF(head[:n]) && explicit:
		// The file's own tokenizer is not read: it may be one this
		// package does not support, and tokPath replaces it anyway.
		var g *gguf.File
		if g, err = gguf.Read(f, st.Size()); err == nil {
			w, err = readWeights(g)
		}
	case isGGUF(head[:n]):
		w, tok, err = ReadGGUF(f, st.Size())
	default:
		w, err = ReadLlama2C(f, st.Size())
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if !explicit && tok == nil {
		tokPath = filepath.Join(filepath.Dir(path), "tokenizer.bin")
	}
	if tokPath != "" && (explicit || tok == nil) {
		t, err := OpenTokenizerFor(tokPath, w.Config.Vocab)
		switch {
		case err == nil:
			tok = t
		case !explicit && errors.Is(err, fs.ErrNotExist):
		default:
			return nil, nil, fmt.Errorf("%s: %w", tokPath, err)
		}
	}
	return w, tok, nil
}
