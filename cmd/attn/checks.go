package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/cmd/needle"
	"github.com/attnkit/attn/model"
)

// trainHelp is attn train's help (the command is in train.go).
var trainHelp = helpText{
	synopsis: "attn train -text FILES [-val FILE] [-ctx N] [-attn NAME[:params]] [-steps N] [-o FILE] [flags]",
	examples: []string{
		"attn train -text emma.txt.gz,pride.txt.gz -val persuasion.txt.gz -ctx 512 -steps 1000 -o austen.gguf",
		"attn train -text book.txt -attn window:left=64 -checkpoint ckpt.gguf -o window.gguf",
		"attn train -text book.txt -resume ckpt.gguf -o model.gguf   # continue an interrupted run exactly",
	},
	about: `Trains a llama-style model (GQA, RoPE, SwiGLU, RMSNorm) and its tokenizer
on plain text, in pure Go: a SentencePiece-style BPE vocabulary, then
AdamW with warm-up, cosine decay and gradient clipping. The model and
checkpoints are GGUF files that every command reads.`,
}

// checkTrain refuses a training run that could only fail or mislead,
// after the text is tokenized and before any batch is drawn: text that is
// not UTF-8 (in the corpus or in -val, read here to check it), a window
// (-ctx) longer than the text, which would train on one window and ignore
// -batch, and a batch whose activations cannot fit in memory, which
// would die of it mid-step. tc and c are the run's settings (a resumed
// run's are its checkpoint's).
func checkTrain(tc model.TrainConfig, c model.Config, tokens int, corpus []string, val string) error {
	for i, s := range corpus {
		if !utf8.ValidString(s) {
			return fmt.Errorf("-text: file %d is not UTF-8 text", i+1)
		}
	}
	if val != "" {
		if _, err := needle.ReadText(val); err != nil {
			return fmt.Errorf("-val: %w", err)
		}
	}
	if tokens < tc.Context+1 {
		return fmt.Errorf("-ctx %d: the text has %d tokens, too few for one training window of -ctx+1 tokens: "+
			"give -ctx %d or less, or more text", tc.Context, tokens, max(2, tokens/2))
	}
	need := trainBytes(tc, c)
	if avail, ok := availableMemory(); ok && need > avail {
		return fmt.Errorf("-batch %d of -ctx %d tokens needs about %s for activations, more than the %s available: lower -batch or -ctx",
			tc.Batch, tc.Context, eval.FormatBytes(uint64(min(need, 1<<62))), eval.FormatBytes(uint64(avail)))
	}
	return nil
}

// trainBytes is a lower bound on the bytes one training step holds for
// its activations: per token and layer the normed input and the MLP's
// hidden activations kept for the backward pass, and per token the
// logits and their gradient.
func trainBytes(tc model.TrainConfig, c model.Config) float64 {
	c = c.WithDefaults()
	perToken := float64(c.Layers)*float64(4*c.Dim+2*c.Hidden) + 2*float64(c.Vocab)
	return 4 * perToken * float64(tc.Batch) * float64(tc.Context)
}

// availableMemory is the memory available now (MemAvailable); ok is
// false where that cannot be read.
func availableMemory() (bytes float64, ok bool) {
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "MemAvailable:" {
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					return kb * 1024, true
				}
			}
		}
	}
	return 0, false
}
