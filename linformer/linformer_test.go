package linformer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

const tol = 1e-5

func inputs(rng *rand.Rand, s attn.Shape) (q, k, v []float32) {
	return ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
}

func mustNew(t testing.TB, cfg Config) *Linformer {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func forward(t testing.TB, l *Linformer, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float32) {
	t.Helper()
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	if err := l.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return out, lse
}

// formula is the float64 evaluation of Linformer from its definition:
// K' = Eᵀ·K and V' = Fᵀ·V over the valid keys, then softmax(scale·Q·K'ᵀ)·V'.
func formula(l *Linformer, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float64) {
	e, f, err := l.Projections(s.M)
	if err != nil {
		panic(err)
	}
	kk, d := l.K(), s.D
	scale := float64(o.ScaleFor(d))
	out = make([]float64, s.QLen())
	lse = make([]float64, s.LSELen())
	for b := range s.B {
		end := o.KeyEnd(s, b)
		for kvh := range s.HKV {
			kp := make([]float64, kk*d)
			vp := make([]float64, kk*d)
			for j := range end {
				src := ((b*s.HKV+kvh)*s.M + j) * d
				for p := range kk {
					for c := range d {
						kp[p*d+c] += float64(e[j*kk+p]) * float64(k[src+c])
						vp[p*d+c] += float64(f[j*kk+p]) * float64(v[src+c])
					}
				}
			}
			for h := kvh * s.Group(); h < (kvh+1)*s.Group(); h++ {
				for i := range s.N {
					row := (b*s.H+h)*s.N + i
					if end == 0 {
						lse[row] = math.Inf(-1)
						continue
					}
					logit := make([]float64, kk)
					mx := math.Inf(-1)
					for p := range kk {
						for c := range d {
							logit[p] += float64(q[row*d+c]) * kp[p*d+c]
						}
						logit[p] *= scale
						mx = max(mx, logit[p])
					}
					sum := 0.0
					for p := range kk {
						w := math.Exp(logit[p] - mx)
						sum += w
						for c := range d {
							out[row*d+c] += w * vp[p*d+c]
						}
					}
					for c := range d {
						out[row*d+c] /= sum
					}
					lse[row] = mx + math.Log(sum)
				}
			}
		}
	}
	return out, lse
}

func TestAgainstFormula(t *testing.T) {
	rng := ref.FreshRNG(t, 1) // fresh inputs every run
	cases := []struct {
		s attn.Shape
		k int
	}{
		{attn.Shape{B: 2, H: 4, HKV: 2, N: 37, M: 300, D: 24}, 20},
		{attn.Shape{B: 2, H: 4, HKV: 1, N: 70, M: 45, D: 40}, 33},
		{attn.Shape{B: 1, H: 4, HKV: 4, N: 5, M: 1, D: 3}, 16},
		{attn.Shape{B: 2, H: 2, HKV: 1, N: 9, M: 520, D: 64}, 256},
	}
	for n, c := range cases {
		for _, padded := range []bool{false, true} {
			// Supplied projections longer than M: only their first rows
			// are used.
			long := mustNew(t, Config{K: c.k, Seed: uint64(n)})
			e, f, err := long.Projections(c.s.M + 17)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range []*Linformer{mustNew(t, Config{K: c.k, Seed: uint64(n)}), mustNew(t, Config{K: c.k, E: e, F: f})} {
				o := attn.Options{Workers: 1 + n%3}
				if padded {
					o.KVLen = make([]int, c.s.B)
					for b := range o.KVLen {
						o.KVLen[b] = rng.IntN(c.s.M + 1)
					}
					o.KVLen[0] = 0
					o.Scale = 0.3
				}
				q, k, v := inputs(rng, c.s)
				out, lse := forward(t, l, c.s, q, k, v, o)
				wantOut, wantLSE := formula(l, c.s, q, k, v, o)
				name := fmt.Sprintf("%+v k=%d kvlen=%v", c.s, c.k, o.KVLen)
				if e := ref.RelErr(out, wantOut); e > tol {
					t.Errorf("%s: out rel err %.3g", name, e)
				}
				if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
					t.Errorf("%s: lse rel err %.3g %v", name, e, err)
				}
			}
		}
	}
}

