package gguf

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/tensorio"
)

func inspectFile(t *testing.T) *File {
	t.Helper()
	tokens := make([]string, 100000)
	for i := range tokens {
		tokens[i] = fmt.Sprint("tok", i)
	}
	q4k := make([]byte, 2*144) // two Q4_K blocks of zeros: all values 0
	kv := []KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "llama.block_count", Value: uint32(16)},
		{Key: "llama.rope.freq_base", Value: float32(500000)},
		{Key: "tokenizer.ggml.add_bos_token", Value: true},
		{Key: "tokenizer.ggml.tokens", Value: tokens},
		{Key: "tokenizer.ggml.scores", Value: make([]float32, 3)},
		{Key: "tokenizer.chat_template", Value: strings.Repeat("{% for m in messages %}é", 400)},
		{Key: "nested", Value: []any{[]int32{1, 2}, []int32{3}}},
	}
	ts := []Tensor{
		{Name: "w", Dims: []uint64{3, 2}, Type: F32, Data: []float32{1, 2, 3, 4, 5, 6}},
		{Name: "q", Dims: []uint64{32, 3}, Type: Q8_0, Data: seqData(96)},
		{Name: "k", Dims: []uint64{256, 2}, Type: Q4_K, Raw: q4k},
		{Name: "iq2", Dims: []uint64{256}, Type: 16, Raw: make([]byte, 66)}, // IQ2_XXS: described, not decoded
	}
	var buf bytes.Buffer
	if err := Write(&buf, kv, ts); err != nil {
		t.Fatal(err)
	}
	f, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func seqData(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%17) - 8
	}
	return x
}

func TestSummary(t *testing.T) {
	f := inspectFile(t)
	var out strings.Builder
	if err := f.Summary(&out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Log("\n" + s)
	flat := strings.Join(strings.Fields(s), " ")
	for _, want := range []string{
		"GGUF version 3, alignment 32, 8 metadata entries, 4 tensors",
		`general.architecture  string         "llama"`,
		"llama.block_count     uint32         16",
		"[string]       [\"tok0\", \"tok1\"",
		"… (100000 in all)]",
		"[float32]      [0, 0, 0]",
		"bytes)",
		"[[int32]]      [[2], [1]]",
		"w     F32      3 x 2                                24              0",
		"q     Q8_0     32 x 3",
		"k     Q4_K     256 x 2                             288",
		"iq2   IQ2_XXS  256                                  66",
	} {
		if !strings.Contains(flat, strings.Join(strings.Fields(want), " ")) {
			t.Errorf("summary lacks %q", want)
		}
	}
	// Abbreviated: 100000 tokens and a 10 kB template take a few lines.
	if len(s) > 3000 {
		t.Errorf("summary of %d bytes", len(s))
	}
	var short errShort
	if err := f.Summary(&short); !errors.Is(err, errFull) {
		t.Errorf("Summary to a failing writer: %v", err)
	}
}

var errFull = errors.New("full")

type errShort struct{ n int }

func (e *errShort) Write(p []byte) (int, error) {
	if e.n += len(p); e.n > 100 {
		return 0, errFull
	}
	return len(p), nil
}

func TestTensorNPY(t *testing.T) {
	f := inspectFile(t)
	for _, name := range []string{"w", "q", "k"} {
		x, err := f.TensorNPY(name)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := f.Tensor(name)
		want := make([]int, len(info.Dims))
		for i, d := range info.Dims {
			want[len(want)-1-i] = int(d)
		}
		data, _ := f.ReadTensor(name)
		if !slices.Equal(x.Shape, want) || !slices.Equal(x.Data, data) {
			t.Errorf("%s: shape %v, want %v", name, x.Shape, want)
		}
		// What numpy would load: the same array.
		var buf bytes.Buffer
		if err := tensorio.WriteNPY(&buf, x); err != nil {
			t.Fatal(err)
		}
		back, err := tensorio.ReadNPY(&buf)
		if err != nil || !slices.Equal(back.Shape, want) || !slices.Equal(back.Data, data) {
			t.Errorf("%s: .npy reads back as %v, %v", name, back, err)
		}
	}
	// Row-major: w's rows are its ne[0] = 3 values.
	if x, _ := f.TensorNPY("w"); !slices.Equal(x.Shape, []int{2, 3}) || x.Data[3] != 4 {
		t.Errorf("w as %v %v", x.Shape, x.Data)
	}
	if _, err := f.TensorNPY("iq2"); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("IQ2_XXS: %v, want ErrUnsupported", err)
	}
	if _, err := f.TensorNPY("nope"); !errors.Is(err, attn.ErrInput) {
		t.Errorf("missing tensor: %v, want ErrInput", err)
	}
}
