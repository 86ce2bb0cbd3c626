package ref

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*max(1, math.Abs(b)) }

// TestHandComputed checks one softmax worked out on paper.
func TestHandComputed(t *testing.T) {
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 2, D: 2}
	q := []float32{1, 0}
	k := []float32{1, 0, 0, 1}
	v := []float32{1, 2, 3, 4}
	out, lse, err := Attention(s, q, k, v, Spec{Scale: 1})
	if err != nil {
		t.Fatal(err)
	}
	e := math.E
	p0, p1 := e/(e+1), 1/(e+1)
	want := []float64{p0*1 + p1*3, p0*2 + p1*4}
	if !near(out[0], want[0]) || !near(out[1], want[1]) || !near(lse[0], math.Log(e+1)) {
		t.Errorf("out %v lse %v, want %v %v", out, lse, want, math.Log(e+1))
	}
	// A bias of -1 on key 0 makes both logits 0: equal weights.
	out, lse, _ = Attention(s, q, k, v, Spec{Scale: 1, Bias: []float64{-1, 0}})
	if !near(out[0], 2) || !near(out[1], 3) || !near(lse[0], math.Log(2)) {
		t.Errorf("with bias: out %v lse %v", out, lse)
	}
	// Masking key 1 leaves value 0; masking both leaves 0 and -Inf.
	out, lse, _ = Attention(s, q, k, v, Spec{Scale: 1, Mask: []bool{true, false}})
	if !near(out[0], 1) || !near(out[1], 2) || !near(lse[0], 1) {
		t.Errorf("masked: out %v lse %v", out, lse)
	}
	out, lse, _ = Attention(s, q, k, v, Spec{Scale: 1, Bias: []float64{math.Inf(-1), math.Inf(-1)}})
	if out[0] != 0 || out[1] != 0 || !math.IsInf(lse[0], -1) {
		t.Errorf("all masked: out %v lse %v", out, lse)
	}
}

// TestBroadcastAndGQA checks that a per-head mask selects the right head
// and that query head h reads kv head h/(H/Hkv).
func TestBroadcastAndGQA(t *testing.T) {
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 3, M: 5, D: 3}
	rng := rand.New(rand.NewPCG(1, 1))
	q, k, v := Normal(rng, s.QLen()), Normal(rng, s.KVLen()), Normal(rng, s.KVLen())
	full, fullLSE, _ := Attention(s, q, k, v, Spec{})
	perHead := make([]bool, s.B*s.H*s.N*s.M)
	for i := range perHead {
		perHead[i] = true
	}
	same, sameLSE, _ := Attention(s, q, k, v, Spec{Mask: perHead})
	for i := range full {
		if full[i] != same[i] {
			t.Fatal("an all-true mask changed the output")
		}
	}
	for i := range fullLSE {
		if fullLSE[i] != sameLSE[i] {
			t.Fatal("an all-true mask changed the lse")
		}
	}
	// Mask out everything for (b=1, h=3) only.
	for i := range s.N * s.M {
		perHead[((1*s.H+3)*s.N)*s.M+i] = false
	}
	_, lse, _ := Attention(s, q, k, v, Spec{Mask: perHead})
	for row := range s.LSELen() {
		dead := row/(s.N) == 1*s.H+3
		if dead != math.IsInf(lse[row], -1) {
			t.Errorf("row %d: lse %v", row, lse[row])
		}
	}
	// Head 1 and head 0 share kv head 0: with equal queries they agree.
	q2 := append([]float32(nil), q...)
	copy(q2[1*s.N*s.D:2*s.N*s.D], q2[:s.N*s.D])
	out, _, _ := Attention(s, q2, k, v, Spec{})
	for i := range s.N * s.D {
		if out[i] != out[s.N*s.D+i] {
			t.Fatal("heads 0 and 1 of a group disagree on equal queries")
		}
	}
}

func TestMask(t *testing.T) {
	s := attn.Shape{B: 2, H: 1, HKV: 1, N: 2, M: 4, D: 1}
	m := Mask(s, attn.Options{Causal: true, KVLen: []int{4, 2}})
	want := []bool{
		true, true, true, false, // b0 i0: position 2
		true, true, true, true, // b0 i1: position 3
		true, true, false, false, // b1: only 2 valid keys
		true, true, false, false,
	}
	for i := range want {
		if m[i] != want[i] {
			t.Fatalf("mask %v, want %v", m, want)
		}
	}
}

func TestErrors(t *testing.T) {
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 2, M: 3, D: 1}
	q, kv := make([]float32, 2), make([]float32, 3)
	if _, _, err := Attention(s, q[:1], kv, kv, Spec{}); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short q: %v", err)
	}
	if _, _, err := Attention(s, q, kv, kv, Spec{Mask: make([]bool, 5)}); !errors.Is(err, attn.ErrShape) {
		t.Errorf("bad mask length: %v", err)
	}
	if _, _, err := Attention(s, q, kv, kv, Spec{Bias: make([]float64, 7)}); !errors.Is(err, attn.ErrShape) {
		t.Errorf("bad bias length: %v", err)
	}
}

func TestCompare(t *testing.T) {
	if e := RelErr([]float32{1, 2}, []float64{1, 2}); e != 0 {
		t.Errorf("identical: %v", e)
	}
	if e := RelErr([]float32{3, 4}, []float64{0, 0}); e != 5 {
		t.Errorf("against zero: %v", e)
	}
	if e := RelErr([]float32{1, 0}, []float64{0, 1}); !near(e, math.Sqrt2) {
		t.Errorf("known perturbation: %v", e)
	}
	if e := RelErr([]float32{float32(math.NaN())}, []float64{1}); !math.IsInf(e, 1) {
		t.Errorf("NaN: %v", e)
	}
	if e := RelErr([]float32{1}, []float64{1, 2}); !math.IsInf(e, 1) {
		t.Errorf("length mismatch: %v", e)
	}
	inf := float32(math.Inf(-1))
	if _, err := LSEErr([]float32{inf, 1}, []float64{math.Inf(-1), 1}); err != nil {
		t.Errorf("matching -Inf: %v", err)
	}
	if _, err := LSEErr([]float32{0}, []float64{math.Inf(-1)}); err == nil {
		t.Error("finite where -Inf expected")
	}
	if _, err := LSEErr([]float32{inf}, []float64{0}); err == nil {
		t.Error("-Inf where finite expected")
	}
	if _, err := LSEErr([]float32{0}, nil); err == nil {
		t.Error("length mismatch")
	}
}
