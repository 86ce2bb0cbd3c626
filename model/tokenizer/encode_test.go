package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// longTexts are 4 MB texts: prose, and the stretches without a split point
// that make one word of everything (letters for byte-level BPE, spaces for
// both).
func longTexts() map[string]string {
	rng := rand.New(rand.NewPCG(9, 10))
	prose := zipfText(rng, makeLexicon(rng, 5000), 1000000)
	return map[string]string{
		"prose":   prose[:4<<20],
		"letters": strings.Repeat("abcdefgh", 1<<19),
		"spaces":  strings.Repeat(" ", 4<<20),
	}
}

// TestEncodeLong encodes 4 MB texts with both models; the bound is loose
// (a shared machine), there to catch a quadratic encoder, which takes
// minutes. The figures are BenchmarkEncode's.
func TestEncodeLong(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	text, _ := zipfCorpus(t)
	toks := map[string]*Tokenizer{
		"sentencepiece": mustTrain(t, []string{text}, TrainConfig{Size: 2000}),
		"llama-bpe":     cl100kTokenizer(t, "llama-bpe"),
	}
	for tname, tok := range toks {
		for name, s := range longTexts() {
			start := time.Now()
			ids := tok.Encode(s, true)
			d := time.Since(start)
			t.Logf("%s, %s: %d bytes, %d ids in %v", tname, name, len(s), len(ids), d)
			if d > time.Minute {
				t.Errorf("%s, %s: %v", tname, name, d)
			}
			if name == "prose" && tok.Decode(ids) != s {
				t.Errorf("%s: prose does not decode to itself", tname)
			}
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	text, _ := zipfCorpus(b)
	toks := map[string]*Tokenizer{
		"sentencepiece": mustTrain(b, []string{text}, TrainConfig{Size: 2000}),
		"llama-bpe":     cl100kTokenizer(b, "llama-bpe"),
	}
	for tname, tok := range toks {
		for name, s := range longTexts() {
			b.Run(tname+"/"+name, func(b *testing.B) {
				b.SetBytes(int64(len(s)))
				for b.Loop() {
					tok.Encode(s, true)
				}
			})
		}
	}
}
