package reformer

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// The backward pass is checked against the float64 gradient of the same
// estimator: softmax attention over the keys each query chose, which
// ref.AttentionBackward computes from a dense mask (no bias: each chosen
// key counts once, however many rounds chose it). The masks come from
// the brute-force oracles unionMask and causalRuleMask, which share only
// the hashing with the code under test, and chosenKeys reads the same
// sets off the kernels' own sorting and gathering.

// estimatorMask is the oracle's mask of the keys Forward attends to for
// a call of shape s under o.
func estimatorMask(t *testing.T, l *LSH, s attn.Shape, q, k []float32, o attn.Options) []bool {
	t.Helper()
	if o.Causal && !l.cfg.NonStrictCausal && !l.falls(s, o) {
		return causalRuleMask(l, s, q, k, o)
	}
	return unionMask(t, l, s, q, k, o)
}

// chosenKeys returns, as a dense B·H·N·M mask, the keys each query row
// attends to as Forward's and Backward's own machinery chooses them: the
// windows of prepare's sorted chunks in every round (less the causal mask
// and the self rule), or gather's candidates under the causal rule.
func chosenKeys(t *testing.T, l *LSH, s attn.Shape, q, k []float32, o attn.Options) []bool {
	t.Helper()
	rt, err := l.route(s, o)
	if err != nil {
		t.Fatal(err)
	}
	cfg := l.cfg
	if rt.exact && !cfg.ExcludeSelf {
		return ref.Mask(s, o)
	}
	if cfg.SharedQK {
		k = normalizedRows(q, s.D)
	}
	mask := make([]bool, s.B*s.H*s.N*s.M)
	at := func(row, j int) *bool { return &mask[row*s.M+j] }
	if rt.causalRule {
		hs := newHasher(cfg.Seed, cfg.Hashes, s.D, rt.factors)
		heads, err := buildIndexes(context.Background(), s, k, o, hs)
		if err != nil {
			t.Fatal(err)
		}
		w := newRowScratch(hs, cfg.rule(), s.M)
		for b := range s.B {
			for h := range s.H {
				pair := b*s.HKV + h/s.Group()
				for i := range s.N {
					row, p := (b*s.H+h)*s.N+i, s.M-s.N+i
					x := q[row*s.D:][:s.D]
					if cfg.SharedQK {
						x = k[(pair*s.M+p)*s.D:][:s.D]
					}
					hs.hashRow(x, w.proj, w.qb)
					for r := range w.lists {
						w.lists[r] = heads[pair].list(r, w.qb[r])
					}
					for _, pos := range cfg.rule().gather(w.cand, &w.seen, p, o.VisibleKeys(s, b, i), w.lists) {
						*at(row, int(pos)) = true
					}
				}
			}
		}
		return mask
	}
	p := l.newPlan(s, o, q, k, nil, rt)
	g := s.Group()
	for b := range s.B {
		for kvh := range s.HKV {
			var hp headPlan
			p.prepare(&hp, b, kvh, p.hs.scratch())
			for r := range p.rounds {
				for c := range hp.chunks {
					keys := hp.perm[r][max(c-1, 0)*p.bucket : min((c+1)*p.bucket, hp.keys)]
					for _, gr := range hp.qOrder[r][hp.qStart[r][c]:hp.qStart[r][c+1]] {
						hl, i := int(gr)/s.N, int(gr)%s.N
						row, pos := (b*s.H+kvh*g+hl)*s.N+i, s.M-s.N+i
						for _, j := range keys {
							if (o.Causal && int(j) > pos) || (cfg.ExcludeSelf && int(j) == pos) {
								continue
							}
							*at(row, int(j)) = true
						}
					}
				}
			}
			for hl := range g {
				for i := range s.N {
					row, pos := (b*s.H+kvh*g+hl)*s.N+i, s.M-s.N+i
					if cfg.ExcludeSelf && pos >= 0 && pos < hp.keys && !slices.Contains(mask[row*s.M:][:s.M], true) {
						*at(row, pos) = true
					}
				}
			}
		}
	}
	return mask
}

