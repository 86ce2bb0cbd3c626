package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/cmd/experiment"
)

// readPatching reads dir/patching.json.
func readPatching(t *testing.T, dir string) eval.Patching {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "patching.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res eval.Patching
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestPatchingCommand(t *testing.T) {
	f := newModelFixture(t)
	L := f.w.Config.Layers
	out := filepath.Join(f.dir, "out")
	stdout, stderr, err := modelCmd(t, cmdPatching, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-stride", "12", "-out", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"budgets for n = 24", "perplexity as the last ℓ layers", "attention seconds", "hyper", "block=", "m.gguf"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	for _, name := range []string{"patching.md", "patching.png", "patching.svg"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || len(b) < 100 {
			t.Errorf("%s: %d bytes, %v", name, len(b), err)
		}
		switch name {
		case "patching.png":
			if !bytes.HasPrefix(b, []byte("\x89PNG")) {
				t.Errorf("patching.png is not a PNG")
			}
		case "patching.svg":
			if !bytes.Contains(b, []byte("<svg")) {
				t.Errorf("patching.svg is not an SVG")
			}
		case "patching.md":
			if !bytes.Contains(b, []byte("| ℓ | layers | window |")) || !bytes.Contains(b, []byte("![")) {
				t.Errorf("patching.md:\n%s", b)
			}
		}
	}

	// ℓ = 0 is exactly what attn ppl reports for the exact model.
	res := readPatching(t, out)
	pplDir := filepath.Join(f.dir, "ppl")
	if _, stderr, err := modelCmd(t, cmdPPL, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-stride", "12", "-out", pplDir); err != nil {
		t.Fatalf("ppl: %v\n%s", err, stderr)
	}
	var ppl pplJSON
	b, _ := os.ReadFile(filepath.Join(pplDir, "ppl.json"))
	if err := json.Unmarshal(b, &ppl); err != nil {
		t.Fatal(err)
	}
	if res.Exact.Perplexity != ppl.Perplexity || res.Tokens != ppl.Tokens || res.Windows != ppl.Windows {
		t.Errorf("exact perplexity %v over %d tokens, %d windows; attn ppl %v over %d, %d",
			res.Exact.Perplexity, res.Tokens, res.Windows, ppl.Perplexity, ppl.Tokens, ppl.Windows)
	}

	var names []string
	changed := false
	for _, m := range res.Mechanisms {
		names = append(names, m.Name)
		if m.Error != "" || len(m.Points) != L+1 {
			t.Fatalf("%s: %d points, want %d; error %q", m.Name, len(m.Points), L+1, m.Error)
		}
		for ell, p := range m.Points {
			wantLayers := []int{}
			for l := L - ell; l < L; l++ {
				wantLayers = append(wantLayers, l)
			}
			if p.Patched != ell || !slices.Equal(p.Layers, wantLayers) {
				t.Errorf("%s point %d: ℓ=%d, layers %v; want %v", m.Name, ell, p.Patched, p.Layers, wantLayers)
			}
			if !(p.Perplexity > 1) || math.IsInf(p.Perplexity, 0) || !(p.AttnSeconds > 0) || p.AttnSeconds > p.Seconds {
				t.Errorf("%s ℓ=%d: perplexity %v, attention %vs of %vs", m.Name, ell, p.Perplexity, p.AttnSeconds, p.Seconds)
			}
			if ell == 0 && p.Perplexity != res.Exact.Perplexity {
				t.Errorf("%s ℓ=0: %v, exact %v", m.Name, p.Perplexity, res.Exact.Perplexity)
			}
			if ell > 0 && !strings.HasPrefix(p.Patch, m.Name+":layers=") {
				t.Errorf("%s ℓ=%d: patch %q", m.Name, ell, p.Patch)
			}
		}
		changed = changed || m.Points[L].Perplexity != res.Exact.Perplexity
	}
	if !slices.Equal(names, experiment.PatchingMechs) {
		t.Errorf("mechanisms %v, want %v", names, experiment.PatchingMechs)
	}
	if !changed {
		t.Errorf("no mechanism changed the perplexity: the patches did not apply")
	}
}

// A window that covers the whole context is exact attention: every ℓ
// gives exact's perplexity. -layers picks the ℓ that run (0 always does).
func TestPatchingExactWindow(t *testing.T) {
	f := newModelFixture(t)
	out := filepath.Join(f.dir, "out")
	_, stderr, err := modelCmd(t, cmdPatching, "-model", f.gguf, "-text", f.text, "-ctx", "24", "-tokens", "40",
		"-mech", "window", "-set", "window:left=24", "-layers", "2", "-kl", "-out", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	res := readPatching(t, out)
	if len(res.Mechanisms) != 1 || len(res.Mechanisms[0].Points) != 2 {
		t.Fatalf("%+v", res.Mechanisms)
	}
	m := res.Mechanisms[0]
	if !slices.Contains(m.Settings, "left=24") || slices.Contains(m.Settings, "left=3") {
		t.Errorf("settings %v: -set did not replace left", m.Settings)
	}
	for _, p := range m.Points {
		if math.Abs(p.Perplexity-res.Exact.Perplexity) > 1e-4*res.Exact.Perplexity || p.MeanKL > 1e-6 {
			t.Errorf("ℓ=%d: perplexity %v, exact %v; KL %v", p.Patched, p.Perplexity, res.Exact.Perplexity, p.MeanKL)
		}
	}
	if p := m.Points[1]; p.Patched != 2 || len(p.LayerRelErr) != 2 || p.LayerRelErr[1] > 1e-5 {
		t.Errorf("ℓ=2 point %+v", p)
	}
}

func TestPatchingBadFlags(t *testing.T) {
	f := newModelFixture(t)
	base := []string{"-model", f.gguf, "-text", f.text, "-ctx", "24"}
	for _, extra := range [][]string{
		{"-mech", "window,nosuch"},
		{"-mech", "window,window"},
		{"-mech", ","},
		{"-ctx", "-1"},
		{"-ctx", "8", "-stride", "9"},
		{"-tokens", "-2"},
		{"-layers", "3"},
		{"-layers", "2-1"},
		{"-layers", "x"},
		{"-mech", "window", "-set", "hyper:block=4"},
		{"-mech", "window", "-set", "window:layers=1"},
		{"-mech", "window", "-set", "window:nosuch=1"},
		{"-mech", "window", "-set", "window:left=x"},
		{"-mech", "window", "extra"},
	} {
		if _, _, err := modelCmd(t, cmdPatching, append(slices.Clone(base), extra...)...); err == nil {
			t.Errorf("patching %v: no error", extra)
		}
	}
	if _, _, err := modelCmd(t, cmdPatching, "-tokenizer", f.gguf, "-text", f.text); err == nil {
		t.Errorf("patching with -tokenizer but no -model: no error")
	}
}

// Every mechanism of the figure has a budget rule in the registry, so
// that none runs at defaults chosen for other lengths.
func TestScaledBudget(t *testing.T) {
	for _, name := range experiment.PatchingMechs {
		b := experiment.ScaledBudget(name, 2048, 2048)
		if len(b.Settings) == 0 || strings.Contains(b.Rule, "defaults") {
			t.Errorf("%s: no budget rule in the registry: %+v", name, b)
		}
	}
	if b := experiment.ScaledBudget("nosuch", 2048, 2048); b.Settings != nil {
		t.Errorf("unknown mechanism: %+v", b)
	}
}
