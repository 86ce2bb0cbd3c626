package main

import (
	"fmt"
	"strings"
	"testing"
)

func TestGenerateCommand(t *testing.T) {
	f := newModelFixture(t)
	run := func(args ...string) (string, string) {
		t.Helper()
		stdout, stderr, err := modelCmd(t, cmdGenerate, args...)
		if err != nil {
			t.Fatalf("generate %v: %v\n%s", args, err, stderr)
		}
		return stdout, stderr
	}
	a, stats := run("-model", f.gguf, "-prompt", "the cat", "-n", "12", "-temp", "0")
	if !strings.HasPrefix(a, "the cat") || !strings.HasSuffix(a, "\n") {
		t.Errorf("output %q does not continue the prompt", a)
	}
	prefill := fmt.Sprintf("prefill: %d tokens", len(f.tok.Encode("the cat", true)))
	for _, want := range []string{prefill, "decode:  12 tokens", "tokens/s", "stopped by length"} {
		if !strings.Contains(stats, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stats)
		}
	}
	// Greedy output is the same for the llama2.c copy and for an exact patch.
	b, _ := run("-model", f.llama2c, "-prompt", "the cat", "-n", "12", "-temp", "0")
	c, _ := run("-model", f.gguf, "-prompt", "the cat", "-n", "12", "-temp", "0", "-patch", "exact:layers=0-1")
	if a != b || a != c {
		t.Errorf("greedy outputs differ: %q, %q, %q", a, b, c)
	}
	// Sampling is reproducible by seed.
	d, _ := run("-model", f.gguf, "-prompt", "a", "-n", "30", "-seed", "3", "-topk", "0", "-temp", "1.5")
	e, _ := run("-model", f.gguf, "-prompt", "a", "-n", "30", "-seed", "3", "-topk", "0", "-temp", "1.5")
	if d != e {
		t.Errorf("same seed, different text: %q, %q", d, e)
	}
	// The context (32) stops generation; a patched model generates too.
	_, stats = run("-model", f.gguf, "-n", "100", "-patch", "linear:layers=1")
	if !strings.Contains(stats, "stopped by context") || !strings.Contains(stats, "patch: linear:layers=1") {
		t.Errorf("stderr:\n%s", stats)
	}
	for _, args := range [][]string{
		{"-tokenizer", f.gguf, "-prompt", "x"}, // a tokenizer for the embedded model
		{"-model", f.gguf, "-n", "-1"},
		{"-model", f.gguf, "-temp", "-1"},
		{"-model", f.gguf, "-topk", "-2"},
		{"-model", f.gguf, "-patch", "linear:layers=1,chunk=0"},
		{"-model", f.gguf, "extra"},
	} {
		if _, _, err := modelCmd(t, cmdGenerate, args...); err == nil {
			t.Errorf("generate %v: no error", args)
		}
	}
}
