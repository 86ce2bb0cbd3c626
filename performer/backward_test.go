package performer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/gradbench"
	"github.com/attnkit/attn/ref"
)

// feat64 is the feature map in float64 from its definition, with the map's
// own W and no stabiliser: with x' = c·x,
//
//	Positive: φ_f(x) = exp(w_f·x' − |x'|²/2) / sqrt(m)
//	Trig:     φ(x)   = exp(|x'|²/2) / sqrt(m/2) · [sin(w_f·x'), cos(w_f·x')]
//
// and jacT(x, g) = J_φ(x)ᵀ·g, the transposed Jacobian written out by hand:
// ∂φ_f/∂x = φ_f·(c·w_f − c²·x) for positive features, and for the
// trigonometric ones e·(sin·c²·x + cos·c·w_f) and e·(cos·c²·x − sin·c·w_f),
// e = exp(|x'|²/2)/sqrt(m/2).
type feat64 struct {
	kind  Kind
	nw, m int
	d     int
	w     []float64 // [nw][d]
}

func newFeat64(fm *FeatureMap, d int) *feat64 {
	w32 := fm.Projection(d)
	w := make([]float64, len(w32))
	for i, x := range w32 {
		w[i] = float64(x)
	}
	return &feat64{kind: fm.kind, nw: fm.nw, m: fm.m, d: d, w: w}
}

// dots returns w_f·x' for every f, |x'|²/2 and the norm constant.
func (f *feat64) dots(x []float64, c float64) (dots []float64, half, norm float64) {
	dots = make([]float64, f.nw)
	for i, xi := range x {
		half += c * c * xi * xi / 2
		for r := range f.nw {
			dots[r] += f.w[r*f.d+i] * c * xi
		}
	}
	return dots, half, 1 / math.Sqrt(float64(f.nw))
}

func (f *feat64) phi(x []float64, c float64) []float64 {
	dots, half, norm := f.dots(x, c)
	y := make([]float64, f.m)
	for r, z := range dots {
		switch f.kind {
		case Positive:
			y[r] = norm * math.Exp(z-half)
		case Trig:
			e := norm * math.Exp(half)
			y[r], y[f.nw+r] = e*math.Sin(z), e*math.Cos(z)
		}
	}
	return y
}

func (f *feat64) jacT(x []float64, c float64, g []float64) []float64 {
	dots, half, norm := f.dots(x, c)
	dx := make([]float64, f.d)
	for r, z := range dots {
		// a·c²·x + b·c·w_r is row r's part (both features for Trig).
		var a, b float64
		switch f.kind {
		case Positive:
			p := norm * math.Exp(z-half)
			a, b = -g[r]*p, g[r]*p
		case Trig:
			e := norm * math.Exp(half)
			s, co := math.Sin(z), math.Cos(z)
			a = g[r]*e*s + g[f.nw+r]*e*co
			b = g[r]*e*co - g[f.nw+r]*e*s
		}
		for i := range dx {
			dx[i] += a*c*c*x[i] + b*c*f.w[r*f.d+i]
		}
	}
	return dx
}

// featScales returns the factors of the queries and the keys inside φ
// under scale: √|scale| each, the sign of scale going with the queries.
func featScales(scale float64) (cq, ck float64) {
	c := math.Sqrt(math.Abs(scale))
	if scale < 0 {
		return -c, c
	}
	return c, c
}

// features returns φ of every query row and key row of f.d values under
// scale (see featScales).
func (f *feat64) features(q, k []float64, scale float64) (pq, pk [][]float64) {
	cq, c := featScales(scale)
	rows := func(x []float64, c float64) [][]float64 {
		y := make([][]float64, len(x)/f.d)
		for r := range y {
			y[r] = f.phi(x[r*f.d:][:f.d], c)
		}
		return y
	}
	return rows(q, cq), rows(k, c)
}

