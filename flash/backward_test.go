package flash

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// gradTol bounds the relative error (Frobenius norm) of each gradient
// against the float64 one.
const gradTol = 1e-4

// gradVis says whether query i of batch row b sees key j.
type gradVis func(b, i, j int) bool

// gradVisOf is the visibility of o's causal and padding masks (from
// ref.Mask, written from package attn's definitions) and, when pat is not
// nil, of the pattern at absolute positions.
func gradVisOf(s attn.Shape, o attn.Options, pat Pattern) gradVis {
	mask := ref.Mask(s, o)
	return func(b, i, j int) bool {
		return mask[(b*s.N+i)*s.M+j] && (pat == nil || pat.Visible(s.M-s.N+i, j))
	}
}

// attention64 is softmax attention in float64 under vis: out and lse, a
// row that sees nothing having out 0 and lse -Inf.
func attention64(s attn.Shape, q, k, v []float64, scale float64, vis gradVis) (out, lse []float64) {
	d := s.D
	out = make([]float64, s.QLen())
	lse = make([]float64, s.LSELen())
	logit := make([]float64, s.M)
	for b := range s.B {
		for h := range s.H {
			kv := (b*s.HKV + h/s.Group()) * s.M
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				mx := math.Inf(-1)
				for j := range s.M {
					logit[j] = math.Inf(-1)
					if vis(b, i, j) {
						logit[j] = scale * dot64(q[row*d:][:d], k[(kv+j)*d:][:d])
						mx = math.Max(mx, logit[j])
					}
				}
				lse[row] = mx
				if math.IsInf(mx, -1) {
					continue
				}
				sum := 0.0
				for j := range s.M {
					if vis(b, i, j) {
						p := math.Exp(logit[j] - mx)
						sum += p
						for c := range d {
							out[row*d+c] += p * v[(kv+j)*d+c]
						}
					}
				}
				for c := range d {
					out[row*d+c] /= sum
				}
				lse[row] = mx + math.Log(sum)
			}
		}
	}
	return out, lse
}

// gradients64 is the float64 reference gradient of L = Σ dout ∘ out with
// respect to q, k and v under vis: ref.AttentionBackward with vis as its
// dense mask, the one reference every mechanism's backward is tested by.
func gradients64(t testing.TB, s attn.Shape, q, k, v, dout []float32, scale float64, vis gradVis) (dq, dk, dv []float64) {
	t.Helper()
	mask := make([]bool, s.B*s.N*s.M)
	for b := range s.B {
		for i := range s.N {
			for j := range s.M {
				mask[(b*s.N+i)*s.M+j] = vis(b, i, j)
			}
		}
	}
	dq, dk, dv, err := ref.AttentionBackward(s, q, k, v, dout, ref.Spec{Scale: scale, Mask: mask})
	if err != nil {
		t.Fatal(err)
	}
	return dq, dk, dv
}

