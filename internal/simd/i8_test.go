package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// guard8 fills the padding of int8 rows and the memory around them: the
// most negative code, far from the random ones, so that a kernel reading
// it where it should not changes the results visibly (int8 has no NaN).
const guard8 = -128

// i8Format is the format of int8 codes: random ones from randCode, with
// guard8 around them.
var i8Format = narrowFormat[int8]{guard: guard8, rand: randCode, widen: func(c int8) float32 { return float32(c) }}

// randCode returns an int8 code, all 256 values possible, -128 and 127
// more often than chance.
func randCode(r *rand.Rand) int8 {
	switch r.IntN(16) {
	case 0:
		return -128
	case 1:
		return 127
	default:
		return int8(r.Uint32())
	}
}

// randCodes returns n codes of randCode.
func randCodes(r *rand.Rand, n int) []int8 {
	x := make([]int8, n)
	for i := range x {
		x[i] = randCode(r)
	}
	return x
}

// TestWidenI8 widens rows of every length of testLengths (and a few row
// counts) at four alignments of dst, with scales of every kind: 0,
// subnormal, huge, negative, NaN; each value must be the float32 product
// of the code and its row's scale, bit for bit.
func TestWidenI8(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	scales := []float32{1, 0, 0x1p-140, 3e36, -0.75, float32(math.NaN()), float32(math.Inf(1))}
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, ld := range testLengths {
			for _, rows := range []int{0, 1, 2, 3, 7} {
				for off := range 4 {
					src := randCodes(r, rows*ld)
					sc := make([]float32, rows)
					for i := range sc {
						sc[i] = scales[r.IntN(len(scales))] * (0.5 + r.Float32())
					}
					g := guardedCopyInts(src, guard8)
					scg := guardedCopy(sc)
					dst := newGuarded(rows*ld + off)
					impl.widenI8(dst.v[off:], g.v, scg.v, ld)
					name := fmt.Sprintf("ld=%d rows=%d off=%d", ld, rows, off)
					dst.check(t, name)
					scg.check(t, name+" scale")
					g.unchanged(t, src)
					for i := range off {
						if math.Float32bits(dst.v[i]) != math.Float32bits(guard) {
							t.Fatalf("%s: dst[%d] before the slice written", name, i)
						}
					}
					for i, c := range src {
						want := float32(c) * sc[i/ld]
						if got := dst.v[off+i]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s: [%d] = %d·%v: got %v, want %v", name, i, c, sc[i/ld], got, want)
						}
					}
				}
			}
		}
	})
}

// TestScaleColumns runs ScaleColumns on every width of testLengths (up
// to 257), a few row counts and tight and padded strides: each element
// of the rows must be the float32 product of the old one and its
// column's factor, the padding between the rows and the memory around s
// and f untouched.
func TestScaleColumns(t *testing.T) {
	r := rand.New(rand.NewPCG(49, 50))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range testLengths {
			if n > 257 {
				continue
			}
			for _, rows := range []int{0, 1, 2, 3, 5} {
				for _, pad := range []int{0, 3} {
					lds := n + pad
					size := 0
					if rows > 0 {
						size = (rows-1)*lds + n
					}
					s0 := randSlice(r, size, -4, 4)
					for i := range s0 {
						if i%lds >= n {
							s0[i] = guard
						}
					}
					f := randSlice(r, n, -2, 2)
					sg, fg := guardedCopy(s0), guardedCopy(f)
					impl.scaleColumns(sg.v, lds, rows, fg.v)
					name := fmt.Sprintf("n=%d rows=%d lds=%d", n, rows, lds)
					sg.check(t, name+" s")
					fg.check(t, name+" f")
					for i, old := range s0 {
						want := old
						if i%lds < n {
							want = old * f[i%lds]
						}
						if got := sg.v[i]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s: s[%d] = %v, want %v", name, i, got, want)
						}
					}
					for i, x := range fg.v {
						if x != f[i] {
							t.Fatalf("%s: f[%d] changed", name, i)
						}
					}
				}
			}
		}
	})
}

