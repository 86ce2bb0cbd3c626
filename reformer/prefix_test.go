package reformer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// perturbFrom returns copies of q, k and v with fresh random values at
// every position >= t (absolute positions: query i is at M-N+i), or only
// at t when only is set.
func perturbFrom(rng *rand.Rand, s attn.Shape, q, k, v []float32, t int, only bool) (q2, k2, v2 []float32) {
	q2, k2, v2 = slices.Clone(q), slices.Clone(k), slices.Clone(v)
	touch := func(x []float32, rows, n, shift int) {
		for r := range rows {
			for i := range n {
				if p := shift + i; p == t || (!only && p > t) {
					for c := range s.D {
						x[(r*n+i)*s.D+c] = 3 * float32(rng.NormFloat64())
					}
				}
			}
		}
	}
	touch(q2, s.B*s.H, s.N, s.M-s.N)
	touch(k2, s.B*s.HKV, s.M, 0)
	touch(v2, s.B*s.HKV, s.M, 0)
	return q2, k2, v2
}

// checkPrefix fails unless the rows of out and lse at positions < t are
// bitwise those of want.
func checkPrefix(t *testing.T, what string, s attn.Shape, pos int, out, lse, wantOut, wantLSE []float32) {
	t.Helper()
	for bh := range s.B * s.H {
		for i := range s.N {
			if s.M-s.N+i >= pos {
				break
			}
			row := bh*s.N + i
			if !slices.Equal(out[row*s.D:(row+1)*s.D], wantOut[row*s.D:(row+1)*s.D]) || lse[row] != wantLSE[row] {
				t.Fatalf("%s: row %d of head %d (position %d) changed when positions >= %d did", what, i, bh, s.M-s.N+i, pos)
			}
		}
	}
}

// Under the causal mask the output at position p is a function of the
// inputs at positions <= p alone: changing q, k and v at t (or at every
// position from t on) leaves every earlier row bit for bit as it was.
func TestCausalIsPrefixSafe(t *testing.T) {
	rng := testRNG(t, 30)
	for _, c := range []struct {
		cfg Config
		s   attn.Shape
		o   attn.Options
	}{
		{Config{Hashes: 3, Bucket: 16, Min: -1}, attn.Shape{B: 2, H: 4, HKV: 2, N: 301, M: 301, D: 24}, attn.Options{}},
		{Config{Hashes: 2, Bucket: 7, Buckets: 100, Window: 5, Min: -1, Seed: 3}, attn.Shape{B: 1, H: 6, HKV: 2, N: 97, M: 250, D: 40}, attn.Options{Workers: 3}},
		{Config{Hashes: 4, Bucket: 5, Min: -1, ExcludeSelf: true}, attn.Shape{B: 2, H: 3, HKV: 1, N: 250, M: 250, D: 9}, attn.Options{KVLen: []int{250, 177}}},
		{Config{Hashes: 2, Bucket: 6, Min: -1, SharedQK: true}, attn.Shape{B: 1, H: 2, HKV: 2, N: 249, M: 249, D: 17}, attn.Options{}},
		{Config{}, attn.Shape{B: 1, H: 2, HKV: 1, N: 130, M: 130, D: 8}, attn.Options{}}, // below Min: exact
		{Config{ExcludeSelf: true}, attn.Shape{B: 1, H: 2, HKV: 1, N: 300, M: 300, D: 8}, attn.Options{}},
	} {
		l := mustNew(t, c.cfg)
		s, o := c.s, c.o
		o.Causal = true
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		out, lse := forward(t, l, s, q, k, v, o)
		for _, pos := range []int{s.M - 1, s.M - 2, s.M / 2, s.M - s.N + 1, 1 + rng.IntN(s.M-1)} {
			for _, only := range []bool{true, false} {
				q2, k2, v2 := perturbFrom(rng, s, q, k, v, pos, only)
				out2, lse2 := forward(t, l, s, q2, k2, v2, o)
				checkPrefix(t, fmt.Sprintf("%+v %+v only %v", c.cfg, s, only), s, pos, out2, lse2, out, lse)
			}
		}
	}
}

// Under the causal mask a sequence's first L outputs do not depend on how
// long the pass is: a language model's loss at a position is the same
// whatever window it is evaluated in.
func TestCausalDoesNotDependOnLength(t *testing.T) {
	rng := testRNG(t, 31)
	for _, cfg := range []Config{
		{Hashes: 3, Bucket: 8, Min: -1},
		{Hashes: 2, Bucket: 5, Window: 3, Min: -1, ExcludeSelf: true, Seed: 9},
	} {
		l := mustNew(t, cfg)
		long := attn.Shape{B: 1, H: 4, HKV: 2, N: 333, M: 333, D: 24}
		q, k, v := ref.Normal(rng, long.QLen()), ref.Normal(rng, long.KVLen()), ref.Normal(rng, long.KVLen())
		o := attn.Options{Causal: true}
		out, lse := forward(t, l, long, q, k, v, o)
		for _, n := range []int{1, 64, 65, 200, 332} {
			s := long
			s.N, s.M = n, n
			head := func(x []float32, heads int, d int) []float32 {
				var y []float32
				for h := range heads {
					y = append(y, x[h*long.N*d:][:n*d]...)
				}
				return y
			}
			outN, lseN := forward(t, l, s, head(q, s.H, s.D), head(k, s.HKV, s.D), head(v, s.HKV, s.D), o)
			if !slices.Equal(outN, head(out, s.H, s.D)) || !slices.Equal(lseN, head(lse, s.H, 1)) {
				t.Errorf("%+v: the first %d rows of a %d-token pass differ from a %d-token pass", cfg, n, long.N, n)
			}
		}
	}
}
