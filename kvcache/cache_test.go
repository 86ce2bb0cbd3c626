package kvcache

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// seq is a whole sequence: q [B][H][T][D], k and v [B][Hkv][T][D].
type seq struct {
	s       attn.Shape // N = M = T
	q, k, v []float32
}

func newSeq(rng *rand.Rand, b, h, hkv, t, d int) seq {
	s := attn.Shape{B: b, H: h, HKV: hkv, N: t, M: t, D: d}
	return seq{s, ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())}
}

// slice returns positions [t0, t1) of x laid out [B][heads][T][D].
func (sq seq) slice(x []float32, heads, t0, t1 int) []float32 {
	var out []float32
	for bh := range sq.s.B * heads {
		out = append(out, x[(bh*sq.s.M+t0)*sq.s.D:(bh*sq.s.M+t1)*sq.s.D]...)
	}
	return out
}

// want is the float64 reference for queries [t0, t1) of the sequence under
// the window rule: key j is visible to query p when j <= p and, with a
// window, j > p-w or j < sinks.
func (sq seq) want(t0, t1, w, sinks int) (out, lse []float64) {
	s := sq.s
	s.N = t1 - t0
	s.M = t1
	mask := make([]bool, s.N*s.M)
	for i := range s.N {
		p := t0 + i
		for j := range s.M {
			mask[i*s.M+j] = j <= p && (w == 0 || j > p-w || j < sinks)
		}
	}
	k, v := sq.slice(sq.k, s.HKV, 0, t1), sq.slice(sq.v, s.HKV, 0, t1)
	out, lse, err := ref.Attention(s, sq.slice(sq.q, s.H, t0, t1), k, v, ref.Spec{Mask: mask})
	if err != nil {
		panic(err)
	}
	return out, lse
}

// tolFor is the bound on the relative error of outputs and lse against
// the float64 reference. For I8 each stored value is within scale/2 =
// max|row|/254 of the original, an error of about max|row|/440 rms
// (uniform rounding), 0.6–0.8% of a Gaussian row of D = 20…128; that is
// the output's error when a query sees few keys, and less when it
// averages many. Measured on these tests' shapes: at most 1.0e-2 for
// outputs over 200 Attend calls, 1.5e-2 over 30 seeds of the step-by-step
// and window tests (windows of 1 key show a row's rounding undiluted) and
// 1.2e-2 over 300 seeds of those alone; lse at most 1.0e-2. 3e-2 leaves
// a factor of 2 to 3 against that for the tests' random seeds.
//
// BF16 keeps 8 bits: each stored value, and with the CPU's bfloat16
// arithmetic each query element and probability, is off by up to 2^-9
// of itself. A step whose head attends to a few keys shows that
// undiluted, and its moved logits shift weight between keys whose values
// differ: one step in a few hundred runs of TestPrefillThenDecode is off
// by more than 1e-2 (1.2e-2 at most in 1000 runs, 1.3e-2 once in CI,
// 8.7e-3 the next worst), hence I8's bound. F16 keeps 11 bits: at most
// 7.6e-4 over 100 runs of these tests.
func tolFor(t DType) float64 {
	switch t {
	case F32:
		return 1e-5
	case I8, BF16:
		return 3e-2
	}
	return 1e-2
}

