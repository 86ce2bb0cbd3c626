package ref

import (
	"math"

	"github.com/attnkit/attn"
)

// AttentionBackward returns the gradients of a loss L with respect to q, k
// and v, given dout = ∂L/∂out, for the attention that Attention computes
// with the same spec: softmax over the visible keys of the scaled logits
// plus any bias. Everything is float64 and dense, from the definitions:
//
//	P = softmax(S),  dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ∘ (dP − rowsum(dO ∘ O)),
//	dQ = scale·dS·K,  dK = scale·dSᵀ·Q
//
// with GQA's key/value gradients summed over the query heads of a group.
// An estimator that attends each query to a set of keys with weights
// (Reformer's union of buckets, HyperAttention's blocks and importance-
// weighted samples) is this attention with a mask and a bias of log
// weight, so one reference serves every mechanism built on softmax. The
// bias gets no gradient: the weights of a fixed draw are constants.
func AttentionBackward(s attn.Shape, q, k, v, dout []float32, spec Spec) (dq, dk, dv []float64, err error) {
	out, _, err := Attention(s, q, k, v, spec)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := s.CheckTensors(q, k, v, dout, nil); err != nil {
		return nil, nil, nil, err
	}
	maskAt, _ := broadcast(s, len(spec.Mask), "mask", spec.Mask == nil)
	biasAt, _ := broadcast(s, len(spec.Bias), "bias", spec.Bias == nil)
	scale := spec.Scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(s.D))
	}
	dq, dk, dv = make([]float64, s.QLen()), make([]float64, s.KVLen()), make([]float64, s.KVLen())
	p := make([]float64, s.M)
	d := s.D
	for b := range s.B {
		for h := range s.H {
			kvh := h / s.Group()
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				qi, gi, oi := q[row*d:][:d], dout[row*d:][:d], out[row*d:][:d]
				mx := math.Inf(-1)
				for j := range s.M {
					p[j] = math.Inf(-1)
					if maskAt != nil && !spec.Mask[maskAt(b, h, i, j)] {
						continue
					}
					kj := k[((b*s.HKV+kvh)*s.M+j)*d:][:d]
					dot := 0.0
					for c := range d {
						dot += float64(qi[c]) * float64(kj[c])
					}
					x := dot * scale
					if biasAt != nil {
						x += spec.Bias[biasAt(b, h, i, j)]
					}
					p[j] = x
					mx = math.Max(mx, x)
				}
				if math.IsInf(mx, -1) {
					continue // a row that sees nothing has no gradient
				}
				sum := 0.0
				for j := range p {
					p[j] = math.Exp(p[j] - mx)
					sum += p[j]
				}
				delta := 0.0 // rowsum(dO ∘ O)
				for c := range d {
					delta += float64(gi[c]) * oi[c]
				}
				for j := range s.M {
					pj := p[j] / sum
					if pj == 0 {
						continue
					}
					kv := ((b*s.HKV+kvh)*s.M + j) * d
					vj, kj := v[kv:][:d], k[kv:][:d]
					dp := 0.0
					for c := range d {
						dp += float64(gi[c]) * float64(vj[c])
						dv[kv+c] += pj * float64(gi[c])
					}
					ds := pj * (dp - delta) * scale
					for c := range d {
						dq[row*d+c] += ds * float64(kj[c])
						dk[kv+c] += ds * float64(qi[c])
					}
				}
			}
		}
	}
	return dq, dk, dv, nil
}
