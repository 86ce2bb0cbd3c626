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
	"github.com/attnkit/attn/ref"
)

const tol = 1e-5

// expMap is φ(x) = exp(x) element by element, written in log-scaled form
// (dst = exp(x - max), logScale = max): it drives the stabilised path of
// Attention with a map whose float64 formula is obvious.
type expMap struct{}

func (expMap) Features(d int) int { return d }
func (expMap) LogScaled() bool    { return true }
func (expMap) Map(dst []float32, ld int, ls, x []float32, n, d int, _ float32, _ bool) {
	for r := range n {
		row := x[r*d : (r+1)*d]
		m := slices.Max(row)
		for c, v := range row {
			dst[r*ld+c] = float32(math.Exp(float64(v - m)))
		}
		ls[r] = m
	}
}

// MapBackward: with φ = exp(ℓ)·ψ and ℓ = max(x), exp(−ℓ)·∂φ_c/∂x_c = ψ_c.
func (expMap) MapBackward(dx []float32, ldx int, g, phi []float32, ld int, _ []float32, n, d int, _ float32, _ bool) {
	for r := range n {
		for c := range d {
			dx[r*ldx+c] = g[r*ld+c] * phi[r*ld+c]
		}
	}
}

// opaqueMap hides every method of a map but those of FeatureMap.
type opaqueMap struct{ m FeatureMap }

func (o opaqueMap) Features(d int) int { return o.m.Features(d) }
func (o opaqueMap) LogScaled() bool    { return o.m.LogScaled() }
func (o opaqueMap) Map(dst []float32, ld int, ls, x []float32, n, d int, scale float32, key bool) {
	o.m.Map(dst, ld, ls, x, n, d, scale, key)
}

func phi64(name string, x float32) float64 {
	v := float64(x)
	if name == "exp" || v <= 0 {
		return math.Exp(v)
	}
	return v + 1
}

// formula is the float64 evaluation of linear attention written from its
// definition: weights w_ij = φ(q_i)·φ(k_j) on the keys the dense mask
// allows, out_i = Σ_j w_ij v_j / Σ_j w_ij, lse_i = log Σ_j w_ij.
func formula(s attn.Shape, q, k, v []float32, o attn.Options, mapName string) (out, lse []float64) {
	mask := ref.Mask(s, o)
	phi := func(x []float32) []float64 {
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = phi64(mapName, v)
		}
		return y
	}
	pq, pk := phi(q), phi(k)
	out = make([]float64, s.QLen())
	lse = make([]float64, s.LSELen())
	d := s.D
	for b := range s.B {
		for h := range s.H {
			kvh := h / s.Group()
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				qi := pq[row*d : (row+1)*d]
				sum := 0.0
				o := out[row*d : (row+1)*d]
				for j := range s.M {
					if !mask[(b*s.N+i)*s.M+j] {
						continue
					}
					kj := pk[((b*s.HKV+kvh)*s.M+j)*d:][:d]
					vj := v[((b*s.HKV+kvh)*s.M+j)*d:][:d]
					w := 0.0
					for c := range d {
						w += qi[c] * kj[c]
					}
					sum += w
					for c := range d {
						o[c] += w * float64(vj[c])
					}
				}
				if sum == 0 {
					lse[row] = math.Inf(-1)
					continue
				}
				for c := range o {
					o[c] /= sum
				}
				lse[row] = math.Log(sum)
			}
		}
	}
	return out, lse
}

func inputs(rng *rand.Rand, s attn.Shape) (q, k, v []float32) {
	return ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
}

func forward(t testing.TB, a *Attention, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float32) {
	t.Helper()
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	if err := a.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return out, lse
}

func checkClose(t *testing.T, what string, out, lse []float32, wantOut, wantLSE []float64) {
	t.Helper()
	if e := ref.RelErr(out, wantOut); e > tol {
		t.Errorf("%s: out rel err %.3g", what, e)
	}
	checkLSE(t, what, lse, wantLSE)
}

