// Package austen embeds attn's two models, small llama-style decoders
// (grouped-query attention, RoPE, SwiGLU, RMSNorm) with their
// SentencePiece-style vocabularies, trained from scratch by `attn train`
// on five of Jane Austen's novels, with Persuasion held out for
// validation:
//
//   - austen, the default, what `attn ppl` and `attn generate` run when no
//     -model is given: context 2048, 4096 pieces;
//   - austen-long, the long-context retrieval model: context 8192, 512
//     pieces, trained with planted facts asked for at the end of the
//     window (the needle test's templates) and with copying windows, so
//     that its answers depend on text thousands of tokens back.
//
// The files are the GGUFs that `attn train` wrote (matrices F16), so any
// GGUF reader of the llama architecture runs them too; TrainCommand and
// LongTrainCommand say how each was trained. Their validation figures are
// in the repository's README and results/long.
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

// Size is the embedded files' size in bytes, both models together.
func Size() int { return len(file) + len(longFile) }

//go:embed long.gguf
var longFile []byte

// LongName is the long-context model's name in messages.
const LongName = "austen-long (embedded)"

// LongTrainCommand is the script, run from the repository root with the
// shared data beside it, whose last phase produced the long-context file.
const LongTrainCommand = "scripts/train-long.sh"

// LoadLong returns the long-context model's weights and tokenizer,
// freshly decoded.
func LoadLong() (*model.Weights, *tokenizer.Tokenizer, error) {
	return model.ReadGGUF(bytes.NewReader(longFile), int64(len(longFile)))
}

// Embedded returns the embedded model called name ("austen" or
// "austen-long"), its name in messages, and whether name is one of them.
func Embedded(name string) (load func() (*model.Weights, *tokenizer.Tokenizer, error), display string, ok bool) {
	switch name {
	case "austen":
		return Load, Name, true
	case "austen-long":
		return LoadLong, LongName, true
	}
	return nil, "", false
}

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
