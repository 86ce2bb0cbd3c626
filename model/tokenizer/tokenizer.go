package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrFormat is wrapped by every error about a vocabulary or a tokenizer
// file that cannot be used.
var ErrFormat = errors.New("tokenizer: malformed vocabulary")

// Kind is the role of a piece; the values are those of SentencePiece and
// GGUF's tokenizer.ggml.token_type.
type Kind int32

// The kinds of pieces.
const (
	Undefined   Kind = 0 // treated as Normal
	Normal      Kind = 1
	Unknown     Kind = 2
	Control     Kind = 3 // <s>, </s>: never matched in text, skipped by Decode
	UserDefined Kind = 4
	Unused      Kind = 5
	Byte        Kind = 6 // <0xXX>
)

// Space is SentencePiece's marker for a space, U+2581.
const Space = "\u2581"

// The tokenizer models, as GGUF's tokenizer.ggml.model names them.
const (
	// SentencePiece is SentencePiece-style BPE over characters, merged by
	// piece score, with <0xXX> byte fallback (Llama 1 and 2, Mistral,
	// TinyLlama, llama2.c).
	SentencePiece = "llama"
	// ByteBPE is GPT-2-style byte-level BPE: the text is split by a
	// pre-tokenizer, each word's bytes are merged by rank (Llama 3, Qwen2,
	// SmolLM, GPT-2).
	ByteBPE = "gpt2"
)

// Tokenizer is a vocabulary with its encoder: SentencePiece-style (New) or
// byte-level BPE (NewBPE). It is safe for concurrent use once made; its
// exported fields may be set before use.
type Tokenizer struct {
	pieces []string
	scores []float32
	kinds  []Kind
	// index finds pieces by text: for SentencePiece the Normal, Undefined
	// and UserDefined ones (the pieces merges may form), for byte-level
	// BPE every piece, as llama.cpp looks them up.
	index  map[string]int32
	byteID [256]int32 // the <0xXX> pieces, -1 where missing

	model string
	// joins holds, for SentencePiece, every pair of adjacent characters
	// inside a piece of index: where two characters of a text are not
	// such a pair, no merge can cross between them, so the text is merged
	// a part at a time with the same result as at once.
	joins    map[uint64]struct{}
	bpe      *bpe
	specials specials

	// BOS, EOS and Unknown are the ids of the begin- and end-of-sequence
	// pieces and of the unknown piece, -1 where there is none. New sets
	// them from the pieces <s>, </s> and the first piece of kind Unknown;
	// NewBPE sets them to -1.
	BOS, EOS, Unknown int
	// AddBOS and AddEOS say whether Encode and Tokenize with addSpecial
	// put BOS first and EOS last (GGUF's tokenizer.ggml.add_bos_token and
	// add_eos_token). New sets AddBOS; NewBPE sets it for the
	// pre-tokenizers whose models want it (llama-bpe), as llama.cpp does.
	AddBOS, AddEOS bool
	// AddSpacePrefix puts a space in front of a non-empty text, and of
	// the text after a special piece, before SentencePiece encoding and
	// drops it when decoding (default true; byte-level BPE ignores it).
	AddSpacePrefix bool
}

// New makes a SentencePiece-style tokenizer from parallel lists of pieces,
// scores and kinds. scores may be nil (all 0); kinds may be nil, and are
// then inferred: <unk> is Unknown, <s> and </s> are Control, <0xXX> is
// Byte, the rest Normal. A piece of kind Byte must be of the form <0xXX>;
// scores must not be NaN. The tokenizer keeps the slices: do not modify
// them afterwards.
func New(pieces []string, scores []float32, kinds []Kind) (*Tokenizer, error) {
	n := len(pieces)
	if n == 0 {
		return nil, fmt.Errorf("%w: no pieces", ErrFormat)
	}
	if n > MaxVocab {
		return nil, fmt.Errorf("%w: %d pieces (at most %d)", ErrFormat, n, MaxVocab)
	}
	if scores != nil && len(scores) != n {
		return nil, fmt.Errorf("%w: %d pieces but %d scores", ErrFormat, n, len(scores))
	}
	if kinds != nil && len(kinds) != n {
		return nil, fmt.Errorf("%w: %d pieces but %d kinds", ErrFormat, n, len(kinds))
	}
	t := &Tokenizer{
		pieces: pieces, scores: scores, kinds: kinds,
		index: make(map[string]int32, n),
		model: SentencePiece,
		joins: map[uint64]struct{}{},
		BOS:   -1, EOS: -1, Unknown: -1, AddBOS: true, AddSpacePrefix: true,
	}
	if t.scores == nil {
		t.scores = make([]float32, n)
	}
	if t.kinds == nil {
		t.kinds = make([]Kind, n)
		for i, p := range pieces {
			t.kinds[i] = inferKind(p)
		}
	}
	for i := range t.byteID {
		t.byteID[i] = -1
	}
	for i, p := range pieces {
		if x := t.scores[i]; x != x {
			return nil, fmt.Errorf("%w: piece %d (%q) has score NaN", ErrFormat, i, clip(p))
		}
		switch k := t.kinds[i]; k {
		case Normal, Undefined, UserDefined:
			if _, dup := t.index[p]; !dup && p != "" {
				t.index[p] = int32(i)
				t.addJoins(p)
			}
		case Byte:
			b, ok := parseByte(p)
			if !ok {
				return nil, fmt.Errorf("%w: piece %d (%q) is of kind Byte but not <0xXX>", ErrFormat, i, clip(p))
			}
			if t.byteID[b] < 0 {
				t.byteID[b] = int32(i)
			}
		case Unknown:
			if t.Unknown < 0 {
				t.Unknown = i
			}
		case Control:
			switch p {
			case "<s>":
				t.BOS = i
			case "</s>":
				t.EOS = i
			}
		case Unused:
		default:
			return nil, fmt.Errorf("%w: piece %d (%q) has kind %d", ErrFormat, i, clip(p), k)
		}
	}
	t.specials = newSpecials(pieces, t.kinds)
	return t, nil
}

