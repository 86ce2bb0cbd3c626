package sparse

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/ref"
)

// freshSeed returns a fresh seed for a test's random inputs and logs it
// (shown when the test fails, or with -v); SPARSE_SEED=<seed> reruns the
// tests with that seed.
func freshSeed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("SPARSE_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 0, 64); err != nil {
			t.Fatalf("SPARSE_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (SPARSE_SEED=%d reruns it)", seed, seed)
	return seed
}

// decodeCase is a mechanism to decode.
type decodeCase struct {
	name  string
	build func() (*Attention, error)
}

func decodeCases(seed uint64) []decodeCase {
	return []decodeCase{
		{"window", func() (*Attention, error) { return NewWindow(WindowConfig{Left: 9, Right: 4}) }},
		{"window dilated", func() (*Attention, error) { return NewWindow(WindowConfig{Left: 13, Dilation: 3}) }},
		// Longer than a ring may be: every position is stored.
		{"window long", func() (*Attention, error) { return NewWindow(WindowConfig{Left: maxRing + 1, Dilation: 2}) }},
		{"strided", func() (*Attention, error) { return NewStrided(StridedConfig{Stride: 5}) }},
		{"fixed", func() (*Attention, error) { return NewStrided(StridedConfig{Mode: ModeFixed, Stride: 6, Summary: 2}) }},
		{"longformer", func() (*Attention, error) {
			return NewLongformer(LongformerConfig{Left: 4, Right: 2, Globals: []int{40, 0, 11, 500}})
		}},
		{"bigbird", func() (*Attention, error) {
			return NewBigBird(BigBirdConfig{Block: 4, Window: 3, Globals: 1, Random: 2, Seed: seed})
		}},
	}
}

// sequence is one sequence's whole tensors: q [H][T][D], k and v
// [Hkv][T][D].
type sequence struct {
	h, hkv, t, d int
	q, k, v      []float32
}

func newSequence(rng *rand.Rand, h, hkv, t, d int) sequence {
	return sequence{h, hkv, t, d, ref.Normal(rng, h*t*d), ref.Normal(rng, hkv*t*d), ref.Normal(rng, hkv*t*d)}
}

// part returns positions [t0, t1) of x ([heads][T][D]) as [heads][t1-t0][D].
func (sq sequence) part(x []float32, heads, t0, t1 int) []float32 {
	var out []float32
	for h := range heads {
		out = append(out, x[(h*sq.t+t0)*sq.d:(h*sq.t+t1)*sq.d]...)
	}
	return out
}

// forward is one causal Forward of a over the whole sequence.
func (sq sequence) forward(t *testing.T, a *Attention) (out, lse []float32) {
	t.Helper()
	s := attn.Shape{B: 1, H: sq.h, HKV: sq.hkv, N: sq.t, M: sq.t, D: sq.d}
	out, lse = make([]float32, s.QLen()), make([]float32, s.LSELen())
	if err := a.Forward(context.Background(), s, sq.q, sq.k, sq.v, attn.Options{Causal: true}, out, lse); err != nil {
		t.Fatal(err)
	}
	return out, lse
}

// decode feeds the sequence to dec (B = 1) in chunks and returns the
// outputs as [H][T][D] and lse as [H][T].
func (sq sequence) decode(t *testing.T, dec attn.Decoder, chunks []int) (out, lse []float32) {
	t.Helper()
	out, lse = make([]float32, sq.h*sq.t*sq.d), make([]float32, sq.h*sq.t)
	t0 := 0
	for _, n := range chunks {
		t1 := t0 + n
		o, l := make([]float32, sq.h*n*sq.d), make([]float32, sq.h*n)
		if err := dec.Step(context.Background(), sq.part(sq.q, sq.h, t0, t1), sq.part(sq.k, sq.hkv, t0, t1),
			sq.part(sq.v, sq.hkv, t0, t1), n, nil, o, l); err != nil {
			t.Fatalf("step [%d, %d): %v", t0, t1, err)
		}
		for h := range sq.h {
			copy(out[(h*sq.t+t0)*sq.d:][:n*sq.d], o[h*n*sq.d:][:n*sq.d])
			copy(lse[h*sq.t+t0:][:n], l[h*n:][:n])
		}
		t0 = t1
		if dec.Len(0) != t0 {
			t.Fatalf("Len %d after %d positions", dec.Len(0), t0)
		}
	}
	return out, lse
}

