package simd

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/attnkit/attn"
)

// The tests run every implementation this CPU supports (see
// implementations) and compare each with a float64 computation.

// guard is the value around every slice a kernel gets: a NaN with a
// payload of its own, so that a kernel that reads it poisons its result
// and one that writes it changes its bits.
var guard = math.Float32frombits(0x7fa5a5a5)

const guardLen = 19

// guarded is a slice v with guardLen guard values on either side in the
// same array, as gonum's kernel tests do.
type guarded struct {
	all []float32
	v   []float32
}

func newGuarded(n int) guarded {
	all := make([]float32, n+2*guardLen)
	for i := range all {
		all[i] = guard
	}
	return guarded{all: all, v: all[guardLen : guardLen+n]}
}

func guardedCopy(x []float32) guarded {
	g := newGuarded(len(x))
	copy(g.v, x)
	return g
}

// check reports any guard value that changed.
func (g guarded) check(t *testing.T, name string) {
	t.Helper()
	n := len(g.v)
	for i, v := range g.all {
		if (i < guardLen || i >= guardLen+n) && math.Float32bits(v) != math.Float32bits(guard) {
			t.Errorf("%s: guard at offset %d written: %v", name, i-guardLen, v)
		}
	}
}

// testLengths holds 0, 1, every remainder of 8 and 16, and longer slices
// that go through the unrolled loops.
var testLengths = []int{
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
	23, 24, 25, 31, 32, 33, 39, 47, 48, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 1000, 1023,
}

func randSlice(r *rand.Rand, n int, lo, hi float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = lo + (hi-lo)*r.Float32()
	}
	return x
}

func forEachImpl(t *testing.T, f func(t *testing.T, impl implementation)) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) { f(t, impl) })
	}
}

func TestImplementations(t *testing.T) {
	names := Families()
	var missing []string
	for _, f := range familyNames {
		if !slices.Contains(names, f) {
			missing = append(missing, f)
		}
	}
	// Every test that runs forEachImpl covers these families.
	t.Logf("kernel families covered: %v; not on this CPU or build: %v; in use: %s", names, missing, Kernels())
	want, _ := chooseKernels(os.Getenv("ATTN_KERNELS"))
	if names[0] != "generic" || active != want || Implementation() != Kernels() {
		t.Errorf("implementations %v, active %s, want %s", names, active.name, want.name)
	}
	for i, f := range names {
		if j := slices.Index(familyNames, f); j < 0 || (i > 0 && j <= slices.Index(familyNames, names[i-1])) {
			t.Errorf("families %v not in the order of %v", names, familyNames)
		}
	}
}

func TestChooseKernels(t *testing.T) {
	names := Families()
	best := names[len(names)-1]
	for _, c := range []struct {
		req, want string
		note      bool
	}{
		{"", best, false},
		{"  ", best, false},
		{"go", "generic", false},
		{" PureGo ", "generic", false},
		{"generic", "generic", false},
		{"sse2", best, true},
		{"neon", atMost(names, "neon"), !slices.Contains(names, "neon")},
		{"avx2", atMost(names, "avx2"), !slices.Contains(names, "avx2")},
		{"avx512", atMost(names, "avx512"), !slices.Contains(names, "avx512")},
		{"AVX512BF16", atMost(names, "avx512bf16"), !slices.Contains(names, "avx512bf16")},
		{" amx", atMost(names, "amx"), !slices.Contains(names, "amx")},
	} {
		impl, note := chooseKernels(c.req)
		if impl.name != c.want || (note != "") != c.note {
			t.Errorf("ATTN_KERNELS=%q: %s, note %q; want %s, a note %v", c.req, impl.name, note, c.want, c.note)
		}
	}
}

// atMost is the most capable of names (the families of this machine)
// that is no more capable than family.
func atMost(names []string, family string) string {
	rank := slices.Index(familyNames, family)
	best := names[0]
	for _, f := range names {
		if slices.Index(familyNames, f) <= rank {
			best = f
		}
	}
	return best
}

