package performer

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/linear"
	"github.com/attnkit/attn/ref"
)

// TestForwardWorkers: the worker count changes no bit of Forward, with
// either kind of features, with and without the masks, on the exact
// fallback too.
func TestForwardWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, testSeed(t)))
	shapes := []attn.Shape{
		{B: 1, H: 8, HKV: 1, N: 75, M: 75, D: 24},
		{B: 1, H: 6, HKV: 2, N: 37, M: 90, D: 13},
		{B: 2, H: 3, HKV: 1, N: 90, M: 41, D: 5},
	}
	for _, cfg := range []Config{{Features: 64, Min: -1, Chunk: 16}, {Features: 62, Kind: Trig, Min: -1}, {Features: 64, Min: 80}} {
		p := mustNew(t, cfg)
		for _, s := range shapes {
			for _, causal := range []bool{false, true} {
				for _, pad := range []bool{false, true} {
					o := attn.Options{Causal: causal}
					if pad {
						o.KVLen = make([]int, s.B)
						for b := range o.KVLen {
							o.KVLen[b] = rng.IntN(s.M + 1)
						}
					}
					q, k, v := inputs(rng, s, unitScale(s.D))
					var out1, lse1 []float32
					for _, w := range []int{1, 2, 3, 8} {
						o.Workers = w
						out, lse := forward(t, p, s, q, k, v, o)
						if w == 1 {
							out1, lse1 = out, lse
							continue
						}
						if i := firstDiff(out, out1); i >= 0 {
							t.Errorf("%+v %+v causal=%v kvlen=%v workers=%d: out[%d] differs from 1 worker", cfg, s, causal, o.KVLen, w, i)
						}
						if i := firstDiff(lse, lse1); i >= 0 {
							t.Errorf("%+v %+v causal=%v kvlen=%v workers=%d: lse[%d] differs from 1 worker", cfg, s, causal, o.KVLen, w, i)
						}
					}
				}
			}
		}
	}
}

// TestNonFinite: a NaN or an infinity makes the rows that use it NaN in out
// and lse (not repaired as an underflow), and no other row changes.
func TestNonFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, testSeed(t)))
	for _, kind := range []Kind{Positive, Trig} {
		p := mustNew(t, Config{Features: 32, Kind: kind, Min: -1, Chunk: 8})
		s := attn.Shape{B: 1, H: 4, HKV: 2, N: 30, M: 30, D: 6}
		o := attn.Options{Causal: true}
		q, k, v := inputs(rng, s, unitScale(s.D))
		out0, lse0 := forward(t, p, s, q, k, v, o)
		for _, c := range []struct {
			x    []float32
			at   int
			uses func(h, i int) bool
		}{
			{q, (2*s.N+11)*s.D + 3, func(h, i int) bool { return h == 2 && i == 11 }},
			{k, (1*s.M+17)*s.D + 5, func(h, i int) bool { return h >= 2 && i >= 17 }},
			{v, (0*s.M+4)*s.D + 0, func(h, i int) bool { return h < 2 && i >= 4 }},
		} {
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
				old := c.x[c.at]
				c.x[c.at] = bad
				out, lse := forward(t, p, s, q, k, v, o)
				c.x[c.at] = old
				for h := range s.H {
					for i := range s.N {
						row := h*s.N + i
						o, o0 := out[row*s.D:][:s.D], out0[row*s.D:][:s.D]
						nan := lse[row] != lse[row]
						for _, x := range o {
							nan = nan && x != x
						}
						if c.uses(h, i) != nan {
							t.Fatalf("%v, %v at %d: row %d of head %d: lse %v, want NaN = %v", kind, bad, c.at, i, h, lse[row], c.uses(h, i))
						}
						if !nan && (firstDiff(o, o0) >= 0 || lse[row] != lse0[row]) {
							t.Fatalf("%v, %v at %d: row %d of head %d changed", kind, bad, c.at, i, h)
						}
					}
				}
			}
		}
	}
}