// rowSizes returns, for every query row i, den_i = Σ_j A_ij over the keys
// the mask allows, abs_i = Σ_j S_ij and, when v is not nil, vsize_i =
// Σ_j S_ij ‖v_j‖, where S_ij = Σ_x |φ(q_i)_x φ(k_j)_x| is the size of
// weight A_ij before its terms cancel.
func rowSizes(s attn.Shape, q, k, v []float64, mask []bool, f *feat64, scale float64) (den, abs, vsize []float64) {
	d := s.D
	pq, pk := f.features(q, k, scale)
	den, abs, vsize = make([]float64, len(pq)), make([]float64, len(pq)), make([]float64, len(pq))
	for b := range s.B {
		for h := range s.H {
			kv := (b*s.HKV + h/s.Group()) * s.M
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				for j := range s.M {
					if !mask[(b*s.N+i)*s.M+j] {
						continue
					}
					var a, sij float64
					for x := range f.m {
						a += pq[row][x] * pk[kv+j][x]
						sij += math.Abs(pq[row][x] * pk[kv+j][x])
					}
					den[row] += a
					abs[row] += sij
					if v != nil {
						var nv float64
						for _, vx := range v[(kv+j)*d:][:d] {
							nv += vx * vx
						}
						vsize[row] += sij * math.Sqrt(nv)
					}
				}
			}
		}
	}
	return den, abs, vsize
}

// favor64 evaluates the estimator in float64 from its definition: weights
// A_ij = φ(q_i)·φ(k_j) on the keys the mask allows, out_i = Σ_j A_ij v_j /
// Σ_j A_ij (0 for a row whose sum is not positive), lse_i = log Σ_j A_ij,
// and, when dout is not nil, the gradient of L = Σ dout ∘ out by the chain
// rule written out term by term:
//
//	∂L/∂A_ij = (dO_i·v_j − dO_i·out_i) / den_i,   dv_j = Σ_i A_ij dO_i / den_i,
//	dq_i = J_φ(q_i)ᵀ Σ_j ∂L/∂A_ij φ(k_j),        dk_j = J_φ(k_j)ᵀ Σ_i ∂L/∂A_ij φ(q_i).
func favor64(s attn.Shape, q, k, v, dout []float64, mask []bool, f *feat64, scale float64) (out, lse, dq, dk, dv []float64) {
	d := s.D
	cq, c := featScales(scale)
	pq, pk := f.features(q, k, scale)
	out, lse = make([]float64, s.QLen()), make([]float64, s.LSELen())
	dq, dk, dv = make([]float64, s.QLen()), make([]float64, s.KVLen()), make([]float64, s.KVLen())
	gq := make([][]float64, len(pq)) // ∂L/∂φ(q)
	gk := make([][]float64, len(pk)) // ∂L/∂φ(k)
	for r := range gq {
		gq[r] = make([]float64, f.m)
	}
	for r := range gk {
		gk[r] = make([]float64, f.m)
	}
	a := make([]float64, s.M)
	for b := range s.B {
		for h := range s.H {
			kv := (b*s.HKV + h/s.Group()) * s.M
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				den := 0.0
				for j := range s.M {
					a[j] = 0
					if mask[(b*s.N+i)*s.M+j] {
						for x := range f.m {
							a[j] += pq[row][x] * pk[kv+j][x]
						}
						den += a[j]
					}
				}
				lse[row] = math.Inf(-1)
				if !(den > 0) {
					continue
				}
				lse[row] = math.Log(den)
				oi := out[row*d:][:d]
				for j := range s.M {
					for x := range d {
						oi[x] += a[j] * v[(kv+j)*d+x] / den
					}
				}
				if dout == nil {
					continue
				}
				gi := dout[row*d:][:d]
				gdo := 0.0
				for x := range d {
					gdo += gi[x] * oi[x]
				}
				for j := range s.M {
					if !mask[(b*s.N+i)*s.M+j] {
						continue
					}
					gv := 0.0
					for x := range d {
						gv += gi[x] * v[(kv+j)*d+x]
						dv[(kv+j)*d+x] += a[j] * gi[x] / den
					}
					dA := (gv - gdo) / den
					for x := range f.m {
						gq[row][x] += dA * pk[kv+j][x]
						gk[kv+j][x] += dA * pq[row][x]
					}
				}
			}
		}
	}
	if dout != nil {
		for r := range gq {
			copy(dq[r*d:], f.jacT(q[r*d:][:d], cq, gq[r]))
		}
		for r := range gk {
			copy(dk[r*d:], f.jacT(k[r*d:][:d], c, gk[r]))
		}
	}
	return out, lse, dq, dk, dv
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func nanFilled(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.NaN())
	}
	return x
}

