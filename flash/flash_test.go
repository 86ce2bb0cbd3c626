package flash

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

const tol = 1e-5

// kernels are the tile configurations every correctness test runs: the
// default and small odd tiles that put boundaries everywhere.
var kernels = []*Kernel{New(Config{}), New(Config{BlockRows: 5, BlockK: 7})}

// compare runs kn on fresh random inputs and checks out and lse against the
// float64 reference with the equivalent dense mask.
func compare(t *testing.T, kn *Kernel, rng *rand.Rand, s attn.Shape, o attn.Options) {
	t.Helper()
	q := ref.Normal(rng, s.QLen())
	k := ref.Normal(rng, s.KVLen())
	v := ref.Normal(rng, s.KVLen())
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := kn.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	wantOut, wantLSE, err := ref.Attention(s, q, k, v, ref.Spec{Scale: float64(o.Scale), Mask: ref.Mask(s, o)})
	if err != nil {
		t.Fatal(err)
	}
	if e := ref.RelErr(out, wantOut); e > tol {
		t.Errorf("%+v %+v blocks %d/%d: out rel err %.3g", s, o, kn.blockRows, kn.blockK, e)
	}
	e, err := ref.LSEErr(lse, wantLSE)
	if err != nil || e > tol {
		t.Errorf("%+v %+v blocks %d/%d: lse rel err %.3g %v", s, o, kn.blockRows, kn.blockK, e, err)
	}
}

func TestAgainstReference(t *testing.T) {
	rng := ref.FreshRNG(t, 1) // fresh inputs every run
	lengths := []int{1, 7, 63, 64, 65, 200}
	ds := []int{1, 3, 64, 80, 128}
	groups := [][2]int{{4, 4}, {4, 2}, {4, 1}}
	c := 0
	for _, n := range lengths {
		for _, m := range lengths {
			for _, hg := range groups {
				for _, causal := range []bool{false, true} {
					c++
					s := attn.Shape{B: 2, H: hg[0], HKV: hg[1], N: n, M: m, D: ds[c%len(ds)]}
					o := attn.Options{Causal: causal}
					if c%2 == 0 {
						// Random valid lengths, 0 included now and then.
						o.KVLen = []int{rng.IntN(m + 1), rng.IntN(m + 1)}
						if c%6 == 0 {
							o.KVLen[0] = 0
						}
					}
					compare(t, kernels[c%len(kernels)], rng, s, o)
				}
			}
		}
	}
}

func TestHeadSizes(t *testing.T) {
	rng := ref.FreshRNG(t, 2)
	for _, d := range []int{1, 3, 64, 80, 128} {
		for _, kn := range kernels {
			for _, causal := range []bool{false, true} {
				s := attn.Shape{B: 1, H: 4, HKV: 2, N: 65, M: 200, D: d}
				compare(t, kn, rng, s, attn.Options{Causal: causal, Scale: 0.3, KVLen: []int{131}, Workers: 3})
			}
		}
	}
}

func TestEmptyRows(t *testing.T) {
	// Causal with N > M leaves the first N-M queries with no key; a zero
	// key length leaves every query of that batch row with none.
	s := attn.Shape{B: 2, H: 2, HKV: 1, N: 9, M: 4, D: 5}
	o := attn.Options{Causal: true, KVLen: []int{4, 0}}
	rng := rand.New(rand.NewPCG(3, 3))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for _, kn := range kernels {
		out := make([]float32, s.QLen())
		lse := make([]float32, s.LSELen())
		for i := range out {
			out[i] = float32(math.NaN()) // must be overwritten
		}
		if err := kn.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
			t.Fatal(err)
		}
		for row := range s.LSELen() {
			b, i := row/(s.H*s.N), row%s.N
			empty := b == 1 || i < s.N-s.M
			if empty != math.IsInf(float64(lse[row]), -1) {
				t.Errorf("row %d (b=%d i=%d): lse %v, empty=%v", row, b, i, lse[row], empty)
			}
			for _, x := range out[row*s.D : (row+1)*s.D] {
				if math.IsNaN(float64(x)) || (empty && x != 0) {
					t.Fatalf("row %d: out %v", row, out[row*s.D:(row+1)*s.D])
				}
			}
		}
	}
}

