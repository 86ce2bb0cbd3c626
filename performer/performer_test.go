package performer

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

func inputs(rng *rand.Rand, s attn.Shape, qkScale float32) (q, k, v []float32) {
	q, k, v = ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for i := range q {
		q[i] *= qkScale
	}
	for i := range k {
		k[i] *= qkScale
	}
	return q, k, v
}

// unitScale is the entry size at which the scaled inputs x·scale^(1/2)
// have unit norm with the default scale: entries of size d^(-1/4).
func unitScale(d int) float32 { return float32(math.Pow(float64(d), -0.25)) }

func forward(t testing.TB, p attn.Mechanism, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float32) {
	t.Helper()
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	if err := p.Forward(context.Background(), s, q, k, v, o, out, lse); err != nil {
		t.Fatalf("%+v %+v: %v", s, o, err)
	}
	return out, lse
}

func mustNew(t testing.TB, cfg Config) *Performer {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// estimator is the float64 evaluation of the estimator from its definition,
// with the feature map's own W: dense weights φ(q_i)·φ(k_j) on the keys
// the mask allows, out = Σ w v / Σ w, lse = log Σ w.
func estimator(s attn.Shape, q, k, v []float32, o attn.Options, fm *FeatureMap) (out, lse []float64) {
	d := s.D
	w := fm.Projection(d)
	scale := float64(o.ScaleFor(d))
	c := math.Sqrt(math.Abs(scale))
	phi := func(x []float32, sign float64) []float64 {
		rows := len(x) / d
		y := make([]float64, rows*fm.Features(d))
		for r := range rows {
			xr := make([]float64, d)
			n2 := 0.0
			for i := range d {
				xr[i] = sign * c * float64(x[r*d+i])
				n2 += xr[i] * xr[i]
			}
			for f := range fm.nw {
				dot := 0.0
				for i := range d {
					dot += float64(w[f*d+i]) * xr[i]
				}
				switch fm.kind {
				case Positive:
					y[r*fm.m+f] = math.Exp(dot-n2/2) / math.Sqrt(float64(fm.nw))
				case Trig:
					e := math.Exp(n2/2) / math.Sqrt(float64(fm.nw))
					y[r*fm.m+f] = e * math.Sin(dot)
					y[r*fm.m+fm.nw+f] = e * math.Cos(dot)
				}
			}
		}
		return y
	}
	sign := 1.0
	if scale < 0 {
		sign = -1
	}
	pq, pk := phi(q, sign), phi(k, 1)
	m := fm.m
	mask := ref.Mask(s, o)
	out = make([]float64, s.QLen())
	lse = make([]float64, s.LSELen())
	for b := range s.B {
		for h := range s.H {
			kvh := h / s.Group()
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				sum := 0.0
				or := out[row*d : (row+1)*d]
				for j := range s.M {
					if !mask[(b*s.N+i)*s.M+j] {
						continue
					}
					kr := (b*s.HKV+kvh)*s.M + j
					wt := 0.0
					for f := range m {
						wt += pq[row*m+f] * pk[kr*m+f]
					}
					sum += wt
					for c := range d {
						or[c] += wt * float64(v[kr*d+c])
					}
				}
				if sum <= 0 {
					clear(or)
					lse[row] = math.Inf(-1)
					continue
				}
				for c := range or {
					or[c] /= sum
				}
				lse[row] = math.Log(sum)
			}
		}
	}
	return out, lse
}

