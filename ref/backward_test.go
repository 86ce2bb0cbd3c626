package ref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
)

// TestAttentionBackwardFiniteDifferences checks the analytic gradients
// against central differences of Attention itself, with GQA, a causal and
// padding mask and a bias, on odd sizes.
func TestAttentionBackwardFiniteDifferences(t *testing.T) {
	const seed = 17
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 5, M: 7, D: 3}
	q, k, v, g := Normal(rng, s.QLen()), Normal(rng, s.KVLen()), Normal(rng, s.KVLen()), Normal(rng, s.QLen())
	spec := Spec{Mask: Mask(s, attn.Options{Causal: true, KVLen: []int{7, 4}}), Bias: make([]float64, s.N*s.M)}
	for i := range spec.Bias {
		spec.Bias[i] = rng.NormFloat64()
	}
	dq, dk, dv, err := AttentionBackward(s, q, k, v, g, spec)
	if err != nil {
		t.Fatal(err)
	}
	loss := func() float64 {
		out, _, err := Attention(s, q, k, v, spec)
		if err != nil {
			t.Fatal(err)
		}
		l := 0.0
		for i, o := range out {
			l += o * float64(g[i])
		}
		return l
	}
	const h = 1e-3
	for _, x := range []struct {
		name string
		in   []float32
		grad []float64
	}{{"q", q, dq}, {"k", k, dk}, {"v", v, dv}} {
		for i := range x.in {
			old := x.in[i]
			x.in[i] = old + h
			up := loss()
			x.in[i] = old - h
			down := loss()
			x.in[i] = old
			fd := (up - down) / (2 * float64(h))
			if math.Abs(fd-x.grad[i]) > 2e-3*max(1, math.Abs(fd)) {
				t.Errorf("d%s[%d] = %.6g, finite difference %.6g", x.name, i, x.grad[i], fd)
			}
		}
	}
}
