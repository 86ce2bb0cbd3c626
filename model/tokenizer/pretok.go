package tokenizer

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Pre-tokenizers split a text into the words byte-level BPE merges one at a
// time. Each is a hand-written scanner for a regular expression with
// look-ahead (\s+(?!\S)), which Go's regexp lacks; it follows the
// expression's leftmost-alternative semantics exactly, as tiktoken and
// Hugging Face's tokenizers evaluate it, over Unicode's categories as
// package unicode gives them: \p{L} is unicode.IsLetter, \p{N}
// unicode.IsNumber, \s the White_Space property (unicode.IsSpace). A byte
// that is not valid UTF-8 counts as a character of none of these classes.

// A splitter calls emit with the bounds of each word of s, in order; the
// words cover s.
type splitter func(s string, emit func(a, b int))

// character classes of the scanners
const (
	cOther   = iota // none of the below
	cLetter         // \p{L}
	cNumber         // \p{N}
	cSpace          // \s other than \r and \n
	cNewline        // \r or \n
	cEnd     = 0xff // past the end of the text
)

var asciiClass [utf8.RuneSelf]uint8

func init() {
	for r := range rune(utf8.RuneSelf) {
		asciiClass[r] = slowClass(r)
	}
}

func slowClass(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return cNewline
	case unicode.IsLetter(r):
		return cLetter
	case unicode.IsNumber(r):
		return cNumber
	case unicode.IsSpace(r):
		return cSpace
	}
	return cOther
}

// at returns the character at s[i] (utf8.RuneError for an invalid byte),
// its length and class.
func at(s string, i int) (rune, int, uint8) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1, asciiClass[c]
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && n == 1 {
		return r, 1, cOther
	}
	return r, n, slowClass(r)
}

// classAt is the class of the character at s[i], cEnd past the end.
func classAt(s string, i int) uint8 {
	if i >= len(s) {
		return cEnd
	}
	_, _, c := at(s, i)
	return c
}

// skip returns the end of the run of class c starting at s[i].
func skip(s string, i int, c uint8) int {
	for i < len(s) {
		_, n, ci := at(s, i)
		if ci != c {
			break
		}
		i += n
	}
	return i
}

// skipNewlines returns the end of the run of \r and \n at s[i].
func skipNewlines(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// isSpaceClass reports whether c is a class of \s.
func isSpaceClass(c uint8) bool { return c == cSpace || c == cNewline }

// contraction returns the length of the English contraction suffix
// ('s, 't, 're, 've, 'm, 'll, 'd) that s starts with, after the
// apostrophe, or 0. fold makes it case-insensitive as (?i:...) is in
// tiktoken's and Rust's regex, where s also matches U+017F (ſ, long s).
func contraction(s string, fold bool) int {
	if s == "" {
		return 0
	}
	low := func(b byte) byte {
		if fold && 'A' <= b && b <= 'Z' {
			return b + 'a' - 'A'
		}
		return b
	}
	switch c := low(s[0]); c {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v', 'l':
		if len(s) >= 2 {
			c2 := low(s[1])
			if c2 == 'e' && c != 'l' || c == 'l' && c2 == 'l' {
				return 2
			}
		}
	}
	if fold && strings.HasPrefix(s, "ſ") {
		return len("ſ")
	}
	return 0
}

// whitespace handles a run of \s starting at s[i], after the other
// alternatives failed: \s*[\r\n]+ when newlines is set and the run holds
// one (up to its last \r or \n), else \s+(?!\S) (the run less its last
// character when a non-space follows), else \s+. It returns the match's
// end.
func whitespace(s string, i int, newlines bool) int {
	end, last, lastNL := i, i, -1
	for end < len(s) {
		_, n, c := at(s, end)
		if !isSpaceClass(c) {
			break
		}
		if c == cNewline {
			lastNL = end + n
		}
		last = end
		end += n
	}
	switch {
	case newlines && lastNL >= 0:
		return lastNL
	case end < len(s) && last > i:
		return last
	}
	return end
}

// splitCL100k scans tiktoken's cl100k_base expression, Llama 3's:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// with at most digits numbers in a row (3; Qwen2's has \p{N}, 1).
func splitCL100k(s string, digits int, emit func(a, b int)) {
	for i := 0; i < len(s); {
		r, n, c := at(s, i)
		j := -1
		switch {
		case r == '\'' && contraction(s[i+1:], true) > 0:
			j = i + 1 + contraction(s[i+1:], true)
		case c == cLetter:
			j = skip(s, i, cLetter)
		case (c == cOther || c == cSpace) && classAt(s, i+n) == cLetter:
			j = skip(s, i+n, cLetter)
		case c == cNumber:
			j = i
			for k := 0; k < digits && j < len(s); k++ {
				_, m, cj := at(s, j)
				if cj != cNumber {
					break
				}
				j += m
			}
		case c == cOther:
			j = skipNewlines(s, skip(s, i, cOther))
		case r == ' ' && classAt(s, i+1) == cOther:
			j = skipNewlines(s, skip(s, i+1, cOther))
		default:
			j = whitespace(s, i, true)
		}
		emit(i, j)
		i = j
	}
}

// splitGPT2 scans GPT-2's expression:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitGPT2(s string, emit func(a, b int)) {
	for i := 0; i < len(s); {
		r, _, c := at(s, i)
		var j int
		if r == '\'' && contraction(s[i+1:], false) > 0 {
			j = i + 1 + contraction(s[i+1:], false)
		} else {
			from := i
			if r == ' ' {
				if c2 := classAt(s, i+1); c2 == cLetter || c2 == cNumber || c2 == cOther {
					from, c = i+1, c2
				}
			}
			if c == cLetter || c == cNumber || c == cOther {
				j = skip(s, from, c)
			} else {
				j = whitespace(s, i, false)
			}
		}
		emit(i, j)
		i = j
	}
}