func dot64(x, y []float64) float64 {
	s := 0.0
	for i := range x {
		s += x[i] * y[i]
	}
	return s
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func relErr64(got, want []float64) float64 {
	var diff, norm float64
	for i := range got {
		diff += (got[i] - want[i]) * (got[i] - want[i])
		norm += want[i] * want[i]
	}
	if norm == 0 {
		return math.Sqrt(diff)
	}
	return math.Sqrt(diff / norm)
}

// gradCase is one backward call: inputs, the forward's out and lse from
// the kernel, and the gradients Backward wrote.
type gradCase struct {
	s                       attn.Shape
	o                       attn.Options
	pat                     Pattern
	q, k, v, out, lse, dout []float32
	dq, dk, dv              []float32
	bq, bk                  int // tiles; 0: Backward's own
	name                    string
}

// newGradCase draws inputs and computes the forward pass's out and lse
// with the float64 reference, rounded to float32, so that the backward
// pass is checked on its own; TestBackwardAfterForward uses the kernel's.
func newGradCase(t *testing.T, rng *rand.Rand, s attn.Shape, o attn.Options, pat Pattern, bq, bk int) *gradCase {
	t.Helper()
	c := &gradCase{s: s, o: o, pat: pat, bq: bq, bk: bk,
		q: ref.Normal(rng, s.QLen()), k: ref.Normal(rng, s.KVLen()), v: ref.Normal(rng, s.KVLen()),
		dout: ref.Normal(rng, s.QLen()),
	}
	c.name = fmt.Sprintf("%+v causal=%v kvlen=%v scale=%v pat=%T tiles=%d/%d", s, o.Causal, o.KVLen, o.Scale, pat, bq, bk)
	vis := gradVisOf(s, o, pat)
	mask := make([]bool, s.B*s.N*s.M)
	for b := range s.B {
		for i := range s.N {
			for j := range s.M {
				mask[(b*s.N+i)*s.M+j] = vis(b, i, j)
			}
		}
	}
	out, lse, err := ref.Attention(s, c.q, c.k, c.v, ref.Spec{Scale: float64(o.Scale), Mask: mask})
	if err != nil {
		t.Fatalf("%s: reference forward: %v", c.name, err)
	}
	c.out, c.lse = to32(out), to32(lse)
	return c
}

func to32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

// backward runs the kernel's backward pass on c into fresh gradients
// filled with NaN, which it must overwrite.
func (c *gradCase) backward(t *testing.T) {
	t.Helper()
	nan := float32(math.NaN())
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = nan
		}
		return x
	}
	c.dq, c.dk, c.dv = fill(c.s.QLen()), fill(c.s.KVLen()), fill(c.s.KVLen())
	var err error
	if c.bq == 0 {
		err = New(Config{}).Backward(context.Background(), c.s, c.q, c.k, c.v, c.out, c.lse, c.dout, c.o, c.pat, c.dq, c.dk, c.dv)
	} else {
		err = backward(context.Background(), c.s, c.q, c.k, c.v, c.out, c.lse, c.dout, c.o, c.pat, c.dq, c.dk, c.dv, c.bq, c.bk)
	}
	if err != nil {
		t.Fatalf("%s: backward: %v", c.name, err)
	}
}

// check compares c's gradients with the float64 analytic ones.
func (c *gradCase) check(t *testing.T) {
	t.Helper()
	vis := gradVisOf(c.s, c.o, c.pat)
	scale := float64(c.o.ScaleFor(c.s.D))
	dq, dk, dv := gradients64(t, c.s, c.q, c.k, c.v, c.dout, scale, vis)
	for _, g := range []struct {
		name string
		got  []float32
		want []float64
	}{{"dq", c.dq, dq}, {"dk", c.dk, dk}, {"dv", c.dv, dv}} {
		if e := ref.RelErr(g.got, g.want); e > gradTol {
			t.Errorf("%s: %s rel err %.3g", c.name, g.name, e)
		}
	}
}

// gradTiles are the tile sizes the correctness tests run: Backward's own
// and small ones (16 query positions, 7 keys) that put boundaries
// everywhere and split each (batch row, kv head) into several runs.
var gradTiles = [][2]int{{0, 0}, {16, 7}, {32, 20}}

func TestBackwardAgainstReference(t *testing.T) {
	rng := ref.FreshRNG(t, 11) // fresh inputs every run
	dims := [][2]int{{1, 1}, {37, 37}, {29, 70}, {70, 29}, {1, 131}, {131, 45}}
	groups := [][2]int{{4, 4}, {4, 2}, {4, 1}}
	n := 0
	for _, nm := range dims {
		for _, hg := range groups {
			for _, causal := range []bool{false, true} {
				n++
				s := attn.Shape{B: 2, H: hg[0], HKV: hg[1], N: nm[0], M: nm[1], D: []int{24, 40}[n%2]}
				o := attn.Options{Causal: causal}
				if n%3 != 0 {
					o.KVLen = []int{rng.IntN(s.M + 1), s.M}
					if n%3 == 1 {
						o.KVLen[1] = 0
					}
				}
				if n%4 == 0 {
					o.Scale = 0.3
				}
				tl := gradTiles[n%len(gradTiles)]
				c := newGradCase(t, rng, s, o, nil, tl[0], tl[1])
				c.backward(t)
				c.check(t)
			}
		}
	}
}

