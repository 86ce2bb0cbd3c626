package needle

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/attnkit/attn"
)

// Placeholders of the templates.
const (
	KeyPlaceholder   = "{key}"
	ValuePlaceholder = "{value}"
)

// Default templates. The needle has no trailing space: it is inserted
// before a word of the haystack, whose token brings its own space.
const (
	DefaultNeedle   = " The special magic number for {key} is #{value}."
	DefaultQuestion = " What is the special magic number for {key}? The special magic number for {key} is"
	DefaultAnswer   = " #{value}"
)

// Templates are the texts of a test, with {key} and {value} replaced by
// each case's key and value. The needle is the fact hidden in the
// haystack, the question follows the haystack and ends where the answer
// starts. A template that continues text should start with a space (the
// defaults do); see Builder for how the pieces are tokenized.
type Templates struct {
	Needle, Question, Answer string
}

// DefaultTemplates returns the default needle, question and answer.
func DefaultTemplates() Templates {
	return Templates{Needle: DefaultNeedle, Question: DefaultQuestion, Answer: DefaultAnswer}
}

// WithDefaults returns t with empty templates replaced by the defaults.
func (t Templates) WithDefaults() Templates {
	if t.Needle == "" {
		t.Needle = DefaultNeedle
	}
	if t.Question == "" {
		t.Question = DefaultQuestion
	}
	if t.Answer == "" {
		t.Answer = DefaultAnswer
	}
	return t
}

// Validate checks that the needle names the key and the value, the
// question names the key but not the value (it would give the answer
// away), and the answer names the value.
func (t Templates) Validate() error {
	switch {
	case !strings.Contains(t.Needle, KeyPlaceholder) || !strings.Contains(t.Needle, ValuePlaceholder):
		return fmt.Errorf("%w: needle template %q must contain %s and %s", attn.ErrInput, t.Needle, KeyPlaceholder, ValuePlaceholder)
	case !strings.Contains(t.Question, KeyPlaceholder):
		return fmt.Errorf("%w: question template %q must contain %s", attn.ErrInput, t.Question, KeyPlaceholder)
	case strings.Contains(t.Question, ValuePlaceholder):
		return fmt.Errorf("%w: question template %q must not contain %s: it would give the answer away", attn.ErrInput, t.Question, ValuePlaceholder)
	case !strings.Contains(t.Answer, ValuePlaceholder):
		return fmt.Errorf("%w: answer template %q must contain %s", attn.ErrInput, t.Answer, ValuePlaceholder)
	}
	return nil
}

// Fill returns template s with key and value in place of the
// placeholders.
func Fill(s, key, value string) string {
	return strings.NewReplacer(KeyPlaceholder, key, ValuePlaceholder, value).Replace(s)
}

// Keys are an adjective and a noun of these lists; keys are matched as
// whole words, so one never shows up inside another.
var (
	keyAdjectives = []string{
		"amber", "ancient", "autumn", "bitter", "blue", "brave", "bright", "broken",
		"calm", "clever", "copper", "crimson", "curious", "dusty", "eager", "early",
		"faded", "gentle", "golden", "green", "grey", "hidden", "hollow", "humble",
		"icy", "idle", "ivory", "jolly", "lonely", "lucky", "marble", "merry",
		"misty", "modest", "narrow", "noble", "olive", "orange", "pale", "patient",
		"polished", "purple", "quiet", "rapid", "rusty", "scarlet", "secret", "silent",
		"silver", "simple", "sleepy", "slender", "smoky", "solemn", "steady", "stony",
		"sturdy", "sunny", "tender", "velvet", "violet", "wandering", "wooden", "yellow",
	}
	keyNouns = []string{
		"anchor", "apple", "arrow", "badger", "basket", "beacon", "bell", "bridge",
		"bucket", "button", "candle", "canyon", "castle", "cedar", "comet", "compass",
		"cottage", "crane", "crystal", "dolphin", "dragon", "drum", "falcon", "feather",
		"fiddle", "forest", "fountain", "garden", "glacier", "harbour", "helmet", "island",
		"kettle", "ladder", "lantern", "lemon", "lighthouse", "lizard", "meadow", "mirror",
		"mountain", "needle", "orchard", "otter", "owl", "parrot", "pebble", "pepper",
		"piano", "pigeon", "pillow", "planet", "pumpkin", "quill", "rabbit", "river",
		"saddle", "spoon", "squirrel", "teapot", "thimble", "tiger", "violin", "walnut",
	}
)

