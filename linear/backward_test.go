package linear

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/gradbench"
	"github.com/attnkit/attn/ref"
)

// gradTol bounds the relative error (Frobenius norm) of each gradient
// against the float64 one.
const gradTol = 1e-4

// map64 is an element-wise feature map in float64, φ(x)_c = f(x_c), and
// its derivative.
type map64 struct{ f, df func(float64) float64 }

// elu64 is φ(x) = elu(x)+1, exp64 φ(x) = exp(x) (expMap).
var (
	elu64 = map64{
		f: func(x float64) float64 {
			if x < 0 {
				return math.Exp(x)
			}
			return x + 1
		},
		df: func(x float64) float64 {
			if x < 0 {
				return math.Exp(x)
			}
			return 1
		},
	}
	exp64 = map64{f: math.Exp, df: math.Exp}
)

// linear64 evaluates linear attention with an element-wise map in float64
// from its definition, out_i = Σ_j A_ij v_j / Σ_j A_ij with A_ij = φ(q_i)·φ(k_j)
// over the keys the mask allows (a row that sees none gives 0), and,
// when dout is not nil, the gradient of L = Σ dout ∘ out by the chain
// rule written out term by term:
//
//	∂L/∂A_ij = dO_i·v_j/den_i − dO_i·out_i/den_i
//	dq_i = φ'(q_i) ∘ Σ_j ∂L/∂A_ij φ(k_j),  dk_j = φ'(k_j) ∘ Σ_i ∂L/∂A_ij φ(q_i),
//	dv_j = Σ_i A_ij dO_i/den_i.
func linear64(s attn.Shape, q, k, v, dout []float64, mask []bool, fm map64) (out, dq, dk, dv []float64) {
	d := s.D
	phi := func(x []float64) []float64 {
		y := make([]float64, len(x))
		for i, t := range x {
			y[i] = fm.f(t)
		}
		return y
	}
	pq, pk := phi(q), phi(k)
	out = make([]float64, s.QLen())
	dq = make([]float64, s.QLen())
	dk = make([]float64, s.KVLen())
	dv = make([]float64, s.KVLen())
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
						for c := range d {
							a[j] += pq[row*d+c] * pk[(kv+j)*d+c]
						}
						den += a[j]
					}
				}
				if den == 0 {
					continue
				}
				oi := out[row*d:][:d]
				for j := range s.M {
					for c := range d {
						oi[c] += a[j] * v[(kv+j)*d+c] / den
					}
				}
				if dout == nil {
					continue
				}
				gi := dout[row*d:][:d]
				gdo := 0.0
				for c := range d {
					gdo += gi[c] * oi[c]
				}
				for j := range s.M {
					if !mask[(b*s.N+i)*s.M+j] {
						continue
					}
					gv := 0.0
					for c := range d {
						gv += gi[c] * v[(kv+j)*d+c]
					}
					dA := gv/den - gdo/den
					for c := range d {
						dq[row*d+c] += dA * pk[(kv+j)*d+c] * fm.df(q[row*d+c])
						dk[(kv+j)*d+c] += dA * pq[row*d+c] * fm.df(k[(kv+j)*d+c])
						dv[(kv+j)*d+c] += a[j] * gi[c] / den
					}
				}
			}
		}
	}
	return out, dq, dk, dv
}

func gradTo64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// gradRun runs a's Forward and Backward on fresh inputs with NaN-filled
// gradients, which Backward must overwrite. Given qk = {a, b}, q and k
// are a·N(0, 1) + b; else standard normal.
func gradRun(t *testing.T, a *Attention, rng *rand.Rand, s attn.Shape, o attn.Options, qk ...float32) (q, k, v, g, dq, dk, dv []float32) {
	t.Helper()
	q, k, v = ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	g = ref.Normal(rng, s.QLen())
	if len(qk) == 2 {
		for _, x := range [][]float32{q, k} {
			for i := range x {
				x[i] = qk[0]*x[i] + qk[1]
			}
		}
	}
	ctx := context.Background()
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	if err := a.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
		t.Fatal(err)
	}
	nan := float32(math.NaN())
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = nan
		}
		return x
	}
	dq, dk, dv = fill(s.QLen()), fill(s.KVLen()), fill(s.KVLen())
	if err := a.Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv); err != nil {
		t.Fatal(err)
	}
	return q, k, v, g, dq, dk, dv
}

