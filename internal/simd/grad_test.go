package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// expMulInputs returns n values of p (mostly the logits less lse of the
// backward pass, with exp's special inputs mixed in) and of g.
func expMulInputs(r *rand.Rand, n int) (p, g []float32) {
	p = randSlice(r, n, -30, 2)
	g = randSlice(r, n, -4, 4)
	sp := expSpecials()
	for i := range p {
		switch r.IntN(8) {
		case 0:
			p[i] = sp[r.IntN(len(sp))]
		case 1:
			p[i] = -110 + 200*r.Float32() // underflow to overflow
		case 2:
			g[i] = []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.NaN()), 1e-38, 3e38}[r.IntN(6)]
		}
	}
	return p, g
}

// checkExpMul reports whether e is an acceptable ExpMul exponential of
// x (see ExpMul): t = x·log2 e in float32, 2^t within 2.5e-7 relative
// where it is a normal float32, 0 for t ≤ -127, 0 or a subnormal for t
// up to -126, +Inf from 127.5 up, NaN for NaN.
func checkExpMul(x, e float32) error {
	t := x * float32(math.Log2E)
	want := math.Exp2(float64(t))
	switch {
	case x != x:
		if e == e {
			return fmt.Errorf("exp(NaN) = %v", e)
		}
	case t <= -127:
		if math.Float32bits(e) != 0 {
			return fmt.Errorf("exp(%v) = %v, want 0", x, e)
		}
	case want < 0x1p-126:
		if !(e >= 0 && e < 0x1p-126) {
			return fmt.Errorf("exp(%v) = %v, want 0 or subnormal", x, e)
		}
	case t >= 127.5:
		if !math.IsInf(float64(e), 1) {
			return fmt.Errorf("exp(%v) = %v, want +Inf", x, e)
		}
	default:
		if rel := math.Abs(float64(e)-want) / want; !(rel <= 2.5e-7) {
			return fmt.Errorf("exp(%v) = %v, want 2^%v = %v (rel %.3g)", x, e, t, want, rel)
		}
	}
	return nil
}

// TestExpMul checks every implementation: p within the documented error
// of the exponential, and g exactly the float32 product of its old value
// and the new p, at every length (through the unrolled loop, the single
// vectors and the masked tail), with no write outside the slices.
func TestExpMul(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range append(testLengths, 4096) {
			p0, g0 := expMulInputs(r, n)
			p, g := guardedCopy(p0), guardedCopy(g0)
			impl.expMul(p.v, g.v)
			p.check(t, fmt.Sprintf("n=%d p", n))
			g.check(t, fmt.Sprintf("n=%d g", n))
			for i := range n {
				if err := checkExpMul(p0[i], p.v[i]); err != nil {
					t.Fatalf("n=%d, p[%d]: %v", n, i, err)
				}
				want := g0[i] * p.v[i]
				if got := g.v[i]; math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
					t.Fatalf("n=%d: g[%d] = %v·%v = %v, want %v", n, i, g0[i], p.v[i], got, want)
				}
			}
		}
		// The whole float32 range, by a sweep of the bit patterns.
		x := append(expSpecials(), expSweep()...)
		p, g := append([]float32(nil), x...), make([]float32, len(x))
		impl.expMul(p, g)
		errs := 0
		for i := range x {
			if err := checkExpMul(x[i], p[i]); err != nil {
				if errs++; errs <= 10 {
					t.Error(err)
				}
			}
		}
		for _, c := range []struct{ x, want float32 }{
			{0, 1}, {float32(math.Copysign(0, -1)), 1},
			{float32(math.Inf(-1)), 0}, {-1000, 0},
			{float32(math.Inf(1)), float32(math.Inf(1))}, {89, float32(math.Inf(1))},
		} {
			p, g := []float32{c.x}, []float32{1}
			impl.expMul(p, g)
			if math.Float32bits(p[0]) != math.Float32bits(c.want) || math.Float32bits(g[0]) != math.Float32bits(c.want) {
				t.Errorf("ExpMul(%v, 1) = %v, %v; want exactly %v", c.x, p[0], g[0], c.want)
			}
		}
	})
}