func TestUseKernels(t *testing.T) {
	orig := Kernels()
	defer UseKernels(orig)
	for _, f := range Families() {
		if _, err := UseKernels(f); err != nil || Kernels() != f {
			t.Fatalf("UseKernels(%s): %v, in use %s", f, err, Kernels())
		}
		// The exported functions call the family in use.
		x := []float32{1, 2, 3}
		if d := Dot(x, x); d != 14 {
			t.Errorf("%s: Dot = %v", f, d)
		}
	}
	if _, err := UseKernels("sse2"); !errors.Is(err, attn.ErrInput) {
		t.Errorf("UseKernels(sse2): %v, want ErrInput", err)
	}
	for _, f := range familyNames {
		if !slices.Contains(Families(), f) {
			before := Kernels()
			if _, err := UseKernels(f); !errors.Is(err, attn.ErrUnsupported) || Kernels() != before {
				t.Errorf("UseKernels(%s) on a CPU without it: %v, in use %s", f, err, Kernels())
			}
		}
	}
}

// ulps is the distance between two finite float32 of the same sign in
// units in the last place.
func ulps(a, b float32) int64 {
	d := int64(int32(math.Float32bits(a))) - int64(int32(math.Float32bits(b)))
	if d < 0 {
		d = -d
	}
	return d
}

var minNormal = math.Ldexp(1, -126)

// checkExp reports whether got is an acceptable exp(x): NaN for NaN, 0
// where the exact result is below the least normal float32, +Inf above
// MaxFloat32, and within maxUlps of the exact result elsewhere. It
// returns the error in ulps of a normal result.
func checkExp(x, got float32, maxUlps int64) (int64, error) {
	if x != x {
		if got == got {
			return 0, fmt.Errorf("exp(NaN) = %v", got)
		}
		return 0, nil
	}
	want := math.Exp(float64(x))
	switch {
	case want < minNormal:
		if math.Float32bits(got) != 0 {
			return 0, fmt.Errorf("exp(%v) = %v (bits %#x), want 0", x, got, math.Float32bits(got))
		}
		return 0, nil
	case want > math.MaxFloat32:
		if !math.IsInf(float64(got), 1) {
			return 0, fmt.Errorf("exp(%v) = %v, want +Inf", x, got)
		}
		return 0, nil
	}
	u := ulps(got, float32(want))
	if got != got || u > maxUlps {
		return u, fmt.Errorf("exp(%v) = %v, want %v (%d ulp)", x, got, float32(want), u)
	}
	return u, nil
}

// expSpecials are the inputs around the edges of exp's range.
func expSpecials() []float32 {
	x := []float32{
		float32(math.Inf(-1)), float32(math.Inf(1)), float32(math.NaN()),
		0, float32(math.Copysign(0, -1)),
		math.Float32frombits(1), math.Float32frombits(0x80000001), // ±least subnormal
		math.Float32frombits(0x007fffff), math.Float32frombits(0x807fffff), // ±largest subnormal
		math.Float32frombits(0x00800000), math.Float32frombits(0x80800000), // ±least normal
		math.MaxFloat32, -math.MaxFloat32,
		88.72, 88.72283, 88.72284, 88.73, 89, 100,
		-87.3, -87.33654, -87.33655, -88, -100, -103.97, -103.98, -104, -105, -1000,
		1, -1, 0.5, -0.5, 0.34657359, -0.34657359, 1e-7, -1e-7, 1e-30, -1e-30,
	}
	// Every float32 in a few bands: the underflow edge and the band where
	// the exact result is subnormal, the overflow edge.
	for _, band := range [][2]float32{{-87.34, -87.33}, {-104, -103.9}, {88.72, 88.7229}} {
		for v := band[0]; v <= band[1]; v = math.Nextafter32(v, float32(math.Inf(1))) {
			x = append(x, v)
		}
	}
	// The smallest magnitudes and those around 2^-24, where exp(x)
	// rounds to 1 or to its neighbours.
	for b := uint32(0); b < 1000; b++ {
		x = append(x, math.Float32frombits(b), math.Float32frombits(b|0x80000000))
		x = append(x, math.Float32frombits(0x33800000-500+b), -math.Float32frombits(0x33800000-500+b))
	}
	for v := float32(-104); v < -87; v += 0.01 {
		x = append(x, v)
	}
	return x
}

