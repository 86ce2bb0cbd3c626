package main

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/tensorio"
)

// attnCmd runs attn with args in-process and returns its status and
// output. bench and accuracy runs that give a shape (-heads) without
// -input use Gaussian inputs: the default, the model's activations, fixes
// the shape (TestModelInputs tests it).
func attnCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	if len(args) > 0 && (args[0] == "bench" || args[0] == "accuracy") && slices.Contains(args, "-heads") && !slices.Contains(args, "-input") {
		args = append([]string{args[0], "-input", "gaussian"}, args[1:]...)
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func writeNPY(t *testing.T, dir, name string, shape []int, data []float32) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := tensorio.WriteNPYFile(path, &tensorio.Tensor{Shape: shape, Data: data}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRunMatchesReference(t *testing.T) {
	dir := t.TempDir()
	rng := ref.FreshRNG(t, 7)
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 37, M: 53, D: 24}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	qp := writeNPY(t, dir, "q.npy", []int{s.B, s.H, s.N, s.D}, q)
	kp := writeNPY(t, dir, "k.npy", []int{s.B, s.HKV, s.M, s.D}, k)
	vp := writeNPY(t, dir, "v.npy", []int{s.B, s.HKV, s.M, s.D}, v)
	op, lp := filepath.Join(dir, "o.npy"), filepath.Join(dir, "l.npy")
	code, _, stderr := attnCmd(t, "run", "-mech", "exact", "-q", qp, "-k", kp, "-v", vp, "-o", op, "-lse", lp,
		"-causal", "-scale", "0.3", "-kvlen", "50,0", "-workers", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	o := attn.Options{Causal: true, Scale: 0.3, KVLen: []int{50, 0}}
	wantOut, wantLSE, _ := ref.Attention(s, q, k, v, ref.Spec{Scale: 0.3, Mask: ref.Mask(s, o)})
	gotO, err := tensorio.ReadNPYFile(op)
	if err != nil {
		t.Fatal(err)
	}
	gotL, err := tensorio.ReadNPYFile(lp)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{s.B, s.H, s.N, s.D}; !slices.Equal(gotO.Shape, want) {
		t.Errorf("O shape %v, want %v", gotO.Shape, want)
	}
	if want := []int{s.B, s.H, s.N}; !slices.Equal(gotL.Shape, want) {
		t.Errorf("L shape %v, want %v", gotL.Shape, want)
	}
	if e := ref.RelErr(gotO.Data, wantOut); e > 1e-5 {
		t.Errorf("O rel err %.3g", e)
	}
	if e, err := ref.LSEErr(gotL.Data, wantLSE); err != nil || e > 1e-5 {
		t.Errorf("L rel err %.3g %v", e, err)
	}
}

func TestRunSafetensors(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(8, 8))
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 5, M: 6, D: 3}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	path := filepath.Join(dir, "qkv.safetensors")
	err := tensorio.WriteSafetensorsFile(path, map[string]*tensorio.Tensor{
		"q": {Shape: []int{1, 2, 5, 3}, Data: q},
		"k": {Shape: []int{1, 1, 6, 3}, Data: k},
		"v": {Shape: []int{1, 1, 6, 3}, Data: v},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	op := filepath.Join(dir, "o.npy")
	code, _, stderr := attnCmd(t, "run", "-q", path, "-k", path+":k", "-v", path, "-o", op)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, err := tensorio.ReadNPYFile(op)
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := ref.Attention(s, q, k, v, ref.Spec{})
	if e := ref.RelErr(got.Data, want); e > 1e-5 {
		t.Errorf("O rel err %.3g", e)
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	q := writeNPY(t, dir, "q.npy", []int{1, 4, 3, 2}, make([]float32, 24))
	k := writeNPY(t, dir, "k.npy", []int{1, 2, 5, 2}, make([]float32, 20))
	k3 := writeNPY(t, dir, "k3.npy", []int{1, 3, 5, 2}, make([]float32, 30))
	kd := writeNPY(t, dir, "kd.npy", []int{1, 2, 5, 3}, make([]float32, 30))
	flat := writeNPY(t, dir, "flat.npy", []int{24}, make([]float32, 24))
	nan := make([]float32, 24)
	nan[5] = float32(math.NaN())
	qnan := writeNPY(t, dir, "qnan.npy", []int{1, 4, 3, 2}, nan)
	garbage := filepath.Join(dir, "bad.npy")
	os.WriteFile(garbage, []byte("not a numpy file"), 0o644)
	o := filepath.Join(dir, "o.npy")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"-q", q, "-k", k, "-v", k}, "-o is required"},
		{[]string{"-mech", "nope", "-q", q, "-k", k, "-v", k, "-o", o}, "unknown mechanism"},
		{[]string{"-set", "x=1", "-q", q, "-k", k, "-v", k, "-o", o}, "no selected mechanism has a parameter"},
		{[]string{"-q", q, "-k", k3, "-v", k3, "-o", o}, "not a multiple"},
		{[]string{"-q", q, "-k", kd, "-v", kd, "-o", o}, "head size"},
		{[]string{"-q", q, "-k", k, "-v", kd, "-o", o}, "must match"},
		{[]string{"-q", flat, "-k", k, "-v", k, "-o", o}, "4 dimensions"},
		{[]string{"-q", qnan, "-k", k, "-v", k, "-o", o}, "must be finite"},
		{[]string{"-q", garbage, "-k", k, "-v", k, "-o", o}, "bad format"},
		{[]string{"-q", q, "-k", k, "-v", k, "-o", o, "-kvlen", "3,4"}, "key lengths"},
		{[]string{"-q", q, "-k", k, "-v", k, "-o", o, "-kvlen", "9"}, "outside"},
		{[]string{"-q", q + ".txt", "-k", k, "-v", k, "-o", o}, "unknown file type"},
		{[]string{"-q", filepath.Join(dir, "missing.npy"), "-k", k, "-v", k, "-o", o}, "no such file"},
		{[]string{"-q", q, "-k", k, "-v", k, "-o", o, "-scale", "1e300"}, "float32"},
	}
	for _, c := range cases {
		code, _, stderr := attnCmd(t, append([]string{"run"}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("run %v: exit %d, stderr %q, want it to mention %q", c.args, code, stderr, c.want)
		}
	}
}
