package linformer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// BenchmarkForward times Linformer with k = 256 and exact attention
// (package flash) on the same inputs, B=1, H=8, D=64, not causal:
//
//	go test -run '^$' -bench Forward ./linformer/
func BenchmarkForward(b *testing.B) {
	l, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	mechs := []attn.Mechanism{l, flash.New(flash.Config{})}
	for _, n := range []int{256, 512, 1024, 2048, 4096} {
		s := attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: 64}
		rng := rand.New(rand.NewPCG(1, 2))
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		out := make([]float32, s.QLen())
		lse := make([]float32, s.LSELen())
		for _, m := range mechs {
			b.Run(fmt.Sprintf("n%d/%s", n, m.Name()), func(b *testing.B) {
				for b.Loop() {
					if err := m.Forward(context.Background(), s, q, k, v, attn.Options{}, out, lse); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/token")
			})
		}
	}
}

// BenchmarkBackward times Linformer's Forward and Backward with k = 256
// on the same inputs, B=1, H=8, D=64, not causal; the target is a
// backward pass within 3× the forward:
//
//	go test -run '^$' -bench Backward ./linformer/
func BenchmarkBackward(b *testing.B) {
	l, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []int{1024, 4096} {
		s := attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: 64}
		rng := rand.New(rand.NewPCG(1, 2))
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		dout := ref.Normal(rng, s.QLen())
		out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
		dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
		dE, dF := make([]float32, n*l.K()), make([]float32, n*l.K())
		if err := l.Forward(ctx, s, q, k, v, attn.Options{}, out, lse); err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name string
			run  func() error
		}{
			{"forward", func() error { return l.Forward(ctx, s, q, k, v, attn.Options{}, out, lse) }},
			{"backward", func() error { return l.Backward(ctx, s, q, k, v, out, lse, dout, attn.Options{}, dq, dk, dv) }},
			{"backward+EF", func() error {
				return l.BackwardProjections(ctx, s, q, k, v, out, lse, dout, attn.Options{}, dq, dk, dv, dE, dF)
			}},
		} {
			b.Run(fmt.Sprintf("n%d/%s", n, c.name), func(b *testing.B) {
				for b.Loop() {
					if err := c.run(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/token")
			})
		}
	}
}