// expSweep steps through the float32 bit patterns by a prime, so every
// exponent and sign is visited with varied mantissas.
func expSweep() []float32 {
	const step = 4099
	x := make([]float32, 0, (1<<32)/step+1)
	for b := uint64(0); b < 1<<32; b += step {
		x = append(x, math.Float32frombits(uint32(b)))
	}
	return x
}

func TestExp(t *testing.T) {
	inputs := append(expSpecials(), expSweep()...)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		out := newGuarded(len(inputs))
		in := guardedCopy(inputs)
		impl.exp(out.v, in.v)
		out.check(t, "dst")
		in.check(t, "x")
		var worst int64
		errs := 0
		for i, x := range inputs {
			if math.Float32bits(in.v[i]) != math.Float32bits(x) {
				t.Fatalf("x[%d] changed", i)
			}
			u, err := checkExp(x, out.v[i], 4)
			if err != nil {
				if errs++; errs <= 10 {
					t.Error(err)
				}
			}
			worst = max(worst, u)
		}
		t.Logf("%d inputs, worst error %d ulp", len(inputs), worst)
		for _, c := range []struct{ x, want float32 }{
			{0, 1}, {float32(math.Copysign(0, -1)), 1},
			{float32(math.Inf(-1)), 0}, {-1000, 0},
			{float32(math.Inf(1)), float32(math.Inf(1))}, {88.73, float32(math.Inf(1))},
		} {
			d := []float32{-1}
			impl.exp(d, []float32{c.x})
			if math.Float32bits(d[0]) != math.Float32bits(c.want) {
				t.Errorf("exp(%v) = %v, want exactly %v", c.x, d[0], c.want)
			}
		}
	})
}

// TestExpFamiliesAgree checks that the AVX-512 exp kernels (Exp, ExpSum's
// elements, ExpMul) give the avx2 ones' values bit for bit (the same
// arithmetic on wider registers), and ExpSum's sums within a few ulp of
// theirs (other order of additions).
func TestExpFamiliesAgree(t *testing.T) {
	var base *implementation
	for i := range implementations {
		if implementations[i].name == "avx2" {
			base = &implementations[i]
		}
	}
	if base == nil {
		t.Skip("no avx2 kernels on this machine or build")
	}
	inputs := append(expSpecials(), expSweep()...)
	want := make([]float32, len(inputs))
	base.exp(want, inputs)
	r := rand.New(rand.NewPCG(5, 6))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		if impl.name == "generic" || impl.name == "avx2" {
			return
		}
		got := make([]float32, len(inputs))
		impl.exp(got, inputs)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("exp(%v) = %v, avx2 %v", inputs[i], got[i], want[i])
			}
		}
		// ExpMul's exponential (that of the online softmax) and product,
		// over the same inputs as p and a sweep of g.
		pa, pb := append([]float32(nil), inputs...), append([]float32(nil), inputs...)
		ga, gb := randSlice(r, len(inputs), -3, 3), make([]float32, len(inputs))
		copy(gb, ga)
		base.expMul(pa, ga)
		impl.expMul(pb, gb)
		for i := range pa {
			if math.Float32bits(pa[i]) != math.Float32bits(pb[i]) || math.Float32bits(ga[i]) != math.Float32bits(gb[i]) {
				t.Fatalf("ExpMul(%v): p %v, g %v; avx2 %v, %v", inputs[i], pb[i], gb[i], pa[i], ga[i])
			}
		}
		for _, n := range testLengths {
			x := randSlice(r, n, -30, 5)
			a, b := append([]float32(nil), x...), append([]float32(nil), x...)
			sa, sb := base.expSum(a, 0.5), impl.expSum(b, 0.5)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("n=%d: ExpSum element %d = %v, avx2 %v", n, i, b[i], a[i])
				}
			}
			if math.Abs(float64(sa-sb)) > 1e-6*math.Abs(float64(sa)) {
				t.Errorf("n=%d: ExpSum sum %v, avx2 %v", n, sb, sa)
			}
		}
	})
}

