package main

import (
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/registry"
	"github.com/attnkit/attn/tensorio"
)

// TestAccuracy sweeps every registered mechanism's budget on a tiny input
// and checks that each appears, with its swept parameter set to each value.
func TestAccuracy(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := attnCmd(t, "accuracy", "-n", "48", "-heads", "2", "-d", "16", "-seeds", "2", "-probe=false", "-out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	res, _ := readResults(t, dir)
	a := res.Accuracy
	if a == nil || a.N != 48 || a.H != 2 || a.D != 16 || a.Seeds != 2 || a.Input != eval.Gaussian {
		t.Fatalf("accuracy header %+v", a)
	}
	html := readReport(t, dir)
	for _, name := range registry.Names() {
		if name == "exact" {
			continue
		}
		var pts []eval.AccuracyPoint
		for _, p := range a.Points {
			if p.Mech == name {
				pts = append(pts, p)
			}
		}
		if len(pts) == 0 {
			t.Errorf("no accuracy point for %s", name)
			continue
		}
		if !strings.Contains(stdout, name) || !strings.Contains(html, name) {
			t.Errorf("%s missing from the tables or the report", name)
		}
		for _, p := range pts {
			if p.Skipped != "" {
				continue // a value the mechanism rejects at this size; the reason is shown
			}
			if p.RelErr == nil || *p.RelErr < 0 || p.Seeds != 2 || p.RelErrMin == nil || *p.RelErrMin > *p.RelErrMax {
				t.Errorf("%s %s=%d: %+v", name, p.Param, p.Value, p)
			}
			for _, param := range strings.Split(p.Param, ",") {
				if param != "" && p.Params[param] != strconv.Itoa(p.Value) {
					t.Errorf("%s: point %d has %s=%q", name, p.Value, param, p.Params[param])
				}
			}
		}
	}
}

// TestAccuracyExact: exact against itself is exact.
func TestAccuracyExact(t *testing.T) {
	dir := t.TempDir()
	for _, input := range []string{"gaussian", "planted"} {
		code, _, stderr := attnCmd(t, "accuracy", "-mech", "exact", "-input", input, "-n", "40", "-heads", "2", "-d", "8",
			"-causal", "-probe=false", "-out", dir)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		res, _ := readResults(t, dir)
		p := res.Accuracy.Points
		if len(p) != 1 || p[0].RelErr == nil || *p[0].RelErr > 1e-6 || !res.Accuracy.Causal || res.Accuracy.Input != input {
			t.Errorf("%s: exact against exact: %+v", input, p)
		}
	}
}

func TestAccuracyFiles(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(9, 9))
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 24, M: 24, D: 8}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	qp := writeNPY(t, dir, "q.npy", []int{1, 2, 24, 8}, q)
	kp := writeNPY(t, dir, "k.npy", []int{1, 1, 24, 8}, k)
	vp := writeNPY(t, dir, "v.npy", []int{1, 1, 24, 8}, v)
	st := filepath.Join(dir, "qkv.safetensors")
	err := tensorio.WriteSafetensorsFile(st, map[string]*tensorio.Tensor{
		"q": {Shape: []int{1, 2, 24, 8}, Data: q},
		"k": {Shape: []int{1, 1, 24, 8}, Data: k},
		"v": {Shape: []int{1, 1, 24, 8}, Data: v},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-q", qp, "-k", kp, "-v", vp},
		{"-input", st},
	} {
		out := t.TempDir()
		code, _, stderr := attnCmd(t, append([]string{"accuracy", "-mech", "exact", "-seeds", "2", "-probe=false", "-out", out}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		res, _ := readResults(t, out)
		a := res.Accuracy
		if a.N != 24 || a.H != 2 || a.HKV != 1 || a.D != 8 || !strings.Contains(a.Input, "q") {
			t.Errorf("%v: shape or input from the files: %+v", args, a)
		}
	}
}

func TestAccuracyFailingMechanism(t *testing.T) {
	withFakes(t)
	code, stdout, stderr := attnCmd(t, "accuracy", "-mech", "failing,panicky", "-n", "40", "-heads", "1", "-d", "8", "-probe=false")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"failing: n = 40 > 20", "panic: panicky"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

func TestAccuracyErrors(t *testing.T) {
	dir := t.TempDir()
	npy := writeNPY(t, dir, "q.npy", []int{1, 1, 4, 2}, make([]float32, 8))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-mech", "nope"}, "unknown mechanism"},
		{[]string{"-input", npy}, "holds one tensor"},
		{[]string{"-input", "uniform"}, "want gaussian, planted"},
		{[]string{"-q", npy}, "go together"},
		{[]string{"-seeds", "0"}, "want 1 or more"},
		{[]string{"-heads", "3", "-kv-heads", "2"}, "not a multiple"},
		{[]string{"-set", "nosuchparam=1"}, "no selected mechanism"},
		{[]string{"-input", filepath.Join(dir, "missing.safetensors")}, "no such file"},
	} {
		code, _, stderr := attnCmd(t, append([]string{"accuracy", "-mech", "exact", "-n", "16", "-heads", "1", "-d", "8", "-probe=false"}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("accuracy %v: exit %d, stderr %q, want %q", c.args, code, stderr, c.want)
		}
	}
}
