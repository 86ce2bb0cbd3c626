package reformer

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

func mustNew(t *testing.T, cfg Config) *LSH {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func forward(t *testing.T, m attn.Mechanism, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float32) {
	t.Helper()
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	if err := m.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%s %+v %+v: %v", m.Name(), s, o, err)
	}
	return out, lse
}

// selfRuleMask is ref.Mask without each query's own position, unless that
// leaves the row empty.
func selfRuleMask(s attn.Shape, o attn.Options) []bool {
	m := ref.Mask(s, o)
	for b := range s.B {
		for i := range s.N {
			row := m[(b*s.N+i)*s.M:][:s.M]
			if self := s.M - s.N + i; self >= 0 && row[self] {
				row[self] = false
				row[self] = !slices.Contains(row, true)
			}
		}
	}
	return m
}

// When every key lands in every query's window (one chunk), every pair is
// in all rounds' windows, and the duplicate correction makes the merged
// rounds exact attention (minus the self rule where it applies).
func TestOneChunkIsExact(t *testing.T) {
	rng := testRNG(t, 3)
	shapes := []attn.Shape{
		{B: 2, H: 4, HKV: 2, N: 45, M: 45, D: 24},
		{B: 1, H: 4, HKV: 1, N: 13, M: 70, D: 40},
		{B: 2, H: 4, HKV: 4, N: 70, M: 29, D: 7},
	}
	for _, excl := range []bool{false, true} {
		for _, buckets := range []int{0, 1, 6} {
			l := mustNew(t, Config{Hashes: 4, Bucket: 80, Buckets: buckets, Min: -1, ExcludeSelf: excl, Seed: 11})
			for _, s := range shapes {
				for _, causal := range []bool{false, true} {
					o := attn.Options{Causal: causal, KVLen: make([]int, s.B)}
					for b := range o.KVLen {
						o.KVLen[b] = rng.IntN(s.M + 1)
					}
					q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
					out, lse := forward(t, l, s, q, k, v, o)
					mask := ref.Mask(s, o)
					if excl {
						mask = selfRuleMask(s, o)
					}
					wantOut, wantLSE, err := ref.Attention(s, q, k, v, ref.Spec{Mask: mask})
					if err != nil {
						t.Fatal(err)
					}
					if e := ref.RelErr(out, wantOut); e > 2e-5 {
						t.Errorf("self rule %v, buckets %d, %+v causal %v: out rel err %.3g against exact", excl, buckets, s, causal, e)
					}
					if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > 2e-5 {
						t.Errorf("self rule %v, buckets %d, %+v causal %v: lse rel err %.3g %v", excl, buckets, s, causal, e, err)
					}
				}
			}
		}
	}
}

// clustered returns n vectors of size d near one of the given centres,
// with the noise scaled by noise.
func clustered(rng *rand.Rand, centres [][]float32, n int, noise float32) []float32 {
	d := len(centres[0])
	x := make([]float32, n*d)
	for i := range n {
		c := centres[rng.IntN(len(centres))]
		for j := range d {
			x[i*d+j] = c[j] + noise*float32(rng.NormFloat64())
		}
	}
	return x
}

