package eval

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

func near(got, want, tol float64) bool {
	return math.Abs(got-want) <= tol*math.Max(1, math.Abs(want))
}

func TestIdenticalIsZero(t *testing.T) {
	s := attn.Shape{B: 2, H: 3, HKV: 1, N: 7, M: 9, D: 5}
	rng := rand.New(rand.NewPCG(1, 2))
	out, lse := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.LSELen())
	lse[4] = float32(math.Inf(-1)) // a row that sees no key
	e, err := Compare(s, out, slices.Clone(out), lse, slices.Clone(lse))
	if err != nil {
		t.Fatal(err)
	}
	if e != (Errors{}) {
		t.Errorf("identical outputs: %+v, want all 0", e)
	}
}

func TestScaledOutput(t *testing.T) {
	// got = (1+ε)·want is off by exactly ε in every relative norm.
	s := attn.Shape{B: 1, H: 2, HKV: 2, N: 11, M: 11, D: 4}
	rng := rand.New(rand.NewPCG(3, 4))
	want := make([]float64, s.QLen())
	for i := range want {
		want[i] = rng.NormFloat64()
	}
	const eps = 0.03
	got := make([]float64, len(want))
	for i, w := range want {
		got[i] = (1 + eps) * w
	}
	e, err := Compare(s, got, want, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]float64{"Rel": e.Rel, "MaxRow": e.MaxRow, "Spectral": e.Spectral} {
		if !near(v, eps, 1e-9) {
			t.Errorf("%s = %.12g, want %g", name, v, eps)
		}
	}
	if !math.IsNaN(e.LSE) || !math.IsNaN(e.LSEMaxAbs) {
		t.Errorf("lse errors without lse: %v %v, want NaN", e.LSE, e.LSEMaxAbs)
	}
}

func TestKnownPerturbation(t *testing.T) {
	// One head, N=3, D=2: rows (3,0), (0,4), (0,0). ‖W‖_F = 5, ‖W‖₂ = 4.
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 3, M: 3, D: 2}
	want := []float64{3, 0, 0, 4, 0, 0}
	// Add (0,1) to row 0: the error is one entry of 1.
	got := []float64{3, 1, 0, 4, 0, 0}
	e, err := Compare(s, got, want, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string][2]float64{
		"Rel":      {e.Rel, 1.0 / 5},
		"MaxRow":   {e.MaxRow, 1.0 / 3},
		"Spectral": {e.Spectral, 1.0 / 4},
	} {
		if !near(c[0], c[1], 1e-12) {
			t.Errorf("%s = %.15g, want %.15g", name, c[0], c[1])
		}
	}
	// A row whose reference is zero counts its absolute error.
	got = []float64{3, 0, 0, 4, 0.5, 0}
	if e := MaxRowErr(got, want, 2); !near(e, 0.5, 1e-12) {
		t.Errorf("MaxRowErr with a zero reference row = %g, want 0.5", e)
	}
}

func TestLSEErr(t *testing.T) {
	inf := math.Inf(-1)
	want := []float64{1, 2, inf}
	rel, abs := LSEErr([]float32{1, 2.5, float32(inf)}, want)
	if !near(rel, 0.5/math.Sqrt(5), 1e-7) || !near(abs, 0.5, 1e-7) {
		t.Errorf("LSEErr = %g, %g; want %g, 0.5", rel, abs, 0.5/math.Sqrt(5))
	}
	for _, got := range [][]float32{
		{1, 2, 0},                              // sees keys where the reference sees none
		{float32(inf), 2, float32(inf)},        // sees none where the reference does
		{1, float32(math.NaN()), float32(inf)}, // NaN
	} {
		if rel, abs := LSEErr(got, want); !math.IsInf(rel, 1) || !math.IsInf(abs, 1) {
			t.Errorf("LSEErr(%v) = %g, %g; want +Inf", got, rel, abs)
		}
	}
}

func TestNonFiniteIsInf(t *testing.T) {
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 2, M: 2, D: 2}
	want := []float32{1, 2, 3, 4}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		got := []float32{1, 2, bad, 4}
		e, err := Compare(s, got, want, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !math.IsInf(e.Rel, 1) || !math.IsInf(e.MaxRow, 1) || !math.IsInf(e.Spectral, 1) {
			t.Errorf("output with %v: %+v, want +Inf", bad, e)
		}
	}
	if _, err := Compare(s, want[:3], want, nil, nil); err == nil {
		t.Error("Compare of a short output: no error")
	}
}

func TestSpectralNorm(t *testing.T) {
	// A rank-one matrix u·vᵀ has norm ‖u‖·‖v‖.
	rng := rand.New(rand.NewPCG(5, 6))
	rows, cols := 100, 16
	u, v := make([]float64, rows), make([]float64, cols)
	for i := range u {
		u[i] = rng.NormFloat64()
	}
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	a := make([]float64, rows*cols)
	for i := range rows {
		for j := range cols {
			a[i*cols+j] = u[i] * v[j]
		}
	}
	nu, nv := math.Sqrt(dot(u, u)), math.Sqrt(dot(v, v))
	if got := SpectralNorm(a, rows, cols); !near(got, nu*nv, 1e-9) {
		t.Errorf("rank one: %g, want %g", got, nu*nv)
	}
	// A diagonal matrix: its largest entry.
	d := []float64{2, 0, 0, 0, -7, 0, 0, 0, 5}
	if got := SpectralNorm(d, 3, 3); !near(got, 7, 1e-9) {
		t.Errorf("diag(2,-7,5): %g, want 7", got)
	}
	if got := SpectralNorm(make([]float32, 6), 2, 3); got != 0 {
		t.Errorf("zero matrix: %g", got)
	}
}

func dot(x, y []float64) float64 {
	s := 0.0
	for i := range x {
		s += x[i] * y[i]
	}
	return s
}

func TestSpectralWorstHead(t *testing.T) {
	// Two heads of I₂; the second is perturbed by 0.1·I₂: error 0.1.
	s := attn.Shape{B: 1, H: 2, HKV: 2, N: 2, M: 2, D: 2}
	want := []float32{1, 0, 0, 1, 1, 0, 0, 1}
	got := []float32{1, 0, 0, 1, 1.1, 0, 0, 1.1}
	e, err := Compare(s, got, want, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !near(e.Spectral, 0.1, 1e-6) {
		t.Errorf("Spectral = %g, want 0.1", e.Spectral)
	}
}

func TestReferenceMatchesCompare(t *testing.T) {
	s := attn.Shape{B: 2, H: 2, HKV: 1, N: 13, M: 13, D: 8}
	rng := rand.New(rand.NewPCG(7, 8))
	want, wantLSE := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.LSELen())
	got, gotLSE := slices.Clone(want), slices.Clone(wantLSE)
	for i := range got {
		got[i] += 0.01 * float32(rng.NormFloat64())
	}
	gotLSE[3] += 0.2
	e1, err := Compare(s, got, want, gotLSE, wantLSE)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReference(s, want, wantLSE)
	if err != nil {
		t.Fatal(err)
	}
	e2, err := r.Compare(got, gotLSE)
	if err != nil {
		t.Fatal(err)
	}
	if e1 != e2 {
		t.Errorf("Compare %+v, Reference.Compare %+v", e1, e2)
	}
	if e1.Rel <= 0 || e1.LSE <= 0 || !near(e1.LSEMaxAbs, 0.2, 1e-5) {
		t.Errorf("errors %+v", e1)
	}
	if _, err := NewReference(s, want[1:], nil); err == nil {
		t.Error("NewReference of a short output: no error")
	}
}