// TestDotRowsI8 runs DotRowsI8 and DotRowsI8PF (with a hint) on the
// shapes of TestDotRows16: every row count of a block and its tails,
// every d%8 and d%16, tight and padded strides.
func TestDotRowsI8(t *testing.T) {
	hint := make([]int8, 4000)
	r := rand.New(rand.NewPCG(43, 44))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		testDotRowsNarrow(t, r, "pf=false ", i8Format, nil, impl.dotRowsI8)
		testDotRowsNarrow(t, r, "pf=true ", i8Format, nil, func(s []float32, lds int, q []float32, ldq, rows int, k []int8, ldk, n, d int) {
			impl.dotRowsI8PF(s, lds, q, ldq, rows, k, ldk, n, d, hint)
		})
	})
}

// TestDotRowsI8Empty checks that empty problems read nothing: with d = 0
// the scores are 0 whatever q and k are.
func TestDotRowsI8Empty(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl implementation) {
		impl.dotRowsI8(nil, 0, nil, 0, 0, nil, 0, 5, 3)
		impl.dotRowsI8(nil, 0, nil, 0, 3, nil, 0, 0, 3)
		s := newGuarded(2*5 + 4)
		impl.dotRowsI8PF(s.v, 7, nil, 0, 2, nil, 0, 4, 0, nil)
		checkZeroScores(t, s)
	})
}

// TestGemmI8 runs GemmI8 on the shapes of TestGemm16 (m query rows of a
// group, n = D with an 8-column last panel, k keys not a multiple of the
// unrolling), tight and padded strides, accumulating or not, with no
// hint, a short one and one unrelated to the operands.
func TestGemmI8(t *testing.T) {
	ms := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 32}
	ns := []int{0, 8, 16, 24, 40, 72, 128}
	ks := []int{0, 1, 2, 3, 5, 7, 9, 63, 64, 65}
	hint := make([]int8, 5000)
	r := rand.New(rand.NewPCG(45, 46))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, m := range ms {
			for _, n := range ns {
				for _, k := range ks {
					for _, accumulate := range []bool{false, true} {
						for i, pf := range [][]int8{nil, hint[:3], hint} {
							pad := [3]int{0, 0, 0}
							if i == 1 {
								pad = [3]int{3, 5, 7}
							}
							g := newGemmNarrowCase(r, m, n, k, k+pad[0], n+pad[1], n+pad[2], accumulate, i8Format)
							checkGemm8(m, n, k, len(g.a.v), g.lda, len(g.b.v), g.ldb, len(g.c.v), g.ldc)
							impl.gemmI8(m, n, k, g.a.v, g.lda, g.b.v, g.ldb, g.c.v, g.ldc, accumulate, pf)
							name := fmt.Sprintf("m=%d n=%d k=%d lda=%d ldb=%d ldc=%d acc=%v pf=%d", m, n, k, g.lda, g.ldb, g.ldc, accumulate, len(pf))
							t.Run(name, func(t *testing.T) { g.check(t, accumulate) })
						}
					}
				}
			}
		}
		// The decode step's own call: a [g][64] block of probabilities,
		// V rows of an int8 cache (stride 128, or 128 for D = 72 too, a
		// 64-byte multiple), acc rows of the same stride.
		for _, m := range []int{1, 4, 8, 32} {
			for _, d := range [][2]int{{128, 128}, {72, 128}} {
				g := newGemmNarrowCase(r, m, d[0], 61, 64, d[1], d[1], true, i8Format)
				impl.gemmI8(m, d[0], 61, g.a.v, g.lda, g.b.v, g.ldb, g.c.v, g.ldc, true, hint)
				t.Run(fmt.Sprintf("decode m=%d d=%d", m, d[0]), func(t *testing.T) { g.check(t, true) })
			}
		}
	})
}

// TestI8Exact checks that DotRowsI8 and GemmI8 agree bit for bit with
// DotRows and Gemm on the widened codes wherever the sums are exact (small
// integer q and A), with and without a hint, and WidenI8 with
// float32(code)·scale.
func TestI8Exact(t *testing.T) {
	const m, n, k = 7, 40, 19
	r := rand.New(rand.NewPCG(47, 48))
	a := make([]float32, m*k)
	for i := range a {
		a[i] = float32(r.IntN(9) - 4)
	}
	b := randCodes(r, k*n)
	bw := make([]float32, k*n)
	for i, c := range b {
		bw[i] = float32(c)
	}
	want := gemm48(m, n, k, a, bw)
	// The scores of m query rows of n small integers against the k rows
	// of b taken as keys.
	q := make([]float32, m*n)
	for i := range q {
		q[i] = float32(r.IntN(5) - 2)
	}
	wantS := make([]float32, m*k)
	DotRows(wantS, k, q, n, m, bw, n, k, n)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, pf := range [][]int8{nil, b} {
			c := make([]float32, m*n)
			impl.gemmI8(m, n, k, a, k, b, n, c, n, false, pf)
			checkSameC(t, "GemmI8", m, n, c, want)
			s := make([]float32, m*k)
			impl.dotRowsI8PF(s, k, q, n, m, b, n, k, n, pf)
			for i, v := range s {
				if v != wantS[i] {
					t.Fatalf("DotRowsI8: s[%d] = %v, want %v", i, v, wantS[i])
				}
			}
		}
	})
}

