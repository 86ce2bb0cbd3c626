package flash

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/internal/simd/simdtest"
	"github.com/attnkit/attn/ref"
)

// bf16Kernels are the tile configurations of the bfloat16 tests: the
// default (64-row tiles on the bfloat16 tile path) and tiles of 5 rows,
// which leave most of a tile's panels empty and put tile edges
// everywhere.
var bf16Kernels = []*Kernel{New(Config{}), New(Config{BlockRows: 5, BlockK: 7})}

// bf16Normal returns n standard normal values rounded to bfloat16, and
// the same values as float32 (exactly).
func bf16Normal(rng *rand.Rand, n int) ([]uint16, []float32) {
	b, f := make([]uint16, n), make([]float32, n)
	for i := range b {
		b[i] = half.F32ToBF16(float32(rng.NormFloat64()))
		f[i] = half.BF16ToF32(b[i])
	}
	return b, f
}

// bf16Inputs are the inputs of one bfloat16 test and their float32
// widenings, which the reference gets.
type bf16Inputs struct {
	q, k, v    []uint16
	qf, kf, vf []float32
}

func newBF16Inputs(rng *rand.Rand, s attn.Shape) bf16Inputs {
	var in bf16Inputs
	in.q, in.qf = bf16Normal(rng, s.QLen())
	in.k, in.kf = bf16Normal(rng, s.KVLen())
	in.v, in.vf = bf16Normal(rng, s.KVLen())
	return in
}

// checkBF16Result compares out and lse with the float64 reference on the
// same (bfloat16) inputs. On the bfloat16 tile path each output must be
// within (2^-8 + 1e-5)·Σ_j p_j·|v_j| + 1e-6 of the reference: the probabilities
// are rounded to bfloat16, to nearest (relative error at most 2^-8), and
// the rest is float32 arithmetic. On the float32 fallback the outputs
// must match as Forward's do (relative error 1e-5). The log-sum-exps
// match to 1e-5 on both.
func checkBF16Result(t *testing.T, name string, s attn.Shape, o attn.Options, in bf16Inputs, out, lse []float32) {
	t.Helper()
	spec := ref.Spec{Scale: float64(o.Scale), Mask: ref.Mask(s, o)}
	wantOut, wantLSE, err := ref.Attention(s, in.qf, in.kf, in.vf, spec)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
		t.Errorf("%s: lse rel err %.3g %v", name, e, err)
	}
	if !simd.HasBF16Tile() {
		if e := ref.RelErr(out, wantOut); e > tol {
			t.Errorf("%s (%s): out rel err %.3g", name, BF16Path(), e)
		}
		return
	}
	absV := make([]float32, len(in.vf))
	for i, x := range in.vf {
		absV[i] = float32(math.Abs(float64(x)))
	}
	absOut, _, err := ref.Attention(s, in.qf, in.kf, absV, spec)
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for i, w := range wantOut {
		bound := (1.0/256+1e-5)*absOut[i] + 1e-6
		e := math.Abs(float64(out[i]) - w)
		if !(e <= bound) {
			t.Fatalf("%s: out[%d] = %v, want %v ± %.3g", name, i, out[i], w, bound)
		}
		if absOut[i] > 0 {
			worst = max(worst, (e-1e-6)/absOut[i])
		}
	}
	if testing.Verbose() {
		t.Logf("%s: out rel err %.3g, largest error %.3g of Σ p|v| (bound 2^-8 = %.3g)", name, ref.RelErr(out, wantOut), worst, 1.0/256)
	}
}

