package kvcache

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/ref"
)

// TestDecoderRagged decodes a batch of three sequences of different
// lengths, a prompt chunk with padding and then one token a step, and
// compares every output with one causal Forward over each sequence alone.
func TestDecoderRagged(t *testing.T) {
	const seed = 41
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx := context.Background()
	const b, h, hkv, d, chunk, steps = 3, 6, 2, 19, 23, 9
	prompt := []int{23, 7, 16} // real positions of the chunk, per sequence
	cfg := attn.DecodeConfig{B: b, H: h, HKV: hkv, D: d, Workers: 3}
	dec, err := NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Each sequence's whole tokens: its prompt then steps more.
	type whole struct{ q, k, v []float32 }
	seqs := make([]whole, b)
	for i := range seqs {
		n := prompt[i] + steps
		seqs[i] = whole{ref.Normal(rng, h*n*d), ref.Normal(rng, hkv*n*d), ref.Normal(rng, hkv*n*d)}
	}
	// gather builds the batch tensor of positions [p0(i), p0(i)+n) of
	// every sequence, zero where a sequence has fewer.
	gather := func(x func(whole) []float32, heads, n int, p0 func(i int) int, cnt func(i int) int) []float32 {
		out := make([]float32, b*heads*n*d)
		for i, sq := range seqs {
			tot := len(x(sq)) / (heads * d)
			for hd := range heads {
				for j := range cnt(i) {
					copy(out[((i*heads+hd)*n+j)*d:][:d], x(sq)[(hd*tot+p0(i)+j)*d:][:d])
				}
			}
		}
		return out
	}
	got := make([][]float32, b) // per sequence [H][T][D]
	for i := range got {
		got[i] = make([]float32, h*(prompt[i]+steps)*d)
	}
	scatter := func(out []float32, n int, p0 func(i int) int, cnt func(i int) int) {
		for i := range seqs {
			tot := prompt[i] + steps
			for hd := range h {
				for j := range cnt(i) {
					copy(got[i][(hd*tot+p0(i)+j)*d:][:d], out[((i*h+hd)*n+j)*d:][:d])
				}
			}
		}
	}
	zero := func(int) int { return 0 }
	pc := func(i int) int { return prompt[i] }
	q := gather(func(w whole) []float32 { return w.q }, h, chunk, zero, pc)
	k := gather(func(w whole) []float32 { return w.k }, hkv, chunk, zero, pc)
	v := gather(func(w whole) []float32 { return w.v }, hkv, chunk, zero, pc)
	out, lse := make([]float32, b*h*chunk*d), make([]float32, b*h*chunk)
	if err := dec.Step(ctx, q, k, v, chunk, prompt, out, lse); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		for hd := range h {
			for j := prompt[i]; j < chunk; j++ {
				if l := lse[(i*h+hd)*chunk+j]; !math.IsInf(float64(l), -1) {
					t.Fatalf("padding position %d of sequence %d has lse %v, want -Inf", j, i, l)
				}
			}
		}
	}
	scatter(out, chunk, zero, pc)
	one := func(int) int { return 1 }
	for st := range steps {
		at := func(i int) int { return prompt[i] + st }
		q := gather(func(w whole) []float32 { return w.q }, h, 1, at, one)
		k := gather(func(w whole) []float32 { return w.k }, hkv, 1, at, one)
		v := gather(func(w whole) []float32 { return w.v }, hkv, 1, at, one)
		out := make([]float32, b*h*d)
		if err := dec.Step(ctx, q, k, v, 1, nil, out, nil); err != nil {
			t.Fatal(err)
		}
		scatter(out, 1, at, one)
	}
	for i, sq := range seqs {
		if dec.Len(i) != prompt[i]+steps {
			t.Errorf("Len(%d) = %d, want %d", i, dec.Len(i), prompt[i]+steps)
		}
		n := prompt[i] + steps
		s := attn.Shape{B: 1, H: h, HKV: hkv, N: n, M: n, D: d}
		want, _, err := ref.Attention(s, sq.q, sq.k, sq.v, ref.Spec{Mask: ref.Mask(s, attn.Options{Causal: true})})
		if err != nil {
			t.Fatal(err)
		}
		if e := ref.RelErr(got[i], want); e > 1e-5 {
			t.Errorf("sequence %d: decoded outputs differ from the float64 causal reference by %.2g", i, e)
		}
	}
	if dec.Bytes() <= 0 {
		t.Errorf("Bytes = %d", dec.Bytes())
	}
	dec.Reset()
	if dec.Len(0) != 0 {
		t.Errorf("after Reset Len = %d", dec.Len(0))
	}
}

func TestDecoderErrors(t *testing.T) {
	for _, cfg := range []attn.DecodeConfig{
		{B: 0, H: 1, HKV: 1, D: 8},
		{B: 1, H: 3, HKV: 2, D: 8},
		{B: 1, H: 1, HKV: 1, D: 8, Storage: "f8"},
		{B: 1, H: 1, HKV: 1, D: 8, Sinks: 2},
		{B: 1, H: 1, HKV: 1, D: 8, Window: min(1<<40, math.MaxInt)},
	} {
		if _, err := NewDecoder(cfg); err == nil {
			t.Errorf("NewDecoder(%+v) = nil error", cfg)
		}
	}
	dec, err := NewDecoder(attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 4})
	if err != nil {
		t.Fatal(err)
	}
	q, kv, out := make([]float32, 2*2*3*4), make([]float32, 2*3*4), make([]float32, 2*2*3*4)
	for _, c := range []struct {
		name  string
		err   error
		wants error
	}{
		{"short q", dec.Step(context.Background(), q[1:], kv, kv, 3, nil, out, nil), attn.ErrShape},
		{"n = 0", dec.Step(context.Background(), nil, nil, nil, 0, nil, nil, nil), attn.ErrInput},
		{"valid > n", dec.Step(context.Background(), q, kv, kv, 3, []int{4, 0}, out, nil), attn.ErrInput},
		{"one valid count", dec.Step(context.Background(), q, kv, kv, 3, []int{1}, out, nil), attn.ErrShape},
	} {
		if !errors.Is(c.err, c.wants) {
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.wants)
		}
	}
}