// TestI8ArgumentChecks checks the panics of the int8 kernels and runs the
// exported functions on the implementation in use.
func TestI8ArgumentChecks(t *testing.T) {
	s := make([]float32, 100)
	b := make([]int8, 100)
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"GemmI8 n%8", func() { GemmI8(1, 12, 1, s, 1, b, 12, s, 12, false, nil) }},
		{"GemmI8 negative", func() { GemmI8(-1, 8, 1, s, 1, b, 8, s, 8, false, nil) }},
		{"GemmI8 short C", func() { GemmI8(2, 8, 1, s, 1, b, 8, s[:15], 8, false, nil) }},
		{"GemmI8 short A", func() { GemmI8(2, 8, 4, s[:7], 4, b, 8, s, 8, false, nil) }},
		{"GemmI8 short B", func() { GemmI8(2, 8, 4, s, 4, b[:31], 8, s, 8, false, nil) }},
		{"GemmI8 ldb", func() { GemmI8(2, 8, 4, s, 4, b, 7, s, 8, false, nil) }},
		{"DotRowsI8 lds", func() { DotRowsI8(s, 3, s, 4, 2, b, 4, 4, 4) }},
		{"DotRowsI8 short k", func() { DotRowsI8(s, 4, s, 4, 2, b[:15], 4, 4, 4) }},
		{"DotRowsI8PF ldq", func() { DotRowsI8PF(s, 4, s, 3, 2, b, 4, 4, 4, nil) }},
		{"DotRowsI8PF negative", func() { DotRowsI8PF(s, 4, s, 4, -1, b, 4, 4, 4, nil) }},
		{"WidenI8 ld", func() { WidenI8(s[:0], b[:0], nil, -1) }},
		{"WidenI8 dst", func() { WidenI8(s[:7], b[:8], s[:2], 4) }},
		{"WidenI8 scale", func() { WidenI8(s[:8], b[:8], s[:3], 4) }},
		{"ScaleColumns rows", func() { ScaleColumns(s, 4, -1, s[:4]) }},
		{"ScaleColumns lds", func() { ScaleColumns(s, 3, 2, s[:4]) }},
		{"ScaleColumns short s", func() { ScaleColumns(s[:7], 4, 2, s[:4]) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f()
		}()
	}
	// Empty problems need no memory at all; k = 0 clears C.
	GemmI8(0, 8, 5, nil, 0, nil, 0, nil, 0, false, nil)
	GemmI8(3, 0, 5, nil, 0, nil, 0, nil, 0, true, nil)
	c := []float32{guard, guard, guard, guard, guard, guard, guard, guard}
	GemmI8(1, 8, 0, nil, 0, nil, 0, c, 8, false, nil)
	for _, v := range c {
		if v != 0 {
			t.Fatalf("GemmI8 with k=0 left %v in C, want 0", v)
		}
	}
	WidenI8(nil, nil, nil, 0)
	WidenI8(nil, nil, s[:3], 0)
	// The exported functions on the implementation in use.
	out := make([]float32, 8)
	GemmI8(1, 8, 2, []float32{2, 3}, 2, []int8{1, -1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, -128}, 8, out, 8, false, nil)
	if out[0] != 2 || out[1] != 4 || out[7] != -384 {
		t.Errorf("GemmI8: %v", out)
	}
	sc := make([]float32, 2)
	DotRowsI8(sc, 2, []float32{1, 2}, 2, 1, []int8{3, 4, -5, 127}, 2, 2, 2)
	if sc[0] != 11 || sc[1] != 249 {
		t.Errorf("DotRowsI8: %v", sc)
	}
	DotRowsI8PF(sc, 2, []float32{1, 2}, 2, 1, []int8{1, 2, 0, 1}, 2, 2, 2, b)
	if sc[0] != 5 || sc[1] != 2 {
		t.Errorf("DotRowsI8PF: %v", sc)
	}
	ScaleColumns(nil, 0, 0, s[:4])
	ScaleColumns(nil, 0, 3, nil)
	m := []float32{1, 2, 3, 9, 4, 5, 6}
	ScaleColumns(m, 4, 2, []float32{2, 0, -1})
	if m[0] != 2 || m[1] != 0 || m[2] != -3 || m[3] != 9 || m[4] != 8 || m[6] != -6 {
		t.Errorf("ScaleColumns: %v", m)
	}
	w := make([]float32, 4)
	WidenI8(w, []int8{1, -2, 127, -128}, []float32{0.5, 2}, 2)
	if w[0] != 0.5 || w[1] != -1 || w[2] != 254 || w[3] != -256 {
		t.Errorf("WidenI8: %v", w)
	}
}