// TestAgainstEstimator checks the chunked, stabilised computation against
// the dense float64 formula with the same random features: GQA, padding,
// N ≠ M, causal or not, odd chunk sizes.
func TestAgainstEstimator(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, testSeed(t)))
	cases := []struct {
		s     attn.Shape
		chunk int
	}{
		{attn.Shape{B: 2, H: 4, HKV: 2, N: 70, M: 70, D: 24}, 0},
		{attn.Shape{B: 2, H: 4, HKV: 1, N: 33, M: 90, D: 40}, 7},
		{attn.Shape{B: 1, H: 4, HKV: 4, N: 90, M: 41, D: 5}, 16},
	}
	n := 0
	for _, kind := range []Kind{Positive, Trig} {
		for _, c := range cases {
			for _, causal := range []bool{false, true} {
				n++
				p := mustNew(t, Config{Features: 62, Kind: kind, Min: -1, Seed: uint64(n), Chunk: c.chunk})
				o := attn.Options{Causal: causal, Workers: 1 + n%3}
				if n%2 == 0 {
					o.KVLen = make([]int, c.s.B)
					for b := range o.KVLen {
						o.KVLen[b] = rng.IntN(c.s.M + 1)
					}
				}
				if n%3 == 0 {
					o.Scale = -0.3
				}
				q, k, v := inputs(rng, c.s, unitScale(c.s.D))
				out, lse := forward(t, p, c.s, q, k, v, o)
				wantOut, wantLSE := estimator(c.s, q, k, v, o, p.fm)
				name := fmt.Sprintf("%v %+v causal=%v kvlen=%v scale=%v", kind, c.s, causal, o.KVLen, o.Scale)
				// Trig normalisers can be near 0, which amplifies
				// rounding; positive ones cannot.
				tol := 1e-4
				if kind == Trig {
					tol = 1e-3
				}
				if e := ref.RelErr(out, wantOut); e > tol {
					t.Errorf("%s: out rel err %.3g", name, e)
				}
				if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
					t.Errorf("%s: lse rel err %.3g %v", name, e, err)
				}
			}
		}
	}
}

func TestSameSeedSameOutput(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, testSeed(t)))
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 77, M: 77, D: 24}
	q, k, v := inputs(rng, s, 1)
	for _, causal := range []bool{false, true} {
		o := attn.Options{Causal: causal}
		out1, lse1 := forward(t, mustNew(t, Config{Seed: 42, Min: -1}), s, q, k, v, o)
		out2, lse2 := forward(t, mustNew(t, Config{Seed: 42, Min: -1}), s, q, k, v, attn.Options{Causal: causal, Workers: 1})
		if !slices.Equal(out1, out2) || !slices.Equal(lse1, lse2) {
			t.Errorf("causal=%v: same seed, different output", causal)
		}
		out3, _ := forward(t, mustNew(t, Config{Seed: 43, Min: -1}), s, q, k, v, o)
		if slices.Equal(out1, out3) {
			t.Errorf("causal=%v: seeds 42 and 43 give the same output", causal)
		}
	}
}

// meanErr is the error against exact attention averaged over seeds.
func meanErr(t *testing.T, kind Kind, m int, seeds int, s attn.Shape, entry float32, causal bool) (outErr, lseErr float64) {
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 100))
		q, k, v := inputs(rng, s, entry)
		p := mustNew(t, Config{Features: m, Kind: kind, Min: -1, Seed: uint64(1000 + seed)})
		o := attn.Options{Causal: causal}
		out, lse := forward(t, p, s, q, k, v, o)
		wantOut, wantLSE, err := ref.Attention(s, q, k, v, ref.Spec{Mask: ref.Mask(s, o)})
		if err != nil {
			t.Fatal(err)
		}
		outErr += ref.RelErr(out, wantOut)
		e, err := ref.LSEErr(lse, wantLSE)
		if err != nil {
			e = math.Inf(1)
		}
		lseErr += e
	}
	return outErr / float64(seeds), lseErr / float64(seeds)
}

// TestErrorFallsWithFeatures: the estimate approaches exact attention as
// the number of features grows, and is close with 4096 features at unit
// scale.
func TestErrorFallsWithFeatures(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 64, M: 64, D: 32}
	for _, causal := range []bool{false, true} {
		prev := math.Inf(1)
		for _, m := range []int{64, 256, 1024} {
			e, _ := meanErr(t, Positive, m, 6, s, unitScale(s.D), causal)
			t.Logf("causal=%v m=%d: mean out rel err %.3g", causal, m, e)
			if e >= prev {
				t.Errorf("causal=%v: error %.3g with %d features is not below %.3g", causal, e, m, prev)
			}
			prev = e
		}
		e, el := meanErr(t, Positive, 4096, 2, s, unitScale(s.D), causal)
		t.Logf("causal=%v m=4096: out rel err %.3g, lse rel err %.3g", causal, e, el)
		if e > 0.06 || el > 0.02 {
			t.Errorf("causal=%v m=4096: out rel err %.3g, lse rel err %.3g: want below 0.06 and 0.02", causal, e, el)
		}
	}
}