// TestBackwardFiniteDifferences checks the float64 analytic gradient, and
// through it the kernel, against central differences of the float64 loss
// L = Σ dout ∘ out, element by element of q, k and v.
func TestBackwardFiniteDifferences(t *testing.T) {
	rng := ref.FreshRNG(t, 12)
	cases := []struct {
		s   attn.Shape
		o   attn.Options
		pat Pattern
	}{
		{attn.Shape{B: 1, H: 4, HKV: 2, N: 9, M: 13, D: 24}, attn.Options{}, nil},
		{attn.Shape{B: 1, H: 4, HKV: 1, N: 13, M: 6, D: 24}, attn.Options{Causal: true}, nil},
		{attn.Shape{B: 2, H: 4, HKV: 2, N: 11, M: 11, D: 40}, attn.Options{Causal: true, KVLen: []int{7, 0}}, nil},
		{attn.Shape{B: 2, H: 4, HKV: 1, N: 10, M: 17, D: 24}, attn.Options{KVLen: []int{17, 5}, Scale: 0.5}, nil},
		{attn.Shape{B: 1, H: 4, HKV: 2, N: 12, M: 15, D: 24}, attn.Options{Causal: true}, gradBand{left: 4, right: 2}},
		{attn.Shape{B: 1, H: 4, HKV: 1, N: 15, M: 12, D: 24}, attn.Options{}, gradBand{left: 3, right: 5}},
	}
	for _, tc := range cases {
		c := newGradCase(t, rng, tc.s, tc.o, tc.pat, 16, 7)
		c.backward(t)
		c.check(t)

		s := tc.s
		vis := gradVisOf(s, tc.o, tc.pat)
		scale := float64(tc.o.ScaleFor(s.D))
		q, k, v, g := to64(c.q), to64(c.k), to64(c.v), to64(c.dout)
		loss := func() float64 {
			out, _ := attention64(s, q, k, v, scale, vis)
			return dot64(out, g)
		}
		dq, dk, dv := gradients64(t, s, c.q, c.k, c.v, c.dout, scale, vis)
		const h = 1e-5
		for _, x := range []struct {
			name string
			in   []float64
			an   []float64
			got  []float32
		}{{"dq", q, dq, c.dq}, {"dk", k, dk, c.dk}, {"dv", v, dv, c.dv}} {
			fd := make([]float64, len(x.in))
			for i, x0 := range x.in {
				x.in[i] = x0 + h
				lp := loss()
				x.in[i] = x0 - h
				lm := loss()
				x.in[i] = x0
				fd[i] = (lp - lm) / (2 * h)
			}
			if e := relErr64(x.an, fd); e > 1e-7 {
				t.Errorf("%s: %s: analytic float64 gradient vs finite differences: rel err %.3g", c.name, x.name, e)
			}
			if e := ref.RelErr(x.got, fd); e > gradTol {
				t.Errorf("%s: %s: kernel vs finite differences: rel err %.3g", c.name, x.name, e)
			}
		}
	}
}

// TestBackwardEmptyRows: rows that see no key (causal with N > M, a key
// length of 0) get exactly zero dq, keys no row sees get zero dk and dv,
// and padded keys holding NaN change nothing.
func TestBackwardEmptyRows(t *testing.T) {
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 40, M: 23, D: 24}
	o := attn.Options{Causal: true, KVLen: []int{19, 0}}
	rng := rand.New(rand.NewPCG(13, 13))
	for _, tl := range gradTiles {
		c := &gradCase{s: s, o: o, bq: tl[0], bk: tl[1], name: fmt.Sprintf("tiles %v", tl),
			q: ref.Normal(rng, s.QLen()), k: ref.Normal(rng, s.KVLen()), v: ref.Normal(rng, s.KVLen()),
			dout: ref.Normal(rng, s.QLen()),
		}
		nan := float32(math.NaN())
		for kvh := range s.HKV {
			for j := 19; j < s.M; j++ {
				row := (0*s.HKV+kvh)*s.M + j
				c.k[row*s.D], c.v[row*s.D] = nan, nan
			}
		}
		// The reference's out and lse: it never reads a padded key.
		out, lse, err := ref.Attention(s, c.q, c.k, c.v, ref.Spec{Mask: ref.Mask(s, o)})
		if err != nil {
			t.Fatal(err)
		}
		c.out, c.lse = to32(out), to32(lse)
		c.backward(t)
		for row := range s.LSELen() {
			b, i := row/(s.H*s.N), row%s.N
			empty := b == 1 || i < s.N-s.M
			for _, x := range c.dq[row*s.D:][:s.D] {
				if math.IsNaN(float64(x)) || (empty && x != 0) {
					t.Fatalf("%s: dq row %d (b=%d i=%d): %v", c.name, row, b, i, c.dq[row*s.D:][:s.D])
				}
			}
		}
		for row := range s.B * s.HKV * s.M {
			b, j := row/(s.HKV*s.M), row%s.M
			unseen := b == 1 || j >= 19
			for _, g := range [][]float32{c.dk, c.dv} {
				for _, x := range g[row*s.D:][:s.D] {
					if math.IsNaN(float64(x)) || (unseen && x != 0) {
						t.Fatalf("%s: key row %d (b=%d j=%d): %v", c.name, row, b, j, g[row*s.D:][:s.D])
					}
				}
			}
		}
		// The NaNs sit in keys no query sees: the others must match the
		// reference with the NaNs replaced by anything.
		for kvh := range s.HKV {
			for j := 19; j < s.M; j++ {
				row := kvh*s.M + j
				c.k[row*s.D], c.v[row*s.D] = 0, 0
			}
		}
		c.check(t)
	}
}

