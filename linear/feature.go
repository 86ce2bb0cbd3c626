package linear

import (
	"github.com/attnkit/attn/internal/simd"
)

// FeatureMap is the kernel feature map φ of linear attention: the weight of
// key j for query i is φ(q_i)·φ(k_j). It is applied to whole blocks of
// rows so that a map built on a matrix product (random features) runs at
// matrix-multiply speed.
//
// A map may write its features in log-scaled form: row r of x has the
// features exp(logScale[r])·dst[r]. Maps whose features can grow past the
// float32 range (exponentials of the input, as in Performer) use it to keep
// dst bounded; Attention then carries the scales in the log domain, with a
// stabiliser taken only over keys a query can see (see the package
// documentation), so the result neither overflows nor depends on later
// tokens.
//
// Implementations must be safe for concurrent use: Forward calls Map from
// several goroutines.
type FeatureMap interface {
	// Features returns the number of features F for head size d; it must
	// be at least 1.
	Features(d int) int
	// LogScaled reports whether Map writes per-row log scales.
	LogScaled() bool
	// Map writes the features of the n rows of x (row stride d) to dst,
	// n rows of stride ld ≥ F; columns F..ld-1 of dst are scratch the map
	// may use. When LogScaled is true it also writes logScale[r] for every
	// row, otherwise logScale is nil. scale is the logit scale in effect
	// (Options.ScaleFor) and key reports whether the rows are keys rather
	// than queries: a map approximating a softmax kernel uses both.
	Map(dst []float32, ld int, logScale, x []float32, n, d int, scale float32, key bool)
}

// DifferentiableMap is a FeatureMap that Backward can differentiate
// through: it also applies the transposed Jacobian of φ. Backward returns
// an error wrapping attn.ErrUnsupported for a map that does not implement
// it. ELU and package performer's maps do.
type DifferentiableMap interface {
	FeatureMap
	// MapBackward writes into dx the gradient of a loss with respect to
	// the n rows of x (row stride d), given its gradient with respect to
	// their features, both in the log-scaled form of Map: for row r,
	//
	//	dx_r = Σ_f g_rf · exp(−ℓ_r) · ∂φ_f(x_r)/∂x_r,   g_r = exp(ℓ_r) · ∂L/∂φ(x_r),
	//
	// where ℓ_r is the log scale Map writes for the row (0 when the map is
	// not LogScaled), so that g and dx stay bounded where φ itself would
	// overflow. phi holds the rows exactly as Map wrote them for the same
	// x, scale and key, and g the gradients, each n rows of stride ld with
	// the first F values used. The map may overwrite g, not phi. dx has n
	// rows of stride ldx ≥ d, and columns d..ldx−1 are scratch; Backward
	// passes ldx = d rounded up to a multiple of 16. Like Map,
	// MapBackward must be safe for concurrent use.
	MapBackward(dx []float32, ldx int, g, phi []float32, ld int, x []float32, n, d int, scale float32, key bool)
}

// ELU is the feature map of Katharopoulos et al. (2020): φ(x) = elu(x) + 1,
// applied element by element, so F = d. It is positive, which keeps the
// normaliser positive, and it ignores the logit scale: elu+1 attention is
// a function of its own, not an approximation of softmax attention, and is
// trained as such.
type ELU struct{}

// Features returns d.
func (ELU) Features(d int) int { return d }

// LogScaled returns false: elu(x)+1 ≤ |x|+1 cannot overflow.
func (ELU) LogScaled() bool { return false }

// Map writes elu(x)+1 for every element of the n rows of x.
func (ELU) Map(dst []float32, ld int, _, x []float32, n, d int, _ float32, _ bool) {
	if ld == d {
		simd.ELU1(dst[:n*d], x[:n*d])
		return
	}
	for r := range n {
		simd.ELU1(dst[r*ld:r*ld+d], x[r*d:(r+1)*d])
	}
}

// MapBackward writes dx = g ∘ φ'(x): the derivative of elu(x)+1 is
// exp(x) = φ(x) below 0 and 1 from 0 on, that is min(φ(x), 1), read off
// phi instead of computing an exponential again.
func (ELU) MapBackward(dx []float32, ldx int, g, phi []float32, ld int, _ []float32, n, d int, _ float32, _ bool) {
	for r := range n {
		dst, gr, pr := dx[r*ldx:][:d], g[r*ld:][:d], phi[r*ld:][:d]
		for c := range dst {
			dst[c] = gr[c] * min(pr[c], 1)
		}
	}
}
