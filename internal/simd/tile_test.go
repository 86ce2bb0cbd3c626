package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// panelsCase is one GemmPanels problem with guarded operands: the
// unused elements between A's (strided) values, the gaps between panels
// (strides longer than their panels) and the values around every slice
// hold guard NaNs, and with accumulate false so does C.
type panelsCase struct {
	m, n, k, ar, ac, pb, pc int
	a, b, c                 guarded
	c0                      []float32
}

func newPanelsCase(r *rand.Rand, m, n, k, ar, ac, pb, pc int, accumulate bool) *panelsCase {
	g := &panelsCase{m: m, n: n, k: k, ar: ar, ac: ac, pb: pb, pc: pc}
	panels := n / Panel
	la, lb, lc := 0, 0, 0
	if m > 0 && n > 0 {
		lc = (panels-1)*pc + Panel*m
		if k > 0 {
			la = (m-1)*ar + (k-1)*ac + 1
			lb = (panels-1)*pb + Panel*k
		}
	}
	g.a, g.b, g.c = newGuarded(la), newGuarded(lb), newGuarded(lc)
	if la > 0 {
		for i := range m {
			for p := range k {
				g.a.v[i*ar+p*ac] = 2*r.Float32() - 1
			}
		}
		for p := range k {
			for j := range n {
				g.b.v[(j/Panel)*pb+p*Panel+j%Panel] = 2*r.Float32() - 1
			}
		}
	}
	if accumulate {
		for i := range m {
			for j := range n {
				g.c.v[(j/Panel)*pc+i*Panel+j%Panel] = 2*r.Float32() - 1
			}
		}
	}
	g.c0 = append([]float32(nil), g.c.v...)
	return g
}

func (g *panelsCase) check(t *testing.T, accumulate bool) {
	t.Helper()
	g.a.check(t, "A")
	g.b.check(t, "B")
	g.c.check(t, "C")
	inC := make([]bool, len(g.c.v))
	for i := range g.m {
		for j := range g.n {
			at := (j/Panel)*g.pc + i*Panel + j%Panel
			inC[at] = true
			got := g.c.v[at]
			var want, abs float64
			if accumulate {
				want = float64(g.c0[at])
				abs = math.Abs(want)
			}
			for p := range g.k {
				v := float64(g.a.v[i*g.ar+p*g.ac]) * float64(g.b.v[(j/Panel)*g.pb+p*Panel+j%Panel])
				want += v
				abs += math.Abs(v)
			}
			if tol := float64(g.k+2) * 0x1p-24 * abs; !(math.Abs(float64(got)-want) <= tol) {
				t.Fatalf("C[%d][%d] = %v, want %v (tol %g)", i, j, got, want, tol)
			}
		}
	}
	for at, in := range inC {
		if !in && math.Float32bits(g.c.v[at]) != math.Float32bits(g.c0[at]) {
			t.Fatalf("C gap at %d written: %v", at, g.c.v[at])
		}
	}
}

func TestGemmPanels(t *testing.T) {
	ms := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 17, 64, 65}
	ns := []int{0, 16, 32, 48, 96}
	ks := []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 64, 65}
	r := rand.New(rand.NewPCG(19, 20))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, m := range ms {
			for _, n := range ns {
				for _, k := range ks {
					for _, accumulate := range []bool{false, true} {
						// A row-major and column-major, tight and padded,
						// B and C with tight and padded panels.
						for _, lay := range [][4]int{
							{k, 1, Panel * k, Panel * m}, {1, m, Panel * k, Panel * m},
							{k + 3, 1, Panel*k + 16, Panel*m + 32}, {1, m + 5, Panel*k + 16, Panel*m + 32},
						} {
							ar, ac, pb, pc := lay[0], lay[1], lay[2], lay[3]
							g := newPanelsCase(r, m, n, k, ar, ac, pb, pc, accumulate)
							checkGemmPanels(m, n, k, len(g.a.v), ar, ac, len(g.b.v), pb, len(g.c.v), pc)
							impl.gemmPanels(m, n, k, g.a.v, ar, ac, g.b.v, pb, g.c.v, pc, accumulate)
							name := fmt.Sprintf("m=%d n=%d k=%d ar=%d ac=%d pb=%d pc=%d acc=%v", m, n, k, ar, ac, pb, pc, accumulate)
							t.Run(name, func(t *testing.T) { g.check(t, accumulate) })
						}
					}
				}
			}
		}
	})
}

