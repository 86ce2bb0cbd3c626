package linear_test

import (
	"context"
	"fmt"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/linear"
)

func ExampleAttention_Forward() {
	// Two queries at 0, so φ(q) = (1, 1), and two keys: φ(0, 0) = (1, 1)
	// gives weight 2 and φ(1, 1) = (2, 2) weight 4.
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 2, M: 2, D: 2}
	q := []float32{0, 0, 0, 0}
	k := []float32{0, 0, 1, 1}
	v := []float32{1, 0, 0, 1}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	a := linear.New(linear.Config{})
	if err := a.Forward(context.Background(), s, q, k, v, attn.Options{Causal: true}, out, lse); err != nil {
		fmt.Println(err)
		return
	}
	for i := range s.N {
		fmt.Printf("query %d: out %.3f, lse %.3f\n", i, out[i*2:i*2+2], lse[i])
	}
	// Output:
	// query 0: out [1.000 0.000], lse 0.693
	// query 1: out [0.333 0.667], lse 1.792
}

func ExampleState() {
	// Decoding one token at a time gives the causal pass above.
	a := linear.New(linear.Config{})
	st, err := a.NewState(1, 1, 1, 2, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	keys := [][]float32{{0, 0}, {1, 1}}
	values := [][]float32{{1, 0}, {0, 1}}
	out := make([]float32, 2)
	for t := range keys {
		if err := st.Append(keys[t], values[t], 1, nil); err != nil {
			fmt.Println(err)
			return
		}
		if err := st.Attend([]float32{0, 0}, out, nil); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("token %d: out %.3f\n", t, out)
	}
	// Output:
	// token 0: out [1.000 0.000]
	// token 1: out [0.333 0.667]
}

func ExampleAttention_NewDecoder() {
	// The keys and values of the Forward example as a prompt of two
	// positions, then a third token: each step attends causally to the
	// state carried over from the earlier ones.
	a := linear.New(linear.Config{})
	dec, err := a.NewDecoder(attn.DecodeConfig{B: 1, H: 1, HKV: 1, D: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	out := make([]float32, 4)
	if err := dec.Step(ctx, []float32{0, 0, 0, 0}, []float32{0, 0, 1, 1}, []float32{1, 0, 0, 1}, 2, nil, out, nil); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("prompt: out %.3f\n", out)
	// A third key φ(0, 0) = (1, 1), weight 2, with value (1, 1).
	if err := dec.Step(ctx, []float32{0, 0}, []float32{0, 0}, []float32{1, 1}, 1, nil, out[:2], nil); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("token 2: out %.3f, length %d\n", out[:2], dec.Len(0))
	// Output:
	// prompt: out [1.000 0.000 0.333 0.667]
	// token 2: out [0.500 0.750], length 3
}
