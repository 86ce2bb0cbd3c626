package sparse

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

const tol = 1e-5

// tiles are the kernel tile sizes every correctness test runs: the default
// and small odd ones that put tile boundaries everywhere.
var tiles = []flash.Config{{}, {BlockRows: 5, BlockK: 16}}

// shapes have lengths that are multiples of neither the tiles nor the
// blocks, N < M and N > M, and GQA groups of 2 and 4.
var shapes = []attn.Shape{
	{B: 2, H: 4, HKV: 2, N: 203, M: 150, D: 24},
	{B: 2, H: 4, HKV: 1, N: 150, M: 203, D: 40},
	{B: 3, H: 2, HKV: 2, N: 97, M: 97, D: 24},
}

// visFunc is a pattern written in the test from the papers' definitions,
// independently of the package: whether the query at absolute position p
// sees key j.
type visFunc func(p, j int) bool

func floorDivT(a, b int) int { return int(math.Floor(float64(a) / float64(b))) }

// mechCase is one mechanism configuration and its definition.
type mechCase struct {
	name  string
	build func(tiles flash.Config) (*Attention, error)
	// def returns the definition for a call; pat is the package's own
	// pattern for that call, used only for bigbird's random draws.
	def func(s attn.Shape, causal bool, pat flash.Pattern) visFunc
}

func windowDef(left, right, dil int) visFunc {
	return func(p, j int) bool {
		d := p - j
		return d <= left && d >= -right && d%dil == 0
	}
}

func longformerDef(left, right int, globals []int) visFunc {
	g := map[int]bool{}
	for _, x := range globals {
		g[x] = true
	}
	return func(p, j int) bool {
		d := p - j
		return (d <= left && d >= -right) || g[j] || g[p]
	}
}

func mechCases() []mechCase {
	var cs []mechCase
	for _, w := range []WindowConfig{
		{Left: 7, Right: 3}, {Left: 20, Dilation: 3}, {Left: 13, Right: 9, Dilation: 2}, {}, {Right: 5},
	} {
		left, right, dil := w.Left, w.Right, max(w.Dilation, 1)
		if left == 0 && right == 0 {
			left, right = 64, 64
		}
		cs = append(cs, mechCase{
			name: fmt.Sprintf("window%+v", w),
			build: func(t flash.Config) (*Attention, error) {
				w.Tiles = t
				return NewWindow(w)
			},
			def: func(attn.Shape, bool, flash.Pattern) visFunc { return windowDef(left, right, dil) },
		})
	}
	for _, st := range []StridedConfig{
		{Stride: 16}, {Stride: 7}, {Mode: ModeFixed, Stride: 32, Summary: 4}, {Mode: ModeFixed, Stride: 10, Summary: 3},
		{Mode: ModeFixed, Stride: 5, Summary: 5},
	} {
		l, c := st.Stride, st.Summary
		cs = append(cs, mechCase{
			name: fmt.Sprintf("strided%+v", st),
			build: func(t flash.Config) (*Attention, error) {
				st.Tiles = t
				return NewStrided(st)
			},
			def: func(attn.Shape, bool, flash.Pattern) visFunc {
				if st.Mode == ModeFixed {
					// Child et al. §4.2: A1 = the query's block of l, A2 =
					// the last c positions of every block.
					return func(p, j int) bool { return floorDivT(p, l) == j/l || j%l >= l-c }
				}
				// A1 = the previous l positions, A2 = every l-th one.
				return func(p, j int) bool {
					d := p - j
					return (d <= l && d >= -l) || d%l == 0
				}
			},
		})
	}
	for _, lc := range []LongformerConfig{
		{Left: 8, Right: 5, Globals: []int{77, 0, 3, 85, 3}}, {Left: 16, Globals: []int{89}}, {Left: 4, Right: 4, Globals: []int{}}, {},
	} {
		left, right, globals := lc.Left, lc.Right, lc.Globals
		if left == 0 && right == 0 {
			left, right = 64, 64
		}
		if globals == nil {
			globals = []int{0}
		}
		cs = append(cs, mechCase{
			name: fmt.Sprintf("longformer%+v", lc),
			build: func(t flash.Config) (*Attention, error) {
				lc.Tiles = t
				return NewLongformer(lc)
			},
			def: func(attn.Shape, bool, flash.Pattern) visFunc { return longformerDef(left, right, globals) },
		})
	}
	for _, bc := range []BigBirdConfig{
		{Block: 16, Window: 3, Globals: 1, Random: 2, Seed: 5},
		{Block: 13, Window: 2, Globals: 2, Random: 3, Seed: 9},
		{Block: 7, Random: 4, Seed: 1},
		{Block: 32, Window: 1, Globals: 0, Random: 0},
	} {
		cs = append(cs, mechCase{
			name: fmt.Sprintf("bigbird%+v", bc),
			build: func(t flash.Config) (*Attention, error) {
				bc.Tiles = t
				return NewBigBird(bc)
			},
			def: func(s attn.Shape, causal bool, pat flash.Pattern) visFunc {
				bb := pat.(*BigBird)
				b, g, w := bc.Block, bc.Globals, bc.Window
				return func(p, j int) bool {
					qb, kb := floorDivT(p, b), j/b
					if (qb >= 0 && qb < g) || kb < g {
						return true
					}
					if w > 0 && kb-qb >= -(w/2) && kb-qb <= (w-1)/2 {
						return true
					}
					return slices.Contains(bb.RandomBlocks(qb), kb)
				}
			},
		})
	}
	return cs
}

