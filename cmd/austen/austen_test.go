package austen_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/tokenizer"
)

// excerpt is the opening of Persuasion, which the model never saw in
// training.
const excerpt = `Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who,
for his own amusement, never took up any book but the Baronetage; there
he found occupation for an idle hour, and consolation in a distressed
one; there his faculties were roused into admiration and respect, by
contemplating the limited remnant of the earliest patents; there any
unwelcome sensations, arising from domestic affairs changed naturally
into pity and contempt as he turned over the almost endless creations
of the last century; and there, if every other leaf were powerless, he
could read his own history with an interest which never failed.`

// recordedPPL is the embedded model's perplexity on excerpt, as this code
// computed it when the model was committed: a change in the file, the
// loader, the tokenizer or the forward pass shows here.
const recordedPPL = 96.687394

func TestEmbeddedModel(t *testing.T) {
	w, tok, err := austen.Load()
	if err != nil {
		t.Fatal(err)
	}
	c := w.Config.WithDefaults()
	if c.SeqLen < 2048 || c.KVHeads >= c.Heads || tok == nil || tok.Len() != c.Vocab {
		t.Fatalf("config %+v, tokenizer of %d pieces: want context >= 2048, GQA and the tokenizer", c, tok.Len())
	}
	checkExcerpt(t, w, tok, recordedPPL)
}

// checkExcerpt checks a model's perplexity on excerpt, in windows of its
// context, against the recorded figure.
func checkExcerpt(t *testing.T, w *model.Weights, tok *tokenizer.Tokenizer, recorded float64) {
	t.Helper()
	m, err := model.New(w, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := w.Config.WithDefaults()
	r, err := model.Perplexity(context.Background(), m, tok.Encode(excerpt, true), model.PerplexityOptions{Context: c.SeqLen, Stride: c.SeqLen})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.PPL(); math.Abs(got-recorded) > 1e-4*recorded {
		t.Errorf("perplexity on the excerpt %.6f, recorded %.6f", got, recorded)
	}
}

// recordedLongPPL is the long-context model's perplexity on excerpt, as
// recordedPPL is the default's.
const recordedLongPPL = 19.648794

func TestEmbeddedLong(t *testing.T) {
	for _, name := range []string{"austen", "austen-long", "austen.gguf"} {
		_, _, ok := austen.Embedded(name)
		if ok != (name != "austen.gguf") {
			t.Errorf("Embedded(%q) ok = %v", name, ok)
		}
	}
	load, display, _ := austen.Embedded("austen-long")
	w, tok, err := load()
	if err != nil {
		t.Fatal(err)
	}
	c := w.Config.WithDefaults()
	if c.SeqLen < 8192 || c.KVHeads >= c.Heads || tok == nil || tok.Len() != c.Vocab || display != austen.LongName {
		t.Fatalf("config %+v, tokenizer of %d pieces, name %q: want context >= 8192, GQA and the tokenizer", c, tok.Len(), display)
	}
	checkExcerpt(t, w, tok, recordedLongPPL)
}

func TestHeldOut(t *testing.T) {
	text, err := austen.HeldOut()
	if err != nil {
		t.Fatal(err)
	}
	if len([]rune(text)) != 466853 || !strings.Contains(text, "Sir Walter Elliot") {
		t.Errorf("held-out text: %d characters, want Persuasion's 466853", len([]rune(text)))
	}
}
