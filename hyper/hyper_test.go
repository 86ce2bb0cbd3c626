package hyper

import (
	"context"
	"errors"
	"flag"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

const tol = 1e-5

var seedFlag = flag.Uint64("seed", 0, "replay the random inputs of a logged stream")

// testRNG returns the generator of a test's random inputs: PCG(id, s) with
// s fresh every run, or -seed's, logged so that a failure can be replayed.
func testRNG(t testing.TB, id uint64) *rand.Rand {
	t.Helper()
	s := *seedFlag
	if s == 0 {
		s = rand.Uint64()
	}
	t.Logf("inputs from PCG(%d, %d); replay with -seed=%d", id, s, s)
	return rand.New(rand.NewPCG(id, s))
}

// all is a length no test input reaches: a block or sample count that
// covers every key.
const all = 1 << 20

func newAttention(t testing.TB, cfg Config) *Attention {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func inputs(rng *rand.Rand, s attn.Shape) (q, k, v []float32) {
	return ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
}

func forward(t testing.TB, m attn.Mechanism, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float32) {
	t.Helper()
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	if err := m.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return out, lse
}

func reference(t testing.TB, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float64) {
	t.Helper()
	out, lse, err := ref.Attention(s, q, k, v, ref.Spec{Scale: float64(o.Scale), Mask: ref.Mask(s, o)})
	if err != nil {
		t.Fatal(err)
	}
	return out, lse
}

// randomKVLen returns nil or random valid lengths, 0 among them now and
// then.
func randomKVLen(rng *rand.Rand, b, m int) []int {
	if rng.IntN(3) == 0 {
		return nil
	}
	l := make([]int, b)
	for i := range l {
		l[i] = rng.IntN(m + 1)
		if rng.IntN(4) == 0 {
			l[i] = 0
		}
	}
	return l
}

// shapes are the odd sizes the exactness tests sweep: lengths that are no
// multiple of any block, head sizes that are no power of two, MHA, GQA and
// MQA, N < M, N = M and N > M.
func shapes() []attn.Shape {
	var out []attn.Shape
	dims := [][2]int{{37, 37}, {61, 150}, {150, 61}, {1, 90}, {97, 1}, {130, 129}}
	groups := [][2]int{{4, 4}, {4, 2}, {4, 1}}
	ds := []int{24, 40, 3}
	for c, nm := range dims {
		g := groups[c%len(groups)]
		out = append(out, attn.Shape{B: 2, H: g[0], HKV: g[1], N: nm[0], M: nm[1], D: ds[c%len(ds)]})
	}
	return out
}

// checkExact runs a on fresh inputs for every shape, causal and not, with
// random padding and scale, and compares with the float64 reference.
func checkExact(t *testing.T, a *Attention, seed uint64) {
	rng := testRNG(t, seed) // fresh inputs every run
	for _, s := range shapes() {
		for _, causal := range []bool{false, true} {
			o := attn.Options{Causal: causal, KVLen: randomKVLen(rng, s.B, s.M)}
			if rng.IntN(2) == 0 {
				o.Scale = 0.3
			}
			q, k, v := inputs(rng, s)
			out, lse := forward(t, a, s, q, k, v, o)
			wantOut, wantLSE := reference(t, s, q, k, v, o)
			if e := ref.RelErr(out, wantOut); e > tol {
				t.Errorf("%+v %+v: out rel err %.3g", s, o, e)
			}
			if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
				t.Errorf("%+v %+v: lse rel err %.3g %v", s, o, e, err)
			}
		}
	}
}

// With one block holding every key the block-diagonal part is exact
// attention and nothing is left to sample.
func TestOneBlockIsExact(t *testing.T) {
	checkExact(t, newAttention(t, Config{Block: all, Min: -1}), 1)
}

// Without a block part and with a sample count that covers every key, the
// sampled part takes every key with weight 1.
func TestAllSamplesIsExact(t *testing.T) {
	for _, sm := range []Sampling{Uniform, ValueNorm} {
		checkExact(t, newAttention(t, Config{Block: -1, Samples: all, Min: -1, Sampling: sm}), 2)
	}
}

// Small blocks plus samples that cover the rest of the keys are exact too:
// this runs the sorting, the block-diagonal part, the exclusion of a
// block's own keys from its samples, the merge and the causal recursion.
func TestBlocksPlusAllSamplesIsExact(t *testing.T) {
	for _, block := range []int{1, 7, 16} {
		checkExact(t, newAttention(t, Config{Block: block, Samples: all, Min: -1, Projs: 3}), 3)
	}
}

// Below Min the call is the exact kernel's, bit for bit.
func TestFallback(t *testing.T) {
	rng := testRNG(t, 4)
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 100, M: 5000, D: 24}
	q, k, v := inputs(rng, s)
	for _, causal := range []bool{false, true} {
		o := attn.Options{Causal: causal, KVLen: []int{4000}}
		got, gotLSE := forward(t, newAttention(t, Config{}), s, q, k, v, o)
		want, wantLSE := forward(t, flash.New(flash.Config{}), s, q, k, v, o)
		if !slices.Equal(got, want) || !slices.Equal(gotLSE, wantLSE) {
			t.Errorf("causal=%v: below Min the output differs from the exact kernel", causal)
		}
	}
}

