package tokenizer

import (
	"container/heap"
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

// Tokenizer is a SentencePiece-style BPE vocabulary. It is safe for
// concurrent use once made; its exported fields may be set before use.
type Tokenizer struct {
	pieces []string
	scores []float32
	kinds  []Kind
	index  map[string]int32 // Normal and UserDefined pieces
	byteID [256]int32       // the <0xXX> pieces, -1 where missing

	// BOS, EOS and Unknown are the ids of the begin- and end-of-sequence
	// pieces and of the unknown piece, -1 where there is none. New sets
	// them from the pieces <s>, </s> and the first piece of kind Unknown.
	BOS, EOS, Unknown int
	// AddSpacePrefix puts a space in front of a non-empty text before
	// encoding and drops it when decoding (default true).
	AddSpacePrefix bool
}

// New makes a tokenizer from parallel lists of pieces, scores and kinds.
// scores may be nil (all 0); kinds may be nil, and are then inferred:
// <unk> is Unknown, <s> and </s> are Control, <0xXX> is Byte, the rest
// Normal. A piece of kind Byte must be of the form <0xXX>. The tokenizer
// keeps the slices: do not modify them afterwards.
func New(pieces []string, scores []float32, kinds []Kind) (*Tokenizer, error) {
	n := len(pieces)
	if n == 0 {
		return nil, fmt.Errorf("%w: no pieces", ErrFormat)
	}
	if n > 1<<31-1 {
		return nil, fmt.Errorf("%w: %d pieces", ErrFormat, n)
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
		BOS:   -1, EOS: -1, Unknown: -1, AddSpacePrefix: true,
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
		switch k := t.kinds[i]; k {
		case Normal, Undefined, UserDefined:
			if _, dup := t.index[p]; !dup && p != "" {
				t.index[p] = int32(i)
			}
		case Byte:
			b, ok := parseByte(p)
			if !ok {
				return nil, fmt.Errorf("%w: piece %d (%q) is of kind Byte but not <0xXX>", ErrFormat, i, p)
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
			return nil, fmt.Errorf("%w: piece %d (%q) has kind %d", ErrFormat, i, p, k)
		}
	}
	return t, nil
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

// Len returns the number of pieces.
func (t *Tokenizer) Len() int { return len(t.pieces) }

// Piece returns the text of piece id as stored ("▁" for spaces), "" for
// an id out of range.
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

// symbol is a run of the text, text[start:end]; end == start once merged
// into its left neighbour.
type symbol struct {
	start, end int
	prev, next int // -1 at the ends
}

// pair is a candidate merge of symbols left and left's next neighbour,
// valid while their lengths still add up to size.
type pair struct {
	left, right int
	score       float32
	size        int
}

type pairQueue []pair

func (q pairQueue) Len() int { return len(q) }
func (q pairQueue) Less(i, j int) bool {
	if q[i].score != q[j].score {
		return q[i].score > q[j].score
	}
	return q[i].left < q[j].left
}
func (q pairQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *pairQueue) Push(x any)   { *q = append(*q, x.(pair)) }
func (q *pairQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	*q = old[:len(old)-1]
	return p
}

// Encode returns the ids of text, preceded by BOS when bos is true and the
// vocabulary has one.
func (t *Tokenizer) Encode(text string, bos bool) []int {
	var ids []int
	if bos && t.BOS >= 0 {
		ids = append(ids, t.BOS)
	}
	if text == "" {
		return ids
	}
	s := strings.ReplaceAll(text, " ", Space)
	if t.AddSpacePrefix {
		s = Space + s
	}
	syms := make([]symbol, 0, len(s))
	for i := 0; i < len(s); {
		_, n := utf8.DecodeRuneInString(s[i:])
		syms = append(syms, symbol{start: i, end: i + n, prev: len(syms) - 1, next: len(syms) + 1})
		i += n
	}
	syms[len(syms)-1].next = -1

	q := make(pairQueue, 0, len(syms))
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		id, ok := t.index[s[syms[l].start:syms[r].end]]
		if !ok {
			return
		}
		heap.Push(&q, pair{l, r, t.scores[id], syms[r].end - syms[l].start})
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.Len() > 0 {
		p := heap.Pop(&q).(pair)
		l, r := &syms[p.left], &syms[p.right]
		// A pair is stale once either side was merged elsewhere.
		if l.end == l.start || r.end == r.start || r.end-l.start != p.size || l.next != p.right {
			continue
		}
		l.end = r.end
		r.end = r.start
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = p.left
		}
		try(l.prev, p.left)
		try(p.left, l.next)
	}
	for i := 0; i >= 0; i = syms[i].next {
		piece := s[syms[i].start:syms[i].end]
		if id, ok := t.index[piece]; ok {
			ids = append(ids, int(id))
			continue
		}
		// Byte fallback; the space marker stands for a space.
		if piece == Space {
			piece = " "
		}
		for j := range len(piece) {
			b := piece[j]
			switch {
			case t.byteID[b] >= 0:
				ids = append(ids, int(t.byteID[b]))
			case t.Unknown >= 0:
				ids = append(ids, t.Unknown)
			}
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
// "▁" as a space, nothing for control pieces and ids out of range. The
// first piece that is output loses a leading space when AddSpacePrefix is
// set and the stream did not start mid-text.
func (st *Stream) Append(dst []byte, id int) []byte {
	t := st.t
	if id < 0 || id >= len(t.pieces) || t.kinds[id] == Control {
		return dst
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
