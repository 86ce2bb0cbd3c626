package hyper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

const gradTol = 1e-4

// pick is a key a query row attends to and the log of its weight.
type pick struct {
	key  int
	logw float64
}

// picks returns, for every query row of Q[B][H][N], the keys Forward
// attends that row to for these inputs and options and their log weights,
// read from the plan Forward and Backward share: the causal leaves, then
// the jobs of each phase, exact ones with every key of their rectangle,
// approximate ones with the keys of each row's block and the samples kept
// outside it. It fails the test if a row gets a key twice.
func (a *Attention) picks(t *testing.T, s attn.Shape, q, k, v []float32, o attn.Options) [][]pick {
	t.Helper()
	rows := make([][]pick, s.B*s.H*s.N)
	add := func(row, key int, logw float64) {
		rows[row] = append(rows[row], pick{key, logw})
	}
	if a.exact(s.N, s.M) {
		for b := range s.B {
			for h := range s.H {
				for i := range s.N {
					for j := range o.VisibleKeys(s, b, i) {
						add((b*s.H+h)*s.N+i, j, 0)
					}
				}
			}
		}
		return rows
	}
	c := &call{a: a, s: s, o: o, q: q, k: k, v: v, scale: o.ScaleFor(s.D), grad: true}
	leaves, phases := a.layout(s, o.Causal)
	if o.Causal {
		for b := range s.B {
			for h := range s.H {
				for i := range s.N {
					p := s.M - s.N + i
					lf := leaves.leaf(p)
					if lf < 0 {
						continue
					}
					for j := leaves.bounds[lf]; j < min(leaves.bounds[lf+1], o.VisibleKeys(s, b, i)); j++ {
						add((b*s.H+h)*s.N+i, j, 0)
					}
				}
			}
		}
	}
	g := s.Group()
	for _, ph := range phases {
		jobs, err := c.plan(context.Background(), ph)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if j.exact {
				for hh := range g {
					for r := range j.r.q1 - j.r.q0 {
						for key := range j.nk {
							add((j.b*s.H+j.kvh*g+hh)*s.N+j.r.q0+r, j.r.k0+key, 0)
						}
					}
				}
				continue
			}
			for bl := range len(j.start) - 1 {
				blk := bl
				if a.block <= 0 {
					blk = -1
				}
				out := j.outside(blk)
				for _, x := range j.rows[j.start[bl]:j.start[bl+1]] {
					row := c.queryRow(j, int(x), g)
					if blk >= 0 {
						ka, kz := span(j.nk, j.nb, blk)
						for p := ka; p < kz; p++ {
							add(row, j.r.k0+j.key(p), 0)
						}
					}
					if out.kept == 0 {
						continue
					}
					for t, p := range j.uniform {
						if t < out.lo || t >= out.hi {
							add(row, j.r.k0+j.key(int(p)), float64(out.logw))
						}
					}
				}
			}
		}
	}
	for row, ps := range rows {
		seen := map[int]bool{}
		for _, p := range ps {
			if seen[p.key] {
				t.Fatalf("row %d gets key %d twice", row, p.key)
			}
			seen[p.key] = true
		}
	}
	return rows
}

// spec turns picks into the mask and bias of ref.Spec, per head.
func spec(s attn.Shape, o attn.Options, rows [][]pick) ref.Spec {
	mask := make([]bool, s.B*s.H*s.N*s.M)
	bias := make([]float64, len(mask))
	for row, ps := range rows {
		for _, p := range ps {
			mask[row*s.M+p.key] = true
			bias[row*s.M+p.key] = p.logw
		}
	}
	return ref.Spec{Scale: float64(o.ScaleFor(s.D)), Mask: mask, Bias: bias}
}

// backwardOf runs a's forward and backward passes and returns the
// gradients.
func backwardOf(t testing.TB, a *Attention, s attn.Shape, q, k, v, dout []float32, o attn.Options) (dq, dk, dv []float32) {
	t.Helper()
	out, lse := forward(t, a, s, q, k, v, o)
	dq, dk, dv = make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	for _, x := range [][]float32{dq, dk, dv} {
		for i := range x {
			x[i] = float32(math.NaN()) // overwritten, never read
		}
	}
	if err := a.Backward(context.Background(), s, q, k, v, out, lse, dout, o, dq, dk, dv); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return dq, dk, dv
}

