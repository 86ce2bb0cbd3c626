package lowbit

import "math"

// ChanGroup is the number of channels of a row quantised per token that
// share a scale and a zero.
const ChanGroup = 64

// Stride returns the row length in codes of rows of d values: d rounded
// up to 16, so that a packed row (Stride/2 bytes) is a whole number of
// 8-byte words.
func Stride(d int) int { return (d + 15) &^ 15 }

// ChanGroups returns the number of channel groups of a row of d values.
func ChanGroups(d int) int { return (d + ChanGroup - 1) / ChanGroup }

// Params returns the scale and zero of the 4-bit codes of values in
// [lo, hi]: zero = lo, scale = (hi-lo)/15 rounded up to float32 (so that
// hi's code is 15 without clamping), stepped down where zero + 15·scale
// would overflow (so that a range wider than the largest float32, values
// of both signs near it, is clamped). Equal bounds give scale 0: every
// value is zero exactly.
// bad (a NaN or an infinity among the values) gives NaN for both, so that
// NaN propagates through attention as it would in float32.
func Params(lo, hi float32, bad bool) (scale, zero float32) {
	if bad {
		nan := float32(math.NaN())
		return nan, nan
	}
	r := float64(hi) - float64(lo)
	if r == 0 {
		return 0, lo
	}
	scale = float32(r / 15)
	if float64(scale)*15 < r {
		scale = math.Nextafter32(scale, float32(math.Inf(1)))
	}
	for math.IsInf(float64(15*scale), 0) || math.IsInf(float64(lo+15*scale), 0) {
		scale = math.Nextafter32(scale, 0)
	}
	return scale, lo
}

// Inv returns the reciprocal the codes are computed with: 0 for a scale
// of 0 or NaN (all codes 0).
func Inv(scale float32) float64 {
	if !(scale > 0) {
		return 0
	}
	return 1 / float64(scale)
}

// Code returns the code of x: round((x-zero)/scale), ties to even,
// clamped to 0…15.
func Code(x, zero float32, inv float64) uint8 {
	c := math.RoundToEven((float64(x) - float64(zero)) * inv)
	return uint8(max(0, min(15, c)))
}

// SetCode puts code into channel c of a packed row of pw bytes (whose
// nibble is 0).
func SetCode(row []uint8, c int, code uint8, pw int) {
	if c < pw {
		row[c] |= code
	} else {
		row[c-pw] |= code << 4
	}
}

// GetCode returns the code of channel c of a packed row of pw bytes.
func GetCode(row []uint8, c, pw int) uint8 {
	if c < pw {
		return row[c] & 15
	}
	return row[c-pw] >> 4
}

// Range returns the least and greatest of x and whether x holds a NaN
// or an infinity.
func Range(x []float32) (lo, hi float32, bad bool) {
	lo, hi = float32(math.Inf(1)), float32(math.Inf(-1))
	for _, v := range x {
		if !(v >= -math.MaxFloat32 && v <= math.MaxFloat32) {
			bad = true
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi, bad
}

// QuantRow quantises x (one row of D values) per token: channel group cg
// gets scale[cg·gs] and zero[cg·gs], and row (pw bytes) the codes.
func QuantRow(row []uint8, scale, zero []float32, gs int, x []float32, pw int) {
	clear(row)
	for cg := range ChanGroups(len(x)) {
		c0, c1 := cg*ChanGroup, min(len(x), (cg+1)*ChanGroup)
		lo, hi, bad := Range(x[c0:c1])
		s, z := Params(lo, hi, bad)
		scale[cg*gs], zero[cg*gs] = s, z
		inv := Inv(s)
		for c := c0; c < c1; c++ {
			SetCode(row, c, Code(x[c], z, inv), pw)
		}
	}
}

// Dequant sets dst (D values) to the values of a packed row: zero +
// scale·code, with a scale and zero per channel (gs 0) or per group of
// ChanGroup channels, those of successive groups gs apart.
func Dequant(dst []float32, packed []uint8, scale, zero []float32, gs int) {
	pw, d := len(packed), len(dst)
	at := func(c int, code uint8) {
		g := c
		if gs > 0 {
			g = c / ChanGroup * gs
		}
		dst[c] = zero[g] + scale[g]*float32(code)
	}
	for i, b := range packed[:min(pw, d)] {
		at(i, b&15)
		if i+pw < d {
			at(i+pw, b>>4)
		}
	}
}

// Halves calls f for the parts of channels [c0, c1) of packed rows of pw
// bytes that lie in the low (hi false) and the high nibbles: the part's
// first byte b in a row, and its channels [p0, p1). The kernels read
// each part in place with one call.
func Halves(pw, c0, c1 int, f func(hi bool, b, p0, p1 int)) {
	if c0 < pw {
		f(false, c0, c0, min(c1, pw))
	}
	if c1 > pw {
		p0 := max(c0, pw)
		f(true, p0-pw, p0, c1)
	}
}

// QuantColumns quantises rows x (row stride ldx, d values a row) per
// channel: channel c of all the rows shares scale[c] and zero[c] (from
// its range over the rows, see Params), and row r's codes go into the
// packed row codes[r*ldc:][:pw], whose nibbles of channels below d must
// be 0.
func QuantColumns(codes []uint8, ldc, pw int, scale, zero []float32, x []float32, ldx, rows, d int) {
	for c := range d {
		lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
		bad := false
		for r := range rows {
			v := x[r*ldx+c]
			if !(v >= -math.MaxFloat32 && v <= math.MaxFloat32) {
				bad = true
			}
			lo, hi = min(lo, v), max(hi, v)
		}
		s, z := Params(lo, hi, bad)
		scale[c], zero[c] = s, z
		inv := Inv(s)
		for r := range rows {
			SetCode(codes[r*ldc:][:pw], c, Code(x[r*ldx+c], z, inv), pw)
		}
	}
}