// softmaxCase is one OnlineSoftmax problem, with guard values around
// every slice and in the gaps between panels.
type softmaxCase struct {
	ps, n, np, pacc, dacc int
	s, lim, m, l, acc     guarded
	s0, m0, l0, acc0      []float32
}

func newSoftmaxCase(r *rand.Rand, n, np, padS, padAcc, dacc int, masked bool, spread float32) *softmaxCase {
	g := &softmaxCase{ps: Panel*n + padS, n: n, np: np, pacc: Panel*dacc + padAcc, dacc: dacc}
	q := np * Panel
	ls, lacc := 0, 0
	if np > 0 {
		if n > 0 {
			ls = (np-1)*g.ps + Panel*n
		}
		if dacc > 0 {
			lacc = (np-1)*g.pacc + Panel*dacc
		}
	}
	g.s, g.acc = newGuarded(ls), newGuarded(lacc)
	g.m, g.l = newGuarded(q), newGuarded(q)
	if masked {
		g.lim = newGuarded(q)
	} else {
		g.lim = guarded{}
	}
	negInf := float32(math.Inf(-1))
	for p := range np {
		for j := range n {
			for x := range Panel {
				g.s.v[p*g.ps+j*Panel+x] = spread * (2*r.Float32() - 1)
			}
		}
		for i := range dacc {
			for x := range Panel {
				g.acc.v[p*g.pacc+i*Panel+x] = 2*r.Float32() - 1
			}
		}
	}
	for x := range q {
		switch r.IntN(4) {
		case 0: // nothing seen yet
			g.m.v[x], g.l.v[x] = negInf, 0
		case 1: // a maximum above every new logit: no rescale
			g.m.v[x], g.l.v[x] = spread+1, 1+10*r.Float32()
		default:
			g.m.v[x], g.l.v[x] = spread*(2*r.Float32()-1), 1+10*r.Float32()
		}
		if masked {
			g.lim.v[x] = float32(r.IntN(n+3) - 1)
		}
	}
	// Some whole panels keep their maximum, so the rescale is skipped.
	if np > 1 {
		for x := range Panel {
			g.m.v[x], g.l.v[x] = spread+1, 2
		}
	}
	g.s0 = append([]float32(nil), g.s.v...)
	g.m0 = append([]float32(nil), g.m.v...)
	g.l0 = append([]float32(nil), g.l.v...)
	g.acc0 = append([]float32(nil), g.acc.v...)
	return g
}

// expTol is the error OnlineSoftmax allows for exp(d), d <= 0.
func expTol(d float64) float64 { return 4e-7 + 1.2e-7*math.Abs(d) }

func (g *softmaxCase) run(impl implementation) {
	impl.onlineSoftmax(g.s.v, g.ps, g.n, g.np, g.lim.v, g.m.v, g.l.v, g.acc.v, g.pacc, g.dacc)
}