// refGrads returns the float64 gradients of the estimator with the keys
// of mask, through the normalisation of the queries into keys under
// shared QK (where dk is 0).
func refGrads(t *testing.T, l *LSH, s attn.Shape, q, k, v, dout []float32, o attn.Options, mask []bool) (dq, dk, dv []float64) {
	t.Helper()
	kk := k
	if l.cfg.SharedQK {
		kk = normalizedRows(q, s.D)
	}
	dq, dk, dv, err := ref.AttentionBackward(s, q, kk, v, dout, ref.Spec{Scale: float64(o.Scale), Mask: mask})
	if err != nil {
		t.Fatal(err)
	}
	if !l.cfg.SharedQK {
		return dq, dk, dv
	}
	d := s.D
	for r := 0; r < len(q); r += d {
		var ss float64
		for _, x := range q[r : r+d] {
			ss += float64(x) * float64(x)
		}
		if ss == 0 {
			continue
		}
		n := math.Sqrt(ss)
		dot := 0.0
		for c := range d {
			dot += dk[r+c] * float64(q[r+c]) / n
		}
		for c := range d {
			dq[r+c] += (dk[r+c] - dot*float64(q[r+c])/n) / n
		}
	}
	return dq, make([]float64, len(dk)), dv
}

// backward runs Forward and then Backward of l on q, k, v with the output
// gradient dout.
func backward(t *testing.T, l *LSH, s attn.Shape, q, k, v, dout []float32, o attn.Options) (dq, dk, dv []float32) {
	t.Helper()
	out, lse := forward(t, l, s, q, k, v, o)
	dq, dk, dv = make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	for _, x := range [][]float32{dq, dk, dv} {
		for i := range x {
			x[i] = float32(math.NaN()) // overwritten, never read
		}
	}
	if err := l.Backward(context.Background(), s, q, k, v, out, lse, dout, o, dq, dk, dv); err != nil {
		t.Fatalf("%+v %+v %+v: %v", s, o, l.cfg, err)
	}
	return dq, dk, dv
}

// checkGrads compares Backward on fresh inputs with the float64 gradient
// of the estimator, and checks that padded keys get exactly 0.
func checkGrads(t *testing.T, l *LSH, rng *rand.Rand, s attn.Shape, o attn.Options) {
	t.Helper()
	q, k, v, dout := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.QLen())
	dq, dk, dv := backward(t, l, s, q, k, v, dout, o)
	wq, wk, wv := refGrads(t, l, s, q, k, v, dout, o, estimatorMask(t, l, s, q, k, o))
	const tol = 5e-5
	for _, c := range []struct {
		name string
		got  []float32
		want []float64
	}{{"dq", dq, wq}, {"dk", dk, wk}, {"dv", dv, wv}} {
		if e := ref.RelErr(c.got, c.want); e > tol {
			t.Errorf("%+v %+v %+v: %s rel err %.3g against the float64 gradient of the estimator", s, o, l.cfg, c.name, e)
		}
	}
	for b := range s.B {
		for kvh := range s.HKV {
			for j := o.KeyEnd(s, b); j < s.M; j++ {
				off := ((b*s.HKV+kvh)*s.M + j) * s.D
				for c := range s.D {
					if dk[off+c] != 0 || dv[off+c] != 0 {
						t.Fatalf("%+v %+v: padded key %d of batch row %d has dk %v, dv %v", s, o, j, b, dk[off+c], dv[off+c])
					}
				}
			}
		}
	}
}

// gradShapes are odd sizes: GQA, N < M, N > M (queries before the first
// key under the causal mask), one query row.
var gradShapes = []attn.Shape{
	{B: 2, H: 4, HKV: 2, N: 61, M: 61, D: 24},
	{B: 1, H: 6, HKV: 2, N: 37, M: 103, D: 41},
	{B: 2, H: 4, HKV: 4, N: 103, M: 37, D: 5},
	{B: 1, H: 2, HKV: 1, N: 1, M: 77, D: 24},
}

// options returns the options of case x: padding on every other case
// (one batch row with no valid key), and a scale of its own on some.
func gradOptions(rng *rand.Rand, s attn.Shape, causal bool, x int) attn.Options {
	o := attn.Options{Causal: causal, Workers: 1 + x%3}
	if x%2 == 0 {
		// Row 0 may be wholly padded (always, when x%4 == 0); the others
		// keep at least one key, so that a case never pads every row away
		// and the checks below always have a chosen key to compare.
		o.KVLen = make([]int, s.B)
		for b := range o.KVLen {
			o.KVLen[b] = 1 + rng.IntN(s.M)
		}
		o.KVLen[0] = rng.IntN(s.M + 1)
		if x%4 == 0 {
			o.KVLen[0] = 0
		}
	}
	if x%3 == 1 {
		o.Scale = 0.3
	}
	return o
}