// TestDecoder prefills a prompt of odd length and decodes the rest token
// by token: every output equals one causal Forward over all positions
// (with the fallback off), and the estimator's float64 formula. Then a
// ragged batch of three equals the sequences' own decoders, bit for bit.
func TestDecoder(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, testSeed(t)))
	for _, kind := range []Kind{Positive, Trig} {
		p := mustNew(t, Config{Features: 48, Kind: kind, Min: -1, Chunk: 16})
		cfg := attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 13, Workers: 2}
		const T, prompt = 60, 37
		s := attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: T, M: T, D: cfg.D}
		q, k, v := inputs(rng, s, unitScale(s.D))
		want, wantLSE := forward(t, p, s, q, k, v, attn.Options{Causal: true})
		dec, err := p.NewDecoder(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, gotLSE := make([]float32, len(want)), make([]float32, len(wantLSE))
		for t0 := 0; t0 < T; {
			n := 1
			if t0 == 0 {
				n = prompt
			}
			o, l := make([]float32, cfg.B*cfg.H*n*cfg.D), make([]float32, cfg.B*cfg.H*n)
			err := dec.Step(context.Background(), positions(q, cfg.B*cfg.H, T, t0, n, cfg.D),
				positions(k, cfg.B*cfg.HKV, T, t0, n, cfg.D), positions(v, cfg.B*cfg.HKV, T, t0, n, cfg.D), n, nil, o, l)
			if err != nil {
				t.Fatal(err)
			}
			place(got, o, cfg.B*cfg.H, T, t0, n, cfg.D)
			place(gotLSE, l, cfg.B*cfg.H, T, t0, n, 1)
			t0 += n
		}
		if dec.Len(0) != T || dec.Len(1) != T {
			t.Errorf("lengths %d %d, want %d", dec.Len(0), dec.Len(1), T)
		}
		tol := 1e-5
		if kind == Trig {
			tol = 1e-4 // normalisers near 0 amplify the rounding
		}
		widen := func(x []float32) []float64 {
			y := make([]float64, len(x))
			for i, v := range x {
				y[i] = float64(v)
			}
			return y
		}
		wantOut, wantL := estimator(s, q, k, v, attn.Options{Causal: true}, p.fm)
		for _, ref64 := range []struct {
			name     string
			out, lse []float64
		}{{"Forward", widen(want), widen(wantLSE)}, {"estimator", wantOut, wantL}} {
			if e := ref.RelErr(got, ref64.out); e > tol {
				t.Errorf("%v decode vs %s: out rel err %.3g", kind, ref64.name, e)
			}
			if e, err := ref.LSEErr(gotLSE, ref64.lse); err != nil || e > tol {
				t.Errorf("%v decode vs %s: lse rel err %.3g %v", kind, ref64.name, e, err)
			}
		}
	}

	// Ragged: three sequences, one empty in the prompt step.
	p := mustNew(t, Config{Features: 40, Min: -1, Chunk: 8})
	cfg := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 7}
	one := cfg
	one.B = 1
	dec, err := p.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var singles []attn.Decoder
	for range cfg.B {
		d1, err := p.NewDecoder(one)
		if err != nil {
			t.Fatal(err)
		}
		singles = append(singles, d1)
	}
	h, hkv, d := cfg.H, cfg.HKV, cfg.D
	for si, st := range []struct {
		n     int
		valid []int
	}{{37, []int{37, 11, 0}}, {1, nil}, {1, []int{0, 1, 1}}, {4, []int{4, 1, 3}}} {
		n := st.n
		q, k, v := inputs(rng, attn.Shape{B: cfg.B, H: h, HKV: hkv, N: n, M: n, D: d}, unitScale(d))
		out, lse := make([]float32, len(q)), make([]float32, cfg.B*h*n)
		if err := dec.Step(context.Background(), q, k, v, n, st.valid, out, lse); err != nil {
			t.Fatal(err)
		}
		for b, single := range singles {
			nb := n
			if st.valid != nil {
				nb = st.valid[b]
			}
			if nb == 0 {
				continue
			}
			o1, l1 := make([]float32, h*nb*d), make([]float32, h*nb)
			err := single.Step(context.Background(), positions(q[b*h*n*d:][:h*n*d], h, n, 0, nb, d),
				positions(k[b*hkv*n*d:][:hkv*n*d], hkv, n, 0, nb, d), positions(v[b*hkv*n*d:][:hkv*n*d], hkv, n, 0, nb, d), nb, nil, o1, l1)
			if err != nil {
				t.Fatal(err)
			}
			if firstDiff(positions(out[b*h*n*d:][:h*n*d], h, n, 0, nb, d), o1) >= 0 || firstDiff(positions(lse[b*h*n:][:h*n], h, n, 0, nb, 1), l1) >= 0 {
				t.Fatalf("step %d sequence %d differs from its own decoder", si, b)
			}
			for hd := range h {
				for i := nb; i < n; i++ {
					if !math.IsInf(float64(lse[(b*h+hd)*n+i]), -1) {
						t.Fatalf("step %d sequence %d: padding row %d has lse %v", si, b, i, lse[(b*h+hd)*n+i])
					}
				}
			}
		}
	}
	if dec.Len(0) != 37+1+0+4 || dec.Len(1) != 11+1+1+1 || dec.Len(2) != 0+1+1+3 {
		t.Errorf("lengths %d %d %d", dec.Len(0), dec.Len(1), dec.Len(2))
	}
}

