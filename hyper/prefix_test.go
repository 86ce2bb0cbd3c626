package hyper

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// Under a causal mask the output at a position depends on the queries, keys
// and values up to it only: changing any of the three at position t leaves
// every output at an earlier position unchanged, bit for bit. This holds
// for the rectangles of the recursion (whose keys all precede their
// queries, and where a query's block depends on itself and those keys
// alone), the leading rectangle of N < M and the exact leaves.
func TestCausalPrefixSafe(t *testing.T) {
	rng := testRNG(t, 12)
	cfgs := []Config{
		approx(3),
		{Block: 16, Samples: 8, Min: 40, Projs: 4, Seed: 4}, // exact rectangles below Min among approximate ones
		{Block: -1, Samples: 8, Min: -1, Seed: 5},           // samples only
		{Block: 5, Samples: -1, Min: -1, Projs: 2, Seed: 6}, // blocks only
	}
	for _, sm := range []Sampling{Uniform, ValueNorm} {
		for _, cfg := range cfgs {
			cfg.Sampling = sm
			a := newAttention(t, cfg)
			for _, nm := range [][2]int{{301, 301}, {200, 333}, {250, 181}} {
				s := attn.Shape{B: 2, H: 6, HKV: 2, N: nm[0], M: nm[1], D: 21}
				o := attn.Options{Causal: true, KVLen: []int{s.M, s.M - rng.IntN(s.M/3)}}
				q, k, v := inputs(rng, s)
				out, lse := forward(t, a, s, q, k, v, o)
				shift := s.M - s.N
				for range 4 {
					pos := max(shift, 0) + rng.IntN(s.M-max(shift, 0)) // a position some query sits at
					q2, k2, v2 := slices.Clone(q), slices.Clone(k), slices.Clone(v)
					for b := range s.B {
						for h := range s.H {
							row := (b*s.H+h)*s.N + pos - shift
							for c := range s.D {
								q2[row*s.D+c] = float32(rng.NormFloat64())
							}
						}
						for kvh := range s.HKV {
							row := (b*s.HKV+kvh)*s.M + pos
							for c := range s.D {
								k2[row*s.D+c] = float32(rng.NormFloat64())
								v2[row*s.D+c] = float32(rng.NormFloat64())
							}
						}
					}
					out2, lse2 := forward(t, a, s, q2, k2, v2, o)
					changed := false
					for row := range s.B * s.H * s.N {
						same := slices.Equal(out[row*s.D:(row+1)*s.D], out2[row*s.D:(row+1)*s.D]) && lse[row] == lse2[row]
						if shift+row%s.N >= pos {
							changed = changed || !same
							continue
						}
						if !same {
							t.Fatalf("%v %+v %+v: output at position %d changed with the inputs at position %d",
								sm, cfg, s, shift+row%s.N, pos)
						}
					}
					if !changed {
						t.Fatalf("%v %+v %+v: new inputs at position %d changed no output", sm, cfg, s, pos)
					}
				}
			}
		}
	}
}

// Value-norm sampling stays finite however far apart the logits are: the
// ratio of its numerator to the uniform normaliser overflows a float when
// only one of the two samples catches a large logit.
func TestValueNormLargeLogits(t *testing.T) {
	rng := testRNG(t, 13)
	s := attn.Shape{B: 1, H: 3, HKV: 1, N: 300, M: 300, D: 24}
	cfg := approx(3)
	cfg.Sampling = ValueNorm
	a := newAttention(t, cfg)
	for _, causal := range []bool{false, true} {
		q, k, v := inputs(rng, s)
		for i := range q {
			q[i] *= 16
		}
		for i := range k {
			k[i] *= 16
		}
		spread := logitSpread(s, q, k)
		if spread < 1e3 {
			t.Fatalf("logit spread %.0f, want at least 1e3", spread)
		}
		out, lse := forward(t, a, s, q, k, v, attn.Options{Causal: causal})
		lo, hi := valueRange(s, v)
		for i, x := range out {
			// An average of value rows lies in their range, up to the
			// rounding of its weights.
			slack := 1e-5 * max(-lo[i%s.D], hi[i%s.D])
			if math.IsNaN(float64(x)) || x < lo[i%s.D]-slack || x > hi[i%s.D]+slack {
				t.Fatalf("causal=%v, logit spread %.0f: out[%d] = %v, outside the values' range [%v, %v]",
					causal, spread, i, x, lo[i%s.D], hi[i%s.D])
			}
		}
		for i, l := range lse {
			if math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
				t.Fatalf("causal=%v: lse[%d] = %v", causal, i, l)
			}
		}
	}
}

// logitSpread returns the largest minus the smallest logit of one query
// head against all keys, at the default scale.
func logitSpread(s attn.Shape, q, k []float32) float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	scale := 1 / math.Sqrt(float64(s.D))
	for i := range s.N {
		for j := range s.M {
			var dot float64
			for c := range s.D {
				dot += float64(q[i*s.D+c]) * float64(k[j*s.D+c])
			}
			lo, hi = min(lo, dot*scale), max(hi, dot*scale)
		}
	}
	return hi - lo
}

