package tokenizer

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/attnkit/attn/ref"
)

// cl100k is tiktoken's cl100k_base as a GGUF file would hold it: the
// 100256 ranks as pieces in GPT-2's byte mapping, merges derived from the
// ranks as Hugging Face's tiktoken converter derives them (every split of
// a piece into two pieces, ordered by the piece's rank and then by the
// halves'), and the special tokens as control pieces at their ids, the
// gaps between them unused placeholders. testdata/gen_cl100k.js wrote the
// ranks and the ids tiktoken gives for the test texts.
type cl100k struct {
	pieces []string
	kinds  []Kind
	merges []string
}

var cl100kOnce = sync.OnceValues(func() (*cl100k, error) {
	f, err := os.Open("testdata/cl100k_base.bin.gz")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	r := bufio.NewReader(z)
	var ranks [][]byte
	for {
		n, err := r.ReadByte()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		ranks = append(ranks, b)
	}
	rank := make(map[string]int, len(ranks))
	for i, b := range ranks {
		rank[string(b)] = i
	}
	enc := func(b []byte) string {
		var s strings.Builder
		for _, c := range b {
			s.WriteString(byteText[c])
		}
		return s.String()
	}
	v := &cl100k{}
	for _, b := range ranks {
		v.pieces = append(v.pieces, enc(b))
		v.kinds = append(v.kinds, Normal)
	}
	for _, b := range ranks {
		type split struct{ l, r int }
		var local []split
		for k := 1; k < len(b); k++ {
			l, okl := rank[string(b[:k])]
			r, okr := rank[string(b[k:])]
			if okl && okr {
				local = append(local, split{l, r})
			}
		}
		slices.SortStableFunc(local, func(a, b split) int {
			if a.l != b.l {
				return a.l - b.l
			}
			return a.r - b.r
		})
		for _, s := range local {
			v.merges = append(v.merges, v.pieces[s.l]+" "+v.pieces[s.r])
		}
	}
	specials := map[int]string{100257: "<|endoftext|>", 100258: "<|fim_prefix|>", 100259: "<|fim_middle|>", 100260: "<|fim_suffix|>", 100276: "<|endofprompt|>"}
	for id := len(v.pieces); id <= 100276; id++ {
		if s, ok := specials[id]; ok {
			v.pieces = append(v.pieces, s)
			v.kinds = append(v.kinds, Control)
		} else {
			v.pieces = append(v.pieces, fmt.Sprintf("<|unused_%d|>", id))
			v.kinds = append(v.kinds, Unused)
		}
	}
	return v, nil
})

// withPre is tok with another pre-tokenizer, without building the merge
// rules again.
func withPre(tok *Tokenizer, pre string) *Tokenizer {
	t2, b := *tok, *tok.bpe
	b.pre, b.preName, b.ignoreMerges = preTokenizers[pre], pre, preTokenizers[pre].ignoreMerges
	t2.bpe = &b
	return &t2
}

