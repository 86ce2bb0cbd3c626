package main

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/tensorio"
)

func TestDumpCommand(t *testing.T) {
	f := newModelFixture(t)
	out := filepath.Join(f.dir, "dump")
	stdout, stderr, err := modelCmd(t, cmdDump, "-model", f.gguf, "-text", f.text, "-layer", "1", "-out", out, "-ctx", "27")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "attn accuracy -causal -q") {
		t.Errorf("output:\n%s", stdout)
	}
	read := func(name string) *tensorio.Tensor {
		tt, err := tensorio.ReadNPYFile(filepath.Join(out, name+".npy"))
		if err != nil {
			t.Fatal(err)
		}
		return tt
	}
	q, k, v, o := read("q"), read("k"), read("v"), read("o")
	c := f.w.Config
	if !slices.Equal(q.Shape, []int{1, c.Heads, 27, c.Dim / c.Heads}) || !slices.Equal(k.Shape, []int{1, c.KVHeads, 27, c.Dim / c.Heads}) ||
		!slices.Equal(v.Shape, k.Shape) || !slices.Equal(o.Shape, q.Shape) {
		t.Fatalf("shapes q %v k %v v %v o %v", q.Shape, k.Shape, v.Shape, o.Shape)
	}
	// o is causal attention of q, k, v, as attn run would compute it.
	s := attn.Shape{B: 1, H: c.Heads, HKV: c.KVHeads, N: 27, M: 27, D: c.Dim / c.Heads}
	want, _, err := flash.Attention(context.Background(), s, q.Data, k.Data, v.Data, attn.Options{Causal: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Data, want) {
		t.Error("o.npy is not the causal attention of q, k, v")
	}
	for _, args := range [][]string{
		{"-model", f.gguf, "-text", f.text, "-layer", "2", "-out", out},
		{"-model", f.gguf, "-text", f.text, "-layer", "-1", "-out", out},
		{"-model", f.gguf, "-text", f.text, "-layer", "0"},
		{"-model", f.gguf, "-text", filepath.Join(f.dir, "nosuch"), "-layer", "0", "-out", out},
		{"-model", f.gguf, "-text", f.text, "-ctx", "-3", "-out", out},
	} {
		if _, _, err := modelCmd(t, cmdDump, args...); err == nil {
			t.Errorf("dump %v: no error", args)
		}
	}
}
