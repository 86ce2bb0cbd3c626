package experiment

import (
	"fmt"
	"path/filepath"
	"unicode/utf8"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/cmd/needle"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/tokenizer"
)

// Text is a text to score over sliding windows (attn ppl, attn
// patching): its tokens, BOS first, and the windows a perplexity run
// covers them with.
type Text struct {
	// Name is the file's base name, or the embedded text's name.
	Name   string
	Tokens []int
	// Chars is the characters the tokens decode to, for bits per char.
	Chars int
	// Context and Stride are the windows' length and step in tokens.
	Context, Stride int
	// Windows is the count of windows; Longest and Shortest their
	// lengths (the last window is shorter when the text ends in it).
	Windows, Longest, Shortest int
	// Notes say what the caller should tell the user: a context past
	// the model's, one longer than the text.
	Notes []string
}

// TextConfig says which text to load and how to window it.
type TextConfig struct {
	// Path is a UTF-8 text file, gunzipped when it ends in .gz; "" is
	// Persuasion, the embedded model's held-out text.
	Path string
	// Limit keeps the first Limit tokens (0: all).
	Limit int
	// Context is the window length (0: the model's context, or 512),
	// Stride its step (0: half the window). SeqLen is the model's
	// context, for the note when Context is longer (0: unknown).
	Context, Stride, SeqLen int
}

// MaxContext bounds a window, long before the positions it holds would
// overflow a buffer's size.
const MaxContext = 1 << 24

// Check checks the settings that need no text: a command calls it
// before it loads a model.
func (cfg TextConfig) Check() error {
	switch {
	case cfg.Context < 0 || cfg.Context > MaxContext || cfg.Context == 1:
		return fmt.Errorf("%w: -ctx %d: want 0 (the model's context) or 2 to %d", attn.ErrInput, cfg.Context, MaxContext)
	case cfg.Stride < 0:
		return fmt.Errorf("%w: -stride %d: want 0 (half the window) or more", attn.ErrInput, cfg.Stride)
	case cfg.Limit < 0:
		return fmt.Errorf("%w: -tokens %d: want 0 (all) or more", attn.ErrInput, cfg.Limit)
	case cfg.Stride > 0 && cfg.Context > 0 && cfg.Stride > cfg.Context:
		return fmt.Errorf("%w: -stride %d is longer than the window (-ctx %d): tokens between windows would not be scored", attn.ErrInput, cfg.Stride, cfg.Context)
	}
	return nil
}

// LoadText reads, tokenizes and windows a text, checking every setting
// before the text is read. Invalid UTF-8 is an error, as is a text of
// fewer than two tokens.
func LoadText(cfg TextConfig, tok *tokenizer.Tokenizer) (*Text, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	t := &Text{Context: cfg.Context, Stride: cfg.Stride}
	if t.Context == 0 {
		t.Context = cfg.SeqLen
		if t.Context == 0 {
			t.Context = 512
		}
	}
	if t.Stride == 0 {
		t.Stride = max(1, t.Context/2)
	}
	if t.Stride > t.Context {
		return nil, fmt.Errorf("%w: -stride %d is longer than the window (-ctx %d): tokens between windows would not be scored", attn.ErrInput, t.Stride, t.Context)
	}
	var s string
	var err error
	if cfg.Path == "" {
		s, err = austen.HeldOut()
		t.Name = austen.HeldOutName
	} else {
		s, err = needle.ReadText(cfg.Path)
		t.Name = filepath.Base(cfg.Path)
	}
	if err != nil {
		return nil, err
	}
	tokens := tok.Encode(s, true)
	if cfg.Limit > 0 && cfg.Limit < len(tokens) {
		tokens = tokens[:cfg.Limit]
	}
	if len(tokens) < 2 {
		return nil, fmt.Errorf("%w: %s: %d tokens; perplexity needs at least one after BOS", attn.ErrInput, t.Name, len(tokens))
	}
	w := NewText(t.Name, tokens, utf8.RuneCountInString(tok.Decode(tokens)), t.Context, t.Stride)
	if cfg.SeqLen > 0 && w.Context > cfg.SeqLen {
		w.Notes = append(w.Notes, fmt.Sprintf("note: -ctx %d is longer than the model's context of %d tokens: positions past it extrapolate the rotary embedding", w.Context, cfg.SeqLen))
	}
	if w.Context > len(w.Tokens) {
		w.Notes = append(w.Notes, fmt.Sprintf("note: the text has %d tokens, fewer than -ctx %d: one window of %d", len(w.Tokens), w.Context, len(w.Tokens)))
	}
	return w, nil
}

// NewText windows tokens (BOS first) that decode to chars characters,
// with windows of context tokens every stride.
func NewText(name string, tokens []int, chars, context, stride int) *Text {
	t := &Text{Name: name, Tokens: tokens, Chars: chars, Context: context, Stride: stride}
	begins, ends, _ := model.Windows(len(tokens), context, stride)
	t.Windows = len(begins)
	t.Shortest = len(tokens)
	for w := range begins {
		l := ends[w] - begins[w]
		t.Longest, t.Shortest = max(t.Longest, l), min(t.Shortest, l)
	}
	return t
}

// Options returns the perplexity options of the text's windows.
func (t *Text) Options() model.PerplexityOptions {
	return model.PerplexityOptions{Context: t.Context, Stride: t.Stride}
}
