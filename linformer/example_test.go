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