// backward runs Forward and Backward on q, k, v and dout g, with NaN-filled
// gradients that Backward must overwrite.
func backward(t testing.TB, p attn.Differentiable, s attn.Shape, q, k, v, g []float32, o attn.Options) (out, lse, dq, dk, dv []float32) {
	t.Helper()
	out, lse = forward(t, p.(attn.Mechanism), s, q, k, v, o)
	dq, dk, dv = nanFilled(s.QLen()), nanFilled(s.KVLen()), nanFilled(s.KVLen())
	if err := p.Backward(context.Background(), s, q, k, v, out, lse, g, o, dq, dk, dv); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return out, lse, dq, dk, dv
}

// estimatorTol bounds estimatorErr for Forward's float32 against favor64:
// about 16 float32 roundings (2^-24 each), where features, products and
// sums make a few. A different projection or normaliser is wrong by
// order 1.
const estimatorTol = 1e-6

// estimatorErr is the largest, over the rows whose normaliser is positive,
// of ‖got_i − want_i‖ over the first-order bound on rounding's effect on
// out_i = num_i / den_i: (Σ_j S_ij ‖v_j‖ + ‖out_i‖ Σ_j S_ij) / den_i, where
// S_ij = Σ_x |φ(q_i)_x φ(k_j)_x| is the size of weight A_ij before its
// terms cancel. Trigonometric features have signs, so den_i can near 0 (it
// does on some random inputs), and a row's own relative error then grows
// without bound while the estimator is right.
func estimatorErr(s attn.Shape, q, k, v []float64, mask []bool, f *feat64, scale float64, got []float32, want []float64) float64 {
	d := s.D
	den, abs, vsize := rowSizes(s, q, k, v, mask, f, scale)
	worst := 0.0
	for row := range den {
		if !(den[row] > 0) {
			continue
		}
		var diff, nw float64
		for x := range d {
			e := float64(got[row*d+x]) - want[row*d+x]
			diff += e * e
			nw += want[row*d+x] * want[row*d+x]
		}
		worst = max(worst, math.Sqrt(diff)/((vsize[row]+math.Sqrt(nw)*abs[row])/den[row]))
	}
	return worst
}