// addJoins records the adjacent characters of piece p.
func (t *Tokenizer) addJoins(p string) {
	prev := rune(-1)
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRuneInString(p[i:])
		if prev >= 0 {
			t.joins[joinKey(prev, r)] = struct{}{}
		}
		prev = r
		i += n
	}
}

func joinKey(a, b rune) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// clip shortens a piece for an error message.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func inferKind(p string) Kind {
	switch p {
	case "<unk>":
		return Unknown
	case "<s>", "</s>":
		return Control
	}
	if _, ok := parseByte(p); ok {
		return Byte
	}
	return Normal
}

// parseByte parses "<0xXX>" with two hex digits.
func parseByte(p string) (byte, bool) {
	if len(p) != 6 || p[:3] != "<0x" || p[5] != '>' {
		return 0, false
	}
	var b byte
	for _, c := range []byte(p[3:5]) {
		var v byte
		switch {
		case '0' <= c && c <= '9':
			v = c - '0'
		case 'A' <= c && c <= 'F':
			v = c - 'A' + 10
		case 'a' <= c && c <= 'f':
			v = c - 'a' + 10
		default:
			return 0, false
		}
		b = b<<4 | v
	}
	return b, true
}

// Model returns the tokenizer model: SentencePiece or ByteBPE.
func (t *Tokenizer) Model() string { return t.model }

// Len returns the number of pieces.
func (t *Tokenizer) Len() int { return len(t.pieces) }

// Piece returns the text of piece id as stored (SentencePiece's have "▁"
// for a space; byte-level BPE's are in GPT-2's byte characters, "Ġ" for a
// space), "" for an id out of range.
func (t *Tokenizer) Piece(id int) string {
	if id < 0 || id >= len(t.pieces) {
		return ""
	}
	return t.pieces[id]
}

// Score returns the score of piece id, 0 for an id out of range.
func (t *Tokenizer) Score(id int) float32 {
	if id < 0 || id >= len(t.pieces) {
		return 0
	}
	return t.scores[id]
}

// Kind returns the kind of piece id, Undefined for an id out of range.
func (t *Tokenizer) Kind(id int) Kind {
	if id < 0 || id >= len(t.pieces) {
		return Undefined
	}
	return t.kinds[id]
}

// Pieces, Scores and Kinds return the vocabulary (not copies: do not
// modify).
func (t *Tokenizer) Pieces() []string { return t.pieces }

// Scores returns the piece scores; see Pieces.
func (t *Tokenizer) Scores() []float32 { return t.scores }

// Kinds returns the piece kinds; see Pieces.
func (t *Tokenizer) Kinds() []Kind { return t.kinds }

// Encode returns the ids of text. With addSpecial, BOS comes first when
// AddBOS is set and EOS last when AddEOS is set, where the vocabulary has
// them (llama.cpp's add_special). User-defined pieces in the text are
// matched before anything else; control pieces never are (see Tokenize).
func (t *Tokenizer) Encode(text string, addSpecial bool) []int {
	return t.Tokenize(text, addSpecial, false)
}

// Tokenize is Encode that, with parseSpecial, also matches the text of
// control and unknown pieces (such as <|eot_id|> or <s>) in text, as
// llama.cpp's parse_special does: the longest special pieces are found
// first, then the text between them is encoded.
func (t *Tokenizer) Tokenize(text string, addSpecial, parseSpecial bool) []int {
	ids := make([]int, 0, len(text)/4+2)
	if addSpecial && t.AddBOS && t.BOS >= 0 {
		ids = append(ids, t.BOS)
	}
	e := encoder{t: t}
	prevSpecial := true
	for _, f := range t.specials.partition(text, parseSpecial) {
		if f.id >= 0 {
			ids = append(ids, int(f.id))
			prevSpecial = true
			continue
		}
		if t.bpe != nil {
			ids = e.bpeText(ids, text[f.start:f.end])
		} else {
			ids = e.spmText(ids, text[f.start:f.end], t.AddSpacePrefix && prevSpecial)
		}
		prevSpecial = false
	}
	if addSpecial && t.AddEOS && t.EOS >= 0 {
		ids = append(ids, t.EOS)
	}
	return ids
}