func (g *softmaxCase) check(t *testing.T) {
	t.Helper()
	for _, s := range []struct {
		name string
		g    guarded
	}{{"s", g.s}, {"lim", g.lim}, {"m", g.m}, {"l", g.l}, {"acc", g.acc}} {
		if s.g.all != nil {
			s.g.check(t, s.name)
		}
	}
	for p := range g.np {
		rescale := false
		cs := make([]float64, Panel)
		for x := range Panel {
			i := p*Panel + x
			m0 := float64(g.m0[i])
			mx := m0
			vis := func(j int) bool { return g.lim.v == nil || float32(j) < g.lim.v[i] }
			for j := range g.n {
				if vis(j) {
					mx = max(mx, float64(g.s0[p*g.ps+j*Panel+x]))
				}
			}
			if float64(g.m.v[i]) != mx {
				t.Fatalf("panel %d query %d: m = %v, want %v", p, x, g.m.v[i], mx)
			}
			ms := mx
			if math.IsInf(mx, -1) {
				ms = 0
			}
			c := math.Exp(m0 - ms)
			cs[x] = c
			sum, sumTol := 0.0, 0.0
			for j := range g.n {
				at := p*g.ps + j*Panel + x
				got := float64(g.s.v[at])
				if !vis(j) {
					if got != 0 {
						t.Fatalf("panel %d query %d key %d: hidden key gives %v", p, x, j, got)
					}
					continue
				}
				d := float64(g.s0[at]) - ms
				want := math.Exp(d)
				if !(math.Abs(got-want) <= expTol(d)*want+0x1p-126) {
					t.Fatalf("panel %d query %d key %d: exp(%v) = %v, want %v", p, x, j, d, got, want)
				}
				sum += want
				sumTol += expTol(d) * want
			}
			wantL := float64(g.l0[i])*c + sum
			tolL := sumTol
			if c != 0 {
				tolL += float64(g.l0[i]) * c * expTol(m0-ms)
			}
			tolL += float64(g.n+2)*0x1p-24*wantL + 1e-30
			if got := float64(g.l.v[i]); !(math.Abs(got-wantL) <= tolL) {
				t.Fatalf("panel %d query %d: l = %v, want %v (m0 %v, ms %v)", p, x, got, wantL, m0, ms)
			}
			if c != 1 {
				rescale = true
			}
		}
		for r := range g.dacc {
			for x := range Panel {
				at := p*g.pacc + r*Panel + x
				a0 := float64(g.acc0[at])
				want := a0
				if rescale {
					want *= cs[x]
				}
				tol := 1e-38
				if rescale && cs[x] != 0 {
					tol += expTol(math.Log(cs[x])) * math.Abs(want)
				}
				if got := float64(g.acc.v[at]); !(math.Abs(got-want) <= tol) {
					t.Fatalf("panel %d acc[%d][%d] = %v, want %v", p, r, x, got, want)
				}
			}
		}
		// Gaps between panels are left alone.
		if p+1 < g.np && g.n > 0 {
			for at := p*g.ps + Panel*g.n; at < (p+1)*g.ps; at++ {
				if math.Float32bits(g.s.v[at]) != math.Float32bits(g.s0[at]) {
					t.Fatalf("s gap at %d written", at)
				}
			}
		}
		if p+1 < g.np && g.dacc > 0 {
			for at := p*g.pacc + Panel*g.dacc; at < (p+1)*g.pacc; at++ {
				if math.Float32bits(g.acc.v[at]) != math.Float32bits(g.acc0[at]) {
					t.Fatalf("acc gap at %d written", at)
				}
			}
		}
	}
}

func TestOnlineSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, n := range []int{0, 1, 2, 3, 7, 64, 65} {
			for _, np := range []int{0, 1, 3} {
				for _, dacc := range []int{0, 1, 5, 64} {
					for _, masked := range []bool{false, true} {
						for _, spread := range []float32{3, 30, 200} {
							for _, pad := range [][2]int{{0, 0}, {16, 48}} {
								g := newSoftmaxCase(r, n, np, pad[0], pad[1], dacc, masked, spread)
								checkOnlineSoftmax(len(g.s.v), g.ps, n, np, len(g.lim.v), len(g.m.v), len(g.l.v), len(g.acc.v), g.pacc, dacc)
								g.run(impl)
								name := fmt.Sprintf("n=%d np=%d dacc=%d masked=%v spread=%v pad=%v", n, np, dacc, masked, spread, pad)
								t.Run(name, func(t *testing.T) { g.check(t) })
							}
						}
					}
				}
			}
		}
	})
}

