package model

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// FuzzResume reads arbitrary bytes as a training checkpoint, seeded with
// checkpoints as Trainer.Save writes them (without a tokenizer, with a
// SentencePiece one and with a byte-level one). No input may panic; every
// error wraps a sentinel; and what Resume allocates stays in proportion to
// the input: weights decode to at most 13 times their bytes and a trainer
// keeps about seven copies of its weights (moments, gradients,
// transposes), so the bound is generous but far below the blow-ups of a
// file whose sizes are not checked against its length.
func FuzzResume(f *testing.F) {
	// Small seeds: the fuzzer minimises each new input byte by byte.
	cfg := Config{Dim: 4, Hidden: 4, Layers: 1, Heads: 2, KVHeads: 1, Vocab: 270, SeqLen: 8, TiedOutput: true}
	for i, tok := range []*tokenizer.Tokenizer{nil, testTokenizer(f, cfg.Vocab), bpeTokenizer(f, cfg.Vocab)} {
		w, err := InitWeights(cfg, uint64(i))
		if err != nil {
			f.Fatal(err)
		}
		tr, err := NewTrainer(w, TrainConfig{Context: 8, Batch: 1, Steps: 4, Warmup: 1, LR: 1e-3, Seed: 3, Workers: 1})
		if err != nil {
			f.Fatal(err)
		}
		var buf bytes.Buffer
		if err := tr.Save(&buf, tok, "fuzz"); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		_, _, err := Resume(bytes.NewReader(data), int64(len(data)), 1)
		runtime.ReadMemStats(&m1)
		if err != nil && !errors.Is(err, ErrFormat) && !errors.Is(err, gguf.ErrFormat) && !errors.Is(err, tokenizer.ErrFormat) &&
			!errors.Is(err, attn.ErrUnsupported) && !errors.Is(err, attn.ErrInput) && !errors.Is(err, attn.ErrShape) {
			t.Fatalf("error wraps no sentinel: %v", err)
		}
		if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 256*uint64(len(data))+1<<20 {
			t.Fatalf("%d bytes allocated for a %d-byte checkpoint", alloc, len(data))
		}
	})
}
