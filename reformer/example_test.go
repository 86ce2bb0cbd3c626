package reformer_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/reformer"
)

// Reformer attention on a causal GQA input. Every row uses a subset of the
// keys exact attention uses, so its log-sum-exp is never larger.
func ExampleNew() {
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 500, M: 500, D: 40}
	rng := rand.New(rand.NewPCG(1, 2))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	o := attn.Options{Causal: true}

	// Min: -1 never falls back to exact attention (500 tokens is below
	// the default).
	lsh, err := reformer.New(reformer.Config{Hashes: 4, Bucket: 32, Min: -1, Seed: 7})
	if err != nil {
		panic(err)
	}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := lsh.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		panic(err)
	}
	_, exactLSE, err := flash.Attention(context.Background(), s, q, k, v, o)
	if err != nil {
		panic(err)
	}
	subset := true
	for i := range lse {
		subset = subset && lse[i] <= exactLSE[i]+1e-5
	}
	fmt.Println(lsh.Name(), "lse <= exact lse on every row:", subset)
	// Output:
	// reformer lse <= exact lse on every row: true
}

// With one chunk holding every key, all rounds see all keys; the duplicate
// correction counts each pair once, so the rounds merge to exact attention.
func ExampleNew_oneChunk() {
	s := attn.Shape{B: 1, H: 2, HKV: 2, N: 100, M: 100, D: 24}
	rng := rand.New(rand.NewPCG(3, 4))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())

	lsh, _ := reformer.New(reformer.Config{Hashes: 8, Bucket: 128, Min: -1})
	out := make([]float32, s.QLen())
	if err := lsh.Forward(context.Background(), s, q, k, v, attn.Options{}, out, nil); err != nil {
		panic(err)
	}
	exact, _, _ := flash.Attention(context.Background(), s, q, k, v, attn.Options{})
	var worst float64
	for i := range out {
		worst = math.Max(worst, math.Abs(float64(out[i]-exact[i])))
	}
	fmt.Println("max |reformer - exact| < 1e-5:", worst < 1e-5)
	// Output:
	// max |reformer - exact| < 1e-5: true
}

// Decoding one token at a time: each step attends to the cached keys of its
// buckets and the recent window, at a cost that does not grow with the
// cache.
func ExampleDecoder() {
	const h, hkv, d = 4, 2, 32
	rng := rand.New(rand.NewPCG(5, 6))
	dec, err := reformer.NewDecoder(reformer.Config{Hashes: 2, Bucket: 16, Buckets: 32, Window: 8}, h, hkv, d, 0)
	if err != nil {
		panic(err)
	}
	// Prefill 1000 tokens ([Hkv][1000][D] keys and values), then decode.
	if err := dec.Append(ref.Normal(rng, hkv*1000*d), ref.Normal(rng, hkv*1000*d)); err != nil {
		panic(err)
	}
	out := make([]float32, h*d)
	lse := make([]float32, h)
	for range 3 {
		if err := dec.Append(ref.Normal(rng, hkv*d), ref.Normal(rng, hkv*d)); err != nil {
			panic(err)
		}
		if err := dec.Step(ref.Normal(rng, h*d), out, lse); err != nil {
			panic(err)
		}
	}
	fmt.Println("tokens in the cache:", dec.Len())
	fmt.Println("finite lse:", !math.IsInf(float64(lse[0]), 0) && !math.IsNaN(float64(lse[0])))
	// Output:
	// tokens in the cache: 1003
	// finite lse: true
}

// The attn.Decoder of Reformer attention: a prompt in one chunk, then a
// token a step, for two sequences of different lengths. Its outputs are
// those of causal Forward over the same tokens.
func ExampleLSH_NewDecoder() {
	const h, hkv, d = 4, 2, 32
	rng := rand.New(rand.NewPCG(7, 8))
	lsh, err := reformer.New(reformer.Config{Hashes: 2, Bucket: 16, Min: -1})
	if err != nil {
		panic(err)
	}
	dec, err := lsh.NewDecoder(attn.DecodeConfig{B: 2, H: h, HKV: hkv, D: d, MaxLen: 4096})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	// Prompts of 300 and 120 tokens: the second sequence's last 180
	// positions of the chunk are padding.
	const n = 300
	out := make([]float32, 2*h*n*d)
	if err := dec.Step(ctx, ref.Normal(rng, 2*h*n*d), ref.Normal(rng, 2*hkv*n*d), ref.Normal(rng, 2*hkv*n*d), n, []int{300, 120}, out, nil); err != nil {
		panic(err)
	}
	for range 5 {
		out := make([]float32, 2*h*d)
		if err := dec.Step(ctx, ref.Normal(rng, 2*h*d), ref.Normal(rng, 2*hkv*d), ref.Normal(rng, 2*hkv*d), 1, nil, out, nil); err != nil {
			panic(err)
		}
	}
	fmt.Println("lengths:", dec.Len(0), dec.Len(1))
	// Output:
	// lengths: 305 125
}
