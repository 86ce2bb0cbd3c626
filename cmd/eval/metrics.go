package eval

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn"
)

// Float is float32 or float64: outputs are float32, the reference float64.
type Float interface{ ~float32 | ~float64 }

// Errors are the distances of one output from its reference; see the
// package documentation for their definitions. LSE and LSEMaxAbs are NaN
// when either log-sum-exp was not given.
type Errors struct {
	Rel       float64 // ‖Ô−O‖_F / ‖O‖_F
	MaxRow    float64 // max_i ‖ô_i−o_i‖₂ / ‖o_i‖₂
	LSE       float64 // ‖L̂−L‖₂ / ‖L‖₂ over the finite entries of L
	LSEMaxAbs float64 // max_i |L̂_i−L_i| over the finite entries of L
	Spectral  float64 // max over heads of ‖Ô−O‖₂ / ‖O‖₂
}

// Compare measures got against want, both [B][H][N][D] for shape s, and
// gotLSE against wantLSE, both [B][H][N] (either may be nil). To compare
// several outputs with one reference, NewReference saves recomputing the
// reference's norms.
func Compare[G, W Float](s attn.Shape, got []G, want []W, gotLSE []G, wantLSE []W) (Errors, error) {
	if err := checkLens(s, len(want), len(wantLSE), wantLSE != nil); err != nil {
		return Errors{}, err
	}
	return compare(s, got, want, gotLSE, wantLSE, headNorms(s, want))
}

// Reference is a reference output with the spectral norms of its heads
// computed once.
type Reference[W Float] struct {
	s        attn.Shape
	out, lse []W
	norms    []float64
}

// NewReference prepares out, [B][H][N][D] for shape s, and lse, [B][H][N]
// or nil, for comparisons. It keeps the slices, which must not change.
func NewReference[W Float](s attn.Shape, out, lse []W) (*Reference[W], error) {
	if err := checkLens(s, len(out), len(lse), lse != nil); err != nil {
		return nil, err
	}
	return &Reference[W]{s: s, out: out, lse: lse, norms: headNorms(s, out)}, nil
}

// Compare measures got and gotLSE (which may be nil) against r.
func (r *Reference[W]) Compare(got, gotLSE []float32) (Errors, error) {
	return compare(r.s, got, r.out, gotLSE, r.lse, r.norms)
}

func checkLens(s attn.Shape, out, lse int, hasLSE bool) error {
	if out != s.QLen() {
		return fmt.Errorf("%w: reference output has %d elements, want B·H·N·D = %d", attn.ErrShape, out, s.QLen())
	}
	if hasLSE && lse != s.LSELen() {
		return fmt.Errorf("%w: reference lse has %d elements, want B·H·N = %d", attn.ErrShape, lse, s.LSELen())
	}
	return nil
}

// headNorms returns the spectral norm of each N×D head of out.
func headNorms[W Float](s attn.Shape, out []W) []float64 {
	head := s.N * s.D
	norms := make([]float64, s.B*s.H)
	for bh := range norms {
		norms[bh] = SpectralNorm(out[bh*head:][:head], s.N, s.D)
	}
	return norms
}

func compare[G, W Float](s attn.Shape, got []G, want []W, gotLSE []G, wantLSE []W, norms []float64) (Errors, error) {
	if len(got) != s.QLen() {
		return Errors{}, fmt.Errorf("%w: output has %d elements, want B·H·N·D = %d", attn.ErrShape, len(got), s.QLen())
	}
	e := Errors{
		Rel:       RelFrobenius(got, want),
		MaxRow:    MaxRowErr(got, want, s.D),
		LSE:       math.NaN(),
		LSEMaxAbs: math.NaN(),
	}
	if gotLSE != nil && wantLSE != nil {
		if len(gotLSE) != s.LSELen() {
			return Errors{}, fmt.Errorf("%w: lse has %d elements, want B·H·N = %d", attn.ErrShape, len(gotLSE), s.LSELen())
		}
		e.LSE, e.LSEMaxAbs = LSEErr(gotLSE, wantLSE)
	}
	if math.IsInf(e.Rel, 1) {
		e.Spectral = math.Inf(1)
		return e, nil
	}
	head := s.N * s.D
	diff := make([]float64, head)
	for bh, norm := range norms {
		g, w := got[bh*head:][:head], want[bh*head:][:head]
		for i := range diff {
			diff[i] = float64(g[i]) - float64(w[i])
		}
		d := SpectralNorm(diff, s.N, s.D)
		if norm > 0 {
			d /= norm
		}
		e.Spectral = math.Max(e.Spectral, d)
	}
	return e, nil
}

// RelFrobenius returns ‖got−want‖_F / ‖want‖_F, or ‖got−want‖_F when want
// is zero. Different lengths, or NaN or Inf in got, give +Inf.
func RelFrobenius[G, W Float](got []G, want []W) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var diff, norm float64
	for i, g := range got {
		x, w := float64(g), float64(want[i])
		if !finite(x) {
			return math.Inf(1)
		}
		diff += (x - w) * (x - w)
		norm += w * w
	}
	if norm == 0 {
		return math.Sqrt(diff)
	}
	return math.Sqrt(diff / norm)
}