// TestOnlineSoftmaxSpecial covers -Inf logits (a pattern's masks), a
// query that sees nothing, NaN, and exp(0) = 1 exactly.
func TestOnlineSoftmaxSpecial(t *testing.T) {
	negInf := float32(math.Inf(-1))
	nan := float32(math.NaN())
	forEachImpl(t, func(t *testing.T, impl implementation) {
		const n = 11
		s := make([]float32, n*Panel)
		m := make([]float32, Panel)
		l := make([]float32, Panel)
		acc := make([]float32, 3*Panel)
		for j := range n {
			for x := range Panel {
				v := float32(j - x)
				switch {
				case x == 1: // sees nothing: all -Inf
					v = negInf
				case x == 2 && j == 4:
					v = nan
				case x == 3 && j%2 == 0:
					v = negInf
				case x == 4: // every logit equal
					v = 7
				}
				s[j*Panel+x] = v
			}
		}
		for x := range Panel {
			m[x], l[x] = negInf, 0
		}
		for i := range acc {
			acc[i] = 0
		}
		impl.onlineSoftmax(s, n*Panel, n, 1, nil, m, l, acc, 3*Panel, 3)
		if m[1] != negInf || l[1] != 0 {
			t.Errorf("query that sees nothing: m %v l %v", m[1], l[1])
		}
		for j := range n {
			if v := s[j*Panel+1]; v != 0 {
				t.Errorf("query that sees nothing: p[%d] = %v", j, v)
			}
			if v := s[j*Panel+3]; j%2 == 0 && v != 0 {
				t.Errorf("-Inf logit gives %v", v)
			}
			if v := s[j*Panel+4]; v != 1 {
				t.Errorf("exp(0) = %v, want exactly 1", v)
			}
		}
		if l[2] == l[2] {
			t.Errorf("NaN logit: l = %v, want NaN", l[2])
		}
		if l[4] != n {
			t.Errorf("equal logits: l = %v, want %d", l[4], n)
		}
		for i, a := range acc {
			if i%Panel != 2 && a != 0 { // the NaN query's may be NaN
				t.Errorf("acc[%d] = %v, want 0", i, a)
			}
		}
		// A second step with a lower maximum: c = exp(m_old - m) stays
		// 1 exactly for the others and the accumulator is not touched.
		for x := range Panel {
			for j := range n {
				s[j*Panel+x] = -50
			}
		}
		for i := range acc {
			acc[i] = float32(i)
		}
		l4 := l[4]
		impl.onlineSoftmax(s, n*Panel, n, 1, nil, m, l, acc, 3*Panel, 3)
		if m[4] != 7 {
			t.Errorf("m = %v, want 7", m[4])
		}
		if want := float64(l4) + n*math.Exp(-57); math.Abs(float64(l[4])-want) > 1e-6*want {
			t.Errorf("l = %v, want %v", l[4], want)
		}
		// Query 1 saw its first keys (factor 0), query 2 is NaN; the
		// others' factor is exactly 1 and their accumulators keep their
		// bits.
		for i, a := range acc {
			switch x := i % Panel; {
			case x == 1:
				if a != 0 {
					t.Errorf("acc[%d] = %v, want 0 (factor 0)", i, a)
				}
			case x != 2 && a != float32(i):
				t.Errorf("acc[%d] = %v, want %v untouched", i, a, float32(i))
			}
		}
	})
}

func TestExp2Tile(t *testing.T) {
	// The Go twin over a sweep of [-130, 0]: within 2 ulp of 2^t where
	// normal, 0 below -127.
	worst := 0.0
	for i := 0; i <= 1<<20; i++ {
		x := -130 * float32(i) / (1 << 20)
		got := exp2Tile(x)
		want := math.Exp2(float64(x))
		switch {
		case x < -127:
			if got != 0 {
				t.Fatalf("exp2(%v) = %v, want 0", x, got)
			}
		case want >= 0x1p-126:
			e := math.Abs(float64(got)-want) / want
			worst = max(worst, e)
			if e > 2.5e-7 {
				t.Fatalf("exp2(%v) = %v, want %v (rel %g)", x, got, want, e)
			}
		}
	}
	if exp2Tile(0) != 1 || exp2Tile(float32(math.Inf(-1))) != 0 || !math.IsNaN(float64(exp2Tile(float32(math.NaN())))) {
		t.Errorf("exp2 specials: %v %v %v", exp2Tile(0), exp2Tile(float32(math.Inf(-1))), exp2Tile(float32(math.NaN())))
	}
	t.Logf("worst relative error %.3g", worst)
}