// TestBackwardAgainstFormula compares Backward with linear64 for elu+1 and
// for expMap, whose log-scaled features go through the stabilisers; with
// q and k around 50, exp(q_c + k_c) is far past the float32 range, so only
// the log-scaled form computes it.
func TestBackwardAgainstFormula(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, testSeed(t)))
	// No case leaves every row a single key: the output is then v
	// whatever q and k, dq and dk vanish, and only rounding is left, which
	// a relative error cannot judge.
	dims := [][2]int{{1, 2}, {37, 37}, {29, 70}, {70, 29}, {1, 131}, {131, 45}, {100, 100}}
	groups := [][2]int{{4, 4}, {4, 2}, {4, 1}}
	chunks := []int{5, 16, 0}
	n := 0
	for _, nm := range dims {
		for _, hg := range groups {
			for _, causal := range []bool{false, true} {
				n++
				s := attn.Shape{B: 2, H: hg[0], HKV: hg[1], N: nm[0], M: nm[1], D: []int{13, 24, 40}[(n/2)%3]}
				o := attn.Options{Causal: causal, Workers: n % 4}
				if n%3 != 0 {
					o.KVLen = []int{2 + rng.IntN(s.M-1), s.M}
					if n%3 == 1 {
						o.KVLen[1] = 0
					}
				}
				for _, m := range []struct {
					name string
					fm   FeatureMap
					f64  map64
					qk   []float32
				}{{"elu", ELU{}, elu64, nil}, {"exp", expMap{}, exp64, nil}, {"exp", expMap{}, exp64, []float32{2, 50}}} {
					a := New(Config{Map: m.fm, Chunk: chunks[n%len(chunks)]})
					q, k, v, g, dq, dk, dv := gradRun(t, a, rng, s, o, m.qk...)
					_, wq, wk, wv := linear64(s, gradTo64(q), gradTo64(k), gradTo64(v), gradTo64(g), ref.Mask(s, o), m.f64)
					name := fmt.Sprintf("%s %v %+v causal=%v kvlen=%v chunk=%d", m.name, m.qk, s, causal, o.KVLen, a.Chunk())
					for _, x := range []struct {
						name string
						got  []float32
						want []float64
					}{{"dq", dq, wq}, {"dk", dk, wk}, {"dv", dv, wv}} {
						if e := ref.RelErr(x.got, x.want); e > gradTol {
							t.Errorf("%s: %s rel err %.3g", name, x.name, e)
						}
					}
				}
			}
		}
	}
}

// TestBackwardFiniteDifferences checks the float64 gradient, and through
// it Backward, against central differences of the float64 loss
// L = Σ dout ∘ out, element by element of q, k and v.
func TestBackwardFiniteDifferences(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, testSeed(t)))
	for _, tc := range []struct {
		s     attn.Shape
		o     attn.Options
		chunk int
		exp   bool
	}{
		{attn.Shape{B: 1, H: 4, HKV: 2, N: 13, M: 11, D: 24}, attn.Options{}, 4, false},
		{attn.Shape{B: 1, H: 4, HKV: 1, N: 11, M: 17, D: 24}, attn.Options{Causal: true}, 4, false},
		{attn.Shape{B: 2, H: 4, HKV: 2, N: 8, M: 7, D: 40}, attn.Options{Causal: true, KVLen: []int{6, 0}}, 3, false},
		{attn.Shape{B: 2, H: 4, HKV: 1, N: 9, M: 12, D: 24}, attn.Options{KVLen: []int{12, 5}}, 64, false},
		{attn.Shape{B: 1, H: 4, HKV: 2, N: 13, M: 11, D: 7}, attn.Options{}, 4, true},
		{attn.Shape{B: 2, H: 3, HKV: 1, N: 9, M: 7, D: 5}, attn.Options{Causal: true, KVLen: []int{6, 7}}, 3, true},
	} {
		s, o := tc.s, tc.o
		a, f64 := New(Config{Chunk: tc.chunk}), elu64
		if tc.exp {
			a, f64 = New(Config{Map: expMap{}, Chunk: tc.chunk}), exp64
		}
		q, k, v, g, dq, dk, dv := gradRun(t, a, rng, s, o)
		mask := ref.Mask(s, o)
		q64, k64, v64, g64 := gradTo64(q), gradTo64(k), gradTo64(v), gradTo64(g)
		_, aq, ak, av := linear64(s, q64, k64, v64, g64, mask, f64)
		loss := func() float64 {
			out, _, _, _ := linear64(s, q64, k64, v64, nil, mask, f64)
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
			// elu+1 has a kink in its second derivative at 0, so the
			// differences are a little less exact than for a smooth map.
			if e := math.Sqrt(diff / norm); e > 1e-6 {
				t.Errorf("%+v %+v: %s: float64 gradient vs finite differences: rel err %.3g", s, o, x.name, e)
			}
			if e := ref.RelErr(x.got, fd); e > gradTol {
				t.Errorf("%+v %+v: %s: Backward vs finite differences: rel err %.3g", s, o, x.name, e)
			}
		}
	}
}

