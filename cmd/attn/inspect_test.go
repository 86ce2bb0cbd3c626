package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn/tensorio"
)

// TestInspectAndTokenize runs both commands on the fixture model: the
// metadata and the tensor table, a tensor written as .npy with its GGUF
// dimensions reversed, and the ids of a text as the tokenizer gives them.
func TestInspectAndTokenize(t *testing.T) {
	f := newModelFixture(t)
	stdout, stderr, err := modelCmd(t, cmdInspect, f.gguf)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"general.architecture", "tokenizer.ggml.tokens", "blk.0.attn_q.weight", "token_embd.weight"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, stdout)
		}
	}
	npy := filepath.Join(f.dir, "q.npy")
	if _, stderr, err := modelCmd(t, cmdInspect, f.gguf, "-tensor", "blk.0.attn_q.weight", "-o", npy); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	tn, err := tensorio.ReadNPYFile(npy)
	if err != nil {
		t.Fatal(err)
	}
	c := f.w.Config
	if !slices.Equal(tn.Shape, []int{c.Dim, c.Dim}) || !slices.Equal(tn.Data, f.w.Layers[0].Wq) {
		t.Errorf("tensor shape %v, equal to the weights: %v", tn.Shape, slices.Equal(tn.Data, f.w.Layers[0].Wq))
	}
	stdout, stderr, err = modelCmd(t, cmdTokenize, "-model", f.gguf, "-prompt", "the cat sat on the mat", "-json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var ids []int
	if err := json.Unmarshal([]byte(stdout), &ids); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	if want := f.tok.Tokenize("the cat sat on the mat", true, true); !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
	for _, bad := range [][]string{{"-model", f.gguf}, {"-prompt", "x"}, {"-model", "/nonexistent", "-prompt", "x"}} {
		if _, _, err := modelCmd(t, cmdTokenize, bad...); err == nil {
			t.Errorf("tokenize %v: no error", bad)
		}
	}
	if _, _, err := modelCmd(t, cmdInspect, f.gguf, "-tensor", "nosuch", "-o", npy); err == nil {
		t.Error("inspect -tensor nosuch: no error")
	}
}
