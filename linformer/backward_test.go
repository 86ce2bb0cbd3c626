package linformer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// freshSeed returns a fresh seed for a test's random inputs and logs it;
// LINFORMER_SEED=<seed> reruns the tests with that seed.
func freshSeed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("LINFORMER_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 0, 64); err != nil {
			t.Fatalf("LINFORMER_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (LINFORMER_SEED=%d reruns it)", seed, seed)
	return seed
}

// grads are the gradients of one backward pass.
type grads struct{ dq, dk, dv, dE, dF []float32 }

func backwardAll(t testing.TB, l *Linformer, s attn.Shape, q, k, v, dout []float32, o attn.Options) grads {
	t.Helper()
	out, lse := forward(t, l, s, q, k, v, o)
	g := grads{
		dq: make([]float32, s.QLen()), dk: make([]float32, s.KVLen()), dv: make([]float32, s.KVLen()),
		dE: make([]float32, s.M*l.K()), dF: make([]float32, s.M*l.K()),
	}
	// Garbage in the outputs: they must be overwritten.
	for _, x := range [][]float32{g.dq, g.dk, g.dv, g.dE, g.dF} {
		for i := range x {
			x[i] = float32(math.NaN())
		}
	}
	if err := l.BackwardProjections(context.Background(), s, q, k, v, out, lse, dout, o, g.dq, g.dk, g.dv, g.dE, g.dF); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return g
}