// TestPositiveBeatsTrig: at equal feature counts, positive features are
// more accurate than sin/cos ones on softmax attention (Choromanski et al.
// 2021, §3).
func TestPositiveBeatsTrig(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 64, M: 64, D: 32}
	pos, _ := meanErr(t, Positive, 256, 4, s, 1, false)
	trig, _ := meanErr(t, Trig, 256, 4, s, 1, false)
	t.Logf("unit-normal inputs, 256 features: positive %.3g, trig %.3g", pos, trig)
	if pos >= trig {
		t.Errorf("positive features (err %.3g) no better than trig (%.3g)", pos, trig)
	}
}

// TestUnbiased: the estimated normaliser of one query and one key averages
// to exp(scale·q·k) over seeds.
func TestUnbiased(t *testing.T) {
	// A fixed draw: the tolerance is statistical, over the feature seeds,
	// and this q and k sit well inside it.
	rng := rand.New(rand.NewPCG(3, 3))
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 1, D: 16}
	// Half the unit scale keeps the estimator's relative standard
	// deviation near 0.1 per draw, 0.005 for the mean of 400 draws.
	q, k, v := inputs(rng, s, unitScale(s.D)/2)
	_, want, _ := ref.Attention(s, q, k, v, ref.Spec{})
	for _, kind := range []Kind{Positive, Trig} {
		sum := 0.0
		const seeds = 400
		for seed := range seeds {
			p := mustNew(t, Config{Features: 64, Kind: kind, Min: -1, Seed: uint64(seed)})
			_, lse := forward(t, p, s, q, k, v, attn.Options{})
			sum += math.Exp(float64(lse[0]))
		}
		if r := sum / seeds / math.Exp(want[0]); math.Abs(r-1) > 0.03 {
			t.Errorf("%v: mean estimate / exact = %.4f", kind, r)
		}
	}
}

func TestProjection(t *testing.T) {
	const d, m = 12, 40
	fm, err := NewFeatureMap(Positive, m, 9)
	if err != nil {
		t.Fatal(err)
	}
	w := fm.Projection(d)
	row := func(i int) []float64 {
		r := make([]float64, d)
		for c := range d {
			r[c] = float64(w[i*d+c])
		}
		return r
	}
	dot := func(a, b []float64) float64 {
		s := 0.0
		for i := range a {
			s += a[i] * b[i]
		}
		return s
	}
	meanNorm := 0.0
	for i := range m {
		ri := row(i)
		meanNorm += math.Sqrt(dot(ri, ri)) / m
		for j := i - i%d; j < i; j++ { // same block
			rj := row(j)
			if c := dot(ri, rj) / math.Sqrt(dot(ri, ri)*dot(rj, rj)); math.Abs(c) > 1e-5 {
				t.Errorf("rows %d and %d of one block: cosine %.3g", i, j, c)
			}
		}
	}
	// Row norms follow chi(d), whose mean is close to sqrt(d - 1/2).
	if want := math.Sqrt(d - 0.5); math.Abs(meanNorm-want) > 0.5 {
		t.Errorf("mean row norm %.3f, want about %.3f", meanNorm, want)
	}
	// More features extend W: the first rows do not change.
	big, _ := NewFeatureMap(Positive, 2*m, 9)
	if !slices.Equal(big.Projection(d)[:m*d], w) {
		t.Error("the first 40 rows of an 80-row projection differ from the 40-row one")
	}
}