// runs emits the maximal runs of characters that in reports true for and
// the stretches between them, as llama.cpp splits by a character-class
// expression such as \p{N}+; each with single set emits every such
// character alone (\p{N}).
func runs(s string, in func(r rune, c uint8) bool, single bool, emit func(a, b int)) {
	prev := 0
	for i := 0; i < len(s); {
		r, n, c := at(s, i)
		if !in(r, c) {
			i += n
			continue
		}
		if i > prev {
			emit(prev, i)
		}
		j := i + n
		if !single {
			for j < len(s) {
				r2, m, c2 := at(s, j)
				if !in(r2, c2) {
					break
				}
				j += m
			}
		}
		emit(i, j)
		prev, i = j, j
	}
	if prev < len(s) {
		emit(prev, len(s))
	}
}

func isNumber(_ rune, c uint8) bool { return c == cNumber }

// isDefaultPunct is llama.cpp's default first class, [\p{P}\$\+<=>\^~\|].
func isDefaultPunct(r rune, _ uint8) bool {
	return unicode.IsPunct(r) || strings.ContainsRune("$+<=>^~|", r)
}

// digitTriples emits each leftmost run of three ASCII digits
// ([0-9][0-9][0-9]) and the stretches between them.
func digitTriples(s string, emit func(a, b int)) {
	prev := 0
	isDigit := func(i int) bool { return i < len(s) && '0' <= s[i] && s[i] <= '9' }
	for i := 0; i+3 <= len(s); {
		if isDigit(i) && isDigit(i+1) && isDigit(i+2) {
			if i > prev {
				emit(prev, i)
			}
			emit(i, i+3)
			i += 3
			prev = i
			continue
		}
		i++
	}
	if prev < len(s) {
		emit(prev, len(s))
	}
}

// chain applies each splitter to the words of the one before, as
// llama.cpp applies a pre-tokenizer's expressions in turn.
func chain(stages ...splitter) splitter {
	return func(s string, emit func(a, b int)) {
		var apply func(k, off int, s string)
		apply = func(k, off int, s string) {
			if k == len(stages) {
				emit(off, off+len(s))
				return
			}
			stages[k](s, func(a, b int) { apply(k+1, off+a, s[a:b]) })
		}
		apply(0, 0, s)
	}
}

// preTokenizer is a pre-tokenizer and what llama.cpp sets with it.
type preTokenizer struct {
	split splitter
	// ignoreMerges takes a word that is a piece as it is, without
	// merging (tiktoken's and Llama 3's rule).
	ignoreMerges bool
	addBOS       bool
}

var (
	preLlama3 = preTokenizer{split: func(s string, emit func(a, b int)) { splitCL100k(s, 3, emit) }, ignoreMerges: true, addBOS: true}
	preCL100k = preTokenizer{split: func(s string, emit func(a, b int)) { splitCL100k(s, 3, emit) }}
	preQwen2  = preTokenizer{split: func(s string, emit func(a, b int)) { splitCL100k(s, 1, emit) }}
	preGPT2   = preTokenizer{split: splitGPT2}
	preSmolLM = preTokenizer{split: chain(
		func(s string, emit func(a, b int)) { runs(s, isNumber, true, emit) },
		splitGPT2)}
	preDefault = preTokenizer{split: chain(
		func(s string, emit func(a, b int)) { runs(s, isDefaultPunct, false, emit) },
		splitGPT2,
		func(s string, emit func(a, b int)) { runs(s, isNumber, false, emit) },
		digitTriples)}
)

// preTokenizers maps GGUF's tokenizer.ggml.pre to the pre-tokenizers, with
// the names llama.cpp gives the same expressions.
var preTokenizers = map[string]preTokenizer{
	// Llama 3: tiktoken's cl100k_base expression.
	"llama-bpe": preLlama3, "llama3": preLlama3, "llama-v3": preLlama3, "falcon3": preLlama3, "pixtral": preLlama3,
	"dbrx": preCL100k, "smaug-bpe": preCL100k,
	// cl100k with single digits.
	"qwen2": preQwen2, "deepseek-r1-qwen": preQwen2, "megrez": preQwen2, "stablelm2": preQwen2,
	// \p{N} alone, then GPT-2's.
	"smollm": preSmolLM, "starcoder": preSmolLM, "refact": preSmolLM, "command-r": preSmolLM,
	"codeshell": preSmolLM, "exaone": preSmolLM, "minerva-7b": preSmolLM,
	"gpt-2": preGPT2, "phi-2": preGPT2, "mpt": preGPT2, "olmo": preGPT2,
	// What llama.cpp uses for a vocabulary that names none.
	"default": preDefault, "": preDefault,
}

// PreTokenizers returns the names NewBPE accepts, sorted.
func PreTokenizers() []string {
	var names []string
	for k := range preTokenizers {
		if k != "" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return names
}
