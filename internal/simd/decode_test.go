package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn/internal/half"
)

// gemm16Kernels are GemmBF16 and GemmF16, with the conversion of a
// float32 to the type of B and the widening of a value of B.
var gemm16Kernels = []struct {
	name   string
	f      func(impl implementation) func(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16)
	narrow func(x float32) uint16
	widen  func(h uint16) float32
	// roundA is the rounding of A a family's kernel does, or nil.
	roundA func(impl implementation) func(float32) float32
}{
	{
		"bf16",
		func(impl implementation) func(int, int, int, []float32, int, []uint16, int, []float32, int, bool, []uint16) {
			return impl.gemmBF16
		},
		half.F32ToBF16, half.BF16ToF32, bf16Split,
	},
	{
		"bf16native",
		func(impl implementation) func(int, int, int, []float32, int, []uint16, int, []float32, int, bool, []uint16) {
			return impl.gemmBF16Native
		},
		half.F32ToBF16, half.BF16ToF32, bf16Rounding,
	},
	{
		"f16",
		func(impl implementation) func(int, int, int, []float32, int, []uint16, int, []float32, int, bool, []uint16) {
			return impl.gemmF16
		},
		half.F32ToF16, half.F16ToF32, noRounding,
	},
}

// gemmNarrowCase is one problem of a Gemm kernel with a 16-bit or int8
// B: A with NaN in the padding of each row and around it, B with the
// guard of its format there (guard16, a NaN in both 16-bit formats, or
// guard8), C with NaN in its padding and, without accumulate, in its
// elements too.
type gemmNarrowCase[T narrowElem] struct {
	gemmAC
	b     guardedInts[T]
	bSrc  []T
	widen func(T) float32
}

func newGemmNarrowCase[T narrowElem](r *rand.Rand, m, n, k, lda, ldb, ldc int, accumulate bool, bf narrowFormat[T]) *gemmNarrowCase[T] {
	g := &gemmNarrowCase[T]{gemmAC: newGemmAC(r, m, n, k, lda, ldb, ldc), widen: bf.widen}
	g.bSrc = bf.matrix(r, k, n, ldb)
	g.b = guardedCopyInts(g.bSrc, bf.guard)
	g.fillC(r, accumulate)
	return g
}

// check checks the guards of A and C, that B is unchanged, and C against
// the product of A and the widened B (see checkC).
func (g *gemmNarrowCase[T]) check(t *testing.T, accumulate bool) {
	t.Helper()
	g.a.check(t, "A")
	g.c.check(t, "C")
	g.b.unchanged(t, g.bSrc)
	g.checkC(t, accumulate, func(p, j int) float64 { return float64(g.widen(g.bSrc[p*g.ldb+j])) })
}