// gradBand is a sliding window written for these tests: the query at
// position p sees keys [p-left, p+right]. Its ranges are a Full middle
// between two masked edges, and it has no RowMasker, so the kernel asks
// Visible key by key.
type gradBand struct{ left, right int }

func (w gradBand) Visible(p, j int) bool { return p-w.left <= j && j <= p+w.right }

func (w gradBand) KeyRanges(dst []Range, p0, p1, m int) []Range {
	lo, hi := p0-w.left, p1+w.right       // union of the rows' windows
	flo, fhi := p1-1-w.left, p0+w.right+1 // keys every row sees
	if flo >= fhi {
		return append(dst, Range{Lo: lo, Hi: hi})
	}
	if lo < flo {
		dst = append(dst, Range{Lo: lo, Hi: flo})
	}
	dst = append(dst, Range{Lo: flo, Hi: fhi, Full: true})
	if fhi < hi {
		dst = append(dst, Range{Lo: fhi, Hi: hi})
	}
	return dst
}

// gradStripes hides keys in a pattern with holes inside every tile: one
// masked range of all keys.
type gradStripes struct{}

func (gradStripes) Visible(p, j int) bool { return (p+2*j)%3 != 0 || j%5 == 0 }
func (gradStripes) KeyRanges(dst []Range, p0, p1, m int) []Range {
	return append(dst, Range{Lo: 0, Hi: m})
}

func TestBackwardPattern(t *testing.T) {
	rng := ref.FreshRNG(t, 14)
	pats := []Pattern{gradBand{left: 9, right: 3}, gradBand{left: 40, right: 0}, gradStripes{}, dense{}}
	dims := [][2]int{{70, 130}, {130, 70}, {1, 90}, {97, 97}}
	n := 0
	for _, pat := range pats {
		for _, nm := range dims {
			for _, causal := range []bool{false, true} {
				n++
				s := attn.Shape{B: 2, H: 4, HKV: []int{2, 1}[n%2], N: nm[0], M: nm[1], D: []int{24, 40}[n%2]}
				o := attn.Options{Causal: causal}
				if n%3 == 0 {
					o.KVLen = []int{rng.IntN(s.M + 1), s.M}
				}
				tl := gradTiles[n%len(gradTiles)]
				c := newGradCase(t, rng, s, o, pat, tl[0], tl[1])
				c.backward(t)
				c.check(t)
			}
		}
	}
}

