// Package ref is the float64 reference for every attention mechanism in
// this module: dense softmax(Q·Kᵀ·scale + bias, masked)·V, computed the
// obvious way, one query row at a time, in float64. It is the oracle the
// tests compare against; it is kept plain rather than fast.
package ref

import (
	"fmt"
	"math"

	"github.com/attnkit/attn"
)

// Spec is everything that shapes the reference computation besides the
// tensors.
type Spec struct {
	// Scale multiplies the logits; 0 means 1/sqrt(D).
	Scale float64
	// Mask, when non-nil, says which (query, key) pairs are visible. Its
	// length selects how it broadcasts: N·M (one mask for all batch rows
	// and heads), B·N·M (per batch row) or B·H·N·M (per head), indexed
	// row-major in that order.
	Mask []bool
	// Bias, when non-nil, is added to the scaled logits; it broadcasts by
	// length exactly like Mask. -Inf in Bias masks a pair too.
	Bias []float64
}

// Attention returns out[B][H][N][D] and lse[B][H][N] in float64. A query row
// with no visible key gets out 0 and lse -Inf.
func Attention(s attn.Shape, q, k, v []float32, spec Spec) (out, lse []float64, err error) {
	if err := s.CheckTensors(q, k, v, nil, nil); err != nil {
		return nil, nil, err
	}
	maskAt, err := broadcast(s, len(spec.Mask), "mask", spec.Mask == nil)
	if err != nil {
		return nil, nil, err
	}
	biasAt, err := broadcast(s, len(spec.Bias), "bias", spec.Bias == nil)
	if err != nil {
		return nil, nil, err
	}
	scale := spec.Scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(s.D))
	}
	out = make([]float64, s.QLen())
	lse = make([]float64, s.LSELen())
	logits := make([]float64, s.M)
	for b := range s.B {
		for h := range s.H {
			kvh := h / s.Group()
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				qi := q[row*s.D : (row+1)*s.D]
				mx := math.Inf(-1)
				for j := range s.M {
					logits[j] = math.Inf(-1)
					if maskAt != nil && !spec.Mask[maskAt(b, h, i, j)] {
						continue
					}
					kj := k[((b*s.HKV+kvh)*s.M+j)*s.D:][:s.D]
					dot := 0.0
					for c := range s.D {
						dot += float64(qi[c]) * float64(kj[c])
					}
					x := dot * scale
					if biasAt != nil {
						x += spec.Bias[biasAt(b, h, i, j)]
					}
					logits[j] = x
					mx = math.Max(mx, x)
				}
				if math.IsInf(mx, -1) {
					lse[row] = mx
					continue // out row stays 0
				}
				sum := 0.0
				o := out[row*s.D : (row+1)*s.D]
				for j := range s.M {
					p := math.Exp(logits[j] - mx)
					if p == 0 {
						continue
					}
					sum += p
					vj := v[((b*s.HKV+kvh)*s.M+j)*s.D:][:s.D]
					for c := range s.D {
						o[c] += p * float64(vj[c])
					}
				}
				for c := range o {
					o[c] /= sum
				}
				lse[row] = mx + math.Log(sum)
			}
		}
	}
	return out, lse, nil
}

// broadcast returns the index function for a mask or bias of length n, or
// nil when absent.
func broadcast(s attn.Shape, n int, what string, absent bool) (func(b, h, i, j int) int, error) {
	nm := s.N * s.M
	switch {
	case absent:
		return nil, nil
	case n == nm:
		return func(b, h, i, j int) int { return i*s.M + j }, nil
	case n == s.B*nm:
		return func(b, h, i, j int) int { return (b*s.N+i)*s.M + j }, nil
	case n == s.B*s.H*nm:
		return func(b, h, i, j int) int { return ((b*s.H+h)*s.N+i)*s.M + j }, nil
	}
	return nil, fmt.Errorf("%w: %s has %d elements, want N·M = %d, B·N·M = %d or B·H·N·M = %d",
		attn.ErrShape, what, n, nm, s.B*nm, s.B*s.H*nm)
}

// Mask returns the dense B·N·M mask that the causal and key-padding options
// of o describe, written from the definitions in package attn rather than
// from any kernel's loop bounds.
func Mask(s attn.Shape, o attn.Options) []bool {
	m := make([]bool, s.B*s.N*s.M)
	for b := range s.B {
		valid := s.M
		if o.KVLen != nil {
			valid = o.KVLen[b]
		}
		for i := range s.N {
			pos := s.M - s.N + i // absolute position of query i
			for j := range s.M {
				m[(b*s.N+i)*s.M+j] = j < valid && (!o.Causal || j <= pos)
			}
		}
	}
	return m
}
