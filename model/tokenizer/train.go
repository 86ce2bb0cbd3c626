package tokenizer

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"unicode"
	"unicode/utf8"
)

// ErrTrain is wrapped by the errors Train returns for a configuration or
// a corpus it cannot train on.
var ErrTrain = errors.New("tokenizer: cannot train")

// TrainConfig configures Train. A zero field other than Size takes its
// default.
type TrainConfig struct {
	// Size is the number of pieces in the vocabulary, counting <unk>, <s>,
	// </s> and the 256 byte pieces: at least 260, at most MaxVocab.
	Size int
	// MaxPieceLen bounds the length of a piece in characters, "▁"
	// included (default 16, as SentencePiece).
	MaxPieceLen int
	// MinFrequency is the fewest occurrences a pair of pieces needs to be
	// merged (default 2); training stops when no pair has that many.
	MinFrequency int
	// CharacterCoverage is the share of the characters in the texts that
	// the character pieces cover, the most frequent characters first
	// (default 0.9995, as SentencePiece); the rarer ones are left to byte
	// fallback. 1 keeps every character.
	CharacterCoverage float64
}

// Defaults of TrainConfig.
const (
	defaultMaxPieceLen  = 16
	defaultMinFrequency = 2
	defaultCoverage     = 0.9995
)

// numSpecial counts <unk>, <s>, </s> and the byte pieces, which open every
// trained vocabulary.
const numSpecial = 3 + 256

// spaceRune is Space, the marker that Encode puts for a space.
const spaceRune = '\u2581'

// Train learns a BPE vocabulary of c.Size pieces from texts, as
// SentencePiece's BPE trainer does, for Encode to use.
//
// Each text is normalised as Encode does it (spaces to "▁", one "▁" put
// first) and split into words, the units that merges never cross. A word
// starts at every "▁"; a run of other whitespace characters (newline, tab,
// …) is a word of its own, so "\n" may merge with "\n" but never with a
// letter; a word also ends where the Unicode script changes (Latin
// letters, Common punctuation and digits, Han with Hiragana and Katakana,
// …; combining marks go with the character before), so "the" and "," stay
// apart. The words are counted once each, with their frequencies.
//
// The most frequent characters, enough to cover c.CharacterCoverage of the
// characters in the texts, are the first symbols; rarer characters and
// invalid UTF-8 bytes are left to byte fallback and end a word. Then the
// most frequent adjacent pair of symbols is merged into a new piece, ties
// going to the shorter piece and then to the smaller string, over and
// over. Pairs are counted by the piece they form, and a merge is applied
// to a word exactly as Encode would apply it (an index from each piece to
// the words holding a pair that forms it keeps the counts current at a
// cost proportional to the words touched), so that Encode with the
// trained vocabulary splits every word of the texts as training left it.
// No piece is longer than c.MaxPieceLen characters or reads as a special
// piece (<s>, <0x41>).
//
// The vocabulary is <unk> (id 0, Unknown), <s> (1, Control), </s> (2,
// Control), <0x00> to <0xFF> (3 to 258, Byte), then the merged pieces in
// the order they were learned, with scores 0, -1, -2, …, then the
// character pieces, most frequent first, scored below every merge. It is
// made by New, so BOS is 1, EOS is 2 and Unknown is 0. When no pair is
// left that occurs c.MinFrequency times, training stops early and the
// vocabulary has fewer than c.Size pieces: that is not an error. When
// c.Size leaves no room for all the characters coverage asks for, only
// the most frequent ones become pieces.
//
// The result depends only on texts and c. Train runs in one goroutine and
// returns ctx's error once ctx is done (checked every 256 merges and every
// MiB of text). A configuration outside the documented ranges, or texts
// without a character, is an error wrapping ErrTrain.
func Train(ctx context.Context, texts []string, c TrainConfig) (*Tokenizer, error) {
	tr, err := train(ctx, texts, c)
	if err != nil {
		return nil, err
	}
	return tr.tokenizer()
}

