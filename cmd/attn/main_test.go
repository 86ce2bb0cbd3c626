package main

import (
	"bytes"
	"context"
	"encoding/json"
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

// attnCmd runs the command in-process and returns its status and output.
func attnCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
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
	rng := rand.New(rand.NewPCG(7, uint64(rand.Int64())))
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
		{[]string{"-set", "x=1", "-q", q, "-k", k, "-v", k, "-o", o}, "unknown parameter"},
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

func TestBenchJSON(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := attnCmd(t, "bench", "-n", "17,40", "-h", "4", "-hkv", "2", "-d", "24", "-reps", "1", "-out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "GFLOP/s") {
		t.Errorf("no table on stdout:\n%s", stdout)
	}
	buf, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res benchResults
	if err := json.Unmarshal(buf, &res); err != nil {
		t.Fatal(err)
	}
	// 2 lengths × causal and not × (ref, exact).
	if len(res.Rows) != 8 {
		t.Fatalf("%d rows, want 8", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.Skipped != "" || r.Seconds <= 0 || r.H != 4 || r.HKV != 2 || r.D != 24 || r.Mode != "prefill" || r.DType != "f32" {
			t.Errorf("row %+v", r)
		}
		if r.Mech == "exact" && (r.RelErr == nil || *r.RelErr > 1e-5) {
			t.Errorf("exact row without a small rel_err: %+v", r)
		}
	}
	// The schema's field names, checked on the raw JSON.
	var raw map[string]any
	json.Unmarshal(buf, &raw)
	row := raw["rows"].([]any)[0].(map[string]any)
	for _, f := range []string{"mode", "mech", "b", "h", "hkv", "n", "m", "d", "causal", "dtype", "params", "seconds", "gflops", "gbps", "extra_bytes", "rel_err", "skipped"} {
		if _, ok := row[f]; !ok {
			t.Errorf("row lacks %q", f)
		}
	}
	for _, f := range []string{"cpu", "threads", "peak_gflops", "dram_gbps"} {
		if _, ok := raw["machine"].(map[string]any)[f]; !ok {
			t.Errorf("machine lacks %q", f)
		}
	}
}

func TestBenchSkipsRef(t *testing.T) {
	code, stdout, stderr := attnCmd(t, "bench", "-n", "64", "-causal", "-reps", "1", "-ref-budget", "0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "skipped: estimated") {
		t.Errorf("ref row not skipped:\n%s", stdout)
	}
}

func TestBenchErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-mech", "nope"}, "unknown mechanism"},
		{[]string{"-mode", "decode"}, "only prefill"},
		{[]string{"-dtype", "bf16"}, "f32 only"},
		{[]string{"-n", "0"}, "outside"},
		{[]string{"-h", "3", "-hkv", "2"}, "not a multiple"},
		{[]string{"-reps", "0"}, "at least 1"},
		{[]string{"-bogus"}, "flag provided but not defined"},
	} {
		code, _, stderr := attnCmd(t, append([]string{"bench"}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("bench %v: exit %d, stderr %q, want %q", c.args, code, stderr, c.want)
		}
	}
	if code, _, _ := attnCmd(t, "frobnicate"); code != 2 {
		t.Errorf("unknown command: exit %d", code)
	}
	if code, _, _ := attnCmd(t); code != 2 {
		t.Errorf("no command: exit %d", code)
	}
}