func runBF16(t *testing.T, kn *Kernel, s attn.Shape, o attn.Options, in bf16Inputs) (out, lse []float32) {
	t.Helper()
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	for i := range out {
		out[i] = float32(math.NaN()) // must be overwritten
	}
	if err := kn.ForwardBF16(context.Background(), s, in.q, in.k, in.v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return out, lse
}

// TestBF16AgainstReference runs odd sizes (N and M no multiple of any
// block, M != N, head sizes that are no multiple of 32, GQA and MQA, two
// batch rows) causal and not, with and without padding, under every
// kernel family: amx and avx512bf16 take the bfloat16 tile, the others
// the float32 fallback.
func TestBF16AgainstReference(t *testing.T) {
	rng := ref.FreshRNG(t, 22)
	type sizes struct{ n, m, d int }
	cases := []sizes{{37, 37, 24}, {161, 200, 40}, {333, 161, 64}, {37, 333, 80}, {161, 161, 128}, {1, 130, 64}, {200, 1, 40}}
	if testing.Short() {
		cases = cases[:3]
	}
	simdtest.ForEachFamily(t, func(t *testing.T) {
		c := 0
		for _, z := range cases {
			for _, hkv := range []int{2, 1} {
				for _, causal := range []bool{false, true} {
					c++
					s := attn.Shape{B: 2, H: 6, HKV: hkv, N: z.n, M: z.m, D: z.d}
					o := attn.Options{Causal: causal}
					if c%2 == 0 {
						o.KVLen = []int{rng.IntN(z.m + 1), z.m}
						if c%4 == 0 {
							o.KVLen = []int{0, 1 + rng.IntN(z.m)}
						}
					}
					if c%3 == 0 {
						o.Scale = -0.1
					}
					kn := bf16Kernels[c%len(bf16Kernels)]
					in := newBF16Inputs(rng, s)
					out, lse := runBF16(t, kn, s, o, in)
					name := fmt.Sprintf("%+v causal=%v kvlen=%v scale=%v rows=%d", s, causal, o.KVLen, o.Scale, kn.blockRows)
					checkBF16Result(t, name, s, o, in, out, lse)
				}
			}
		}
	})
}

// TestBF16Padding perturbs the padding keys and values (NaN, ±Inf, huge
// values): the results must not change by a bit.
func TestBF16Padding(t *testing.T) {
	rng := ref.FreshRNG(t, 23)
	simdtest.ForEachFamily(t, func(t *testing.T) {
		for _, kn := range bf16Kernels {
			for _, causal := range []bool{false, true} {
				s := attn.Shape{B: 2, H: 4, HKV: 2, N: 70, M: 300, D: 40}
				o := attn.Options{Causal: causal, KVLen: []int{1 + rng.IntN(s.M-1), 129}}
				in := newBF16Inputs(rng, s)
				out1, lse1 := runBF16(t, kn, s, o, in)
				checkBF16Result(t, fmt.Sprintf("padding causal=%v", causal), s, o, in, out1, lse1)
				bad := []uint16{0x7fc0, 0x7f80, 0xff80, half.F32ToBF16(3e38)} // NaN, +Inf, -Inf, huge
				for b := range s.B {
					for h := range s.HKV {
						for j := o.KVLen[b]; j < s.M; j++ {
							for c := range s.D {
								i := ((b*s.HKV+h)*s.M+j)*s.D + c
								in.k[i], in.v[i] = bad[(j+c)%4], bad[(j+c+1)%4]
							}
						}
					}
				}
				out2, lse2 := runBF16(t, kn, s, o, in)
				if !slices.Equal(f32Bits(out1), f32Bits(out2)) || !slices.Equal(f32Bits(lse1), f32Bits(lse2)) {
					t.Errorf("rows %d causal=%v: the padding changed the results", kn.blockRows, causal)
				}
			}
		}
	})
}

func f32Bits(x []float32) []uint32 {
	b := make([]uint32, len(x))
	for i, v := range x {
		b[i] = math.Float32bits(v)
	}
	return b
}

// TestBF16LargeLogits uses small integers so that logits reach about
// 1e4 and are exact in float32: no NaN or Inf, and the bound holds.
func TestBF16LargeLogits(t *testing.T) {
	rng := ref.FreshRNG(t, 24)
	ints := func(n, lo, hi int) ([]uint16, []float32) {
		b, f := make([]uint16, n), make([]float32, n)
		for i := range b {
			f[i] = float32(lo + rng.IntN(hi-lo+1))
			b[i] = half.F32ToBF16(f[i])
		}
		return b, f
	}
	simdtest.ForEachFamily(t, func(t *testing.T) {
		s := attn.Shape{B: 1, H: 4, HKV: 2, N: 150, M: 260, D: 128}
		var in bf16Inputs
		in.q, in.qf = ints(s.QLen(), 0, 16)
		in.k, in.kf = ints(s.KVLen(), 0, 16)
		in.v, in.vf = ints(s.KVLen(), -8, 8)
		for _, causal := range []bool{false, true} {
			o := attn.Options{Scale: 1, Causal: causal}
			out, lse := runBF16(t, New(Config{}), s, o, in)
			for i, x := range out {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("causal=%v: out[%d] = %v", causal, i, x)
				}
			}
			big := 0.0
			for _, x := range lse {
				big = max(big, math.Abs(float64(x)))
			}
			if big < 5e3 {
				t.Fatalf("test inputs too tame: max |lse| %v", big)
			}
			checkBF16Result(t, fmt.Sprintf("large causal=%v", causal), s, o, in, out, lse)
		}
	})
}