// TestExpTail checks that the masked tail gives the same results as
// full vectors: each element alone equals the same element in a long
// call, bit for bit, and the same holds for ExpSum.
func TestExpTail(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := append(randSlice(r, 200, -110, 90), expSpecials()[:40]...)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		all := make([]float32, len(x))
		impl.exp(all, x)
		sums := append([]float32(nil), x...)
		impl.expSum(sums, 1.5)
		for i := range x {
			one := []float32{0}
			impl.exp(one, x[i:i+1])
			if math.Float32bits(one[0]) != math.Float32bits(all[i]) {
				t.Errorf("exp(%v): %v alone, %v in a vector", x[i], one[0], all[i])
			}
			s := []float32{x[i]}
			impl.expSum(s, 1.5)
			if math.Float32bits(s[0]) != math.Float32bits(sums[i]) {
				t.Errorf("ExpSum(%v, 1.5): %v alone, %v in a vector", x[i], s[0], sums[i])
			}
		}
	})
}

func TestExpInPlace(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range testLengths {
			x := randSlice(r, n, -20, 20)
			want := make([]float32, n)
			impl.exp(want, x)
			g := guardedCopy(x)
			impl.exp(g.v, g.v)
			g.check(t, fmt.Sprintf("n=%d", n))
			for i := range want {
				if math.Float32bits(g.v[i]) != math.Float32bits(want[i]) {
					t.Fatalf("n=%d: in place exp differs at %d", n, i)
				}
			}
		}
	})
}

func TestExpSum(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range testLengths {
			for _, lo := range []float32{-5, -30, -120} {
				x := randSlice(r, n, lo, 0)
				shift := 2 * r.Float32()
				if n > 0 {
					shift += Max(x)
				}
				g := guardedCopy(x)
				got := impl.expSum(g.v, shift)
				g.check(t, fmt.Sprintf("n=%d", n))
				var want, abs float64
				for i, v := range x {
					d := v - shift // the kernel's float32 difference
					if _, err := checkExp(d, g.v[i], 4); err != nil {
						t.Fatalf("n=%d, x[%d]=%v, shift %v: %v", n, i, v, shift, err)
					}
					e := math.Exp(float64(d))
					if e < minNormal {
						e = 0
					}
					want += e
					abs += e
				}
				tol := (float64(n)*0x1p-24+6e-7)*abs + 1e-30
				if math.Abs(float64(got)-want) > tol {
					t.Errorf("n=%d lo=%v: sum %v, want %v (tol %g)", n, lo, got, want, tol)
				}
			}
		}
		// A shift below the values: results above 1, up to +Inf, never NaN.
		x := []float32{0, 10, 50, 80, 100, float32(math.Inf(1)), -200}
		s := impl.expSum(x, -10)
		for i, v := range x {
			if v != v {
				t.Errorf("ExpSum with a low shift gave NaN at %d", i)
			}
		}
		if !math.IsInf(float64(s), 1) {
			t.Errorf("sum %v, want +Inf", s)
		}
	})
}

func TestMax(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	nan := float32(math.NaN())
	forEachImpl(t, func(t *testing.T, impl implementation) {
		if m := impl.max(nil); !math.IsInf(float64(m), -1) {
			t.Errorf("max(nil) = %v, want -Inf", m)
		}
		for _, n := range testLengths {
			x := randSlice(r, n, -100, -1)
			for pos := 0; pos < n; pos += max(1, n/37) {
				y := append([]float32(nil), x...)
				y[pos] = 7
				g := guardedCopy(y)
				if m := impl.max(g.v); m != 7 {
					t.Errorf("n=%d, max at %d: got %v, want 7", n, pos, m)
				}
				g.check(t, "x")
				y[pos] = nan
				if m := impl.max(y); m == m {
					t.Errorf("n=%d, NaN at %d: got %v, want NaN", n, pos, m)
				}
			}
			if n > 0 {
				for i := range x {
					x[i] = float32(math.Inf(-1))
				}
				if m := impl.max(x); !math.IsInf(float64(m), -1) {
					t.Errorf("n=%d, all -Inf: got %v", n, m)
				}
			}
		}
	})
}