// TestBackwardFiniteDifferences checks favor64's gradient, and through it
// Backward, against central differences of the float64 loss
// L = Σ dout ∘ out, element by element of q, k and v, after checking that
// favor64 is the estimator Forward computes.
func TestBackwardFiniteDifferences(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, testSeed(t)))
	for n, tc := range []struct {
		s     attn.Shape
		o     attn.Options
		kind  Kind
		chunk int
	}{
		{attn.Shape{B: 1, H: 2, HKV: 1, N: 7, M: 9, D: 5}, attn.Options{}, Positive, 4},
		{attn.Shape{B: 1, H: 2, HKV: 1, N: 9, M: 7, D: 5}, attn.Options{Causal: true}, Positive, 3},
		{attn.Shape{B: 2, H: 3, HKV: 1, N: 6, M: 8, D: 3}, attn.Options{Causal: true, KVLen: []int{6, 0}, Scale: -0.4}, Positive, 4},
		{attn.Shape{B: 2, H: 2, HKV: 2, N: 5, M: 9, D: 7}, attn.Options{KVLen: []int{9, 4}}, Positive, 64},
		{attn.Shape{B: 1, H: 2, HKV: 1, N: 7, M: 9, D: 5}, attn.Options{}, Trig, 4},
		{attn.Shape{B: 2, H: 2, HKV: 1, N: 8, M: 8, D: 5}, attn.Options{Causal: true, KVLen: []int{8, 5}, Scale: -0.3}, Trig, 3},
	} {
		s, o := tc.s, tc.o
		p := mustNew(t, Config{Features: 14, Kind: tc.kind, Min: -1, Seed: uint64(n), Chunk: tc.chunk})
		f := newFeat64(p.fm, s.D)
		q, k, v := conditionedInputs(t, rng, s, o, f)
		g := ref.Normal(rng, s.QLen())
		out, _, dq, dk, dv := backward(t, p, s, q, k, v, g, o)
		mask := ref.Mask(s, o)
		scale := float64(o.ScaleFor(s.D))
		q64, k64, v64, g64 := to64(q), to64(k), to64(v), to64(g)
		want, _, aq, ak, av := favor64(s, q64, k64, v64, g64, mask, f, scale)
		name := fmt.Sprintf("%v %+v %+v", tc.kind, s, o)
		if e := estimatorErr(s, q64, k64, v64, mask, f, scale, out, want); e > estimatorTol {
			t.Fatalf("%s: favor64 is not Forward's estimator: error %.3g of what a row sums", name, e)
		}
		loss := func() float64 {
			out, _, _, _, _ := favor64(s, q64, k64, v64, nil, mask, f, scale)
			l := 0.0
			for i := range out {
				l += out[i] * g64[i]
			}
			return l
		}
		const h = 1e-6
		for _, x := range []struct {
			name string
			in   []float64
			an   []float64
			got  []float32
		}{{"dq", q64, aq, dq}, {"dk", k64, ak, dk}, {"dv", v64, av, dv}} {
			fd := make([]float64, len(x.in))
			for i, x0 := range x.in {
				x.in[i] = x0 + h
				lp := loss()
				x.in[i] = x0 - h
				lm := loss()
				x.in[i] = x0
				fd[i] = (lp - lm) / (2 * h)
			}
			var diff, norm float64
			for i := range fd {
				diff += (x.an[i] - fd[i]) * (x.an[i] - fd[i])
				norm += fd[i] * fd[i]
			}
			if e := math.Sqrt(diff / norm); e > 1e-7 {
				t.Errorf("%s: %s: float64 gradient vs finite differences: rel err %.3g", name, x.name, e)
			}
			// Trig normalisers can come near 0, which amplifies
			// rounding; positive ones cannot.
			tol := 1e-4
			if tc.kind == Trig {
				tol = 1e-3
			}
			if e := ref.RelErr(x.got, fd); e > tol {
				t.Errorf("%s: %s: Backward vs finite differences: rel err %.3g", name, x.name, e)
			}
		}
	}
}

// TestBackwardAgainstFormula compares Backward with favor64's gradient at
// odd sizes: GQA, N ≠ M, causal or not, padding (a key length of 0 too),
// odd chunks, a negative scale, both kinds of features. For positive
// features it also checks dv against ref.AttentionBackward: with q = 0
// and a bias of log A_ij the reference's softmax rows are the estimator's
// weights, so its dv is the estimator's.
func TestBackwardAgainstFormula(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, testSeed(t)))
	dims := [][2]int{{37, 37}, {29, 70}, {70, 29}, {1, 45}}
	n := 0
	for _, kind := range []Kind{Positive, Trig} {
		for _, nm := range dims {
			for _, causal := range []bool{false, true} {
				n++
				s := attn.Shape{B: 2, H: 6, HKV: 2, N: nm[0], M: nm[1], D: 13}
				if n%3 == 0 {
					s.HKV = 6
				}
				o := attn.Options{Causal: causal, Workers: n % 4}
				if n%2 == 0 {
					o.KVLen = []int{2 + rng.IntN(s.M-1), 0}
					if n%4 == 0 {
						o.KVLen[1] = s.M
					}
				}
				if n%5 == 0 {
					o.Scale = -0.25
				}
				p := mustNew(t, Config{Features: 62, Kind: kind, Min: -1, Seed: uint64(n), Chunk: []int{5, 16, 0}[n%3]})
				f := newFeat64(p.fm, s.D)
				q, k, v := conditionedInputs(t, rng, s, o, f)
				g := ref.Normal(rng, s.QLen())
				_, _, dq, dk, dv := backward(t, p, s, q, k, v, g, o)
				mask := ref.Mask(s, o)
				_, _, wq, wk, wv := favor64(s, to64(q), to64(k), to64(v), to64(g), mask, f, float64(o.ScaleFor(s.D)))
				name := fmt.Sprintf("%v %+v causal=%v kvlen=%v scale=%v chunk=%d", kind, s, causal, o.KVLen, o.Scale, p.lin.Chunk())
				// Trig normalisers can come near 0, which amplifies
				// rounding (see maxCondition); positive ones cannot.
				tol := 1e-4
				if kind == Trig {
					tol = 1e-3
				}
				for _, x := range []struct {
					name string
					got  []float32
					want []float64
				}{{"dq", dq, wq}, {"dk", dk, wk}, {"dv", dv, wv}} {
					if e := ref.RelErr(x.got, x.want); e > tol {
						t.Errorf("%s: %s rel err %.3g", name, x.name, e)
					}
				}
				if kind == Positive {
					if e := refDV(t, s, o, q, k, v, g, f, dv); e > tol {
						t.Errorf("%s: dv vs ref.AttentionBackward: rel err %.3g", name, e)
					}
				}
			}
		}
	}
}

