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
)

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

// decodeAll runs dec over the T positions of q, k, v ([B][H][T][D],
// [B][Hkv][T][D]) in steps of the given sizes, the last repeated, and
// returns the outputs laid out as q and lse [B][H][T].
func decodeAll(t *testing.T, dec attn.Decoder, cfg attn.DecodeConfig, q, k, v []float32, T int, steps []int) (out, lse []float32) {
	t.Helper()
	d := cfg.D
	out = make([]float32, cfg.B*cfg.H*T*d)
	lse = make([]float32, cfg.B*cfg.H*T)
	for t0, s := 0, 0; t0 < T; s++ {
		n := steps[min(s, len(steps)-1)]
		n = min(n, T-t0)
		o := make([]float32, cfg.B*cfg.H*n*d)
		l := make([]float32, cfg.B*cfg.H*n)
		err := dec.Step(context.Background(), positions(q, cfg.B*cfg.H, T, t0, n, d),
			positions(k, cfg.B*cfg.HKV, T, t0, n, d), positions(v, cfg.B*cfg.HKV, T, t0, n, d), n, nil, o, l)
		if err != nil {
			t.Fatalf("step at %d of %d: %v", t0, n, err)
		}
		place(out, o, cfg.B*cfg.H, T, t0, n, d)
		place(lse, l, cfg.B*cfg.H, T, t0, n, 1)
		t0 += n
	}
	for b := range cfg.B {
		if dec.Len(b) != T {
			t.Errorf("Len(%d) = %d after %d positions", b, dec.Len(b), T)
		}
	}
	return out, lse
}

func newDecoder(t *testing.T, m attn.Decodable, cfg attn.DecodeConfig) attn.Decoder {
	t.Helper()
	dec, err := m.NewDecoder(cfg)
	if err != nil {
		t.Fatalf("NewDecoder(%+v): %v", cfg, err)
	}
	return dec
}

// TestDecoderMatchesForward prefills a prompt of odd length, then decodes
// token by token (or in uneven chunks), and compares every output with
// one causal Forward pass over all the positions, and that with the
// float64 formula.
func TestDecoderMatchesForward(t *testing.T) {
	rng := rand.New(rand.NewPCG(50, testSeed(t)))
	maps := []struct {
		name string
		a    *Attention
	}{
		{"elu", New(Config{})},
		{"elu", New(Config{Chunk: 7})},
		{"exp", New(Config{Map: expMap{}, Chunk: 16})},
	}
	for _, mp := range maps {
		for _, steps := range [][]int{{37, 1}, {20, 17, 5, 1, 3}, {1}} {
			cfg := attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 13, Workers: 2}
			const T = 75
			s := attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: T, M: T, D: cfg.D}
			q, k, v := inputs(rng, s)
			want, wantLSE := forward(t, mp.a, s, q, k, v, attn.Options{Causal: true})
			got, gotLSE := decodeAll(t, newDecoder(t, mp.a, cfg), cfg, q, k, v, T, steps)
			name := fmt.Sprintf("%s chunk %d steps %v", mp.name, mp.a.Chunk(), steps)
			checkClose(t, name+" vs Forward", got, gotLSE, widen(want), widen(wantLSE))
			f, fl := formula(s, q, k, v, attn.Options{Causal: true}, mp.name)
			checkClose(t, name+" vs formula", got, gotLSE, f, fl)
		}
	}
}