func checkLSE(t *testing.T, what string, lse []float32, wantLSE []float64) {
	t.Helper()
	if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
		t.Errorf("%s: lse rel err %.3g %v", what, e, err)
	}
}

// checkOut compares out with wantOut relative to termOut, the formula
// evaluated on |V|: the size of the terms every output sums. Where those
// terms nearly cancel (a few keys, D = 1, so that every row is the same
// short sum) no float32 summation, however ordered, keeps 1e-5 of the
// tiny result, but it keeps 1e-5 of the terms' scale, and that is what
// this check asks. Without cancellation the two norms agree.
func checkOut(t *testing.T, what string, out []float32, wantOut, termOut []float64) {
	t.Helper()
	var diff, scale float64
	for i, x := range out {
		e := float64(x) - wantOut[i]
		if math.IsNaN(e) || math.IsInf(e, 0) {
			t.Errorf("%s: out[%d] = %v", what, i, x)
			return
		}
		diff += e * e
		scale += termOut[i] * termOut[i]
	}
	if scale > 0 && math.Sqrt(diff/scale) > tol {
		t.Errorf("%s: out err %.3g relative to the terms' scale", what, math.Sqrt(diff/scale))
	}
}

func TestAgainstFormula(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, testSeed(t)))
	lengths := []int{1, 7, 64, 65, 150}
	ds := []int{1, 5, 24, 40, 64}
	groups := [][2]int{{4, 4}, {4, 2}, {4, 1}}
	maps := []struct {
		name string
		a    *Attention
	}{
		{"elu", New(Config{})},
		{"elu", New(Config{Chunk: 5})},
		{"exp", New(Config{Map: expMap{}, Chunk: 16})},
		{"exp", New(Config{Map: expMap{}, Chunk: 3})},
	}
	c := 0
	for _, n := range lengths {
		for _, m := range lengths {
			for _, hg := range groups {
				for _, causal := range []bool{false, true} {
					c++
					s := attn.Shape{B: 2, H: hg[0], HKV: hg[1], N: n, M: m, D: ds[c%len(ds)]}
					o := attn.Options{Causal: causal, Workers: 1 + c%3}
					if c%2 == 0 {
						o.KVLen = []int{rng.IntN(m + 1), rng.IntN(m + 1)}
						if c%6 == 0 {
							o.KVLen[1] = 0
						}
					}
					mp := maps[c%len(maps)]
					q, k, v := inputs(rng, s)
					out, lse := forward(t, mp.a, s, q, k, v, o)
					wantOut, wantLSE := formula(s, q, k, v, o, mp.name)
					checkLSE(t, mp.name+" "+fmtCase(s, o), lse, wantLSE)
					// The same weights on |v|: the scale of the terms each
					// output sums, which bounds a float32 sum's error.
					absV := make([]float32, len(v))
					for i, x := range v {
						absV[i] = float32(math.Abs(float64(x)))
					}
					termOut, _ := formula(s, q, k, absV, o, mp.name)
					checkOut(t, mp.name+" "+fmtCase(s, o), out, wantOut, termOut)
				}
			}
		}
	}
}

func fmtCase(s attn.Shape, o attn.Options) string {
	return fmt.Sprintf("%+v causal=%v kvlen=%v", s, o.Causal, o.KVLen)
}