// TestPaddingIgnored puts huge values in padding keys and values: the
// result must not change at all.
func TestPaddingIgnored(t *testing.T) {
	rng := ref.FreshRNG(t, 2)
	l := mustNew(t, Config{K: 32})
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 20, M: 300, D: 24}
	o := attn.Options{KVLen: []int{rng.IntN(s.M + 1), rng.IntN(s.M + 1)}}
	q, k, v := inputs(rng, s)
	out1, lse1 := forward(t, l, s, q, k, v, o)
	for b := range s.B {
		for kvh := range s.HKV {
			for j := o.KVLen[b]; j < s.M; j++ {
				base := ((b*s.HKV+kvh)*s.M + j) * s.D
				for c := range s.D {
					k[base+c] = 1e4 * float32(rng.NormFloat64())
					v[base+c] = 1e4 * float32(rng.NormFloat64())
				}
			}
		}
	}
	out2, lse2 := forward(t, l, s, q, k, v, o)
	if !slices.Equal(out1, out2) || !slices.Equal(lse1, lse2) {
		t.Errorf("kvlen=%v: padding keys changed the result", o.KVLen)
	}
}

func TestSeeds(t *testing.T) {
	a := mustNew(t, Config{K: 24, Seed: 7})
	b := mustNew(t, Config{K: 24, Seed: 7})
	// Drawing lazily in different steps gives the same rows.
	a.Projections(10)
	ea, fa, _ := a.Projections(100)
	eb, fb, _ := b.Projections(100)
	if !slices.Equal(ea, eb) || !slices.Equal(fa, fb) {
		t.Error("same seed, different projections")
	}
	if slices.Equal(ea, fa) {
		t.Error("E and F are the same matrix")
	}
	c := mustNew(t, Config{K: 24, Seed: 8})
	if ec, _, _ := c.Projections(100); slices.Equal(ea, ec) {
		t.Error("seeds 7 and 8 give the same projections")
	}
	// Entries are N(0, 1/k).
	sum2 := 0.0
	for _, x := range ea {
		sum2 += float64(x) * float64(x)
	}
	if v := sum2 / float64(len(ea)); math.Abs(v*24-1) > 0.1 {
		t.Errorf("entry variance %.4f, want 1/24", v)
	}
}

// TestLargeInputs scales inputs by 100: no NaN or Inf.
func TestLargeInputs(t *testing.T) {
	rng := ref.FreshRNG(t, 3)
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 50, M: 400, D: 40}
	q, k, v := inputs(rng, s)
	for _, x := range [][]float32{q, k, v} {
		for i := range x {
			x[i] *= 100
		}
	}
	out, lse := forward(t, mustNew(t, Config{K: 64}), s, q, k, v, attn.Options{})
	for _, x := range append(out, lse...) {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("result has %v", x)
		}
	}
}

func TestErrors(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 60, D: 2}
	q, k, v := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out := make([]float32, s.QLen())
	ctx := context.Background()
	l := mustNew(t, Config{K: 8, Length: 50})
	err := l.Forward(ctx, s, q, k, v, attn.Options{}, out, nil)
	if !errors.Is(err, attn.ErrUnsupported) || !strings.Contains(err.Error(), "50") {
		t.Errorf("M = 60 > length 50: %v", err)
	}
	s.M = 50
	k, v = k[:s.KVLen()], v[:s.KVLen()]
	if err := l.Forward(ctx, s, q, k, v, attn.Options{Causal: true}, out, nil); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("causal: %v", err)
	}
	if err := l.Forward(ctx, s, q[1:], k, v, attn.Options{}, out, nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short q: %v", err)
	}
	if err := l.Forward(ctx, s, q, k, v, attn.Options{KVLen: []int{51}}, out, nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("kvlen 51: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Forward(cctx, s, q, k, v, attn.Options{}, out, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	bad := []Config{
		{K: -1},
		{Length: -1},
		{E: make([]float32, 16)},
		{K: 4, E: make([]float32, 16), F: make([]float32, 12)},
		{K: 4, E: make([]float32, 18), F: make([]float32, 18)},
		{K: 4, Length: 5, E: make([]float32, 16), F: make([]float32, 16)},
		{K: 4, E: []float32{float32(math.NaN()), 0, 0, 0}, F: make([]float32, 4)},
	}
	for _, cfg := range bad {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(K %d, Length %d, len(E) %d, len(F) %d) accepted", cfg.K, cfg.Length, len(cfg.E), len(cfg.F))
		}
	}
	if _, _, err := l.Projections(51); err == nil {
		t.Error("Projections(51) of length 50 accepted")
	}
}
