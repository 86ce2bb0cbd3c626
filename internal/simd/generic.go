package simd

import "math"

// gemmGeneric is the plain Go reference: a row of 4 columns of C stays in
// locals across the k loop.
func gemmGeneric(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	for i := 0; i < m; i++ {
		ci := c[i*ldc:][:n]
		if !accumulate {
			clear(ci)
		}
		ai := a[i*lda:][:k]
		for j := 0; j < n; j += 4 {
			c0, c1, c2, c3 := ci[j], ci[j+1], ci[j+2], ci[j+3]
			for p, av := range ai {
				bp := b[p*ldb+j:][:4]
				c0 += av * bp[0]
				c1 += av * bp[1]
				c2 += av * bp[2]
				c3 += av * bp[3]
			}
			ci[j], ci[j+1], ci[j+2], ci[j+3] = c0, c1, c2, c3
		}
	}
}

func expSumGeneric(x []float32, shift float32) float32 {
	var sum float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - shift)))
		x[i] = e
		sum += e
	}
	return sum
}

func maxGeneric(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v)
	}
	return m
}

func scaleGeneric(x []float32, c float32) {
	for i := range x {
		x[i] *= c
	}
}