// TestPrefixInvariance changes every token after position t: causal outputs
// up to t must not change at all, even when the new tokens are huge (a
// stabiliser taken over the whole sequence would change them).
func TestPrefixInvariance(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, testSeed(t)))
	for _, nm := range [][2]int{{150, 150}, {61, 150}} {
		for _, kind := range []Kind{Positive, Trig} {
			s := attn.Shape{B: 1, H: 4, HKV: 2, N: nm[0], M: nm[1], D: 24}
			p := mustNew(t, Config{Features: 64, Kind: kind, Min: -1, Seed: 5, Chunk: 32})
			o := attn.Options{Causal: true}
			q, k, v := inputs(rng, s, 1)
			out1, lse1 := forward(t, p, s, q, k, v, o)
			tq := rng.IntN(s.N)
			tk := s.M - s.N + tq
			for bh := range s.B * s.H {
				for i := tq + 1; i < s.N; i++ {
					for c := range s.D {
						q[(bh*s.N+i)*s.D+c] = 30 * float32(rng.NormFloat64())
					}
				}
			}
			for bh := range s.B * s.HKV {
				for j := tk + 1; j < s.M; j++ {
					for c := range s.D {
						k[(bh*s.M+j)*s.D+c] = 30 * float32(rng.NormFloat64())
						v[(bh*s.M+j)*s.D+c] = 30 * float32(rng.NormFloat64())
					}
				}
			}
			out2, lse2 := forward(t, p, s, q, k, v, o)
			for bh := range s.B * s.H {
				for i := 0; i <= tq; i++ {
					r := bh*s.N + i
					if lse1[r] != lse2[r] || !slices.Equal(out1[r*s.D:(r+1)*s.D], out2[r*s.D:(r+1)*s.D]) {
						t.Fatalf("%v %+v: row %d of head %d (t = %d) changed: lse %v -> %v",
							kind, s, i, bh, tq, lse1[r], lse2[r])
					}
				}
			}
		}
	}
}

// TestPaddingIgnored puts huge values in padding keys and values: the
// result must not change at all.
func TestPaddingIgnored(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, testSeed(t)))
	p := mustNew(t, Config{Features: 64, Min: -1, Chunk: 16})
	for _, causal := range []bool{false, true} {
		s := attn.Shape{B: 2, H: 4, HKV: 1, N: 37, M: 70, D: 24}
		o := attn.Options{Causal: causal, KVLen: []int{rng.IntN(s.M + 1), rng.IntN(s.M + 1)}}
		q, k, v := inputs(rng, s, 1)
		out1, lse1 := forward(t, p, s, q, k, v, o)
		for b := range s.B {
			for j := o.KVLen[b]; j < s.M; j++ {
				base := (b*s.M + j) * s.D
				for c := range s.D {
					k[base+c] = 1e3 * float32(rng.NormFloat64())
					v[base+c] = 1e3 * float32(rng.NormFloat64())
				}
			}
		}
		out2, lse2 := forward(t, p, s, q, k, v, o)
		if !slices.Equal(out1, out2) || !slices.Equal(lse1, lse2) {
			t.Errorf("causal=%v kvlen=%v: padding keys changed the result", causal, o.KVLen)
		}
	}
}

// TestLargeInputs scales the inputs by 100: no NaN or Inf in the output,
// and with positive features none in lse either.
func TestLargeInputs(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, testSeed(t)))
	for _, kind := range []Kind{Positive, Trig} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 1, H: 4, HKV: 2, N: 90, M: 90, D: 40}
			q, k, v := inputs(rng, s, 100)
			for i := range v {
				v[i] *= 100
			}
			p := mustNew(t, Config{Features: 128, Kind: kind, Min: -1, Chunk: 32})
			out, lse := forward(t, p, s, q, k, v, attn.Options{Causal: causal})
			for _, x := range out {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("%v causal=%v: out has %v", kind, causal, x)
				}
			}
			for _, x := range lse {
				// Trig estimates that are not positive give -Inf, as
				// documented; positive features never do.
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 1) || (kind == Positive && math.IsInf(float64(x), -1)) {
					t.Fatalf("%v causal=%v: lse has %v", kind, causal, x)
				}
			}
		}
	}
}

// TestDecode runs the recurrent state token by token against the causal
// pass.
func TestDecode(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, testSeed(t)))
	p := mustNew(t, Config{Features: 64, Min: -1, Chunk: 16})
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: 50, M: 50, D: 24}
	q, k, v := inputs(rng, s, 1)
	want, wantLSE := forward(t, p, s, q, k, v, attn.Options{Causal: true})
	st, err := p.NewState(s.B, s.H, s.HKV, s.D, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := s.D
	got := make([]float64, s.QLen())
	gotLSE := make([]float64, s.LSELen())
	out := make([]float32, s.H*d)
	lse := make([]float32, s.H)
	for i := range s.N {
		var kt, vt, qt []float32
		for h := range s.HKV {
			kt = append(kt, k[(h*s.M+i)*d:][:d]...)
			vt = append(vt, v[(h*s.M+i)*d:][:d]...)
		}
		for h := range s.H {
			qt = append(qt, q[(h*s.N+i)*d:][:d]...)
		}
		if err := st.Append(kt, vt, 1, nil); err != nil {
			t.Fatal(err)
		}
		if err := st.Attend(qt, out, lse); err != nil {
			t.Fatal(err)
		}
		for h := range s.H {
			for c := range d {
				got[(h*s.N+i)*d+c] = float64(out[h*d+c])
			}
			gotLSE[h*s.N+i] = float64(lse[h])
		}
	}
	if e := ref.RelErr(want, got); e > 1e-5 {
		t.Errorf("decode vs forward: out rel err %.3g", e)
	}
	if e, err := ref.LSEErr(wantLSE, gotLSE); err != nil || e > 1e-5 {
		t.Errorf("decode vs forward: lse rel err %.3g %v", e, err)
	}
}