// TestBackwardEmptyRows: rows that see no key (causal with N > M, a key
// length of 0) get exactly zero dq, keys no row sees get zero dk and dv,
// and nothing is NaN.
func TestBackwardEmptyRows(t *testing.T) {
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 40, M: 23, D: 24}
	o := attn.Options{Causal: true, KVLen: []int{19, 0}}
	for _, a := range []*Attention{New(Config{Chunk: 5}), New(Config{Chunk: 64}), New(Config{Map: expMap{}, Chunk: 7})} {
		chunk := a.Chunk()
		_, _, _, _, dq, dk, dv := gradRun(t, a, rand.New(rand.NewPCG(33, 33)), s, o)
		for row := range s.LSELen() {
			b, i := row/(s.H*s.N), row%s.N
			empty := b == 1 || i < s.N-s.M
			for _, x := range dq[row*s.D:][:s.D] {
				if math.IsNaN(float64(x)) || (empty && x != 0) {
					t.Fatalf("chunk %d: dq row %d (b=%d i=%d): %v", chunk, row, b, i, dq[row*s.D:][:s.D])
				}
			}
		}
		for row := range s.B * s.HKV * s.M {
			b, j := row/(s.HKV*s.M), row%s.M
			unseen := b == 1 || j >= 19
			for _, gr := range [][]float32{dk, dv} {
				for _, x := range gr[row*s.D:][:s.D] {
					if math.IsNaN(float64(x)) || (unseen && x != 0) {
						t.Fatalf("chunk %d: key row %d (b=%d j=%d): %v", chunk, row, b, j, gr[row*s.D:][:s.D])
					}
				}
			}
		}
	}
}

// TestBackwardWorkers: every output is written by one task in a fixed
// order, so the worker count does not change a bit, whatever the mask.
// With four pairs, 1 and 2 workers take a pair at a time and 3 and 8
// split each pair's queries from its keys.
func TestBackwardWorkers(t *testing.T) {
	for _, s := range []attn.Shape{{B: 1, H: 4, HKV: 1, N: 150, M: 170, D: 40}, {B: 2, H: 4, HKV: 2, N: 150, M: 170, D: 40}} {
		testBackwardWorkers(t, s)
	}
}

func testBackwardWorkers(t *testing.T, s attn.Shape) {
	rng := rand.New(rand.NewPCG(34, 34))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	g := ref.Normal(rng, s.QLen())
	ctx := context.Background()
	kvlen := func(n ...int) []int { return n[:s.B] }
	for _, a := range []*Attention{New(Config{Chunk: 16}), New(Config{Map: expMap{}, Chunk: 16})} {
		for _, o := range []attn.Options{{}, {Causal: true}, {Causal: true, KVLen: kvlen(131, 170)}, {KVLen: kvlen(77, 12)}} {
			out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
			if err := a.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
				t.Fatal(err)
			}
			var first [][]float32
			for _, workers := range []int{1, 2, 3, 8} {
				dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
				o.Workers = workers
				if err := a.Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv); err != nil {
					t.Fatal(err)
				}
				got := [][]float32{dq, dk, dv}
				if first == nil {
					first = got
					continue
				}
				for x := range got {
					if i := firstDiff(got[x], first[x]); i >= 0 {
						t.Fatalf("%T %s workers=%d: gradient %d differs at %d", a.fm, fmtCase(s, o), workers, x, i)
					}
				}
			}
		}
	}
}

// TestBackwardReusesMemory: Backward's operands are reused from one call
// to the next (slabPool), so they may hold anything, NaN included. A call
// on memory filled with NaN must give the gradients of a call on fresh
// memory: whatever the products read and no step writes (keys past the
// key length, rows Forward left at 0, padding) must be zero again.
func TestBackwardReusesMemory(t *testing.T) {
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 37, M: 29, D: 19}
	rng := rand.New(rand.NewPCG(37, testSeed(t)))
	ctx := context.Background()
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	g := ref.Normal(rng, s.QLen())
	poison := func() {
		for range 2 * s.B * s.HKV {
			x := make([]float32, 1<<16)
			for i := range x {
				x[i] = float32(math.NaN())
			}
			slabPool.Put(&x)
		}
	}
	for _, a := range []*Attention{New(Config{Chunk: 8}), New(Config{Map: expMap{}, Chunk: 8})} {
		for _, o := range []attn.Options{{Causal: true, KVLen: []int{17, 0}}, {KVLen: []int{23, 5}}} {
			out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
			if err := a.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
				t.Fatal(err)
			}
			var want [][]float32
			for _, poisoned := range []bool{false, true} {
				if poisoned {
					poison()
				}
				dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
				if err := a.Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv); err != nil {
					t.Fatal(err)
				}
				got := [][]float32{dq, dk, dv}
				if want == nil {
					want = got
					continue
				}
				for x := range got {
					if i := firstDiff(got[x], want[x]); i >= 0 {
						t.Fatalf("%T %s: gradient %d differs at %d on reused memory: %v, want %v", a.fm, fmtCase(s, o), x, i, got[x][i], want[x][i])
					}
				}
			}
		}
	}
}

