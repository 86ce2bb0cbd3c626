package needle

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/tokenizer"
)

var _ Tokenizer = (*tokenizer.Tokenizer)(nil)

// fillerWords make the synthetic haystacks; none is a key word.
var fillerWords = strings.Fields(`the a of and to in she he was had her his it that with for as at on
by but not be this which from or have an they were all so one would there their been said could
very some what when more no if out who them time much must will any such only then into most my
morning house walked letter evening family friend sister mother father garden little great good`)

// hayText returns a synthetic haystack of about words words, sentences
// and paragraphs drawn from seed.
func hayText(seed uint64, words int) string {
	rng := rand.New(rand.NewPCG(seed, 1))
	var b strings.Builder
	for i := 0; i < words; i++ {
		w := fillerWords[rng.IntN(len(fillerWords))]
		switch {
		case i == 0:
			w = strings.ToUpper(w[:1]) + w[1:]
		case rng.IntN(12) == 0:
			b.WriteString(".")
			if rng.IntN(4) == 0 {
				b.WriteString("\n\n")
			} else {
				b.WriteString(" ")
			}
			w = strings.ToUpper(w[:1]) + w[1:]
		default:
			b.WriteString(" ")
		}
		b.WriteString(w)
	}
	b.WriteString(".")
	return b.String()
}

var (
	tokOnce sync.Once
	tokTest *tokenizer.Tokenizer
	tokErr  error
)

// testTokenizer returns a small vocabulary trained on synthetic haystacks
// and filled templates, with byte fallback for anything else.
func testTokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	tokOnce.Do(func() {
		texts := []string{hayText(1, 3000)}
		rng := rand.New(rand.NewPCG(2, 2))
		for range 200 {
			k, v := DrawKey(rng), DrawValue(rng)
			texts = append(texts, Fill(DefaultNeedle, k, v), Fill(DefaultQuestion, k, v), Fill(DefaultAnswer, k, v))
		}
		tokTest, tokErr = tokenizer.Train(context.Background(), texts, tokenizer.TrainConfig{Size: 420})
	})
	if tokErr != nil {
		t.Fatal(tokErr)
	}
	return tokTest
}

