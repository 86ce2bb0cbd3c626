package tokenizer

import (
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/attnkit/attn"
)

func TestNewBPEErrors(t *testing.T) {
	for _, c := range []struct {
		pieces []string
		kinds  []Kind
		merges []string
		pre    string
		want   error
	}{
		{nil, nil, nil, "gpt-2", ErrFormat},
		{[]string{"a"}, []Kind{Normal, Normal}, nil, "gpt-2", ErrFormat},
		{[]string{"a"}, []Kind{9}, nil, "gpt-2", ErrFormat},
		{[]string{"a"}, []Kind{Byte}, nil, "gpt-2", ErrFormat},
		{[]string{"a", "b"}, nil, []string{"ab"}, "gpt-2", ErrFormat},
		{[]string{"a", "b"}, nil, []string{" ab"}, "gpt-2", ErrFormat},
		{[]string{"a"}, nil, nil, "tekken", attn.ErrUnsupported},
	} {
		if _, err := NewBPE(c.pieces, c.kinds, c.merges, c.pre); !errors.Is(err, c.want) {
			t.Errorf("NewBPE(%q, %v, %q, %q): %v, want %v", c.pieces, c.kinds, c.merges, c.pre, err, c.want)
		}
	}
	if err := byteVocab(t, "gpt-2", nil, nil).WriteLlama2C(io.Discard); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("WriteLlama2C of byte-level BPE: %v, want ErrUnsupported", err)
	}
	if _, err := New([]string{"a"}, []float32{float32(nan())}, nil); !errors.Is(err, ErrFormat) {
		t.Errorf("New with a NaN score: %v, want ErrFormat", err)
	}
}

func nan() float64 { var z float64; return z / z }

// byteVocab is a byte-level vocabulary of the 256 byte characters and
// extra pieces of the given kinds.
func byteVocab(t *testing.T, pre string, merges []string, extra map[string]Kind) *Tokenizer {
	t.Helper()
	var pieces []string
	var kinds []Kind
	for b := range 256 {
		pieces = append(pieces, byteText[b])
		kinds = append(kinds, Normal)
	}
	for _, m := range merges {
		for i := 1; i < len(m); i++ {
			if m[i] == ' ' {
				pieces = append(pieces, m[:i]+m[i+1:])
				kinds = append(kinds, Normal)
				break
			}
		}
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		pieces = append(pieces, k)
		kinds = append(kinds, extra[k])
	}
	tok, err := NewBPE(pieces, kinds, merges, pre)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestSpecialPieces(t *testing.T) {
	tok := byteVocab(t, "gpt-2", []string{"a b"}, map[string]Kind{"<ctl>": Control, "<user>": UserDefined, "bcd": Control, "ab": Control})
	// "ab" the merge, "ab" the control piece: the control piece is found
	// in the text only with parseSpecial, and the longer "bcd" first, as
	// llama.cpp partitions, although "ab" starts earlier.
	pieces := func(ids []int) []string { return pieces2(tok, ids) }
	for _, c := range []struct {
		text  string
		parse bool
		want  []string
	}{
		{"x<user>y", false, []string{"x", "<user>", "y"}},
		{"x<ctl>y", false, []string{"x", "<", "c", "t", "l", ">", "y"}},
		{"x<ctl>y", true, []string{"x", "<ctl>", "y"}},
		{"xabcd", true, []string{"x", "a", "bcd"}},
		{"ab<ctl><ctl>", true, []string{"ab", "<ctl>", "<ctl>"}},
	} {
		got := pieces(tok.Tokenize(c.text, false, c.parse))
		if !slices.Equal(got, c.want) {
			t.Errorf("Tokenize(%q, parse %v) = %q, want %q", c.text, c.parse, got, c.want)
		}
	}
	// The merged "ab" is the first piece of that text, the control piece.
	if id := tok.Encode("ab", false); len(id) != 1 || tok.Kind(id[0]) != Normal {
		t.Errorf("Encode(ab) = %v", id)
	}
	// Decoding outputs user-defined pieces as they are and skips control.
	if got := tok.Decode(tok.Tokenize("x<user><ctl>y", false, true)); got != "x<user>y" {
		t.Errorf("Decode = %q", got)
	}
}

func TestSpecialPiecesSentencePiece(t *testing.T) {
	tok := testVocab(t, map[string]float32{Space: 0, "a": 0, Space + "a": -1, "<u>": 0})
	// A user-defined piece cuts the text, and the text after it gets the
	// space prefix again, as llama.cpp does.
	kinds := slices.Clone(tok.Kinds())
	for i, p := range tok.Pieces() {
		if p == "<u>" {
			kinds[i] = UserDefined
		}
	}
	tok, err := New(tok.Pieces(), tok.Scores(), kinds)
	if err != nil {
		t.Fatal(err)
	}
	got := pieces(tok, tok.Encode("a<u>a", false))
	if want := []string{Space + "a", "<u>", Space + "a"}; !slices.Equal(got, want) {
		t.Errorf("Encode = %q, want %q", got, want)
	}
	// <s> is control: matched only with parseSpecial.
	got = pieces(tok, tok.Tokenize("<s>a", false, true))
	if want := []string{"<s>", Space + "a"}; !slices.Equal(got, want) {
		t.Errorf("Tokenize = %q, want %q", got, want)
	}
}

func TestAddBOSEOS(t *testing.T) {
	tok := byteVocab(t, "llama-bpe", nil, map[string]Kind{"<bos>": Control, "<eos>": Control})
	if !tok.AddBOS || tok.AddEOS {
		t.Fatalf("llama-bpe: AddBOS %v AddEOS %v, want true false", tok.AddBOS, tok.AddEOS)
	}
	tok.BOS, tok.EOS = 256, 257
	for _, c := range []struct {
		bos, eos, special bool
		want              []int
	}{
		{true, false, true, []int{256, 'x'}},
		{true, true, true, []int{256, 'x', 257}},
		{false, true, true, []int{'x', 257}},
		{true, true, false, []int{'x'}},
	} {
		tok.AddBOS, tok.AddEOS = c.bos, c.eos
		if got := tok.Encode("x", c.special); !slices.Equal(got, c.want) {
			t.Errorf("AddBOS %v AddEOS %v special %v: %v, want %v", c.bos, c.eos, c.special, got, c.want)
		}
	}
	if byteVocab(t, "qwen2", nil, nil).AddBOS {
		t.Error("qwen2 adds BOS")
	}
}
