package kvcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// hashPattern is an irregular pattern for the masked ranges.
type hashPattern struct{}

func (hashPattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	return append(dst, flash.Range{Lo: 0, Hi: m})
}
func (hashPattern) Visible(p, j int) bool { return (j*7+p*3)%5 < 3 }

// randomRanges returns sorted, disjoint ranges of held positions below
// n, a mix of long runs (read in place) and short ones (gathered), some
// Full.
func randomRanges(rng *rand.Rand, c *Cache, n int) []flash.Range {
	var rs []flash.Range
	for j := 0; j < n; {
		if !c.Holds(j) || rng.IntN(3) == 0 {
			j += 1 + rng.IntN(4)
			continue
		}
		l := 1 + rng.IntN(3)
		if rng.IntN(3) == 0 {
			l = gatherBelow + rng.IntN(3*decodeBlock)
		}
		hi := j
		for hi < min(j+l, n) && c.Holds(hi) {
			hi++
		}
		rs = append(rs, flash.Range{Lo: j, Hi: hi, Full: rng.IntN(2) == 0})
		j = hi + 1 + rng.IntN(3)
	}
	return rs
}

// rangesRef is the float64 attention of the query of position p (q
// [B][H][1][D]) to the keys of ranges that pat lets it see, as the cache
// stores them (Read).
func rangesRef(t *testing.T, c *Cache, h int, q []float32, p int, ranges []flash.Range, pat flash.Pattern) (out, lse []float64) {
	t.Helper()
	cfg := c.Config()
	var keys []int
	for _, r := range ranges {
		for j := r.Lo; j < r.Hi; j++ {
			if r.Full || pat.Visible(p, j) {
				keys = append(keys, j)
			}
		}
	}
	s := attn.Shape{B: cfg.B, H: h, HKV: cfg.HKV, N: 1, M: max(len(keys), 1), D: cfg.D}
	k, v := make([]float32, s.KVLen()), make([]float32, s.KVLen())
	one := attn.Shape{B: cfg.B, HKV: cfg.HKV, D: cfg.D}
	kj, vj := make([]float32, one.B*one.HKV*one.D), make([]float32, one.B*one.HKV*one.D)
	for t0, j := range keys {
		if err := c.Read(kj, vj, j, j+1); err != nil {
			t.Fatal(err)
		}
		for bh := range cfg.B * cfg.HKV {
			copy(k[(bh*s.M+t0)*s.D:][:s.D], kj[bh*s.D:][:s.D])
			copy(v[(bh*s.M+t0)*s.D:][:s.D], vj[bh*s.D:][:s.D])
		}
	}
	var mask []bool
	if len(keys) == 0 {
		mask = []bool{false}
	}
	out, lse, err := ref.Attention(s, q, k, v, ref.Spec{Mask: mask})
	if err != nil {
		t.Fatal(err)
	}
	return out, lse
}