// TestGemm16 runs GemmBF16 and GemmF16 on the decode shapes (m query rows
// of a group, 1..8 and 32; n = D, 128 or 72 and other multiples of 8,
// with an 8-column last panel; k keys, not a multiple of the unrolling),
// with tight and padded strides, accumulating or not.
func TestGemm16(t *testing.T) {
	ms := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 32}
	ns := []int{0, 8, 16, 24, 40, 72, 128}
	ks := []int{0, 1, 2, 3, 5, 7, 9, 63, 64, 65, 256, 300, 513}
	r := rand.New(rand.NewPCG(27, 28))
	for _, kern := range gemm16Kernels {
		t.Run(kern.name, func(t *testing.T) {
			bf := halfFormat(kern.narrow, kern.widen)
			forEachImpl(t, func(t *testing.T, impl implementation) {
				f := kern.f(impl)
				for _, m := range ms {
					for _, n := range ns {
						for _, k := range ks {
							for _, accumulate := range []bool{false, true} {
								for _, pad := range [][3]int{{0, 0, 0}, {3, 5, 7}} {
									g := newGemmNarrowCase(r, m, n, k, k+pad[0], n+pad[1], n+pad[2], accumulate, bf)
									g.roundA = kern.roundA(impl)
									checkGemm8(m, n, k, len(g.a.v), g.lda, len(g.b.v), g.ldb, len(g.c.v), g.ldc)
									f(m, n, k, g.a.v, g.lda, g.b.v, g.ldb, g.c.v, g.ldc, accumulate, nil)
									name := fmt.Sprintf("m=%d n=%d k=%d lda=%d ldb=%d ldc=%d acc=%v", m, n, k, g.lda, g.ldb, g.ldc, accumulate)
									t.Run(name, func(t *testing.T) { g.check(t, accumulate) })
								}
							}
						}
					}
				}
				// The decode step's own call: a [g][64] block of
				// probabilities, V rows of a 16-bit cache (stride 128
				// or 96 for D = 72), acc rows of the same stride.
				for _, m := range []int{1, 4, 8, 32} {
					for _, d := range [][2]int{{128, 128}, {72, 96}} {
						g := newGemmNarrowCase(r, m, d[0], 61, 64, d[1], d[1], true, bf)
						g.roundA = kern.roundA(impl)
						f(m, d[0], 61, g.a.v, g.lda, g.b.v, g.ldb, g.c.v, g.ldc, true, nil)
						t.Run(fmt.Sprintf("decode m=%d d=%d", m, d[0]), func(t *testing.T) { g.check(t, true) })
					}
				}
			})
		})
	}
}

// TestGemm16Widened checks that GemmBF16 and GemmF16 agree with Gemm on
// the widened B wherever the sums are exact: A and B small integers.
func TestGemm16Widened(t *testing.T) {
	const m, n, k = 7, 40, 19
	r := rand.New(rand.NewPCG(29, 30))
	a := make([]float32, m*k)
	for i := range a {
		a[i] = float32(r.IntN(9) - 4)
	}
	for _, kern := range gemm16Kernels {
		b := make([]uint16, k*n)
		bw := make([]float32, k*n+16)
		for i := range b {
			b[i] = kern.narrow(float32(r.IntN(17) - 8))
			bw[i] = kern.widen(b[i])
		}
		want := gemm48(m, n, k, a, bw)
		forEachImpl(t, func(t *testing.T, impl implementation) {
			c := make([]float32, m*n)
			kern.f(impl)(m, n, k, a, k, b, n, c, n, false, nil)
			checkSameC(t, kern.name, m, n, c, want)
		})
	}
}

// gemm48 is A·B by Gemm for an m×k A and a k×n B, n at most 48, at tight
// strides. Gemm wants n a multiple of 16: it runs on 48 columns of a
// zero-padded copy of B, and the product has stride 48.
func gemm48(m, n, k int, a, b []float32) []float32 {
	bp := make([]float32, k*48)
	for p := range k {
		copy(bp[p*48:], b[p*n:][:n])
	}
	want := make([]float32, m*48)
	Gemm(m, 48, k, a, k, bp, 48, want, 48, false)
	return want
}

// checkSameC checks that c, m rows of n at stride n, equals want, the
// product gemm48 gives.
func checkSameC(t *testing.T, name string, m, n int, c, want []float32) {
	t.Helper()
	for i := range m {
		for j := range n {
			if c[i*n+j] != want[i*48+j] {
				t.Fatalf("%s: C[%d][%d] = %v, want %v", name, i, j, c[i*n+j], want[i*48+j])
			}
		}
	}
}