func widen(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// loss64 is Σ out·dout for Linformer evaluated in float64 from its
// definition, with every input (E and F m×k included) a float64 that
// finite differences can perturb.
func loss64(s attn.Shape, kk int, q, k, v, e, f, dout []float64, o attn.Options) float64 {
	d := s.D
	scale := float64(o.ScaleFor(d))
	loss := 0.0
	kp := make([]float64, kk*d)
	vp := make([]float64, kk*d)
	logit := make([]float64, kk)
	for b := range s.B {
		end := o.KeyEnd(s, b)
		if end == 0 {
			continue // out 0
		}
		for kvh := range s.HKV {
			clear(kp)
			clear(vp)
			for j := range end {
				src := ((b*s.HKV+kvh)*s.M + j) * d
				for p := range kk {
					for c := range d {
						kp[p*d+c] += e[j*kk+p] * k[src+c]
						vp[p*d+c] += f[j*kk+p] * v[src+c]
					}
				}
			}
			for h := kvh * s.Group(); h < (kvh+1)*s.Group(); h++ {
				for i := range s.N {
					row := (b*s.H+h)*s.N + i
					mx := math.Inf(-1)
					for p := range kk {
						logit[p] = 0
						for c := range d {
							logit[p] += q[row*d+c] * kp[p*d+c]
						}
						logit[p] *= scale
						mx = max(mx, logit[p])
					}
					sum := 0.0
					for p := range kk {
						logit[p] = math.Exp(logit[p] - mx)
						sum += logit[p]
					}
					for c := range d {
						o := 0.0
						for p := range kk {
							o += logit[p] * vp[p*d+c]
						}
						loss += o / sum * dout[row*d+c]
					}
				}
			}
		}
	}
	return loss
}

// refGrads is the float64 reference gradient: ref.AttentionBackward of Q
// against the projected keys and values (K' = Eᵀ·K, V' = Fᵀ·V over the
// valid keys, in float64 then rounded to the float32 ref takes), chained
// with the projections' transposes: dK = E·dK', dE = Σ K·dK'ᵀ.
func refGrads(t testing.TB, l *Linformer, s attn.Shape, q, k, v, dout []float32, o attn.Options) (dq, dk, dv, dE, dF []float64) {
	t.Helper()
	e, f, err := l.Projections(s.M)
	if err != nil {
		t.Fatal(err)
	}
	kk, d := l.K(), s.D
	ps := attn.Shape{B: s.B, H: s.H, HKV: s.HKV, N: s.N, M: kk, D: d}
	kp, vp := make([]float32, ps.KVLen()), make([]float32, ps.KVLen())
	po := attn.Options{KVLen: make([]int, s.B)}
	for b := range s.B {
		end := o.KeyEnd(s, b)
		if end > 0 {
			po.KVLen[b] = kk // a row with no valid key sees no projected key
		}
		for kvh := range s.HKV {
			n := b*s.HKV + kvh
			for p := range kk {
				for c := range d {
					var x, y float64
					for j := range end {
						x += float64(e[j*kk+p]) * float64(k[(n*s.M+j)*d+c])
						y += float64(f[j*kk+p]) * float64(v[(n*s.M+j)*d+c])
					}
					kp[(n*kk+p)*d+c], vp[(n*kk+p)*d+c] = float32(x), float32(y)
				}
			}
		}
	}
	dq, dkp, dvp, err := ref.AttentionBackward(ps, q, kp, vp, dout, ref.Spec{Scale: float64(o.ScaleFor(d)), Mask: ref.Mask(ps, po)})
	if err != nil {
		t.Fatal(err)
	}
	dk, dv = make([]float64, s.KVLen()), make([]float64, s.KVLen())
	dE, dF = make([]float64, s.M*kk), make([]float64, s.M*kk)
	for b := range s.B {
		for kvh := range s.HKV {
			n := b*s.HKV + kvh
			for j := range o.KeyEnd(s, b) {
				for p := range kk {
					for c := range d {
						gk, gv := dkp[(n*kk+p)*d+c], dvp[(n*kk+p)*d+c]
						dk[(n*s.M+j)*d+c] += float64(e[j*kk+p]) * gk
						dv[(n*s.M+j)*d+c] += float64(f[j*kk+p]) * gv
						dE[j*kk+p] += float64(k[(n*s.M+j)*d+c]) * gk
						dF[j*kk+p] += float64(v[(n*s.M+j)*d+c]) * gv
					}
				}
			}
		}
	}
	return dq, dk, dv, dE, dF
}

type gradCase struct {
	s      attn.Shape
	k      int
	kvlen  []int // nil: no padding; -1 entries are drawn
	scale  float32
	supply bool // E and F supplied, longer than M
	fd     bool // check against finite differences too
}

func gradCases() []gradCase {
	odd := attn.Shape{B: 2, H: 6, HKV: 2, N: 37, M: 37, D: 13}
	return []gradCase{
		{s: odd, k: 11, fd: true},
		{s: odd, k: 11, kvlen: []int{-1, 0}, scale: 0.3, fd: true},
		{s: attn.Shape{B: 3, H: 4, HKV: 1, N: 19, M: 45, D: 16}, k: 20, kvlen: []int{-1, 45, 1}, supply: true, fd: true},
		{s: attn.Shape{B: 1, H: 2, HKV: 2, N: 5, M: 3, D: 7}, k: 17, fd: true}, // k > M
		{s: attn.Shape{B: 2, H: 4, HKV: 2, N: 50, M: 300, D: 24}, k: 33, kvlen: []int{-1, 300}},
		{s: attn.Shape{B: 1, H: 3, HKV: 1, N: 70, M: 530, D: 40}, k: 64, supply: true},
	}
}

func (c gradCase) build(t testing.TB, rng *rand.Rand, seed uint64) (*Linformer, attn.Options) {
	t.Helper()
	o := attn.Options{Scale: c.scale}
	if c.kvlen != nil {
		o.KVLen = slices.Clone(c.kvlen)
		for b, n := range o.KVLen {
			if n < 0 {
				o.KVLen[b] = 1 + rng.IntN(c.s.M-1)
			}
		}
	}
	l := mustNew(t, Config{K: c.k, Seed: seed})
	if c.supply {
		e, f, err := l.Projections(c.s.M + 9)
		if err != nil {
			t.Fatal(err)
		}
		l = mustNew(t, Config{K: c.k, E: e, F: f})
	}
	return l, o
}

// TestBackwardAgainstReference compares every gradient with the float64
// reference chained through the projections.
func TestBackwardAgainstReference(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, c := range gradCases() {
		l, o := c.build(t, rng, seed)
		o.Workers = 1 + rng.IntN(3)
		name := fmt.Sprintf("%+v k=%d kvlen=%v supplied=%v", c.s, c.k, o.KVLen, c.supply)
		q, k, v := inputs(rng, c.s)
		dout := ref.Normal(rng, c.s.QLen())
		g := backwardAll(t, l, c.s, q, k, v, dout, o)
		dq, dk, dv, dE, dF := refGrads(t, l, c.s, q, k, v, dout, o)
		for _, x := range []struct {
			name string
			got  []float32
			want []float64
		}{{"dq", g.dq, dq}, {"dk", g.dk, dk}, {"dv", g.dv, dv}, {"dE", g.dE, dE}, {"dF", g.dF, dF}} {
			if e := ref.RelErr(x.got, x.want); e > 1e-4 {
				t.Errorf("%s: %s rel err %.3g", name, x.name, e)
			}
		}
		checkPadding(t, name, c.s, l.K(), o, g)
	}
}

// checkPadding asks for exact zeros where nothing flows: padded keys,
// rows of E and F past every valid length, and the queries of a batch row
// with no valid key.
func checkPadding(t *testing.T, name string, s attn.Shape, kk int, o attn.Options, g grads) {
	t.Helper()
	longest := 0
	for b := range s.B {
		end := o.KeyEnd(s, b)
		longest = max(longest, end)
		for kvh := range s.HKV {
			n := b*s.HKV + kvh
			for i := (n*s.M + end) * s.D; i < (n+1)*s.M*s.D; i++ {
				if g.dk[i] != 0 || g.dv[i] != 0 {
					t.Fatalf("%s: padded key %d of pair %d: dk %v dv %v", name, i/s.D-n*s.M, n, g.dk[i], g.dv[i])
				}
			}
		}
		if end == 0 {
			for i, x := range g.dq[b*s.H*s.N*s.D : (b+1)*s.H*s.N*s.D] {
				if x != 0 {
					t.Fatalf("%s: batch row %d sees no key, dq[%d] = %v", name, b, i, x)
				}
			}
		}
	}
	for i := longest * kk; i < s.M*kk; i++ {
		if g.dE[i] != 0 || g.dF[i] != 0 {
			t.Fatalf("%s: row %d of E, F is past every valid length: dE %v dF %v", name, i/kk, g.dE[i], g.dF[i])
		}
	}
}

// TestBackwardFiniteDifferences checks the float64 reference gradient and
// the mechanism's against central differences of the float64 formula,
// on sampled entries of every input, E and F included.
func TestBackwardFiniteDifferences(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	samples := 40
	if testing.Short() {
		samples = 12
	}
	for _, c := range gradCases() {
		if !c.fd {
			continue
		}
		l, o := c.build(t, rng, seed)
		name := fmt.Sprintf("%+v k=%d kvlen=%v", c.s, c.k, o.KVLen)
		q, k, v := inputs(rng, c.s)
		dout := ref.Normal(rng, c.s.QLen())
		g := backwardAll(t, l, c.s, q, k, v, dout, o)
		dq, dk, dv, dE, dF := refGrads(t, l, c.s, q, k, v, dout, o)
		e, f, _ := l.Projections(c.s.M)
		x := [][]float64{widen(q), widen(k), widen(v), widen(e), widen(f)}
		d64 := widen(dout)
		loss := func() float64 { return loss64(c.s, l.K(), x[0], x[1], x[2], x[3], x[4], d64, o) }
		for n, in := range []struct {
			name string
			got  []float32
			want []float64
		}{{"dq", g.dq, dq}, {"dk", g.dk, dk}, {"dv", g.dv, dv}, {"dE", g.dE, dE}, {"dF", g.dF, dF}} {
			big := 0.0
			for _, w := range in.want {
				big = max(big, math.Abs(w))
			}
			for range samples {
				i := rng.IntN(len(in.want))
				const h = 1e-6
				old := x[n][i]
				x[n][i] = old + h
				up := loss()
				x[n][i] = old - h
				down := loss()
				x[n][i] = old
				fd := (up - down) / (2 * h)
				if math.Abs(fd-in.want[i]) > 1e-6*max(1, big) {
					t.Errorf("%s: %s[%d] reference %.9g, finite differences %.9g", name, in.name, i, in.want[i], fd)
				}
				if math.Abs(fd-float64(in.got[i])) > 1e-4*max(1, big) {
					t.Errorf("%s: %s[%d] = %.7g, finite differences %.7g", name, in.name, i, in.got[i], fd)
				}
			}
		}
	}
}

// TestBackwardWorkers asks for the same bits with any worker count, on a
// shape with several blocks of keys and fewer pairs than workers.
func TestBackwardWorkers(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	for _, s := range []attn.Shape{
		{B: 2, H: 4, HKV: 2, N: 70, M: 600, D: 20},
		{B: 1, H: 3, HKV: 1, N: 33, M: 513, D: 32},
	} {
		l := mustNew(t, Config{K: 40, Seed: seed})
		q, k, v := inputs(rng, s)
		dout := ref.Normal(rng, s.QLen())
		kvlen := make([]int, s.B)
		for b := range kvlen {
			kvlen[b] = 257 + rng.IntN(s.M-257)
		}
		var want grads
		for _, w := range []int{1, 2, 3, 8} {
			g := backwardAll(t, l, s, q, k, v, dout, attn.Options{Workers: w, KVLen: kvlen})
			if w == 1 {
				want = g
				continue
			}
			for _, x := range []struct {
				name      string
				got, want []float32
			}{{"dq", g.dq, want.dq}, {"dk", g.dk, want.dk}, {"dv", g.dv, want.dv}, {"dE", g.dE, want.dE}, {"dF", g.dF, want.dF}} {
				if !slices.Equal(x.got, x.want) {
					t.Errorf("%+v kvlen %v: %s with %d workers differs from 1 worker", s, kvlen, x.name, w)
				}
			}
		}
	}
}

// TestBackwardPaddingIgnored puts huge values in padded keys and values:
// no gradient may change, and Backward must agree with
// BackwardProjections bit for bit.
func TestBackwardPaddingIgnored(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 4))
	l := mustNew(t, Config{K: 24, Seed: seed})
	s := attn.Shape{B: 3, H: 4, HKV: 2, N: 21, M: 290, D: 24}
	o := attn.Options{KVLen: []int{rng.IntN(s.M + 1), 0, 260 + rng.IntN(30)}}
	q, k, v := inputs(rng, s)
	dout := ref.Normal(rng, s.QLen())
	g1 := backwardAll(t, l, s, q, k, v, dout, o)
	for b := range s.B {
		for kvh := range s.HKV {
			for i := ((b*s.HKV+kvh)*s.M + o.KVLen[b]) * s.D; i < (b*s.HKV+kvh+1)*s.M*s.D; i++ {
				k[i] = 1e4 * float32(rng.NormFloat64())
				v[i] = 1e4 * float32(rng.NormFloat64())
			}
		}
	}
	g2 := backwardAll(t, l, s, q, k, v, dout, o)
	for _, x := range [][2][]float32{{g1.dq, g2.dq}, {g1.dk, g2.dk}, {g1.dv, g2.dv}, {g1.dE, g2.dE}, {g1.dF, g2.dF}} {
		if !slices.Equal(x[0], x[1]) {
			t.Fatalf("kvlen %v: padded keys changed the gradients", o.KVLen)
		}
	}
	checkPadding(t, fmt.Sprint(o.KVLen), s, l.K(), o, g1)

	out, lse := forward(t, l, s, q, k, v, o)
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	if err := l.Backward(context.Background(), s, q, k, v, out, lse, dout, o, dq, dk, dv); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dq, g2.dq) || !slices.Equal(dk, g2.dk) || !slices.Equal(dv, g2.dv) {
		t.Error("Backward and BackwardProjections differ")
	}
}