// TestDecodeWorkers checks that a decode step gives the same bits for any
// worker count: the cache is split into spans by its length alone.
func TestDecodeWorkers(t *testing.T) {
	const seed = 43
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	ctx := context.Background()
	for _, c := range []struct{ h, hkv, held int }{{8, 2, 1500}, {32, 1, 5003}, {4, 4, 70}} {
		for _, dt := range []DType{F32, BF16} {
			const d = 40
			cache, err := New(Config{B: 2, HKV: c.hkv, D: d, DType: dt})
			if err != nil {
				t.Fatal(err)
			}
			kv := 2 * c.hkv * c.held * d
			if err := cache.Append(ref.Normal(rng, kv), ref.Normal(rng, kv), c.held); err != nil {
				t.Fatal(err)
			}
			q := ref.Normal(rng, 2*c.h*d)
			var first []float32
			for _, w := range []int{1, 2, 3, 8} {
				out, lse := make([]float32, len(q)), make([]float32, 2*c.h)
				if err := cache.Attend(ctx, c.h, q, attn.Options{Workers: w}, out, lse); err != nil {
					t.Fatal(err)
				}
				if first == nil {
					first = out
					continue
				}
				for i := range out {
					if out[i] != first[i] {
						t.Fatalf("%+v %v: workers %d differ from 1 worker at %d", c, dt, w, i)
					}
				}
			}
		}
	}
}

// TestDecoderAppend checks that positions taken by Append are seen by the
// next steps as if they had gone through Step.
func TestDecoderAppend(t *testing.T) {
	const seed = 47
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	ctx := context.Background()
	cfg := attn.DecodeConfig{B: 2, H: 4, HKV: 2, D: 9}
	a, _ := NewDecoder(cfg)
	s, _ := NewDecoder(cfg)
	const n = 13
	q, k, v := ref.Normal(rng, 2*4*n*9), ref.Normal(rng, 2*2*n*9), ref.Normal(rng, 2*2*n*9)
	valid := []int{13, 5}
	if err := a.Append(ctx, k, v, n, valid); err != nil {
		t.Fatal(err)
	}
	if err := s.Step(ctx, q, k, v, n, valid, make([]float32, len(q)), nil); err != nil {
		t.Fatal(err)
	}
	q1, k1, v1 := ref.Normal(rng, 2*4*9), ref.Normal(rng, 2*2*9), ref.Normal(rng, 2*2*9)
	o1, o2 := make([]float32, len(q1)), make([]float32, len(q1))
	if err := a.Step(ctx, q1, k1, v1, 1, nil, o1, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Step(ctx, q1, k1, v1, 1, nil, o2, nil); err != nil {
		t.Fatal(err)
	}
	for i := range o1 {
		if o1[i] != o2[i] {
			t.Fatalf("output %d after Append %v, after Step %v", i, o1[i], o2[i])
		}
	}
	if a.Len(1) != 6 {
		t.Errorf("Len(1) = %d, want 6", a.Len(1))
	}
	full, _ := NewDecoder(attn.DecodeConfig{B: 1, H: 1, HKV: 1, D: 2, MaxLen: 3})
	if err := full.Append(ctx, make([]float32, 8), make([]float32, 8), 4, nil); !errors.Is(err, attn.ErrFull) {
		t.Errorf("past MaxLen: %v, want ErrFull", err)
	}
}

// storedTol is the relative error a decode step may show against float64
// attention over the stored (already rounded) rows of type dt: float32
// rounding, but with the CPU's bfloat16 arithmetic (simd.NativeBF16) the
// queries and probabilities are rounded to bfloat16 too, 2^-9 a term,
// which averages down over the keys to a few parts in a thousand
// (measured 0.0040 at most over 80 runs of the stored-rows, eviction and
// long-span tests, about 20000 steps, 0.0036 the next worst). With
// the CPU's int4 arithmetic (simd.NativeU4) I4 queries are rounded to
// int8 as well, up to 1/254 of the row's largest value a term, times
// codes centred on 8: the scores move by about a hundredth, which the
// tests' outputs show as errors of about a percent, most at D = 128
// (measured 0.0168 at most over 100 runs of the int4, eviction,
// stored-rows, long-span and range tests, 327 of their 295972 checks
// above 0.01; 0.027 at most over 20 runs before the codes were
// centred); a missing scale or zero would show as errors of order 1.
// Without it, I4's values are summed in two parts over each span of
// rows, the codes times their scales and the zeros (see addZeros), each
// far larger than their sum where the values average out, as the tests'
// random ones do: float32 rounding of the parts then shows in the sum,
// more the longer the span (measured up to 2.4e-5 with spans of 1024
// rows, 1.1e-5 with 512).
func storedTol(dt DType, tol float64) float64 {
	switch {
	case dt == BF16 && simd.NativeBF16():
		return 1e-2
	case dt == I4 && simd.NativeU4():
		return 0.04
	case dt == I4:
		return max(tol, 1e-4)
	}
	return tol
}