// TestBF16Workers checks that the results are the same bits for any
// worker count.
func TestBF16Workers(t *testing.T) {
	rng := ref.FreshRNG(t, 25)
	s := attn.Shape{B: 2, H: 6, HKV: 2, N: 161, M: 290, D: 80}
	in := newBF16Inputs(rng, s)
	simdtest.ForEachFamily(t, func(t *testing.T) {
		for _, causal := range []bool{false, true} {
			var first []uint32
			for _, w := range []int{1, 2, 3} {
				o := attn.Options{Causal: causal, Workers: w, KVLen: []int{290, 200}}
				out, lse := runBF16(t, New(Config{}), s, o, in)
				got := append(f32Bits(out), f32Bits(lse)...)
				if first == nil {
					first = got
				} else if !slices.Equal(first, got) {
					t.Errorf("causal=%v: Workers=%d differs from Workers=1", causal, w)
				}
			}
		}
	})
}

// TestBF16EmptyRows: rows that see no key (causal with N > M, a zero key
// length) get out 0 and lse -Inf, as from Forward.
func TestBF16EmptyRows(t *testing.T) {
	s := attn.Shape{B: 2, H: 2, HKV: 1, N: 9, M: 4, D: 5}
	o := attn.Options{Causal: true, KVLen: []int{4, 0}}
	rng := rand.New(rand.NewPCG(3, 3))
	in := newBF16Inputs(rng, s)
	simdtest.ForEachFamily(t, func(t *testing.T) {
		out, lse := runBF16(t, New(Config{}), s, o, in)
		want, wantLSE := make([]float32, s.QLen()), make([]float32, s.LSELen())
		if err := New(Config{}).Forward(context.Background(), s, in.qf, in.kf, in.vf, o, want, wantLSE); err != nil {
			t.Fatal(err)
		}
		for row := range s.LSELen() {
			b, i := row/(s.H*s.N), row%s.N
			empty := b == 1 || i < s.N-s.M
			if empty != math.IsInf(float64(lse[row]), -1) || math.IsInf(float64(wantLSE[row]), -1) != empty {
				t.Errorf("row %d: lse %v (Forward %v), empty=%v", row, lse[row], wantLSE[row], empty)
			}
			for c, x := range out[row*s.D : (row+1)*s.D] {
				if math.IsNaN(float64(x)) || (empty && x != want[row*s.D+c]) {
					t.Fatalf("row %d: out %v, Forward %v", row, out[row*s.D:(row+1)*s.D], want[row*s.D:(row+1)*s.D])
				}
			}
		}
		checkBF16Result(t, "empty rows", s, o, in, out, lse)
	})
}