func TestBackwardErrors(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 50, D: 5}
	l := mustNew(t, Config{K: 8, Length: 50})
	q, k, v := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out, lse, dout := make([]float32, s.QLen()), make([]float32, s.LSELen()), make([]float32, s.QLen())
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	dE, dF := make([]float32, s.M*8), make([]float32, s.M*8)
	ctx := context.Background()
	bw := func(s attn.Shape, o attn.Options, lse, dq, dE []float32) error {
		return l.BackwardProjections(ctx, s, q, k, v, out, lse, dout, o, dq, dk, dv, dE, dF)
	}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"causal", bw(s, attn.Options{Causal: true}, lse, dq, dE), attn.ErrUnsupported},
		{"causal Backward", l.Backward(ctx, s, q, k, v, out, lse, dout, attn.Options{Causal: true}, dq, dk, dv), attn.ErrUnsupported},
		{"nil lse", bw(s, attn.Options{}, nil, dq, dE), attn.ErrShape},
		{"short dq", bw(s, attn.Options{}, lse, dq[1:], dE), attn.ErrShape},
		{"short dE", bw(s, attn.Options{}, lse, dq, dE[1:]), attn.ErrShape},
		{"nil dE", bw(s, attn.Options{}, lse, dq, nil), attn.ErrShape},
		{"kvlen 51", bw(s, attn.Options{KVLen: []int{51}}, lse, dq, dE), attn.ErrInput},
		{"M > length", l.Backward(ctx, attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 51, D: 1},
			make([]float32, 1), make([]float32, 51), make([]float32, 51), make([]float32, 1), make([]float32, 1), make([]float32, 1),
			attn.Options{}, make([]float32, 1), make([]float32, 51), make([]float32, 51)), attn.ErrUnsupported},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.BackwardProjections(cctx, s, q, k, v, out, lse, dout, attn.Options{}, dq, dk, dv, dE, dF); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

