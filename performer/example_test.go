package performer_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/performer"
	"github.com/attnkit/attn/ref"
)

func Example() {
	// 1024 keys of head size 32 at unit scale, so that FAVOR+ is
	// accurate: entries of size d^(-1/4).
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 1024, M: 1024, D: 32}
	rng := rand.New(rand.NewPCG(1, 2))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for _, x := range [][]float32{q, k} {
		for i := range x {
			x[i] *= 0.42
		}
	}
	ctx := context.Background()
	o := attn.Options{Causal: true}
	exact, _, _ := flash.Attention(ctx, s, q, k, v, o)

	p, err := performer.New(performer.Config{Features: 1024, Seed: 7})
	if err != nil {
		fmt.Println(err)
		return
	}
	out := make([]float32, s.QLen())
	if err := p.Forward(ctx, s, q, k, v, o, out, nil); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("relative error below 10%:", relErr(out, exact) < 0.1)
	// Output:
	// relative error below 10%: true
}

func Example_fallback() {
	// Below Min keys the Performer is exact attention.
	p, _ := performer.New(performer.Config{})
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 2, D: 2}
	out := make([]float32, 2)
	err := p.Forward(context.Background(), s, []float32{1, 0}, []float32{1, 0, 0, 1}, []float32{1, 0, 0, 1}, attn.Options{Scale: 1}, out, nil)
	fmt.Printf("min %d: out %.4f %v\n", p.Min(), out, err)
	// Output:
	// min 2048: out [0.7311 0.2689] <nil>
}

func relErr(got, want []float32) float64 {
	var d, n float64
	for i := range got {
		e := float64(got[i] - want[i])
		d += e * e
		n += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(d / n)
}