func newBuilder(t testing.TB, tok Tokenizer) *Builder {
	t.Helper()
	b, err := NewBuilder(tok, Templates{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTemplates(t *testing.T) {
	if err := DefaultTemplates().Validate(); err != nil {
		t.Fatal(err)
	}
	if got := (Templates{}).WithDefaults(); got != DefaultTemplates() {
		t.Fatalf("WithDefaults of zero templates: %+v", got)
	}
	bad := []Templates{
		{Needle: " The number is {value}.", Question: DefaultQuestion, Answer: DefaultAnswer},        // no key in the needle
		{Needle: " The number for {key}.", Question: DefaultQuestion, Answer: DefaultAnswer},         // no value in the needle
		{Needle: DefaultNeedle, Question: " What is the number?", Answer: DefaultAnswer},             // no key in the question
		{Needle: DefaultNeedle, Question: " The number for {key} is {value}", Answer: DefaultAnswer}, // the answer given away
		{Needle: DefaultNeedle, Question: DefaultQuestion, Answer: " {key}"},                         // no value in the answer
	}
	for _, tm := range bad {
		if err := tm.Validate(); !errors.Is(err, attn.ErrInput) {
			t.Errorf("%+v: error %v, want ErrInput", tm, err)
		}
		if _, err := NewBuilder(testTokenizer(t), tm); !errors.Is(err, attn.ErrInput) {
			t.Errorf("NewBuilder(%+v): error %v, want ErrInput", tm, err)
		}
	}
	if got := Fill(DefaultNeedle, "blue owl", "123456"); got != " The special magic number for blue owl is #123456." {
		t.Errorf("Fill: %q", got)
	}
}

func TestKeysAndValues(t *testing.T) {
	for _, list := range [][]string{keyAdjectives, keyNouns} {
		if len(list) < 64 || len(slices.Compact(slices.Sorted(slices.Values(list)))) != len(list) {
			t.Fatalf("word list of %d, want >= 64 distinct words", len(list))
		}
		for _, w := range list {
			if w != strings.ToLower(strings.TrimSpace(w)) || strings.ContainsAny(w, " -'") {
				t.Errorf("word %q", w)
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	keys := map[string]bool{}
	for range 1000 {
		k, v := DrawKey(rng), DrawValue(rng)
		keys[k] = true
		if len(v) != 6 || strings.Trim(v, "0123456789") != "" || v[0] == '0' {
			t.Fatalf("value %q, want 6 digits", v)
		}
		if len(strings.Fields(k)) != 2 {
			t.Fatalf("key %q, want two words", k)
		}
	}
	if len(keys) < 800 {
		t.Errorf("%d distinct keys in 1000 draws", len(keys))
	}
	a, b := rand.New(rand.NewPCG(5, 6)), rand.New(rand.NewPCG(5, 6))
	for range 10 {
		if DrawKey(a) != DrawKey(b) || DrawValue(a) != DrawValue(b) {
			t.Fatal("same seed, different draws")
		}
	}
}

func TestCount(t *testing.T) {
	for _, c := range []struct {
		text, s string
		want    int
	}{
		{"the blue owl flew; a Blue Owl sat", "blue owl", 2},
		{"the blue owls", "blue owl", 0},
		{"a true blue owl", "blue owl", 1},
		{"what box", "hat box", 0},
		{"number 1234567 and 123456.", "123456", 1},
		{"0123456", "123456", 0},
		{"", "x", 0},
		{"abc", "", 0},
	} {
		if got := Count(c.text, c.s); got != c.want {
			t.Errorf("Count(%q, %q) = %d, want %d", c.text, c.s, got, c.want)
		}
		if got := contains(c.text, c.s); got != (c.want > 0) {
			t.Errorf("contains(%q, %q) = %v", c.text, c.s, got)
		}
	}
}

func TestScore(t *testing.T) {
	for _, c := range []struct {
		answer, got string
		want        bool
	}{
		{" 123456", " 123456", true},
		{" 123456", "123456", true},
		{" 123456", " 123456.", true},
		{" 123456", " 123456 and", true},
		{" 123456", " 123456\n", true},
		{" 123456", " 1234567", false},
		{" 123456", " 12345", false},
		{" 123456", " 123457", false},
		{" 123456", "\nthe", false},
		{" 123456", "", false},
		{" 123456", " 123456x", false},
		{" ", " ", false},
	} {
		if got := Score(c.answer, c.got); got != c.want {
			t.Errorf("Score(%q, %q) = %v, want %v", c.answer, c.got, got, c.want)
		}
	}
	for _, c := range []struct {
		answer, got string
		want        bool
	}{
		{" 123456", " 12", false},
		{" 123456", " 13", true},
		{" 123456", " 123456", false},
		{" 123456", " 1234567", true},
		{" 123456", "\n", false},
	} {
		if got := decided(c.answer, c.got); got != c.want {
			t.Errorf("decided(%q, %q) = %v, want %v", c.answer, c.got, got, c.want)
		}
	}
}

// checkCase checks what Build promises of c.
func checkCase(t *testing.T, b *Builder, hay []int, c Case, n int, depth float64) {
	t.Helper()
	tm := b.Templates()
	needle := b.Encode(Fill(tm.Needle, c.Key, c.Value))
	question := b.Encode(Fill(tm.Question, c.Key, c.Value))
	bos := b.BOS()
	m := n - len(bos) - len(needle) - len(question)
	if len(c.Tokens) != n {
		t.Fatalf("%d tokens, want %d", len(c.Tokens), n)
	}
	if !slices.Equal(c.Tokens[:len(bos)], bos) {
		t.Fatalf("prompt starts %v, want BOS %v", c.Tokens[:len(bos)], bos)
	}
	if c.NeedleLen != len(needle) || !slices.Equal(c.Tokens[c.NeedleAt:c.NeedleAt+c.NeedleLen], needle) {
		t.Fatalf("no needle at %d", c.NeedleAt)
	}
	if c.QuestionAt != n-len(question) || !slices.Equal(c.Tokens[c.QuestionAt:], question) {
		t.Fatalf("prompt does not end with the question")
	}
	target := len(bos) + int(math.Round(depth*float64(m)))
	if d := c.NeedleAt - target; d < -maxSnap || d > maxSnap {
		t.Fatalf("needle at %d, depth %v asks for %d (± %d)", c.NeedleAt, depth, target, maxSnap)
	}
	if want := float64(c.NeedleAt-len(bos)) / float64(m); c.Depth != want {
		t.Fatalf("Depth %v, want %v", c.Depth, want)
	}
	// The haystack around the needle is hay's stretch at Offset.
	hs := slices.Concat(c.Tokens[len(bos):c.NeedleAt], c.Tokens[c.NeedleAt+c.NeedleLen:c.QuestionAt])
	if !slices.Equal(hs, hay[c.Offset:c.Offset+m]) {
		t.Fatalf("haystack part is not hay[%d:%d]", c.Offset, c.Offset+m)
	}
	// The needle starts a word of the haystack.
	at := c.NeedleAt - len(bos)
	if at > 0 && at < m && !wordStart(b.tok, hay, c.Offset+at) {
		t.Fatalf("needle at %d does not start a word of the haystack", at)
	}
	text := b.tok.Decode(c.Tokens[:c.QuestionAt])
	if k := Count(text, c.Key); k != 1 {
		t.Fatalf("key %q %d times before the question, want once:\n%s", c.Key, k, text)
	}
	if k := Count(text, c.Value); k != 1 {
		t.Fatalf("value %q %d times before the question, want once", c.Value, k)
	}
	if !strings.Contains(text, strings.TrimPrefix(Fill(tm.Needle, c.Key, c.Value), " ")) {
		t.Fatalf("the prompt's text lacks the needle's")
	}
	if !slices.Equal(c.Answer, b.Encode(Fill(DefaultAnswer, c.Key, c.Value))) || c.AnswerText != Fill(DefaultAnswer, c.Key, c.Value) {
		t.Fatalf("answer %v %q, want the tokens of %q", c.Answer, c.AnswerText, Fill(DefaultAnswer, c.Key, c.Value))
	}
	if got := b.Continuation(c.Tokens[n-1], c.Answer); got != Fill(DefaultAnswer, c.Key, c.Value) {
		t.Fatalf("answer reads %q after the question", got)
	}
}

func TestBuild(t *testing.T) {
	tok := testTokenizer(t)
	for _, prefix := range []bool{true, false} {
		tk := *tok
		tk.AddSpacePrefix = prefix
		b := newBuilder(t, &tk)
		if b.prefix != prefix {
			t.Fatalf("AddSpacePrefix %v detected as %v", prefix, b.prefix)
		}
		hay := Haystack(b, hayText(7, 2000), 0)
		rng := rand.New(rand.NewPCG(8, 9))
		for _, n := range []int{97, 203, 511} {
			for _, depth := range []float64{0, 0.13, 0.5, 0.77, 1} {
				key, value := DrawKey(rng), DrawValue(rng)
				c, err := b.Build(hay, n, depth, key, value)
				if err != nil {
					t.Fatalf("n %d depth %v: %v", n, depth, err)
				}
				if c.Key != key || c.Value != value || c.Offset > maxSnap {
					t.Fatalf("case %+v", c)
				}
				checkCase(t, b, hay, c, n, depth)
				if depth == 0 && c.NeedleAt != len(b.BOS()) {
					t.Errorf("depth 0: needle at %d, want first", c.NeedleAt)
				}
				if depth == 1 && c.NeedleAt+c.NeedleLen != c.QuestionAt {
					t.Errorf("depth 1: needle ends at %d, question at %d", c.NeedleAt+c.NeedleLen, c.QuestionAt)
				}
			}
		}
		// The prompt reads as text with single spaces around the pieces.
		c, err := b.Build(hay, 150, 0.5, "blue owl", "424242")
		if err != nil {
			t.Fatal(err)
		}
		text := tk.Decode(c.Tokens)
		for _, s := range []string{" The special magic number for blue owl is #424242.", " What is the special magic number for blue owl? The special magic number for blue owl is"} {
			if !strings.Contains(text, s) || strings.Contains(text, " "+s) {
				t.Errorf("AddSpacePrefix %v: prompt does not hold %q once spaced:\n%s", prefix, s, text)
			}
		}
	}
}

func TestBuildErrors(t *testing.T) {
	tok := testTokenizer(t)
	b := newBuilder(t, tok)
	hay := Haystack(b, hayText(7, 500), 0)
	over := b.Overhead("blue owl", "123456")
	for _, c := range []struct {
		n     int
		depth float64
		key   string
		value string
		hay   []int
	}{
		{over, 0.5, "blue owl", "123456", hay},       // no room for the haystack
		{over - 5, 0.5, "blue owl", "123456", hay},   // less than the overhead
		{0, 0.5, "blue owl", "123456", hay},          // empty
		{200, -0.1, "blue owl", "123456", hay},       // depth out of range
		{200, 1.5, "blue owl", "123456", hay},        //
		{200, math.NaN(), "blue owl", "123456", hay}, //
		{200, 0.5, "", "123456", hay},                // no key
		{200, 0.5, "blue owl", " ", hay},             // no value
		{200, 0.5, "blue owl", "123456", hay[:50]},   // too little haystack
	} {
		if _, err := b.Build(c.hay, c.n, c.depth, c.key, c.value); !errors.Is(err, attn.ErrInput) {
			t.Errorf("Build(n %d, depth %v, %q, %q, %d tokens): error %v, want ErrInput", c.n, c.depth, c.key, c.value, len(c.hay), err)
		}
	}
	if c, err := b.Build(hay, over+1, 0.5, "blue owl", "123456"); err != nil || len(c.Tokens) != over+1 {
		t.Errorf("one token of haystack: %v", err)
	}
	// A haystack that holds the key or the value.
	for _, s := range []string{"the Blue Owl sat", "a sum of 123456 pounds"} {
		h := Haystack(b, s+" "+hayText(3, 300), 0)
		if _, err := b.Build(h, 150, 0.5, "blue owl", "123456"); !errors.Is(err, ErrCollision) {
			t.Errorf("haystack %q: error %v, want ErrCollision", s, err)
		}
	}
	if _, err := NewBuilder(nil, Templates{}); !errors.Is(err, attn.ErrInput) {
		t.Errorf("nil tokenizer: %v", err)
	}
}

func TestDraw(t *testing.T) {
	tok := testTokenizer(t)
	b := newBuilder(t, tok)
	hay := Haystack(b, hayText(11, 4000), 0)
	const seed = 12
	seq := func(n, trial int) *rand.Rand { return rand.New(rand.NewPCG(seed, caseSeq(n, trial))) }
	for _, n := range []int{129, 300} {
		var first Case
		for i, depth := range []float64{0, 0.25, 0.6, 1} {
			c, err := b.Draw(seq(n, 3), hay, n, depth)
			if err != nil {
				t.Fatal(err)
			}
			checkCase(t, b, hay, c, n, depth)
			again, err := b.Draw(seq(n, 3), hay, n, depth)
			if err != nil || !reflect.DeepEqual(c, again) {
				t.Fatalf("same seed, different cases: %v", err)
			}
			// Depth moves the needle only.
			if i == 0 {
				first = c
			} else if c.Key != first.Key || c.Value != first.Value || c.Offset != first.Offset {
				t.Fatalf("depth %v: key %q value %q offset %d; depth 0 had %q %q %d", depth, c.Key, c.Value, c.Offset, first.Key, first.Value, first.Offset)
			}
		}
		other, err := b.Draw(seq(n, 4), hay, n, 0.5)
		if err != nil {
			t.Fatal(err)
		}
		if other.Key == first.Key && other.Value == first.Value && other.Offset == first.Offset {
			t.Errorf("trials 3 and 4 drew the same case")
		}
	}
	// A haystack that holds every key cannot hide one.
	var all strings.Builder
	for _, a := range keyAdjectives {
		for _, n := range keyNouns {
			all.WriteString(a + " " + n + ". ")
		}
	}
	kb := newBuilder(t, keyful{tok, all.String()})
	if _, err := kb.Draw(seq(100, 0), hay, 100, 0.5); !errors.Is(err, ErrCollision) {
		t.Errorf("a haystack of keys: %v, want ErrCollision", err)
	}
	if _, err := b.Draw(seq(10, 0), hay, 10, 0.5); !errors.Is(err, attn.ErrInput) {
		t.Errorf("n too small: %v, want ErrInput", err)
	}
}

// keyful is a tokenizer whose longer texts hold every key.
type keyful struct {
	*tokenizer.Tokenizer
	keys string
}

func (k keyful) Decode(ids []int) string {
	if len(ids) > 2 {
		return k.Tokenizer.Decode(ids) + " " + k.keys
	}
	return k.Tokenizer.Decode(ids)
}

func TestHaystack(t *testing.T) {
	b := newBuilder(t, testTokenizer(t))
	one := testTokenizer(t).Encode("She walked to the garden.", false)
	if got := Haystack(b, "She walked to the garden.", 0); !slices.Equal(got, one) {
		t.Fatalf("Haystack %v, want %v", got, one)
	}
	long := Haystack(b, "She walked to the garden.", 100)
	if len(long) < 100 || !slices.Equal(long[:len(one)], one) {
		t.Fatalf("repeated haystack of %d tokens", len(long))
	}
	if text := b.tok.Decode(long); strings.Count(text, "She walked to the garden.") != strings.Count(text, "garden") {
		t.Errorf("repeats are not whole copies: %q", text)
	}
	if Haystack(b, "", 100) != nil {
		t.Errorf("empty text, tokens")
	}
}

func TestPlant(t *testing.T) {
	tok := testTokenizer(t)
	b := newBuilder(t, tok)
	hay := Haystack(b, hayText(13, 3000), 0)
	tm := b.Templates()
	for _, L := range []int{150, 257} {
		for _, k := range []int{1, 3} {
			for trial := range 5 {
				win := append([]int{1}, hay[trial*50:trial*50+L]...) // BOS first
				orig := slices.Clone(win)
				p, err := b.Plant(rand.New(rand.NewPCG(uint64(L), uint64(10*k+trial))), win, k)
				if err != nil {
					t.Fatalf("L %d k %d: %v", L, k, err)
				}
				if !slices.Equal(win, orig) {
					t.Fatal("Plant changed its window")
				}
				if len(p.Tokens) != len(win) || p.Tokens[0] != win[0] {
					t.Fatalf("%d tokens starting %d, want %d starting %d", len(p.Tokens), p.Tokens[0], len(win), win[0])
				}
				if len(p.Facts) < 1 || len(p.Facts) > k || p.Asked < 0 || p.Asked >= len(p.Facts) {
					t.Fatalf("%d facts asked %d, want 1 to %d", len(p.Facts), p.Asked, k)
				}
				asked := p.Facts[p.Asked]
				answer := b.Encode(Fill(tm.Answer, asked.Key, asked.Value))
				question := b.Encode(Fill(tm.Question, asked.Key, asked.Value))
				if p.AnswerAt != len(p.Tokens)-len(answer) || !slices.Equal(p.Tokens[p.AnswerAt:], answer) {
					t.Fatal("the window does not end with the answer")
				}
				if p.QuestionAt != p.AnswerAt-len(question) || !slices.Equal(p.Tokens[p.QuestionAt:p.AnswerAt], question) {
					t.Fatal("the question does not precede the answer")
				}
				text := tok.Decode(p.Tokens[:p.QuestionAt])
				var rest []int
				last := 0
				for i, f := range p.Facts {
					needle := b.Encode(Fill(tm.Needle, f.Key, f.Value))
					if f.At < 1 || !slices.Equal(p.Tokens[f.At:f.At+len(needle)], needle) {
						t.Fatalf("fact %d: no needle at %d", i, f.At)
					}
					if Count(text, f.Key) != 1 || Count(text, f.Value) != 1 {
						t.Fatalf("fact %d: key %q or value %q not once in the haystack", i, f.Key, f.Value)
					}
					for _, g := range p.Facts[:i] {
						if g.Key == f.Key || g.Value == f.Value {
							t.Fatal("two facts share a key or a value")
						}
					}
				}
				// Without the needles the haystack is the window's start.
				order := slices.Clone(p.Facts)
				slices.SortFunc(order, func(x, y Fact) int { return x.At - y.At })
				for _, f := range order {
					rest = append(rest, p.Tokens[last:f.At]...)
					last = f.At + len(b.Encode(Fill(tm.Needle, f.Key, f.Value)))
				}
				rest = append(rest, p.Tokens[last:p.QuestionAt]...)
				if !slices.Equal(rest, win[:len(rest)]) {
					t.Fatal("the haystack part is not the window's start")
				}
				again, err := b.Plant(rand.New(rand.NewPCG(uint64(L), uint64(10*k+trial))), win, k)
				if err != nil || !slices.Equal(again.Tokens, p.Tokens) || !slices.Equal(again.Facts, p.Facts) {
					t.Fatal("same rng state, different windows")
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 1))
	if _, err := b.Plant(rng, hay[:20], 1); !errors.Is(err, attn.ErrInput) {
		t.Errorf("short window: %v, want ErrInput", err)
	}
	for _, k := range []int{0, -1, MaxFacts + 1} {
		if _, err := b.Plant(rng, hay[:500], k); !errors.Is(err, attn.ErrInput) {
			t.Errorf("k = %d: %v, want ErrInput", k, err)
		}
	}
}

// DrawRepeatingValue's digits come from k of ten, first never 0; with
// k = 3 most values repeat a digit next to itself or two apart, as the
// values a model copied out of order did.
func TestDrawRepeatingValue(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	for _, k := range []int{1, 2, 3, 10} {
		for range 500 {
			v := DrawRepeatingValue(rng, k)
			if len(v) != 6 || strings.Trim(v, "0123456789") != "" || v[0] == '0' {
				t.Fatalf("k = %d: value %q, want 6 digits, the first not 0", k, v)
			}
			distinct := map[rune]bool{}
			for _, c := range v {
				distinct[c] = true
			}
			if len(distinct) > k {
				t.Fatalf("k = %d: value %q has %d distinct digits", k, v, len(distinct))
			}
		}
	}
	near := 0
	for range 1000 {
		v := DrawRepeatingValue(rng, 3)
		for i := 1; i < len(v); i++ {
			if v[i] == v[i-1] || (i > 1 && v[i] == v[i-2]) {
				near++
				break
			}
		}
	}
	// 1 - (2/3)·(1/3)^4·... : all but a few percent.
	if near < 900 {
		t.Errorf("%d of 1000 values repeat a digit within two places, want most", near)
	}
}

// WithValues changes the values Plant draws and nothing else of the
// builder; a draw with too few values for the facts is an error, not a
// loop without end.
func TestWithValues(t *testing.T) {
	tok := testTokenizer(t)
	b := newBuilder(t, tok)
	hay := Haystack(b, hayText(19, 3000), 0)
	win := append([]int{1}, hay[:400]...)
	fixed := b.WithValues(func(rng *rand.Rand) string { return "424242" })
	p, err := fixed.Plant(rand.New(rand.NewPCG(1, 2)), win, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Facts) != 1 || p.Facts[0].Value != "424242" || len(p.Tokens) != len(win) {
		t.Fatalf("facts %+v, %d tokens: want the one fact to have the drawn value", p.Facts, len(p.Tokens))
	}
	if q, err := b.Plant(rand.New(rand.NewPCG(1, 2)), win, 1); err != nil || q.Facts[0].Value == "424242" {
		t.Fatalf("the original builder drew %+v (%v)", q.Facts, err)
	}
	for seed := range uint64(20) {
		_, err := fixed.PlantAsking(rand.New(rand.NewPCG(seed, 3)), win, 4, 2)
		if err == nil {
			continue // one fact drawn
		}
		if !errors.Is(err, attn.ErrInput) {
			t.Fatalf("four facts of one value: %v, want ErrInput", err)
		}
		return
	}
	t.Fatal("20 seeds drew one fact each of up to four")
}

func TestPlantAsking(t *testing.T) {
	tok := testTokenizer(t)
	b := newBuilder(t, tok)
	hay := Haystack(b, hayText(17, 3000), 0)
	tm := b.Templates()
	for trial := range 8 {
		win := append([]int{1}, hay[trial*40:trial*40+400]...)
		seed := uint64(100 + trial)
		p, err := b.PlantAsking(rand.New(rand.NewPCG(seed, 7)), win, 4, 3)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if len(p.Tokens) != len(win) {
			t.Fatalf("%d tokens, want %d", len(p.Tokens), len(win))
		}
		if want := min(3, len(p.Facts)); len(p.Questions) != want {
			t.Fatalf("%d questions about %d facts, want %d", len(p.Questions), len(p.Facts), want)
		}
		seen := map[int]bool{}
		for i, q := range p.Questions {
			if seen[q.Fact] {
				t.Fatalf("fact %d asked twice", q.Fact)
			}
			seen[q.Fact] = true
			f := p.Facts[q.Fact]
			question := b.Encode(Fill(tm.Question, f.Key, f.Value))
			answer := b.Encode(Fill(tm.Answer, f.Key, f.Value))
			end := len(p.Tokens)
			if i+1 < len(p.Questions) {
				end = p.Questions[i+1].At
			}
			if !slices.Equal(p.Tokens[q.At:q.AnswerAt], question) || !slices.Equal(p.Tokens[q.AnswerAt:end], answer) {
				t.Fatalf("question %d is not the question about fact %d and its answer", i, q.Fact)
			}
		}
		last := p.Questions[len(p.Questions)-1]
		if p.QuestionAt != last.At || p.AnswerAt != last.AnswerAt || p.Asked != last.Fact {
			t.Fatal("QuestionAt, AnswerAt and Asked do not describe the last question")
		}
		if p.Questions[0].At <= p.Facts[0].At {
			t.Fatal("a question before the facts")
		}
		// One question: the same window as Plant's.
		one, err := b.PlantAsking(rand.New(rand.NewPCG(seed, 7)), win, 4, 1)
		plain, err2 := b.Plant(rand.New(rand.NewPCG(seed, 7)), win, 4)
		if err != nil || err2 != nil || !slices.Equal(one.Tokens, plain.Tokens) {
			t.Fatal("PlantAsking with one question differs from Plant")
		}
	}
	if _, err := b.PlantAsking(rand.New(rand.NewPCG(1, 1)), hay[:500], 2, 0); !errors.Is(err, attn.ErrInput) {
		t.Errorf("0 questions: %v, want ErrInput", err)
	}
}

// TestPlantDistances checks that facts land near the questions, far
// from them and near the window's start: with points uniform over a
// window of m tokens, a fact within m/16 of either end would come once in
// 16, and a model trained so learnt to look only far back, and missed
// facts at the very start of its longest windows.
func TestPlantDistances(t *testing.T) {
	tok := testTokenizer(t)
	b := newBuilder(t, tok)
	hay := Haystack(b, hayText(19, 6000), 0)
	const L, trials = 1024, 300
	near, far, first := 0, 0, 0
	for trial := range trials {
		win := append([]int{1}, hay[trial*10:trial*10+L]...)
		p, err := b.Plant(rand.New(rand.NewPCG(7, uint64(trial))), win, 1)
		if err != nil {
			t.Fatal(err)
		}
		switch d := p.QuestionAt - p.Facts[0].At; {
		case d < L/16:
			near++
		case d > L/2:
			far++
		}
		if p.Facts[0].At < L/16 {
			first++
		}
	}
	// A third of the points log-uniform in distance from the end, a third
	// from the start (m ≈ 990): P(d < m/16) is about 1/3·(1 − ln 16/ln m)
	// + 1/3·1/16 ≈ 0.22, P(at < m/16) as much, and P(d > m/2) about
	// 1/3·(1/2 + ln 2/ln m + ln(m/2)/ln m) ≈ 0.50. Uniform points alone
	// would give 0.06, 0.06 and 0.50.
	if near < trials/7 || first < trials/7 || far < trials/4 {
		t.Errorf("%d of %d facts within %d tokens of the question, %d within %d of the start, %d further than %d from the question: want a seventh, a seventh and a quarter or more",
			near, trials, L/16, first, L/16, far, L/2)
	}
}
