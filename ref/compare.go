package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// RelErr returns ‖got − want‖ / ‖want‖ in the Frobenius norm, or ‖got‖ when
// want is all zero. NaN or Inf in got gives +Inf, so that a comparison
// against a tolerance fails.
func RelErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var diff, norm float64
	for i, g := range got {
		x := float64(g)
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return math.Inf(1)
		}
		e := x - want[i]
		diff += e * e
		norm += want[i] * want[i]
	}
	if norm == 0 {
		return math.Sqrt(diff)
	}
	return math.Sqrt(diff / norm)
}

// LSEErr compares log-sum-exps: entries that are -Inf in want must be -Inf
// in got (a row that sees no key); the finite ones are compared by RelErr.
func LSEErr(got []float32, want []float64) (float64, error) {
	if len(got) != len(want) {
		return 0, fmt.Errorf("lse has %d entries, want %d", len(got), len(want))
	}
	var g32 []float32
	var w64 []float64
	for i, w := range want {
		gi := float64(got[i])
		switch {
		case math.IsInf(w, -1) && !math.IsInf(gi, -1):
			return 0, fmt.Errorf("lse[%d] = %v, want -Inf (row sees no key)", i, gi)
		case !math.IsInf(w, -1) && math.IsInf(gi, -1):
			return 0, fmt.Errorf("lse[%d] = -Inf, want %v", i, w)
		case !math.IsInf(w, -1):
			g32 = append(g32, got[i])
			w64 = append(w64, w)
		}
	}
	return RelErr(g32, w64), nil
}

// Normal returns n standard normal float32 values drawn from rng.
func Normal(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}