// TestBackwardCausalDiagonal runs the tiles a causal mask cuts with
// Backward's own tile sizes and others, where the products cover only
// the panels of queries that see a block of keys: the diagonal falling
// across tiles at every offset (N ≠ M, bottom-right aligned, N > M
// included), GQA groups, padded key lengths and patterns on top.
func TestBackwardCausalDiagonal(t *testing.T) {
	rng := ref.FreshRNG(t, 19)
	dims := [][2]int{{200, 200}, {192, 192}, {130, 260}, {260, 130}, {100, 171}, {77, 77}}
	tiles := [][2]int{{0, 0}, {32, 48}, {48, 40}, {64, 20}}
	pats := []Pattern{nil, gradBand{left: 70, right: 0}, gradStripes{}}
	n := 0
	for _, nm := range dims {
		for _, tl := range tiles {
			n++
			s := attn.Shape{B: 2, H: 4, HKV: []int{4, 2, 1}[n%3], N: nm[0], M: nm[1], D: []int{64, 24, 40}[n%3]}
			o := attn.Options{Causal: true}
			if n%2 == 0 {
				o.KVLen = []int{s.M - 37, s.M}
			}
			c := newGradCase(t, rng, s, o, pats[n%len(pats)], tl[0], tl[1])
			c.backward(t)
			c.check(t)
		}
	}
}

// TestGradRuns checks the cut of the key tiles into runs: they cover the
// tiles in order, each at least one, with the weights and query tiles of
// their visits.
func TestGradRuns(t *testing.T) {
	for _, tc := range []struct {
		s      attn.Shape
		o      attn.Options
		pat    Pattern
		bq, bk int
	}{
		{attn.Shape{B: 1, H: 8, HKV: 8, N: 2048, M: 2048, D: 64}, attn.Options{Causal: true}, nil, 64, 64},
		{attn.Shape{B: 1, H: 8, HKV: 2, N: 2048, M: 2048, D: 64}, attn.Options{}, nil, 64, 64},
		{attn.Shape{B: 1, H: 4, HKV: 1, N: 300, M: 330, D: 40}, attn.Options{Causal: true}, nil, 16, 7},
		{attn.Shape{B: 2, H: 2, HKV: 1, N: 90, M: 200, D: 24}, attn.Options{Causal: true, KVLen: []int{120, 0}}, gradBand{left: 30, right: 2}, 32, 20},
	} {
		pat := tc.pat
		if pat == nil {
			pat = dense{}
		}
		s := tc.s
		p := newGradPlan(s, nil, nil, nil, nil, nil, nil, tc.o, pat, nil, nil, nil, tc.bq, tc.bk)
		gradArenas.Put(p.arena)
		for b := range s.B {
			kk := p.keys[tc.o.KeyEnd(s, b)]
			if len(kk.runs) != p.segs || len(kk.runW) != p.segs || len(kk.runQT) != p.segs {
				t.Fatalf("%+v: %d runs, want %d", s, len(kk.runs), p.segs)
			}
			next := 0
			for r, run := range kk.runs {
				if run[0] != next || run[1] <= run[0] {
					t.Fatalf("%+v: run %d is %v after tile %d", s, r, run, next)
				}
				next = run[1]
				w := 0
				qts := make([]bool, p.qTiles)
				for kt := run[0]; kt < run[1]; kt++ {
					w += kk.weight[kt]
					for _, vi := range kk.visits[kt] {
						qts[vi.qt] = true
					}
				}
				if w != kk.runW[r] || !slices.Equal(qts, kk.runQT[r]) {
					t.Errorf("%+v: run %d: weight %d (want %d), query tiles %v (want %v)", s, r, kk.runW[r], w, kk.runQT[r], qts)
				}
			}
			if next != p.kTiles {
				t.Fatalf("%+v: runs end at tile %d of %d", s, next, p.kTiles)
			}
		}
	}
}

// TestBackwardAfterForward runs Backward on the out and lse of the
// kernel's own Forward and ForwardPattern, as training does.
func TestBackwardAfterForward(t *testing.T) {
	rng := ref.FreshRNG(t, 17)
	kn := New(Config{})
	ctx := context.Background()
	for n, pat := range []Pattern{nil, gradBand{left: 20, right: 5}} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 4, HKV: 2, N: 150, M: 170, D: 40}
			o := attn.Options{Causal: causal, KVLen: []int{170, 101}}
			c := newGradCase(t, rng, s, o, pat, 0, 0)
			var err error
			if n == 0 {
				err = kn.Forward(ctx, s, c.q, c.k, c.v, o, c.out, c.lse)
			} else {
				err = kn.ForwardPattern(ctx, s, c.q, c.k, c.v, o, pat, c.out, c.lse)
			}
			if err != nil {
				t.Fatal(err)
			}
			c.backward(t)
			c.check(t)
		}
	}
}