// TestExp2Constants checks that the decimal constants of exp2Tile are the
// float32 coefficients the assembly uses (_asm/flash.go).
func TestExp2Constants(t *testing.T) {
	for i, c := range []struct {
		got  float32
		want uint32
	}{{exp2C1, 0x3f317215}, {exp2C2, 0x3e75fcde}, {exp2C3, 0x3d635ba9}, {exp2C4, 0x3c1e7544}, {exp2C5, 0x3aaddd0c}} {
		if b := math.Float32bits(c.got); b != c.want {
			t.Errorf("exp2C%d = %#x, want %#x", i+1, b, c.want)
		}
	}
}

func TestTileArgumentChecks(t *testing.T) {
	s := make([]float32, 1000)
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"GemmPanels n%16", func() { GemmPanels(1, 8, 1, s, 1, 1, s, 16, s, 16, false) }},
		{"GemmPanels negative", func() { GemmPanels(-1, 16, 1, s, 1, 1, s, 16, s, 16, false) }},
		{"GemmPanels negative stride", func() { GemmPanels(1, 16, 1, s, -1, 1, s, 16, s, 16, false) }},
		{"GemmPanels short C", func() { GemmPanels(2, 16, 1, s, 1, 1, s, 16, s[:31], 32, false) }},
		{"GemmPanels pc", func() { GemmPanels(2, 32, 1, s, 1, 1, s, 16, s, 16, false) }},
		{"GemmPanels short A", func() { GemmPanels(7, 16, 2, s[:13], 2, 1, s, 32, s, 112, false) }},
		{"GemmPanels short A columns", func() { GemmPanels(7, 16, 2, s[:13], 1, 7, s, 32, s, 112, false) }},
		{"GemmPanels strides", func() { GemmPanels(2, 16, 2, s, 2, 2, s, 32, s, 32, false) }},
		{"AttendPanels vr", func() { AttendPanels(1, 4, 2, s, 2, 1, s, 32, s, s, 2, 1, s, s, s, 32, nil, nil) }},
		{"GemmPanels short B", func() { GemmPanels(2, 16, 4, s, 4, 1, s[:63], 64, s, 32, false) }},
		{"GemmPanels pb", func() { GemmPanels(2, 32, 4, s, 4, 1, s, 63, s, 32, false) }},
		{"AttendPanels st", func() { AttendPanels(1, 4, 2, s, 2, 1, s, 32, s[:63], s, 1, 2, s, s, s, 32, nil, nil) }},
		{"AttendPanels short k", func() { AttendPanels(1, 4, 2, s[:7], 2, 1, s, 32, s, s, 1, 2, s, s, s, 32, nil, nil) }},
		{"PanelFromRows rows", func() { PanelFromRows(s, s, make([]int, 17), 1, 1) }},
		{"PanelFromRows range", func() { PanelFromRows(s, s[:10], []int{8}, 3, 1) }},
		{"PanelFromRows short panel", func() { PanelFromRows(s[:47], s, []int{0}, 3, 1) }},
		{"RowsFromPanel f", func() { RowsFromPanel(s, []int{0, 3}, s, s[:1], 3) }},
		{"OnlineSoftmax negative", func() { OnlineSoftmax(s, 16, -1, 1, nil, s, s, s, 16, 1) }},
		{"OnlineSoftmax short m", func() { OnlineSoftmax(s, 16, 1, 2, nil, s[:31], s, s, 16, 1) }},
		{"OnlineSoftmax short lim", func() { OnlineSoftmax(s, 16, 1, 1, s[:15], s, s, s, 16, 1) }},
		{"OnlineSoftmax ps", func() { OnlineSoftmax(s, 31, 2, 2, nil, s, s, s, 16, 1) }},
		{"OnlineSoftmax short s", func() { OnlineSoftmax(s[:47], 32, 2, 2, nil, s, s, s, 16, 1) }},
		{"OnlineSoftmax pacc", func() { OnlineSoftmax(s, 16, 1, 2, nil, s, s, s, 31, 2) }},
		{"OnlineSoftmax short acc", func() { OnlineSoftmax(s, 16, 1, 2, nil, s, s, s[:63], 32, 2) }},
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
	// Empty problems need no memory.
	GemmPanels(0, 16, 5, nil, 0, 0, nil, 0, nil, 0, false)
	GemmPanels(3, 0, 5, nil, 0, 0, nil, 0, nil, 0, true)
	AttendPanels(0, 5, 5, nil, 0, 0, nil, 0, nil, nil, 0, 0, nil, nil, nil, 0, nil, nil)
	OnlineSoftmax(nil, 0, 5, 0, nil, nil, nil, nil, 0, 3)
	c := make([]float32, 2*16)
	for i := range c {
		c[i] = guard
	}
	GemmPanels(2, 16, 0, nil, 0, 0, nil, 0, c, 32, false)
	for _, v := range c {
		if v != 0 {
			t.Fatalf("GemmPanels with k=0 left %v in C, want 0", v)
		}
	}
}