// trial is a set of inputs with their exact output, for measuring errors
// against a budget. The exact kernel is the reference here: its error is
// far below the approximation errors measured.
type trial struct {
	s       attn.Shape
	o       attn.Options
	q, k, v []float32
	want    []float64
}

func trials(t *testing.T, s attn.Shape, o attn.Options, gen func(rng *rand.Rand) (q, k, v []float32)) []trial {
	const draws = 3
	var ts []trial
	for i := range draws {
		q, k, v := gen(rand.New(rand.NewPCG(5, uint64(i))))
		out, _ := forward(t, flash.New(flash.Config{}), s, q, k, v, o)
		want := make([]float64, len(out))
		for i, x := range out {
			want[i] = float64(x)
		}
		ts = append(ts, trial{s, o, q, k, v, want})
	}
	return ts
}

// meanErr is the mean relative error of a over the trials.
func meanErr(t *testing.T, a *Attention, ts []trial) float64 {
	var sum float64
	for _, tr := range ts {
		out, _ := forward(t, a, tr.s, tr.q, tr.k, tr.v, tr.o)
		sum += ref.RelErr(out, tr.want)
	}
	return sum / float64(len(ts))
}

// planted returns inputs where every third query has a key close to it in
// direction and large in the logits: the entries sortLSH has to find.
func planted(s attn.Shape) func(rng *rand.Rand) (q, k, v []float32) {
	return func(rng *rand.Rand) (q, k, v []float32) {
		q, k, v = inputs(rng, s)
		d := s.D
		for i := 0; i < s.N; i += 3 {
			j := rng.IntN(s.M)
			qi, kj := q[i*d:(i+1)*d], k[j*d:(j+1)*d]
			for c := range d {
				kj[c] = 2*qi[c] + 0.1*float32(rng.NormFloat64())
			}
		}
		return q, k, v
	}
}

