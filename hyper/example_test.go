package hyper_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/hyper"
)

func normal(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// HyperAttention is called like every mechanism; here with small blocks and
// few samples, so that it approximates even at this length (by default it
// is exact below 4096 tokens), and compared with exact attention.
func Example() {
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 2000, M: 2000, D: 40}
	rng := rand.New(rand.NewPCG(1, 2))
	q, k, v := normal(rng, s.QLen()), normal(rng, s.KVLen()), normal(rng, s.KVLen())
	// Make attention peaked: every query of head 0 and 2 has one key
	// close to it.
	for h := 0; h < s.H; h += s.Group() {
		for i := range s.N {
			kvh := h / s.Group()
			j := (i*7 + h) % s.M // a permutation
			for c := range s.D {
				k[(kvh*s.M+j)*s.D+c] = 2 * q[(h*s.N+i)*s.D+c]
			}
		}
	}

	a, err := hyper.New(hyper.Config{Block: 128, Samples: 128, Min: -1, Seed: 42})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	o := attn.Options{Causal: true}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := a.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
		panic(err)
	}
	exact, _, err := flash.Attention(ctx, s, q, k, v, o)
	if err != nil {
		panic(err)
	}
	var diff, norm float64
	for i := range out {
		d := float64(out[i] - exact[i])
		diff += d * d
		norm += float64(exact[i]) * float64(exact[i])
	}
	fmt.Println(a.Name(), "relative error below 0.5:", math.Sqrt(diff/norm) < 0.5)
	// Output: hyper relative error below 0.5: true
}

// With a block that holds every key, the block-diagonal part is all of
// attention and the result is exact.
func ExampleNew_oneBlock() {
	s := attn.Shape{B: 2, H: 2, HKV: 1, N: 300, M: 500, D: 24}
	rng := rand.New(rand.NewPCG(3, 4))
	q, k, v := normal(rng, s.QLen()), normal(rng, s.KVLen()), normal(rng, s.KVLen())
	a, _ := hyper.New(hyper.Config{Block: 1 << 20, Min: -1})
	o := attn.Options{KVLen: []int{500, 77}}
	out := make([]float32, s.QLen())
	if err := a.Forward(context.Background(), s, q, k, v, o, out, nil); err != nil {
		panic(err)
	}
	exact, _, _ := flash.Attention(context.Background(), s, q, k, v, o)
	var worst float64
	for i := range out {
		worst = max(worst, math.Abs(float64(out[i]-exact[i])))
	}
	fmt.Println("max difference below 1e-5:", worst < 1e-5)
	// Output: max difference below 1e-5: true
}

// Buckets are Gray-code ranks of the sign pattern: in rank order, each
// pattern differs from the next in one sign.
func ExampleGrayRank() {
	byRank := make([]uint32, 8)
	for pattern := range uint32(8) {
		byRank[hyper.GrayRank(pattern)] = pattern
	}
	for _, p := range byRank {
		fmt.Printf("%03b ", p)
	}
	fmt.Println()
	// Output: 000 001 011 010 110 111 101 100
}

// SortLSH buckets depend on direction only: a vector and any positive
// multiple of it share a bucket, and its opposite has every sign flipped.
func ExampleSortLSH() {
	l, err := hyper.NewSortLSH(7, 4, 1)
	if err != nil {
		panic(err)
	}
	b, _ := l.Buckets([]float32{
		1, 2, -1, 0.5,
		3, 6, -3, 1.5,
		-1, -2, 1, -0.5,
	})
	// Buckets are ranks among the 2^7 sign patterns.
	fmt.Println(b[0] == b[1], b[0] != b[2], b[0] < 128)
	// Output: true true true
}

// A decoder attends each new token to its recent block, the cached keys
// around its bucket and a few sampled columns. Here the blocks and samples
// cover the whole (short) sequence, so decoding is exact attention.
func ExampleAttention_NewDecoder() {
	cfg := attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 16}
	a, _ := hyper.New(hyper.Config{Block: 32, Samples: 64, Min: -1})
	dec, err := a.NewDecoder(cfg)
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	const prompt, total = 20, 30
	q := normal(rng, cfg.H*total*cfg.D)
	k, v := normal(rng, total*cfg.D), normal(rng, total*cfg.D)
	ctx := context.Background()
	at := func(x []float32, heads, p, n int) []float32 { // positions [p, p+n) of every head
		var y []float32
		for h := range heads {
			y = append(y, x[(h*total+p)*cfg.D:(h*total+p+n)*cfg.D]...)
		}
		return y
	}
	out := make([]float32, cfg.H*prompt*cfg.D)
	if err := dec.Step(ctx, at(q, 2, 0, prompt), k[:prompt*cfg.D], v[:prompt*cfg.D], prompt, nil, out, nil); err != nil {
		panic(err)
	}
	last := make([]float32, cfg.H*cfg.D)
	for p := prompt; p < total; p++ {
		if err := dec.Step(ctx, at(q, 2, p, 1), at(k, 1, p, 1), at(v, 1, p, 1), 1, nil, last, nil); err != nil {
			panic(err)
		}
	}
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: total, M: total, D: cfg.D}
	exact, _, _ := flash.Attention(ctx, s, q, k, v, attn.Options{Causal: true})
	var worst float64
	for h := range cfg.H {
		for c := range cfg.D {
			worst = max(worst, math.Abs(float64(last[h*cfg.D+c]-exact[(h*total+total-1)*cfg.D+c])))
		}
	}
	fmt.Println(dec.Len(0), "positions; last token within 1e-5 of exact:", worst < 1e-5)
	// Output: 30 positions; last token within 1e-5 of exact: true
}
