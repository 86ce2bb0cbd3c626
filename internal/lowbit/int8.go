package lowbit

import "math"

// QuantI8 sets q to the int8 codes of x, symmetric with the scale it
// returns, max|x|/127: q[i] = round(x[i]/scale), ties to even (the
// quotient taken as x[i]·(1/scale) in float64), so that x[i] is within
// scale/2 of q[i]·scale. A row of zeros has scale 0 and zero codes.
//
// The scale is max|x|/127 rounded to float32, then one step up if that
// fell below max|x|/127, so that the largest value's code is 127 without
// clamping: for a subnormal scale (max|x| < 2^-119) the step is a large
// part of it, and a scale of 0 (max|x|/127 under the smallest float32)
// would lose the row. Only where 127·scale would overflow to Inf (max|x|
// within an ulp of the largest float32) is it one step down instead, and
// the code clamped to ±127. A row holding Inf or NaN has scale NaN and
// zero codes, and NaN propagates through attention as it would in
// float32.
func QuantI8(q []int8, x []float32) float32 {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	switch {
	case amax == 0:
		clear(q)
		return 0
	case !(amax <= math.MaxFloat32): // Inf or NaN
		clear(q)
		return float32(math.NaN())
	}
	scale := amax / 127
	if float64(scale)*127 < float64(amax) {
		scale = math.Nextafter32(scale, float32(math.Inf(1)))
	}
	if math.IsInf(float64(scale*127), 0) {
		scale = math.Nextafter32(scale, 0)
	}
	inv := 1 / float64(scale)
	for i, v := range x {
		q[i] = int8(max(-127, min(127, math.RoundToEven(float64(v)*inv))))
	}
	return scale
}
