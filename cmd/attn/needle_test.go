package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/attnkit/attn/cmd/needle"
)

// TestNeedleCommand runs the needle test on the fixture model with its own
// text as the haystack: the table, needle.json and the heat maps appear,
// one row per mechanism, length and depth.
func TestNeedleCommand(t *testing.T) {
	f := newModelFixture(t)
	hay := filepath.Join(f.dir, "hay.txt")
	if err := os.WriteFile(hay, []byte(strings.Repeat("the cat sat on the mat and the cat ate. ", 80)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(f.dir, "needle")
	stdout, stderr, err := modelCmd(t, cmdNeedle, "-model", f.gguf, "-text", hay, "-n", "200,256", "-depths", "0,1",
		"-trials", "2", "-mech", "exact,window", "-out", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"exact", "window", "200", "256", "s/answer"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	res := readNeedleJSON(t, out)
	if len(res.Rows) != 2*2*2 {
		t.Errorf("%d rows, want 8 (2 mechanisms × 2 lengths × 2 depths)", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.Trials != 2 || r.Accuracy < 0 || r.Accuracy > 1 {
			t.Errorf("row %+v", r)
		}
	}
	for _, name := range []string{"needle-exact.png", "needle-window.png", "needle-accuracy.png"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Error(err)
		}
	}
	if res.Config.Cache != "f32" {
		t.Errorf("config cache %q, want f32", res.Config.Cache)
	}
	// -cache reaches the models and the record.
	out2 := filepath.Join(f.dir, "needle-i4")
	if _, stderr, err := modelCmd(t, cmdNeedle, "-model", f.gguf, "-text", hay, "-n", "200", "-depths", "1",
		"-trials", "1", "-cache", "i4+rot", "-out", out2); err != nil {
		t.Fatalf("-cache i4+rot: %v\n%s", err, stderr)
	}
	if res2 := readNeedleJSON(t, out2); res2.Config.Cache != "i4+rot" {
		t.Errorf("-cache i4+rot: config cache %q", res2.Config.Cache)
	}
	// Quest with a budget that covers the prompt decodes exactly: its rows
	// and the table say so; with a small budget they do not.
	for _, c := range []struct {
		set      string
		fallback bool
	}{{"quest:page=16", true}, {"quest:page=4,budget=8,recent=4", false}} {
		dir := filepath.Join(f.dir, fmt.Sprint("quest", c.fallback))
		stdout, stderr, err := modelCmd(t, cmdNeedle, "-model", f.gguf, "-text", hay, "-n", "200", "-depths", "1",
			"-trials", "1", "-mech", "quest", "-set", c.set, "-out", dir)
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.set, err, stderr)
		}
		r := readNeedleJSON(t, dir)
		if len(r.Rows) != 1 {
			t.Fatalf("%s: %d rows", c.set, len(r.Rows))
		}
		if got := r.Rows[0].Fallback != ""; got != c.fallback || strings.Contains(stdout, "ran exact attention") != c.fallback {
			t.Errorf("%s: row fallback %q, want one: %v\n%s", c.set, r.Rows[0].Fallback, c.fallback, stdout)
		}
	}
	for _, bad := range [][]string{{"-depths", "2"}, {"-n", "x"}, {"-mech", "nosuch"}, {"-cache", "i3"}} {
		if _, _, err := modelCmd(t, cmdNeedle, append([]string{"-model", f.gguf, "-text", hay}, bad...)...); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// readNeedleJSON reads dir/needle.json.
func readNeedleJSON(t *testing.T, dir string) *needle.Results {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "needle.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := needle.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