// TestAttendPanels compares AttendPanels of every implementation with the
// three calls it stands for, made with the generic kernels, on guarded
// operands with padded strides, K and V both as rows and transposed.
func TestAttendPanels(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	negInf := float32(math.Inf(-1))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, np := range []int{0, 1, 2, 3, 4} {
			for _, n := range []int{0, 1, 5, 6, 7, 8, 9, 13, 16, 17, 64, 65} {
				for _, d := range []int{1, 5, 6, 17, 64} {
					for _, pad := range []int{0, 7} {
						for _, rows := range []bool{true, false} {
							// two: st holds two panels, which lets a kernel
							// take the panels two at a time.
							two := (n+d+pad)%2 == 1
							var kr, kc, vr, vc int
							if rows { // K and V as rows of D values (dense layout)
								kr, kc, vr, vc = d+pad, 1, 1, d+pad
							} else { // K transposed (PackK), V as rows (PackV)
								kr, kc, vr, vc = 1, n+pad, 1, d+pad
							}
							pq, pacc := Panel*d+16*pad, Panel*d+16*pad
							size := func(r, c, rs, cs int) int {
								if r == 0 || c == 0 {
									return 0
								}
								return (r-1)*rs + (c-1)*cs + 1
							}
							k := guardedCopy(randSlice(r, size(n, d, kr, kc), -1, 1))
							v := guardedCopy(randSlice(r, size(d, n, vr, vc), -1, 1))
							qt := guardedCopy(randSlice(r, np*pq, -2, 2))
							acc := guardedCopy(randSlice(r, np*pacc, -1, 1))
							lst := Panel * n
							if two {
								lst *= 2
							}
							st := guardedCopy(randSlice(r, lst, -1, 1))
							m0 := make([]float32, np*Panel)
							l0 := make([]float32, np*Panel)
							for x := range m0 {
								switch r.IntN(3) {
								case 0:
									m0[x], l0[x] = negInf, 0
								default:
									m0[x], l0[x] = 3*r.Float32()-1, 1+r.Float32()
								}
							}
							m, l := guardedCopy(m0), guardedCopy(l0)
							wm := append([]float32(nil), m0...)
							wl := append([]float32(nil), l0...)
							wacc := append([]float32(nil), acc.v...)
							wacc0 := append([]float32(nil), acc.v...)
							wst := append([]float32(nil), st.v...)
							for q := range np {
								gemmPanelsGeneric(n, Panel, d, k.v, kr, kc, qt.v[q*pq:], pq, wst, Panel*n, false)
								onlineSoftmaxGeneric(wst, Panel*n, n, 1, nil, wm[q*Panel:], wl[q*Panel:], wacc[q*pacc:], pacc, d)
								gemmPanelsGeneric(d, Panel, n, v.v, vr, vc, wst, Panel*n, wacc[q*pacc:], pacc, true)
							}
							checkAttendPanels(np, n, d, len(k.v), kr, kc, len(qt.v), pq, len(st.v), len(v.v), vr, vc, len(m.v), len(l.v), len(acc.v), pacc)
							impl.attendPanels(np, n, d, k.v, kr, kc, qt.v, pq, st.v, v.v, vr, vc, m.v, l.v, acc.v, pacc, k.all, v.all)
							name := fmt.Sprintf("np=%d n=%d d=%d pad=%d rows=%v two=%v", np, n, d, pad, rows, two)
							for _, g := range []struct {
								name string
								g    guarded
							}{{"k", k}, {"qt", qt}, {"v", v}, {"acc", acc}, {"st", st}, {"m", m}, {"l", l}} {
								g.g.check(t, name+" "+g.name)
							}
							near := func(what string, got, want []float32, rel float64) {
								for i := range want {
									if got[i] == want[i] {
										continue
									}
									if !(math.Abs(float64(got[i]-want[i])) <= rel*(1+math.Abs(float64(want[i])))) {
										t.Fatalf("%s: %s[%d] = %v, want %v", name, what, i, got[i], want[i])
									}
								}
							}
							for x := range wm {
								if math.IsInf(float64(wm[x]), -1) != math.IsInf(float64(m.v[x]), -1) {
									t.Fatalf("%s: m[%d] = %v, want %v", name, x, m.v[x], wm[x])
								}
							}
							near("m", m.v, wm, 1e-5)
							near("l", l.v, wl, 1e-5)
							near("acc", acc.v, wacc, 1e-5)
							if np > 0 && !two {
								near("st", st.v, wst[:Panel*n], 1e-5)
							}
							// Two panels at a time give the bits of one at a time.
							if two && np > 1 {
								m1, l1 := append([]float32(nil), m0...), append([]float32(nil), l0...)
								acc1 := append([]float32(nil), wacc0...)
								impl.attendPanels(np, n, d, k.v, kr, kc, qt.v, pq, make([]float32, Panel*n), v.v, vr, vc, m1, l1, acc1, pacc, nil, nil)
								for _, x := range []struct {
									name      string
									got, want []float32
								}{{"m", m.v, m1}, {"l", l.v, l1}, {"acc", acc.v, acc1}} {
									for i := range x.want {
										if math.Float32bits(x.got[i]) != math.Float32bits(x.want[i]) {
											t.Fatalf("%s: %s[%d] = %v by two panels, %v by one", name, x.name, i, x.got[i], x.want[i])
										}
									}
								}
							}
						}
					}
				}
			}
		}
	})
}

