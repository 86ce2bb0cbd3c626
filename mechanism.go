package attn

import (
	"context"
	"errors"
	"fmt"
	"math"
)

// Mechanism is one way of computing attention. Every exact kernel and every
// approximation in this module satisfies it, so that tests, the command
// line and the benchmarks treat them alike.
type Mechanism interface {
	// Name is the mechanism's name on the command line ("exact", "window", …).
	Name() string
	// Forward computes out = attention(q, k, v) for shape s under o and,
	// when lse is non-nil, the natural-log normaliser of each query row
	// (or the mechanism's estimate of it). q, k, v, out and lse follow the
	// layout in the package documentation. A mechanism that cannot honour
	// an option returns an error wrapping ErrUnsupported; it never
	// silently ignores one. (Where an option has no meaning for a
	// mechanism, such as Scale for linear attention, which defines its own
	// normalisation, the mechanism's package documents it.)
	Forward(ctx context.Context, s Shape, q, k, v []float32, o Options, out, lse []float32) error
}

// ErrUnsupported is wrapped by errors for options or shapes a mechanism
// does not implement (for example a causal Linformer).
var ErrUnsupported = errors.New("attn: unsupported")

// Merge folds the partial result (src, srcLSE), computed over one set of
// keys, into (dst, dstLSE), computed over a disjoint set, so that dst then
// holds attention over the union:
//
//	L = logaddexp(L1, L2);  O = exp(L1-L)·O1 + exp(L2-L)·O2
//
// Each of the len(dstLSE) rows has d elements. A row whose two lse are both
// -Inf saw no key and stays 0 with lse -Inf.
func Merge(dst, dstLSE, src, srcLSE []float32, d int) error {
	rows := len(dstLSE)
	if d <= 0 {
		return fmt.Errorf("%w: Merge row size d = %d, want > 0", ErrShape, d)
	}
	if len(srcLSE) != rows || len(dst) != rows*d || len(src) != rows*d {
		return fmt.Errorf("%w: Merge of %d×%d rows got len(dst) = %d, len(src) = %d, len(srcLSE) = %d",
			ErrShape, rows, d, len(dst), len(src), len(srcLSE))
	}
	for r := range rows {
		MergeRow(dst[r*d:(r+1)*d], &dstLSE[r], src[r*d:(r+1)*d], srcLSE[r])
	}
	return nil
}

// MergeRow is Merge for one row; len(dst) must equal len(src).
func MergeRow(dst []float32, dstLSE *float32, src []float32, srcLSE float32) {
	l1, l2 := float64(*dstLSE), float64(srcLSE)
	m := math.Max(l1, l2)
	if math.IsInf(m, -1) {
		clear(dst)
		*dstLSE = float32(math.Inf(-1))
		return
	}
	// Weights relative to the larger lse are in (0, 1]: no overflow even
	// for lse near the float32 limit.
	w1, w2 := math.Exp(l1-m), math.Exp(l2-m)
	sum := w1 + w2
	a, b := float32(w1/sum), float32(w2/sum)
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = a*dst[i] + b*src[i]
	}
	*dstLSE = float32(m + math.Log(sum))
}

// LogAddExp returns log(exp(a) + exp(b)) without overflow; it is -Inf when
// both are -Inf.
func LogAddExp(a, b float64) float64 {
	m := math.Max(a, b)
	if math.IsInf(m, -1) {
		return m
	}
	return m + math.Log(math.Exp(a-m)+math.Exp(b-m))
}