// TestDecoderRagged steps a batch of three sequences of different lengths
// (padding in the prompt step and in later steps) and checks each against
// a decoder of its own, bit for bit, and the padding rows.
func TestDecoderRagged(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, testSeed(t)))
	for _, a := range []*Attention{New(Config{Chunk: 16}), New(Config{Map: expMap{}, Chunk: 5})} {
		cfg := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 9, Workers: 3}
		one := cfg
		one.B = 1
		dec := newDecoder(t, a, cfg)
		singles := []attn.Decoder{newDecoder(t, a, one), newDecoder(t, a, one), newDecoder(t, a, one)}
		d, h, hkv := cfg.D, cfg.H, cfg.HKV
		steps := []struct {
			n     int
			valid []int
		}{{37, []int{37, 20, 0}}, {1, []int{1, 1, 1}}, {1, []int{1, 0, 1}}, {6, []int{6, 2, 5}}, {1, nil}}
		for si, st := range steps {
			n := st.n
			q, k, v := randn(rng, cfg.B*h*n*d), randn(rng, cfg.B*hkv*n*d), randn(rng, cfg.B*hkv*n*d)
			out, lse := make([]float32, len(q)), make([]float32, cfg.B*h*n)
			for i := range out {
				out[i] = 7 // Step must write every element, padding too
			}
			for i := range lse {
				lse[i] = 7
			}
			if err := dec.Step(context.Background(), q, k, v, n, st.valid, out, lse); err != nil {
				t.Fatal(err)
			}
			for b, single := range singles {
				nb := n
				if st.valid != nil {
					nb = st.valid[b]
				}
				ob, lb := out[b*h*n*d:][:h*n*d], lse[b*h*n:][:h*n]
				for hd := range h {
					for i := nb; i < n; i++ {
						if l := lb[hd*n+i]; !math.IsInf(float64(l), -1) || slices.ContainsFunc(ob[(hd*n+i)*d:][:d], func(x float32) bool { return x != 0 }) {
							t.Fatalf("step %d sequence %d: padding row %d of head %d has lse %v", si, b, i, hd, l)
						}
					}
				}
				if nb == 0 {
					continue
				}
				qb := positions(q[b*h*n*d:][:h*n*d], h, n, 0, nb, d)
				kb := positions(k[b*hkv*n*d:][:hkv*n*d], hkv, n, 0, nb, d)
				vb := positions(v[b*hkv*n*d:][:hkv*n*d], hkv, n, 0, nb, d)
				o1, l1 := make([]float32, len(qb)), make([]float32, h*nb)
				if err := single.Step(context.Background(), qb, kb, vb, nb, nil, o1, l1); err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(positions(ob, h, n, 0, nb, d), o1); i >= 0 {
					t.Fatalf("%T step %d sequence %d: out[%d] differs from its own decoder", a.fm, si, b, i)
				}
				if i := firstDiff(positions(lb, h, n, 0, nb, 1), l1); i >= 0 {
					t.Fatalf("%T step %d sequence %d: lse[%d] differs from its own decoder", a.fm, si, b, i)
				}
			}
		}
		for b, single := range singles {
			if dec.Len(b) != single.Len(0) {
				t.Errorf("Len(%d) = %d, its own decoder %d", b, dec.Len(b), single.Len(0))
			}
		}
		if want := []int{37 + 1 + 1 + 6 + 1, 20 + 1 + 0 + 2 + 1, 0 + 1 + 1 + 5 + 1}; dec.Len(0) != want[0] || dec.Len(1) != want[1] || dec.Len(2) != want[2] {
			t.Errorf("lengths %d %d %d, want %v", dec.Len(0), dec.Len(1), dec.Len(2), want)
		}
	}
}

// TestDecoderPrefix changes the positions of a prompt after t, values to
// NaN: the outputs up to t do not change at all.
func TestDecoderPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(52, testSeed(t)))
	for _, a := range []*Attention{New(Config{Chunk: 8}), New(Config{Map: expMap{}, Chunk: 8})} {
		cfg := attn.DecodeConfig{B: 2, H: 4, HKV: 1, D: 11}
		const n = 37
		q, k, v := randn(rng, cfg.B*cfg.H*n*cfg.D), randn(rng, cfg.B*cfg.HKV*n*cfg.D), randn(rng, cfg.B*cfg.HKV*n*cfg.D)
		run := func() ([]float32, []float32) {
			out, lse := make([]float32, len(q)), make([]float32, cfg.B*cfg.H*n)
			if err := newDecoder(t, a, cfg).Step(context.Background(), q, k, v, n, nil, out, lse); err != nil {
				t.Fatal(err)
			}
			return out, lse
		}
		out1, lse1 := run()
		tq := rng.IntN(n)
		for r := range cfg.B * cfg.H {
			for i := tq + 1; i < n; i++ {
				for c := range cfg.D {
					q[(r*n+i)*cfg.D+c] = 40 * float32(rng.NormFloat64())
				}
			}
		}
		for r := range cfg.B * cfg.HKV {
			for i := tq + 1; i < n; i++ {
				for c := range cfg.D {
					k[(r*n+i)*cfg.D+c] = 40 * float32(rng.NormFloat64())
					v[(r*n+i)*cfg.D+c] = float32(math.NaN())
				}
			}
		}
		out2, lse2 := run()
		for r := range cfg.B * cfg.H {
			for i := 0; i <= tq; i++ {
				row := r*n + i
				if firstDiff(out1[row*cfg.D:][:cfg.D], out2[row*cfg.D:][:cfg.D]) >= 0 || firstDiff(lse1[row:row+1], lse2[row:row+1]) >= 0 {
					t.Fatalf("%T: row %d of head %d (t = %d) changed", a.fm, i, r, tq)
				}
			}
		}
	}
}