// check validates c and fills in its defaults.
func (c TrainConfig) check() (TrainConfig, error) {
	if c.Size < numSpecial+1 || c.Size > MaxVocab {
		return c, fmt.Errorf("%w: size %d outside [%d, %d]", ErrTrain, c.Size, numSpecial+1, MaxVocab)
	}
	if c.MaxPieceLen < 0 || c.MinFrequency < 0 {
		return c, fmt.Errorf("%w: negative MaxPieceLen %d or MinFrequency %d", ErrTrain, c.MaxPieceLen, c.MinFrequency)
	}
	if !(c.CharacterCoverage >= 0 && c.CharacterCoverage <= 1) {
		return c, fmt.Errorf("%w: character coverage %v outside [0, 1]", ErrTrain, c.CharacterCoverage)
	}
	if c.MaxPieceLen == 0 {
		c.MaxPieceLen = defaultMaxPieceLen
	}
	// Lengths are int32, and two are added to test a pair.
	c.MaxPieceLen = min(c.MaxPieceLen, 1<<30)
	if c.MinFrequency == 0 {
		c.MinFrequency = defaultMinFrequency
	}
	if c.CharacterCoverage == 0 {
		c.CharacterCoverage = defaultCoverage
	}
	return c, nil
}

// trainer holds the state of one training run. Symbols are ids into the
// parallel slices strs, runes, rank, ...: the characters first
// (0..numChars-1, most frequent first), then every string that an adjacent
// pair of symbols formed, the candidates for a merge.
type trainer struct {
	maxLen   int32
	numChars int

	strs    []string
	runes   []int32   // length in characters
	rank    []int32   // merge rank of a learned piece, -1 for the rest
	count   []int64   // occurrences as a pair in the words; 0 once learned
	where   [][]int32 // words that have or had a pair forming the candidate
	heapPos []int32   // index in cands, -1 when not there
	dirty   []bool    // count changed during the current merge
	ids     map[string]int32
	// pairs caches the candidate formed by two adjacent symbols (left<<32
	// | right), -1 where the pair may not merge; distinct pairs may form
	// the same candidate ("ab"+"c", "a"+"bc").
	pairs map[uint64]int32

	ascii  [128]int32 // character ids, -1 where the character is not kept
	other  map[rune]int32
	class  []int32 // script class of each character, for splitting words
	spaceI int32   // id of "▁", -1 when not kept

	words []trainWord
	seen  []int32 // the last merge that visited each word

	cands   candidates
	touched []int32 // candidates whose count changed in this merge
	learned []int32 // the merged pieces, in order

	// Scratch for resegment.
	slots []slot
	queue []pending
}

// trainWord is a distinct word of the texts, as its current segmentation.
type trainWord struct {
	syms []int32
	freq int64
}

// train runs Train up to the vocabulary: the trainer it returns holds the
// learned pieces and the words as they were left.
func train(ctx context.Context, texts []string, c TrainConfig) (*trainer, error) {
	c, err := c.check()
	if err != nil {
		return nil, err
	}
	tr := &trainer{
		maxLen: int32(c.MaxPieceLen),
		ids:    make(map[string]int32),
		pairs:  make(map[uint64]int32),
		other:  make(map[rune]int32),
		spaceI: -1,
	}
	if err := tr.chooseChars(ctx, texts, c.CharacterCoverage, c.Size-numSpecial); err != nil {
		return nil, err
	}
	if err := tr.countWords(ctx, texts); err != nil {
		return nil, err
	}
	tr.countPairs()
	if err := tr.merge(ctx, c.Size-numSpecial-tr.numChars, int64(c.MinFrequency)); err != nil {
		return nil, err
	}
	return tr, nil
}

// ctxCheckBytes is how much text is read between checks of the context.
const ctxCheckBytes = 1 << 20