// Values are 6-digit numbers.
const (
	minValue = 100000
	maxValue = 999999
)

// DrawKey returns a random key: an adjective and a noun of a fixed list
// of ordinary English words (64 of each).
func DrawKey(rng *rand.Rand) string {
	return keyAdjectives[rng.IntN(len(keyAdjectives))] + " " + keyNouns[rng.IntN(len(keyNouns))]
}

// DrawValue returns a random value: a 6-digit number.
func DrawValue(rng *rand.Rand) string {
	return strconv.Itoa(minValue + rng.IntN(maxValue-minValue+1))
}

// DrawRepeatingValue returns a random 6-digit number whose digits are
// drawn from k distinct digits (k in 1…10; the first digit is never 0),
// so that with a small k most digits repeat: 662645 or 593965 are the
// values a model gets wrong when it copies a value by the digit before
// each one rather than by its place in the value, and DrawValue's
// uniform digits give too few of them to train that away.
func DrawRepeatingValue(rng *rand.Rand, k int) string {
	k = min(max(k, 1), 10)
	digits := rng.Perm(10)[:k]
	if k == 1 && digits[0] == 0 {
		digits[0] = 1 + rng.IntN(9)
	}
	var b [6]byte
	for i := range b {
		d := digits[rng.IntN(k)]
		for i == 0 && d == 0 {
			d = digits[rng.IntN(k)]
		}
		b[i] = byte('0' + d)
	}
	return string(b[:])
}

// find returns the byte offset of the first whole-word match of s in text
// at or after from, ignoring case (not inside a longer word or number:
// "hat box" is not in "what boxes"), or -1.
func find(text, s string, from int) int {
	lt, ls := strings.ToLower(text), strings.ToLower(s)
	if ls == "" || len(lt) != len(text) {
		// Lower-casing changed the lengths (rare scripts): match as is.
		lt, ls = text, s
	}
	for i := from; i <= len(lt); {
		j := strings.Index(lt[i:], ls)
		if j < 0 || ls == "" {
			return -1
		}
		j += i
		end := j + len(ls)
		before, _ := utf8.DecodeLastRuneInString(lt[:j])
		after, _ := utf8.DecodeRuneInString(lt[end:])
		if (j == 0 || !isWordRune(before)) && (end == len(lt) || !isWordRune(after)) {
			return j
		}
		i = j + 1
	}
	return -1
}

// contains reports whether text holds s as whole words, ignoring case.
func contains(text, s string) bool { return find(text, s, 0) >= 0 }

// Count returns how many times text holds s as whole words, ignoring case
// (not inside a longer word or number): how the tests count a key in a
// prompt.
func Count(text, s string) int {
	n := 0
	for i := find(text, s, 0); i >= 0; i = find(text, s, i+len(s)) {
		n++
	}
	return n
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// Score reports whether generated text answers with answer: exact match,
// leading white space aside, with the answer followed by nothing or by a
// character that is neither a letter nor a digit (" 123456." answers
// " 123456"; " 1234567" and " 12345" do not).
func Score(answer, generated string) bool {
	a := strings.TrimLeftFunc(answer, unicode.IsSpace)
	g := strings.TrimLeftFunc(generated, unicode.IsSpace)
	if a == "" || !strings.HasPrefix(g, a) {
		return false
	}
	next, _ := utf8.DecodeRuneInString(g[len(a):])
	return len(g) == len(a) || !isWordRune(next)
}

// decided reports whether generated text already settles Score: it has
// left answer's path, or gone at least one character past it.
func decided(answer, generated string) bool {
	a := strings.TrimLeftFunc(answer, unicode.IsSpace)
	g := strings.TrimLeftFunc(generated, unicode.IsSpace)
	if len(g) <= len(a) {
		return !strings.HasPrefix(a, g)
	}
	return true
}