// TestBackwardSkipped: a row whose normaliser under the map is not
// positive gets out 0 and lse -Inf from Forward and nothing from Backward;
// given a finite lse for it (its out computed some other way, as package
// performer does), BackwardSkipped lists it, and it still contributes
// nothing: the gradients are those with its dout set to 0.
func TestBackwardSkipped(t *testing.T) {
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 30, M: 33, D: 8}
	rng := rand.New(rand.NewPCG(36, testSeed(t)))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	g := ref.Normal(rng, s.QLen())
	// elu(x)+1 of x = -200 underflows to 0 in float32.
	zero := []int{3, 2*s.N + 17, 5*s.N + 29}
	for _, row := range zero {
		for c := range s.D {
			q[row*s.D+c] = -200
		}
	}
	a := New(Config{Chunk: 8})
	ctx := context.Background()
	for _, o := range []attn.Options{{}, {Causal: true, KVLen: []int{33, 20}}} {
		out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
		if err := a.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
			t.Fatal(err)
		}
		grads := func(lse, g []float32) ([]int, [][]float32) {
			dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
			rows, err := a.BackwardSkipped(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv)
			if err != nil {
				t.Fatal(err)
			}
			return rows, [][]float32{dq, dk, dv}
		}
		g0 := slices.Clone(g)
		for _, row := range zero {
			if !math.IsInf(float64(lse[row]), -1) {
				t.Fatalf("%+v: row %d: lse %v, want -Inf", o, row, lse[row])
			}
			clear(g0[row*s.D:][:s.D])
		}
		rows, want := grads(lse, g0)
		if len(rows) != 0 {
			t.Errorf("%+v: with Forward's lse, skipped %v", o, rows)
		}
		fake := slices.Clone(lse)
		for _, row := range zero {
			fake[row] = 1
		}
		rows, got := grads(fake, g)
		if !slices.Equal(rows, zero) {
			t.Errorf("%+v: skipped %v, want %v", o, rows, zero)
		}
		for x := range got {
			if i := firstDiff(got[x], want[x]); i >= 0 {
				t.Errorf("%+v: gradient %d differs at %d", o, x, i)
			}
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 20, M: 30, D: 8}
	rng := rand.New(rand.NewPCG(35, 35))
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	g := ref.Normal(rng, s.QLen())
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	a := New(Config{})
	ctx := context.Background()
	if err := a.Forward(ctx, s, q, k, v, attn.Options{}, out, lse); err != nil {
		t.Fatal(err)
	}
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	o := attn.Options{}
	for name, call := range map[string]func() error{
		"nil lse":    func() error { return a.Backward(ctx, s, q, k, v, out, nil, g, o, dq, dk, dv) },
		"nil out":    func() error { return a.Backward(ctx, s, q, k, v, nil, lse, g, o, dq, dk, dv) },
		"short dout": func() error { return a.Backward(ctx, s, q, k, v, out, lse, g[1:], o, dq, dk, dv) },
		"short dq":   func() error { return a.Backward(ctx, s, q, k, v, out, lse, g, o, dq[1:], dk, dv) },
		"long dk":    func() error { return a.Backward(ctx, s, q, k, v, out, lse, g, o, dq, append(dk, 0), dv) },
		"short dv":   func() error { return a.Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv[:0]) },
	} {
		if err := call(); !errors.Is(err, attn.ErrShape) {
			t.Errorf("%s: got %v, want ErrShape", name, err)
		}
	}
	if err := New(Config{Map: opaqueMap{expMap{}}}).Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("a map without MapBackward: got %v, want ErrUnsupported", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Backward(cctx, s, q, k, v, out, lse, g, o, dq, dk, dv); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v", err)
	}
}

// BenchmarkBackward times a forward and a backward pass of elu+1
// attention at B = 1, H = 8, D = 64 and N = M = 2048 and 8192,
// alternating the two in one loop so that both see the same machine load;
// bwd/fwd is the ratio of their mean times.
func BenchmarkBackward(b *testing.B) {
	for _, n := range []int{2048, 8192} {
		for _, causal := range []bool{false, true} {
			benchmarkBackward(b, attn.Shape{B: 1, H: 8, HKV: 8, N: n, M: n, D: 64}, causal)
		}
	}
}

func benchmarkBackward(b *testing.B, s attn.Shape, causal bool) {
	b.Run(fmt.Sprintf("d64/n%d/causal=%v", s.N, causal), func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 2))
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		g := ref.Normal(rng, s.QLen())
		gradbench.Run(b, New(Config{}), s, attn.Options{Causal: causal}, q, k, v, g)
	})
}