// TestFallback: below Min keys the result is exact attention, bit for bit,
// and Fallback says so exactly when Forward does it.
func TestFallback(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, testSeed(t)))
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 20, M: 30, D: 16}
	q, k, v := inputs(rng, s, 1)
	o := attn.Options{Causal: true}
	want, wantLSE := forward(t, flash.New(flash.Config{}), s, q, k, v, o)
	got, gotLSE := forward(t, mustNew(t, Config{Min: 31}), s, q, k, v, o)
	if !slices.Equal(got, want) || !slices.Equal(gotLSE, wantLSE) {
		t.Error("M < Min: result is not exact attention")
	}
	for _, min := range []int{30, -1} {
		got, _ = forward(t, mustNew(t, Config{Min: min}), s, q, k, v, o)
		if slices.Equal(got, want) {
			t.Errorf("Min %d, M = 30: fell back to exact attention", min)
		}
	}
	p := mustNew(t, Config{})
	if p.Min() != DefaultMin || p.MinFor(false) != DefaultMin || p.MinFor(true) != DefaultMinCausal || DefaultMinCausal != 2*DefaultMin {
		t.Errorf("default thresholds %d/%d/%d, want %d, doubled under the causal mask",
			p.Min(), p.MinFor(false), p.MinFor(true), DefaultMin)
	}
	if p := mustNew(t, Config{Min: 100}); p.MinFor(true) != 100 {
		t.Errorf("an explicit Min is doubled under the causal mask: %d", p.MinFor(true))
	}
	if got, want := attn.FallbackOf(p, attn.Shape{B: 1, H: 1, HKV: 1, N: 1000, M: 1000, D: 8}, o),
		"M = 1000 < min = 4096 (causal): ran exact attention"; got != want {
		t.Errorf("Fallback = %q, want %q", got, want)
	}

	// Fallback agrees with what Forward does, on both sides of every
	// threshold: exact attention is flash's result bit for bit, the
	// random features never are.
	for _, cfg := range []Config{{Min: 25, Features: 32}, {Min: -1, Features: 32}, {Features: 32}} {
		p := mustNew(t, cfg)
		for _, m := range []int{2, 24, 25, 26} {
			for _, causal := range []bool{false, true} {
				s := attn.Shape{B: 1, H: 2, HKV: 1, N: 9, M: m, D: 8}
				o := attn.Options{Causal: causal}
				q, k, v := inputs(rng, s, 1)
				got, _ := forward(t, p, s, q, k, v, o)
				want, _ := forward(t, flash.New(flash.Config{}), s, q, k, v, o)
				ranExact := slices.Equal(got, want)
				reason := p.Fallback(s, o)
				if ranExact != (reason != "") {
					t.Errorf("Min %d, M = %d, causal %v: Fallback %q, but exact = %v", cfg.Min, m, causal, reason, ranExact)
				}
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	for _, cfg := range []Config{{Features: -1}, {Kind: Trig, Features: 7}, {Kind: 5}, {Chunk: -2}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 4, D: 2}
	q, k, v := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out := make([]float32, s.QLen())
	p := mustNew(t, Config{Min: -1})
	ctx := context.Background()
	if err := p.Forward(ctx, s, q[1:], k, v, attn.Options{}, out, nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short q: %v", err)
	}
	if err := p.Forward(ctx, s, q, k, v, attn.Options{KVLen: []int{9}}, out, nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("kvlen 9 > M: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Forward(cctx, s, q, k, v, attn.Options{}, out, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}