// refDV returns the relative error of dv against ref.AttentionBackward run
// on the estimator's weights as a bias of log weights (q = 0, so the
// logits are the bias alone).
func refDV(t *testing.T, s attn.Shape, o attn.Options, q, k, v, g []float32, f *feat64, dv []float32) float64 {
	t.Helper()
	d := s.D
	cq, c := featScales(float64(o.ScaleFor(d)))
	mask := ref.Mask(s, o)
	bias := make([]float64, s.B*s.H*s.N*s.M)
	full := make([]bool, len(bias))
	for b := range s.B {
		for h := range s.H {
			kv := (b*s.HKV + h/s.Group()) * s.M
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				pq := f.phi(to64(q[row*d:][:d]), cq)
				for j := range s.M {
					at := row*s.M + j
					if !mask[(b*s.N+i)*s.M+j] {
						bias[at] = math.Inf(-1)
						continue
					}
					full[at] = true
					pk := f.phi(to64(k[(kv+j)*d:][:d]), c)
					a := 0.0
					for x := range pq {
						a += pq[x] * pk[x]
					}
					bias[at] = math.Log(a)
				}
			}
		}
	}
	_, _, want, err := ref.AttentionBackward(s, make([]float32, s.QLen()), k, v, g, ref.Spec{Mask: full, Bias: bias})
	if err != nil {
		t.Fatal(err)
	}
	return ref.RelErr(dv, want)
}

// TestBackwardWorkers: every output is written by one task in a fixed
// order, so the worker count does not change a bit, whatever the mask,
// and the same holds below Min, where flash computes the gradients.
func TestBackwardWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, testSeed(t)))
	s := attn.Shape{B: 2, H: 6, HKV: 2, N: 101, M: 117, D: 13}
	q, k, v := inputs(rng, s, unitScale(s.D))
	g := ref.Normal(rng, s.QLen())
	ctx := context.Background()
	for _, cfg := range []Config{
		{Features: 62, Min: -1, Chunk: 16},
		{Features: 62, Kind: Trig, Min: -1, Chunk: 7},
		{Features: 40, Min: 1000},
	} {
		p := mustNew(t, cfg)
		for _, o := range []attn.Options{{}, {Causal: true}, {Causal: true, KVLen: []int{101, 0}}, {KVLen: []int{77, 117}}} {
			out, lse := forward(t, p, s, q, k, v, o)
			var first [][]float32
			for _, workers := range []int{1, 2, 3, 8} {
				dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
				o.Workers = workers
				if err := p.Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv); err != nil {
					t.Fatal(err)
				}
				got := [][]float32{dq, dk, dv}
				if first == nil {
					first = got
					continue
				}
				for x := range got {
					if i := firstDiff(got[x], first[x]); i >= 0 {
						t.Fatalf("%+v %+v workers=%d: gradient %d differs at %d", cfg, o, workers, x, i)
					}
				}
			}
		}
	}
}