// The error against exact attention falls as blocks and samples grow, on
// random inputs and on inputs with planted large entries, with and without
// the causal recursion. Value-norm sampling is held to random inputs: its
// numerator and normaliser come from independent samples, and a planted
// entry outside the blocks that one sample catches and the other misses
// makes its error erratic (see Sampling).
func TestErrorFallsWithBudget(t *testing.T) {
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1000, M: 1000, D: 24}
	random := func(rng *rand.Rand) (q, k, v []float32) { return inputs(rng, s) }
	budgets := []int{8, 48, 200}
	for _, in := range []struct {
		name string
		gen  func(rng *rand.Rand) (q, k, v []float32)
	}{{"random", random}, {"planted", planted(s)}} {
		for _, causal := range []bool{false, true} {
			ts := trials(t, s, attn.Options{Causal: causal}, in.gen)
			for _, sm := range []Sampling{Uniform, ValueNorm} {
				if sm == ValueNorm && in.name == "planted" {
					continue
				}
				prev := math.Inf(1)
				for _, n := range budgets {
					a := newAttention(t, Config{Block: n, Samples: n, Min: -1, Sampling: sm, Seed: 9})
					e := meanErr(t, a, ts)
					t.Logf("%s causal=%v %v block=samples=%d: rel err %.4f", in.name, causal, sm, n, e)
					if e >= prev {
						t.Errorf("%s causal=%v %v: error %.4f at budget %d is not below %.4f", in.name, causal, sm, e, n, prev)
					}
					prev = e
				}
			}
		}
	}
	// Each part alone improves with its own budget.
	ts := trials(t, s, attn.Options{}, planted(s))
	for _, cfg := range [][2]Config{
		{{Block: 16, Samples: 32, Min: -1}, {Block: 16, Samples: 256, Min: -1}},
		{{Block: 16, Samples: 32, Min: -1}, {Block: 256, Samples: 32, Min: -1}},
	} {
		small := meanErr(t, newAttention(t, cfg[0]), ts)
		large := meanErr(t, newAttention(t, cfg[1]), ts)
		if large >= small {
			t.Errorf("%+v → %+v: error %.4f did not fall below %.4f", cfg[0], cfg[1], large, small)
		}
	}
}

// On planted inputs the sortLSH blocks find the large entries: blocks plus
// samples beat twice the samples alone, the same number of pairs.
func TestLSHFindsPlantedEntries(t *testing.T) {
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1000, M: 1000, D: 24}
	ts := trials(t, s, attn.Options{}, planted(s))
	withBlocks := meanErr(t, newAttention(t, Config{Block: 64, Samples: 64, Min: -1, Projs: 5}), ts)
	samplesOnly := meanErr(t, newAttention(t, Config{Block: -1, Samples: 128, Min: -1}), ts)
	t.Logf("blocks+samples %.4f, samples only %.4f", withBlocks, samplesOnly)
	if withBlocks >= samplesOnly {
		t.Errorf("LSH blocks (err %.4f) do not beat uniform sampling alone (err %.4f) on planted entries", withBlocks, samplesOnly)
	}
}

// approx is a configuration that approximates on small inputs: several
// blocks, few samples and the causal recursion several levels deep.
func approx(seed uint64) Config {
	return Config{Block: 16, Samples: 8, Min: -1, Projs: 4, Seed: seed}
}

// No key after position t contributes to the output at t: changing keys
// and values after t leaves outputs up to t unchanged, bit for bit, for
// N < M, N = M and N > M. (TestCausalPrefixSafe changes queries too.)
func TestCausalNoFuture(t *testing.T) {
	rng := testRNG(t, 6)
	for _, sm := range []Sampling{Uniform, ValueNorm} {
		cfg := approx(3)
		cfg.Sampling = sm
		a := newAttention(t, cfg)
		for _, nm := range [][2]int{{301, 301}, {200, 333}, {250, 180}} {
			s := attn.Shape{B: 2, H: 4, HKV: 2, N: nm[0], M: nm[1], D: 24}
			o := attn.Options{Causal: true, KVLen: []int{s.M, rng.IntN(s.M + 1)}}
			q, k, v := inputs(rng, s)
			out, lse := forward(t, a, s, q, k, v, o)
			pos := 1 + rng.IntN(s.M-1) // change keys at positions > pos
			k2, v2 := slices.Clone(k), slices.Clone(v)
			for bh := range s.B * s.HKV {
				for j := pos + 1; j < s.M; j++ {
					for c := range s.D {
						k2[(bh*s.M+j)*s.D+c] = float32(rng.NormFloat64())
						v2[(bh*s.M+j)*s.D+c] = float32(rng.NormFloat64())
					}
				}
			}
			out2, lse2 := forward(t, a, s, q, k2, v2, o)
			for row := range s.B * s.H * s.N {
				i := row % s.N
				if s.M-s.N+i > pos {
					continue
				}
				if !slices.Equal(out[row*s.D:(row+1)*s.D], out2[row*s.D:(row+1)*s.D]) || lse[row] != lse2[row] {
					t.Fatalf("%v %+v: output of query %d (position %d) changed with keys after position %d",
						sm, s, i, s.M-s.N+i, pos)
				}
			}
		}
	}
}

