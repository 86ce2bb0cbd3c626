package needle

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/attnkit/attn"
)

// Tokenizer turns text into a model's token ids and back.
// *model/tokenizer.Tokenizer is one.
type Tokenizer interface {
	// Encode returns the ids of text, BOS first when bos is true and
	// the vocabulary has one.
	Encode(text string, bos bool) []int
	// Decode returns the text of ids.
	Decode(ids []int) string
}

// ErrCollision is wrapped by Build's error when the haystack already holds
// the key or the value, so that the needle would not be the only place
// the answer can be read from: draw another key and value.
var ErrCollision = errors.New("needle: the haystack holds the key or the value")

// maxSnap is how far, in tokens, an insertion point moves to reach the
// start of a word.
const maxSnap = 8

// Builder makes the prompts of the test from a tokenizer and templates.
//
// Prompts are made of token ids, not of text, so that a case has exactly
// the length asked for: BOS (when the tokenizer has one), a stretch of the
// tokenized haystack with the needle's tokens inserted, then the
// question's tokens. The needle, the question and the answer are each
// tokenized on their own, as text that continues other text: a tokenizer
// that puts a space in front of every text it encodes (SentencePiece's
// add-space-prefix, detected by encoding and decoding two words) is given
// the template without its first space, so the space is not doubled.
// Insertion points are moved, by at most 8 tokens, to the start of a word
// of the haystack (a token whose text starts with white space, or that
// follows one that ends with it), so that no word is cut in two; the
// haystack stretch ends at the start of a word too where it can.
type Builder struct {
	tok    Tokenizer
	tmpl   Templates
	bos    []int
	prefix bool // the tokenizer puts a space in front of a text
	// value draws Plant's values (DrawValue unless WithValues).
	value func(*rand.Rand) string
}