// TestBackwardFallback: below Min, Forward is flash's exact attention, and
// so is Backward, bit for bit, and it matches the float64 reference; at
// Min the gradients are the features' again.
func TestBackwardFallback(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, testSeed(t)))
	s := attn.Shape{B: 2, H: 6, HKV: 2, N: 37, M: 37, D: 13}
	q, k, v := inputs(rng, s, 1)
	g := ref.Normal(rng, s.QLen())
	exact := flash.New(flash.Config{})
	for _, o := range []attn.Options{{}, {Causal: true, KVLen: []int{30, 0}}} {
		eo, eLSE := forward(t, exact, s, q, k, v, o)
		wq, wk, wv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
		if err := exact.Backward(context.Background(), s, q, k, v, eo, eLSE, g, o, nil, wq, wk, wv); err != nil {
			t.Fatal(err)
		}
		_, _, dq, dk, dv := backward(t, mustNew(t, Config{Min: 38}), s, q, k, v, g, o)
		for x, got := range [][]float32{dq, dk, dv} {
			if i := firstDiff(got, [][]float32{wq, wk, wv}[x]); i >= 0 {
				t.Errorf("%+v: M < Min: gradient %d differs from flash's at %d", o, x, i)
			}
		}
		rq, rk, rv, err := ref.AttentionBackward(s, q, k, v, g, ref.Spec{Mask: ref.Mask(s, o)})
		if err != nil {
			t.Fatal(err)
		}
		for x, got := range [][]float32{dq, dk, dv} {
			if e := ref.RelErr(got, [][]float64{rq, rk, rv}[x]); e > 1e-4 {
				t.Errorf("%+v: M < Min: gradient %d rel err %.3g against ref.AttentionBackward", o, x, e)
			}
		}
		_, _, dq, _, _ = backward(t, mustNew(t, Config{Min: 37, Features: 32}), s, q, k, v, g, o)
		if firstDiff(dq, wq) < 0 {
			t.Errorf("%+v: M = Min: the gradient is exact attention's", o)
		}
	}
}

// TestBackwardUnderflowRows: a row whose positive-feature normaliser
// underflows is computed exactly by Forward, and Backward gives it the
// exact gradient of its softmax row: the gradients are those of the
// feature rows alone (linear's backward with the other rows' dout 0) plus
// the float64 exact gradients of those rows alone.
//
// Batch row 0 has every key near α·e for a unit vector e, and queries
// near −α·e on even positions, +α·e on odd ones. With x' = c·x and a_f =
// w_f·e, the features of a query near −α·e and a key near α·e multiply to
// exp(−c·α·(max_f a_f − min_f a_f)) in every feature, far below the
// float32 range, while aligned ones meet at the same feature; the keys
// differ by little, so the exact rows' softmax is not saturated. Batch row
// 1 is at unit scale.
func TestBackwardUnderflowRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, testSeed(t)))
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 40, M: 43, D: 8}
	d := s.D
	alpha := 40 / float64(unitScale(d)) // c·α = 40
	for _, causal := range []bool{false, true} {
		o := attn.Options{Causal: causal}
		p := mustNew(t, Config{Features: 32, Min: -1, Chunk: 16})
		q, k, v := inputs(rng, s, unitScale(d))
		e := make([]float64, d)
		norm := 0.0
		for c := range e {
			e[c] = rng.NormFloat64()
			norm += e[c] * e[c]
		}
		for c := range e {
			e[c] /= math.Sqrt(norm)
		}
		for r := range s.HKV * s.M { // batch row 0's keys
			for c := range d {
				k[r*d+c] = float32(alpha*e[c]) + 0.01*k[r*d+c]
			}
		}
		for r := range s.H * s.N { // batch row 0's queries
			sign := 1.0
			if r%2 == 0 {
				sign = -1
			}
			for c := range d {
				q[r*d+c] += float32(sign * alpha * e[c])
			}
		}
		g := ref.Normal(rng, s.QLen())
		_, lse, dq, dk, dv := backward(t, p, s, q, k, v, g, o)
		// The rows the features leave out: -Inf from the linear pass.
		linLSE := make([]float32, s.LSELen())
		if err := p.lin.Forward(context.Background(), s, q, k, v, o, make([]float32, s.QLen()), linLSE); err != nil {
			t.Fatal(err)
		}
		exactRow := make([]bool, s.LSELen())
		nExact, nWant := 0, 0
		for row, l := range linLSE {
			b, i := row/(s.H*s.N), row%s.N
			exactRow[row] = math.IsInf(float64(l), -1) && o.VisibleKeys(s, b, i) > 0
			if exactRow[row] {
				nExact++
			}
			if b == 0 && i%2 == 0 && o.VisibleKeys(s, b, i) > 0 {
				nWant++
			}
		}
		if nExact != nWant {
			t.Fatalf("causal=%v: %d rows underflow, want %d", causal, nExact, nWant)
		}
		out, _ := forward(t, p, s, q, k, v, o)
		gFeat, gExact := make([]float32, len(g)), make([]float32, len(g))
		for row := range exactRow {
			dst := gFeat
			if exactRow[row] {
				dst = gExact
			}
			copy(dst[row*d:][:d], g[row*d:][:d])
		}
		fq, fk, fv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
		if err := p.lin.Backward(context.Background(), s, q, k, v, out, lse, gFeat, o, fq, fk, fv); err != nil {
			t.Fatal(err)
		}
		// Only the exact rows see keys in the reference's mask.
		mask := make([]bool, s.B*s.H*s.N*s.M)
		dense := ref.Mask(s, o)
		for row := range exactRow {
			b, i := row/(s.H*s.N), row%s.N
			for j := range s.M {
				mask[row*s.M+j] = exactRow[row] && dense[(b*s.N+i)*s.M+j]
			}
		}
		rq, rk, rv, err := ref.AttentionBackward(s, q, k, v, gExact, ref.Spec{Mask: mask})
		if err != nil {
			t.Fatal(err)
		}
		for x, tc := range []struct {
			got, feat []float32
			exact     []float64
		}{{dq, fq, rq}, {dk, fk, rk}, {dv, fv, rv}} {
			want := make([]float64, len(tc.exact))
			for i := range want {
				want[i] = float64(tc.feat[i]) + tc.exact[i]
			}
			// The exact rows' logits are near −(c·α)² = −1600, whose
			// float32 rounding alone moves a probability by 1e-4.
			if e := ref.RelErr(tc.got, want); e > 5e-4 {
				t.Errorf("causal=%v, %d exact rows: gradient %d rel err %.3g", causal, nExact, x, e)
			}
		}
	}
}