func cl100kTokenizer(t testing.TB, pre string) *Tokenizer {
	t.Helper()
	v, err := cl100kOnce()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewBPE(v.pieces, v.kinds, v.merges, pre)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type cl100kCase struct {
	Text    string `json:"text"`
	CL100k  []int  `json:"cl100k"`
	GPT2    []int  `json:"gpt2"`
	Qwen2   []int  `json:"qwen2"`
	SmolLM  []int  `json:"smollm"`
	Default []int  `json:"default"`
	Special []int  `json:"special"`
}

func cl100kCases(t testing.TB) []cl100kCase {
	t.Helper()
	b, err := os.ReadFile("testdata/cl100k_expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []cl100kCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	return cases
}

// TestCL100kLlamaBPE encodes English prose, code, numbers, whitespace runs,
// non-Latin scripts and random strings of tricky characters as tiktoken
// does with cl100k_base: llama-bpe is its split, and Llama 3 takes a word
// that is a piece as it is, as tiktoken does.
func TestCL100kLlamaBPE(t *testing.T) {
	tok := cl100kTokenizer(t, "llama-bpe")
	for _, c := range cl100kCases(t) {
		got := tok.Tokenize(c.Text, false, false)
		if !slices.Equal(got, c.CL100k) {
			t.Errorf("%q:\n got %v\nwant %v", c.Text, got, c.CL100k)
		}
		if c.Special != nil {
			if got := tok.Tokenize(c.Text, false, true); !slices.Equal(got, c.Special) {
				t.Errorf("%q with special pieces:\n got %v\nwant %v", c.Text, got, c.Special)
			}
		}
		if back := tok.Decode(got); back != c.Text {
			t.Errorf("Decode(Encode(%q)) = %q", c.Text, back)
		}
	}
}

// TestCL100kOtherSplits checks the other pre-tokenizers on the same
// vocabulary against tiktoken with their expressions (gpt-2, qwen2) or
// against llama.cpp's sequence of expressions split in JavaScript and each
// word encoded by tiktoken (smollm, default). tiktoken takes a word that is
// a piece as it is, so the tokenizers here do too; that merging reaches
// the same pieces is the merge loop's test.
func TestCL100kOtherSplits(t *testing.T) {
	cases := cl100kCases(t)
	base := cl100kTokenizer(t, "llama-bpe")
	for _, pre := range []string{"gpt-2", "qwen2", "smollm", "default"} {
		tok := withPre(base, pre)
		tok.bpe.ignoreMerges = true
		for _, c := range cases {
			want := map[string][]int{"gpt-2": c.GPT2, "qwen2": c.Qwen2, "smollm": c.SmolLM, "default": c.Default}[pre]
			if want == nil {
				continue
			}
			if got := tok.Encode(c.Text, false); !slices.Equal(got, want) {
				t.Errorf("%s %q:\n got %v\nwant %v", pre, c.Text, got, want)
			}
		}
	}
}

// splitWords returns the words splitter s makes of text, and an error
// when they are not contiguous, non-empty and covering.
func splitWords(s splitter, text string) ([]string, error) {
	var w []string
	var err error
	end := 0
	s(text, func(a, b int) {
		if a != end || b <= a || b > len(text) {
			err = fmt.Errorf("word [%d, %d) after %d", a, b, end)
			return
		}
		end = b
		w = append(w, text[a:b])
	})
	if err == nil && end != len(text) {
		err = fmt.Errorf("words end at %d of %d", end, len(text))
	}
	return w, err
}

func TestPreTokenizerSplits(t *testing.T) {
	for _, c := range []struct {
		pre, text string
		want      []string
	}{
		{"llama-bpe", "Hello world", []string{"Hello", " world"}},
		{"llama-bpe", "I'm John's", []string{"I", "'m", " John", "'s"}},
		{"llama-bpe", "IT'S 'ſ", []string{"IT", "'S", " '", "ſ"}},
		// tiktoken folds case as Rust's regex does: ſ is an s (checked
		// with tiktoken on a vocabulary where the split shows).
		{"llama-bpe", "x'ſa x'Sa", []string{"x", "'ſ", "a", " x", "'S", "a"}},
		{"llama-bpe", "1234567", []string{"123", "456", "7"}},
		{"llama-bpe", "a  b", []string{"a", " ", " b"}},
		{"llama-bpe", "a \n\n  b", []string{"a", " \n\n", " ", " b"}},
		{"llama-bpe", "x  ", []string{"x", "  "}},
		{"llama-bpe", "x\t\ty", []string{"x", "\t", "\ty"}},
		{"llama-bpe", "!!\n\nx", []string{"!!\n\n", "x"}},
		{"llama-bpe", " 12", []string{" ", "12"}},
		{"llama-bpe", "$x", []string{"$x"}},
		{"llama-bpe", "\xffab", []string{"\xffab"}},
		{"qwen2", "1234", []string{"1", "2", "3", "4"}},
		{"gpt-2", "I'M here", []string{"I", "'", "M", " here"}},
		{"gpt-2", "a  b", []string{"a", " ", " b"}},
		{"gpt-2", "a\n\nb", []string{"a", "\n", "\n", "b"}},
		{"gpt-2", " 123 !?", []string{" 123", " !?"}},
		{"gpt-2", "x\t\ty  ", []string{"x", "\t", "\t", "y", "  "}},
		{"smollm", "a 123b", []string{"a", " ", "1", "2", "3", "b"}},
		{"default", "x=12345, y", []string{"x", "=", "123", "45", ",", " y"}},
		{"default", "a 1b", []string{"a", " ", "1", "b"}},
	} {
		got, err := splitWords(preTokenizers[c.pre].split, c.text)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s %q: %q (%v), want %q", c.pre, c.text, got, err, c.want)
		}
	}
}

// FuzzBPE encodes arbitrary bytes with every pre-tokenizer on cl100k:
// the words must tile the text, the ids be pieces, and decoding give the
// text back; with special pieces parsed, the text between them must.
func FuzzBPE(f *testing.F) {
	for _, s := range []string{"Hello world", "a  \n\n b", "I'M 123'sſ", "\xff\xfe  x", "\u00a0\u0085 1²", "<|endoftext|>x<|fim_prefix|>"} {
		f.Add(s)
	}
	base := cl100kTokenizer(f, "llama-bpe")
	var toks []*Tokenizer
	for _, name := range []string{"llama-bpe", "qwen2", "smollm", "gpt-2", "default"} {
		toks = append(toks, withPre(base, name))
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range toks {
			if _, err := splitWords(tok.bpe.pre.split, s); err != nil {
				t.Fatalf("%s %q: %v", tok.Pre(), s, err)
			}
			ids := tok.Encode(s, false)
			for _, id := range ids {
				if id < 0 || id >= tok.Len() {
					t.Fatalf("id %d out of range", id)
				}
			}
			if back := tok.Decode(ids); back != s {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", tok.Pre(), s, back)
			}
			var plain strings.Builder
			for _, id := range tok.Tokenize(s, true, true) {
				if tok.Kind(id) == Control {
					plain.WriteString(tok.Piece(id))
				} else {
					plain.WriteString(tok.Decode([]int{id}))
				}
			}
			if plain.String() != s {
				t.Fatalf("%s: pieces of %q with special pieces spell %q", tok.Pre(), s, plain.String())
			}
		}
	})
}