func TestBackwardAgainstReference(t *testing.T) {
	rng := testRNG(t, 40)
	cfgs := []Config{
		{Hashes: 1, Bucket: 8, Min: -1},
		{Hashes: 3, Bucket: 7, Window: 3, Min: -1, Seed: 5},
		{Hashes: 4, Bucket: 4, Buckets: 100, Window: 1, Min: -1, Seed: 9}, // factorised buckets, many runs of chunks
		{Hashes: 3, Bucket: 4, Buckets: 1, Min: -1},                       // every round the same: each pair in 3 rounds
		{Hashes: 2, Bucket: 5, Min: -1, ExcludeSelf: true},
		{Hashes: 2, Bucket: 5, Min: -1, NonStrictCausal: true, ExcludeSelf: true},
		{Hashes: 3, Bucket: 3, Min: -1, NonStrictCausal: true, Seed: 7},
		{Hashes: 2, Bucket: 5, Buckets: 2000, Min: -1}, // more buckets than keys
		{Min: 90},                    // below Min: exact attention
		{Min: 90, ExcludeSelf: true}, // below Min: exact without the own key
	}
	x := 0
	for _, cfg := range cfgs {
		l := mustNew(t, cfg)
		for _, s := range gradShapes {
			for _, causal := range []bool{false, true} {
				checkGrads(t, l, rng, s, gradOptions(rng, s, causal, x))
				x++
			}
		}
	}
}

// Windows wider than one key tile (2·Bucket > 256) and chunks of more
// query rows than one tile.
func TestBackwardWideWindows(t *testing.T) {
	rng := testRNG(t, 41)
	l := mustNew(t, Config{Hashes: 2, Bucket: 200, Buckets: 4, Min: -1, NonStrictCausal: true, ExcludeSelf: true})
	for _, causal := range []bool{false, true} {
		s := attn.Shape{B: 2, H: 4, HKV: 1, N: 150, M: 650, D: 24}
		checkGrads(t, l, rng, s, attn.Options{Causal: causal, KVLen: []int{601, rng.IntN(651)}})
	}
}

// Under the causal rule a round's rows are cut into runs of gradRunRows
// rows, tiles of tileRows: more rows than a run here, so that runs spill
// into the keys of the one before.
func TestBackwardCausalRuns(t *testing.T) {
	rng := testRNG(t, 47)
	s := attn.Shape{B: 1, H: 4, HKV: 1, N: 300, M: 333, D: 13}
	if s.Group()*s.N <= gradRunRows {
		t.Fatalf("%d rows make one run", s.Group()*s.N)
	}
	for x, cfg := range []Config{
		{Hashes: 3, Bucket: 4, Window: 3, Min: -1},
		{Hashes: 2, Bucket: 8, Buckets: 1, Window: 2, Min: -1, ExcludeSelf: true}, // one bucket: every band overlaps the next
		{Hashes: 2, Bucket: 3, Buckets: 2000, Min: -1, Seed: 4},
	} {
		checkGrads(t, mustNew(t, cfg), rng, s, gradOptions(rng, s, true, x))
	}
}

// Under shared QK the gradient reaches q through the queries and through
// the normalised keys.
func TestBackwardSharedQK(t *testing.T) {
	rng := testRNG(t, 42)
	for _, cfg := range []Config{
		{SharedQK: true, Hashes: 3, Bucket: 6, Min: -1, Seed: 3},
		{SharedQK: true, Hashes: 1, Bucket: 11, Min: -1, NonStrictCausal: true, Buckets: 70},
		{SharedQK: true, Hashes: 3, Bucket: 4, Window: 2, Min: -1, Seed: 3},
		{SharedQK: true, Min: 100},
	} {
		l := mustNew(t, cfg)
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 3, HKV: 3, N: 57, M: 57, D: 24}
			checkGrads(t, l, rng, s, attn.Options{Causal: causal, KVLen: []int{57, rng.IntN(58)}})
		}
	}
}