// TestLargeLogits uses small integers so that logits up to ±1.6e4 are exact
// in float32: any error then comes from the softmax, not the dot products.
func TestLargeLogits(t *testing.T) {
	rng := ref.FreshRNG(t, 4)
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 70, M: 90, D: 64}
	ints := func(n, r int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.IntN(2*r+1) - r)
		}
		return x
	}
	q, k, v := ints(s.QLen(), 50), ints(s.KVLen(), 5), ref.Normal(rng, s.KVLen())
	for _, causal := range []bool{false, true} {
		o := attn.Options{Scale: 1, Causal: causal}
		out, lse, err := Attention(context.Background(), s, q, k, v, o)
		if err != nil {
			t.Fatal(err)
		}
		wantOut, wantLSE, _ := ref.Attention(s, q, k, v, ref.Spec{Scale: 1, Mask: ref.Mask(s, o)})
		maxLogit := 0.0
		for _, l := range wantLSE {
			maxLogit = max(maxLogit, math.Abs(l))
		}
		if maxLogit < 1e3 {
			t.Fatalf("test inputs too tame: max |lse| %v", maxLogit)
		}
		if e := ref.RelErr(out, wantOut); e > tol {
			t.Errorf("causal=%v: out rel err %.3g", causal, e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
			t.Errorf("causal=%v: lse rel err %.3g %v", causal, e, err)
		}
	}
}

// TestMergeSplit checks the (out, lse) contract: attention over a random
// split of the keys, merged, equals attention over all of them.
func TestMergeSplit(t *testing.T) {
	rng := ref.FreshRNG(t, 5)
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 33, M: 101, D: 24}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	split := 1 + rng.IntN(s.M-1)
	part := func(lo, hi int) (attn.Shape, []float32, []float32) {
		ps := s
		ps.M = hi - lo
		pk := make([]float32, 0, ps.KVLen())
		pv := make([]float32, 0, ps.KVLen())
		for bh := range s.B * s.HKV {
			pk = append(pk, k[(bh*s.M+lo)*s.D:(bh*s.M+hi)*s.D]...)
			pv = append(pv, v[(bh*s.M+lo)*s.D:(bh*s.M+hi)*s.D]...)
		}
		return ps, pk, pv
	}
	ctx := context.Background()
	o := attn.Options{Scale: 0.2}
	s1, k1, v1 := part(0, split)
	s2, k2, v2 := part(split, s.M)
	o1, l1, err1 := Attention(ctx, s1, q, k1, v1, o)
	o2, l2, err2 := Attention(ctx, s2, q, k2, v2, o)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if err := attn.Merge(o1, l1, o2, l2, s.D); err != nil {
		t.Fatal(err)
	}
	wantOut, wantLSE, _ := ref.Attention(s, q, k, v, ref.Spec{Scale: 0.2})
	if e := ref.RelErr(o1, wantOut); e > tol {
		t.Errorf("split at %d: merged out rel err %.3g", split, e)
	}
	if e, err := ref.LSEErr(l1, wantLSE); err != nil || e > tol {
		t.Errorf("split at %d: merged lse rel err %.3g %v", split, e, err)
	}
}

func TestBadInput(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 4, D: 2}
	q, k, v := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out := make([]float32, s.QLen())
	kn := New(Config{})
	ctx := context.Background()
	cases := []struct {
		name    string
		s       attn.Shape
		q, out  []float32
		o       attn.Options
		wantErr error
	}{
		{"short q", s, q[1:], out, attn.Options{}, attn.ErrShape},
		{"nil out", s, q, nil, attn.Options{}, attn.ErrShape},
		{"H%Hkv", attn.Shape{B: 1, H: 3, HKV: 2, N: 3, M: 4, D: 2}, q, out, attn.Options{}, attn.ErrShape},
		{"kvlen", s, q, out, attn.Options{KVLen: []int{5}}, attn.ErrInput},
		{"scale", s, q, out, attn.Options{Scale: float32(math.Inf(1))}, attn.ErrInput},
	}
	for _, c := range cases {
		err := kn.Forward(ctx, c.s, c.q, k, v, c.o, c.out, nil)
		if !errors.Is(err, c.wantErr) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.wantErr)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := kn.Forward(cctx, s, q, k, v, attn.Options{}, out, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: got %v", err)
	}
}

