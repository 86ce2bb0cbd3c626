// Package austen embeds attn's default model: a small llama-style
// decoder (grouped-query attention, RoPE, SwiGLU, RMSNorm) and its
// SentencePiece-style vocabulary, trained from scratch by `attn train` on
// five of Jane Austen's novels, with Persuasion held out for validation.
// It is what `attn ppl` and `attn generate` run when no -model is given.
//
// The file is the GGUF that `attn train` wrote (matrices F16), so any
// GGUF reader of the llama architecture runs it too; TrainCommand is the
// command line that trained it. Its validation figures are in the
// repository's README.
package austen

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"io"

	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/tokenizer"
)

//go:embed austen.gguf
var file []byte

// Name is the embedded model's name in messages.
const Name = "austen (embedded)"

// TrainCommand is the command, run from the repository root with the
// shared data beside it, that produced the embedded file.
const TrainCommand = "attn train -text emma,pride,sense,mansfield,northanger (.txt.gz) -val persuasion.txt.gz " +
	"-ctx 2048 -dim 256 -hidden 688 -layers 4 -heads 8 -kv-heads 2 -vocab 4096 -batch 2 -steps 1400 -warmup 70 -lr 1.5e-3 -type f16"

// Load returns the embedded model's weights and tokenizer, freshly
// decoded: the caller may change them.
func Load() (*model.Weights, *tokenizer.Tokenizer, error) {
	return model.ReadGGUF(bytes.NewReader(file), int64(len(file)))
}

// Size is the embedded file's size in bytes.
func Size() int { return len(file) }

//go:embed persuasion.txt.gz
var heldOut []byte

// HeldOutName names the held-out text in messages and results.
const HeldOutName = "persuasion (held out)"

// HeldOut returns Persuasion, the novel the embedded model never saw in
// training (public domain, from Project Gutenberg): the built-in text of
// perplexity, the needle test's haystack and the model inputs of the
// benchmarks, so that they run without the shared data folder.
func HeldOut() (string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(heldOut))
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return "", err
	}
	return string(b), nil
}