// NewBuilder returns a builder of prompts from templates t (empty ones
// take the defaults), which must be valid.
func NewBuilder(tok Tokenizer, t Templates) (*Builder, error) {
	if tok == nil {
		return nil, fmt.Errorf("%w: nil tokenizer", attn.ErrInput)
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	b := &Builder{tok: tok, tmpl: t, bos: tok.Encode("", true), value: DrawValue}
	ab := append(tok.Encode("a", false), tok.Encode("b", false)...)
	b.prefix = tok.Decode(ab) == "a b"
	return b, nil
}

// WithValues returns a builder like b whose Plant and PlantAsking draw
// their values with draw instead of DrawValue (training chooses which
// values to teach on; the test's Draw keeps DrawValue).
func (b *Builder) WithValues(draw func(*rand.Rand) string) *Builder {
	c := *b
	c.value = draw
	return &c
}

// Templates returns the builder's templates, defaults filled in.
func (b *Builder) Templates() Templates { return b.tmpl }

// BOS returns the tokens a prompt starts with: the tokenizer's BOS, or
// none.
func (b *Builder) BOS() []int { return slices.Clone(b.bos) }

// Encode returns the tokens of text as a continuation of other text.
func (b *Builder) Encode(text string) []int {
	if b.prefix {
		text = strings.TrimPrefix(text, " ")
	}
	if text == "" {
		return nil
	}
	return b.tok.Encode(text, false)
}

// Continuation returns the text of ids as it reads after token prev: with
// the space that a tokenizer's Decode drops at the start of a text.
func (b *Builder) Continuation(prev int, ids []int) string {
	head := b.tok.Decode([]int{prev})
	all := b.tok.Decode(append([]int{prev}, ids...))
	if !strings.HasPrefix(all, head) {
		return b.tok.Decode(ids)
	}
	return all[len(head):]
}

// Case is one prompt of the test.
type Case struct {
	// Tokens is the prompt: BOS, haystack with the needle, question.
	Tokens []int
	// Answer is the tokens of the answer template filled in; AnswerText
	// its text, which Score compares the model's answer with.
	Answer     []int
	AnswerText string
	// NeedleAt is the index in Tokens of the needle's first token,
	// NeedleLen its length in tokens; QuestionAt is the index of the
	// question's first token.
	NeedleAt, NeedleLen, QuestionAt int
	// Depth is where the needle is, as a fraction of the haystack tokens
	// before it: 0 first, 1 right before the question.
	Depth      float64
	Key, Value string
	// Offset is where the haystack stretch starts in the haystack given to
	// Build (or to Cases).
	Offset int
}

// Overhead returns the prompt tokens a case with key and value spends on
// anything but the haystack: BOS, needle and question.
func (b *Builder) Overhead(key, value string) int {
	return len(b.bos) + len(b.Encode(Fill(b.tmpl.Needle, key, value))) + len(b.Encode(Fill(b.tmpl.Question, key, value)))
}

// Build returns a prompt of exactly n tokens: BOS, then a stretch of hay
// from its start (moved forward by up to 8 tokens so that it ends at the
// start of a word) with the needle inserted at depth (0: first, 1: last,
// before the question; the point moved to the nearest start of a word
// within 8 tokens), then the question. n must leave room for BOS, the
// needle, the question and at least one token of hay; hay must have the
// tokens. The error wraps ErrCollision when the stretch already holds the
// key or the value as words.
func (b *Builder) Build(hay []int, n int, depth float64, key, value string) (Case, error) {
	if math.IsNaN(depth) || depth < 0 || depth > 1 {
		return Case{}, fmt.Errorf("%w: depth %v, want a fraction in [0, 1]", attn.ErrInput, depth)
	}
	if strings.TrimSpace(key) == "" || strings.TrimSpace(value) == "" {
		return Case{}, fmt.Errorf("%w: empty key or value", attn.ErrInput)
	}
	needle := b.Encode(Fill(b.tmpl.Needle, key, value))
	question := b.Encode(Fill(b.tmpl.Question, key, value))
	answerText := Fill(b.tmpl.Answer, key, value)
	m := n - len(b.bos) - len(needle) - len(question)
	if m < 1 {
		return Case{}, fmt.Errorf("%w: a prompt of %d tokens leaves no room for the haystack: BOS, the needle and the question take %d",
			attn.ErrInput, n, n-m)
	}
	if len(hay) < m {
		return Case{}, fmt.Errorf("%w: a prompt of %d tokens needs %d tokens of haystack, have %d", attn.ErrInput, n, m, len(hay))
	}
	end := m
	for e := m; e <= min(len(hay), m+maxSnap); e++ {
		if wordStart(b.tok, hay, e) {
			end = e
			break
		}
	}
	off := end - m
	win := hay[off:end]
	text := b.tok.Decode(win)
	if contains(text, key) || contains(text, value) {
		return Case{}, fmt.Errorf("%w: %q or %q", ErrCollision, key, value)
	}
	at := snap(b.tok, hay, off, m, int(math.Round(depth*float64(m))))
	c := Case{
		Answer: b.Encode(answerText), AnswerText: answerText,
		NeedleAt: len(b.bos) + at, NeedleLen: len(needle), QuestionAt: n - len(question),
		Depth: float64(at) / float64(m), Key: key, Value: value, Offset: off,
	}
	c.Tokens = make([]int, 0, n)
	c.Tokens = append(c.Tokens, b.bos...)
	c.Tokens = append(c.Tokens, win[:at]...)
	c.Tokens = append(c.Tokens, needle...)
	c.Tokens = append(c.Tokens, win[at:]...)
	c.Tokens = append(c.Tokens, question...)
	return c, nil
}

// maxDraws bounds the keys and values drawn for one case before giving up
// on a haystack that holds them all.
const maxDraws = 64

// Draw returns a case of n tokens with the needle at depth, from rng: a
// random key and value and a random stretch of hay, drawn again while
// the stretch holds either. The same rng state gives the same case, and
// depth moves only the needle: the key, the value and the stretch
// depend on rng, n and hay alone.
func (b *Builder) Draw(rng *rand.Rand, hay []int, n int, depth float64) (Case, error) {
	for range maxDraws {
		key, value := DrawKey(rng), DrawValue(rng)
		m := n - b.Overhead(key, value)
		if m < 1 {
			// Build says why.
			return b.Build(hay, n, depth, key, value)
		}
		if len(hay) < m {
			return Case{}, fmt.Errorf("%w: a prompt of %d tokens needs %d tokens of haystack, have %d", attn.ErrInput, n, m, len(hay))
		}
		off := rng.IntN(len(hay) - m + 1)
		c, err := b.Build(hay[off:], n, depth, key, value)
		if errors.Is(err, ErrCollision) {
			continue
		}
		c.Offset += off
		return c, err
	}
	return Case{}, fmt.Errorf("%w: %d draws of keys and values", ErrCollision, maxDraws)
}

// wordStart reports whether a word starts at token i of hay: the start or
// the end of hay, a token whose text begins with white space, or one after
// a token whose text ends with it.
func wordStart(tok Tokenizer, hay []int, i int) bool {
	if i <= 0 || i >= len(hay) {
		return true
	}
	prev := tok.Decode(hay[i-1 : i])
	pair := tok.Decode(hay[i-1 : i+1])
	if !strings.HasPrefix(pair, prev) {
		return false
	}
	first, _ := utf8.DecodeRuneInString(pair[len(prev):])
	last, _ := utf8.DecodeLastRuneInString(prev)
	return unicode.IsSpace(first) || (prev != "" && unicode.IsSpace(last))
}

// snap moves insertion point t of the stretch hay[off:off+m] to the
// nearest start of a word within maxSnap tokens, the earlier on a tie;
// t when there is none.
func snap(tok Tokenizer, hay []int, off, m, t int) int {
	t = max(0, min(m, t))
	for d := 0; d <= maxSnap; d++ {
		for _, p := range []int{t - d, t + d} {
			if p < 0 || p > m {
				continue
			}
			if p == 0 || p == m || wordStart(tok, hay, off+p) {
				return p
			}
		}
	}
	return t
}

// WordStart returns the start of a word in tokens nearest to i (in [0,
// len(tokens)], both ends counting as starts) within a few tokens, the
// earlier on a tie, or i when there is none: where text cut from tokens
// can end with the next word whole, as a training window that goes on
// after an answer must, or the model learns that answers run on into
// the middle of a word.
func (b *Builder) WordStart(tokens []int, i int) int {
	return snap(b.tok, tokens, 0, len(tokens), i)
}

// Fact is one needle of a planted training window.
type Fact struct {
	Key, Value string
	// At is the index of the needle's first token.
	At int
}

// Planted is a training window with facts planted in it.
type Planted struct {
	// Tokens has the window's length: the start of the window with the
	// needles inserted, then the question about one of them and its
	// answer, last.
	Tokens []int
	// AnswerAt is the index in Tokens of the answer's first token: a
	// training loss on Tokens[AnswerAt:] is the retrieval task's.
	AnswerAt int
	// QuestionAt is the index of the question's first token.
	QuestionAt int
	Facts      []Fact
	// Asked indexes the fact the last question asks for.
	Asked int
	// Questions lists every question asked at the end, in order; the
	// last is the one QuestionAt, AnswerAt and Asked describe.
	Questions []Question
}

// Question is one question of a planted window and its answer.
type Question struct {
	// Fact indexes the fact asked for.
	Fact int
	// At and AnswerAt index the question's and the answer's first tokens;
	// the answer ends where the next question starts (or at the end).
	At, AnswerAt int
}

// MaxFacts bounds the facts Plant plants in one window, far below the
// keys there are to draw them from.
const MaxFacts = 64

// Plant returns a copy of a training window (L+1 tokens for L
// predictions) with 1 to k facts planted in it: needle sentences with
// random keys and distinct values, at random depths (moved to the starts
// of words), and, at its end, the question about one of them followed by
// the answer. The window's first token stays first (it may be BOS) and
// its tail is cut so that the length stays len(window). This is the
// retrieval task for training, with the builder's templates: a model
// trained on it learns to answer the question in the test's prompts.
// Everything is drawn from rng, so the same rng state and window give the
// same result.
func (b *Builder) Plant(rng *rand.Rand, window []int, k int) (Planted, error) {
	return b.PlantAsking(rng, window, k, 1)
}

// PlantAsking is Plant with up to asks questions at the end instead of
// one, each about a different planted fact (as many as were planted when
// fewer), in random order, each followed by its answer: more of the
// window trains retrieval, as in multi-query associative recall.
func (b *Builder) PlantAsking(rng *rand.Rand, window []int, k, asks int) (Planted, error) {
	if asks < 1 || asks > MaxFacts {
		return Planted{}, fmt.Errorf("%w: %d questions, want 1 to %d", attn.ErrInput, asks, MaxFacts)
	}
	if k < 1 {
		return Planted{}, fmt.Errorf("%w: %d facts, want >= 1", attn.ErrInput, k)
	}
	if k > MaxFacts {
		return Planted{}, fmt.Errorf("%w: %d facts, want at most %d", attn.ErrInput, k, MaxFacts)
	}
	nf := 1 + rng.IntN(k)
	for range maxDraws {
		p, err := b.plant(rng, window, nf, min(asks, nf))
		if errors.Is(err, ErrCollision) {
			continue
		}
		return p, err
	}
	return Planted{}, fmt.Errorf("%w: %d draws of keys and values", ErrCollision, maxDraws)
}

func (b *Builder) plant(rng *rand.Rand, window []int, nf, asks int) (Planted, error) {
	// The last question's fact is drawn first, as when one was asked.
	p := Planted{Facts: make([]Fact, nf), Asked: rng.IntN(nf)}
	needles := make([][]int, nf)
	used := 0
	for i := range p.Facts {
		f := &p.Facts[i]
		for tries := 0; ; tries++ {
			if tries == maxDraws {
				// Only a WithValues draw of few values gets here.
				return Planted{}, fmt.Errorf("%w: %d draws gave no key and value distinct from the other facts'", attn.ErrInput, maxDraws)
			}
			f.Key, f.Value = DrawKey(rng), b.value(rng)
			if !slices.ContainsFunc(p.Facts[:i], func(g Fact) bool { return g.Key == f.Key || g.Value == f.Value }) {
				break
			}
		}
		needles[i] = b.Encode(Fill(b.tmpl.Needle, f.Key, f.Value))
		used += len(needles[i])
	}
	askedFacts := []int{p.Asked}
	if asks > 1 {
		others := make([]int, 0, nf-1)
		for _, i := range rng.Perm(nf) {
			if i != p.Asked {
				others = append(others, i)
			}
		}
		askedFacts = append(others[:asks-1], p.Asked)
	}
	questions := make([][]int, asks)
	answers := make([][]int, asks)
	for i, fi := range askedFacts {
		f := p.Facts[fi]
		questions[i] = b.Encode(Fill(b.tmpl.Question, f.Key, f.Value))
		answers[i] = b.Encode(Fill(b.tmpl.Answer, f.Key, f.Value))
		used += len(questions[i]) + len(answers[i])
	}
	m := len(window) - used
	if m < 1 {
		return Planted{}, fmt.Errorf("%w: a window of %d tokens has no room for %d facts, the question and the answer (%d tokens)",
			attn.ErrInput, len(window), nf, used)
	}
	hay := window[:m]
	text := b.tok.Decode(hay)
	for _, f := range p.Facts {
		if contains(text, f.Key) || contains(text, f.Value) {
			return Planted{}, ErrCollision
		}
	}
	// Insertion points in [1, m], after the first token: a third of them
	// uniform; a third at a distance from the end drawn log-uniformly, so
	// that facts a few words before the questions are as common as facts
	// far back (a model trained on uniform points alone learnt to look
	// only far back, where most facts were, and missed near ones); and a
	// third at a distance from the start drawn log-uniformly, so that
	// facts among the window's first tokens, where the needle test's
	// depth 0 puts them, are as common (with the first two kinds alone,
	// the long model's misses gathered at depth 0 of its longest
	// context).
	logUniform := func() int { return int(math.Exp(rng.Float64() * math.Log(float64(m)))) } // in [1, m]
	at := make([]int, nf)
	for i := range at {
		t := 1 + rng.IntN(m)
		switch rng.IntN(3) {
		case 1:
			t = m + 1 - logUniform()
		case 2:
			t = logUniform()
		}
		at[i] = max(1, snap(b.tok, hay, 0, m, t))
	}
	order := make([]int, nf)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int { return at[x] - at[y] })
	p.Tokens = make([]int, 0, len(window))
	last := 0
	for _, i := range order {
		p.Tokens = append(p.Tokens, hay[last:at[i]]...)
		last = at[i]
		p.Facts[i].At = len(p.Tokens)
		p.Tokens = append(p.Tokens, needles[i]...)
	}
	p.Tokens = append(p.Tokens, hay[last:]...)
	for i, fi := range askedFacts {
		q := Question{Fact: fi, At: len(p.Tokens)}
		p.Tokens = append(p.Tokens, questions[i]...)
		q.AnswerAt = len(p.Tokens)
		p.Tokens = append(p.Tokens, answers[i]...)
		p.Questions = append(p.Questions, q)
	}
	final := p.Questions[asks-1]
	p.QuestionAt, p.AnswerAt = final.At, final.AnswerAt
	return p, nil
}