func ExampleAttention() {
	// One batch row, two query heads sharing one key/value head (MQA),
	// three queries over four keys, head size 2, causal.
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 4, D: 2}
	q := make([]float32, s.QLen())
	k := make([]float32, s.KVLen())
	v := []float32{1, 0, 0, 1, 1, 1, 2, 2} // four value rows
	out, lse, err := Attention(context.Background(), s, q, k, v, attn.Options{Causal: true})
	if err != nil {
		panic(err)
	}
	// With zero queries every visible key gets the same weight: query 0
	// (absolute position 1) averages values 0 and 1.
	fmt.Println(out[:2], lse[0])
	// Output: [0.5 0.5] 0.6931472
}

// TestTileBoundaries crosses every tile edge of each kernel: lengths of
// tile-1, tile, tile+1 and 3·tile+5 in both the query and the key
// direction, for query tiles of whole GQA groups.
func TestTileBoundaries(t *testing.T) {
	rng := ref.FreshRNG(t, 10)
	for _, kn := range kernels {
		for _, hg := range [][2]int{{2, 2}, {4, 1}} {
			rowsPerHead := max(1, kn.blockRows/(hg[0]/hg[1]))
			qs := []int{rowsPerHead - 1, rowsPerHead, rowsPerHead + 1, 3*rowsPerHead + 5}
			ks := []int{kn.blockK - 1, kn.blockK, kn.blockK + 1, 3*kn.blockK + 5}
			for _, n := range qs {
				for _, m := range ks {
					if n < 1 {
						continue
					}
					for _, causal := range []bool{false, true} {
						s := attn.Shape{B: 1, H: hg[0], HKV: hg[1], N: n, M: m, D: 17}
						compare(t, kn, rng, s, attn.Options{Causal: causal})
					}
				}
			}
		}
	}
}

// TestPaddingIsInert fills the padded keys and values with NaN and Inf:
// keys past a row's valid length must contribute nothing, not even a 0·NaN.
func TestPaddingIsInert(t *testing.T) {
	rng := ref.FreshRNG(t, 12)
	for _, kn := range kernels {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 4, HKV: 2, N: 70, M: 150, D: 40}
			o := attn.Options{Causal: causal, KVLen: []int{1 + rng.IntN(s.M-1), 0}}
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			wantOut, wantLSE, _ := ref.Attention(s, q, k, v, ref.Spec{Mask: ref.Mask(s, o)})
			bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}
			for b := range s.B {
				for h := range s.HKV {
					for j := o.KVLen[b]; j < s.M; j++ {
						for c := range s.D {
							i := ((b*s.HKV+h)*s.M+j)*s.D + c
							k[i], v[i] = bad[(j+c)%3], bad[(j+c+1)%3]
						}
					}
				}
			}
			out := make([]float32, s.QLen())
			lse := make([]float32, s.LSELen())
			if err := kn.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
				t.Fatal(err)
			}
			if e := ref.RelErr(out, wantOut); e > tol {
				t.Errorf("blocks %d/%d causal=%v kvlen %v: out rel err %.3g", kn.blockRows, kn.blockK, causal, o.KVLen, e)
			}
			if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
				t.Errorf("blocks %d/%d causal=%v: lse rel err %.3g %v", kn.blockRows, kn.blockK, causal, e, err)
			}
		}
	}
}

// TestAttentionChecksBeforeAllocating asks for a shape whose outputs
// would take terabytes, with nil inputs: the error must come before the
// allocation.
func TestAttentionChecksBeforeAllocating(t *testing.T) {
	_, _, err := Attention(context.Background(), attn.Shape{B: 1, H: 1 << 20, HKV: 1, N: 1 << 10, M: 1, D: 1 << 10}, nil, nil, nil, attn.Options{})
	if !errors.Is(err, attn.ErrShape) {
		t.Errorf("huge shape, nil inputs: err = %v, want ErrShape", err)
	}
}