func TestScale(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range testLengths {
			x := randSlice(r, n, -10, 10)
			c := 3 * r.Float32()
			g := guardedCopy(x)
			impl.scale(g.v, c)
			g.check(t, fmt.Sprintf("n=%d", n))
			for i := range x {
				if g.v[i] != x[i]*c {
					t.Fatalf("n=%d: x[%d]·%v = %v, want %v", n, i, c, g.v[i], x[i]*c)
				}
			}
		}
	})
}

func TestDot(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range testLengths {
			x, y := randSlice(r, n, -1, 1), randSlice(r, n, -1, 1)
			gx, gy := guardedCopy(x), guardedCopy(y)
			got := impl.dot(gx.v, gy.v)
			gx.check(t, "x")
			gy.check(t, "y")
			var want, abs float64
			for i := range x {
				p := float64(x[i]) * float64(y[i])
				want += p
				abs += math.Abs(p)
			}
			if tol := float64(n+1) * 0x1p-24 * abs; math.Abs(float64(got)-want) > tol {
				t.Errorf("n=%d: dot %v, want %v", n, got, want)
			}
		}
	})
}

func TestAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range testLengths {
			x, y := randSlice(r, n, -1, 1), randSlice(r, n, -1, 1)
			a := 2*r.Float32() - 1
			gx, gy := guardedCopy(x), guardedCopy(y)
			impl.axpy(a, gx.v, gy.v)
			gx.check(t, "x")
			gy.check(t, "y")
			for i := range x {
				want := float64(y[i]) + float64(a)*float64(x[i])
				if math.Abs(float64(gy.v[i])-want) > 0x1p-23*(math.Abs(want)+math.Abs(float64(a*x[i]))) {
					t.Fatalf("n=%d: y[%d] = %v, want %v", n, i, gy.v[i], want)
				}
			}
		}
	})
}

func TestReadSum(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range append(testLengths, 4096+64+8+3) {
			x := randSlice(r, n, 0, 1)
			g := guardedCopy(x)
			got := impl.readSum(g.v)
			var want float64
			for _, v := range x {
				want += float64(v)
			}
			if math.Abs(float64(got)-want) > float64(n+1)*0x1p-24*want {
				t.Errorf("n=%d: sum %v, want %v", n, got, want)
			}
		}
	})
}

func TestFMAPeak(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, iters := range []int{0, 1, 1000} {
			if v := impl.fmaPeak(iters); v != v || math.IsInf(float64(v), 0) || v <= 0 {
				t.Errorf("fmaPeak(%d) = %v", iters, v)
			}
		}
	})
	if g := MeasurePeakGFlops(1, 20*time.Millisecond); !(g > 0) {
		t.Errorf("MeasurePeakGFlops = %v", g)
	}
	if g := MeasureReadGBps(1<<16, 2); !(g > 0) {
		t.Errorf("MeasureReadGBps = %v", g)
	}
}

