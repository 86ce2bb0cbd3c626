package linear

import (
	"math"

	"github.com/attnkit/attn/internal/simd"
)

var negInf = float32(math.Inf(-1))

func exp32(x float32) float32 { return float32(math.Exp(float64(x))) }
func log32(x float32) float32 { return float32(math.Log(float64(x))) }
func isInf(x float32) bool    { return math.IsInf(float64(x), 0) }
func maxOf(x []float32) float32 {
	return simd.Max(x)
}
func scaleBy(x []float32, c float32) { simd.Scale(x, c) }

// mulInto sets x[i] *= y[i].
func mulInto(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] *= y[i]
	}
}

// transpose writes the rows×cols matrix src (row stride lds) transposed
// into dst (row stride ldd), in tiles that stay in L1 cache: with
// hundreds of features a row-by-row transpose touches a new cache line
// on every write.
func transpose(dst []float32, ldd int, src []float32, lds, rows, cols int) {
	const tile = 16
	for r0 := 0; r0 < rows; r0 += tile {
		r1 := min(r0+tile, rows)
		for c0 := 0; c0 < cols; c0 += tile {
			c1 := min(c0+tile, cols)
			for r := r0; r < r1; r++ {
				s := src[r*lds+c0 : r*lds+c1]
				for c, x := range s {
					dst[(c0+c)*ldd+r] = x
				}
			}
		}
	}
}