// TestAttendRanges attends to random ranges of caches of every element
// type, with and without a ring, for small and large GQA groups, and
// compares with float64 attention over what the cache stores at the
// visible positions. Every position outside the ranges holds NaN: a step
// that read one would return NaN.
func TestAttendRanges(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	ctx := context.Background()
	for _, dt := range []DType{F32, BF16, F16, I8} {
		for _, tc := range []struct {
			cfg Config
			h   int
		}{
			{Config{B: 2, HKV: 2, D: 19, Capacity: 7}, 6},
			{Config{B: 1, HKV: 1, D: 40, Window: 40, Sinks: 3}, 32},
			{Config{B: 1, HKV: 3, D: 24, Window: 57}, 3},
		} {
			cfg := tc.cfg
			cfg.DType = dt
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			const n = 700
			heads := cfg.B * cfg.HKV
			k, v := ref.Normal(rng, heads*n*cfg.D), ref.Normal(rng, heads*n*cfg.D)
			// Positions to poison: every one not in the ranges of the
			// last query, which are drawn now over what will be held.
			probe, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			probe.n = n
			ranges := randomRanges(rng, probe, n)
			if cfg.Window > 0 {
				// One range across the ring's wrap and the sinks.
				ranges = []flash.Range{{Lo: 0, Hi: cfg.Sinks, Full: true}, {Lo: n - cfg.Window + 1, Hi: n}}
				if cfg.Sinks == 0 {
					ranges = ranges[1:]
				}
			}
			in := make([]bool, n)
			for _, r := range ranges {
				for j := r.Lo; j < r.Hi; j++ {
					in[j] = true
				}
			}
			nan := float32(math.NaN())
			for bh := range heads {
				for j := range n {
					if !in[j] {
						for i := range cfg.D {
							k[(bh*n+j)*cfg.D+i], v[(bh*n+j)*cfg.D+i] = nan, nan
						}
					}
				}
			}
			if err := c.Append(k, v, n); err != nil {
				t.Fatal(err)
			}
			s := attn.Shape{B: cfg.B, H: tc.h, HKV: cfg.HKV, N: 1, M: 1, D: cfg.D}
			q := ref.Normal(rng, s.QLen())
			p := n - 1
			name := fmt.Sprintf("%v %+v H=%d ranges %v", dt, cfg, tc.h, ranges)
			var first []float32
			for _, workers := range []int{1, 3} {
				out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
				if err := c.AttendRanges(ctx, tc.h, q, p, ranges, hashPattern{}, attn.Options{Workers: workers}, out, lse); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if first == nil {
					first = out
					wantOut, wantLSE := rangesRef(t, c, tc.h, q, p, ranges, hashPattern{})
					if e := ref.RelErr(out, wantOut); e > storedTol(cfg.DType, 1e-5) {
						t.Errorf("%s: out rel err %.3g", name, e)
					}
					if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > storedTol(cfg.DType, 1e-5) {
						t.Errorf("%s: lse rel err %.3g %v", name, e, err)
					}
				} else if !slices.Equal(first, out) {
					t.Errorf("%s: output depends on the worker count", name)
				}
			}
		}
	}
}

// TestAttendRangesEmpty checks that a query with no range, or whose
// masked ranges hide every key, gets 0 and -Inf.
func TestAttendRangesEmpty(t *testing.T) {
	c, err := New(Config{B: 1, HKV: 1, D: 5})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	if err := c.Append(ref.Normal(rng, 10*5), ref.Normal(rng, 10*5), 10); err != nil {
		t.Fatal(err)
	}
	q := ref.Normal(rng, 2*5)
	for _, rs := range [][]flash.Range{nil, {{Lo: 2, Hi: 9}}} {
		out, lse := ref.Normal(rng, 2*5), make([]float32, 2)
		if err := c.AttendRanges(context.Background(), 2, q, 9, rs, none{}, attn.Options{}, out, lse); err != nil {
			t.Fatal(err)
		}
		for _, x := range out {
			if x != 0 {
				t.Fatalf("ranges %v: output %v, want 0", rs, out)
			}
		}
		for _, l := range lse {
			if !math.IsInf(float64(l), -1) {
				t.Fatalf("ranges %v: lse %v, want -Inf", rs, lse)
			}
		}
	}
}

type none struct{}

func (none) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range { return dst }
func (none) Visible(p, j int) bool                                    { return false }