// gradCfgs are configurations that approximate on small inputs, in every
// form: blocks and samples, the recursion with exact rectangles below Min
// among approximate ones, samples only, blocks only, and blocks with every
// other key sampled (exact, but through the approximate code).
func gradCfgs() []Config {
	return []Config{
		approx(3),
		{Block: 16, Samples: 8, Min: 40, Projs: 4, Seed: 4},
		{Block: -1, Samples: 8, Min: -1, Seed: 5},
		{Block: 5, Samples: -1, Min: -1, Projs: 2, Seed: 6},
		{Block: 7, Samples: 300, Min: -1, Projs: 3, Seed: 7},
	}
}

// The gradient is that of the estimate Forward computed: softmax attention
// over the keys each row was given, biased by their log weights, whose
// float64 forward is Forward's output (so the picks are Forward's) and
// whose float64 gradient is Backward's; for odd sizes, causal and not,
// GQA, random padding and scale, and rows cut into several chunks.
func TestBackwardMatchesReference(t *testing.T) {
	rng := testRNG(t, 21)
	defer func(n, r int) { gradChunkRows, rowSpan = n, r }(gradChunkRows, rowSpan)
	shapes := []attn.Shape{
		{B: 2, H: 6, HKV: 2, N: 173, M: 173, D: 21},
		{B: 2, H: 4, HKV: 4, N: 97, M: 230, D: 10},
		{B: 1, H: 3, HKV: 1, N: 211, M: 140, D: 7},
	}
	for _, chunk := range []int{8192, 37} {
		// Small chunks with their gathers and scatters split too.
		gradChunkRows, rowSpan = chunk, min(chunk/4, 1024)
		for _, cfg := range gradCfgs() {
			a := newAttention(t, cfg)
			approximated := 0
			for _, s := range shapes {
				for _, causal := range []bool{false, true} {
					o := attn.Options{Causal: causal, KVLen: randomKVLen(rng, s.B, s.M)}
					if !causal && a.Fallback(s, o) != "" {
						// Padding that shrinks a non-causal call below
						// Min is dropped (the draw still made, so the
						// inputs stay those of the seed): three calls
						// of each configuration must approximate
						// whatever the draws.
						o.KVLen = nil
					}
					if rng.IntN(2) == 0 {
						o.Scale = 0.3
					}
					name := fmt.Sprintf("chunk %d %+v %+v %+v", chunk, cfg, s, o)
					if a.Fallback(s, o) == "" {
						approximated++
					}
					q, k, v := inputs(rng, s)
					dout := ref.Normal(rng, s.QLen())
					sp := spec(s, o, a.picks(t, s, q, k, v, o))
					out, lse := forward(t, a, s, q, k, v, o)
					wantOut, wantLSE, err := ref.Attention(s, q, k, v, sp)
					if err != nil {
						t.Fatal(err)
					}
					if e := ref.RelErr(out, wantOut); e > tol {
						t.Errorf("%s: forward vs its picks: out rel err %.3g", name, e)
					}
					if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
						t.Errorf("%s: forward vs its picks: lse rel err %.3g %v", name, e, err)
					}
					dq, dk, dv := backwardOf(t, a, s, q, k, v, dout, o)
					wq, wk, wv, err := ref.AttentionBackward(s, q, k, v, dout, sp)
					if err != nil {
						t.Fatal(err)
					}
					for _, x := range []struct {
						name string
						got  []float32
						want []float64
					}{{"dq", dq, wq}, {"dk", dk, wk}, {"dv", dv, wv}} {
						if e := ref.RelErr(x.got, x.want); e > gradTol {
							t.Errorf("%s: %s rel err %.3g", name, x.name, e)
						}
					}
					checkPaddedZero(t, name, s, o, dk, dv)
				}
			}
			if approximated < 3 && cfg.Samples < 300 { // 300 samples take every key, at weight 1
				t.Errorf("chunk %d %+v: only %d calls approximated", chunk, cfg, approximated)
			}
		}
	}
}