// On clustered keys, more rounds see more of each query's cluster: the
// error against exact attention falls as Hashes grows, averaged over seeds.
func TestErrorFallsWithHashes(t *testing.T) {
	// A statistical claim on a few draws: fixed inputs, so that it cannot
	// fail by chance on one run and pass on the next.
	rng := rand.New(rand.NewPCG(4, 4))
	s := attn.Shape{B: 1, H: 2, HKV: 2, N: 600, M: 600, D: 24}
	hashes := []int{1, 2, 4, 8}
	const seeds = 6
	errs := make([]float64, len(hashes))
	for seed := range seeds {
		centres := make([][]float32, 40)
		for i := range centres {
			centres[i] = ref.Normal(rng, s.D)
			for j := range centres[i] {
				centres[i][j] *= 1.2
			}
		}
		q := clustered(rng, centres, s.B*s.H*s.N, 0.4)
		k := clustered(rng, centres, s.B*s.HKV*s.M, 0.4)
		v := ref.Normal(rng, s.KVLen())
		want, _, err := ref.Attention(s, q, k, v, ref.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		for i, h := range hashes {
			l := mustNew(t, Config{Hashes: h, Bucket: 16, Min: -1, Seed: uint64(seed)})
			out, _ := forward(t, l, s, q, k, v, attn.Options{})
			errs[i] += ref.RelErr(out, want) / seeds
		}
	}
	t.Logf("mean rel err for hashes %v: %.3f", hashes, errs)
	for i := 1; i < len(errs); i++ {
		if !(errs[i] < errs[i-1]) {
			t.Errorf("error did not fall from %d to %d hashes: %.4f -> %.4f", hashes[i-1], hashes[i], errs[i-1], errs[i])
		}
	}
}

// Under the causal mask no value after position t reaches the output at t.
// (Keys after t may change which earlier keys a query sees, through the
// sort; see the package documentation.)
func TestCausalIgnoresLaterValues(t *testing.T) {
	rng := testRNG(t, 5)
	for _, s := range []attn.Shape{
		{B: 2, H: 4, HKV: 2, N: 301, M: 301, D: 24},
		{B: 1, H: 4, HKV: 1, N: 97, M: 301, D: 40},
	} {
		l := mustNew(t, Config{Hashes: 3, Bucket: 16, Min: -1, ExcludeSelf: s.N == s.M})
		o := attn.Options{Causal: true}
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		out, lse := forward(t, l, s, q, k, v, o)
		i := rng.IntN(s.N) // query i is at position M-N+i
		pos := s.M - s.N + i
		v2 := slices.Clone(v)
		for bh := range s.B * s.HKV {
			for j := pos + 1; j < s.M; j++ {
				for c := range s.D {
					v2[(bh*s.M+j)*s.D+c] = 1e3 * float32(rng.NormFloat64())
				}
			}
		}
		out2, lse2 := forward(t, l, s, q, k, v2, o)
		for bh := range s.B * s.H {
			for r := 0; r <= i; r++ {
				row := bh*s.N + r
				if !slices.Equal(out[row*s.D:(row+1)*s.D], out2[row*s.D:(row+1)*s.D]) || lse[row] != lse2[row] {
					t.Fatalf("%+v: row %d (position %d) changed when values after position %d changed", s, r, s.M-s.N+r, pos)
				}
			}
		}
	}
}

// Padded keys enter no bucket and no normaliser: whatever they hold, the
// result is the same.
func TestPaddingInvariance(t *testing.T) {
	rng := testRNG(t, 6)
	for _, c := range []struct {
		cfg    Config
		causal bool
	}{
		{Config{Hashes: 4, Bucket: 8, Min: -1, ExcludeSelf: true}, false},
		{Config{Hashes: 4, Bucket: 8, Min: -1, ExcludeSelf: true}, true},
		{Config{Hashes: 3, Bucket: 5, Window: 2, Buckets: 7, Min: -1}, true},
		{Config{Hashes: 4, Bucket: 8, Min: -1, ExcludeSelf: true, NonStrictCausal: true}, true},
		{Config{Hashes: 2, Bucket: 8, Min: 1000, ExcludeSelf: true}, true}, // exact under the self rule
	} {
		causal := c.causal
		s := attn.Shape{B: 3, H: 4, HKV: 2, N: 150, M: 150, D: 24}
		o := attn.Options{Causal: causal, KVLen: []int{0, 77, 150}}
		l := mustNew(t, c.cfg)
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		out, lse := forward(t, l, s, q, k, v, o)
		k2, v2 := slices.Clone(k), slices.Clone(v)
		for b := range s.B {
			for kvh := range s.HKV {
				for j := o.KVLen[b]; j < s.M; j++ {
					for c := range s.D {
						at := ((b*s.HKV+kvh)*s.M+j)*s.D + c
						k2[at] = 100 * float32(rng.NormFloat64())
						v2[at] = 100 * float32(rng.NormFloat64())
					}
				}
			}
		}
		out2, lse2 := forward(t, l, s, q, k2, v2, o)
		if !slices.Equal(out, out2) || !slices.Equal(lse, lse2) {
			t.Errorf("%+v causal %v: the contents of padded keys changed the result", c.cfg, causal)
		}
		// Batch row 0 has no valid key: out 0, lse -Inf.
		for h := range s.H {
			for i := range s.N {
				if row := h*s.N + i; !math.IsInf(float64(lse[row]), -1) || slices.ContainsFunc(out[row*s.D:(row+1)*s.D], func(x float32) bool { return x != 0 }) {
					t.Fatalf("%+v causal %v: row %d of a batch row without keys: lse %v", c.cfg, causal, row, lse[row])
				}
			}
		}
	}
}

// expandKV repeats each kv head H/Hkv times: the MHA layout of a GQA input.
func expandKV(s attn.Shape, x []float32) []float32 {
	g := s.Group()
	y := make([]float32, 0, s.B*s.H*s.M*s.D)
	for b := range s.B {
		for h := range s.H {
			kvh := h / g
			y = append(y, x[(b*s.HKV+kvh)*s.M*s.D:][:s.M*s.D]...)
		}
	}
	return y
}

func TestGQAEqualsExpandedMHA(t *testing.T) {
	rng := testRNG(t, 7)
	for _, hkv := range []int{2, 1} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 4, HKV: hkv, N: 133, M: 170, D: 40}
			o := attn.Options{Causal: causal, KVLen: []int{rng.IntN(171), 170}}
			l := mustNew(t, Config{Hashes: 3, Bucket: 12, Min: -1, Seed: 2})
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			out, lse := forward(t, l, s, q, k, v, o)
			mha := s
			mha.HKV = s.H
			out2, lse2 := forward(t, l, mha, q, expandKV(s, k), expandKV(s, v), o)
			if e := ref.RelErr(out, widen(out2)); e > 1e-6 {
				t.Errorf("Hkv %d causal %v: GQA differs from expanded MHA by %.3g", hkv, causal, e)
			}
			if e, err := ref.LSEErr(lse, widen(lse2)); err != nil || e > 1e-6 {
				t.Errorf("Hkv %d causal %v: lse differs by %.3g %v", hkv, causal, e, err)
			}
		}
	}
}