// TestDecodeMatchesChunked runs the recurrent state one token at a time and
// compares it with the chunked causal pass, padding included.
func TestDecodeMatchesChunked(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, testSeed(t)))
	for _, a := range []*Attention{New(Config{}), New(Config{Chunk: 7}), New(Config{Map: expMap{}})} {
		for _, hkv := range []int{2, 1} {
			s := attn.Shape{B: 2, H: 4, HKV: hkv, N: 150, M: 150, D: 24}
			o := attn.Options{Causal: true, KVLen: []int{s.M, 1 + rng.IntN(s.M)}}
			q, k, v := inputs(rng, s)
			want, wantLSE := forward(t, a, s, q, k, v, o)
			st, err := a.NewState(s.B, s.H, s.HKV, s.D, 0)
			if err != nil {
				t.Fatal(err)
			}
			d := s.D
			out := make([]float32, s.B*s.H*d)
			lse := make([]float32, s.B*s.H)
			got := make([]float32, s.QLen())
			gotLSE := make([]float32, s.LSELen())
			for i := range s.N {
				kt := make([]float32, 0, s.B*s.HKV*d)
				vt := make([]float32, 0, s.B*s.HKV*d)
				for bh := range s.B * s.HKV {
					kt = append(kt, k[(bh*s.M+i)*d:][:d]...)
					vt = append(vt, v[(bh*s.M+i)*d:][:d]...)
				}
				valid := []int{0, 0}
				for b := range s.B {
					if i < o.KVLen[b] {
						valid[b] = 1
					}
				}
				if err := st.Append(kt, vt, 1, valid); err != nil {
					t.Fatal(err)
				}
				qt := make([]float32, 0, s.B*s.H*d)
				for bh := range s.B * s.H {
					qt = append(qt, q[(bh*s.N+i)*d:][:d]...)
				}
				if err := st.Attend(qt, out, lse); err != nil {
					t.Fatal(err)
				}
				for bh := range s.B * s.H {
					copy(got[(bh*s.N+i)*d:][:d], out[bh*d:][:d])
					gotLSE[bh*s.N+i] = lse[bh]
				}
			}
			if st.Len(1) != o.KVLen[1] {
				t.Errorf("Len(1) = %d, want %d", st.Len(1), o.KVLen[1])
			}
			checkClose(t, "decode "+fmtCase(s, o), got, gotLSE, widen(want), widen(wantLSE))
		}
	}
}

// TestAppendBlock checks that appending many tokens at once equals the
// non-causal pass over them.
func TestAppendBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, testSeed(t)))
	a := New(Config{Chunk: 16})
	s := attn.Shape{B: 2, H: 2, HKV: 1, N: 1, M: 53, D: 40}
	o := attn.Options{KVLen: []int{41, 53}}
	q, k, v := inputs(rng, s)
	want, wantLSE := forward(t, a, s, q, k, v, o)
	st, err := a.NewState(s.B, s.H, s.HKV, s.D, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Append(k, v, s.M, o.KVLen); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := st.Attend(q, out, lse); err != nil {
		t.Fatal(err)
	}
	checkClose(t, "append block", out, lse, widen(want), widen(wantLSE))
	st.Reset()
	if err := st.Attend(q, out, lse); err != nil {
		t.Fatal(err)
	}
	for i := range lse {
		if !math.IsInf(float64(lse[i]), -1) || slices.ContainsFunc(out, func(x float32) bool { return x != 0 }) {
			t.Fatalf("empty state: lse %v out %v", lse, out)
		}
	}
}

func widen(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// TestMerge checks that lse is the log normaliser: two passes over disjoint
// key sets merge into the pass over all keys, as for softmax attention.
func TestMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, testSeed(t)))
	for _, a := range []*Attention{New(Config{}), New(Config{Map: expMap{}})} {
		s := attn.Shape{B: 2, H: 4, HKV: 2, N: 33, M: 101, D: 24}
		q, k, v := inputs(rng, s)
		split := 1 + rng.IntN(s.M-1)
		part := func(lo, hi int) (attn.Shape, []float32, []float32) {
			ps := s
			ps.M = hi - lo
			var pk, pv []float32
			for bh := range s.B * s.HKV {
				pk = append(pk, k[(bh*s.M+lo)*s.D:(bh*s.M+hi)*s.D]...)
				pv = append(pv, v[(bh*s.M+lo)*s.D:(bh*s.M+hi)*s.D]...)
			}
			return ps, pk, pv
		}
		s1, k1, v1 := part(0, split)
		s2, k2, v2 := part(split, s.M)
		o1, l1 := forward(t, a, s1, q, k1, v1, attn.Options{})
		o2, l2 := forward(t, a, s2, q, k2, v2, attn.Options{})
		if err := attn.Merge(o1, l1, o2, l2, s.D); err != nil {
			t.Fatal(err)
		}
		want, wantLSE := forward(t, a, s, q, k, v, attn.Options{})
		checkClose(t, "merge", o1, l1, widen(want), widen(wantLSE))
	}
}