func TestAttendRangesErrors(t *testing.T) {
	c, err := New(Config{B: 1, HKV: 1, D: 4, Window: 5, Sinks: 2})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 3))
	if err := c.Append(ref.Normal(rng, 20*4), ref.Normal(rng, 20*4), 20); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	q, out, lse := make([]float32, 4), make([]float32, 4), make([]float32, 1)
	full := func(lo, hi int) flash.Range { return flash.Range{Lo: lo, Hi: hi, Full: true} }
	for _, tc := range []struct {
		name   string
		ranges []flash.Range
		pat    flash.Pattern
		q, out []float32
		lse    []float32
		o      attn.Options
		want   error
	}{
		{"unsorted", []flash.Range{full(16, 18), full(15, 16)}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"overlapping", []flash.Range{full(15, 18), full(17, 19)}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"empty", []flash.Range{full(16, 16)}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"negative", []flash.Range{full(-1, 1)}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"evicted", []flash.Range{full(1, 3)}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"evicted ring", []flash.Range{full(14, 16)}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"past Len", []flash.Range{full(19, 21)}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"masked without pattern", []flash.Range{{Lo: 16, Hi: 18}}, nil, q, out, lse, attn.Options{}, attn.ErrInput},
		{"short q", []flash.Range{full(16, 18)}, nil, q[:3], out, lse, attn.Options{}, attn.ErrShape},
		{"short lse", []flash.Range{full(16, 18)}, nil, q, out, lse[:0], attn.Options{}, attn.ErrShape},
		{"kvlen", []flash.Range{full(16, 18)}, nil, q, out, lse, attn.Options{KVLen: []int{1}}, attn.ErrUnsupported},
		{"scale", []flash.Range{full(16, 18)}, nil, q, out, lse, attn.Options{Scale: float32(math.NaN())}, attn.ErrInput},
	} {
		if err := c.AttendRanges(ctx, 1, tc.q, 19, tc.ranges, tc.pat, tc.o, tc.out, tc.lse); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := c.AttendRanges(ctx, 1, q, 19, []flash.Range{full(0, 2), full(15, 20)}, nil, attn.Options{}, out, lse); err != nil {
		t.Errorf("held ranges: %v", err)
	}
	k, v := make([]float32, 2*4), make([]float32, 2*4)
	for _, r := range [][2]int{{1, 3}, {-1, 1}, {19, 21}, {3, 2}} {
		if err := c.Read(k, v, r[0], r[1]); !errors.Is(err, attn.ErrInput) {
			t.Errorf("Read(%d, %d): err %v, want ErrInput", r[0], r[1], err)
		}
	}
	if err := c.Read(k[:7], v, 16, 18); !errors.Is(err, attn.ErrShape) {
		t.Errorf("Read with short k: err %v, want ErrShape", err)
	}
	for j, want := range map[int]bool{-1: false, 0: true, 1: true, 2: false, 14: false, 15: true, 19: true, 20: false} {
		if got := c.Holds(j); got != want {
			t.Errorf("Holds(%d) = %v, want %v", j, got, want)
		}
	}
}

// TestRead checks Read against what was appended, through the ring.
func TestRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, cfg := range []Config{{B: 2, HKV: 2, D: 9, Capacity: 3}, {B: 1, HKV: 2, D: 9, Window: 6, Sinks: 1}} {
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		const n = 23
		heads := cfg.B * cfg.HKV
		k, v := ref.Normal(rng, heads*n*cfg.D), ref.Normal(rng, heads*n*cfg.D)
		if err := c.Append(k, v, n); err != nil {
			t.Fatal(err)
		}
		lo := 0
		if cfg.Window > 0 {
			lo = n - cfg.Window
		}
		m := n - lo
		gk, gv := make([]float32, heads*m*cfg.D), make([]float32, heads*m*cfg.D)
		if err := c.Read(gk, gv, lo, n); err != nil {
			t.Fatal(err)
		}
		for bh := range heads {
			if !slices.Equal(gk[bh*m*cfg.D:][:m*cfg.D], k[(bh*n+lo)*cfg.D:][:m*cfg.D]) ||
				!slices.Equal(gv[bh*m*cfg.D:][:m*cfg.D], v[(bh*n+lo)*cfg.D:][:m*cfg.D]) {
				t.Fatalf("%+v: Read differs from what was appended, head %d", cfg, bh)
			}
		}
	}
}