func widen(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// The same seed gives the same output, whatever the number of workers and
// however the work is shared out; another seed draws other rotations.
func TestDeterminism(t *testing.T) {
	rng := testRNG(t, 8)
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 200, M: 200, D: 24}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	cfg := Config{Hashes: 2, Bucket: 10, Min: -1, Seed: 42}
	for _, causal := range []bool{true, false} {
		var first []float32
		for _, workers := range []int{1, 3, 4, 1} { // 3 workers, 4 heads: one round at a time
			out, _ := forward(t, mustNew(t, cfg), s, q, k, v, attn.Options{Workers: workers, Causal: causal})
			if first == nil {
				first = out
			} else if !slices.Equal(first, out) {
				t.Fatalf("causal %v workers %d: output differs for the same seed", causal, workers)
			}
		}
	}
	first, _ := forward(t, mustNew(t, cfg), s, q, k, v, attn.Options{})
	cfg.Seed = 43
	if out, _ := forward(t, mustNew(t, cfg), s, q, k, v, attn.Options{}); slices.Equal(first, out) {
		t.Errorf("seeds 42 and 43 gave the same output")
	}
}

// A query whose chunk holds only its own key (shared QK masks it) falls
// back to that key: no NaN, output v_self.
func TestLonelyQuery(t *testing.T) {
	rng := testRNG(t, 9)
	for _, cfg := range []Config{
		{SharedQK: true, Bucket: 1, Min: -1},
		{SharedQK: true, Hashes: 1, Bucket: 1, Min: -1},
		{ExcludeSelf: true, Bucket: 1, Min: -1},
		{SharedQK: true}, // below Min: exact attention under the self rule
	} {
		for _, n := range []int{1, 2, 9} {
			for _, causal := range []bool{false, true} {
				s := attn.Shape{B: 1, H: 2, HKV: 2, N: n, M: n, D: 24}
				q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
				out, lse := forward(t, mustNew(t, cfg), s, q, k, v, attn.Options{Causal: causal})
				for i, x := range out {
					if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
						t.Fatalf("%+v n %d causal %v: out[%d] = %v", cfg, n, causal, i, x)
					}
				}
				for i, x := range lse {
					if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
						t.Fatalf("%+v n %d causal %v: lse[%d] = %v", cfg, n, causal, i, x)
					}
				}
				if n == 1 || causal {
					// Query 0 sees only key 0, itself.
					for h := range s.H {
						if got, want := out[h*n*s.D:][:s.D], v[h*n*s.D:][:s.D]; !slices.Equal(got, want) {
							t.Fatalf("%+v n %d causal %v head %d: first row is not v_0", cfg, n, causal, h)
						}
					}
				}
			}
		}
	}
}

// Below Min, without the self rule, Forward is the exact kernel.
func TestFallbackIsExact(t *testing.T) {
	rng := testRNG(t, 10)
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 100, M: 120, D: 24}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for _, cfg := range []Config{{}, {Min: 121}, {Min: 101}} {
		for _, causal := range []bool{false, true} {
			o := attn.Options{Causal: causal, KVLen: []int{77}}
			out, lse := forward(t, mustNew(t, cfg), s, q, k, v, o)
			out2, lse2 := forward(t, flash.New(flash.Config{}), s, q, k, v, o)
			if !slices.Equal(out, out2) || !slices.Equal(lse, lse2) {
				t.Errorf("%+v causal %v: fallback differs from the exact kernel", cfg, causal)
			}
		}
	}
	// At Min and above, Reformer proper.
	o := attn.Options{}
	out, _ := forward(t, mustNew(t, Config{Min: 100, Bucket: 8}), s, q, k, v, o)
	out2, _ := forward(t, flash.New(flash.Config{}), s, q, k, v, o)
	if slices.Equal(out, out2) {
		t.Errorf("Min 100 with N = 100 still fell back to exact attention")
	}
}