// TestGemm16ArgumentChecks checks the panics of GemmBF16, GemmF16 and
// GemmPF and of the DotRows kernels with a hint, and runs the exported
// functions on the implementation in use.
func TestGemm16ArgumentChecks(t *testing.T) {
	s := make([]float32, 100)
	h := make([]uint16, 100)
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"n%8", func() { GemmBF16(1, 12, 1, s, 1, h, 12, s, 12, false, nil) }},
		{"negative", func() { GemmF16(-1, 8, 1, s, 1, h, 8, s, 8, false, nil) }},
		{"short C", func() { GemmBF16(2, 8, 1, s, 1, h, 8, s[:15], 8, false, nil) }},
		{"ldc", func() { GemmF16(2, 16, 1, s, 1, h, 16, s, 8, false, nil) }},
		{"short A", func() { GemmBF16(2, 8, 4, s[:7], 4, h, 8, s, 8, false, nil) }},
		{"lda", func() { GemmF16(2, 8, 4, s, 3, h, 8, s, 8, false, nil) }},
		{"short B", func() { GemmBF16(2, 8, 4, s, 4, h[:31], 8, s, 8, false, nil) }},
		{"ldb", func() { GemmF16(2, 8, 4, s, 4, h, 7, s, 8, false, nil) }},
		{"GemmPF n%8", func() { GemmPF(1, 12, 1, s, 1, s, 12, s, 12, false, nil) }},
		{"GemmPF short B", func() { GemmPF(2, 8, 4, s, 4, s[:31], 8, s, 8, false, nil) }},
		{"DotRowsPF lds", func() { DotRowsPF(s, 3, s, 4, 2, s, 4, 4, 4, nil) }},
		{"DotRowsBF16PF short k", func() { DotRowsBF16PF(s, 4, s, 4, 2, h[:15], 4, 4, 4, nil) }},
		{"DotRowsF16PF ldq", func() { DotRowsF16PF(s, 4, s, 3, 2, h, 4, 4, 4, nil) }},
		{"DotRowsBF16Native short q", func() { DotRowsBF16Native(s, 4, s[:7], 4, 2, h, 4, 4, 4, nil) }},
		{"GemmBF16Native n%8", func() { GemmBF16Native(1, 12, 1, s, 1, h, 12, s, 12, false, nil) }},
		{"GemmBF16Native short B", func() { GemmBF16Native(2, 8, 4, s, 4, h[:31], 8, s, 8, false, nil) }},
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
	GemmBF16(0, 8, 5, nil, 0, nil, 0, nil, 0, false, nil)
	GemmF16(3, 0, 5, nil, 0, nil, 0, nil, 0, true, nil)
	c := []float32{guard, guard, guard, guard, guard, guard, guard, guard}
	GemmBF16(1, 8, 0, nil, 0, nil, 0, c, 8, false, nil)
	for _, v := range c {
		if v != 0 {
			t.Fatalf("GemmBF16 with k=0 left %v in C, want 0", v)
		}
	}
	// The exported functions on the implementation in use.
	out := make([]float32, 8)
	GemmBF16(1, 8, 2, []float32{2, 3}, 2, []uint16{0x3f80, 0, 0, 0, 0, 0, 0, 0, 0, 0x4000, 0, 0, 0, 0, 0, 0}, 8, out, 8, false, nil)
	if out[0] != 2 || out[1] != 6 {
		t.Errorf("GemmBF16: %v", out)
	}
	GemmF16(1, 8, 1, []float32{3}, 1, []uint16{0x3c00, 0x0001, 0, 0, 0, 0, 0, 0}, 8, out, 8, true, nil)
	if out[0] != 5 || out[1] != 6+3*0x1p-24 {
		t.Errorf("GemmF16: %v", out)
	}
	GemmPF(1, 8, 1, []float32{2}, 1, []float32{1, 2, 3, 4, 5, 6, 7, 8}, 8, out, 8, false, s)
	if out[0] != 2 || out[7] != 16 {
		t.Errorf("GemmPF: %v", out)
	}
	sc := make([]float32, 2)
	DotRowsPF(sc, 2, []float32{1, 2}, 2, 1, []float32{3, 4, 5, 6}, 2, 2, 2, s)
	if sc[0] != 11 || sc[1] != 17 {
		t.Errorf("DotRowsPF: %v", sc)
	}
	DotRowsBF16PF(sc, 2, []float32{1, 2}, 2, 1, []uint16{0x3f80, 0x4000, 0, 0x3f80}, 2, 2, 2, h)
	if sc[0] != 5 || sc[1] != 2 {
		t.Errorf("DotRowsBF16PF: %v", sc)
	}
	DotRowsF16PF(sc, 2, []float32{1, 2}, 2, 1, []uint16{0x3c00, 0x4000, 0, 0x3c00}, 2, 2, 2, h)
	if sc[0] != 5 || sc[1] != 2 {
		t.Errorf("DotRowsF16PF: %v", sc)
	}
	// 1 + 2^-10 is no bfloat16: the native kernels round it to 1.
	qr := []float32{1 + 0x1p-10, 2}
	DotRowsBF16Native(sc, 2, qr, 2, 1, []uint16{0x3f80, 0x4000, 0, 0x3f80}, 2, 2, 2, h)
	if want := map[bool]float32{true: 5, false: 5 + 0x1p-10}[NativeBF16()]; sc[0] != want || sc[1] != 2 {
		t.Errorf("DotRowsBF16Native: %v, want %v, 2", sc, want)
	}
	DotRowsBF16PF(sc, 2, qr, 2, 1, []uint16{0x3f80, 0x4000, 0, 0x3f80}, 2, 2, 2, h)
	if sc[0] != 5+0x1p-10 || sc[1] != 2 {
		t.Errorf("DotRowsBF16PF: %v, want %v, 2", sc, 5+0x1p-10)
	}
	GemmBF16Native(1, 8, 2, qr, 2, []uint16{0x3f80, 0, 0, 0, 0, 0, 0, 0, 0, 0x4000, 0, 0, 0, 0, 0, 0}, 8, out, 8, false, h)
	if want := map[bool]float32{true: 1, false: 1 + 0x1p-10}[NativeBF16()]; out[0] != want || out[1] != 4 {
		t.Errorf("GemmBF16Native: %v, want %v, 4", out[:2], want)
	}
}

