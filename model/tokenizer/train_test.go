package tokenizer

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// makeLexicon returns n distinct made-up lowercase words of 2 to 9
// letters.
func makeLexicon(rng *rand.Rand, n int) []string {
	const letters = "etaoinshrdlcumwfgypbvk"
	seen := map[string]bool{}
	var lex []string
	for len(lex) < n {
		b := make([]byte, 2+rng.IntN(8))
		for i := range b {
			b[i] = letters[rng.IntN(len(letters))]
		}
		if w := string(b); !seen[w] {
			seen[w] = true
			lex = append(lex, w)
		}
	}
	return lex
}

// zipfText draws words from lex by a Zipf law (lex[0] the most frequent)
// into lines of 4 to 15 words, with some commas and full stops.
func zipfText(rng *rand.Rand, lex []string, words int) string {
	z := rand.NewZipf(rng, 1.1, 1, uint64(len(lex)-1))
	var b strings.Builder
	for i := 0; i < words; {
		line := 4 + rng.IntN(12)
		for j := 0; j < line && i < words; j, i = j+1, i+1 {
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(lex[z.Uint64()])
			switch rng.IntN(20) {
			case 0:
				b.WriteByte(',')
			case 1:
				b.WriteByte('.')
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// zipfCorpus is a training text of 60,000 words from a lexicon of 300,
// and the lexicon.
func zipfCorpus(t testing.TB) (string, []string) {
	rng := rand.New(rand.NewPCG(7, 8))
	lex := makeLexicon(rng, 300)
	return zipfText(rng, lex, 60000), lex
}

func mustTrain(t testing.TB, texts []string, c TrainConfig) *Tokenizer {
	t.Helper()
	tok, err := Train(context.Background(), texts, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestTrainVocabulary(t *testing.T) {
	text, lex := zipfCorpus(t)
	rng := rand.New(rand.NewPCG(9, 10))
	heldOut := zipfText(rng, lex, 2000) +
		"  two  spaces\n\n\ttab, 日本語 naïve € \x00 \xff\xfe end "
	prev := len(text)
	for _, size := range []int{300, 400, 600, 1000} {
		tok := mustTrain(t, []string{text}, TrainConfig{Size: size})
		if tok.Len() != size {
			t.Fatalf("size %d: %d pieces", size, tok.Len())
		}
		if tok.Unknown != 0 || tok.BOS != 1 || tok.EOS != 2 || tok.Kind(0) != Unknown || tok.Kind(1) != Control || tok.Kind(2) != Control {
			t.Fatalf("size %d: special pieces %q %q %q, ids %d %d %d", size, tok.Piece(0), tok.Piece(1), tok.Piece(2), tok.Unknown, tok.BOS, tok.EOS)
		}
		for b := range 256 {
			if got, ok := parseByte(tok.Piece(3 + b)); !ok || int(got) != b || tok.Kind(3+b) != Byte {
				t.Fatalf("size %d: piece %d is %q, kind %d", size, 3+b, tok.Piece(3+b), tok.Kind(3+b))
			}
		}
		checkPieces(t, tok)

		if back := tok.Decode(tok.Encode(heldOut, true)); back != heldOut {
			t.Fatalf("size %d: held-out text does not come back: %q", size, back)
		}
		// An unseen character falls back to its bytes.
		if got := pieces(tok, tok.Encode("€", false)); !slices.Equal(got, []string{Space, "<0xE2>", "<0x82>", "<0xAC>"}) {
			t.Errorf("size %d: € encodes as %q", size, got)
		}
		// Larger vocabularies compress the training text better (a part of
		// it: Encode of the whole would take most of the test's time).
		n := len(tok.Encode(text[:len(text)/8], false))
		if n >= prev {
			t.Errorf("size %d: %d tokens, not fewer than %d with the smaller vocabulary", size, n, prev)
		}
		prev = n
		if size == 1000 {
			// The most frequent words are whole pieces, after a space.
			for _, w := range lex[:10] {
				if got := pieces(tok, tok.Encode(w, false)); !slices.Equal(got, []string{Space + w}) {
					t.Errorf("frequent word %q encodes as %q", w, got)
				}
			}
		}
	}
}

// checkPieces checks what every trained vocabulary must satisfy: each
// merged piece is two earlier pieces (or characters) joined, scores fall
// strictly, no piece is longer than 16 characters, and no piece joins
// "▁" other than first, whitespace with other characters, or two scripts.
func checkPieces(t *testing.T, tok *Tokenizer) {
	t.Helper()
	ids := map[string]int{}
	for id := numSpecial; id < tok.Len(); id++ {
		ids[tok.Piece(id)] = id
	}
	seen := map[string]bool{}
	for id := numSpecial; id < tok.Len(); id++ {
		p := tok.Piece(id)
		if seen[p] {
			t.Fatalf("piece %q twice", p)
		}
		seen[p] = true
		if tok.Kind(id) != Normal {
			t.Fatalf("piece %d %q of kind %d", id, p, tok.Kind(id))
		}
		if id > numSpecial && tok.Score(id) >= tok.Score(id-1) {
			t.Fatalf("piece %d %q scores %v, piece %d %v", id, p, tok.Score(id), id-1, tok.Score(id-1))
		}
		rs := []rune(p)
		if len(rs) > defaultMaxPieceLen {
			t.Errorf("piece %q longer than %d", p, defaultMaxPieceLen)
		}
		if i := strings.LastIndex(p, Space); i > 0 {
			t.Errorf("piece %q has ▁ inside", p)
		}
		spaces := 0
		for _, r := range rs {
			if unicode.IsSpace(r) {
				spaces++
			}
		}
		if spaces > 0 && spaces < len(rs) {
			t.Errorf("piece %q mixes whitespace with other characters", p)
		}
		if strings.ContainsAny(p, ",.") && strings.ContainsFunc(p, unicode.IsLetter) {
			t.Errorf("piece %q mixes letters and punctuation", p)
		}
		if len(rs) == 1 {
			continue
		}
		// A half is a character (they come last) or an earlier merge.
		earlier := func(h string) bool {
			hid, ok := ids[h]
			return ok && (hid < id || len([]rune(h)) == 1)
		}
		ok := false
		for i := 1; i < len(rs) && !ok; i++ {
			ok = earlier(string(rs[:i])) && earlier(string(rs[i:]))
		}
		if !ok {
			t.Errorf("piece %d %q is not two earlier pieces joined", id, p)
		}
	}
}

// TestTrainMatchesEncode checks the trainer's bookkeeping: every word is
// left as Encode splits it, and the pair counts kept up incrementally are
// those counted afresh.
func TestTrainMatchesEncode(t *testing.T) {
	text, _ := zipfCorpus(t)
	texts := strings.SplitAfter(text[:len(text)/4], "\n")
	texts = append(texts, "naïve café, Œuvre 日本語のテキスト 2024-11-30 x̃y")
	checkMatchesEncode(t, texts)
	// Words over two letters: many overlapping pairs, and merges that
	// make a pair forming an earlier piece, which Encode merges at once.
	rng := rand.New(rand.NewPCG(3, 4))
	texts = texts[:0]
	for range 3000 {
		b := make([]byte, 1+rng.IntN(12))
		for i := range b {
			b[i] = "ab"[rng.IntN(2)]
		}
		texts = append(texts, string(b))
	}
	checkMatchesEncode(t, texts)
}

func checkMatchesEncode(t *testing.T, texts []string) {
	tr, err := train(context.Background(), texts, TrainConfig{Size: 700, MinFrequency: 1, CharacterCoverage: 1})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tr.tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if tok.Len() != 700 {
		t.Fatalf("%d pieces", tok.Len())
	}
	raw := *tok
	raw.AddSpacePrefix = false
	counts := map[int32]int64{}
	for _, w := range tr.words {
		var word strings.Builder
		var want []string
		for i, s := range w.syms {
			word.WriteString(tr.strs[s])
			want = append(want, tr.strs[s])
			if i > 0 {
				if id := tr.pairID(w.syms[i-1], s); id >= 0 {
					counts[id] += w.freq
				}
			}
		}
		if got := pieces(&raw, raw.Encode(word.String(), false)); !slices.Equal(got, want) {
			t.Fatalf("word %q: trained %q, Encode %q", word.String(), want, got)
		}
	}
	for id := range tr.strs {
		if tr.count[id] != counts[int32(id)] {
			t.Errorf("candidate %q counted %d, recounted %d (rank %d)", tr.strs[id], tr.count[id], counts[int32(id)], tr.rank[id])
		}
	}
}

func TestTrainMergeOrder(t *testing.T) {
	// "bc" occurs 4 times and "▁b" 3: bc is learned first, then ▁bc;
	// "ab" (once) is never learned, so Encode splits "abc" as a, bc.
	tok := mustTrain(t, []string{"bc bc bc abc"}, TrainConfig{Size: 1000})
	if got := tok.Pieces()[numSpecial:]; !slices.Equal(got[:2], []string{"bc", Space + "bc"}) {
		t.Fatalf("pieces %q, want bc, ▁bc first", got)
	}
	if got := pieces(tok, tok.Encode("abc bc", false)); !slices.Equal(got, []string{Space, "a", "bc", Space + "bc"}) {
		t.Errorf("Encode(abc bc) = %q", got)
	}
	// Equal counts: the smaller string first ("ab" < "▁a" byte-wise).
	tok = mustTrain(t, []string{"ab ab ab ab abc abc"}, TrainConfig{Size: 1000})
	if got := tok.Pieces()[numSpecial:]; !slices.Equal(got[:3], []string{"ab", Space + "ab", Space + "abc"}) {
		t.Fatalf("pieces %q, want ab, ▁ab, ▁abc first", got)
	}
	if got := pieces(tok, tok.Encode("abc ab", false)); !slices.Equal(got, []string{Space + "abc", Space + "ab"}) {
		t.Errorf("Encode(abc ab) = %q", got)
	}
	// Equal counts, different lengths: the shorter first
	// ("bc" before "aab", though "aab" < "bc").
	tok = mustTrain(t, []string{strings.Repeat("\naab\nbc", 3)}, TrainConfig{Size: 1000})
	if got := tok.Pieces()[numSpecial:]; !slices.Equal(got[:3], []string{"aa", "bc", "aab"}) {
		t.Fatalf("pieces %q, want aa, bc, aab first", got)
	}
	// Overlapping pairs merge leftmost first, as Encode does: a,a,a,b
	// becomes aa,a,b, leaving "ab" to learn (rightmost first would leave
	// "aaa" and "aab").
	tok = mustTrain(t, []string{strings.Repeat("\naaab", 3)}, TrainConfig{Size: 1000})
	if got := tok.Pieces()[numSpecial:]; !slices.Equal(got[:3], []string{"aa", "ab", "aaab"}) {
		t.Fatalf("pieces %q, want aa, ab, aaab first", got)
	}
	// Newlines merge with newlines only.
	tok = mustTrain(t, []string{"a\n\nb\n\nab\n\nab"}, TrainConfig{Size: 1000})
	if got := pieces(tok, tok.Encode("ab\n\nab", false)); !slices.Equal(got, []string{Space, "ab", "\n\n", "ab"}) {
		t.Errorf("Encode(ab\\n\\nab) = %q", got)
	}
}

func TestTrainSmall(t *testing.T) {
	// Nothing left to merge: fewer pieces than asked for.
	tok := mustTrain(t, []string{"ab ab"}, TrainConfig{Size: 1000})
	if got := tok.Pieces()[numSpecial:]; !slices.Equal(got, []string{"ab", Space + "ab", "a", "b", Space}) {
		t.Errorf("pieces %q", got)
	}
	// Room for one character only: the most frequent one.
	text := "aaaa bb a"
	tok = mustTrain(t, []string{text}, TrainConfig{Size: numSpecial + 1})
	if tok.Len() != numSpecial+1 || tok.Piece(numSpecial) != "a" {
		t.Errorf("%d pieces, last %q", tok.Len(), tok.Piece(tok.Len()-1))
	}
	if back := tok.Decode(tok.Encode(text, true)); back != text {
		t.Errorf("Decode(Encode(%q)) = %q", text, back)
	}
	// Pieces never read as special pieces.
	tok = mustTrain(t, slices.Repeat([]string{"<s> </s> <unk> <0x41>"}, 10), TrainConfig{Size: 1000})
	for id := numSpecial; id < tok.Len(); id++ {
		if inferKind(tok.Piece(id)) != Normal {
			t.Errorf("piece %d %q reads as kind %d", id, tok.Piece(id), inferKind(tok.Piece(id)))
		}
	}
}

func TestTrainCoverage(t *testing.T) {
	// ж is 1 character in 15,002: rarer than the 0.05% left out by default.
	text := strings.Repeat("ab ", 5000) + "ж"
	for _, c := range []struct {
		coverage float64
		want     bool
	}{{0, false}, {0.99995, true}, {1, true}} {
		tok := mustTrain(t, []string{text}, TrainConfig{Size: 300, CharacterCoverage: c.coverage})
		if got := slices.Contains(tok.Pieces(), "ж"); got != c.want {
			t.Errorf("coverage %v: ж a piece %v, want %v", c.coverage, got, c.want)
		}
		if back := tok.Decode(tok.Encode(text, true)); back != text {
			t.Errorf("coverage %v: text does not come back", c.coverage)
		}
	}
}

func TestTrainDeterministic(t *testing.T) {
	text, _ := zipfCorpus(t)
	texts := strings.SplitAfter(text, "\n")
	a := mustTrain(t, texts, TrainConfig{Size: 800})
	b := mustTrain(t, texts, TrainConfig{Size: 800})
	if !slices.Equal(a.Pieces(), b.Pieces()) || !slices.Equal(a.Scores(), b.Scores()) || !slices.Equal(a.Kinds(), b.Kinds()) {
		t.Error("two runs differ")
	}
}

func TestTrainErrors(t *testing.T) {
	ok := []string{"some text"}
	for _, c := range []struct {
		texts []string
		cfg   TrainConfig
	}{
		{ok, TrainConfig{}},
		{ok, TrainConfig{Size: numSpecial}},
		{ok, TrainConfig{Size: -1}},
		{ok, TrainConfig{Size: MaxVocab + 1}},
		{ok, TrainConfig{Size: 300, MaxPieceLen: -1}},
		{ok, TrainConfig{Size: 300, MinFrequency: -1}},
		{ok, TrainConfig{Size: 300, CharacterCoverage: 1.5}},
		{ok, TrainConfig{Size: 300, CharacterCoverage: -0.5}},
		{nil, TrainConfig{Size: 300}},
		{[]string{"", ""}, TrainConfig{Size: 300}},
	} {
		if _, err := Train(context.Background(), c.texts, c.cfg); !errors.Is(err, ErrTrain) {
			t.Errorf("Train(%q, %+v): %v, want ErrTrain", c.texts, c.cfg, err)
		}
	}
}

// cancelAfter is a context whose Err reports cancellation from its n+1st
// call on.
type cancelAfter struct {
	context.Context
	n, calls int
}

func (c *cancelAfter) Err() error {
	c.calls++
	if c.calls > c.n {
		return context.Canceled
	}
	return nil
}

func TestTrainCancel(t *testing.T) {
	text, _ := zipfCorpus(t)
	texts := []string{text[:len(text)/2], text[len(text)/2:]}
	cfg := TrainConfig{Size: 1400, MinFrequency: 1}
	// Count the checks of a whole run; there are several in the merges.
	never := &cancelAfter{Context: context.Background(), n: 1 << 30}
	if _, err := Train(never, texts, cfg); err != nil {
		t.Fatal(err)
	}
	if never.calls < 5 {
		t.Fatalf("%d checks of the context", never.calls)
	}
	for n := range never.calls {
		if _, err := Train(&cancelAfter{Context: context.Background(), n: n}, texts, cfg); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled at check %d of %d: %v", n+1, never.calls, err)
		}
	}
}

func FuzzTrain(f *testing.F) {
	for _, s := range []string{"", " ", "hello world\nhello", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "\xff\xfe ab\tab", "日本語 text ̃x", "<s><s></s>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := Train(context.Background(), []string{s, s[:len(s)/2], s}, TrainConfig{Size: 300, MinFrequency: 1})
		if s == "" {
			if !errors.Is(err, ErrTrain) {
				t.Fatalf("empty text: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(s, Space) {
			return // ▁ decodes as a space
		}
		if back := tok.Decode(tok.Encode(s, true)); back != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, back)
		}
	})
}

// austen returns the named novels of ../shared/data/austen (next to the
// repository), concatenated, or skips the test when they are absent.
func austen(t testing.TB, names ...string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Skip(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("repository root not found")
		}
		dir = parent
	}
	dir = filepath.Join(dir, "..", "shared", "data", "austen")
	var b strings.Builder
	for _, name := range names {
		f, err := os.Open(filepath.Join(dir, name+".txt.gz"))
		if errors.Is(err, os.ErrNotExist) {
			t.Skipf("no Austen corpus: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		z, err := gzip.NewReader(f)
		if err == nil {
			_, err = io.Copy(&b, z)
		}
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return b.String()
}

func TestTrainAusten(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	train := austen(t, "northanger")
	test := austen(t, "persuasion")
	tok := mustTrain(t, []string{train}, TrainConfig{Size: 4096})
	if tok.Len() != 4096 {
		t.Fatalf("%d pieces", tok.Len())
	}
	checkPieces(t, tok)
	ids := tok.Encode(test, false)
	perChar := float64(len(ids)) / float64(len([]rune(test)))
	t.Logf("trained on Northanger Abbey: %.3f tokens per character of Persuasion", perChar)
	if perChar >= 0.35 {
		t.Errorf("%.3f tokens per character, want < 0.35", perChar)
	}
	if back := tok.Decode(ids); back != test {
		t.Error("Persuasion does not decode to itself")
	}
}

func BenchmarkTrain(b *testing.B) {
	b.Run("zipf", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 1))
		text := zipfText(rng, makeLexicon(rng, 5000), 200000)
		benchmarkTrain(b, text, 4096)
	})
	b.Run("austen", func(b *testing.B) {
		text := austen(b, "emma", "mansfield", "northanger", "pride", "sense")
		benchmarkTrain(b, text, 4096)
	})
}

func benchmarkTrain(b *testing.B, text string, size int) {
	b.SetBytes(int64(len(text)))
	var tok *Tokenizer
	for b.Loop() {
		tok = mustTrain(b, []string{text}, TrainConfig{Size: size})
	}
	// Encode takes far longer than Train on megabytes in one string: the
	// metric is of a part.
	part := text[:min(len(text), 1<<18)]
	b.ReportMetric(float64(len(tok.Encode(part, false)))/float64(utf8.RuneCountInString(part)), "tokens/char")
	b.ReportMetric(float64(tok.Len()), "pieces")
}