// encoder holds one call's buffers.
type encoder struct {
	t   *Tokenizer
	m   merger
	s   string // the part being merged
	buf []byte
}

// maxPart bounds the bytes merged at once, so that offsets fit in int32: a
// text with a longer stretch that no split point breaks is cut there.
const maxPart = 1 << 30

// spmText appends the SentencePiece encoding of text, with a space in front
// when prefix is set.
func (e *encoder) spmText(ids []int, text string, prefix bool) []int {
	t := e.t
	s := strings.ReplaceAll(text, " ", Space)
	if prefix {
		s = Space + s
	}
	start := 0
	prev := rune(-1)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if i > start {
			if _, ok := t.joins[joinKey(prev, r)]; !ok || i-start >= maxPart {
				ids = e.spmPart(ids, s[start:i])
				start = i
			}
		}
		prev = r
		i += n
	}
	return e.spmPart(ids, s[start:])
}

// spmPair merges two symbols when their text is a piece, by its score.
func (e *encoder) spmPair(l, r *symbol) (int32, int32, bool) {
	id, ok := e.t.index[e.s[l.start:r.end]]
	if !ok {
		return 0, 0, false
	}
	return id, scoreKey(e.t.scores[id]), true
}

func (e *encoder) spmPart(ids []int, s string) []int {
	if s == "" {
		return ids
	}
	t := e.t
	syms := e.m.reset(utf8.RuneCountInString(s))
	for i, k := 0, 0; i < len(s); k++ {
		_, n := utf8.DecodeRuneInString(s[i:])
		id, ok := t.index[s[i:i+n]]
		if !ok {
			id = -1
		}
		syms[k].start, syms[k].end, syms[k].id = int32(i), int32(i+n), id
		i += n
	}
	e.s = s
	e.m.run(e.spmPair)
	syms = e.m.syms
	for i := int32(0); i >= 0; i = syms[i].next {
		if id := syms[i].id; id >= 0 {
			ids = append(ids, int(id))
			continue
		}
		// Byte fallback; the space marker stands for a space.
		piece := s[syms[i].start:syms[i].end]
		if piece == Space {
			piece = " "
		}
		ids = t.appendBytes(ids, piece)
	}
	return ids
}

// appendBytes appends the byte pieces of s, or the unknown piece for a
// byte without one.
func (t *Tokenizer) appendBytes(ids []int, s string) []int {
	for j := range len(s) {
		switch b := s[j]; {
		case t.byteID[b] >= 0:
			ids = append(ids, int(t.byteID[b]))
		case t.Unknown >= 0:
			ids = append(ids, t.Unknown)
		}
	}
	return ids
}

// Decode returns the text of ids: the inverse of Encode (see the package
// documentation). Ids out of range are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	var b []byte
	st := t.NewStream(false)
	for _, id := range ids {
		b = st.Append(b, id)
	}
	return string(b)
}

// Stream decodes ids one at a time, for output as they are produced.
type Stream struct {
	t       *Tokenizer
	started bool
}

// NewStream returns a Stream. started says that text was already output
// (the ids continue a text, as generated tokens continue a prompt), so
// that the space AddSpacePrefix puts first is not dropped again.
func (t *Tokenizer) NewStream(started bool) *Stream { return &Stream{t: t, started: started} }

// Append appends the text of piece id to dst: a byte piece as its byte,
// nothing for control pieces and ids out of range. A SentencePiece piece
// has "▁" as a space, and the first piece that is output loses a leading
// space when AddSpacePrefix is set and the stream did not start mid-text.
// A byte-level BPE piece is turned back into the bytes it stands for; a
// user-defined one is output as it is, and unknown and unused pieces not
// at all, as llama.cpp does.
func (st *Stream) Append(dst []byte, id int) []byte {
	t := st.t
	if id < 0 || id >= len(t.pieces) || t.kinds[id] == Control {
		return dst
	}
	if t.bpe != nil {
		st.started = true
		switch t.kinds[id] {
		case Unknown, Unused:
			return dst
		case Byte:
			b, _ := parseByte(t.pieces[id])
			return append(dst, b)
		case UserDefined:
			return append(dst, t.pieces[id]...)
		}
		return appendBPEPiece(dst, t.pieces[id])
	}
	n := len(dst)
	if t.kinds[id] == Byte {
		b, _ := parseByte(t.pieces[id])
		dst = append(dst, b)
	} else {
		p := t.pieces[id]
		for {
			i := strings.Index(p, Space)
			if i < 0 {
				break
			}
			dst = append(append(dst, p[:i]...), ' ')
			p = p[i+len(Space):]
		}
		dst = append(dst, p...)
	}
	if !st.started && t.AddSpacePrefix && len(dst) > n && dst[n] == ' ' {
		dst = append(dst[:n], dst[n+1:]...)
	}
	st.started = true
	return dst
}
