package flash

import (
	"context"
	"errors"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// paddedKV stores rows with a stride wider than D, as a cache with aligned
// rows does.
type paddedKV struct {
	s      attn.Shape
	stride int
	k, v   []float32
}

func newPaddedKV(s attn.Shape, k, v []float32) *paddedKV {
	p := &paddedKV{s: s, stride: s.D + 3}
	p.k = make([]float32, s.B*s.HKV*s.M*p.stride)
	p.v = make([]float32, len(p.k))
	for row := range s.B * s.HKV * s.M {
		copy(p.k[row*p.stride:], k[row*s.D:(row+1)*s.D])
		copy(p.v[row*p.stride:], v[row*s.D:(row+1)*s.D])
	}
	return p
}

func (p *paddedKV) row(x []float32, b, kvh, j int) []float32 {
	return x[((b*p.s.HKV+kvh)*p.s.M+j)*p.stride:][:p.s.D]
}

func (p *paddedKV) PackK(dst []float32, ld, b, kvh, j0, n int) {
	for j := range n {
		for c, x := range p.row(p.k, b, kvh, j0+j) {
			dst[c*ld+j] = x
		}
	}
}

func (p *paddedKV) PackV(dst []float32, ld, b, kvh, j0, n int) {
	for j := range n {
		copy(dst[j*ld:], p.row(p.v, b, kvh, j0+j))
	}
}

func TestForwardKV(t *testing.T) {
	rng := ref.FreshRNG(t, 9)
	s := attn.Shape{B: 2, H: 6, HKV: 2, N: 45, M: 131, D: 40}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	o := attn.Options{Causal: true, KVLen: []int{100, 131}}
	wantOut, wantLSE, _ := ref.Attention(s, q, k, v, ref.Spec{Mask: ref.Mask(s, o)})
	for _, kn := range kernels {
		out := make([]float32, s.QLen())
		lse := make([]float32, s.LSELen())
		if err := kn.ForwardKV(context.Background(), s, q, newPaddedKV(s, k, v), o, nil, out, lse); err != nil {
			t.Fatal(err)
		}
		if e := ref.RelErr(out, wantOut); e > tol {
			t.Errorf("out rel err %.3g", e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
			t.Errorf("lse rel err %.3g %v", e, err)
		}
	}
	kn := New(Config{})
	ctx := context.Background()
	kv := newPaddedKV(s, k, v)
	out := make([]float32, s.QLen())
	for _, c := range []struct {
		name string
		err  error
		call func() error
	}{
		{"nil kv", attn.ErrInput, func() error { return kn.ForwardKV(ctx, s, q, nil, o, nil, out, nil) }},
		{"short q", attn.ErrShape, func() error { return kn.ForwardKV(ctx, s, q[1:], kv, o, nil, out, nil) }},
		{"short lse", attn.ErrShape, func() error { return kn.ForwardKV(ctx, s, q, kv, o, nil, out, make([]float32, 3)) }},
		{"bad shape", attn.ErrShape, func() error { return kn.ForwardKV(ctx, attn.Shape{}, q, kv, o, nil, out, nil) }},
		{"bad kvlen", attn.ErrShape, func() error {
			return kn.ForwardKV(ctx, s, q, kv, attn.Options{KVLen: []int{1}}, nil, out, nil)
		}},
		{"nil pattern", attn.ErrInput, func() error {
			return kn.ForwardPattern(ctx, s, q, k, v, o, nil, out, nil)
		}},
	} {
		if err := c.call(); !errors.Is(err, c.err) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.err)
		}
	}
}