// TestExpMulTail: each value gives the same bits alone as in a long
// slice, whichever of the loops takes it.
func TestExpMulTail(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	x, y := expMulInputs(r, 300)
	forEachImpl(t, func(t *testing.T, impl implementation) {
		p, g := append([]float32(nil), x...), append([]float32(nil), y...)
		impl.expMul(p, g)
		for i := range x {
			pi, gi := []float32{x[i]}, []float32{y[i]}
			impl.expMul(pi, gi)
			if math.Float32bits(pi[0]) != math.Float32bits(p[i]) || math.Float32bits(gi[0]) != math.Float32bits(g[i]) {
				t.Errorf("ExpMul(%v, %v): %v, %v alone, %v, %v in a slice", x[i], y[i], pi[0], gi[0], p[i], g[i])
			}
		}
	})
}

// TestExpMulGenericAgrees compares the kernels in use with the Go ones,
// which take the same steps (the assembly with fused multiply-adds):
// the same special values, and finite results within 2 ulp.
func TestExpMulGenericAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	p0, g0 := expMulInputs(r, 10000)
	p0 = append(p0, expSweep()...)
	g0 = append(g0, randSlice(r, len(p0)-len(g0), -4, 4)...)
	for _, impl := range implementations[1:] {
		pa, ga := append([]float32(nil), p0...), append([]float32(nil), g0...)
		pg, gg := append([]float32(nil), p0...), append([]float32(nil), g0...)
		impl.expMul(pa, ga)
		genericImpl.expMul(pg, gg)
		worst := int64(0)
		for i := range p0 {
			if !close32(pa[i], pg[i], 2) || !close32(ga[i], gg[i], 3) {
				t.Fatalf("%s: ExpMul(%v, %v) = %v, %v; generic %v, %v", impl.name, p0[i], g0[i], pa[i], ga[i], pg[i], gg[i])
			}
			if pa[i] == pa[i] && !math.IsInf(float64(pa[i]), 0) {
				worst = max(worst, ulps(pa[i], pg[i]))
			}
		}
		t.Logf("%s: worst difference from generic %d ulp", impl.name, worst)
	}
}

// close32 reports whether a and b are both NaN, equal, or finite with
// the same sign and within maxUlps.
func close32(a, b float32, maxUlps int64) bool {
	switch {
	case a != a || b != b:
		return a != a && b != b
	case a == b:
		return true
	case math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) || (a < 0) != (b < 0):
		return false
	}
	return ulps(a, b) <= maxUlps
}

func TestExpMulExported(t *testing.T) {
	p := []float32{0, 1, float32(math.Inf(-1))}
	g := []float32{2, 3, 5}
	ExpMul(p, g)
	if p[0] != 1 || g[0] != 2 || math.Abs(float64(g[1])-3*math.E) > 1e-5 || p[2] != 0 || g[2] != 0 {
		t.Errorf("ExpMul: p %v, g %v", p, g)
	}
	defer func() {
		if recover() == nil {
			t.Error("ExpMul with len(p) != len(g): no panic")
		}
	}()
	ExpMul(p, g[:2])
}

func BenchmarkExpMul(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, n := range benchLengths {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				r := rand.New(rand.NewPCG(25, 26))
				x, y := randSlice(r, n, -20, 0), randSlice(r, n, -1, 1)
				p, g := make([]float32, n), make([]float32, n)
				call := func() {
					copy(p, x) // keep the inputs in range; a copy costs little
					copy(g, y)
					impl.expMul(p, g)
				}
				for b.Loop() {
					call()
				}
				b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/float64(n), "ns/elem")
				b.ReportMetric(bestSeconds(call)*1e9/float64(n), "best-ns/elem")
			})
		}
	})
}