// The kernels' own choice of keys is the oracles'.
func TestChosenKeysAreTheOracles(t *testing.T) {
	rng := testRNG(t, 43)
	for x, cfg := range []Config{
		{Hashes: 3, Bucket: 4, Buckets: 100, Window: 2, Min: -1, Seed: 9},
		{Hashes: 2, Bucket: 5, Min: -1, NonStrictCausal: true, ExcludeSelf: true},
		{SharedQK: true, Hashes: 3, Bucket: 4, Min: -1, Seed: 3},
		{Min: 90, ExcludeSelf: true},
	} {
		l := mustNew(t, cfg)
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 2, HKV: 2, N: 47, M: 47, D: 9}
			o := gradOptions(rng, s, causal, x)
			q, k := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen())
			got, want := chosenKeys(t, l, s, q, k, o), estimatorMask(t, l, s, q, k, o)
			if i := slices.Index(got, true); i < 0 {
				t.Fatalf("%+v: no key chosen", cfg)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%+v %+v: row %d key %d chosen %v, oracle %v", cfg, o, i/s.M, i%s.M, got[i], want[i])
				}
			}
		}
	}
}

// Central differences of Forward itself (float32), extrapolated from two
// steps, on tiny inputs, for the inputs whose perturbation leaves every
// hash choice as it was.
func TestBackwardFiniteDifferences(t *testing.T) {
	rng := testRNG(t, 44)
	for _, c := range []struct {
		cfg Config
		s   attn.Shape
	}{
		{Config{Hashes: 3, Bucket: 2, Min: -1, Seed: 1}, attn.Shape{B: 1, H: 2, HKV: 1, N: 9, M: 11, D: 5}},
		{Config{Hashes: 2, Bucket: 2, Window: 2, Min: -1, Seed: 2}, attn.Shape{B: 2, H: 2, HKV: 1, N: 7, M: 9, D: 3}},
		{Config{Hashes: 2, Bucket: 2, Min: -1, NonStrictCausal: true, ExcludeSelf: true}, attn.Shape{B: 1, H: 2, HKV: 2, N: 9, M: 9, D: 4}},
		{Config{SharedQK: true, Hashes: 2, Bucket: 2, Min: -1, Seed: 4}, attn.Shape{B: 1, H: 2, HKV: 2, N: 8, M: 8, D: 3}},
		{Config{Min: 50, ExcludeSelf: true}, attn.Shape{B: 1, H: 3, HKV: 1, N: 6, M: 8, D: 3}},
	} {
		l := mustNew(t, c.cfg)
		s := c.s
		for _, causal := range []bool{false, true} {
			o := attn.Options{Causal: causal, KVLen: make([]int, s.B)}
			for b := range o.KVLen {
				o.KVLen[b] = s.M - b*2
			}
			q, k, v, dout := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.QLen())
			dq, dk, dv := backward(t, l, s, q, k, v, dout, o)
			mask := estimatorMask(t, l, s, q, k, o)
			loss := func() (float64, bool) {
				out, _ := forward(t, l, s, q, k, v, o)
				sum := 0.0
				for i, x := range out {
					sum += float64(x) * float64(dout[i])
				}
				return sum, slices.Equal(mask, estimatorMask(t, l, s, q, k, o))
			}
			const h = 1e-2
			tried, kept := 0, 0
			for _, in := range []struct {
				name string
				x    []float32
				grad []float32
			}{{"q", q, dq}, {"k", k, dk}, {"v", v, dv}} {
				for i := range in.x {
					old := in.x[i]
					// Central differences at h and h/2, extrapolated
					// (Richardson): the error falls from O(h²) to O(h⁴),
					// which the curvature of shared-QK keys needs.
					diff := func(h float32) (float64, bool) {
						in.x[i] = old + h
						up, same1 := loss()
						in.x[i] = old - h
						down, same2 := loss()
						in.x[i] = old
						return (up - down) / (2 * float64(h)), same1 && same2
					}
					fd1, same1 := diff(h)
					fd2, same2 := diff(h / 2)
					tried++
					if !same1 || !same2 {
						continue // a bucket moved: another estimator
					}
					kept++
					fd := (4*fd2 - fd1) / 3
					if g := float64(in.grad[i]); math.Abs(fd-g) > 2e-3*max(1, math.Abs(g)) {
						t.Errorf("%+v causal=%v: d%s[%d] = %.6g, finite difference %.6g", c.cfg, causal, in.name, i, g, fd)
					}
				}
			}
			t.Logf("%+v causal=%v: %d of %d perturbations kept every hash choice", c.cfg, causal, kept, tried)
			if kept < tried/2 {
				t.Errorf("%+v causal=%v: only %d of %d perturbations kept every hash choice", c.cfg, causal, kept, tried)
			}
		}
	}
}

