package experiment

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/attnkit/attn/model"
)

// tinyText is a random model and a text of its vocabulary, windowed.
func tinyText(t *testing.T) (*model.Model, *Text) {
	t.Helper()
	cfg := model.Config{Dim: 32, Hidden: 48, Layers: 3, Heads: 4, KVHeads: 2, Vocab: 40, SeqLen: 64}
	w, err := model.RandomWeights(cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(w, model.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	tokens := []int{1}
	for range 90 {
		tokens = append(tokens, 3+rng.IntN(37))
	}
	return m, NewText("random", tokens, 300, 48, 24)
}

// TestRunPatching runs the patching sweep as a library call: the exact
// model once, each mechanism at each ℓ, ℓ = 0 shared; exact patched in
// gives exact's perplexity; a mechanism that cannot run causal fails its
// curve alone.
func TestRunPatching(t *testing.T) {
	m, text := tinyText(t)
	rec := &recorder{}
	set, err := ParseSettings([]string{"window:left=8"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunPatching(context.Background(), PatchingConfig{Exact: m, ModelName: "tiny", Text: text,
		Mechs: []string{"exact", "window", "linformer"}, Settings: set, Ells: []int{1, 3}, Workers: 1, Seed: 1, Progress: rec})
	if err != nil {
		t.Fatal(err)
	}
	if res.Layers != 3 || res.N != 48 || res.Windows != text.Windows || len(res.Mechanisms) != 3 {
		t.Fatalf("results %+v", res)
	}
	ex, win, lin := res.Mechanisms[0], res.Mechanisms[1], res.Mechanisms[2]
	if len(ex.Points) != 3 || ex.Points[0].Perplexity != res.Exact.Perplexity {
		t.Fatalf("exact curve %+v", ex.Points)
	}
	for _, p := range ex.Points[1:] {
		if d := p.Perplexity/res.Exact.Perplexity - 1; d > 1e-4 || d < -1e-4 {
			t.Errorf("exact patched into %d layers: perplexity %g, want %g", p.Patched, p.Perplexity, res.Exact.Perplexity)
		}
	}
	if !strings.Contains(strings.Join(win.Settings, ","), "left=8") || len(win.Points) != 3 || win.Points[2].Perplexity == res.Exact.Perplexity {
		t.Errorf("window curve %+v %v", win.Settings, win.Points)
	}
	if lin.Error == "" || len(lin.Points) != 1 {
		t.Errorf("linformer: error %q, %d points", lin.Error, len(lin.Points))
	}
	if len(rec.steps) == 0 || rec.steps[len(rec.steps)-1].Forecast < 0 {
		t.Errorf("progress: %+v", rec.steps)
	}
	if _, err := PlanPatching(PatchingConfig{Exact: m, Text: text, Mechs: []string{"window"}, Ells: []int{4}}); err == nil {
		t.Error("ℓ = 4 of 3 layers: no error")
	}
}
