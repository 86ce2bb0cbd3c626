package tokenizer

import (
	"container/heap"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/attnkit/attn/ref"
)

// legacyEncode is the SentencePiece encoder as it was before encoding split
// the text where no piece can span: one priority queue over the whole
// string. Encode must give the same ids (TestEncodeMatchesLegacy).
func legacyEncode(t *Tokenizer, text string, bos bool) []int {
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
	type sym struct{ start, end, prev, next int }
	syms := make([]sym, 0, len(s))
	for i := 0; i < len(s); {
		_, n := utf8.DecodeRuneInString(s[i:])
		syms = append(syms, sym{start: i, end: i + n, prev: len(syms) - 1, next: len(syms) + 1})
		i += n
	}
	syms[len(syms)-1].next = -1
	q := make(legacyQueue, 0, len(syms))
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		id, ok := t.index[s[syms[l].start:syms[r].end]]
		if !ok {
			return
		}
		heap.Push(&q, legacyPair{l, r, t.scores[id], syms[r].end - syms[l].start})
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for q.Len() > 0 {
		p := heap.Pop(&q).(legacyPair)
		l, r := &syms[p.left], &syms[p.right]
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

type legacyPair struct {
	left, right int
	score       float32
	size        int
}

type legacyQueue []legacyPair

func (q legacyQueue) Len() int { return len(q) }
func (q legacyQueue) Less(i, j int) bool {
	if q[i].score != q[j].score {
		return q[i].score > q[j].score
	}
	return q[i].left < q[j].left
}
func (q legacyQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *legacyQueue) Push(x any)   { *q = append(*q, x.(legacyPair)) }
func (q *legacyQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	*q = old[:len(old)-1]
	return p
}

// TestEncodeMatchesLegacy checks that splitting the text where no piece
// can span leaves SentencePiece's result as it was, on random vocabularies
// with long random texts (words past linearMax take the queue), on a
// trained vocabulary and, where the corpus is present, on a novel.
func TestEncodeMatchesLegacy(t *testing.T) {
	rng := ref.FreshRNG(t, 2)
	for range 200 {
		tok := randomVocab(t, rng)
		tok.AddSpacePrefix = rng.IntN(2) == 0
		var b strings.Builder
		for range rng.IntN(20) {
			b.WriteString(randomText(rng))
		}
		text := b.String()
		if got, want := tok.Encode(text, true), legacyEncode(tok, text, true); !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, before %v", text, got, want)
		}
	}
	text, lex := zipfCorpus(t)
	tok := mustTrain(t, []string{text}, TrainConfig{Size: 600})
	for _, s := range append(lex[:50], text[:20000], strings.Repeat(" ", 300)+"a"+strings.Repeat("ab", 200)) {
		if got, want := tok.Encode(s, false), legacyEncode(tok, s, false); !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) differs from before", s)
		}
	}
	if testing.Short() {
		return
	}
	novel := austen(t, "persuasion")
	tok = mustTrain(t, []string{austen(t, "northanger")}, TrainConfig{Size: 4096})
	if got, want := tok.Encode(novel, true), legacyEncode(tok, novel, true); !slices.Equal(got, want) {
		t.Fatal("Persuasion encodes differently from before")
	}
}

func TestScoreKeyOrder(t *testing.T) {
	rng := ref.FreshRNG(t, 3)
	xs := []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.Inf(1)), float32(math.Inf(-1)), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, math.MaxFloat32, -math.MaxFloat32}
	for range 1000 {
		xs = append(xs, float32(rng.NormFloat64()*math.Pow(10, float64(rng.IntN(20)-10))))
	}
	for _, a := range xs {
		for _, b := range xs[:40] {
			if (a < b) != (scoreKey(a) < scoreKey(b)) || (a == b) != (scoreKey(a) == scoreKey(b)) {
				t.Fatalf("scoreKey(%g) = %d, scoreKey(%g) = %d", a, scoreKey(a), b, scoreKey(b))
			}
		}
	}
}