// matSize is the length of a slice that holds rows rows of cols elements
// at stride ld: the last row ends after its cols elements.
func matSize(rows, cols, ld int) int {
	if rows == 0 || cols == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

// randMatrix is rows rows of cols random values in [-1, 1) at stride ld,
// with guard values in the padding of each row and around them.
func randMatrix(r *rand.Rand, rows, cols, ld int) guarded {
	g := newGuarded(matSize(rows, cols, ld))
	for i := range rows {
		for j := range cols {
			g.v[i*ld+j] = 2*r.Float32() - 1
		}
	}
	return g
}

// gemmAC holds the float32 operands of a Gemm problem, whatever the type
// of B: A random with NaN in the padding of each row and around it, C
// with guard values in its padding and around it and, without
// accumulate, in its elements too; c0 is C before the call.
type gemmAC struct {
	m, n, k, lda, ldb, ldc int
	a, c                   guarded
	c0                     []float32
	// roundA, when set, is the rounding the kernel applies to A first
	// (bfloat16 for the VDPBF16PS kernels), which checkC applies too.
	roundA func(float32) float32
}

// newGemmAC makes A and a C of guard values; the caller makes B, then
// calls fillC.
func newGemmAC(r *rand.Rand, m, n, k, lda, ldb, ldc int) gemmAC {
	return gemmAC{
		m: m, n: n, k: k, lda: lda, ldb: ldb, ldc: ldc,
		a: randMatrix(r, m, k, lda),
		c: newGuarded(matSize(m, n, ldc)),
	}
}

// fillC sets the elements of C, random with accumulate and guard values
// without, and keeps a copy in c0.
func (g *gemmAC) fillC(r *rand.Rand, accumulate bool) {
	for i := range g.m {
		for j := range g.n {
			v := guard
			if accumulate {
				v = 2*r.Float32() - 1
			}
			g.c.v[i*g.ldc+j] = v
		}
	}
	g.c0 = append([]float32(nil), g.c.v...)
}

// checkC compares C with the float64 product of A (rounded by roundA) and B, b(p, j) being
// element (p, j) of B (plus C's old value with accumulate), within
// (k+2)·2^-24 of the sum of the magnitudes of the terms, and checks that
// the padding of C is untouched.
func (g *gemmAC) checkC(t *testing.T, accumulate bool, b func(p, j int) float64) {
	t.Helper()
	if g.n == 0 {
		return
	}
	for i := range g.m {
		for j := range g.ldc {
			if i == g.m-1 && j >= g.n {
				break
			}
			got := g.c.v[i*g.ldc+j]
			if j >= g.n {
				if math.Float32bits(got) != math.Float32bits(guard) {
					t.Fatalf("C padding [%d][%d] written: %v", i, j, got)
				}
				continue
			}
			var want, abs float64
			if accumulate {
				want = float64(g.c0[i*g.ldc+j])
				abs = math.Abs(want)
			}
			for p := range g.k {
				x := g.a.v[i*g.lda+p]
				if g.roundA != nil {
					x = g.roundA(x)
				}
				v := float64(x) * b(p, j)
				want += v
				abs += math.Abs(v)
			}
			if tol := float64(g.k+2) * 0x1p-24 * abs; !(math.Abs(float64(got)-want) <= tol) {
				t.Fatalf("C[%d][%d] = %v, want %v (tol %g)", i, j, got, want, tol)
			}
		}
	}
}

// gemmCase is one Gemm problem with guarded operands: A and B have NaN
// in the padding of each row (lda > k, ldb > n) and around them, C has
// guard values in its padding and around it, and with accumulate false
// its elements start as NaN too, so reading any of them shows.
type gemmCase struct {
	gemmAC
	b guarded
}

func newGemmCase(r *rand.Rand, m, n, k, lda, ldb, ldc int, accumulate bool) *gemmCase {
	g := &gemmCase{gemmAC: newGemmAC(r, m, n, k, lda, ldb, ldc)}
	g.b = randMatrix(r, k, n, ldb)
	g.fillC(r, accumulate)
	return g
}

func (g *gemmCase) check(t *testing.T, accumulate bool) {
	t.Helper()
	g.a.check(t, "A")
	g.b.check(t, "B")
	g.c.check(t, "C")
	g.checkC(t, accumulate, func(p, j int) float64 { return float64(g.b.v[p*g.ldb+j]) })
}

func TestGemm(t *testing.T) {
	ms := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 64, 65}
	ns := []int{16, 32, 48, 64, 80, 128}
	ks := []int{0, 1, 2, 3, 7, 8, 9, 64, 65, 128}
	r := rand.New(rand.NewPCG(17, 18))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, m := range ms {
			for _, n := range ns {
				for _, k := range ks {
					for _, accumulate := range []bool{false, true} {
						// Tight strides, then odd padded ones.
						for _, pad := range [][3]int{{0, 0, 0}, {3, 5, 7}} {
							g := newGemmCase(r, m, n, k, k+pad[0], n+pad[1], n+pad[2], accumulate)
							name := fmt.Sprintf("m=%d n=%d k=%d lda=%d ldb=%d ldc=%d acc=%v", m, n, k, g.lda, g.ldb, g.ldc, accumulate)
							checkGemm(m, n, k, len(g.a.v), g.lda, len(g.b.v), g.ldb, len(g.c.v), g.ldc)
							impl.gemm(m, n, k, g.a.v, g.lda, g.b.v, g.ldb, g.c.v, g.ldc, accumulate)
							t.Run(name, func(t *testing.T) { g.check(t, accumulate) })
						}
					}
				}
			}
		}
	})
}