// naiveBPE is llama.cpp's byte-level merge loop on one word, written
// plainly: merge the adjacent pair with the lowest-ranked rule, the
// leftmost on a tie, until none has one.
func naiveBPE(tok *Tokenizer, w string) []string {
	rank := map[[2]string]int{}
	for i, m := range tok.Merges() {
		sp := strings.IndexByte(m[1:], ' ') + 1
		k := [2]string{m[:sp], m[sp+1:]}
		if _, dup := rank[k]; !dup {
			rank[k] = i
		}
	}
	var syms []string
	for i := range len(w) {
		syms = append(syms, byteText[w[i]])
	}
	for {
		best, at := 0, -1
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := rank[[2]string{syms[i], syms[i+1]}]; ok && (at < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			return syms
		}
		syms = append(syms[:at], append([]string{syms[at] + syms[at+1]}, syms[at+2:]...)...)
	}
}

// TestBPEMergeAgainstNaive runs the merge loop, by scan and by queue, on
// random words against naiveBPE with random merge rules over a small
// alphabet, ties of equal pieces included.
func TestBPEMergeAgainstNaive(t *testing.T) {
	rng := ref.FreshRNG(t, 1)
	alpha := []string{"a", "b", "c", "Ġ"}
	for trial := range 200 {
		pieces := slices.Clone(alpha)
		var merges []string
		for range 1 + rng.IntN(25) {
			l, r := pieces[rng.IntN(len(pieces))], pieces[rng.IntN(len(pieces))]
			merges = append(merges, l+" "+r)
			if !slices.Contains(pieces, l+r) {
				pieces = append(pieces, l+r)
			}
		}
		tok, err := NewBPE(pieces, nil, merges, "gpt-2")
		if err != nil {
			t.Fatal(err)
		}
		var w strings.Builder
		n := 1 + rng.IntN(3*linearMax)
		for range n {
			w.WriteByte("abc "[rng.IntN(4)])
		}
		word := w.String()
		want := naiveBPE(tok, word)
		e := encoder{t: tok}
		got := pieces2(tok, e.bpeWord(nil, word))
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d, merges %q, word %q:\n got %q\nwant %q", trial, merges, word, got, want)
		}
	}
}

func pieces2(tok *Tokenizer, ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = tok.Piece(id)
	}
	return out
}

func TestBPEDecodeBytes(t *testing.T) {
	tok := cl100kTokenizer(t, "llama-bpe")
	for _, s := range []string{"\xff\xfe invalid \xc3", "a\x00b\x01", strings.Repeat("\u00e9", 3)} {
		ids := tok.Encode(s, false)
		if back := tok.Decode(ids); back != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, back)
		}
		// A stream gives the same bytes, one piece at a time, even where
		// a character spans pieces.
		st := tok.NewStream(false)
		var b []byte
		for _, id := range ids {
			b = st.Append(b, id)
		}
		if string(b) != s {
			t.Errorf("stream of %q gave %q", s, b)
		}
	}
	if !utf8.ValidString(tok.Decode(tok.Encode("ok", false))) {
		t.Error("invalid")
	}
}
