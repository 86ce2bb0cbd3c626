package linformer_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/linformer"
)

func Example() {
	// Supplied projections: three keys projected to k = 2 rows. E sums
	// the first two keys into projected key 0 and takes the third as
	// projected key 1; F does the same with the values.
	e := []float32{
		1, 0,
		1, 0,
		0, 1,
	}
	l, err := linformer.New(linformer.Config{K: 2, E: e, F: e})
	if err != nil {
		fmt.Println(err)
		return
	}
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 3, D: 2}
	q := []float32{0, 0} // equal logits: the mean of the projected values
	k := []float32{1, 0, 0, 1, 1, 1}
	v := []float32{1, 0, 1, 0, 0, 4}
	out := make([]float32, 2)
	lse := make([]float32, 1)
	if err := l.Forward(context.Background(), s, q, k, v, attn.Options{}, out, lse); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("out %.2f, lse %.4f\n", out, lse[0])

	err = l.Forward(context.Background(), s, q, k, v, attn.Options{Causal: true}, out, lse)
	fmt.Println(errors.Is(err, attn.ErrUnsupported))
	// Output:
	// out [1.00 2.00], lse 0.6931
	// true
}

// A training step of E and F: Forward, the gradients of a loss with
// respect to the output, BackwardProjections, a gradient step, and
// SetProjections to install the new parameters.
func ExampleLinformer_BackwardProjections() {
	const m, kk = 6, 3
	l, err := linformer.New(linformer.Config{K: kk, Length: m, Seed: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	e, f, _ := l.Projections(m) // the model's parameters, m×k each
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 4, M: m, D: 2}
	q := make([]float32, s.QLen())
	k := make([]float32, s.KVLen())
	v := make([]float32, s.KVLen())
	target := make([]float32, s.QLen())
	for i := range q {
		q[i], target[i] = float32(i%3)-1, float32(i%2)
	}
	for i := range k {
		k[i], v[i] = float32(i%5)/5, float32(i%4)-1.5
	}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	dout := make([]float32, s.QLen())
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	dE, dF := make([]float32, m*kk), make([]float32, m*kk)
	ctx := context.Background()
	var losses []float32
	for range 20 {
		if err := l.Forward(ctx, s, q, k, v, attn.Options{}, out, lse); err != nil {
			fmt.Println(err)
			return
		}
		// loss = ½‖out − target‖², so ∂loss/∂out = out − target.
		var loss float32
		for i := range out {
			dout[i] = out[i] - target[i]
			loss += dout[i] * dout[i] / 2
		}
		losses = append(losses, loss)
		if err := l.BackwardProjections(ctx, s, q, k, v, out, lse, dout, attn.Options{}, dq, dk, dv, dE, dF); err != nil {
			fmt.Println(err)
			return
		}
		for i := range e {
			e[i] -= 0.02 * dE[i]
			f[i] -= 0.02 * dF[i]
		}
		if err := l.SetProjections(m, e, f); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Printf("loss %.1f, after 20 steps below 0.1: %v\n", losses[0], losses[len(losses)-1] < 0.1)
	// Output:
	// loss 13.1, after 20 steps below 0.1: true
}