// run feeds the sequence through a cache in chunks of the given sizes and
// checks every chunk's output against the reference.
func run(t *testing.T, sq seq, cfg Config, chunks []int) {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := 0
	for _, n := range chunks {
		t1 := t0 + n
		out := make([]float32, sq.s.B*sq.s.H*n*sq.s.D)
		lse := make([]float32, sq.s.B*sq.s.H*n)
		err := c.Step(ctx, sq.s.H, sq.slice(sq.q, sq.s.H, t0, t1), sq.slice(sq.k, sq.s.HKV, t0, t1),
			sq.slice(sq.v, sq.s.HKV, t0, t1), n, attn.Options{Workers: 3}, out, lse)
		if err != nil {
			t.Fatal(err)
		}
		wantOut, wantLSE := sq.want(t0, t1, cfg.Window, cfg.Sinks)
		tol := tolFor(cfg.DType)
		if e := ref.RelErr(out, wantOut); e > tol {
			t.Fatalf("%+v chunk [%d,%d): out rel err %.3g", cfg, t0, t1, e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
			t.Fatalf("%+v chunk [%d,%d): lse rel err %.3g %v", cfg, t0, t1, e, err)
		}
		t0 = t1
		if c.Len() != t0 {
			t.Fatalf("Len %d after %d positions", c.Len(), t0)
		}
	}
}

func TestDecodeStepByStep(t *testing.T) {
	rng := ref.FreshRNG(t, 1)
	for _, dt := range []DType{F32, BF16, F16, I8} {
		for _, hkv := range []int{4, 2, 1} {
			sq := newSeq(rng, 2, 4, hkv, 150, 40)
			ones := make([]int, 150)
			for i := range ones {
				ones[i] = 1
			}
			run(t, sq, Config{B: 2, HKV: hkv, D: 40, DType: dt, Capacity: 3}, ones)
		}
	}
}

func TestPrefillThenDecode(t *testing.T) {
	rng := ref.FreshRNG(t, 2)
	for _, dt := range []DType{F32, BF16, I8} {
		sq := newSeq(rng, 1, 6, 2, 400, 24)
		// A long prefill through the fused kernel (several tiles), a
		// short chunk, then single steps past a decode span boundary.
		chunks := []int{331, 7}
		for len(chunks) < 2+62 {
			chunks = append(chunks, 1)
		}
		run(t, sq, Config{B: 1, HKV: 2, D: 24, DType: dt}, chunks)
	}
}

func TestWindowAndSinks(t *testing.T) {
	rng := ref.FreshRNG(t, 3)
	for _, cfg := range []Config{
		{Window: 16},
		{Window: 70, Sinks: 4},
		{Window: 1, Sinks: 2},
		{Window: 33, Sinks: 40, DType: F16},
		{Window: 70, Sinks: 4, DType: I8},
		{Window: 1, Sinks: 2, DType: I8},
	} {
		cfg.B, cfg.HKV, cfg.D = 2, 1, 20
		sq := newSeq(rng, 2, 3, 1, 260, 20)
		run(t, sq, cfg, []int{5, 1, 1, 90, 1, 1, 1, 40, 1, 100, 1, 1, 16, 1})
		ones := make([]int, 260)
		for i := range ones {
			ones[i] = 1
		}
		run(t, sq, cfg, ones)
	}
}

// TestLargeGroupWindow decodes step by step with a group of 32 query
// heads, larger than streamGroup: where fusedGroup holds, the fused
// kernel while every held row is in the window and the row-by-row path
// once rows leave it; else (int4, and bfloat16 where the CPU multiplies
// in it) the streaming kernels with the rows checked against the window.
func TestLargeGroupWindow(t *testing.T) {
	rng := ref.FreshRNG(t, 6)
	sq := newSeq(rng, 1, 32, 1, 140, 24)
	ones := make([]int, 140)
	for i := range ones {
		ones[i] = 1
	}
	for _, dt := range []DType{F32, BF16, F16, I8} {
		run(t, sq, Config{B: 1, HKV: 1, D: 24, DType: dt, Window: 100, Sinks: 2}, ones)
	}
	// Int4 against the rows it stores: its own rounding is larger than
	// what run allows.
	runStored(t, sq, Config{B: 1, HKV: 1, D: 24, DType: I4, Window: 100, Sinks: 2}, ones, 3, storedTol(I4, 2e-5))
}

// TestAttend checks the decode entry point that attends the newest,
// already appended position.
func TestAttend(t *testing.T) {
	rng := ref.FreshRNG(t, 4)
	for _, cfg := range []Config{{}, {Window: 50, Sinks: 3}, {DType: BF16}, {DType: I8}, {Window: 50, Sinks: 3, DType: I8}} {
		cfg.B, cfg.HKV, cfg.D = 1, 2, 33
		sq := newSeq(rng, 1, 8, 2, 300, 33)
		c, _ := New(cfg)
		if err := c.Append(sq.k, sq.v, 300); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, 8*33)
		lse := make([]float32, 8)
		if err := c.Attend(context.Background(), 8, sq.slice(sq.q, 8, 299, 300), attn.Options{}, out, lse); err != nil {
			t.Fatal(err)
		}
		wantOut, wantLSE := sq.want(299, 300, cfg.Window, cfg.Sinks)
		if e := ref.RelErr(out, wantOut); e > tolFor(cfg.DType) {
			t.Errorf("%+v: out rel err %.3g", cfg, e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tolFor(cfg.DType) {
			t.Errorf("%+v: lse rel err %.3g %v", cfg, e, err)
		}
	}
}

func TestGrowthAndLimits(t *testing.T) {
	c, err := New(Config{B: 1, HKV: 1, D: 3, Capacity: 1, MaxLen: 10})
	if err != nil {
		t.Fatal(err)
	}
	k := []float32{1, 2, 3}
	for i := range 10 {
		if err := c.Append(k, k, 1); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := c.Append(k, k, 1); !errors.Is(err, ErrFull) {
		t.Errorf("append past MaxLen: %v", err)
	}
	if c.Len() != 10 || c.Held() != 10 {
		t.Errorf("Len %d Held %d", c.Len(), c.Held())
	}
	// Stored rows survived the regrowths.
	for p := range 10 {
		if got := c.at(false, c.slot(p)*c.stride+2); got != 3 {
			t.Fatalf("row %d: %v", p, got)
		}
	}
	w, _ := New(Config{B: 1, HKV: 1, D: 3, Window: 4, Sinks: 1})
	for range 100 {
		w.Append(k, k, 1)
	}
	if w.Held() != 5 || w.Bytes() != 2*5*w.stride*4 {
		t.Errorf("window cache holds %d rows in %d bytes", w.Held(), w.Bytes())
	}
	c.Reset()
	if c.Len() != 0 {
		t.Error("Reset")
	}
}

func TestErrors(t *testing.T) {
	for _, cfg := range []Config{
		{B: 0, HKV: 1, D: 1},
		{B: 1, HKV: 0, D: 1},
		{B: 1, HKV: 1, D: 0},
		{B: 1, HKV: 1, D: 1, DType: 9},
		{B: 1, HKV: 1, D: 1, DType: I4 + 1},
		{B: 1, HKV: 1, D: 1, Capacity: -1},
		{B: 1, HKV: 1, D: 1, Sinks: 2},
		{B: 1, HKV: 1, D: 1, Window: 2, MaxLen: 5},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	c, _ := New(Config{B: 1, HKV: 2, D: 4})
	ctx := context.Background()
	x := make([]float32, 64)
	if err := c.Append(x[:7], x[:8], 1); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short append: %v", err)
	}
	if err := c.Attend(ctx, 4, x[:16], attn.Options{}, x[:16], nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("attend on empty cache: %v", err)
	}
	if err := c.Step(ctx, 3, x[:12], x[:8], x[:8], 1, attn.Options{}, x[:12], nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("H not a multiple of Hkv: %v", err)
	}
	if err := c.Step(ctx, 4, x[:16], x[:8], x[:8], 1, attn.Options{KVLen: []int{1}}, x[:16], nil); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("KVLen: %v", err)
	}
	if err := c.Step(ctx, 4, x[:15], x[:8], x[:8], 1, attn.Options{}, x[:16], nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short q: %v", err)
	}
	c.Append(x[:8], x[:8], 1)
	if err := c.Attend(ctx, 4, x[:15], attn.Options{}, x[:16], nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short q in Attend: %v", err)
	}
	if err := c.Attend(ctx, 4, x[:16], attn.Options{KVLen: []int{1}}, x[:16], nil); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("KVLen in Attend: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Attend(cctx, 4, x[:16], attn.Options{}, x[:16], nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if _, err := ParseDType("f8"); err == nil {
		t.Error("ParseDType(f8)")
	}
	for _, dt := range []DType{F32, BF16, F16, I8} {
		if got, err := ParseDType(dt.String()); got != dt || err != nil {
			t.Errorf("ParseDType(%v) = %v, %v", dt, got, err)
		}
	}
}

// TestAttendShapes checks the decode step on the shapes of its kernels'
// edge cases: 16-bit rows whose D is not a multiple of 16 (72: the
// products end on an 8-column block) or of 8 (33, 20), groups of 1 to 32
// query heads (those past streamGroup take the fused kernel where
// fusedGroup holds, in panels of 16 query rows: 20 and 24 leave a partial
// panel), and more rows than a
// decode block, not a multiple of it, over several spans (1100).
func TestAttendShapes(t *testing.T) {
	rng := ref.FreshRNG(t, 5)
	for _, dt := range []DType{F32, BF16, F16, I8} {
		for _, sh := range []struct{ h, hkv, d, n int }{
			{8, 8, 72, 200}, {8, 2, 128, 333}, {32, 1, 72, 150}, {6, 2, 33, 130}, {5, 1, 20, 70},
			{20, 1, 40, 1100}, {48, 2, 24, 130},
		} {
			sq := newSeq(rng, 1, sh.h, sh.hkv, sh.n, sh.d)
			c, _ := New(Config{B: 1, HKV: sh.hkv, D: sh.d, DType: dt})
			if err := c.Append(sq.k, sq.v, sh.n); err != nil {
				t.Fatal(err)
			}
			out := make([]float32, sh.h*sh.d)
			lse := make([]float32, sh.h)
			if err := c.Attend(context.Background(), sh.h, sq.slice(sq.q, sh.h, sh.n-1, sh.n), attn.Options{Workers: 3}, out, lse); err != nil {
				t.Fatal(err)
			}
			wantOut, wantLSE := sq.want(sh.n-1, sh.n, 0, 0)
			if e := ref.RelErr(out, wantOut); e > tolFor(dt) {
				t.Errorf("%v %+v: out rel err %.3g", dt, sh, e)
			}
			if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tolFor(dt) {
				t.Errorf("%v %+v: lse rel err %.3g %v", dt, sh, e, err)
			}
		}
	}
}

// TestNewHugeSizes asks for caches whose first allocation would not fit
// any machine: New must return an error, not panic in makeslice or run
// out of memory.
func TestNewHugeSizes(t *testing.T) {
	for _, cfg := range []Config{
		{B: 1, HKV: 1, D: 64, Capacity: min(1<<40, math.MaxInt)},
		{B: 1, HKV: 1, D: 64, Window: min(1<<40, math.MaxInt)},
		{B: 1, HKV: 1, D: 64, Window: 1 << 20, Sinks: min(1<<40, math.MaxInt)},
		{B: 1 << 30, HKV: 1 << 30, D: 64},
		{B: 1, HKV: 1, D: min(1<<50, math.MaxInt)},
	} {
		if _, err := New(cfg); !errors.Is(err, attn.ErrInput) && !errors.Is(err, attn.ErrShape) {
			t.Errorf("New(%+v): err = %v, want ErrInput or ErrShape", cfg, err)
		}
	}
}