// MaxRowErr returns the largest relative error ‖ĝ_i−w_i‖₂ / ‖w_i‖₂ of the
// rows of d elements; a row whose reference is zero (it saw no key)
// contributes its absolute error. Bad lengths or non-finite values in got
// give +Inf.
func MaxRowErr[G, W Float](got []G, want []W, d int) float64 {
	if len(got) != len(want) || d <= 0 || len(got)%d != 0 {
		return math.Inf(1)
	}
	worst := 0.0
	for r := 0; r < len(got); r += d {
		var diff, norm float64
		for c := r; c < r+d; c++ {
			x, w := float64(got[c]), float64(want[c])
			if !finite(x) {
				return math.Inf(1)
			}
			diff += (x - w) * (x - w)
			norm += w * w
		}
		e := math.Sqrt(diff)
		if norm > 0 {
			e /= math.Sqrt(norm)
		}
		worst = math.Max(worst, e)
	}
	return worst
}

// LSEErr compares log-sum-exps: rel is ‖ĝ−w‖₂ / ‖w‖₂ and maxAbs the
// largest |ĝ_i−w_i| over the entries where want is finite. An entry that
// is -Inf in want (a row that sees no key) must be -Inf in got; a
// mismatch there, or NaN or +Inf in got, makes both +Inf.
func LSEErr[G, W Float](got []G, want []W) (rel, maxAbs float64) {
	if len(got) != len(want) {
		return math.Inf(1), math.Inf(1)
	}
	var diff, norm float64
	for i, g := range got {
		x, w := float64(g), float64(want[i])
		if math.IsInf(w, -1) || math.IsInf(x, -1) {
			if x != w {
				return math.Inf(1), math.Inf(1)
			}
			continue
		}
		if !finite(x) {
			return math.Inf(1), math.Inf(1)
		}
		diff += (x - w) * (x - w)
		norm += w * w
		maxAbs = math.Max(maxAbs, math.Abs(x-w))
	}
	rel = math.Sqrt(diff)
	if norm > 0 {
		rel /= math.Sqrt(norm)
	}
	return rel, maxAbs
}

// SpectralErr returns ‖got−want‖₂ / ‖want‖₂ for the rows×cols matrices
// (row-major), or ‖got−want‖₂ when want is zero, each norm estimated by
// SpectralNorm. Bad lengths or non-finite values in got give +Inf.
func SpectralErr[G, W Float](got []G, want []W, rows, cols int) float64 {
	if len(got) != len(want) || len(got) != rows*cols {
		return math.Inf(1)
	}
	diff := make([]float64, len(got))
	for i, g := range got {
		x := float64(g)
		if !finite(x) {
			return math.Inf(1)
		}
		diff[i] = x - float64(want[i])
	}
	e := SpectralNorm(diff, rows, cols)
	if n := SpectralNorm(want, rows, cols); n > 0 {
		e /= n
	}
	return e
}

// SpectralNorm estimates the largest singular value of the rows×cols
// row-major matrix a by power iteration on the cols×cols Gram matrix aᵀa:
// it stops when the estimate changes by less than 1e-12 relative, or after
// 1000 steps. The start vector is drawn from a fixed seed, so the estimate
// is deterministic; being a power iteration, it can only fall short of
// the true norm, and does so visibly only when the two largest singular
// values are within a hair of each other.
func SpectralNorm[F Float](a []F, rows, cols int) float64 {
	if rows <= 0 || cols <= 0 || len(a) != rows*cols {
		return math.NaN()
	}
	// The Gram matrix costs rows·cols² once; each step then costs cols²
	// instead of 2·rows·cols, which is what makes 1000 steps affordable
	// on N = 16384 rows.
	g := make([]float64, cols*cols)
	row := make([]float64, cols)
	for r := range rows {
		for c := range cols {
			row[c] = float64(a[r*cols+c])
		}
		for i, x := range row {
			if x == 0 {
				continue
			}
			gi := g[i*cols:][:cols]
			for j := i; j < cols; j++ {
				gi[j] += x * row[j]
			}
		}
	}
	for i := range cols {
		for j := range i {
			g[i*cols+j] = g[j*cols+i]
		}
	}
	rng := rand.New(rand.NewPCG(0x5eed, 0x0f))
	x := make([]float64, cols)
	for i := range x {
		x[i] = 1 + rng.Float64()
	}
	normalize(x)
	y := make([]float64, cols)
	lambda := 0.0
	for range 1000 {
		for i := range cols {
			s := 0.0
			for j, gij := range g[i*cols:][:cols] {
				s += gij * x[j]
			}
			y[i] = s
		}
		next := normalize(y)
		x, y = y, x
		if next == 0 {
			return 0
		}
		done := math.Abs(next-lambda) <= 1e-12*next
		lambda = next
		if done {
			break
		}
	}
	return math.Sqrt(lambda)
}

// normalize scales x to unit length and returns its former length.
func normalize(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v * v
	}
	s = math.Sqrt(s)
	if s > 0 {
		for i := range x {
			x[i] /= s
		}
	}
	return s
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