func TestValidation(t *testing.T) {
	ctx := context.Background()
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 5, M: 6, D: 3}
	q, k, v := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	l := mustNew(t, Config{Min: -1})
	cases := []struct {
		name    string
		s       attn.Shape
		q, out  []float32
		o       attn.Options
		want    error
		mech    *LSH
		context context.Context
	}{
		{name: "short q", s: s, q: q[1:], out: out, want: attn.ErrShape},
		{name: "nil out", s: s, q: q, out: nil, want: attn.ErrShape},
		{name: "bad shape", s: attn.Shape{B: 1, H: 3, HKV: 2, N: 5, M: 6, D: 3}, q: q, out: out, want: attn.ErrShape},
		{name: "key length", s: s, q: q, out: out, o: attn.Options{KVLen: []int{7}}, want: attn.ErrInput},
		{name: "scale", s: s, q: q, out: out, o: attn.Options{Scale: float32(math.NaN())}, want: attn.ErrInput},
		{name: "workers", s: s, q: q, out: out, o: attn.Options{Workers: -1}, want: attn.ErrInput},
		{name: "shared QK with N != M", s: s, q: q, out: out, mech: mustNew(t, Config{SharedQK: true}), want: attn.ErrUnsupported},
		{name: "cancelled", s: s, q: q, out: out, context: cancelled(), want: context.Canceled},
	}
	for _, c := range cases {
		m, cx := l, ctx
		if c.mech != nil {
			m = c.mech
		}
		if c.context != nil {
			cx = c.context
		}
		if err := m.Forward(cx, c.s, c.q, k, v, c.o, c.out, lse); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	gqa := attn.Shape{B: 1, H: 2, HKV: 1, N: 6, M: 6, D: 3}
	if err := mustNew(t, Config{SharedQK: true}).Forward(ctx, gqa, make([]float32, gqa.QLen()), k, v, attn.Options{}, make([]float32, gqa.QLen()), nil); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("shared QK with H != Hkv: got %v, want ErrUnsupported", err)
	}
	for _, cfg := range []Config{{Hashes: -1}, {Bucket: -2}, {Buckets: -1}, {Window: -1}, {Hashes: MaxHashes + 1}, {Bucket: MaxBucket + 1}} {
		if _, err := New(cfg); !errors.Is(err, attn.ErrInput) {
			t.Errorf("New(%+v): got %v, want ErrInput", cfg, err)
		}
	}
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// NaN inputs reach the rows they touch, as in the exact kernel, and never
// crash the hashing.
func TestNaNInputDoesNotPanic(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 40, M: 40, D: 8}
	rng := rand.New(rand.NewPCG(12, 1))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	q[3], k[17] = float32(math.NaN()), float32(math.Inf(1))
	forward(t, mustNew(t, Config{Bucket: 4, Min: -1}), s, q, k, v, attn.Options{Causal: true})
}

func TestBucketFactors(t *testing.T) {
	for _, c := range []struct {
		t    int
		want []int
	}{
		{0, nil}, {1, nil}, {2, []int{2}}, {3, []int{4}}, {64, []int{64}},
		{65, []int{10, 8}}, {100, []int{10, 10}}, {1024, []int{32, 32}}, {1000, []int{32, 32}},
	} {
		got := bucketFactors(c.t)
		if !slices.Equal(got, c.want) {
			t.Errorf("bucketFactors(%d) = %v, want %v", c.t, got, c.want)
		}
		prod := 1
		for _, f := range got {
			prod *= f
		}
		if c.t > 1 && prod < c.t {
			t.Errorf("bucketFactors(%d) = %v: fewer buckets than asked", c.t, got)
		}
	}
}

// The hash is argmax([xR; -xR]): check it against that definition written
// out, with the digits of factorised counts in mixed radix.
func TestHashIsArgmax(t *testing.T) {
	rng := testRNG(t, 13)
	for _, factors := range [][]int{{2}, {6}, {10, 8}} {
		const d, n, rounds = 7, 50, 3
		h := newHasher(99, rounds, d, factors)
		x := ref.Normal(rng, n*d)
		x = append(x, make([]float32, d)...) // a zero vector: bucket 0
		got := make([]int32, (n+1)*rounds)
		h.hash(x, n+1, d, h.scratch(), got)
		for i := range n + 1 {
			for r := range rounds {
				want, off := 0, r*h.cols
				for _, f := range factors {
					best, arg := math.Inf(-1), 0
					for c := range f {
						var dot float64
						for j := range d {
							dot += float64(x[i*d+j]) * float64(h.rot[j*h.ld+off+c%(f/2)])
						}
						if c >= f/2 {
							dot = -dot
						}
						if dot > best {
							best, arg = dot, c
						}
					}
					want = want*f + arg
					off += f / 2
				}
				if int(got[i*rounds+r]) != want {
					t.Fatalf("factors %v vector %d round %d: bucket %d, want %d", factors, i, r, got[i*rounds+r], want)
				}
			}
		}
	}
}