// TestDecoderWorkersResetBytes: the worker count changes no bit, Reset
// starts the sequences afresh, Bytes does not grow with the length.
func TestDecoderWorkersResetBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, testSeed(t)))
	a := New(Config{Chunk: 16})
	cfg := attn.DecodeConfig{B: 3, H: 6, HKV: 3, D: 10, Workers: 1}
	const T = 50
	s := attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: T, M: T, D: cfg.D}
	q, k, v := inputs(rng, s)
	d1 := newDecoder(t, a, cfg)
	bytes := d1.Bytes()
	if bytes < 4*cfg.B*cfg.HKV*cfg.D*(cfg.D+1) {
		t.Errorf("Bytes() = %d, below the prefix sums' %d", bytes, 4*cfg.B*cfg.HKV*cfg.D*(cfg.D+1))
	}
	out1, lse1 := decodeAll(t, d1, cfg, q, k, v, T, []int{23, 1})
	if d1.Bytes() != bytes {
		t.Errorf("Bytes() grew from %d to %d", bytes, d1.Bytes())
	}
	d1.Reset()
	for b := range cfg.B {
		if d1.Len(b) != 0 {
			t.Fatalf("Len(%d) = %d after Reset", b, d1.Len(b))
		}
	}
	out2, lse2 := decodeAll(t, d1, cfg, q, k, v, T, []int{23, 1})
	if firstDiff(out1, out2) >= 0 || firstDiff(lse1, lse2) >= 0 {
		t.Error("after Reset the same steps give other outputs")
	}
	for _, w := range []int{2, 3, 8} {
		cw := cfg
		cw.Workers = w
		out3, lse3 := decodeAll(t, newDecoder(t, a, cw), cw, q, k, v, T, []int{23, 1})
		if i := firstDiff(out1, out3); i >= 0 || firstDiff(lse1, lse3) >= 0 {
			t.Errorf("Workers = %d: out[%d] differs from 1 worker", w, i)
		}
	}
}

func TestDecoderErrors(t *testing.T) {
	a := New(Config{})
	good := attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 4, MaxLen: 5}
	for _, c := range []struct {
		cfg  attn.DecodeConfig
		want error
	}{
		{attn.DecodeConfig{B: 1, H: 3, HKV: 2, D: 4}, attn.ErrShape},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Window: 8}, attn.ErrUnsupported},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Window: 8, Sinks: 2}, attn.ErrUnsupported},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Sinks: 2}, attn.ErrInput},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Scale: float32(math.NaN())}, attn.ErrInput},
		{attn.DecodeConfig{B: 1 << 20, H: 1 << 10, HKV: 1 << 10, D: 1 << 10}, attn.ErrShape},
	} {
		if dec, err := a.NewDecoder(c.cfg); !errors.Is(err, c.want) || dec != nil {
			t.Errorf("NewDecoder(%+v): %v, want %v", c.cfg, err, c.want)
		}
	}
	// Storage means nothing to a recurrent state.
	bf := good
	bf.Storage = "bf16"
	newDecoder(t, a, bf)

	dec := newDecoder(t, a, good)
	ctx := context.Background()
	x := make([]float32, 2*2*3*4)
	out := make([]float32, len(x))
	kv := x[:2*1*3*4]
	if err := dec.Step(ctx, x[1:], kv, kv, 3, nil, out, nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short q: %v", err)
	}
	if err := dec.Step(ctx, x, kv, kv, 3, []int{4, 0}, out, nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("valid 4 > n = 3: %v", err)
	}
	if err := dec.Step(ctx, x, kv, kv, 3, []int{3, 1}, out, nil); err != nil {
		t.Fatal(err)
	}
	// Sequence 0 holds 3 of at most 5: 3 more is past MaxLen, and the
	// failed step appends nothing to either sequence.
	if err := dec.Step(ctx, x, kv, kv, 3, nil, out, nil); !errors.Is(err, attn.ErrFull) {
		t.Errorf("past MaxLen: %v", err)
	}
	if dec.Len(0) != 3 || dec.Len(1) != 1 {
		t.Errorf("after a failed step: lengths %d %d, want 3 1", dec.Len(0), dec.Len(1))
	}
	if err := dec.Step(ctx, x, kv, kv, 3, []int{2, 3}, out, nil); err != nil {
		t.Errorf("up to MaxLen: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	dec.Reset()
	if err := dec.Step(cctx, x, kv, kv, 3, nil, out, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

// TestDecoderNonFinite: a NaN value in one sequence's prompt makes its rows
// from there on NaN, not those before it nor the other sequence's.
func TestDecoderNonFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(54, testSeed(t)))
	cfg := attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 6}
	dec := newDecoder(t, New(Config{Chunk: 4}), cfg)
	const n = 11
	q, k, v := randn(rng, 2*2*n*6), randn(rng, 2*n*6), randn(rng, 2*n*6)
	v[(n+5)*6+2] = float32(math.NaN()) // sequence 1, position 5
	out, lse := make([]float32, len(q)), make([]float32, 2*2*n)
	if err := dec.Step(context.Background(), q, k, v, n, nil, out, lse); err != nil {
		t.Fatal(err)
	}
	for row, l := range lse {
		b, i := row/(2*n), row%n
		if want := b == 1 && i >= 5; isNaN(l) != want || allNaN(out[row*6:][:6]) != want {
			t.Errorf("row %d of sequence %d: lse %v, want NaN = %v", i, b, l, want)
		}
	}
	q1, kv1 := randn(rng, 2*2*6), randn(rng, 2*6)
	if err := dec.Step(context.Background(), q1, kv1, kv1, 1, nil, out[:24], lse[:4]); err != nil {
		t.Fatal(err)
	}
	if isNaN(lse[0]) || isNaN(lse[1]) || !isNaN(lse[2]) || !isNaN(lse[3]) {
		t.Errorf("next token: lse %v, want NaN for sequence 1 only", lse[:4])
	}
}
