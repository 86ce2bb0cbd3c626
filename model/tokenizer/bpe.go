package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/attnkit/attn"
)

// bpe is the byte-level half of a Tokenizer.
type bpe struct {
	pre     preTokenizer
	preName string
	merges  []string
	// Symbols are numbered: the pieces by id, then the strings merges name
	// that are not pieces. rules maps a pair of symbols to the rule
	// merging them.
	rules        map[uint64]rule
	byteSym      [256]int32 // the symbol of each byte's character, -1 if none
	byteTok      [256]int32 // the piece of each byte's character, -1 if none
	ignoreMerges bool
}

type rule struct{ rank, sym int32 }

func ruleKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// byteRune is GPT-2's bytes_to_unicode: printable bytes stand for
// themselves, the others (controls, space, DEL, NBSP, soft hyphen) for
// U+0100 and up, in byte order, so that every piece is printable text.
var byteRune [256]rune

// runeByte inverts byteRune; -1 elsewhere.
var runeByte [256 + 68]int16

// byteText is string(byteRune[b]).
var byteText [256]string

func init() {
	n := rune(0)
	for b := range 256 {
		if '!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = 256 + n
			n++
		}
	}
	for i := range runeByte {
		runeByte[i] = -1
	}
	for b, r := range byteRune {
		runeByte[r] = int16(b)
		byteText[b] = string(r)
	}
}

// NewBPE makes a byte-level BPE tokenizer (GGUF's tokenizer.ggml.model
// "gpt2") from its pieces, written in GPT-2's byte-to-character mapping,
// their kinds (nil: all Normal), the merge rules in rank order, each two
// symbols separated by a space (tokenizer.ggml.merges), and the name of
// the pre-tokenizer (tokenizer.ggml.pre; PreTokenizers lists them).
// BOS, EOS and Unknown are -1 (set them from the file's metadata); AddBOS
// is set for the pre-tokenizers whose models want it. The tokenizer keeps
// the slices: do not modify them afterwards.
func NewBPE(pieces []string, kinds []Kind, merges []string, pre string) (*Tokenizer, error) {
	n := len(pieces)
	if n == 0 {
		return nil, fmt.Errorf("%w: no pieces", ErrFormat)
	}
	if n > MaxVocab || len(merges) > 2*MaxVocab {
		return nil, fmt.Errorf("%w: %d pieces and %d merges (at most %d and %d)", ErrFormat, n, len(merges), MaxVocab, 2*MaxVocab)
	}
	if kinds != nil && len(kinds) != n {
		return nil, fmt.Errorf("%w: %d pieces but %d kinds", ErrFormat, n, len(kinds))
	}
	p, ok := preTokenizers[pre]
	if !ok {
		return nil, fmt.Errorf("%w: pre-tokenizer %q (known: %s)", attn.ErrUnsupported, clip(pre), strings.Join(PreTokenizers(), ", "))
	}
	if kinds == nil {
		kinds = make([]Kind, n)
		for i := range kinds {
			kinds[i] = Normal
		}
	}
	t := &Tokenizer{
		pieces: pieces, scores: make([]float32, n), kinds: kinds,
		index: make(map[string]int32, n),
		model: ByteBPE,
		BOS:   -1, EOS: -1, Unknown: -1, AddBOS: p.addBOS,
	}
	for i := range t.byteID {
		t.byteID[i] = -1
	}
	for i, s := range pieces {
		switch k := kinds[i]; k {
		case Normal, Undefined, UserDefined, Control, Unknown, Unused:
		case Byte:
			b, ok := parseByte(s)
			if !ok {
				return nil, fmt.Errorf("%w: piece %d (%q) is of kind Byte but not <0xXX>", ErrFormat, i, clip(s))
			}
			if t.byteID[b] < 0 {
				t.byteID[b] = int32(i)
			}
		default:
			return nil, fmt.Errorf("%w: piece %d (%q) has kind %d", ErrFormat, i, clip(s), k)
		}
		if _, dup := t.index[s]; !dup && s != "" {
			t.index[s] = int32(i)
		}
	}
	b := &bpe{pre: p, preName: pre, merges: merges, rules: make(map[uint64]rule, len(merges)), ignoreMerges: p.ignoreMerges}
	extra := map[string]int32{}
	sym := func(s string) int32 {
		if id, ok := t.index[s]; ok {
			return id
		}
		if id, ok := extra[s]; ok {
			return id
		}
		id := int32(n + len(extra))
		extra[s] = id
		return id
	}
	for i, m := range merges {
		// llama.cpp splits at the first space after the first byte.
		sp := -1
		if len(m) > 1 {
			sp = strings.IndexByte(m[1:], ' ')
		}
		if sp < 0 {
			return nil, fmt.Errorf("%w: merge %d (%q) is not two symbols separated by a space", ErrFormat, i, clip(m))
		}
		l, r := m[:sp+1], m[sp+2:]
		key := ruleKey(sym(l), sym(r))
		if _, dup := b.rules[key]; !dup {
			b.rules[key] = rule{rank: int32(i), sym: sym(l + r)}
		}
	}
	for c := range 256 {
		b.byteSym[c], b.byteTok[c] = -1, -1
		if id, ok := t.index[byteText[c]]; ok {
			b.byteSym[c], b.byteTok[c] = id, id
		} else if id, ok := extra[byteText[c]]; ok {
			b.byteSym[c] = id
		}
	}
	t.bpe = b
	t.specials = newSpecials(pieces, kinds)
	return t, nil
}