// checkPaddedZero checks that keys past each batch row's length get
// gradient exactly 0.
func checkPaddedZero(t *testing.T, name string, s attn.Shape, o attn.Options, dk, dv []float32) {
	t.Helper()
	for b := range s.B {
		for kvh := range s.HKV {
			for j := o.KeyEnd(s, b); j < s.M; j++ {
				row := ((b*s.HKV+kvh)*s.M + j) * s.D
				for c := range s.D {
					if dk[row+c] != 0 || dv[row+c] != 0 {
						t.Fatalf("%s: padded key %d of batch row %d: dk %v, dv %v, want 0", name, j, b, dk[row+c], dv[row+c])
					}
				}
			}
		}
	}
}

// Finite differences on tiny sizes: of the float64 reference of the
// estimator (Forward's picks as mask and bias) at every coordinate, and of
// Forward itself at random coordinates whose perturbation leaves the picks
// unchanged.
func TestBackwardFiniteDifferences(t *testing.T) {
	rng := testRNG(t, 22)
	cases := []struct {
		cfg Config
		s   attn.Shape
		o   attn.Options
	}{
		{Config{Block: 4, Samples: 3, Min: -1, Projs: 3, Seed: 1}, attn.Shape{B: 1, H: 4, HKV: 2, N: 29, M: 29, D: 5}, attn.Options{Causal: true}},
		{Config{Block: 4, Samples: 3, Min: -1, Projs: 3, Seed: 2}, attn.Shape{B: 2, H: 2, HKV: 1, N: 17, M: 23, D: 6}, attn.Options{KVLen: []int{23, 13}}},
		{Config{Block: -1, Samples: 5, Min: -1, Seed: 3}, attn.Shape{B: 1, H: 2, HKV: 2, N: 19, M: 27, D: 3}, attn.Options{Causal: true, Scale: 0.6}},
		{Config{Block: 3, Samples: -1, Min: -1, Projs: 2, Seed: 4}, attn.Shape{B: 1, H: 3, HKV: 1, N: 21, M: 14, D: 4}, attn.Options{Causal: true, KVLen: []int{11}}},
	}
	for _, tc := range cases {
		a := newAttention(t, tc.cfg)
		s, o := tc.s, tc.o
		name := fmt.Sprintf("%+v %+v %+v", tc.cfg, s, o)
		q, k, v := inputs(rng, s)
		dout := ref.Normal(rng, s.QLen())
		picks := a.picks(t, s, q, k, v, o)
		sp := spec(s, o, picks)
		dq, dk, dv := backwardOf(t, a, s, q, k, v, dout, o)
		loss64 := func() float64 {
			out, _, err := ref.Attention(s, q, k, v, sp)
			if err != nil {
				t.Fatal(err)
			}
			l := 0.0
			for i, x := range out {
				l += x * float64(dout[i])
			}
			return l
		}
		loss32 := func() float64 {
			out, _ := forward(t, a, s, q, k, v, o)
			l := 0.0
			for i, x := range out {
				l += float64(x) * float64(dout[i])
			}
			return l
		}
		checked, moved := 0, 0
		for _, x := range []struct {
			name string
			in   []float32
			got  []float32
		}{{"dq", q, dq}, {"dk", k, dk}, {"dv", v, dv}} {
			// The reference at every coordinate, float32 steps of
			// about 1e-3 (the denominator the exact difference).
			fd := make([]float64, len(x.in))
			for i, x0 := range x.in {
				xp, xm := x0+1e-3, x0-1e-3
				x.in[i] = xp
				lp := loss64()
				x.in[i] = xm
				lm := loss64()
				x.in[i] = x0
				fd[i] = (lp - lm) / (float64(xp) - float64(xm))
			}
			if e := ref.RelErr(x.got, fd); e > 1e-3 {
				t.Errorf("%s: %s vs finite differences of the estimator's reference: rel err %.3g", name, x.name, e)
			}
			// Forward itself, where the perturbation moves no bucket.
			for range 12 {
				i := rng.IntN(len(x.in))
				x0 := x.in[i]
				xp, xm := x0+1e-2, x0-1e-2
				x.in[i] = xp
				same := picksEqual(picks, a.picks(t, s, q, k, v, o))
				lp := loss32()
				x.in[i] = xm
				same = same && picksEqual(picks, a.picks(t, s, q, k, v, o))
				lm := loss32()
				x.in[i] = x0
				if !same {
					moved++
					continue
				}
				checked++
				f := (lp - lm) / (float64(xp) - float64(xm))
				if g := float64(x.got[i]); math.Abs(f-g) > 2e-3+2e-2*math.Abs(g) {
					t.Errorf("%s: %s[%d] = %.6g, finite differences of Forward %.6g", name, x.name, i, g, f)
				}
			}
		}
		t.Logf("%s: %d coordinates checked against Forward, %d moved a bucket", name, checked, moved)
		if checked < 18 {
			t.Errorf("%s: only %d of %d coordinates left the picks unchanged", name, checked, checked+moved)
		}
	}
}

