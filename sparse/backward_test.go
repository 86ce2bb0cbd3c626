package sparse

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

// Sliding-window attention has no backward pass of its own: it is the
// exact kernel's Backward with Window as the pattern. These tests
// run the "window" mechanism's Forward, as a model does, then that
// Backward, and check the gradients against float64 ones written from
// the definition of the window (p-Left <= j <= p+Right, p-j a multiple
// of Dilation, at absolute positions) and against finite differences.

// windowVis says whether query i of batch row b sees key j: the window
// at absolute positions, and the causal and padding masks of o.
func windowVis(s attn.Shape, o attn.Options, w Window) func(b, i, j int) bool {
	mask := ref.Mask(s, o)
	return func(b, i, j int) bool {
		p := s.M - s.N + i
		dil := max(w.Dilation, 1)
		return mask[(b*s.N+i)*s.M+j] && p-w.Left <= j && j <= p+w.Right && (p-j)%dil == 0
	}
}

// attention64 returns out and the gradients of L = Σ dout ∘ out in
// float64: P = softmax over the visible keys, dv_j = Σ_i P_ij dO_i,
// dS_ij = P_ij (dO_i·v_j − dO_i·o_i), dq_i = scale Σ_j dS_ij k_j,
// dk_j = scale Σ_i dS_ij q_i.
func attention64(s attn.Shape, q, k, v, dout []float64, scale float64, vis func(b, i, j int) bool) (out, dq, dk, dv []float64) {
	d := s.D
	out = make([]float64, s.QLen())
	dq = make([]float64, s.QLen())
	dk = make([]float64, s.KVLen())
	dv = make([]float64, s.KVLen())
	dot := func(x, y []float64) float64 {
		t := 0.0
		for c := range x {
			t += x[c] * y[c]
		}
		return t
	}
	p := make([]float64, s.M)
	for b := range s.B {
		for h := range s.H {
			kv := (b*s.HKV + h/s.Group()) * s.M
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				qi, oi, gi := q[row*d:][:d], out[row*d:][:d], dout[row*d:][:d]
				mx := math.Inf(-1)
				for j := range s.M {
					p[j] = math.Inf(-1)
					if vis(b, i, j) {
						p[j] = scale * dot(qi, k[(kv+j)*d:][:d])
						mx = math.Max(mx, p[j])
					}
				}
				if math.IsInf(mx, -1) {
					continue
				}
				sum := 0.0
				for j := range p {
					p[j] = math.Exp(p[j] - mx)
					sum += p[j]
				}
				for j := range p {
					p[j] /= sum
					for c := range d {
						oi[c] += p[j] * v[(kv+j)*d+c]
					}
				}
				delta := dot(gi, oi)
				for j := range p {
					if p[j] == 0 {
						continue
					}
					ds := p[j] * (dot(gi, v[(kv+j)*d:][:d]) - delta)
					for c := range d {
						dv[(kv+j)*d+c] += p[j] * gi[c]
						dq[row*d+c] += scale * ds * k[(kv+j)*d+c]
						dk[(kv+j)*d+c] += scale * ds * qi[c]
					}
				}
			}
		}
	}
	return out, dq, dk, dv
}

func f64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// windowGrads runs the window mechanism's Forward and the exact kernel's
// Backward with the window as pattern.
func windowGrads(t *testing.T, s attn.Shape, o attn.Options, w Window, q, k, v, dout []float32) (dq, dk, dv []float32) {
	t.Helper()
	mech, err := NewWindow(WindowConfig{Left: w.Left, Right: w.Right, Dilation: w.Dilation})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	if err := mech.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
		t.Fatal(err)
	}
	dq, dk, dv = make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	if err := flash.New(flash.Config{}).Backward(ctx, s, q, k, v, out, lse, dout, o, w, dq, dk, dv); err != nil {
		t.Fatal(err)
	}
	return dq, dk, dv
}

func TestWindowBackward(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, freshSeed(t))) // fresh inputs every run
	windows := []Window{
		{Left: 5, Right: 3, Dilation: 1},
		{Left: 40, Right: 0, Dilation: 1},
		{Left: 1, Right: 70, Dilation: 1},
		{Left: 12, Right: 6, Dilation: 3},
	}
	dims := [][2]int{{97, 97}, {70, 131}, {131, 45}, {1, 50}}
	n := 0
	for _, w := range windows {
		for _, nm := range dims {
			for _, causal := range []bool{false, true} {
				n++
				s := attn.Shape{B: 2, H: 4, HKV: []int{2, 1}[n%2], N: nm[0], M: nm[1], D: []int{24, 40}[n/2%2]}
				o := attn.Options{Causal: causal}
				if n%3 == 0 {
					o.KVLen = []int{rng.IntN(s.M + 1), 0}
				}
				name := fmt.Sprintf("%+v %+v causal=%v kvlen=%v", w, s, causal, o.KVLen)
				q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
				g := ref.Normal(rng, s.QLen())
				dq, dk, dv := windowGrads(t, s, o, w, q, k, v, g)
				_, wq, wk, wv := attention64(s, f64(q), f64(k), f64(v), f64(g), float64(o.ScaleFor(s.D)), windowVis(s, o, w))
				for _, x := range []struct {
					name string
					got  []float32
					want []float64
				}{{"dq", dq, wq}, {"dk", dk, wk}, {"dv", dv, wv}} {
					if e := ref.RelErr(x.got, x.want); e > 1e-4 {
						t.Errorf("%s: %s rel err %.3g", name, x.name, e)
					}
				}
			}
		}
	}
}