// TestBackwardPrefix: under the causal mask the gradients of a loss on the
// first positions do not depend on later tokens, however large: the
// stabilisers are taken over the keys a query sees. Later tokens only
// change the rounding, through where the chunks fall.
func TestBackwardPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, testSeed(t)))
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 90, M: 90, D: 13}
	for _, kind := range []Kind{Positive, Trig} {
		p := mustNew(t, Config{Features: 62, Kind: kind, Min: -1, Chunk: 16})
		o := attn.Options{Causal: true}
		q, k, v := inputs(rng, s, unitScale(s.D))
		g := ref.Normal(rng, s.QLen())
		tp := 1 + rng.IntN(s.N-1) // the prefix: positions [0, tp)
		for bh := range s.B * s.H {
			for i := tp; i < s.N; i++ {
				for c := range s.D {
					g[(bh*s.N+i)*s.D+c] = 0
				}
			}
		}
		_, _, dq1, dk1, dv1 := backward(t, p, s, q, k, v, g, o)
		for bh := range s.B * s.HKV {
			for j := tp; j < s.M; j++ {
				for c := range s.D {
					k[(bh*s.M+j)*s.D+c] *= 30
					v[(bh*s.M+j)*s.D+c] *= 30
				}
			}
		}
		for bh := range s.B * s.H {
			for i := tp; i < s.N; i++ {
				for c := range s.D {
					q[(bh*s.N+i)*s.D+c] *= 30
				}
			}
		}
		_, _, dq2, dk2, dv2 := backward(t, p, s, q, k, v, g, o)
		for x, pair := range [][2][]float32{{dq1, dq2}, {dk1, dk2}, {dv1, dv2}} {
			if e := ref.RelErr(pair[1], to64(pair[0])); e > 1e-5 {
				t.Errorf("%v, prefix %d: gradient %d changed with later tokens: rel err %.3g", kind, tp, x, e)
			}
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 20, M: 30, D: 8}
	rng := rand.New(rand.NewPCG(26, 26))
	q, k, v := inputs(rng, s, 1)
	g := ref.Normal(rng, s.QLen())
	ctx := context.Background()
	for _, p := range []*Performer{mustNew(t, Config{Min: -1, Features: 16}), mustNew(t, Config{Min: 31})} {
		out, lse := forward(t, p, s, q, k, v, attn.Options{})
		dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
		o := attn.Options{}
		for name, call := range map[string]func() error{
			"nil lse":    func() error { return p.Backward(ctx, s, q, k, v, out, nil, g, o, dq, dk, dv) },
			"short dout": func() error { return p.Backward(ctx, s, q, k, v, out, lse, g[1:], o, dq, dk, dv) },
			"long dk":    func() error { return p.Backward(ctx, s, q, k, v, out, lse, g, o, dq, append(dk, 0), dv) },
		} {
			if err := call(); !errors.Is(err, attn.ErrShape) {
				t.Errorf("min %d: %s: got %v, want ErrShape", p.Min(), name, err)
			}
		}
		if err := p.Backward(ctx, s, q, k, v, out, lse, g, attn.Options{KVLen: []int{31}}, dq, dk, dv); !errors.Is(err, attn.ErrInput) {
			t.Errorf("min %d: kvlen 31 > M: %v", p.Min(), err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := p.Backward(cctx, s, q, k, v, out, lse, g, o, dq, dk, dv); !errors.Is(err, context.Canceled) {
			t.Errorf("min %d: cancelled: got %v", p.Min(), err)
		}
	}
}

// BenchmarkBackwardRatio times a forward and a backward pass of FAVOR+
// (256 features, never falling back) at B = 1, H = 8, D = 64 and
// N = M = 2048, alternating the two in one loop so that both see the
// same machine load; bwd/fwd is the ratio of their mean times.
func BenchmarkBackwardRatio(b *testing.B) {
	for _, causal := range []bool{false, true} {
		s := attn.Shape{B: 1, H: 8, HKV: 8, N: 2048, M: 2048, D: 64}
		b.Run(fmt.Sprintf("d64/n2048/causal=%v", causal), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			q, k, v := inputs(rng, s, unitScale(s.D))
			g := ref.Normal(rng, s.QLen())
			p, err := New(Config{Min: -1})
			if err != nil {
				b.Fatal(err)
			}
			gradbench.Run(b, p, s, attn.Options{Causal: causal}, q, k, v, g)
		})
	}
}

// maxCondition bounds normCondition for the inputs of the tests that
// compare Backward with favor64's gradient. Rounding in the gradient
// grows with it, without bound as a trigonometric normaliser nears 0: on
// one seed in a few hundred a row had 1405, and dq was 2e-3 off. The
// errors measured were at most 1.5e-6 times normCondition (150 runs with
// it up to 2498, and that seed), so below 100 they stay near 1.5e-4,
// under the tests' bound of 1e-3 for trigonometric features.
const maxCondition = 100

// conditionedInputs draws q, k and v as inputs does until their
// normCondition under f, o and the mask is at most maxCondition: at
// once for positive features.
func conditionedInputs(t *testing.T, rng *rand.Rand, s attn.Shape, o attn.Options, f *feat64) (q, k, v []float32) {
	t.Helper()
	mask := ref.Mask(s, o)
	for range 100 {
		q, k, v = inputs(rng, s, unitScale(s.D))
		if normCondition(s, to64(q), to64(k), mask, f, float64(o.ScaleFor(s.D))) <= maxCondition {
			return q, k, v
		}
	}
	t.Fatalf("%+v %+v: no inputs of normCondition <= %d in 100 draws", s, o, maxCondition)
	return nil, nil, nil
}

// normCondition is the largest, over the rows whose normaliser is
// positive, of Σ_j S_ij / den_i, with S_ij = Σ_x |φ(q_i)_x φ(k_j)_x| the
// size of weight A_ij before its terms cancel: 1 for positive features,
// and as large as cancellation makes it for trigonometric ones.
func normCondition(s attn.Shape, q, k []float64, mask []bool, f *feat64, scale float64) float64 {
	den, abs, _ := rowSizes(s, q, k, nil, mask, f, scale)
	worst := 1.0
	for row := range den {
		if den[row] > 0 {
			worst = max(worst, abs[row]/den[row])
		}
	}
	return worst
}
