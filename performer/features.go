package performer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/attnkit/attn/internal/simd"
)

// Kind selects the random features.
type Kind int

const (
	// Positive is FAVOR+: φ(x) = m^(-1/2)·exp(Wx − |x|²/2), positive, so
	// every estimated weight and normaliser is positive.
	Positive Kind = iota
	// Trig is the random Fourier (sin/cos) estimator of the softmax kernel:
	// φ(x) = (m/2)^(-1/2)·exp(|x|²/2)·[sin(Wx), cos(Wx)] with m/2 random
	// vectors. Its weights can be negative and its variance is largest
	// exactly where softmax weights are small, so normalisers near 0 or
	// below it occur; it is offered for comparison.
	Trig
)

// String returns "positive" or "trig".
func (k Kind) String() string {
	switch k {
	case Positive:
		return "positive"
	case Trig:
		return "trig"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// FeatureMap is the random feature map of a Performer; it implements
// linear.FeatureMap in log-scaled form. The projection W for head size d is
// drawn the first time d is used, from the seed and d alone, and then
// shared by all batch rows, heads, queries and keys. A FeatureMap is safe
// for concurrent use.
type FeatureMap struct {
	kind  Kind
	m     int // features
	nw    int // random vectors: m, or m/2 for Trig
	seed  uint64
	mu    sync.Mutex
	projs map[int]*projection
}

// projection is W for one head size, in the two layouts the products
// read: wt = Wᵀ, [d][pad(nw)], zero past column nw, for Map, and w = W,
// [nw][pad(d)], zero past column d, for MapBackward.
type projection struct {
	wt  []float32
	ld  int
	w   []float32
	ldw int
}

// NewFeatureMap returns the feature map of kind with m features drawn from
// seed. Trig needs an even m: m/2 frequencies, each giving a sine and a
// cosine.
func NewFeatureMap(kind Kind, m int, seed uint64) (*FeatureMap, error) {
	switch {
	case kind != Positive && kind != Trig:
		return nil, fmt.Errorf("performer: unknown feature kind %d", int(kind))
	case m < 1:
		return nil, fmt.Errorf("performer: %d features, want at least 1", m)
	case kind == Trig && m%2 != 0:
		return nil, fmt.Errorf("performer: trig features come in sin/cos pairs: features = %d is odd", m)
	}
	nw := m
	if kind == Trig {
		nw = m / 2
	}
	return &FeatureMap{kind: kind, m: m, nw: nw, seed: seed, projs: map[int]*projection{}}, nil
}

// Kind returns the kind of features.
func (f *FeatureMap) Kind() Kind { return f.kind }

// Features returns m, whatever d.
func (f *FeatureMap) Features(int) int { return f.m }

// LogScaled returns true: the features are exponentials of the input.
func (f *FeatureMap) LogScaled() bool { return true }

// Projection returns a copy of the random matrix W used for head size d,
// row-major, one random vector of length d per row (m rows for Positive,
// m/2 for Trig).
func (f *FeatureMap) Projection(d int) []float32 {
	p := f.proj(d)
	w := make([]float32, f.nw*d)
	for r := range f.nw {
		for c := range d {
			w[r*d+c] = p.wt[c*p.ld+r]
		}
	}
	return w
}

func (f *FeatureMap) proj(d int) *projection {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.projs[d]; ok {
		return p
	}
	w := orthogonalGaussian(f.seed, f.nw, d)
	p := &projection{ld: pad(f.nw), ldw: pad(d)}
	p.wt = make([]float32, d*p.ld)
	p.w = make([]float32, f.nw*p.ldw)
	for r := range f.nw {
		for c := range d {
			p.wt[c*p.ld+r] = float32(w[r*d+c])
			p.w[r*p.ldw+c] = float32(w[r*d+c])
		}
	}
	f.projs[d] = p
	return p
}

func pad(n int) int { return (n + simd.Panel - 1) / simd.Panel * simd.Panel }

// orthogonalGaussian returns rows×d random vectors: blocks of d rows that
// are orthogonalised standard Gaussians (Gram–Schmidt, so each block is a
// uniformly random orthonormal basis), each row then scaled by the norm of
// an independent d-dimensional Gaussian, so that every row is marginally
// N(0, I_d) as the estimators need while rows within a block stay exactly
// orthogonal (Choromanski et al. 2021, §4). Every block, the last one too,
// draws d·d + d·d numbers from PCG(seed, d), so the first rows are the same
// whatever rows is.
func orthogonalGaussian(seed uint64, rows, d int) []float64 {
	rng := rand.New(rand.NewPCG(seed, uint64(d)))
	w := make([]float64, rows*d)
	blk := make([]float64, d*d)
	for r0 := 0; r0 < rows; r0 += d {
		for i := range blk {
			blk[i] = rng.NormFloat64()
		}
		for i := range d {
			row := blk[i*d : (i+1)*d]
			// Two passes of modified Gram–Schmidt keep the rows
			// orthogonal to float64 rounding.
			for range 2 {
				for p := range i {
					prev := blk[p*d : (p+1)*d]
					dot := 0.0
					for c := range d {
						dot += row[c] * prev[c]
					}
					for c := range d {
						row[c] -= dot * prev[c]
					}
				}
			}
			nrm := 0.0
			for _, x := range row {
				nrm += x * x
			}
			nrm = math.Sqrt(nrm)
			for c := range row {
				row[c] /= nrm
			}
		}
		for i := range d {
			chi := 0.0
			for range d {
				z := rng.NormFloat64()
				chi += z * z
			}
			chi = math.Sqrt(chi)
			if r := r0 + i; r < rows {
				for c := range d {
					w[r*d+c] = blk[i*d+c] * chi
				}
			}
		}
	}
	return w
}

// Map writes the features of the n rows of x. The inputs are scaled by
// sqrt|scale| (keys) or sign(scale)·sqrt|scale| (queries), so that
// φ(q)·φ(k) estimates exp(scale·q·k); with the default scale this is the
// d^(-1/4) of the paper. Each row is stabilised by its own largest
// exponent, which goes into logScale with the other row constants.
func (f *FeatureMap) Map(dst []float32, ld int, logScale, x []float32, n, d int, scale float32, key bool) {
	p := f.proj(d)
	simd.Gemm(n, p.ld, d, x, d, p.wt, p.ld, dst, ld, false)
	abs := math.Abs(float64(scale))
	c := float32(math.Sqrt(abs))
	if scale < 0 && !key {
		c = -c
	}
	logNorm := 0.5 * math.Log(float64(f.nw))
	for r := range n {
		row := dst[r*ld:][:f.m]
		xr := x[r*d : (r+1)*d]
		half := 0.5 * abs * float64(simd.Dot(xr, xr)) // |x'|²/2
		raw := row[:f.nw]
		simd.Scale(raw, c)
		switch f.kind {
		case Positive:
			mx := simd.Max(raw)
			simd.ExpSum(raw, mx)
			logScale[r] = float32(float64(mx) - half - logNorm)
		case Trig:
			h := f.nw
			// The cosines go to columns [h, 2h), past every raw
			// value still to be read.
			for i := range h {
				s, co := math.Sincos(float64(raw[i]))
				row[i], row[h+i] = float32(s), float32(co)
			}
			logScale[r] = float32(half - logNorm)
		}
	}
}

// MapBackward implements linear.DifferentiableMap. With x' = c·x the
// scaled input of Map (c = ±sqrt|scale|) and ℓ the row's log scale,
// exp(−ℓ)·∂φ/∂x is, feature by feature,
//
//	Positive:  ψ_f·(c·w_f − |scale|·x)
//	Trig:      sin: ψ_sin,f·|scale|·x + c·cos(w_f·x')·w_f,  cos: ψ_cos,f·|scale|·x − c·sin(w_f·x')·w_f
//
// (ψ the features as Map wrote them, w_f row f of W), so dx is one
// product with W, (g∘ψ)·W or the sine and cosine gradients crossed, plus
// a multiple of x. W gets no gradient: the projection is fixed by the
// seed.
func (f *FeatureMap) MapBackward(dx []float32, ldx int, g, phi []float32, ld int, x []float32, n, d int, scale float32, key bool) {
	p := f.proj(d)
	abs := float32(math.Abs(float64(scale)))
	c := float32(math.Sqrt(float64(abs)))
	if scale < 0 && !key {
		c = -c
	}
	h := f.nw
	for r := range n {
		gr, pr := g[r*ld:][:f.m], phi[r*ld:][:f.m]
		t := simd.Dot(gr, pr) // Σ_f g_f ψ_f
		xr, dr := x[r*d:][:d], dx[r*ldx:][:ldx]
		coef := abs * t
		switch f.kind {
		case Positive:
			coef = -coef
			mulInto(gr, pr)
		case Trig:
			for i := range h {
				gr[i] = gr[i]*pr[h+i] - gr[h+i]*pr[i]
			}
		}
		simd.Scale(gr[:h], c)
		// The multiple of x first, then the product added to it.
		copy(dr[:d], xr)
		simd.Scale(dr[:d], coef)
		clear(dr[d:])
	}
	if ldx >= p.ldw {
		simd.Gemm(n, p.ldw, h, g, ld, p.w, p.ldw, dx, ldx, true)
		return
	}
	for r := range n {
		gr, dr := g[r*ld:][:h], dx[r*ldx:][:d]
		for c := range dr {
			dr[c] += simd.Dot(gr, p.wt[c*p.ld:][:h])
		}
	}
}

// mulInto sets x[i] *= y[i], in the vector kernels (a row of
// simd.ScaleColumns): a Go loop was a visible share of a backward pass's
// profile (results/2026-12-07).
func mulInto(x, y []float32) {
	simd.ScaleColumns(x, len(x), 1, y[:len(x)])
}
