package reformer

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// unionMask recomputes, independently of the kernel's sorting and
// chunking, the keys Forward lets each query see: per round, sort the
// valid keys by (bucket, position) with a comparison sort, place the query
// by a linear scan, take its chunk and the previous one; then the union
// over rounds, minus the query's own position under the self rule (unless
// nothing else is left), intersected with the causal mask. Only the
// hashing (bucket ids) is shared with the code under test. The result is a
// B·H·N·M mask for ref.Attention.
func unionMask(t *testing.T, l *LSH, s attn.Shape, q, k []float32, o attn.Options) []bool {
	t.Helper()
	cfg := l.Config()
	if cfg.SharedQK {
		k = normalizedRows(q, s.D)
	}
	rounds, bucket := cfg.Hashes, cfg.Bucket
	var factors []int
	if below := cfg.minFor(o.Causal); below > 0 && (s.N < below || s.M < below) {
		rounds, bucket = 1, s.M
	} else {
		tb := cfg.Buckets
		if tb == 0 {
			tb = (s.M + bucket - 1) / bucket
		}
		factors = bucketFactors(tb)
	}
	hs := newHasher(cfg.Seed, rounds, s.D, factors)
	proj := hs.scratch()
	mask := make([]bool, s.B*s.H*s.N*s.M)
	g := s.Group()
	for b := range s.B {
		end := o.KeyEnd(s, b)
		for h := range s.H {
			kvh := h / g
			kb := make([]int32, s.M*rounds)
			hs.hash(k[(b*s.HKV+kvh)*s.M*s.D:], s.M, s.D, proj, kb)
			qb := make([]int32, s.N*rounds)
			if cfg.SharedQK {
				copy(qb, kb)
			} else {
				hs.hash(q[(b*s.H+h)*s.N*s.D:], s.N, s.D, proj, qb)
			}
			for r := range rounds {
				type item struct{ bucket, pos int }
				keys := make([]item, end)
				for j := range end {
					keys[j] = item{int(kb[j*rounds+r]), j}
				}
				slices.SortFunc(keys, func(a, c item) int {
					return cmp.Or(cmp.Compare(a.bucket, c.bucket), cmp.Compare(a.pos, c.pos))
				})
				chunks := (end + bucket - 1) / bucket
				for i := range s.N {
					me := item{int(qb[i*rounds+r]), s.M - s.N + i}
					idx := 0
					for idx < end && cmp.Or(cmp.Compare(keys[idx].bucket, me.bucket), cmp.Compare(keys[idx].pos, me.pos)) < 0 {
						idx++
					}
					c := min(idx/bucket, chunks-1)
					for x := max(0, (c-1)*bucket); x < min((c+1)*bucket, end); x++ {
						mask[((b*s.H+h)*s.N+i)*s.M+keys[x].pos] = true
					}
				}
			}
			for i := range s.N {
				row := mask[((b*s.H+h)*s.N+i)*s.M:][:s.M]
				vis := o.VisibleKeys(s, b, i)
				for j := vis; j < s.M; j++ {
					row[j] = false
				}
				self := s.M - s.N + i
				if cfg.ExcludeSelf && self >= 0 && self < vis {
					row[self] = false
					row[self] = !slices.Contains(row, true)
				}
			}
		}
	}
	return mask
}

// checkUnion runs l on fresh inputs and compares out and lse with exact
// attention restricted to unionMask.
func checkUnion(t *testing.T, l *LSH, rng *rand.Rand, s attn.Shape, o attn.Options) {
	t.Helper()
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := l.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	kk := k
	if l.Config().SharedQK {
		kk = normalizedRows(q, s.D)
	}
	spec := ref.Spec{Scale: float64(o.Scale), Mask: unionMask(t, l, s, q, k, o)}
	wantOut, wantLSE, err := ref.Attention(s, q, kk, v, spec)
	if err != nil {
		t.Fatal(err)
	}
	const tol = 2e-5
	if e := ref.RelErr(out, wantOut); e > tol {
		t.Errorf("%+v %+v %+v: out rel err %.3g against exact over the union of windows", s, o, l.Config(), e)
	}
	if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
		t.Errorf("%+v %+v %+v: lse rel err %.3g %v", s, o, l.Config(), e, err)
	}
	for i, x := range out {
		if math.IsNaN(float64(x)) {
			t.Fatalf("out[%d] is NaN", i)
		}
	}
}