func TestPanelRows(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, d := range []int{0, 1, 3, 7, 8, 9, 15, 16, 17, 64, 65, 128} {
			for _, rows := range []int{0, 1, 5, 7, 8, 9, 15, 16} {
				// Rows of d values with gaps between them, in shuffled order.
				stride := d + 3
				src := guardedCopy(randSlice(r, 20*stride, -1, 1))
				off := make([]int, rows)
				perm := r.Perm(20)
				for x := range off {
					off[x] = perm[x] * stride
				}
				panel := newGuarded(d * Panel)
				impl.panelFromRows(panel.v, src.v, off, d, 0.5)
				panel.check(t, fmt.Sprintf("in d=%d rows=%d panel", d, rows))
				src.check(t, "in src")
				for c := range d {
					for x := range Panel {
						want := float32(0)
						if x < rows {
							want = src.v[off[x]+c] * 0.5
						}
						if got := panel.v[c*Panel+x]; got != want {
							t.Fatalf("in d=%d rows=%d: [%d][%d] = %v, want %v", d, rows, c, x, got, want)
						}
					}
				}
				// And back, with factors, into rows surrounded by guards.
				f := randSlice(r, Panel, 0.5, 2)
				dst := newGuarded(20 * stride)
				impl.rowsFromPanel(dst.v, off, panel.v, f, d)
				dst.check(t, "out dst")
				inRow := make([]bool, len(dst.v))
				for x, o := range off {
					for c := range d {
						inRow[o+c] = true
						if got, want := dst.v[o+c], panel.v[c*Panel+x]*f[x]; got != want {
							t.Fatalf("out d=%d rows=%d: row %d [%d] = %v, want %v", d, rows, x, c, got, want)
						}
					}
				}
				for i, in := range inRow {
					if !in && math.Float32bits(dst.v[i]) != math.Float32bits(guard) {
						t.Fatalf("out d=%d rows=%d: wrote %d outside the rows", d, rows, i)
					}
				}
			}
		}
	})
}