// chooseChars counts the characters of texts and keeps the most frequent
// ones, up to coverage of all and at most limit, as SentencePiece does.
func (tr *trainer) chooseChars(ctx context.Context, texts []string, coverage float64, limit int) error {
	var ascii [128]int64
	other := make(map[rune]int64)
	read := 0
	for _, t := range texts {
		if read += len(t); read >= ctxCheckBytes {
			read = 0
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if t == "" {
			continue
		}
		other[spaceRune]++ // the "▁" Encode puts first
		for i := 0; i < len(t); {
			if b := t[i]; b < utf8.RuneSelf {
				ascii[b]++
				i++
				continue
			}
			r, n := utf8.DecodeRuneInString(t[i:])
			if r != utf8.RuneError || n > 1 {
				other[r]++
			}
			i += n
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	other[spaceRune] += ascii[' ']
	ascii[' '] = 0
	for b, n := range ascii {
		if n > 0 {
			other[rune(b)] = n
		}
	}
	chars := slices.Collect(maps.Keys(other))
	var total int64
	for _, r := range chars {
		total += other[r]
	}
	if total == 0 {
		return fmt.Errorf("%w: no text", ErrTrain)
	}
	slices.SortFunc(chars, func(a, b rune) int {
		if c := cmp.Compare(other[b], other[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	var covered int64
	for i := range tr.ascii {
		tr.ascii[i] = -1
	}
	for _, r := range chars {
		// Coverage is checked before a character is added, as SentencePiece
		// does, so that 1 keeps them all.
		if float64(covered)/float64(total) >= coverage || tr.numChars == limit {
			break
		}
		covered += other[r]
		id := tr.newSymbol(string(r), 1)
		if r < utf8.RuneSelf {
			tr.ascii[r] = id
		} else {
			tr.other[r] = id
		}
		if r == spaceRune {
			tr.spaceI = id
		}
		tr.class = append(tr.class, scriptClass(r))
		tr.numChars++
	}
	return nil
}

// Script classes: a word never holds two different ones. The rest are
// 1 + the index of a script in unicode.Scripts, sorted by name.
const (
	classAny       = 0  // "▁", which starts a word of any script
	classSpace     = -1 // whitespace other than the space
	classInherited = -2 // combining marks: the class of the character before
)

var scriptTables = sync.OnceValues(func() ([]*unicode.RangeTable, int32) {
	names := slices.Sorted(maps.Keys(unicode.Scripts))
	tables := make([]*unicode.RangeTable, len(names))
	han := int32(-1)
	for i, name := range names {
		tables[i] = unicode.Scripts[name]
		if name == "Han" {
			han = int32(i + 1)
		}
	}
	return tables, han
})

// scriptClass returns the class of r for splitting words, following
// SentencePiece: Hiragana, Katakana and the prolonged sound mark count as
// Han, combining marks as the character before them.
func scriptClass(r rune) int32 {
	tables, han := scriptTables()
	switch {
	case r == spaceRune:
		return classAny
	case unicode.IsSpace(r):
		return classSpace
	case r == 0x30FC || unicode.Is(unicode.Hiragana, r) || unicode.Is(unicode.Katakana, r):
		return han
	case unicode.Is(unicode.Inherited, r):
		return classInherited
	}
	for i, t := range tables {
		if unicode.Is(t, r) {
			return int32(i + 1)
		}
	}
	return int32(len(tables) + 1) // unassigned
}

// charID returns the symbol of the character r, -1 where it is not kept.
func (tr *trainer) charID(r rune) int32 {
	if r == ' ' {
		return tr.spaceI
	}
	if r < utf8.RuneSelf {
		return tr.ascii[r]
	}
	if id, ok := tr.other[r]; ok {
		return id
	}
	return -1
}

// countWords splits texts into words and makes each distinct one a
// trainWord of characters.
func (tr *trainer) countWords(ctx context.Context, texts []string) error {
	counts := make(map[string]int64)
	read := 0
	for _, t := range texts {
		if read += len(t); read >= ctxCheckBytes {
			read = 0
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if t != "" {
			tr.split(t, counts)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Sorted, so that the words' order and everything that follows from
	// it does not depend on map iteration.
	keys := slices.Sorted(maps.Keys(counts))
	n := 0
	for _, k := range keys {
		n += utf8.RuneCountInString(k)
	}
	backing := make([]int32, 0, n)
	tr.words = make([]trainWord, len(keys))
	for i, k := range keys {
		start := len(backing)
		for _, r := range k {
			backing = append(backing, tr.charID(r))
		}
		tr.words[i] = trainWord{syms: backing[start:len(backing):len(backing)], freq: counts[k]}
	}
	tr.seen = make([]int32, len(tr.words))
	return nil
}

// split adds the words of text to counts, keyed by their text (with spaces
// for "▁"; a key of a word that starts the text begins with the space
// that Encode puts first). See Train for where words end.
func (tr *trainer) split(text string, counts map[string]int64) {
	start := 0
	prefixed := tr.spaceI >= 0 // the first word holds the "▁" Encode puts first
	cur := int32(classAny)
	flush := func(end int) {
		switch {
		case prefixed:
			counts[" "+text[start:end]]++
		case end > start:
			counts[text[start:end]]++
		}
		prefixed = false
	}
	for i := 0; i < len(text); {
		r, n := rune(text[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRuneInString(text[i:])
		}
		id := int32(-1)
		if r != utf8.RuneError || n > 1 {
			id = tr.charID(r)
		}
		if id < 0 {
			// Rare characters and invalid bytes are left to byte fallback;
			// they end the word and belong to none.
			flush(i)
			start, cur = i+n, classAny
			i += n
			continue
		}
		cls := tr.class[id]
		var cut bool
		switch {
		case r == ' ' || r == spaceRune:
			cut, cls = true, classAny
		case cls == classSpace:
			cut = cur != classSpace
		case cls == classInherited:
			cut = cur == classSpace
			if cut {
				cls = classAny
			} else {
				cls = cur
			}
		default:
			cut = cur == classSpace || cur != classAny && cur != cls
		}
		if cut {
			flush(i)
			start = i
		}
		cur = cls
		i += n
	}
	flush(len(text))
}

// newSymbol adds a symbol or candidate s of n characters.
func (tr *trainer) newSymbol(s string, n int32) int32 {
	id := int32(len(tr.strs))
	tr.strs = append(tr.strs, s)
	tr.runes = append(tr.runes, n)
	tr.rank = append(tr.rank, -1)
	tr.count = append(tr.count, 0)
	tr.where = append(tr.where, nil)
	tr.heapPos = append(tr.heapPos, -1)
	tr.dirty = append(tr.dirty, false)
	tr.ids[s] = id
	return id
}

// pairID returns the candidate that symbols a and b form when merged, -1
// where they may not merge: too long, or reading as a special piece.
func (tr *trainer) pairID(a, b int32) int32 {
	key := uint64(uint32(a))<<32 | uint64(uint32(b))
	if id, ok := tr.pairs[key]; ok {
		return id
	}
	id := int32(-1)
	if n := tr.runes[a] + tr.runes[b]; n <= tr.maxLen {
		s := tr.strs[a] + tr.strs[b]
		// Script splitting keeps "<" apart from letters already; this guards
		// the kinds, as files store them: a piece that reads as <s> or <0x41>
		// would turn into a control or byte piece.
		if inferKind(s) == Normal {
			var ok bool
			if id, ok = tr.ids[s]; !ok {
				id = tr.newSymbol(s, n)
			}
		}
	}
	tr.pairs[key] = id
	return id
}

// addPair counts an occurrence of the pair a, b in word w, freq times.
func (tr *trainer) addPair(w int32, a, b int32, freq int64) {
	id := tr.pairID(a, b)
	if id < 0 || tr.rank[id] >= 0 {
		return
	}
	tr.count[id] += freq
	tr.touch(id)
	if ws := tr.where[id]; len(ws) == 0 || ws[len(ws)-1] != w {
		tr.where[id] = append(ws, w)
	}
}

// removePair undoes addPair (the word stays in the index; it is checked
// when used).
func (tr *trainer) removePair(a, b int32, freq int64) {
	if id := tr.pairID(a, b); id >= 0 && tr.rank[id] < 0 {
		tr.count[id] -= freq
		tr.touch(id)
	}
}

func (tr *trainer) touch(id int32) {
	if !tr.dirty[id] {
		tr.dirty[id] = true
		tr.touched = append(tr.touched, id)
	}
}

// countPairs counts the adjacent pairs of every word and orders the
// candidates.
func (tr *trainer) countPairs() {
	for w, wd := range tr.words {
		for i := 1; i < len(wd.syms); i++ {
			tr.addPair(int32(w), wd.syms[i-1], wd.syms[i], wd.freq)
		}
	}
	tr.cands.tr = tr
	for _, id := range tr.touched {
		tr.dirty[id] = false
		tr.cands.ids = append(tr.cands.ids, id)
		tr.heapPos[id] = int32(len(tr.cands.ids) - 1)
	}
	tr.touched = tr.touched[:0]
	heap.Init(&tr.cands)
}

// ctxCheckMerges is how many merges run between checks of the context.
const ctxCheckMerges = 256

// merge learns up to n pieces, each from the most frequent candidate, as
// long as that one occurs minFreq times.
func (tr *trainer) merge(ctx context.Context, n int, minFreq int64) error {
	for k := range n {
		if k%ctxCheckMerges == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if tr.cands.Len() == 0 {
			break
		}
		best := tr.cands.ids[0]
		if tr.count[best] < minFreq {
			break
		}
		heap.Pop(&tr.cands)
		// Once learned, a piece is no candidate: resegment merges every pair
		// that forms it, at once, as Encode would.
		tr.rank[best] = int32(len(tr.learned))
		tr.count[best] = 0
		tr.learned = append(tr.learned, best)
		stamp := int32(len(tr.learned))
		ws := tr.where[best]
		tr.where[best] = nil
		for _, w := range ws {
			if tr.seen[w] != stamp {
				tr.seen[w] = stamp
				tr.resegment(w, best)
			}
		}
		for _, id := range tr.touched {
			tr.dirty[id] = false
			switch p := tr.heapPos[id]; {
			case tr.rank[id] >= 0:
			case p >= 0 && tr.count[id] == 0:
				heap.Remove(&tr.cands, int(p))
			case p >= 0:
				heap.Fix(&tr.cands, int(p))
			case tr.count[id] > 0:
				heap.Push(&tr.cands, id)
			}
		}
		tr.touched = tr.touched[:0]
	}
	return nil
}

// slot is a symbol of a word being resegmented; a merged right-hand
// symbol is dead (sym -1).
type slot struct{ sym, prev, next int32 }

// pending is a pair of slots that forms a learned piece of rank rank,
// valid while the slots still hold lsym and rsym side by side.
type pending struct{ rank, left, right, lsym, rsym int32 }

// resegment applies the newly learned piece s to word w as Encode would
// with the vocabulary learned so far: w was left where no adjacent pair
// formed a learned piece, so Encode would now merge the pairs forming s,
// the leftmost first, and after each one any pair it makes that forms an
// earlier piece, best rank first. (No such pair turned up in 20,000
// small random corpora; following Encode regardless keeps the words as
// Encode splits them by construction.) The pair counts follow.
func (tr *trainer) resegment(w int32, s int32) {
	wd := &tr.words[w]
	syms, freq := wd.syms, wd.freq
	slots := tr.slots[:0]
	q := tr.queue[:0]
	for i, sym := range syms {
		slots = append(slots, slot{sym, int32(i - 1), int32(i + 1)})
		if i > 0 && tr.pairID(syms[i-1], sym) == s {
			q = pushPending(q, pending{tr.rank[s], int32(i - 1), int32(i), syms[i-1], sym})
		}
	}
	if len(q) == 0 {
		tr.slots, tr.queue = slots, q
		return // the word lost its pair to an earlier merge
	}
	slots[len(slots)-1].next = -1
	for len(q) > 0 {
		var m pending
		m, q = popPending(q)
		l, r := &slots[m.left], &slots[m.right]
		if l.sym != m.lsym || r.sym != m.rsym || l.next != m.right {
			continue // a neighbour was merged first
		}
		p, nx := l.prev, r.next
		if p >= 0 {
			tr.removePair(slots[p].sym, l.sym, freq)
		}
		if nx >= 0 {
			tr.removePair(r.sym, slots[nx].sym, freq)
		}
		l.sym = tr.pairID(l.sym, r.sym)
		l.next = nx
		r.sym = -1
		if nx >= 0 {
			slots[nx].prev = m.left
		}
		for _, pr := range [2][2]int32{{p, m.left}, {m.left, nx}} {
			if pr[0] < 0 || pr[1] < 0 {
				continue
			}
			a, b := slots[pr[0]].sym, slots[pr[1]].sym
			if id := tr.pairID(a, b); id >= 0 && tr.rank[id] >= 0 {
				q = pushPending(q, pending{tr.rank[id], pr[0], pr[1], a, b})
			} else {
				tr.addPair(w, a, b, freq)
			}
		}
	}
	n := 0
	for i := int32(0); i >= 0; i = slots[i].next {
		syms[n] = slots[i].sym
		n++
	}
	wd.syms = syms[:n]
	tr.slots, tr.queue = slots, q
}

// pendingLess orders pending merges as Encode pops them: the best rank
// (highest score), then the leftmost.
func pendingLess(a, b pending) bool {
	return a.rank < b.rank || a.rank == b.rank && a.left < b.left
}

func pushPending(q []pending, m pending) []pending {
	q = append(q, m)
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !pendingLess(q[i], q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
	return q
}

func popPending(q []pending) (pending, []pending) {
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		c := 2*i + 1
		if c >= len(q) {
			break
		}
		if c+1 < len(q) && pendingLess(q[c+1], q[c]) {
			c++
		}
		if !pendingLess(q[c], q[i]) {
			break
		}
		q[i], q[c] = q[c], q[i]
		i = c
	}
	return top, q
}

// candidates is a heap of candidate ids, the next merge on top: the most
// frequent, then the shortest, then the smallest string, as SentencePiece
// picks.
type candidates struct {
	tr  *trainer
	ids []int32
}

func (h *candidates) Len() int { return len(h.ids) }

func (h *candidates) Less(i, j int) bool {
	tr, a, b := h.tr, h.ids[i], h.ids[j]
	if tr.count[a] != tr.count[b] {
		return tr.count[a] > tr.count[b]
	}
	if tr.runes[a] != tr.runes[b] {
		return tr.runes[a] < tr.runes[b]
	}
	return tr.strs[a] < tr.strs[b]
}

func (h *candidates) Swap(i, j int) {
	h.ids[i], h.ids[j] = h.ids[j], h.ids[i]
	h.tr.heapPos[h.ids[i]] = int32(i)
	h.tr.heapPos[h.ids[j]] = int32(j)
}

func (h *candidates) Push(x any) {
	id := x.(int32)
	h.tr.heapPos[id] = int32(len(h.ids))
	h.ids = append(h.ids, id)
}

func (h *candidates) Pop() any {
	id := h.ids[len(h.ids)-1]
	h.ids = h.ids[:len(h.ids)-1]
	h.tr.heapPos[id] = -1
	return id
}

// tokenizer lays out the vocabulary (see Train).
func (tr *trainer) tokenizer() (*Tokenizer, error) {
	n := numSpecial + len(tr.learned) + tr.numChars
	pieces := make([]string, 0, n)
	scores := make([]float32, 0, n)
	kinds := make([]Kind, 0, n)
	pieces = append(pieces, "<unk>", "<s>", "</s>")
	scores = append(scores, 0, 0, 0)
	kinds = append(kinds, Unknown, Control, Control)
	for b := range 256 {
		pieces = append(pieces, fmt.Sprintf("<0x%02X>", b))
		scores = append(scores, 0)
		kinds = append(kinds, Byte)
	}
	// Scores are exact in float32 up to 2^24 = MaxVocab pieces.
	for i, id := range tr.learned {
		pieces = append(pieces, tr.strs[id])
		scores = append(scores, -float32(i))
		kinds = append(kinds, Normal)
	}
	for id := range tr.numChars {
		pieces = append(pieces, tr.strs[id])
		scores = append(scores, -float32(len(tr.learned)+id))
		kinds = append(kinds, Normal)
	}
	return New(pieces, scores, kinds)
}