// TestPaddingIgnored fills padding keys and values with huge values: the
// result must not change at all.
func TestPaddingIgnored(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, testSeed(t)))
	for _, a := range []*Attention{New(Config{}), New(Config{Map: expMap{}, Chunk: 8})} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 4, HKV: 1, N: 37, M: 70, D: 24}
			o := attn.Options{Causal: causal, KVLen: []int{rng.IntN(s.M + 1), rng.IntN(s.M + 1)}}
			q, k, v := inputs(rng, s)
			out1, lse1 := forward(t, a, s, q, k, v, o)
			for b := range s.B {
				for j := o.KVLen[b]; j < s.M; j++ {
					for kvh := range s.HKV {
						base := ((b*s.HKV+kvh)*s.M + j) * s.D
						for c := range s.D {
							k[base+c] = 1e4 * float32(rng.NormFloat64())
							v[base+c] = 1e4 * float32(rng.NormFloat64())
						}
					}
				}
			}
			out2, lse2 := forward(t, a, s, q, k, v, o)
			if !slices.Equal(out1, out2) || !slices.Equal(lse1, lse2) {
				t.Errorf("causal=%v: padding keys changed the result", causal)
			}
		}
	}
}

// TestPrefixInvariance changes every token after position t and checks
// that causal outputs up to t stay identical, bit for bit.
func TestPrefixInvariance(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, testSeed(t)))
	for _, a := range []*Attention{New(Config{}), New(Config{Map: expMap{}, Chunk: 16})} {
		for _, nm := range [][2]int{{100, 100}, {60, 100}} {
			s := attn.Shape{B: 1, H: 4, HKV: 2, N: nm[0], M: nm[1], D: 24}
			o := attn.Options{Causal: true}
			q, k, v := inputs(rng, s)
			out1, lse1 := forward(t, a, s, q, k, v, o)
			tq := rng.IntN(s.N) // last unchanged query
			tk := s.M - s.N + tq
			for bh := range s.B * s.H {
				for i := tq + 1; i < s.N; i++ {
					for c := range s.D {
						q[(bh*s.N+i)*s.D+c] = 50 * float32(rng.NormFloat64())
					}
				}
			}
			for bh := range s.B * s.HKV {
				for j := tk + 1; j < s.M; j++ {
					for c := range s.D {
						k[(bh*s.M+j)*s.D+c] = 50 * float32(rng.NormFloat64())
						v[(bh*s.M+j)*s.D+c] = 50 * float32(rng.NormFloat64())
					}
				}
			}
			out2, lse2 := forward(t, a, s, q, k, v, o)
			for bh := range s.B * s.H {
				for i := 0; i <= tq; i++ {
					r := bh*s.N + i
					if lse1[r] != lse2[r] || !slices.Equal(out1[r*s.D:(r+1)*s.D], out2[r*s.D:(r+1)*s.D]) {
						t.Fatalf("%s: row %d of head %d (t = %d) changed", fmtCase(s, o), i, bh, tq)
					}
				}
			}
		}
	}
}

// TestLargeInputs scales inputs by 100: no NaN or Inf may appear.
func TestLargeInputs(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, testSeed(t)))
	for _, a := range []*Attention{New(Config{}), New(Config{Map: expMap{}})} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 1, H: 4, HKV: 2, N: 130, M: 130, D: 40}
			q, k, v := inputs(rng, s)
			for _, x := range [][]float32{q, k, v} {
				for i := range x {
					x[i] *= 100
				}
			}
			out, lse := forward(t, a, s, q, k, v, attn.Options{Causal: causal})
			for _, x := range out {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("causal=%v: out has %v", causal, x)
				}
			}
			// φ(x) = exp(x) at this scale leaves some normalisers below
			// the float32 range: those rows are 0 with lse -Inf, as
			// documented. elu+1 has no such rows.
			_, isExp := a.fm.(expMap)
			for _, x := range lse {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 1) || (!isExp && math.IsInf(float64(x), -1)) {
					t.Fatalf("%s causal=%v: lse has %v", a.fm, causal, x)
				}
			}
		}
	}
}

