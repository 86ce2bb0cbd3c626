package lowbit

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn/ref"
)

// checkRoundTrip checks the codes and scale of a quantised row: every
// value within scale/2 of code·scale (up to the float32 rounding of the
// product and the 2^-52 of the quotient), the largest magnitude at code
// ±127, a finite scale and finite dequantised values.
func checkRoundTrip(t *testing.T, name string, x []float32, q []int8, scale float32) {
	t.Helper()
	var amax float64
	for _, v := range x {
		amax = max(amax, math.Abs(float64(v)))
	}
	if amax == 0 {
		if scale != 0 {
			t.Errorf("%s: zero row has scale %v", name, scale)
		}
		for i, c := range q {
			if c != 0 {
				t.Fatalf("%s: zero row has code %d at %d", name, c, i)
			}
		}
		return
	}
	if !(scale > 0) || math.IsInf(float64(scale), 0) {
		t.Fatalf("%s: scale %v", name, scale)
	}
	// max|x|/127, up to a step of float32 (rounded up, see QuantI8).
	ulp := float64(math.Nextafter32(scale, float32(math.Inf(1))) - scale)
	if want := amax / 127; !(math.Abs(float64(scale)-want) <= ulp) {
		t.Errorf("%s: scale %v, want max|x|/127 = %v", name, scale, want)
	}
	sawMax := false
	for i, v := range x {
		y := float32(q[i]) * scale
		if math.IsInf(float64(y), 0) || math.IsNaN(float64(y)) {
			t.Fatalf("%s: [%d] dequantises to %v", name, i, y)
		}
		err := math.Abs(float64(v) - float64(y))
		// scale/2, plus the float32 rounding of code·scale (half an ulp
		// of at most 127·scale), and for the largest float32 the step
		// down of the scale (127 ulps of it).
		if tol := float64(scale) * (0.5 + 127*0x1p-21); err > tol {
			t.Fatalf("%s: [%d] = %v stored as %d·%v = %v, error %.3g > scale/2 (tol %.3g)", name, i, v, q[i], scale, y, err, tol)
		}
		if math.Abs(float64(v)) == amax && (q[i] == 127 || q[i] == -127) {
			sawMax = true
		}
	}
	if !sawMax && scale >= 0x1p-126 { // a subnormal scale is coarser (see QuantI8)
		t.Errorf("%s: the largest value's code is not ±127", name)
	}
}

// TestQuantI8 checks the round trip of QuantI8 on Gaussian rows of
// several lengths and scales, and on the edge cases: a row of zeros
// (scale 0), one huge value among small ones, the largest float32,
// subnormals only, values at exact halves of the scale.
func TestQuantI8(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, d := range []int{1, 3, 20, 64, 128, 129} {
		for _, mag := range []float32{1, 1e-30, 1e30, 0x1p-130} {
			x := ref.Normal(rng, d)
			for i := range x {
				x[i] *= mag
			}
			q := make([]int8, d)
			checkRoundTrip(t, "gaussian", x, q, QuantI8(q, x))
		}
	}
	huge := ref.Normal(rng, 64)
	huge[17] = 3e38
	maxF := ref.Normal(rng, 40)
	maxF[3] = -math.MaxFloat32
	maxF[4] = math.MaxFloat32
	halves := make([]float32, 16)
	for i := range halves {
		halves[i] = float32(i-8) + 0.5 // scale 7.5/127: not exact, but near ties
	}
	sub := []float32{math.SmallestNonzeroFloat32, -3 * math.SmallestNonzeroFloat32, 0, 0x1p-140}
	for _, c := range []struct {
		name string
		x    []float32
	}{
		{"zeros", make([]float32, 40)},
		{"negative zero", []float32{float32(math.Copysign(0, -1)), 0}},
		{"one huge value", huge},
		{"largest float32", maxF},
		{"near halves", halves},
		{"subnormals", sub},
		{"one value", []float32{-2.5}},
	} {
		q := make([]int8, len(c.x))
		for i := range q {
			q[i] = 99 // must be overwritten
		}
		scale := QuantI8(q, c.x)
		checkRoundTrip(t, c.name, c.x, q, scale)
	}
	// Non-finite rows: NaN scale, zero codes, so that NaN propagates.
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		x := []float32{1, bad, 2}
		q := []int8{5, 5, 5}
		if s := QuantI8(q, x); !math.IsNaN(float64(s)) || q[0] != 0 || q[1] != 0 || q[2] != 0 {
			t.Errorf("row with %v: scale %v, codes %v", bad, s, q)
		}
	}
}