// TestBF16BadInput checks that ForwardBF16 and AttentionBF16 refuse what
// Forward refuses, with the same errors.
func TestBF16BadInput(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 4, D: 2}
	// One spare value, for a slice one too long.
	q, k, v := make([]float32, s.QLen()+1), make([]float32, s.KVLen()+1), make([]float32, s.KVLen())
	qb, kb, vb := make([]uint16, s.QLen()+1), make([]uint16, s.KVLen()+1), make([]uint16, s.KVLen())
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	kn := New(Config{})
	ctx := context.Background()
	cases := []struct {
		name     string
		s        attn.Shape
		nq, nk   int // lengths of q and k
		out, lse []float32
		o        attn.Options
		wantErr  error
	}{
		{"short q", s, s.QLen() - 1, s.KVLen(), out, nil, attn.Options{}, attn.ErrShape},
		{"long k", s, s.QLen(), s.KVLen() + 1, out, nil, attn.Options{}, attn.ErrShape},
		{"nil out", s, s.QLen(), s.KVLen(), nil, nil, attn.Options{}, attn.ErrShape},
		{"short out", s, s.QLen(), s.KVLen(), out[1:], nil, attn.Options{}, attn.ErrShape},
		{"short lse", s, s.QLen(), s.KVLen(), out, lse[1:], attn.Options{}, attn.ErrShape},
		{"H%Hkv", attn.Shape{B: 1, H: 3, HKV: 2, N: 3, M: 4, D: 2}, s.QLen(), s.KVLen(), out, nil, attn.Options{}, attn.ErrShape},
		{"zero D", attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 4}, 0, 0, out, nil, attn.Options{}, attn.ErrShape},
		{"kvlen", s, s.QLen(), s.KVLen(), out, nil, attn.Options{KVLen: []int{5}}, attn.ErrInput},
		{"kvlens", s, s.QLen(), s.KVLen(), out, nil, attn.Options{KVLen: []int{1, 2}}, attn.ErrShape},
		{"scale", s, s.QLen(), s.KVLen(), out, nil, attn.Options{Scale: float32(math.NaN())}, attn.ErrInput},
		{"workers", s, s.QLen(), s.KVLen(), out, nil, attn.Options{Workers: -1}, attn.ErrInput},
	}
	for _, c := range cases {
		want := kn.Forward(ctx, c.s, q[:c.nq], k[:c.nk], v[:s.KVLen()], c.o, c.out, c.lse)
		got := kn.ForwardBF16(ctx, c.s, qb[:c.nq], kb[:c.nk], vb[:s.KVLen()], c.o, c.out, c.lse)
		if !errors.Is(got, c.wantErr) || want == nil || got.Error() != want.Error() {
			t.Errorf("%s: ForwardBF16 %v, Forward %v, want %v", c.name, got, want, c.wantErr)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := kn.ForwardBF16(cctx, s, qb[:s.QLen()], kb[:s.KVLen()], vb, attn.Options{}, out, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: got %v", err)
	}
	// AttentionBF16 checks before it allocates: a shape whose outputs
	// would take terabytes, with nil inputs, is an error.
	_, _, err := AttentionBF16(ctx, attn.Shape{B: 1, H: 1 << 20, HKV: 1, N: 1 << 10, M: 1, D: 1 << 10}, nil, nil, nil, attn.Options{})
	if !errors.Is(err, attn.ErrShape) {
		t.Errorf("huge shape, nil inputs: err = %v, want ErrShape", err)
	}
}

// TestBF16Path checks that the path follows the kernels in use.
func TestBF16Path(t *testing.T) {
	simdtest.ForEachFamily(t, func(t *testing.T) {
		p := BF16Path()
		tile := simd.Kernels() == "amx" || simd.Kernels() == "avx512bf16"
		if tile && p != simd.Kernels() || !tile && p != "widened to f32 ("+simd.Kernels()+")" {
			t.Errorf("kernels %s: path %q", simd.Kernels(), p)
		}
	})
}

func ExampleKernel_ForwardBF16() {
	// One head, two queries, three keys, head size 4. Each query points
	// at one key (logit 10, the others 0), so its output is almost that
	// key's value on either path (the bfloat16 tile or the float32
	// fallback).
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 2, M: 3, D: 4}
	// bfloat16 is the upper half of a float32: these small integers
	// convert exactly by truncation.
	bf16 := func(xs ...float32) []uint16 {
		b := make([]uint16, len(xs))
		for i, x := range xs {
			b[i] = uint16(math.Float32bits(x) >> 16)
		}
		return b
	}
	q := bf16(1, 0, 0, 0, 0, 0, 1, 0)
	k := bf16(10, 0, 0, 0, 0, 10, 0, 0, 0, 0, 10, 0)
	v := bf16(1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4)
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := New(Config{}).ForwardBF16(context.Background(), s, q, k, v, attn.Options{Scale: 1}, out, lse); err != nil {
		panic(err)
	}
	for i := range s.N {
		fmt.Printf("query %d: out %.2f, lse %.2f\n", i, out[i*s.D:(i+1)*s.D], lse[i])
	}
	// Output:
	// query 0: out [1.00 2.00 3.00 4.00], lse 10.00
	// query 1: out [-1.00 -2.00 -3.00 -4.00], lse 10.00
}
