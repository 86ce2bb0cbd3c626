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

// mulInto sets x[i] *= y[i], in the vector kernels (a row of
// simd.ScaleColumns).
func mulInto(x, y []float32) {
	simd.ScaleColumns(x, len(x), 1, y[:len(x)])
}

// transpose writes the rows×cols matrix src (row stride lds) transposed
// into dst (row stride ldd), in tiles that stay in L1 cache: with
// hundreds of features a row-by-row transpose touches a new cache line
// on every write. Within a tile, four source rows at a time give four
// consecutive values of each destination row, with fewer bounds checks:
// faster than one row at a time.
func transpose(dst []float32, ldd int, src []float32, lds, rows, cols int) {
	const tile = 16
	for r0 := 0; r0 < rows; r0 += tile {
		r1 := min(r0+tile, rows)
		for c0 := 0; c0 < cols; c0 += tile {
			c1 := min(c0+tile, cols)
			r := r0
			for ; r+4 <= r1; r += 4 {
				s0 := src[r*lds+c0 : r*lds+c1]
				s1 := src[(r+1)*lds+c0:][:len(s0)]
				s2 := src[(r+2)*lds+c0:][:len(s0)]
				s3 := src[(r+3)*lds+c0:][:len(s0)]
				for c := range s0 {
					d := dst[(c0+c)*ldd+r:][:4]
					d[0], d[1], d[2], d[3] = s0[c], s1[c], s2[c], s3[c]
				}
			}
			for ; r < r1; r++ {
				for c, x := range src[r*lds+c0 : r*lds+c1] {
					dst[(c0+c)*ldd+r] = x
				}
			}
		}
	}
}