// denseMask is def ∧ causal ∧ padding as a B·N·M mask for ref.Attention.
func denseMask(s attn.Shape, o attn.Options, def visFunc) []bool {
	mask := ref.Mask(s, o)
	for b := range s.B {
		for i := range s.N {
			for j := range s.M {
				mask[(b*s.N+i)*s.M+j] = mask[(b*s.N+i)*s.M+j] && def(s.M-s.N+i, j)
			}
		}
	}
	return mask
}

func TestAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, freshSeed(t))) // fresh inputs every run
	c := 0
	for _, mc := range mechCases() {
		for _, s := range shapes {
			for _, causal := range []bool{false, true} {
				c++
				o := attn.Options{Causal: causal}
				switch c % 3 {
				case 1:
					o.KVLen = make([]int, s.B)
					for b := range o.KVLen {
						o.KVLen[b] = rng.IntN(s.M + 1)
					}
				case 2:
					o.KVLen = make([]int, s.B)
					for b := range o.KVLen {
						o.KVLen[b] = rng.IntN(s.M + 1)
					}
					o.KVLen[rng.IntN(s.B)] = 0
				}
				q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
				var want, wantLSE []float64
				for ti, tc := range tiles {
					a, err := mc.build(tc)
					if err != nil {
						t.Fatalf("%s: %v", mc.name, err)
					}
					pat, err := a.Pattern(s, causal)
					if err != nil {
						t.Fatalf("%s: %v", mc.name, err)
					}
					if want == nil {
						mask := denseMask(s, o, mc.def(s, causal, pat))
						want, wantLSE, err = ref.Attention(s, q, k, v, ref.Spec{Mask: mask})
						if err != nil {
							t.Fatal(err)
						}
					}
					name := fmt.Sprintf("%s %+v causal=%v kvlen=%v tiles=%d", mc.name, s, causal, o.KVLen, ti)
					out := make([]float32, s.QLen())
					lse := make([]float32, s.LSELen())
					if err := a.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					checkResult(t, name+" Forward", s, out, lse, want, wantLSE)

					// The exposed pattern, run as it is, gives the same.
					clear(out)
					if err := flash.New(tc).ForwardPattern(context.Background(), s, q, k, v, o, pat, out, lse); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					checkResult(t, name+" ForwardPattern", s, out, lse, want, wantLSE)

					// Without lse.
					clear(out)
					if err := a.Forward(context.Background(), s, q, k, v, o, out, nil); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if e := ref.RelErr(out, want); e > tol {
						t.Errorf("%s: out rel err %.3g without lse", name, e)
					}
				}
			}
		}
	}
}

// checkResult compares with the reference; rows that see no key must be
// exactly 0 with lse -Inf.
func checkResult(t *testing.T, name string, s attn.Shape, out, lse []float32, want, wantLSE []float64) {
	t.Helper()
	if e := ref.RelErr(out, want); e > tol {
		t.Errorf("%s: out rel err %.3g", name, e)
	}
	if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
		t.Errorf("%s: lse rel err %.3g %v", name, e, err)
	}
	for row, l := range wantLSE {
		if math.IsInf(l, -1) {
			for _, x := range out[row*s.D : (row+1)*s.D] {
				if x != 0 {
					t.Fatalf("%s: row %d sees no key but has output %v", name, row, x)
				}
			}
		}
	}
}

// TestPatternDefinition checks the exposed patterns, as the kernel reads
// them (Dense), against the definitions, and the structure of their
// ranges.
func TestPatternDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, freshSeed(t)))
	for _, mc := range mechCases() {
		for _, s := range shapes {
			for _, causal := range []bool{false, true} {
				a, err := mc.build(flash.Config{})
				if err != nil {
					t.Fatal(err)
				}
				pat, err := a.Pattern(s, causal)
				if err != nil {
					t.Fatal(err)
				}
				def := mc.def(s, causal, pat)
				got, err := Dense(pat, s.N, s.M)
				if err != nil {
					t.Fatal(err)
				}
				for i := range s.N {
					for j := range s.M {
						if p := s.M - s.N + i; got[i*s.M+j] != def(p, j) {
							t.Fatalf("%s %+v: Dense(p=%d, j=%d) = %v, definition %v", mc.name, s, p, j, got[i*s.M+j], def(p, j))
						}
					}
				}
				for range 50 {
					p0 := s.M - s.N + rng.IntN(s.N)
					p1 := min(p0+1+rng.IntN(70), s.M)
					checkRanges(t, mc.name, pat, p0, p1, s.M)
				}
			}
		}
	}
}