// Padding keys contribute nothing: garbage past each valid length leaves
// the output unchanged, and without a causal mask the result equals the
// call on the truncated keys.
func TestPaddingInvariance(t *testing.T) {
	rng := testRNG(t, 7)
	a := newAttention(t, approx(4))
	for _, causal := range []bool{false, true} {
		s := attn.Shape{B: 1, H: 4, HKV: 1, N: 170, M: 230, D: 40}
		valid := 1 + rng.IntN(s.M-1)
		o := attn.Options{Causal: causal, KVLen: []int{valid}}
		q, k, v := inputs(rng, s)
		out, lse := forward(t, a, s, q, k, v, o)
		k2, v2 := slices.Clone(k), slices.Clone(v)
		for i := valid * s.D; i < len(k2); i++ {
			// Finite: NaN would reach the output through the exact kernel
			// wherever it multiplies a masked key's zero weight.
			k2[i], v2[i] = 1e3*float32(rng.NormFloat64()), 1e3*float32(rng.NormFloat64())
		}
		out2, lse2 := forward(t, a, s, q, k2, v2, o)
		if !slices.Equal(out, out2) || !slices.Equal(lse, lse2) {
			t.Errorf("causal=%v: keys past the valid length %d changed the output", causal, valid)
		}
		if causal {
			continue
		}
		st := s
		st.M = valid
		out3, lse3 := forward(t, a, st, q, k[:st.KVLen()], v[:st.KVLen()], attn.Options{})
		if !slices.Equal(out, out3) || !slices.Equal(lse, lse3) {
			t.Errorf("padding to %d of %d keys differs from the truncated call", valid, s.M)
		}
	}
}

// GQA reads each key/value head for its whole group without copying: the
// heads of a group get what they get when called alone against their
// key/value head.
func TestGQA(t *testing.T) {
	rng := testRNG(t, 8)
	a := newAttention(t, approx(5))
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 123, M: 123, D: 24}
	for _, causal := range []bool{false, true} {
		o := attn.Options{Causal: causal, KVLen: []int{100, 123}}
		q, k, v := inputs(rng, s)
		out, lse := forward(t, a, s, q, k, v, o)
		// Heads {hh, 2+hh} are member hh of kv heads 0 and 1: one MHA call.
		for hh := range s.Group() {
			sm := s
			sm.H = s.HKV
			var qm []float32
			for b := range s.B {
				for kvh := range s.HKV {
					h := kvh*s.Group() + hh
					qm = append(qm, q[(b*s.H+h)*s.N*s.D:][:s.N*s.D]...)
				}
			}
			outm, lsem := forward(t, a, sm, qm, k, v, o)
			for b := range s.B {
				for kvh := range s.HKV {
					h := kvh*s.Group() + hh
					got := out[(b*s.H+h)*s.N*s.D:][:s.N*s.D]
					want := outm[(b*sm.H+kvh)*s.N*s.D:][:s.N*s.D]
					gotL := lse[(b*s.H+h)*s.N:][:s.N]
					wantL := lsem[(b*sm.H+kvh)*s.N:][:s.N]
					if e := maxDiff(got, want); e > 1e-6 || maxDiff(gotL, wantL) > 1e-6 {
						t.Errorf("causal=%v batch %d head %d: GQA differs from the head alone by %.3g", causal, b, h, e)
					}
				}
			}
		}
	}
}

func maxDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		if math.IsInf(float64(a[i]), -1) && math.IsInf(float64(b[i]), -1) {
			continue
		}
		m = max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}

// The same seed gives the same output, whatever the number of workers; a
// different seed gives a different one.
func TestDeterminism(t *testing.T) {
	rng := testRNG(t, 9)
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 201, M: 201, D: 24}
	q, k, v := inputs(rng, s)
	for _, causal := range []bool{false, true} {
		for _, sm := range []Sampling{Uniform, ValueNorm} {
			cfg := approx(11)
			cfg.Sampling = sm
			a := newAttention(t, cfg)
			o := attn.Options{Causal: causal, KVLen: []int{201, 150}, Workers: 1}
			out, lse := forward(t, a, s, q, k, v, o)
			for _, w := range []int{1, 3, 8} {
				o.Workers = w
				out2, lse2 := forward(t, newAttention(t, cfg), s, q, k, v, o)
				if !slices.Equal(out, out2) || !slices.Equal(lse, lse2) {
					t.Errorf("causal=%v %v: seed %d with %d workers gave another output", causal, sm, cfg.Seed, w)
				}
			}
			cfg.Seed++
			out3, _ := forward(t, newAttention(t, cfg), s, q, k, v, o)
			if slices.Equal(out, out3) {
				t.Errorf("causal=%v %v: seeds %d and %d gave the same output", causal, sm, cfg.Seed-1, cfg.Seed)
			}
		}
	}
}

func TestValidation(t *testing.T) {
	a := newAttention(t, approx(1))
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 5, M: 6, D: 3}
	q := make([]float32, s.QLen())
	kv := make([]float32, s.KVLen())
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	ctx := context.Background()
	cases := []struct {
		name string
		s    attn.Shape
		q    []float32
		o    attn.Options
		out  []float32
		want error
	}{
		{"shape", attn.Shape{B: 1, H: 3, HKV: 2, N: 5, M: 6, D: 3}, q, attn.Options{}, out, attn.ErrShape},
		{"len Q", s, q[1:], attn.Options{}, out, attn.ErrShape},
		{"nil out", s, q, attn.Options{}, nil, attn.ErrShape},
		{"kvlen", s, q, attn.Options{KVLen: []int{7}}, out, attn.ErrInput},
		{"kvlen count", s, q, attn.Options{KVLen: []int{1, 2}}, out, attn.ErrShape},
		{"scale", s, q, attn.Options{Scale: float32(math.NaN())}, out, attn.ErrInput},
		{"workers", s, q, attn.Options{Workers: -1}, out, attn.ErrInput},
	}
	for _, c := range cases {
		if err := a.Forward(ctx, c.s, c.q, kv, kv, c.o, c.out, lse); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	bad := []Config{{Projs: -1}, {Projs: MaxProjs + 1}, {Block: -1, Samples: -1}, {Sampling: 7}}
	if strconv.IntSize == 64 { // where int has 32 bits no Block is past int32
		bad = append(bad, Config{Block: min(math.MaxInt32+1, math.MaxInt)})
	}
	for _, cfg := range bad {
		if _, err := New(cfg); !errors.Is(err, attn.ErrInput) {
			t.Errorf("New(%+v): got %v, want ErrInput", cfg, err)
		}
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 64, M: 64, D: 8}
	q := make([]float32, s.QLen())
	out := make([]float32, s.QLen())
	for _, causal := range []bool{false, true} {
		err := newAttention(t, approx(1)).Forward(ctx, s, q, q, q, attn.Options{Causal: causal}, out, nil)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("causal=%v: got %v, want context.Canceled", causal, err)
		}
	}
}