// chunksFor is a prompt of odd length, a second chunk, then one
// position a step, up to t.
func chunksFor(t int) []int {
	ch := []int{31, 6}
	for n := 37; n < t; n++ {
		ch = append(ch, 1)
	}
	return ch
}

// TestDecodeMatchesForward prefills a prompt, decodes the rest token by
// token and compares with one causal Forward over all the tokens.
func TestDecodeMatchesForward(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	const T = 113
	for _, dc := range decodeCases(seed) {
		for _, sh := range [][3]int{{4, 2, 20}, {6, 1, 9}, {32, 2, 12}} {
			a, err := dc.build()
			if err != nil {
				t.Fatal(err)
			}
			sq := newSequence(rng, sh[0], sh[1], T, sh[2])
			want, wantLSE := sq.forward(t, a)
			dec, err := a.NewDecoder(attn.DecodeConfig{B: 1, H: sq.h, HKV: sq.hkv, D: sq.d, Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			got, lse := sq.decode(t, dec, chunksFor(T))
			name := fmt.Sprintf("%s H=%d Hkv=%d D=%d", dc.name, sq.h, sq.hkv, sq.d)
			if e := ref.RelErr(got, f64(want)); e > tol {
				t.Errorf("%s: out rel err %.3g against Forward", name, e)
			}
			if e, err := ref.LSEErr(lse, f64(wantLSE)); err != nil || e > tol {
				t.Errorf("%s: lse rel err %.3g %v against Forward", name, e, err)
			}
			// Reset empties the decoder; decoding again gives the same.
			dec.Reset()
			if dec.Len(0) != 0 {
				t.Fatalf("%s: Len %d after Reset", name, dec.Len(0))
			}
			again, _ := sq.decode(t, dec, chunksFor(T))
			if !slices.Equal(got, again) {
				t.Errorf("%s: decoding after Reset differs", name)
			}
		}
	}
}

// TestDecodeStorage decodes with compact storage: within its rounding of
// the float32 result, and not equal to it (the keys were rounded).
func TestDecodeStorage(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	const T = 90
	// Bounds as kvcache's tests take them: bf16 keeps 8 bits, f16 11, i8
	// a scale of max|row|/127.
	for _, st := range []struct {
		name string
		tol  float64
	}{{"bf16", 1e-2}, {"f16", 2e-3}, {"i8", 3e-2}} {
		for _, dc := range decodeCases(seed) {
			a, err := dc.build()
			if err != nil {
				t.Fatal(err)
			}
			sq := newSequence(rng, 4, 2, T, 20)
			want, _ := sq.forward(t, a)
			dec, err := a.NewDecoder(attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 20, Storage: st.name})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := sq.decode(t, dec, chunksFor(T))
			e := ref.RelErr(got, f64(want))
			if e > st.tol || e < 1e-6 {
				t.Errorf("%s %s: out rel err %.3g against float32 Forward, want in [1e-6, %g]", dc.name, st.name, e, st.tol)
			}
		}
	}
}

// TestDecodeRagged decodes a batch of three sequences of different
// lengths, with padding, and compares with each sequence decoded alone.
func TestDecodeRagged(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	const h, hkv, d = 4, 2, 11
	// Valid counts per step: a padded prompt chunk, a padded chunk with
	// an empty sequence, then single positions, some padded.
	steps := [][]int{{31, 8, 19}, {5, 0, 3}}
	for range 40 {
		steps = append(steps, []int{1, rng.IntN(2), 1})
	}
	widths := []int{31, 5}
	for range 40 {
		widths = append(widths, 1)
	}
	for _, dc := range decodeCases(seed) {
		a, err := dc.build()
		if err != nil {
			t.Fatal(err)
		}
		var seqs []sequence
		for b := range 3 {
			tot := 0
			for _, st := range steps {
				tot += st[b]
			}
			seqs = append(seqs, newSequence(rng, h, hkv, tot, d))
		}
		cfg := attn.DecodeConfig{B: 3, H: h, HKV: hkv, D: d, Workers: 3}
		dec, err := a.NewDecoder(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := make([][]float32, 3)
		gotLSE := make([][]float32, 3)
		for b := range got {
			got[b] = make([]float32, h*seqs[b].t*d)
			gotLSE[b] = make([]float32, h*seqs[b].t)
		}
		at := make([]int, 3)
		for si, st := range steps {
			n := widths[si]
			q, k, v := make([]float32, 3*h*n*d), make([]float32, 3*hkv*n*d), make([]float32, 3*hkv*n*d)
			for i := range q {
				q[i] = float32(math.NaN()) // padding must not matter
			}
			for b, sq := range seqs {
				copy(q[b*h*n*d:], padTo(sq.part(sq.q, h, at[b], at[b]+st[b]), h, st[b], n, d))
				copy(k[b*hkv*n*d:], padTo(sq.part(sq.k, hkv, at[b], at[b]+st[b]), hkv, st[b], n, d))
				copy(v[b*hkv*n*d:], padTo(sq.part(sq.v, hkv, at[b], at[b]+st[b]), hkv, st[b], n, d))
			}
			out, lse := make([]float32, 3*h*n*d), make([]float32, 3*h*n)
			if err := dec.Step(context.Background(), q, k, v, n, st, out, lse); err != nil {
				t.Fatalf("%s step %d: %v", dc.name, si, err)
			}
			for b := range seqs {
				for hd := range h {
					for i := range n {
						row := (b*h+hd)*n + i
						if i >= st[b] {
							if !math.IsInf(float64(lse[row]), -1) || slices.ContainsFunc(out[row*d:][:d], func(x float32) bool { return x != 0 }) {
								t.Fatalf("%s step %d: padded row %d of sequence %d has lse %v", dc.name, si, i, b, lse[row])
							}
							continue
						}
						copy(got[b][(hd*seqs[b].t+at[b]+i)*d:][:d], out[row*d:][:d])
						gotLSE[b][hd*seqs[b].t+at[b]+i] = lse[row]
					}
				}
				at[b] += st[b]
				if dec.Len(b) != at[b] {
					t.Fatalf("%s: Len(%d) = %d, want %d", dc.name, b, dec.Len(b), at[b])
				}
			}
		}
		for b, sq := range seqs {
			alone, err := a.NewDecoder(attn.DecodeConfig{B: 1, H: h, HKV: hkv, D: d})
			if err != nil {
				t.Fatal(err)
			}
			var chunks []int
			for _, st := range steps {
				if st[b] > 0 {
					chunks = append(chunks, st[b])
				}
			}
			want, wantLSE := sq.decode(t, alone, chunks)
			if !slices.Equal(got[b], want) || !slices.Equal(gotLSE[b], wantLSE) {
				t.Errorf("%s: sequence %d in the batch differs from it alone (out rel err %.3g)", dc.name, b, ref.RelErr(got[b], f64(want)))
			}
		}
	}
}

// padTo lays x ([heads][nb][d]) out as [heads][n][d], zero past nb.
func padTo(x []float32, heads, nb, n, d int) []float32 {
	out := make([]float32, heads*n*d)
	for h := range heads {
		copy(out[h*n*d:], x[h*nb*d:][:nb*d])
	}
	return out
}

// TestDecodeWindowAndSinks decodes with a StreamingLLM window on top of
// the pattern and compares with float64 attention under the pattern ∧
// causal ∧ (j > p-Window or j < Sinks).
func TestDecodeWindowAndSinks(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 4))
	const T = 97
	for _, dc := range decodeCases(seed) {
		for _, ws := range [][2]int{{6, 2}, {17, 0}, {40, 3}} {
			a, err := dc.build()
			if err != nil {
				t.Fatal(err)
			}
			sq := newSequence(rng, 4, 2, T, 10)
			s := attn.Shape{B: 1, H: 4, HKV: 2, N: T, M: T, D: 10}
			pat, err := a.Pattern(s, true)
			if err != nil {
				t.Fatal(err)
			}
			w, sinks := ws[0], ws[1]
			mask := make([]bool, T*T)
			for p := range T {
				for j := 0; j <= p; j++ {
					mask[p*T+j] = pat.Visible(p, j) && (j > p-w || j < sinks)
				}
			}
			want, wantLSE, err := ref.Attention(s, sq.q, sq.k, sq.v, ref.Spec{Mask: mask})
			if err != nil {
				t.Fatal(err)
			}
			dec, err := a.NewDecoder(attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 10, Window: w, Sinks: sinks})
			if err != nil {
				t.Fatal(err)
			}
			got, lse := sq.decode(t, dec, chunksFor(T))
			name := fmt.Sprintf("%s window %d sinks %d", dc.name, w, sinks)
			if e := ref.RelErr(got, want); e > tol {
				t.Errorf("%s: out rel err %.3g", name, e)
			}
			if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
				t.Errorf("%s: lse rel err %.3g %v", name, e, err)
			}
			if held := dec.(*decoder).caches[0].Held(); held > w+sinks {
				t.Errorf("%s: the cache holds %d positions, more than Window+Sinks", name, held)
			}
		}
	}
}