func TestAgainstUnionOfWindows(t *testing.T) {
	rng := testRNG(t, 1)
	cfgs := []Config{
		{Hashes: 1, Bucket: 8, Min: -1, NonStrictCausal: true},
		{Hashes: 3, Bucket: 7, Min: -1, NonStrictCausal: true, Seed: 5},
		{Hashes: 4, Bucket: 16, Min: -1, NonStrictCausal: true, Buckets: 100, Seed: 9}, // factorised buckets
		{Hashes: 2, Bucket: 5, Min: -1, NonStrictCausal: true, ExcludeSelf: true},
		{Hashes: 4, Bucket: 300, Min: -1, NonStrictCausal: true, Buckets: 1}, // one chunk
		{Min: 90, ExcludeSelf: true},                                         // below Min: exact with the self rule
	}
	shapes := []attn.Shape{
		{B: 2, H: 4, HKV: 2, N: 61, M: 61, D: 24},
		{B: 1, H: 4, HKV: 1, N: 37, M: 103, D: 40},
		{B: 2, H: 4, HKV: 4, N: 103, M: 37, D: 5},
		{B: 1, H: 2, HKV: 2, N: 1, M: 77, D: 24},
	}
	for ci, cfg := range cfgs {
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for si, s := range shapes {
			for _, causal := range []bool{false, true} {
				o := attn.Options{Causal: causal, Workers: 1 + (ci+si)%3}
				if (ci+si)%2 == 0 {
					o.KVLen = make([]int, s.B)
					for b := range o.KVLen {
						o.KVLen[b] = rng.IntN(s.M + 1)
					}
					if si == 0 {
						o.KVLen[0] = 0
					}
				}
				if si == 2 {
					o.Scale = 0.3
				}
				checkUnion(t, l, rng, s, o)
			}
		}
	}
}

// Windows wider than one key tile (2·Bucket > 256) are attended in
// several tiles with online softmax.
func TestWideWindowsAgainstUnion(t *testing.T) {
	rng := testRNG(t, 3)
	l := mustNew(t, Config{Hashes: 2, Bucket: 200, Buckets: 4, Min: -1, NonStrictCausal: true, ExcludeSelf: true})
	for _, causal := range []bool{false, true} {
		s := attn.Shape{B: 2, H: 2, HKV: 1, N: 70, M: 650, D: 24}
		checkUnion(t, l, rng, s, attn.Options{Causal: causal, KVLen: []int{601, rng.IntN(651)}})
	}
}

func TestSharedQKAgainstUnion(t *testing.T) {
	rng := testRNG(t, 2)
	for _, cfg := range []Config{
		{SharedQK: true, Hashes: 3, Bucket: 6, Min: -1, NonStrictCausal: true, Seed: 3},
		{SharedQK: true, Hashes: 1, Bucket: 11, Min: -1, NonStrictCausal: true, Buckets: 70},
	} {
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 3, HKV: 3, N: 57, M: 57, D: 24}
			o := attn.Options{Causal: causal, KVLen: []int{57, rng.IntN(58)}}
			checkUnion(t, l, rng, s, o)
		}
	}
}

// causalRuleMask recomputes by brute force, independently of the key
// index, the candidates and the order of gather, the keys the causal rule
// gives each query: per round, scanning back from its latest visible key,
// the 2·Bucket latest keys hashed to the query's bucket; the Window latest
// visible keys; without the query's own position under the self rule
// unless nothing else is left. Only the hashing (hashRow) is shared with
// the code under test.
func causalRuleMask(l *LSH, s attn.Shape, q, k []float32, o attn.Options) []bool {
	cfg := l.Config()
	if cfg.SharedQK {
		k = normalizedRows(q, s.D)
	}
	R := cfg.Hashes
	hs := newHasher(cfg.Seed, R, s.D, bucketFactors(cfg.causalBuckets()))
	proj := hs.rowScratch()
	hash := func(x []float32) []int32 {
		b := make([]int32, R)
		hs.hashRow(x, proj, b)
		return b
	}
	mask := make([]bool, s.B*s.H*s.N*s.M)
	for b := range s.B {
		for h := range s.H {
			kvh := b*s.HKV + h/s.Group()
			for i := range s.N {
				row := mask[((b*s.H+h)*s.N+i)*s.M:][:s.M]
				p, vis := s.M-s.N+i, o.VisibleKeys(s, b, i)
				var qb []int32
				if cfg.SharedQK {
					qb = hash(k[(kvh*s.M+p)*s.D:][:s.D])
				} else {
					qb = hash(q[((b*s.H+h)*s.N+i)*s.D:][:s.D])
				}
				for r := range R {
					taken := 0
					for j := vis - 1; j >= 0 && taken < 2*cfg.Bucket; j-- {
						if hash(k[(kvh*s.M+j)*s.D:][:s.D])[r] == qb[r] {
							row[j] = true
							taken++
						}
					}
				}
				for j := max(0, p-cfg.Window+1); j < vis; j++ {
					row[j] = true
				}
				if cfg.ExcludeSelf && p >= 0 && p < vis {
					row[p] = false
					row[p] = !slices.Contains(row, true)
				}
			}
		}
	}
	return mask
}

