package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrainChecks: a run that could only fail or mislead stops with an
// error that says what to change, before any step (and before a batch
// too large for memory is allocated).
func TestTrainChecks(t *testing.T) {
	train, val := trainText(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("the cat sat \xff\xfe on the mat\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	small := []string{"-vocab", "320", "-dim", "32", "-hidden", "48", "-layers", "1", "-heads", "2", "-kv-heads", "1",
		"-steps", "1", "-workers", "1", "-o", filepath.Join(dir, "m.gguf")}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-text", train, "-ctx", "16", "-batch", "2000000000"}, "lower -batch or -ctx"},
		{[]string{"-text", train, "-ctx", "2000000000"}, "too few for one training window"},
		{[]string{"-text", train, "-ctx", "100000"}, "give -ctx"},
		{[]string{"-text", train + "," + bad, "-ctx", "16"}, "not UTF-8"},
		{[]string{"-text", train, "-val", bad, "-ctx", "16"}, "not UTF-8"},
		{[]string{"-text", train, "-val", val, "-ctx", "16", "-workers", "-1"}, "invalid value"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(append([]string{"train"}, small...), c.args...), &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("train %v: exit %d, stderr %q; want it to say %q", c.args, code, stderr.String(), c.want)
		}
		if strings.Contains(stdout.String(), "trained") {
			t.Errorf("train %v trained:\n%s", c.args, stdout.String())
		}
	}
}

// TestTextChecks: the model commands refuse text that is not UTF-8, and
// say so when a window is longer than the model's context or the text.
func TestTextChecks(t *testing.T) {
	f := newModelFixture(t)
	bad := filepath.Join(f.dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("the cat \xc3\x28 sat\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(f.dir, "out")
	for name, cmd := range map[string][]string{
		"ppl":      {"ppl", "-model", f.gguf, "-text", bad},
		"patching": {"patching", "-model", f.gguf, "-text", bad, "-mech", "window", "-layers", "1"},
		"dump":     {"dump", "-model", f.gguf, "-text", bad, "-out", out},
		"needle":   {"needle", "-model", f.gguf, "-text", bad, "-n", "64", "-trials", "1", "-depths", "0"},
	} {
		code, _, stderr := attnCmd(t, cmd...)
		if code != 1 || !strings.Contains(stderr, "UTF-8") {
			t.Errorf("%s of invalid UTF-8: exit %d, stderr %q", name, code, stderr)
		}
	}
	// The fixture's context is 32 tokens, its text about 60.
	code, _, stderr := attnCmd(t, "ppl", "-model", f.gguf, "-text", f.text, "-ctx", "100000")
	if code != 0 || !strings.Contains(stderr, "longer than the model's context of 32") || !strings.Contains(stderr, "fewer than -ctx 100000") {
		t.Errorf("ppl -ctx 100000: exit %d, stderr %q; want notes on the context", code, stderr)
	}
	code, _, stderr = attnCmd(t, "ppl", "-model", f.gguf, "-text", f.text, "-ctx", "16")
	if code != 0 || strings.Contains(stderr, "note:") {
		t.Errorf("ppl -ctx 16: exit %d, stderr %q; want no note", code, stderr)
	}
}
