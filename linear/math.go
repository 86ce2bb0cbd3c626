package linear

import (
	"math"
	"sync"

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

// transposeBlock is the number of columns transpose moves a panel at a
// time.
const transposeBlock = 64

// transposeScratch is transpose's panel and row offsets. They come from a
// pool: on the stack they would escape to the heap through the kernel
// call, an allocation a call.
type transposeScratch struct {
	buf [transposeBlock * simd.Panel]float32
	off [simd.Panel]int
}

var transposePool = sync.Pool{New: func() any { return new(transposeScratch) }}

// transpose writes the rows×cols matrix src (row stride lds) transposed
// into dst (row stride ldd). simd.PanelFromRows transposes 16 source rows
// at a time into a panel (transposeScratch), which goes out a destination
// row (16 values, one 64-byte store) at a time: several times the speed
// of a transpose in Go, which moved one value an instruction or two.
func transpose(dst []float32, ldd int, src []float32, lds, rows, cols int) {
	const P, block = simd.Panel, transposeBlock
	sc := transposePool.Get().(*transposeScratch)
	defer transposePool.Put(sc)
	buf, off := &sc.buf, &sc.off
	for r0 := 0; r0 < rows; r0 += P {
		nr := min(P, rows-r0)
		for c0 := 0; c0 < cols; c0 += block {
			nc := min(block, cols-c0)
			for x := range nr {
				off[x] = (r0+x)*lds + c0
			}
			simd.PanelFromRows(buf[:nc*P], src, off[:nr], nc, 1)
			if nr == P {
				for c := range nc {
					*(*[P]float32)(dst[(c0+c)*ldd+r0:]) = *(*[P]float32)(buf[c*P:])
				}
				continue
			}
			for c := range nc {
				copy(dst[(c0+c)*ldd+r0:][:nr], buf[c*P:][:nr])
			}
		}
	}
}