// TestGemm16NoAlloc checks that GemmBF16, GemmF16 and GemmPF do not
// allocate.
func TestGemm16NoAlloc(t *testing.T) {
	const m, n, k = 4, 128, 64
	a := make([]float32, m*k)
	b := make([]uint16, k*n)
	c := make([]float32, m*n)
	for _, kern := range gemm16Kernels {
		forEachImpl(t, func(t *testing.T, impl implementation) {
			f := kern.f(impl)
			if allocs := testing.AllocsPerRun(10, func() { f(m, n, k, a, k, b, n, c, n, true, nil) }); allocs != 0 {
				t.Errorf("%s: %v allocations a call", kern.name, allocs)
			}
		})
	}
	bf := make([]float32, k*n)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		if allocs := testing.AllocsPerRun(10, func() { impl.gemmPF(m, n, k, a, k, bf, n, c, n, true, bf) }); allocs != 0 {
			t.Errorf("GemmPF: %v allocations a call", allocs)
		}
	})
}

// TestGemmPF runs GemmPF on the shapes of TestGemm16 with float32 B,
// with and without a prefetch hint; the hint must change nothing.
func TestGemmPF(t *testing.T) {
	ms := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 13, 32}
	ns := []int{8, 16, 24, 72, 128}
	ks := []int{0, 1, 3, 5, 9, 63, 64, 65}
	r := rand.New(rand.NewPCG(31, 32))
	hint := make([]float32, 5000)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, m := range ms {
			for _, n := range ns {
				for _, k := range ks {
					for _, accumulate := range []bool{false, true} {
						for i, pf := range [][]float32{nil, hint[:3], hint} {
							pad := [3]int{0, 0, 0}
							if i == 1 {
								pad = [3]int{3, 5, 7}
							}
							g := newGemmCase(r, m, n, k, k+pad[0], n+pad[1], n+pad[2], accumulate)
							checkGemm8(m, n, k, len(g.a.v), g.lda, len(g.b.v), g.ldb, len(g.c.v), g.ldc)
							impl.gemmPF(m, n, k, g.a.v, g.lda, g.b.v, g.ldb, g.c.v, g.ldc, accumulate, pf)
							name := fmt.Sprintf("m=%d n=%d k=%d lda=%d ldb=%d ldc=%d acc=%v pf=%d", m, n, k, g.lda, g.ldb, g.ldc, accumulate, len(pf))
							t.Run(name, func(t *testing.T) { g.check(t, accumulate) })
						}
					}
				}
			}
		}
	})
}