func picksEqual(a, b [][]pick) bool {
	return slices.EqualFunc(a, b, func(x, y []pick) bool { return slices.Equal(x, y) })
}

// The gradients are the same bits with any number of workers.
func TestBackwardDeterminism(t *testing.T) {
	rng := testRNG(t, 23)
	defer func(n, r int) { gradChunkRows, rowSpan = n, r }(gradChunkRows, rowSpan)
	gradChunkRows = 300
	rowSpan = 7 // the gathers and scatters split among the workers
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 601, M: 655, D: 24}
	q, k, v := inputs(rng, s)
	dout := ref.Normal(rng, s.QLen())
	for _, causal := range []bool{false, true} {
		for _, cfg := range []Config{{Block: 32, Samples: 24, Min: 80, Projs: 5, Seed: 8}, {Block: -1, Samples: 40, Min: -1, Seed: 9}} {
			o := attn.Options{Causal: causal, KVLen: []int{655, 480}, Workers: 1}
			a := newAttention(t, cfg)
			dq, dk, dv := backwardOf(t, a, s, q, k, v, dout, o)
			for _, w := range []int{2, 3, 8} {
				o.Workers = w
				dq2, dk2, dv2 := backwardOf(t, newAttention(t, cfg), s, q, k, v, dout, o)
				if !slices.Equal(dq, dq2) || !slices.Equal(dk, dk2) || !slices.Equal(dv, dv2) {
					t.Errorf("causal=%v %+v: %d workers gave other gradients than 1", causal, cfg, w)
				}
			}
		}
	}
}

// The gathered copies are kept from one call to the next (gatheredPool),
// so they may hold anything, NaN included: gradients computed on copies
// filled with NaN are those computed on fresh ones, bit for bit.
func TestBackwardReusesMemory(t *testing.T) {
	rng := testRNG(t, 29)
	defer func(n int) { gradChunkRows = n }(gradChunkRows)
	gradChunkRows = 300
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 601, M: 655, D: 24}
	q, k, v := inputs(rng, s)
	dout := ref.Normal(rng, s.QLen())
	nan := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(math.NaN())
		}
		return x
	}
	for _, causal := range []bool{false, true} {
		cfg := Config{Block: 32, Samples: 24, Min: 80, Projs: 5, Seed: 8}
		o := attn.Options{Causal: causal, KVLen: []int{655, 480}, Workers: 1}
		for gatheredPool.Get() != nil {
		} // a fresh set for the first call
		dq, dk, dv := backwardOf(t, newAttention(t, cfg), s, q, k, v, dout, o)
		for gatheredPool.Get() != nil {
		}
		// Several, so that the call finds one whatever processor it
		// runs on.
		const big = 1 << 16
		for range 8 {
			gatheredPool.Put(&gathered{
				gq: nan(big), gout: nan(big), gdout: nan(big), glse: nan(big), glse2: nan(big), gdq: nan(big),
				gk: nan(big), gv: nan(big), gdk: nan(big), gdv: nan(big),
			})
		}
		dq2, dk2, dv2 := backwardOf(t, newAttention(t, cfg), s, q, k, v, dout, o)
		if !slices.Equal(dq, dq2) || !slices.Equal(dk, dk2) || !slices.Equal(dv, dv2) {
			t.Errorf("causal=%v: other gradients on gathered copies filled with NaN", causal)
		}
	}
}