func TestSetProjections(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	const kk, m = 12, 30
	fresh := mustNew(t, Config{K: kk, Seed: seed})
	e0, f0, _ := fresh.Projections(50)
	e, f := ref.Normal(rng, m*kk), ref.Normal(rng, m*kk)
	// Set before any row is drawn, and after more rows than m are.
	late := mustNew(t, Config{K: kk, Seed: seed})
	late.Projections(40)
	for _, l := range []*Linformer{mustNew(t, Config{K: kk, Seed: seed}), late} {
		if err := l.SetProjections(m, e, f); err != nil {
			t.Fatal(err)
		}
		ge, gf, _ := l.Projections(50)
		if !slices.Equal(ge[:m*kk], e) || !slices.Equal(gf[:m*kk], f) {
			t.Error("rows set are not the rows given")
		}
		if !slices.Equal(ge[m*kk:], e0[m*kk:]) || !slices.Equal(gf[m*kk:], f0[m*kk:]) {
			t.Error("rows past m are not the seed's")
		}
	}
	// Forward and the gradients follow the new projections.
	l := mustNew(t, Config{K: kk, Seed: seed})
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 9, M: m, D: 5}
	q, k, v := inputs(rng, s)
	before, _ := forward(t, l, s, q, k, v, attn.Options{})
	// A call in flight holds these: SetProjections must not write them.
	held, _ := l.projections(m)
	heldCopy := slices.Clone(held)
	if err := l.SetProjections(m, e, f); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(held, heldCopy) {
		t.Error("SetProjections wrote over rows that a call in flight may hold")
	}
	after, lse := forward(t, l, s, q, k, v, attn.Options{})
	want, wantLSE := formula(l, s, q, k, v, attn.Options{})
	if slices.Equal(before, after) {
		t.Error("SetProjections did not change the output")
	}
	if e := ref.RelErr(after, want); e > tol {
		t.Errorf("out rel err %.3g after SetProjections", e)
	}
	if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
		t.Errorf("lse rel err %.3g %v after SetProjections", e, err)
	}

	supplied := mustNew(t, Config{K: kk, E: e0, F: f0})
	for _, c := range []struct {
		m    int
		e, f []float32
	}{
		{51, make([]float32, 51*kk), make([]float32, 51*kk)},
		{-1, nil, nil},
		{m, e[1:], f},
		{m, e, nil},
		{1, append(make([]float32, kk-1), float32(math.Inf(1))), make([]float32, kk)},
	} {
		if err := supplied.SetProjections(c.m, c.e, c.f); err == nil {
			t.Errorf("SetProjections(%d, len %d, len %d) accepted", c.m, len(c.e), len(c.f))
		}
	}
	if ge, gf, _ := supplied.Projections(50); !slices.Equal(ge, e0) || !slices.Equal(gf, f0) {
		t.Error("a refused SetProjections changed the projections")
	}
}

