package lowbit

import (
	"fmt"
	"math"
	"testing"

	"github.com/attnkit/attn/ref"
)

// checkGroup checks the codes of a group of values x quantised with
// scale and zero, read back as y: each within scale/2 of the value (up
// to the float32 rounding of zero + scale·code), the group's least value
// stored exactly and a NaN-free, finite result.
func checkGroup(t *testing.T, name string, x, y []float32, scale, zero float32) {
	t.Helper()
	lo, hi, bad := Range(x)
	if bad {
		t.Fatalf("%s: non-finite input", name)
	}
	if zero != lo {
		t.Errorf("%s: zero %v, want the least value %v", name, zero, lo)
	}
	if want := (float64(hi) - float64(lo)) / 15; float64(scale) < want || float64(scale) > want*(1+0x1p-22)+0x1p-149 {
		t.Errorf("%s: scale %v, want (max-min)/15 = %v rounded up", name, scale, want)
	}
	tol := MaxError(scale, lo, hi)
	for i := range x {
		if math.IsInf(float64(y[i]), 0) || math.IsNaN(float64(y[i])) {
			t.Fatalf("%s: [%d] reads back as %v", name, i, y[i])
		}
		if e := math.Abs(float64(x[i]) - float64(y[i])); e > tol {
			t.Fatalf("%s: [%d] = %v reads back as %v, error %.3g > scale/2 (tol %.3g, scale %v)", name, i, x[i], y[i], e, tol, scale)
		}
	}
}

// TestQuantRow4 checks the round trip of a row quantised per token, for
// rows of several lengths (one and several channel groups, a partial
// last one) and scales, and the edge cases: zeros, a constant row, one
// huge value, the largest float32 of both signs, subnormals, and NaN or
// Inf (NaN scale and zero, so that NaN propagates).
func TestQuantRow4(t *testing.T) {
	rng := ref.FreshRNG(t, 20)
	rows := map[string][]float32{
		"zeros":    make([]float32, 70),
		"constant": {3, 3, 3, 3, 3},
		"subnormals": {math.SmallestNonzeroFloat32, -3 * math.SmallestNonzeroFloat32, 0, 0x1p-140,
			2 * math.SmallestNonzeroFloat32},
		"near max":  {math.MaxFloat32, math.MaxFloat32 * 0.99, math.MaxFloat32 * 0.5},
		"near -max": {-math.MaxFloat32, -math.MaxFloat32 * 0.99, -math.MaxFloat32 * 0.5, 0},
	}
	for _, d := range []int{1, 3, 20, 64, 65, 128, 129, 200} {
		for _, mag := range []float32{1, 1e-30, 1e30, 0x1p-130} {
			x := ref.Normal(rng, d)
			for i := range x {
				x[i] *= mag
			}
			rows[fmt.Sprintf("gaussian d=%d mag=%g", d, mag)] = x
		}
	}
	huge := ref.Normal(rng, 100)
	huge[17] = 3e38
	rows["one huge value"] = huge
	for name, x := range rows {
		d := len(x)
		st := Stride(d)
		pw, ng := st/2, ChanGroups(d)
		packed := make([]uint8, pw)
		for i := range packed {
			packed[i] = 0xAB // must be overwritten
		}
		scale, zero := make([]float32, ng), make([]float32, ng)
		QuantRow(packed, scale, zero, 1, x, pw)
		for cg := range ng {
			c0, c1 := cg*ChanGroup, min(d, (cg+1)*ChanGroup)
			y := make([]float32, c1-c0)
			for i := range y {
				y[i] = zero[cg] + scale[cg]*float32(GetCode(packed, c0+i, pw))
			}
			checkGroup(t, fmt.Sprintf("%s group %d", name, cg), x[c0:c1], y, scale[cg], zero[cg])
		}
		for c := d; c < st; c++ {
			if GetCode(packed, c, pw) != 0 {
				t.Fatalf("%s: padding channel %d has code %d", name, c, GetCode(packed, c, pw))
			}
		}
	}
	// A range past the largest float32 cannot be spanned by 15 steps that
	// are finite: it is clamped, but reads back finite.
	x := []float32{-math.MaxFloat32, math.MaxFloat32, 1, 0}
	packed := make([]uint8, 8)
	scale, zero := make([]float32, 1), make([]float32, 1)
	QuantRow(packed, scale, zero, 1, x, 8)
	for c := range x {
		if y := zero[0] + scale[0]*float32(GetCode(packed, c, 8)); math.IsInf(float64(y), 0) || math.IsNaN(float64(y)) {
			t.Errorf("largest float32: [%d] = %v reads back as %v", c, x[c], y)
		}
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		x := []float32{1, bad, 2}
		packed := make([]uint8, 8)
		scale, zero := make([]float32, 1), make([]float32, 1)
		QuantRow(packed, scale, zero, 1, x, 8)
		if !math.IsNaN(float64(scale[0])) || !math.IsNaN(float64(zero[0])) {
			t.Errorf("row with %v: scale %v zero %v, want NaN", bad, scale[0], zero[0])
		}
	}
}