// TestBackwardDeterministic: the split of the work and every order of
// summation depend on the shape only, so any worker count gives the same
// bits.
func TestBackwardDeterministic(t *testing.T) {
	rng := ref.FreshRNG(t, 15)
	for _, tc := range []struct {
		s      attn.Shape
		bq, bk int
	}{
		{attn.Shape{B: 1, H: 4, HKV: 1, N: 150, M: 170, D: 40}, 16, 7},
		// Backward's own tiles: diagonal tiles cut into blocks, the keys
		// in runs and the heads in subsets.
		{attn.Shape{B: 1, H: 4, HKV: 1, N: 300, M: 330, D: 40}, 0, 0},
		{attn.Shape{B: 1, H: 2, HKV: 2, N: 520, M: 520, D: 64}, 0, 0},
	} {
		c := newGradCase(t, rng, tc.s, attn.Options{Causal: true}, nil, tc.bq, tc.bk)
		var first [][]float32
		for _, workers := range []int{1, 2, 3, 5, 2} {
			c.o.Workers = workers
			c.backward(t)
			got := [][]float32{c.dq, c.dk, c.dv}
			if first == nil {
				first = got
				continue
			}
			for x := range got {
				for i := range got[x] {
					if math.Float32bits(got[x][i]) != math.Float32bits(first[x][i]) {
						t.Fatalf("%s: workers=%d: gradient %d differs at %d: %v vs %v", c.name, workers, x, i, got[x][i], first[x][i])
					}
				}
			}
		}
		c.check(t)
	}
}

// TestBackwardReusedArena: a call whose buffers come from a pooled arena
// full of NaN (as one left by a call of another shape may hold anything)
// gives the bits of a call on a fresh one; every part of the buffers that
// is read is written first.
func TestBackwardReusedArena(t *testing.T) {
	rng := ref.FreshRNG(t, 18)
	cases := []struct {
		s      attn.Shape
		o      attn.Options
		pat    Pattern
		bq, bk int
	}{
		{attn.Shape{B: 2, H: 4, HKV: 2, N: 150, M: 170, D: 40}, attn.Options{Causal: true, KVLen: []int{170, 101}}, nil, 0, 0},
		{attn.Shape{B: 1, H: 2, HKV: 1, N: 97, M: 60, D: 24}, attn.Options{}, gradBand{left: 9, right: 3}, 16, 7},
		{attn.Shape{B: 1, H: 8, HKV: 8, N: 130, M: 130, D: 64}, attn.Options{Causal: true}, nil, 0, 0},
	}
	nan := float32(math.NaN())
	for _, tc := range cases {
		c := newGradCase(t, rng, tc.s, tc.o, tc.pat, tc.bq, tc.bk)
		runtime.GC() // twice: empty the pool, so that the first call allocates
		runtime.GC()
		c.backward(t)
		want := [][]float32{c.dq, c.dk, c.dv}
		// An arena of the size this call takes, filled with NaN.
		bq, bk := tc.bq, tc.bk
		if bq == 0 {
			bq, bk = gradTileRows, gradTileKeys
		}
		pat := tc.pat
		if pat == nil {
			pat = dense{}
		}
		p := newGradPlan(c.s, c.q, c.k, c.v, c.out, c.lse, c.dout, c.o, pat, c.dq, c.dk, c.dv, bq, bk)
		poison := *p.arena
		for i := range poison {
			poison[i] = nan
		}
		gradArenas.Put(p.arena)
		c.backward(t)
		for x, got := range [][]float32{c.dq, c.dk, c.dv} {
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[x][i]) {
					t.Fatalf("%s: gradient %d differs at %d after a poisoned arena: %v vs %v", c.name, x, i, got[i], want[x][i])
				}
			}
		}
		c.check(t)
	}
}