// TestPrefetchHints checks that the kernels with a prefetch hint give
// bit for bit the results of those without, whatever the hint: nil, less
// than a line, or memory unrelated to the operands.
func TestPrefetchHints(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	hint := make([]float32, 3000)
	hint16 := make([]uint16, 3000)
	for _, sh := range []struct{ rows, n, d int }{{1, 64, 128}, {4, 61, 128}, {8, 64, 72}, {32, 17, 40}, {3, 5, 9}} {
		st := (sh.d + 31) &^ 31
		q := randSlice(r, sh.rows*st, -1, 1)
		k := randSlice(r, sh.n*st, -1, 1)
		k16 := make([]uint16, len(k))
		for i, x := range k {
			k16[i] = half.F32ToBF16(x)
		}
		forEachImpl(t, func(t *testing.T, impl implementation) {
			want := make([]float32, sh.rows*sh.n)
			got := make([]float32, sh.rows*sh.n)
			for _, kern := range []struct {
				name  string
				plain func()
				pf    func(i int)
			}{
				{"DotRowsPF", func() { impl.dotRows(want, sh.n, q, st, sh.rows, k, st, sh.n, sh.d) },
					func(i int) {
						impl.dotRowsPF(got, sh.n, q, st, sh.rows, k, st, sh.n, sh.d, [][]float32{nil, hint[:7], hint}[i])
					}},
				{"DotRowsBF16PF", func() { impl.dotRowsBF16(want, sh.n, q, st, sh.rows, k16, st, sh.n, sh.d) },
					func(i int) {
						impl.dotRowsBF16PF(got, sh.n, q, st, sh.rows, k16, st, sh.n, sh.d, [][]uint16{nil, hint16[:7], hint16}[i])
					}},
				{"DotRowsF16PF", func() { impl.dotRowsF16(want, sh.n, q, st, sh.rows, k16, st, sh.n, sh.d) },
					func(i int) {
						impl.dotRowsF16PF(got, sh.n, q, st, sh.rows, k16, st, sh.n, sh.d, [][]uint16{nil, hint16[:7], hint16}[i])
					}},
				{"DotRowsBF16Native", func() { impl.dotRowsBF16Native(want, sh.n, q, st, sh.rows, k16, st, sh.n, sh.d, nil) },
					func(i int) {
						impl.dotRowsBF16Native(got, sh.n, q, st, sh.rows, k16, st, sh.n, sh.d, [][]uint16{nil, hint16[:7], hint16}[i])
					}},
			} {
				kern.plain()
				for i := range 3 {
					clear(got)
					kern.pf(i)
					for j := range got {
						if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
							t.Fatalf("%s %+v hint %d: [%d] = %v, want %v", kern.name, sh, i, j, got[j], want[j])
						}
					}
				}
			}
			// Gemm16 with a hint against none.
			a := randSlice(r, sh.rows*sh.n, 0, 1)
			w := (sh.d + 7) &^ 7
			c0 := make([]float32, sh.rows*st)
			c1 := make([]float32, sh.rows*st)
			for _, g := range []struct {
				name string
				f    func(m, n, k int, a []float32, lda int, b []uint16, ldb int, c []float32, ldc int, accumulate bool, pf []uint16)
			}{{"GemmBF16", impl.gemmBF16}, {"GemmBF16Native", impl.gemmBF16Native}} {
				g.f(sh.rows, w, sh.n, a, sh.n, k16, st, c0, st, false, nil)
				g.f(sh.rows, w, sh.n, a, sh.n, k16, st, c1, st, false, hint16)
				for j := range c0 {
					if math.Float32bits(c0[j]) != math.Float32bits(c1[j]) {
						t.Fatalf("%s %+v: [%d] = %v with a hint, %v without", g.name, sh, j, c1[j], c0[j])
					}
				}
			}
		})
	}
}
