package sparse_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/sparse"
)

// show prints a pattern of n queries against m keys, # where visible.
func show(pat flash.Pattern, n, m int) {
	mask, err := sparse.Dense(pat, n, m)
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := range n {
		var b strings.Builder
		for _, v := range mask[i*m : (i+1)*m] {
			if v {
				b.WriteByte('#')
			} else {
				b.WriteByte('.')
			}
		}
		fmt.Println(b.String())
	}
}

func ExampleNewWindow() {
	w, err := sparse.NewWindow(sparse.WindowConfig{Left: 2, Right: 1})
	if err != nil {
		panic(err)
	}
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 6, M: 6, D: 4}
	pat, err := w.Pattern(s, false)
	if err != nil {
		panic(err)
	}
	show(pat, s.N, s.M)
	// Output:
	// ##....
	// ###...
	// ####..
	// .####.
	// ..####
	// ...###
}

func ExampleNewStrided() {
	st, err := sparse.NewStrided(sparse.StridedConfig{Mode: sparse.ModeFixed, Stride: 4, Summary: 1})
	if err != nil {
		panic(err)
	}
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 8, M: 8, D: 4}
	pat, err := st.Pattern(s, true)
	if err != nil {
		panic(err)
	}
	// Before the causal mask: each query's block, and the last key of
	// every block.
	show(pat, s.N, s.M)
	// Output:
	// ####...#
	// ####...#
	// ####...#
	// ####...#
	// ...#####
	// ...#####
	// ...#####
	// ...#####
}

func ExampleNewLongformer() {
	lf, err := sparse.NewLongformer(sparse.LongformerConfig{Left: 1, Right: 1, Globals: []int{0, 5}})
	if err != nil {
		panic(err)
	}
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 8, M: 8, D: 4}
	pat, err := lf.Pattern(s, false)
	if err != nil {
		panic(err)
	}
	show(pat, s.N, s.M)
	// Output:
	// ########
	// ###..#..
	// ####.#..
	// #.####..
	// #..###..
	// ########
	// #....###
	// #....###
}

func ExampleNewBigBird() {
	bb, err := sparse.NewBigBird(sparse.BigBirdConfig{Block: 2, Window: 3, Globals: 1, Random: 1, Seed: 7})
	if err != nil {
		panic(err)
	}
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 12, M: 12, D: 4}
	pat, err := bb.Pattern(s, true)
	if err != nil {
		panic(err)
	}
	// Causal: the random block of each query block is in its past.
	for qb := range 6 {
		fmt.Println(qb, pat.(*sparse.BigBird).RandomBlocks(qb))
	}
	// Output:
	// 0 []
	// 1 []
	// 2 []
	// 3 [1]
	// 4 [1]
	// 5 [3]
}

func ExampleAttention_Forward() {
	w, err := sparse.NewWindow(sparse.WindowConfig{Left: 64})
	if err != nil {
		panic(err)
	}
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 300, M: 300, D: 16}
	q := make([]float32, s.QLen())
	k := make([]float32, s.KVLen())
	v := make([]float32, s.KVLen())
	for i := range v {
		v[i] = 1
	}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	// Batch row 0 is all padding.
	o := attn.Options{Causal: true, KVLen: []int{0, 300}}
	if err := w.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		panic(err)
	}
	last := s.LSELen() - 1 // batch row 1, last head, last query: 65 keys of logit 0
	fmt.Printf("padded row: out %v lse %v\n", out[0], lse[0])
	fmt.Printf("last row: out %.3f lse %.4f\n", out[len(out)-1], lse[last])
	// Output:
	// padded row: out 0 lse -Inf
	// last row: out 1.000 lse 4.1744
}