func TestBackwardErrors(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 20, M: 30, D: 8}
	rng := rand.New(rand.NewPCG(16, 16))
	c := newGradCase(t, rng, s, attn.Options{}, nil, 0, 0)
	kn := New(Config{})
	ctx := context.Background()
	q, k, v, out, lse, g := c.q, c.k, c.v, c.out, c.lse, c.dout
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	for name, call := range map[string]func() error{
		"nil lse":    func() error { return kn.Backward(ctx, s, q, k, v, out, nil, g, attn.Options{}, nil, dq, dk, dv) },
		"nil out":    func() error { return kn.Backward(ctx, s, q, k, v, nil, lse, g, attn.Options{}, nil, dq, dk, dv) },
		"short dout": func() error { return kn.Backward(ctx, s, q, k, v, out, lse, g[1:], attn.Options{}, nil, dq, dk, dv) },
		"short dq":   func() error { return kn.Backward(ctx, s, q, k, v, out, lse, g, attn.Options{}, nil, dq[1:], dk, dv) },
		"long dk": func() error {
			return kn.Backward(ctx, s, q, k, v, out, lse, g, attn.Options{}, nil, dq, append(dk, 0), dv)
		},
		"short dv": func() error { return kn.Backward(ctx, s, q, k, v, out, lse, g, attn.Options{}, nil, dq, dk, dv[:0]) },
		"bad shape": func() error {
			return kn.Backward(ctx, attn.Shape{B: 1, H: 3, HKV: 2, N: 20, M: 30, D: 8}, q, k, v, out, lse, g, attn.Options{}, nil, dq, dk, dv)
		},
	} {
		if err := call(); !errors.Is(err, attn.ErrShape) {
			t.Errorf("%s: got %v, want ErrShape", name, err)
		}
	}
	if err := kn.Backward(ctx, s, q, k, v, out, lse, g, attn.Options{KVLen: []int{31}}, nil, dq, dk, dv); !errors.Is(err, attn.ErrInput) {
		t.Errorf("kvlen past M: got %v, want ErrInput", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := kn.Backward(cctx, s, q, k, v, out, lse, g, attn.Options{}, nil, dq, dk, dv); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v", err)
	}
}

// BenchmarkBackward times a forward and a backward pass at B = 1, H = 8,
// D = 64 and N = M = 2048 (the target: backward at most 2.5 times
// the forward), alternating the two in one loop so that both see the same
// machine load. ns/op is one forward plus one backward; fwd-ms and bwd-ms
// are each pass's mean and bwd/fwd their ratio; bwd/fwd-best is the ratio
// of the fastest of each, less sensitive to other work on a shared
// machine. bwd-GFLOP/s counts 10·B·H·N·M·D flops (halved when causal),
// 2.5 times the forward's conventional count.
func BenchmarkBackward(b *testing.B) {
	for _, hkv := range []int{8, 2} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 1, H: 8, HKV: hkv, N: 2048, M: 2048, D: 64}
			b.Run(fmt.Sprintf("d64/n2048/hkv%d/causal=%v", hkv, causal), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
				g := ref.Normal(rng, s.QLen())
				out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
				dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
				o := attn.Options{Causal: causal}
				kn := New(Config{})
				ctx := context.Background()
				fwd := func() {
					if err := kn.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
						b.Fatal(err)
					}
				}
				bwd := func() {
					if err := kn.Backward(ctx, s, q, k, v, out, lse, g, o, nil, dq, dk, dv); err != nil {
						b.Fatal(err)
					}
				}
				fwd()
				bwd()
				var tf, tb time.Duration
				bf, bb := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
				for b.Loop() {
					t0 := time.Now()
					fwd()
					t1 := time.Now()
					bwd()
					t2 := time.Now()
					tf += t1.Sub(t0)
					tb += t2.Sub(t1)
					bf, bb = min(bf, t1.Sub(t0)), min(bb, t2.Sub(t1))
				}
				n := float64(b.N)
				b.ReportMetric(tf.Seconds()/n*1e3, "fwd-ms")
				b.ReportMetric(tb.Seconds()/n*1e3, "bwd-ms")
				b.ReportMetric(tb.Seconds()/tf.Seconds(), "bwd/fwd")
				b.ReportMetric(bb.Seconds()/bf.Seconds(), "bwd/fwd-best")
				f := 10 * float64(s.B*s.H*s.N*s.M*s.D)
				if causal {
					f /= 2
				}
				b.ReportMetric(f*n/tb.Seconds()/1e9, "bwd-GFLOP/s")
			})
		}
	}
}