// The causal layout tiles every (query, key) pair under the mask exactly
// once: by the leaves, the rectangles or not at all.
func TestLayoutCoversCausalMask(t *testing.T) {
	for _, cfg := range []Config{{Block: 3, Min: -1}, {Block: -1, Min: -1}, {Block: 5, Min: 9}, {Block: all, Min: -1}} {
		a := newAttention(t, cfg)
		for _, nm := range [][2]int{{1, 1}, {17, 17}, {40, 100}, {100, 40}, {257, 301}} {
			s := attn.Shape{B: 1, H: 1, HKV: 1, N: nm[0], M: nm[1], D: 1}
			leaves, phases := a.layout(s, true)
			count := make([]int, s.N*s.M)
			for i := range s.N {
				for j := range s.M {
					if leaves.Visible(s.M-s.N+i, j) && j <= s.M-s.N+i {
						count[i*s.M+j]++
					}
				}
			}
			for _, ph := range phases {
				rows := make([]bool, s.N)
				for _, r := range ph {
					for i := r.q0; i < r.q1; i++ {
						if rows[i] {
							t.Fatalf("%+v %v: two rectangles of one phase share query %d", cfg, nm, i)
						}
						rows[i] = true
						for j := r.k0; j < r.k1; j++ {
							count[i*s.M+j]++
						}
					}
				}
			}
			mask := ref.Mask(s, attn.Options{Causal: true})
			for x, c := range count {
				want := 0
				if mask[x] {
					want = 1
				}
				if c != want {
					t.Fatalf("%+v %v: pair (%d, %d) covered %d times, want %d", cfg, nm, x/s.M, x%s.M, c, want)
				}
			}
		}
	}
}

// NaN and Inf in the inputs propagate or not, but never panic nor fail the
// call.
func TestNonFiniteInputs(t *testing.T) {
	rng := testRNG(t, 10)
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 90, M: 90, D: 8}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		for _, sm := range []Sampling{Uniform, ValueNorm} {
			cfg := approx(2)
			cfg.Sampling = sm
			a := newAttention(t, cfg)
			for _, causal := range []bool{false, true} {
				q, k, v := inputs(rng, s)
				for _, x := range [][]float32{q, k, v} {
					for range 5 {
						x[rng.IntN(len(x))] = bad
					}
				}
				forward(t, a, s, q, k, v, attn.Options{Causal: causal})
			}
		}
	}
}

// Value-norm sampling with all-zero values: nothing to sample by, and the
// output is exactly 0.
func TestValueNormZeroValues(t *testing.T) {
	rng := testRNG(t, 11)
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 120, M: 120, D: 8}
	cfg := approx(3)
	cfg.Sampling = ValueNorm
	q, k, _ := inputs(rng, s)
	out, lse := forward(t, newAttention(t, cfg), s, q, k, make([]float32, s.KVLen()), attn.Options{})
	for i, x := range out {
		if x != 0 {
			t.Fatalf("out[%d] = %v with all-zero values", i, x)
		}
	}
	for i, l := range lse {
		if math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
			t.Fatalf("lse[%d] = %v", i, l)
		}
	}
}

// The zero Config is the authors' configuration.
func TestDefaults(t *testing.T) {
	got := newAttention(t, Config{Seed: 3}).Config()
	want := Config{Projs: 7, Block: 256, Samples: 256, Min: 4096, Sampling: Uniform, Seed: 3}
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	named := Config{Projs: DefaultProjs, Block: DefaultBlock, Samples: DefaultSamples, Min: DefaultMin, Seed: 3}
	if got != named || DefaultBlockRows != 256 {
		t.Errorf("defaults %+v, named constants %+v, DefaultBlockRows %d", got, named, DefaultBlockRows)
	}
	if s := ValueNorm.String(); s != "vnorm" {
		t.Errorf("ValueNorm.String() = %q", s)
	}
}