// TestSetProjectionsConcurrent runs Forward while SetProjections swaps
// between two sets of projections: each output must be that of one set,
// never a mix. The simd kernels are assembly, which the race detector
// does not see: go test -race -tags purego checks the reads too.
func TestSetProjectionsConcurrent(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 6))
	const kk = 16
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 8, M: 400, D: 8}
	q, k, v := inputs(rng, s)
	sets := [2][2][]float32{}
	outs := [2][]float32{}
	l := mustNew(t, Config{K: kk})
	for i := range sets {
		sets[i] = [2][]float32{ref.Normal(rng, s.M*kk), ref.Normal(rng, s.M*kk)}
		if err := l.SetProjections(s.M, sets[i][0], sets[i][1]); err != nil {
			t.Fatal(err)
		}
		outs[i], _ = forward(t, l, s, q, k, v, attn.Options{Workers: 1})
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := l.SetProjections(s.M, sets[i%2][0], sets[i%2][1]); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	out := make([]float32, s.QLen())
	for range 30 {
		if err := l.Forward(context.Background(), s, q, k, v, attn.Options{Workers: 1}, out, nil); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out, outs[0]) && !slices.Equal(out, outs[1]) {
			t.Fatal("a Forward running alongside SetProjections mixed two sets of projections")
		}
	}
	close(stop)
	wg.Wait()
}