// valueRange returns each coordinate's smallest and largest value.
func valueRange(s attn.Shape, v []float32) (lo, hi []float32) {
	lo, hi = make([]float32, s.D), make([]float32, s.D)
	for c := range s.D {
		lo[c], hi[c] = float32(math.Inf(1)), float32(math.Inf(-1))
	}
	for i, x := range v {
		lo[i%s.D], hi[i%s.D] = min(lo[i%s.D], x), max(hi[i%s.D], x)
	}
	return lo, hi
}

// A cancelled call returns the context's error once, whichever path it
// takes: the exact fallback, whose kernel runs on several goroutines that
// each see the cancellation, or the approximation.
func TestCancelOneError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, cfg := range []Config{{}, approx(1)} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 4, HKV: 2, N: 300, M: 300, D: 8}
			q, kv := make([]float32, s.QLen()), make([]float32, s.KVLen())
			out := make([]float32, s.QLen())
			a := newAttention(t, cfg)
			o := attn.Options{Causal: causal, Workers: 4}
			err := a.Forward(ctx, s, q, kv, kv, o, out, nil)
			if !errors.Is(err, context.Canceled) || strings.Count(err.Error(), "context canceled") != 1 {
				t.Errorf("%+v causal=%v: got %q, want context.Canceled once", cfg, causal, err)
			}
			// Cancelled in the middle of the call, after the check on
			// entry: every worker of the kernel sees it.
			for after := range 40 {
				err := a.Forward(&countdown{context.Background(), int64(after)}, s, q, kv, kv, o, out, nil)
				if err != nil && (!errors.Is(err, context.Canceled) || strings.Count(err.Error(), "context canceled") != 1) {
					t.Errorf("%+v causal=%v, cancelled after %d checks: got %q, want context.Canceled once", cfg, causal, after, err)
				}
			}
		}
	}
}

// countdown is a context that is cancelled after its Err has been called n
// times, from whichever goroutines.
type countdown struct {
	context.Context
	n int64
}

func (c *countdown) Err() error {
	if atomic.AddInt64(&c.n, -1) < 0 {
		return context.Canceled
	}
	return nil
}

// Fallback names a reason exactly when Forward computes exact attention:
// below Min in the whole call, in every batch row after padding, or, under
// a causal mask, in every part of the recursion (whose leaves are exact),
// or with blocks or samples that take every key. Where it returns "", the
// approximation shows in the output.
func TestFallbackAgreesWithForward(t *testing.T) {
	rng := testRNG(t, 14)
	cfgs := []Config{
		{Block: 16, Samples: 8, Min: 40, Projs: 4, Seed: 1},
		{Block: 16, Samples: 8, Min: -1, Projs: 4, Seed: 2},
		{Block: 40, Samples: 8, Min: -1, Projs: 4, Seed: 3},
		{Block: -1, Samples: 120, Min: -1, Seed: 4},
	}
	type call struct {
		n, m   int
		causal bool
		kvlen  []int
	}
	calls := []call{
		{30, 100, false, nil}, {100, 30, true, nil}, {70, 70, false, nil}, {70, 70, true, nil},
		{101, 101, true, nil}, {150, 90, true, nil}, {90, 150, true, nil}, {90, 150, false, []int{150, 39}},
		{90, 150, false, []int{20, 39}}, {181, 181, true, []int{181, 30}}, {181, 181, true, []int{25, 30}},
	}
	seen := map[bool]int{}
	for _, cfg := range cfgs {
		a := newAttention(t, cfg)
		for _, cl := range calls {
			s := attn.Shape{B: 2, H: 4, HKV: 2, N: cl.n, M: cl.m, D: 19}
			o := attn.Options{Causal: cl.causal, KVLen: cl.kvlen}
			q, k, v := inputs(rng, s)
			out, _ := forward(t, a, s, q, k, v, o)
			want, _ := reference(t, s, q, k, v, o)
			e := ref.RelErr(out, want)
			why := attn.FallbackOf(a, s, o)
			seen[why != ""]++
			switch {
			case why != "" && e > tol:
				t.Errorf("%+v %+v %+v: Fallback says %q, but the error is %.3g", cfg, s, o, why, e)
			case why == "" && e < 1e-3:
				t.Errorf("%+v %+v %+v: Fallback says the call approximates, but the error is %.3g", cfg, s, o, e)
			}
		}
	}
	if seen[true] == 0 || seen[false] == 0 {
		t.Errorf("calls with and without a fallback: %v", seen)
	}
	// Arguments Forward rejects have no reason.
	a := newAttention(t, cfgs[0])
	if why := a.Fallback(attn.Shape{B: 1, H: 3, HKV: 2, N: 5, M: 5, D: 4}, attn.Options{}); why != "" {
		t.Errorf("bad shape: Fallback says %q", why)
	}
}