// The gradients are the same bits for any worker count, on shapes with
// few (batch row, kv head) pairs, where the work is cut finest.
func TestBackwardDeterminism(t *testing.T) {
	rng := testRNG(t, 45)
	for _, c := range []struct {
		cfg    Config
		causal bool
	}{
		{Config{Hashes: 3, Bucket: 4, Min: -1}, false},
		{Config{Hashes: 2, Bucket: 4, Min: -1, NonStrictCausal: true}, true},
		{Config{Hashes: 3, Bucket: 4, Window: 5, Min: -1}, true},
		{Config{SharedQK: true, Hashes: 2, Bucket: 4, Min: -1}, true},
		{Config{Min: 1000, ExcludeSelf: true}, false},
	} {
		l := mustNew(t, c.cfg)
		s := attn.Shape{B: 1, H: 3, HKV: 1, N: 401, M: 401, D: 19} // more rows than one run
		if c.cfg.SharedQK {
			s.HKV = 3
		}
		q, k, v, dout := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.QLen())
		var first [3][]float32
		for _, workers := range []int{1, 2, 3, 8} {
			o := attn.Options{Causal: c.causal, Workers: workers, KVLen: []int{380}}
			dq, dk, dv := backward(t, l, s, q, k, v, dout, o)
			if first[0] == nil {
				first = [3][]float32{dq, dk, dv}
				continue
			}
			for x, g := range [3][]float32{dq, dk, dv} {
				for i := range g {
					if math.Float32bits(g[i]) != math.Float32bits(first[x][i]) {
						t.Fatalf("%+v: workers = %d: gradient %d differs at %d: %v, with 1 worker %v", c.cfg, workers, x, i, g[i], first[x][i])
					}
				}
			}
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	rng := testRNG(t, 46)
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 20, M: 20, D: 8}
	q, k, v, dout := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.QLen())
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	ctx := context.Background()
	for _, cfg := range []Config{{Min: -1, Bucket: 2}, {Min: -1, Bucket: 2, ExcludeSelf: true}, {}, {ExcludeSelf: true}} {
		l := mustNew(t, cfg)
		for _, causal := range []bool{false, true} {
			o := attn.Options{Causal: causal}
			for _, c := range []struct {
				name string
				err  error
				call func() error
			}{
				{"nil lse", attn.ErrShape, func() error { return l.Backward(ctx, s, q, k, v, out, nil, dout, o, dq, dk, dv) }},
				{"short dq", attn.ErrShape, func() error { return l.Backward(ctx, s, q, k, v, out, lse, dout, o, dq[1:], dk, dv) }},
				{"short dv", attn.ErrShape, func() error { return l.Backward(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv[1:]) }},
				{"short dout", attn.ErrShape, func() error { return l.Backward(ctx, s, q, k, v, out, lse, dout[1:], o, dq, dk, dv) }},
				{"bad KVLen", attn.ErrInput, func() error {
					return l.Backward(ctx, s, q, k, v, out, lse, dout, attn.Options{Causal: causal, KVLen: []int{21}}, dq, dk, dv)
				}},
				{"cancelled", context.Canceled, func() error { return l.Backward(cancelled(), s, q, k, v, out, lse, dout, o, dq, dk, dv) }},
			} {
				if err := c.call(); !errors.Is(err, c.err) {
					t.Errorf("%+v causal=%v %s: got %v, want %v", cfg, causal, c.name, err, c.err)
				}
			}
		}
	}
	l := mustNew(t, Config{SharedQK: true, Min: -1})
	s2 := attn.Shape{B: 1, H: 2, HKV: 1, N: 20, M: 20, D: 8}
	if err := l.Backward(ctx, s2, q, k, v, out, lse, dout, attn.Options{}, dq, dk, dv); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("shared QK with H != Hkv: got %v, want ErrUnsupported", err)
	}
}

// NaN in the inputs reaches the gradients it reaches, never a panic.
func TestBackwardNaNDoesNotPanic(t *testing.T) {
	rng := testRNG(t, 48)
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 40, M: 40, D: 8}
	for _, cfg := range []Config{{Min: -1, Bucket: 3, Hashes: 2}, {Min: -1, Bucket: 3, ExcludeSelf: true}, {Min: 100, ExcludeSelf: true}} {
		l := mustNew(t, cfg)
		for _, causal := range []bool{false, true} {
			q, k, v, dout := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.QLen())
			q[5], k[77], v[100], dout[3] = float32(math.NaN()), float32(math.NaN()), float32(math.Inf(1)), float32(math.NaN())
			backward(t, l, s, q, k, v, dout, attn.Options{Causal: causal})
		}
	}
}