// Pre returns the name of a byte-level BPE tokenizer's pre-tokenizer, ""
// for SentencePiece.
func (t *Tokenizer) Pre() string {
	if t.bpe == nil {
		return ""
	}
	return t.bpe.preName
}

// Merges returns a byte-level BPE tokenizer's merge rules in rank order
// (not a copy: do not modify), nil for SentencePiece.
func (t *Tokenizer) Merges() []string {
	if t.bpe == nil {
		return nil
	}
	return t.bpe.merges
}

// bpePair merges two symbols by the rule for them.
func (e *encoder) bpePair(l, r *symbol) (int32, int32, bool) {
	if l.id < 0 || r.id < 0 {
		return 0, 0, false
	}
	ru, ok := e.t.bpe.rules[ruleKey(l.id, r.id)]
	if !ok {
		return 0, 0, false
	}
	return ru.sym, -ru.rank, true
}

// bpeText appends the encoding of text: its words, each merged alone.
func (e *encoder) bpeText(ids []int, text string) []int {
	e.t.bpe.pre.split(text, func(a, b int) {
		for a < b {
			c := min(b, a+maxPart)
			ids = e.bpeWord(ids, text[a:c])
			a = c
		}
	})
	return ids
}

func (e *encoder) bpeWord(ids []int, w string) []int {
	t, b := e.t, e.t.bpe
	if b.ignoreMerges {
		e.buf = e.buf[:0]
		for i := range len(w) {
			e.buf = append(e.buf, byteText[w[i]]...)
		}
		if id, ok := t.index[string(e.buf)]; ok {
			return append(ids, int(id))
		}
	}
	syms := e.m.reset(len(w))
	for i := range len(w) {
		syms[i].start, syms[i].end, syms[i].id = int32(i), int32(i+1), b.byteSym[w[i]]
	}
	e.m.run(e.bpePair)
	syms = e.m.syms
	for i := int32(0); i >= 0; i = syms[i].next {
		if id := syms[i].id; id >= 0 && int(id) < len(t.pieces) {
			ids = append(ids, int(id))
			continue
		}
		// A symbol that is no piece (a vocabulary without every byte, or
		// a merge to a string it lacks) falls back to its bytes.
		for j := syms[i].start; j < syms[i].end; j++ {
			switch c := w[j]; {
			case b.byteTok[c] >= 0:
				ids = append(ids, int(b.byteTok[c]))
			case t.byteID[c] >= 0:
				ids = append(ids, int(t.byteID[c]))
			case t.Unknown >= 0:
				ids = append(ids, t.Unknown)
			}
		}
	}
	return ids
}

// appendBPEPiece appends the bytes a normal byte-level piece stands for; a
// character outside GPT-2's mapping stands for itself.
func appendBPEPiece(dst []byte, p string) []byte {
	for _, r := range p {
		if r < rune(len(runeByte)) && runeByte[r] >= 0 {
			dst = append(dst, byte(runeByte[r]))
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	return dst
}