func TestArgumentChecks(t *testing.T) {
	s := make([]float32, 100)
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"Gemm n%16", func() { Gemm(1, 8, 1, s, 1, s, 8, s, 8, false) }},
		{"Gemm negative", func() { Gemm(-1, 16, 1, s, 1, s, 16, s, 16, false) }},
		{"Gemm short C", func() { Gemm(2, 16, 1, s, 1, s, 16, s[:30], 16, false) }},
		{"Gemm ldc", func() { Gemm(2, 16, 1, s, 1, s, 16, s, 8, false) }},
		{"Gemm short A", func() { Gemm(2, 16, 4, s[:7], 4, s, 16, s, 16, false) }},
		{"Gemm lda", func() { Gemm(2, 16, 4, s, 3, s, 16, s, 16, false) }},
		{"Gemm short B", func() { Gemm(2, 16, 4, s, 4, s[:63], 16, s, 16, false) }},
		{"Exp", func() { Exp(s[:3], s[:4]) }},
		{"Dot", func() { Dot(s[:3], s[:4]) }},
		{"Axpy", func() { Axpy(1, s[:4], s[:3]) }},
		{"WidenBF16", func() { WidenBF16(s[:3], make([]uint16, 4)) }},
		{"WidenF16", func() { WidenF16(s[:4], make([]uint16, 3)) }},
		{"DotRows negative", func() { DotRows(s, 4, s, 4, -1, s, 4, 4, 4) }},
		{"DotRows d<0", func() { DotRows(s, 4, s, 4, 1, s, 4, 4, -1) }},
		{"DotRows lds", func() { DotRows(s, 3, s, 4, 2, s, 4, 4, 4) }},
		{"DotRows short s", func() { DotRows(s[:7], 4, s, 4, 2, s, 4, 4, 4) }},
		{"DotRows ldq", func() { DotRows(s, 4, s, 3, 2, s, 4, 4, 4) }},
		{"DotRows short q", func() { DotRows(s, 4, s[:7], 4, 2, s, 4, 4, 4) }},
		{"DotRows ldk", func() { DotRows(s, 4, s, 4, 2, s, 3, 4, 4) }},
		{"DotRows short k", func() { DotRows(s, 4, s, 4, 2, s[:15], 4, 4, 4) }},
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
	// Empty problems need no memory at all.
	Gemm(0, 16, 5, nil, 0, nil, 0, nil, 0, false)
	Gemm(3, 0, 5, nil, 0, nil, 0, nil, 0, true)
	c := make([]float32, 2*16)
	for i := range c {
		c[i] = guard
	}
	Gemm(2, 16, 0, nil, 0, nil, 0, c, 16, false)
	for _, v := range c {
		if v != 0 {
			t.Fatalf("Gemm with k=0 left %v in C, want 0", v)
		}
	}
	DotRows(nil, 0, nil, 0, 0, nil, 0, 5, 5)
	DotRows(nil, 0, nil, 0, 5, nil, 0, 0, 5)
	DotRows(s[:8], 4, nil, 0, 2, nil, 0, 4, 0)
	DotRows(s[:8], 4, s[:7], 4, 2, s[:15], 4, 4, 3) // rows shorter than their strides at the end
}