// TestWindowBackwardFiniteDifferences checks the gradients against
// central differences of the float64 loss Σ dout ∘ out, element by
// element of q, k and v.
func TestWindowBackwardFiniteDifferences(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, freshSeed(t)))
	for _, tc := range []struct {
		s attn.Shape
		o attn.Options
		w Window
	}{
		{attn.Shape{B: 1, H: 4, HKV: 2, N: 13, M: 17, D: 24}, attn.Options{Causal: true}, Window{Left: 4, Right: 2, Dilation: 1}},
		{attn.Shape{B: 2, H: 4, HKV: 1, N: 15, M: 11, D: 24}, attn.Options{KVLen: []int{9, 11}}, Window{Left: 3, Right: 5, Dilation: 2}},
	} {
		s, o, w := tc.s, tc.o, tc.w
		q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
		g := ref.Normal(rng, s.QLen())
		dq, dk, dv := windowGrads(t, s, o, w, q, k, v, g)
		vis := windowVis(s, o, w)
		scale := float64(o.ScaleFor(s.D))
		q64, k64, v64, g64 := f64(q), f64(k), f64(v), f64(g)
		loss := func() float64 {
			out, _, _, _ := attention64(s, q64, k64, v64, g64, scale, vis)
			l := 0.0
			for i := range out {
				l += out[i] * g64[i]
			}
			return l
		}
		const h = 1e-5
		for _, x := range []struct {
			name string
			in   []float64
			got  []float32
		}{{"dq", q64, dq}, {"dk", k64, dk}, {"dv", v64, dv}} {
			fd := make([]float64, len(x.in))
			for i, x0 := range x.in {
				x.in[i] = x0 + h
				lp := loss()
				x.in[i] = x0 - h
				lm := loss()
				x.in[i] = x0
				fd[i] = (lp - lm) / (2 * h)
			}
			if e := ref.RelErr(x.got, fd); e > 1e-4 {
				t.Errorf("%+v %+v %+v: %s vs finite differences: rel err %.3g", w, s, o, x.name, e)
			}
		}
	}
}

// TestBackward runs every mechanism's Forward, then its Backward, and
// checks the gradients against float64 ones written from the mechanism's
// definition (as TestAgainstReference takes it), and against central
// differences of the float64 loss Σ dout ∘ out: causal and not, N < M and
// N > M, GQA, padding.
func TestBackward(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, freshSeed(t)))
	ctx := context.Background()
	shapes := []attn.Shape{{B: 1, H: 4, HKV: 2, N: 13, M: 19, D: 5}, {B: 2, H: 3, HKV: 1, N: 17, M: 11, D: 7}}
	for _, mc := range mechCases() {
		for si, s := range shapes {
			for _, causal := range []bool{false, true} {
				o := attn.Options{Causal: causal}
				if si == 1 && causal {
					o.KVLen = []int{9, 11}
				}
				a, err := mc.build(flash.Config{})
				if err != nil {
					t.Fatal(err)
				}
				pat, err := a.Pattern(s, causal)
				if err != nil {
					t.Fatal(err)
				}
				mask := denseMask(s, o, mc.def(s, causal, pat))
				vis := func(b, i, j int) bool { return mask[(b*s.N+i)*s.M+j] }
				q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
				g := ref.Normal(rng, s.QLen())
				out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
				if err := a.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
					t.Fatal(err)
				}
				dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
				if err := a.Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv); err != nil {
					t.Fatal(err)
				}
				name := fmt.Sprintf("%s %+v causal=%v kvlen=%v", mc.name, s, causal, o.KVLen)
				scale := float64(o.ScaleFor(s.D))
				q64, k64, v64, g64 := f64(q), f64(k), f64(v), f64(g)
				_, wq, wk, wv := attention64(s, q64, k64, v64, g64, scale, vis)
				grads := []struct {
					name string
					in   []float64
					got  []float32
					want []float64
				}{{"dq", q64, dq, wq}, {"dk", k64, dk, wk}, {"dv", v64, dv, wv}}
				for _, x := range grads {
					if e := ref.RelErr(x.got, x.want); e > 1e-4 {
						t.Errorf("%s: %s rel err %.3g", name, x.name, e)
					}
				}
				if testing.Short() && si > 0 {
					continue
				}
				loss := func() float64 {
					out, _, _, _ := attention64(s, q64, k64, v64, g64, scale, vis)
					l := 0.0
					for i := range out {
						l += out[i] * g64[i]
					}
					return l
				}
				const h = 1e-5
				for _, x := range grads {
					fd := make([]float64, len(x.in))
					for i, x0 := range x.in {
						x.in[i] = x0 + h
						lp := loss()
						x.in[i] = x0 - h
						lm := loss()
						x.in[i] = x0
						fd[i] = (lp - lm) / (2 * h)
					}
					if e := ref.RelErr(x.got, fd); e > 1e-4 {
						t.Errorf("%s: %s vs finite differences: rel err %.3g", name, x.name, e)
					}
				}
			}
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	a, err := NewBigBird(BigBirdConfig{Block: 4})
	if err != nil {
		t.Fatal(err)
	}
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 5, M: 5, D: 3}
	q, k := make([]float32, s.QLen()), make([]float32, s.KVLen())
	lse := make([]float32, s.LSELen())
	for _, tc := range []struct {
		name        string
		s           attn.Shape
		lse, dq, dk []float32
	}{
		{"nil lse", s, nil, q, k},
		{"short dq", s, lse, q[:1], k},
		{"short dk", s, lse, q, k[1:]},
		{"bad shape", attn.Shape{B: 1, H: 3, HKV: 2, N: 5, M: 5, D: 3}, lse, q, k},
	} {
		err := a.Backward(context.Background(), tc.s, q, k, k, q, tc.lse, q, attn.Options{}, tc.dq, tc.dk, slices.Clone(k))
		if !errors.Is(err, attn.ErrShape) {
			t.Errorf("%s: err %v, want ErrShape", tc.name, err)
		}
	}
}