// Causal Forward is exact attention over the keys of the causal rule.
func TestCausalRuleAgainstReference(t *testing.T) {
	rng := testRNG(t, 32)
	cfgs := []Config{
		{Hashes: 1, Bucket: 8, Min: -1},
		{Hashes: 3, Bucket: 7, Window: 3, Min: -1, Seed: 5},
		{Hashes: 4, Bucket: 4, Buckets: 100, Window: 1, Min: -1, Seed: 9}, // factorised buckets
		{Hashes: 2, Bucket: 5, Buckets: 2000, Min: -1},                    // more buckets than keys
		{Hashes: 2, Bucket: 5, Window: 2, Min: -1, ExcludeSelf: true},
		{Hashes: 2, Bucket: 3, Buckets: 1, Window: 4, Min: -1}, // one bucket: the latest 2·Bucket keys
	}
	shapes := []attn.Shape{
		{B: 2, H: 4, HKV: 2, N: 61, M: 61, D: 24},
		{B: 1, H: 6, HKV: 2, N: 37, M: 103, D: 41},
		{B: 2, H: 4, HKV: 4, N: 103, M: 37, D: 5}, // queries before the first key see nothing
		{B: 1, H: 2, HKV: 2, N: 1, M: 77, D: 24},
	}
	for ci, cfg := range cfgs {
		l := mustNew(t, cfg)
		for si, s := range shapes {
			o := attn.Options{Causal: true, Workers: 1 + (ci+si)%3}
			if (ci+si)%2 == 0 {
				o.KVLen = make([]int, s.B)
				for b := range o.KVLen {
					o.KVLen[b] = rng.IntN(s.M + 1)
				}
			}
			if si == 2 {
				o.Scale = 0.3
			}
			checkMask(t, l, rng, s, o, 2e-5, 1, causalRuleMask)
		}
	}
	l := mustNew(t, Config{SharedQK: true, Hashes: 3, Bucket: 4, Window: 2, Min: -1, Seed: 3})
	s := attn.Shape{B: 2, H: 3, HKV: 3, N: 57, M: 57, D: 24}
	checkMask(t, l, rng, s, attn.Options{Causal: true, KVLen: []int{57, rng.IntN(58)}}, 2e-5, 1, causalRuleMask)
}

// checkMask runs l on fresh inputs (scaled by amp) and compares out and
// lse with exact attention restricted to the mask of rule.
func checkMask(t *testing.T, l *LSH, rng *rand.Rand, s attn.Shape, o attn.Options, tol float64, amp float32,
	rule func(*LSH, attn.Shape, []float32, []float32, attn.Options) []bool) {
	t.Helper()
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for i := range q {
		q[i] *= amp
	}
	for i := range k {
		k[i] *= amp
	}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := l.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	kk := k
	if l.Config().SharedQK {
		kk = normalizedRows(q, s.D)
	}
	wantOut, wantLSE, err := ref.Attention(s, q, kk, v, ref.Spec{Scale: float64(o.Scale), Mask: rule(l, s, q, k, o)})
	if err != nil {
		t.Fatal(err)
	}
	if e := ref.RelErr(out, wantOut); e > tol {
		t.Errorf("%+v %+v %+v: out rel err %.3g against the reference", s, o, l.Config(), e)
	}
	if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
		t.Errorf("%+v %+v %+v: lse rel err %.3g %v", s, o, l.Config(), e, err)
	}
	for i, x := range out {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("%+v %+v: out[%d] = %v", s, o, i, x)
		}
	}
	for i, x := range lse {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 1) {
			t.Fatalf("%+v %+v: lse[%d] = %v", s, o, i, x)
		}
	}
}