// TestExported runs the exported functions once each, on the
// implementation in use.
func TestExported(t *testing.T) {
	a := []float32{1, 2, 3}
	if d := Dot(a, a); d != 14 {
		t.Errorf("Dot = %v", d)
	}
	y := []float32{1, 1, 1}
	Axpy(2, a, y)
	if y[2] != 7 {
		t.Errorf("Axpy: %v", y)
	}
	Scale(y, 0.5)
	if y[2] != 3.5 || Max(y) != 3.5 {
		t.Errorf("Scale/Max: %v", y)
	}
	e := []float32{0, 0}
	Exp(e, []float32{0, 1})
	if e[0] != 1 || math.Abs(float64(e[1])-math.E) > 1e-6 {
		t.Errorf("Exp: %v", e)
	}
	x := []float32{0, 0}
	if s := ExpSum(x, 0); s != 2 {
		t.Errorf("ExpSum: %v", s)
	}
	b := make([]float32, 16)
	b[3] = 2
	c := make([]float32, 16)
	Gemm(1, 16, 1, []float32{3}, 1, b, 16, c, 16, false)
	if c[3] != 6 || c[4] != 0 {
		t.Errorf("Gemm: %v", c)
	}
	if v := FMAPeak(10); v <= 0 {
		t.Errorf("FMAPeak: %v", v)
	}
	w := make([]float32, 2)
	WidenBF16(w, []uint16{0x3f80, 0xc040})
	if w[0] != 1 || w[1] != -3 {
		t.Errorf("WidenBF16: %v", w)
	}
	WidenF16(w, []uint16{0x3c00, 0x0001})
	if w[0] != 1 || w[1] != 0x1p-24 {
		t.Errorf("WidenF16: %v", w)
	}
	sc := make([]float32, 4)
	DotRows(sc, 2, []float32{1, 2, 3, 4}, 2, 2, []float32{1, 0, 0, 1}, 2, 2, 2)
	if sc[0] != 1 || sc[1] != 2 || sc[2] != 3 || sc[3] != 4 {
		t.Errorf("DotRows: %v", sc)
	}
}

// TestPrefetch runs every family's prefetch on empty, unaligned and
// long ranges, and on the last bytes of a slice: a prefetch has no
// result to check, but it must not fault or write.
func TestPrefetch(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl implementation) {
		x := make([]byte, 3*4096+5)
		for i := range x {
			x[i] = byte(i)
		}
		impl.prefetch(nil, 0)
		for _, r := range [][2]int{{0, 0}, {1, 1}, {63, 2}, {5, 4096}, {len(x) - 1, 1}, {0, len(x)}} {
			impl.prefetch(&x[r[0]], r[1])
		}
		for i := range x {
			if x[i] != byte(i) {
				t.Fatalf("byte %d changed", i)
			}
		}
	})
	Prefetch([]int32(nil))
	Prefetch(make([]float32, 3)[1:])
}

// TestELU1 checks ELU1 against its definition in each family: the
// family's own exponential where the sign bit is set, x+1 elsewhere, bit
// for bit, over the special values, a sweep of every exponent and sign,
// and random slices of every tail length, in place and not.
func TestELU1(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	cases := [][]float32{append(expSpecials(), expSweep()...), {float32(math.Copysign(math.NaN(), -1))}}
	for _, n := range testLengths {
		cases = append(cases, randSlice(r, n, -12, 4))
	}
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, x := range cases {
			want := make([]float32, len(x))
			impl.exp(want, x)
			for i, v := range x {
				if !math.Signbit(float64(v)) {
					want[i] = v + 1
				}
			}
			out := newGuarded(len(x))
			in := guardedCopy(x)
			impl.elu1Of(out.v, in.v)
			out.check(t, "dst")
			in.check(t, "x")
			same := append([]float32(nil), x...)
			impl.elu1Of(same, same)
			// Bit for bit, but any NaN for a NaN: a NaN's payload is the
			// CPU's to keep or not (RISC-V's arithmetic returns the
			// canonical NaN, where the exponential passes x through).
			same32 := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
			for i := range x {
				if !same32(out.v[i], want[i]) {
					t.Fatalf("len %d: ELU1(%v) = %v, want %v", len(x), x[i], out.v[i], want[i])
				}
				if !same32(same[i], want[i]) {
					t.Fatalf("len %d, in place: ELU1(%v) = %v, want %v", len(x), x[i], same[i], want[i])
				}
				if math.Float32bits(in.v[i]) != math.Float32bits(x[i]) {
					t.Fatalf("x[%d] changed", i)
				}
			}
		}
	})
}