// TestDecodeWindowReads checks that a window step reads O(Left) rows
// whatever the length: the keys it attends are exactly the window's, the
// cache holds at most Left+1 positions in a fixed allocation, and keys
// of the other residues of a dilated window, poisoned with NaN, are never
// read.
func TestDecodeWindowReads(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	const T, h, hkv, d = 300, 4, 2, 8
	for _, w := range []WindowConfig{{Left: 9}, {Left: 14, Dilation: 4}} {
		a, err := NewWindow(w)
		if err != nil {
			t.Fatal(err)
		}
		dil := max(w.Dilation, 1)
		sq := newSequence(rng, h, hkv, T, d)
		for hd := range hkv {
			for j := range T {
				if j%dil != 0 {
					for c := range d {
						sq.k[(hd*T+j)*d+c], sq.v[(hd*T+j)*d+c] = float32(math.NaN()), float32(math.NaN())
					}
				}
			}
		}
		ad, err := a.NewDecoder(attn.DecodeConfig{B: 1, H: h, HKV: hkv, D: d})
		if err != nil {
			t.Fatal(err)
		}
		dec := ad.(*decoder)
		bytes := dec.Bytes()
		out := make([]float32, h*d)
		for p := range T {
			err := dec.Step(context.Background(), sq.part(sq.q, h, p, p+1), sq.part(sq.k, hkv, p, p+1), sq.part(sq.v, hkv, p, p+1), 1, nil, out, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := min(w.Left/dil, p/dil) + 1; dec.lastRows != want {
				t.Fatalf("%+v position %d: attended %d keys, want %d", w, p, dec.lastRows, want)
			}
			if held := dec.caches[0].Held(); held > w.Left+1 {
				t.Fatalf("%+v position %d: the cache holds %d positions", w, p, held)
			}
			if dec.Bytes() != bytes {
				t.Fatalf("%+v position %d: Bytes %d, was %d", w, p, dec.Bytes(), bytes)
			}
			if p%dil == 0 && slices.ContainsFunc(out, func(x float32) bool { return math.IsNaN(float64(x)) }) {
				t.Fatalf("%+v position %d: NaN output: a key of another residue was read", w, p)
			}
		}
	}
}

// TestStepRules checks each layout's keys for one query against its
// causal pattern: the same set, as sorted, disjoint, Full ranges that
// do not touch.
func TestStepRules(t *testing.T) {
	seed := freshSeed(t)
	rng := rand.New(rand.NewPCG(seed, 6))
	const T = 160
	for _, mc := range mechCases() {
		a, err := mc.build(flash.Config{})
		if err != nil {
			t.Fatal(err)
		}
		pat, err := a.Pattern(attn.Shape{B: 1, H: 1, HKV: 1, N: T, M: T, D: 1}, true)
		if err != nil {
			t.Fatal(err)
		}
		rule := a.layout.stepRule()
		order := make([]int, T)
		for i := range order {
			order[i] = i
		}
		// In order, as a decoder asks, then shuffled.
		for pass := range 2 {
			if pass == 1 {
				rng.Shuffle(T, func(i, j int) { order[i], order[j] = order[j], order[i] })
			}
			for _, p := range order {
				rs := rule.keys(nil, p)
				got := make([]bool, p+1)
				for i, r := range rs {
					if !r.Full || r.Lo < 0 || r.Lo >= r.Hi || r.Hi > p+1 || (i > 0 && r.Lo <= rs[i-1].Hi) {
						t.Fatalf("%s p=%d: ranges %v are not sorted, disjoint, apart and Full within [0, p]", mc.name, p, rs)
					}
					for j := r.Lo; j < r.Hi; j++ {
						got[j] = true
					}
				}
				for j := 0; j <= p; j++ {
					if got[j] != pat.Visible(p, j) {
						t.Fatalf("%s p=%d: key %d in ranges %v, but Visible %v", mc.name, p, j, got[j], pat.Visible(p, j))
					}
				}
				if r := rule.reach(); r >= 0 && len(rs) > 0 && rs[0].Lo < p-r {
					t.Fatalf("%s p=%d: key %d is past the reach %d", mc.name, p, rs[0].Lo, r)
				}
			}
		}
	}
}

func TestDecoderErrors(t *testing.T) {
	a, err := NewStrided(StridedConfig{Stride: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []attn.DecodeConfig{
		{B: 0, H: 2, HKV: 1, D: 4},
		{B: 1, H: 3, HKV: 2, D: 4},
		{B: 1, H: 2, HKV: 1, D: 4, Storage: "f64"},
		{B: 1, H: 2, HKV: 1, D: 4, Sinks: 2},
		{B: 1, H: 2, HKV: 1, D: 4, Window: -1},
	} {
		if _, err := a.NewDecoder(cfg); !errors.Is(err, attn.ErrShape) && !errors.Is(err, attn.ErrInput) {
			t.Errorf("NewDecoder(%+v): err %v, want ErrShape or ErrInput", cfg, err)
		}
	}
	// MaxLen with and without a ring (a window of 9 under MaxLen 5 has
	// none, a window of 2 has one).
	w9, err := NewWindow(WindowConfig{Left: 9})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := NewWindow(WindowConfig{Left: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Attention{a, w9, w2} {
		cfg := attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 4, MaxLen: 5}
		dec, err := m.NewDecoder(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		step := func(n int, valid []int) error {
			return dec.Step(ctx, make([]float32, 2*2*n*4), make([]float32, 2*n*4), make([]float32, 2*n*4), n, valid, make([]float32, 2*2*n*4), nil)
		}
		if err := step(4, []int{4, 2}); err != nil {
			t.Fatal(err)
		}
		if err := step(2, []int{1, 2}); err != nil {
			t.Fatal(err)
		}
		if err := step(2, []int{2, 1}); !errors.Is(err, kvcache.ErrFull) {
			t.Errorf("%s: step past MaxLen: err %v, want ErrFull", m.Name(), err)
		}
		if dec.Len(0) != 5 || dec.Len(1) != 4 {
			t.Errorf("%s: after a failed step Len = %d, %d, want 5, 4", m.Name(), dec.Len(0), dec.Len(1))
		}
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"n = 0", dec.Step(ctx, nil, nil, nil, 0, nil, nil, nil)},
			{"short q", dec.Step(ctx, make([]float32, 3), make([]float32, 8), make([]float32, 8), 1, nil, make([]float32, 16), nil)},
			{"nil out", dec.Step(ctx, make([]float32, 16), make([]float32, 8), make([]float32, 8), 1, nil, nil, nil)},
			{"valid", dec.Step(ctx, make([]float32, 16), make([]float32, 8), make([]float32, 8), 1, []int{2, 0}, make([]float32, 16), nil)},
			{"valid length", dec.Step(ctx, make([]float32, 16), make([]float32, 8), make([]float32, 8), 1, []int{1}, make([]float32, 16), nil)},
		} {
			if !errors.Is(tc.err, attn.ErrShape) && !errors.Is(tc.err, attn.ErrInput) {
				t.Errorf("%s %s: err %v, want ErrShape or ErrInput", m.Name(), tc.name, tc.err)
			}
		}
		if dec.Len(0) != 5 || dec.Len(1) != 4 {
			t.Errorf("%s: after bad steps Len = %d, %d, want 5, 4", m.Name(), dec.Len(0), dec.Len(1))
		}
	}
}