// checkRanges checks KeyRanges(p0, p1, m) against pat.Visible: ranges
// sorted and disjoint, every visible pair inside one, Full ranges holding
// only visible pairs.
func checkRanges(t *testing.T, name string, pat flash.Pattern, p0, p1, m int) {
	t.Helper()
	rs := pat.KeyRanges(nil, p0, p1, m)
	covered := make([]int, m) // 0: none, 1: masked range, 2: Full range
	for i, r := range rs {
		if r.Lo >= r.Hi || (i > 0 && r.Lo < rs[i-1].Hi) {
			t.Fatalf("%s: KeyRanges(%d, %d, %d) = %v: empty, unsorted or overlapping", name, p0, p1, m, rs)
		}
		for j := max(r.Lo, 0); j < min(r.Hi, m); j++ {
			covered[j] = 1
			if r.Full {
				covered[j] = 2
			}
		}
	}
	for p := p0; p < p1; p++ {
		for j := range m {
			vis := pat.Visible(p, j)
			if vis && covered[j] == 0 {
				t.Fatalf("%s: KeyRanges(%d, %d, %d) = %v misses visible (p=%d, j=%d)", name, p0, p1, m, rs, p, j)
			}
			if !vis && covered[j] == 2 {
				t.Fatalf("%s: KeyRanges(%d, %d, %d) = %v: Full range holds invisible (p=%d, j=%d)", name, p0, p1, m, rs, p, j)
			}
		}
	}
}

// TestPartRanges checks the patterns of the gathered parts Forward runs
// the same way.
func TestPartRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, freshSeed(t)))
	for _, mc := range mechCases() {
		a, err := mc.build(flash.Config{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range shapes {
			for _, causal := range []bool{false, true} {
				merged, rows, err := a.layout.plan(s, causal)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range append(merged, rows...) {
					pb, ok := p.(perBatch)
					if !ok {
						continue
					}
					g := pb(0, rng.IntN(s.M+1))
					n := s.N
					if g.rows != nil {
						n = len(g.rows)
					}
					m := len(g.keys)
					if m == 0 || n == 0 {
						continue
					}
					for range 30 {
						i0 := rng.IntN(n)
						i1 := min(i0+1+rng.IntN(70), n)
						checkRanges(t, mc.name+" part", g.pat, m-n+i0, m-n+i1, m)
					}
				}
			}
		}
	}
}

// TestCausalPrefix checks that, causal, outputs up to t do not change when
// queries, keys or values after t do.
func TestCausalPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, freshSeed(t)))
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 180, M: 180, D: 16}
	o := attn.Options{Causal: true}
	for _, mc := range mechCases() {
		a, err := mc.build(tiles[1])
		if err != nil {
			t.Fatal(err)
		}
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		out1 := make([]float32, s.QLen())
		if err := a.Forward(context.Background(), s, q, k, v, o, out1, nil); err != nil {
			t.Fatal(err)
		}
		cut := 50 + rng.IntN(100)
		for h := range s.H {
			for i := cut + 1; i < s.N; i++ {
				for c := range s.D {
					q[(h*s.N+i)*s.D+c] = float32(rng.NormFloat64())
				}
			}
		}
		for h := range s.HKV {
			for j := cut + 1; j < s.M; j++ {
				for c := range s.D {
					k[(h*s.M+j)*s.D+c] = float32(rng.NormFloat64())
					v[(h*s.M+j)*s.D+c] = float32(rng.NormFloat64())
				}
			}
		}
		out2 := make([]float32, s.QLen())
		if err := a.Forward(context.Background(), s, q, k, v, o, out2, nil); err != nil {
			t.Fatal(err)
		}
		for h := range s.H {
			for i := 0; i <= cut; i++ {
				for c := range s.D {
					if x, y := out1[(h*s.N+i)*s.D+c], out2[(h*s.N+i)*s.D+c]; x != y {
						t.Fatalf("%s: output at %d changed from %v to %v when positions after %d changed", mc.name, i, x, y, cut)
					}
				}
			}
		}
	}
}

// TestPaddingOnly checks that rows that see only padding get 0 and -Inf.
func TestPaddingOnly(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	s := attn.Shape{B: 2, H: 2, HKV: 1, N: 70, M: 90, D: 8}
	o := attn.Options{KVLen: []int{0, 90}}
	for _, mc := range mechCases() {
		a, err := mc.build(flash.Config{})
		if err != nil {
			t.Fatal(err)
		}
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		out := make([]float32, s.QLen())
		lse := make([]float32, s.LSELen())
		if err := a.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
			t.Fatal(err)
		}
		for row := range s.H * s.N { // batch row 0
			if !math.IsInf(float64(lse[row]), -1) {
				t.Fatalf("%s: padded row %d has lse %v", mc.name, row, lse[row])
			}
			for _, x := range out[row*s.D : (row+1)*s.D] {
				if x != 0 {
					t.Fatalf("%s: padded row %d has output %v", mc.name, row, x)
				}
			}
		}
		for _, x := range out {
			if math.IsNaN(float64(x)) {
				t.Fatalf("%s: NaN in output", mc.name)
			}
		}
	}
}