// TestRotation checks the rotation: orthonormal (R·Rᵀ = I to float32
// rounding, in float64), inverted by invert, dot products preserved, for
// powers of two, D with a smaller power of two (96: blocks of 32, 40: of
// 8) and odd D (sign flips alone); and that it mixes: a unit vector
// spreads over its whole block.
func TestRotation(t *testing.T) {
	rng := ref.FreshRNG(t, 26)
	for _, d := range []int{1, 2, 33, 40, 64, 96, 128} {
		r := NewRotation(d)
		if want := d & -d; r.block != want {
			t.Errorf("D = %d: block %d, want %d", d, r.block, want)
		}
		// Columns of R: R applied to the unit vectors.
		cols := make([][]float32, d)
		for i := range cols {
			cols[i] = make([]float32, d)
			cols[i][i] = 1
			r.Apply(cols[i])
			nz := 0
			for _, x := range cols[i] {
				if x != 0 {
					nz++
					if want := 1 / math.Sqrt(float64(r.block)); math.Abs(math.Abs(float64(x))-want) > 1e-7 {
						t.Fatalf("D = %d: R[·][%d] has entry %v, want ±%v", d, i, x, want)
					}
				}
			}
			if nz != r.block {
				t.Fatalf("D = %d: unit vector %d spreads over %d channels, want %d", d, i, nz, r.block)
			}
		}
		for i := range cols {
			for j := range cols {
				var dot float64
				for c := range d {
					dot += float64(cols[i][c]) * float64(cols[j][c])
				}
				want := 0.0
				if i == j {
					want = 1
				}
				if math.Abs(dot-want) > 1e-6 {
					t.Fatalf("D = %d: column %d · column %d = %v, want %v", d, i, j, dot, want)
				}
			}
		}
		q, k := ref.Normal(rng, d), ref.Normal(rng, d)
		var dot0 float64
		for i := range q {
			dot0 += float64(q[i]) * float64(k[i])
		}
		qr, kr := append([]float32(nil), q...), append([]float32(nil), k...)
		r.Apply(qr)
		r.Apply(kr)
		var dot1 float64
		for i := range q {
			dot1 += float64(qr[i]) * float64(kr[i])
		}
		if math.Abs(dot1-dot0) > 1e-5*math.Sqrt(float64(d)) {
			t.Errorf("D = %d: q·k = %v, rotated %v", d, dot0, dot1)
		}
		r.Invert(qr)
		for i := range q {
			if math.Abs(float64(qr[i]-q[i])) > 1e-6 {
				t.Fatalf("D = %d: round trip [%d] = %v, want %v", d, i, qr[i], q[i])
			}
		}
	}
}