// A call Forward computes exactly gets the exact kernel's gradient, bit for
// bit; value-norm sampling is allowed there.
func TestBackwardExactFallback(t *testing.T) {
	rng := testRNG(t, 24)
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 70, M: 90, D: 9}
	for _, sm := range []Sampling{Uniform, ValueNorm} {
		a := newAttention(t, Config{Min: 100, Sampling: sm})
		for _, causal := range []bool{false, true} {
			o := attn.Options{Causal: causal, KVLen: []int{90, 41}}
			q, k, v := inputs(rng, s)
			dout := ref.Normal(rng, s.QLen())
			dq, dk, dv := backwardOf(t, a, s, q, k, v, dout, o)
			kn := flash.New(flash.Config{})
			out, lse := forward(t, kn, s, q, k, v, o)
			wq, wk, wv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
			if err := kn.Backward(context.Background(), s, q, k, v, out, lse, dout, o, nil, wq, wk, wv); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(dq, wq) || !slices.Equal(dk, wk) || !slices.Equal(dv, wv) {
				t.Errorf("%v causal=%v: not the exact kernel's gradient", sm, causal)
			}
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	ctx := context.Background()
	a := newAttention(t, approx(1))
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 50, M: 60, D: 3}
	q, kv := make([]float32, s.QLen()), make([]float32, s.KVLen())
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	cases := []struct {
		name    string
		s       attn.Shape
		lse, dq []float32
		o       attn.Options
		want    error
	}{
		{"shape", attn.Shape{B: 1, H: 3, HKV: 2, N: 50, M: 60, D: 3}, lse, dq, attn.Options{}, attn.ErrShape},
		{"nil lse", s, nil, dq, attn.Options{}, attn.ErrShape},
		{"len dq", s, lse, dq[1:], attn.Options{}, attn.ErrShape},
		{"kvlen", s, lse, dq, attn.Options{KVLen: []int{61}}, attn.ErrInput},
		{"workers", s, lse, dq, attn.Options{Workers: -1}, attn.ErrInput},
	}
	for _, c := range cases {
		if err := a.Backward(ctx, c.s, q, kv, kv, out, c.lse, q, c.o, c.dq, dk, dv); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	vn := approx(1)
	vn.Sampling = ValueNorm
	if err := newAttention(t, vn).Backward(ctx, s, q, kv, kv, out, lse, q, attn.Options{}, dq, dk, dv); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("value-norm sampling: got %v, want ErrUnsupported", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	for _, causal := range []bool{false, true} {
		o := attn.Options{Causal: causal}
		if err := a.Backward(cctx, s, q, kv, kv, out, lse, q, o, dq, dk, dv); !errors.Is(err, context.Canceled) {
			t.Errorf("causal=%v: cancelled: got %v, want context.Canceled", causal, err)
		}
	}
}

// The sampled part's gradient carries the samples' weight: dropping it
// (weights of 1) is a different gradient, which the reference tells apart,
// so TestBackwardMatchesReference would catch a lost weight.
func TestBackwardWeightsMatter(t *testing.T) {
	rng := testRNG(t, 25)
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 150, M: 150, D: 8}
	a := newAttention(t, approx(2))
	o := attn.Options{}
	q, k, v := inputs(rng, s)
	dout := ref.Normal(rng, s.QLen())
	rows := a.picks(t, s, q, k, v, o)
	weighted := false
	for _, ps := range rows {
		for i := range ps {
			weighted = weighted || ps[i].logw != 0
			ps[i].logw = 0
		}
	}
	if !weighted {
		t.Fatal("no sample carries a weight")
	}
	dq, _, _ := backwardOf(t, a, s, q, k, v, dout, o)
	wq, _, _, err := ref.AttentionBackward(s, q, k, v, dout, spec(s, o, rows))
	if err != nil {
		t.Fatal(err)
	}
	if e := ref.RelErr(dq, wq); e < 100*gradTol {
		t.Errorf("gradient without the weights is within %.3g of the weighted one", e)
	}
}