func TestEmptyRows(t *testing.T) {
	s := attn.Shape{B: 2, H: 2, HKV: 1, N: 9, M: 4, D: 5}
	o := attn.Options{Causal: true, KVLen: []int{4, 0}}
	rng := rand.New(rand.NewPCG(8, 8))
	q, k, v := inputs(rng, s)
	out, lse := forward(t, New(Config{Chunk: 4}), s, q, k, v, o)
	for row := range s.LSELen() {
		b, i := row/(s.H*s.N), row%s.N
		empty := b == 1 || i < s.N-s.M
		if empty != math.IsInf(float64(lse[row]), -1) {
			t.Errorf("row %d: lse %v, empty=%v", row, lse[row], empty)
		}
		for _, x := range out[row*s.D : (row+1)*s.D] {
			if math.IsNaN(float64(x)) || (empty && x != 0) {
				t.Fatalf("row %d: out %v", row, out[row*s.D:(row+1)*s.D])
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 4, D: 2}
	q, k, v := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out := make([]float32, s.QLen())
	a := New(Config{})
	ctx := context.Background()
	cases := []struct {
		name    string
		s       attn.Shape
		q, out  []float32
		o       attn.Options
		wantErr error
	}{
		{"short q", s, q[1:], out, attn.Options{}, attn.ErrShape},
		{"nil out", s, q, nil, attn.Options{}, attn.ErrShape},
		{"H%Hkv", attn.Shape{B: 1, H: 3, HKV: 2, N: 3, M: 4, D: 2}, q, out, attn.Options{}, attn.ErrShape},
		{"kvlen", s, q, out, attn.Options{KVLen: []int{5}}, attn.ErrInput},
		{"workers", s, q, out, attn.Options{Workers: -1}, attn.ErrInput},
	}
	for _, c := range cases {
		err := a.Forward(ctx, c.s, c.q, k, v, c.o, c.out, nil)
		if !errors.Is(err, c.wantErr) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.wantErr)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Forward(cctx, s, q, k, v, attn.Options{}, out, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: got %v", err)
	}

	if _, err := a.NewState(1, 3, 2, 4, 0); !errors.Is(err, attn.ErrShape) {
		t.Errorf("NewState(H=3, Hkv=2): %v", err)
	}
	st, err := a.NewState(1, 2, 1, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Append(k[:2], v[:2], 2, nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("Append short: %v", err)
	}
	if err := st.Append(k[:4], v[:4], 2, []int{3}); !errors.Is(err, attn.ErrInput) {
		t.Errorf("Append valid 3 > 2: %v", err)
	}
	if err := st.Attend(q[:3], out[:4], nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("Attend short q: %v", err)
	}
}

// TestTranspose: transpose moves every value of the source and nothing
// else, for sizes that leave partial panels and column blocks, with
// strides past the data.
func TestTranspose(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 41))
	for _, sz := range [][2]int{{1, 1}, {16, 64}, {37, 70}, {5, 130}, {64, 17}} {
		rows, cols := sz[0], sz[1]
		lds, ldd := cols+3, rows+5
		src := ref.Normal(rng, rows*lds)
		dst := make([]float32, cols*ldd)
		for i := range dst {
			dst[i] = -7
		}
		transpose(dst, ldd, src, lds, rows, cols)
		for c := range cols {
			for r := range ldd {
				want := float32(-7)
				if r < rows {
					want = src[r*lds+c]
				}
				if got := dst[c*ldd+r]; got != want {
					t.Fatalf("%d×%d: dst[%d][%d] = %v, want %v", rows, cols, c, r, got, want)
				}
			}
		}
	}
}
