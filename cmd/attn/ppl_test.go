package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// modelFixture is a tiny random model saved as GGUF (with its tokenizer)
// and as a llama2.c checkpoint with tokenizer.bin, and a text file.
type modelFixture struct {
	dir, gguf, llama2c, text string
	w                        *model.Weights
	tok                      *tokenizer.Tokenizer
}

func newModelFixture(t *testing.T) modelFixture {
	t.Helper()
	dir := t.TempDir()
	pieces := []string{"<unk>", "<s>", "</s>"}
	for b := range 256 {
		pieces = append(pieces, fmt.Sprintf("<0x%02X>", b))
	}
	words := []string{"▁", "t", "h", "e", "a", "c", "s", "o", "n", "th", "▁the", "▁a", "at", "▁c", "▁cat", "▁s", "on", "▁on"}
	pieces = append(pieces, words...)
	scores := make([]float32, len(pieces))
	for i := range scores {
		scores[i] = -float32(i)
	}
	tok, err := tokenizer.New(pieces, scores, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := model.Config{Dim: 48, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, Vocab: len(pieces), SeqLen: 32, TiedOutput: true}
	w, err := model.RandomWeights(cfg, 5)
	if err != nil {
		t.Fatal(err)
	}
	f := modelFixture{dir: dir, w: w, tok: tok,
		gguf: filepath.Join(dir, "m.gguf"), llama2c: filepath.Join(dir, "m.bin"), text: filepath.Join(dir, "t.txt")}
	var g, c, tb bytes.Buffer
	if err := model.WriteGGUF(&g, w, tok, gguf.F32, "fixture"); err != nil {
		t.Fatal(err)
	}
	if err := model.WriteLlama2C(&c, w); err != nil {
		t.Fatal(err)
	}
	if err := tok.WriteLlama2C(&tb); err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("the cat sat on the mat; a cat at the ocean. ", 4) + "ünïcode ✓\n"
	for path, b := range map[string][]byte{f.gguf: g.Bytes(), f.llama2c: c.Bytes(),
		filepath.Join(dir, "tokenizer.bin"): tb.Bytes(), f.text: []byte(text)} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// modelCmd runs one of the model commands in-process.
func modelCmd(t *testing.T, cmd func(context.Context, []string, io.Writer, io.Writer) error, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := cmd(context.Background(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestPPLCommand(t *testing.T) {
	f := newModelFixture(t)
	out := filepath.Join(f.dir, "out")
	stdout, stderr, err := modelCmd(t, cmdPPL, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-stride", "10", "-out", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"perplexity", "bits/char", "windows of 24 tokens, stride 10", "m.gguf"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	var res pplJSON
	b, err := os.ReadFile(filepath.Join(out, "ppl.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	// The same as the library's result on the same tokens.
	m, _ := model.New(f.w, model.Options{})
	text, _ := os.ReadFile(f.text)
	tokens := f.tok.Encode(string(text), true)
	r, err := model.Perplexity(context.Background(), m, tokens, model.PerplexityOptions{Context: 24, Stride: 10})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(res.Perplexity-r.PPL()) > 1e-9*r.PPL() || res.Tokens != len(tokens)-1 || res.Chars != len([]rune(string(text))) {
		t.Errorf("ppl.json %+v; library PPL %v over %d tokens", res, r.PPL(), len(tokens)-1)
	}
	if !(res.BitsPerChar > 0) || math.IsInf(res.BitsPerChar, 0) {
		t.Errorf("bits/char %v", res.BitsPerChar)
	}

	// The llama2.c checkpoint with tokenizer.bin beside it scores the same.
	out2 := filepath.Join(f.dir, "out2")
	if _, stderr, err := modelCmd(t, cmdPPL, "-model", f.llama2c, "-text", f.text, "-ctx", "24", "-stride", "10", "-out", out2); err != nil {
		t.Fatalf("llama2.c: %v\n%s", err, stderr)
	}
	var res2 pplJSON
	b, _ = os.ReadFile(filepath.Join(out2, "ppl.json"))
	json.Unmarshal(b, &res2)
	if res2.Perplexity != res.Perplexity {
		t.Errorf("llama2.c perplexity %v, GGUF %v", res2.Perplexity, res.Perplexity)
	}

	// -patch exact changes nothing; a performer patch has a KL and an error
	// on its layer only.
	for _, c := range []struct {
		patch string
		kl    bool
	}{{"exact", false}, {"performer:layers=1,features=8,min=0", true}} {
		dir := filepath.Join(f.dir, "p"+fmt.Sprint(c.kl))
		stdout, stderr, err := modelCmd(t, cmdPPL, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-patch", c.patch, "-out", dir, "-tokens", "50")
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.patch, err, stderr)
		}
		var pr pplJSON
		b, _ = os.ReadFile(filepath.Join(dir, "ppl.json"))
		json.Unmarshal(b, &pr)
		if pr.Tokens != 49 || len(pr.LayerRelErrs) != 2 || !strings.Contains(stdout, "rel. error") {
			t.Fatalf("%s: %+v\n%s", c.patch, pr, stdout)
		}
		if !c.kl && (pr.MeanKL != 0 || pr.PatchedPPL != pr.Perplexity || pr.LayerRelErrs[1].RelErr != 0) {
			t.Errorf("exact patch changed something: %+v", pr)
		}
		if c.kl && (!(pr.MeanKL > 0) || pr.LayerRelErrs[0].RelErr != 0 || !(pr.LayerRelErrs[1].RelErr > 0)) {
			t.Errorf("performer patch: %+v", pr)
		}
	}
	// -decode scores what whole windows score, within float32; an int4
	// cache, used only in decoding, moves the patched model's scores.
	dec := filepath.Join(f.dir, "dec")
	if _, stderr, err := modelCmd(t, cmdPPL, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-stride", "10", "-decode", "-out", dec); err != nil {
		t.Fatalf("-decode: %v\n%s", err, stderr)
	}
	var dr pplJSON
	b, _ = os.ReadFile(filepath.Join(dec, "ppl.json"))
	json.Unmarshal(b, &dr)
	if !dr.Decode || dr.Tokens != res.Tokens || math.Abs(dr.Perplexity-res.Perplexity) > 1e-5*res.Perplexity {
		t.Errorf("-decode: %+v, whole windows %v", dr, res.Perplexity)
	}
	stdout, stderr, err = modelCmd(t, cmdPPL, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-stride", "10", "-decode", "-cache", "i4+rot", "-out", dec)
	if err != nil {
		t.Fatalf("-cache i4+rot: %v\n%s", err, stderr)
	}
	b, _ = os.ReadFile(filepath.Join(dec, "ppl.json"))
	dr = pplJSON{}
	json.Unmarshal(b, &dr)
	if dr.Cache != "i4+rot" || math.Abs(dr.Perplexity-res.Perplexity) > 1e-6*res.Perplexity || !(dr.MeanKL > 0) || dr.PatchedPPL == dr.Perplexity || strings.Contains(stdout, "rel. error") {
		t.Errorf("-cache i4+rot: %+v, exact %v\n%s", dr, res.Perplexity, stdout)
	}
	// Quest approximates only in decoding: whole windows say it ran
	// exact attention, -decode with a budget below the cache does not.
	for _, c := range []struct {
		decode   bool
		fallback bool
	}{{false, true}, {true, false}} {
		args := []string{"-model", f.gguf, "-text", f.text, "-ctx", "32", "-patch", "quest:page=4,budget=4,sinks=1,recent=4"}
		if c.decode {
			args = append(args, "-decode")
		}
		_, stderr, err := modelCmd(t, cmdPPL, args...)
		if err != nil || strings.Contains(stderr, "ran exact attention") != c.fallback {
			t.Errorf("quest, -decode %v: fallback noted %v, want %v (%v)\n%s", c.decode, !c.fallback, c.fallback, err, stderr)
		}
	}
	for _, args := range [][]string{
		{"-model", f.gguf, "-text", f.text, "-cache", "i4"},            // a cache without -decode
		{"-model", f.gguf, "-text", f.text, "-decode", "-cache", "i3"}, // no such storage
		{"-tokenizer", f.gguf, "-text", f.text},                        // a tokenizer for the embedded model
		{"-model", f.gguf, "-text", f.text, "-ctx", "1"},
		{"-model", f.gguf, "-text", f.text, "-patch", "nosuch"},
		{"-model", f.gguf, "-text", f.text, "-patch", "exact:layers=5"},
		{"-model", f.gguf, "-text", f.text, "-patch", "linformer"},
		{"-model", f.gguf, "-text", f.text, "-stride", "-1"},
		{"-model", f.gguf, "-text", f.text, "-ctx", "8", "-stride", "9"},
		{"-model", f.text, "-text", f.text},
		{"-model", f.gguf, "-text", filepath.Join(f.dir, "nosuch")},
	} {
		if _, _, err := modelCmd(t, cmdPPL, args...); err == nil {
			t.Errorf("ppl %v: no error", args)
		}
	}
}

// TestPPLDefaultModel runs ppl without -model: the embedded model.
func TestPPLDefaultModel(t *testing.T) {
	f := newModelFixture(t)
	out, _, err := modelCmd(t, cmdPPL, "-text", f.text, "-tokens", "40")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "austen (embedded)") || !strings.Contains(out, "context 2048") {
		t.Errorf("ppl without -model does not describe the embedded model:\n%s", out)
	}
}
