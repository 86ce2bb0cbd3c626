package model_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/gguf"
)

// A small model with random weights, its second layer's attention replaced
// by linear attention, generating greedily.
func Example() {
	cfg := model.Config{Dim: 64, Hidden: 128, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 100, SeqLen: 64}
	w, err := model.RandomWeights(cfg, 1)
	if err != nil {
		panic(err)
	}
	patches, err := model.ParsePatch("linear:layers=1")
	if err != nil {
		panic(err)
	}
	m, err := model.New(w, model.Options{Patches: patches, Seed: 7})
	if err != nil {
		panic(err)
	}
	for l := range cfg.Layers {
		fmt.Printf("layer %d: %s\n", l, m.Attention(l))
	}
	smp, _ := model.NewSampler(0, 0, 1) // greedy
	var out []int
	st, err := m.Generate(context.Background(), []int{1, 2, 3}, 8, smp, -1, func(tok int) error {
		out = append(out, tok)
		return nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(out), "tokens generated after a prompt of", st.Prompt, "; stopped by", st.Stop)
	// Output:
	// layer 0: exact
	// layer 1: linear:layers=1
	// 8 tokens generated after a prompt of 3 ; stopped by length
}

// Saving a model as GGUF with 8-bit weights and reading it back.
func ExampleWriteGGUF() {
	cfg := model.Config{Dim: 64, Hidden: 96, Layers: 1, Heads: 2, Vocab: 50, SeqLen: 32, TiedOutput: true}
	w, _ := model.RandomWeights(cfg, 1)
	var buf bytes.Buffer
	if err := model.WriteGGUF(&buf, w, nil, gguf.Q8_0, "tiny"); err != nil {
		panic(err)
	}
	back, tok, err := model.ReadGGUF(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		panic(err)
	}
	c := back.Config
	fmt.Println(c.Dim, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.Vocab, c.SeqLen, c.TiedOutput, tok == nil)
	fmt.Println(back.Params(), "weights")
	// Output:
	// 64 96 1 2 2 50 32 true true
	// 38208 weights
}

func ExampleParsePatch() {
	ps, err := model.ParsePatch("hyper:layers=2-3,block=32,samples=32;performer:layers=0,features=64")
	if err != nil {
		panic(err)
	}
	for _, p := range ps {
		fmt.Println(p.Mechanism, p.Layers, p.Settings)
	}
	// Output:
	// hyper [2 3] [block=32 samples=32]
	// performer [0] [features=64]
}