// TestDecoderPrefix: in a prompt step, rows up to t do not change when the
// positions after t do, even to huge values.
func TestDecoderPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, testSeed(t)))
	p := mustNew(t, Config{Features: 32, Min: -1, Chunk: 8})
	cfg := attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 9}
	const n = 41
	s := attn.Shape{B: 1, H: 4, HKV: 2, N: n, M: n, D: 9}
	q, k, v := inputs(rng, s, 1)
	run := func() ([]float32, []float32) {
		dec, err := p.NewDecoder(cfg)
		if err != nil {
			t.Fatal(err)
		}
		out, lse := make([]float32, len(q)), make([]float32, s.LSELen())
		if err := dec.Step(context.Background(), q, k, v, n, nil, out, lse); err != nil {
			t.Fatal(err)
		}
		return out, lse
	}
	out1, lse1 := run()
	tq := rng.IntN(n)
	for r := range s.H {
		for i := tq + 1; i < n; i++ {
			for c := range s.D {
				q[(r*n+i)*s.D+c] = 30 * float32(rng.NormFloat64())
			}
		}
	}
	for r := range s.HKV {
		for i := tq + 1; i < n; i++ {
			for c := range s.D {
				k[(r*n+i)*s.D+c] = 30 * float32(rng.NormFloat64())
				v[(r*n+i)*s.D+c] = 30 * float32(rng.NormFloat64())
			}
		}
	}
	out2, lse2 := run()
	for r := range s.H {
		for i := 0; i <= tq; i++ {
			row := r*n + i
			if firstDiff(out1[row*s.D:][:s.D], out2[row*s.D:][:s.D]) >= 0 || lse1[row] != lse2[row] {
				t.Fatalf("row %d of head %d (t = %d) changed", i, r, tq)
			}
		}
	}
}

func TestDecoderErrors(t *testing.T) {
	p := mustNew(t, Config{})
	for _, c := range []struct {
		cfg  attn.DecodeConfig
		want error
	}{
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 8, Window: 16}, attn.ErrUnsupported},
		{attn.DecodeConfig{B: 1, H: 3, HKV: 2, D: 8}, attn.ErrShape},
		// 256 features × 2^20 head size × 2^10 kv heads: far past the
		// bound, within attn.Shape's.
		{attn.DecodeConfig{B: 1, H: 1 << 10, HKV: 1 << 10, D: 1 << 20}, attn.ErrShape},
	} {
		if dec, err := p.NewDecoder(c.cfg); !errors.Is(err, c.want) || dec != nil {
			t.Errorf("NewDecoder(%+v): %v, want %v", c.cfg, err, c.want)
		}
	}
	for _, c := range [][4]int{{1 << 20, 1 << 10, 1 << 10, 1 << 10}, {1, 1, 1, min(1<<40, math.MaxInt)}, {1 << 30, 8, 8, 128}} {
		if st, err := p.NewState(c[0], c[1], c[2], c[3], 0); !errors.Is(err, attn.ErrShape) || st != nil {
			t.Errorf("NewState(%v): %v", c, err)
		}
	}
	dec, err := p.NewDecoder(attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 8, MaxLen: 4, Storage: "i8"})
	if err != nil {
		t.Fatal(err)
	}
	q, kv := make([]float32, 2*5*8), make([]float32, 5*8)
	out := make([]float32, len(q))
	if err := dec.Step(context.Background(), q, kv, kv, 5, nil, out, nil); !errors.Is(err, attn.ErrFull) || dec.Len(0) != 0 {
		t.Errorf("5 positions past MaxLen = 4: %v, Len %d", err, dec.Len(0))
	}
	if err := dec.Step(context.Background(), q, kv, kv, 5, []int{4}, out, nil); err != nil || dec.Len(0) != 4 {
		t.Errorf("4 of 5 positions up to MaxLen = 4: %v, Len %d", err, dec.Len(0))
	}
	if _, ok := dec.(*linear.Decoder); !ok {
		t.Errorf("decoder is a %T, want a *linear.Decoder", dec)
	}
	if want := 4 * (1 * 256 * (8 + 1)); dec.Bytes() < want {
		t.Errorf("Bytes() = %d, below the state's %d", dec.Bytes(), want)
	}
	dec.Reset()
	if dec.Len(0) != 0 {
		t.Errorf("Len after Reset = %d", dec.Len(0))
	}
}

// positions returns positions [t0, t0+n) of x, laid out [rows][T][D], as
// [rows][n][D].
func positions(x []float32, rows, T, t0, n, d int) []float32 {
	y := make([]float32, 0, rows*n*d)
	for r := range rows {
		y = append(y, x[(r*T+t0)*d:(r*T+t0+n)*d]...)
	}
	return y
}

// place writes y, [rows][n][D], into positions [t0, t0+n) of x, laid out
// [rows][T][D].
func place(x, y []float32, rows, T, t0, n, d int) {
	for r := range rows {
		copy(x[(r*T+t0)*d:(r*T+t0+n)*d], y[r*n*d:(r+1)*n*d])
	}
}