// TestI8NoAlloc checks that the int8 kernels do not allocate.
func TestI8NoAlloc(t *testing.T) {
	const m, n, k = 4, 128, 64
	a := make([]float32, m*k)
	b := make([]int8, k*n)
	c := make([]float32, m*n)
	s := make([]float32, m*k)
	sc := make([]float32, k)
	w := make([]float32, k*n)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for name, f := range map[string]func(){
			"GemmI8":       func() { impl.gemmI8(m, n, k, a, k, b, n, c, n, true, b) },
			"DotRowsI8":    func() { impl.dotRowsI8(s, k, c, n, m, b, n, k, n) },
			"DotRowsI8PF":  func() { impl.dotRowsI8PF(s, k, c, n, m, b, n, k, n, b) },
			"WidenI8":      func() { impl.widenI8(w, b, sc, n) },
			"ScaleColumns": func() { impl.scaleColumns(s, k, m, sc) },
		} {
			if allocs := testing.AllocsPerRun(10, f); allocs != 0 {
				t.Errorf("%s: %v allocations a call", name, allocs)
			}
		}
	})
}

// u4Formats are the two halves of packed 4-bit codes: random bytes, each
// read as its low or its high nibble, with 0xFF around them (a nibble of
// 15 that a read of the padding would add).
var u4Formats = [2]narrowFormat[uint8]{
	{guard: 0xFF, rand: func(r *rand.Rand) uint8 { return uint8(r.Uint32()) }, widen: func(c uint8) float32 { return float32(c & 15) }},
	{guard: 0xFF, rand: func(r *rand.Rand) uint8 { return uint8(r.Uint32()) }, widen: func(c uint8) float32 { return float32(c >> 4) }},
}

// TestDotRowsU4 runs DotRowsU4 on both halves over the shapes of
// TestDotRowsI8.
func TestDotRowsU4(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for h, f := range u4Formats {
			testDotRowsNarrow(t, r, fmt.Sprintf("hi=%d ", h), f, nil, impl.dotRowsU4[h])
		}
	})
}

// TestGemmU4 runs GemmU4 on both halves over the shapes of TestGemmI8.
func TestGemmU4(t *testing.T) {
	ms := []int{0, 1, 2, 3, 4, 5, 8, 13, 32}
	ns := []int{0, 8, 16, 24, 40, 64, 72, 128}
	ks := []int{0, 1, 2, 3, 5, 9, 63, 64, 65}
	r := rand.New(rand.NewPCG(55, 56))
	hint := make([]uint8, 5000)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for h, f := range u4Formats {
			for _, m := range ms {
				for _, n := range ns {
					for _, k := range ks {
						for i, accumulate := range []bool{false, true} {
							pad := [3]int{0, 0, 0}
							if i == 1 {
								pad = [3]int{3, 5, 7}
							}
							g := newGemmNarrowCase(r, m, n, k, k+pad[0], n+pad[1], n+pad[2], accumulate, f)
							impl.gemmU4[h](m, n, k, g.a.v, g.lda, g.b.v, g.ldb, g.c.v, g.ldc, accumulate, hint[:i*len(hint)])
							name := fmt.Sprintf("hi=%d m=%d n=%d k=%d ldb=%d acc=%v", h, m, n, k, g.ldb, accumulate)
							t.Run(name, func(t *testing.T) { g.check(t, accumulate) })
						}
					}
				}
			}
		}
	})
}
