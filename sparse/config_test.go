package sparse

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

func TestConfigErrors(t *testing.T) {
	bad := map[string]func() (*Attention, error){
		"window left -1":       func() (*Attention, error) { return NewWindow(WindowConfig{Left: -1}) },
		"window right -3":      func() (*Attention, error) { return NewWindow(WindowConfig{Left: 4, Right: -3}) },
		"window dilation -2":   func() (*Attention, error) { return NewWindow(WindowConfig{Dilation: -2}) },
		"window left huge":     func() (*Attention, error) { return NewWindow(WindowConfig{Left: min(1<<50, math.MaxInt)}) },
		"strided stride -1":    func() (*Attention, error) { return NewStrided(StridedConfig{Stride: -1}) },
		"strided mode":         func() (*Attention, error) { return NewStrided(StridedConfig{Mode: "dilated"}) },
		"strided summary":      func() (*Attention, error) { return NewStrided(StridedConfig{Stride: 8, Summary: 3}) },
		"fixed summary > l":    func() (*Attention, error) { return NewStrided(StridedConfig{Mode: ModeFixed, Stride: 8, Summary: 9}) },
		"fixed summary -1":     func() (*Attention, error) { return NewStrided(StridedConfig{Mode: ModeFixed, Summary: -1}) },
		"longformer left -1":   func() (*Attention, error) { return NewLongformer(LongformerConfig{Left: -1}) },
		"longformer global -1": func() (*Attention, error) { return NewLongformer(LongformerConfig{Globals: []int{3, -1}}) },
		"bigbird block -1":     func() (*Attention, error) { return NewBigBird(BigBirdConfig{Block: -1}) },
		"bigbird window -1":    func() (*Attention, error) { return NewBigBird(BigBirdConfig{Window: -1, Random: 2}) },
		"bigbird random -1":    func() (*Attention, error) { return NewBigBird(BigBirdConfig{Random: -1}) },
		"bigbird globals -1":   func() (*Attention, error) { return NewBigBird(BigBirdConfig{Globals: -1, Window: 3}) },
	}
	for name, f := range bad {
		a, err := f()
		if err == nil || !errors.Is(err, attn.ErrInput) {
			t.Errorf("%s: got %v, %v; want an error wrapping ErrInput", name, a, err)
		}
	}
}

func TestForwardErrors(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 10, M: 10, D: 4}
	q, k, v := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	ctx := context.Background()
	for _, mc := range mechCases() {
		a, err := mc.build(flash.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Forward(ctx, s, q[:5], k, v, attn.Options{}, out, lse); !errors.Is(err, attn.ErrShape) {
			t.Errorf("%s: short q: %v", mc.name, err)
		}
		if err := a.Forward(ctx, s, q, k, v, attn.Options{KVLen: []int{11}}, out, lse); !errors.Is(err, attn.ErrInput) {
			t.Errorf("%s: key length past M: %v", mc.name, err)
		}
		if _, err := a.Pattern(attn.Shape{}, false); !errors.Is(err, attn.ErrShape) {
			t.Errorf("%s: Pattern of a zero shape: %v", mc.name, err)
		}
	}
	// A global position at or past M plays no part: the result is that
	// of the globals below M.
	lf, err := NewLongformer(LongformerConfig{Globals: []int{3, 10, 40}, Left: 2, Right: 2})
	if err != nil {
		t.Fatal(err)
	}
	lf3, err := NewLongformer(LongformerConfig{Globals: []int{3}, Left: 2, Right: 2})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, x := range [][]float32{q, k, v} {
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
	}
	for _, causal := range []bool{false, true} {
		o := attn.Options{Causal: causal}
		out3, lse3 := make([]float32, len(out)), make([]float32, len(lse))
		if err := lf.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
			t.Fatalf("longformer globals 3, 10, 40 with M = 10: %v", err)
		}
		if err := lf3.Forward(ctx, s, q, k, v, o, out3, lse3); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out, out3) || !slices.Equal(lse, lse3) {
			t.Errorf("causal %v: globals 10 and 40 past M = 10 changed the result", causal)
		}
	}
	// Cancelled contexts stop the work.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	s = attn.Shape{B: 1, H: 2, HKV: 1, N: 100, M: 100, D: 4}
	q, k, v = make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	out, lse = make([]float32, s.QLen()), make([]float32, s.LSELen())
	for _, mc := range mechCases() {
		a, err := mc.build(flash.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Forward(cctx, s, q, k, v, attn.Options{}, out, lse); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: cancelled: %v", mc.name, err)
		}
	}
}

func TestNames(t *testing.T) {
	for name, f := range map[string]func() (*Attention, error){
		"window":     func() (*Attention, error) { return NewWindow(WindowConfig{}) },
		"strided":    func() (*Attention, error) { return NewStrided(StridedConfig{}) },
		"longformer": func() (*Attention, error) { return NewLongformer(LongformerConfig{}) },
		"bigbird":    func() (*Attention, error) { return NewBigBird(BigBirdConfig{}) },
	} {
		a, err := f()
		if err != nil {
			t.Fatal(err)
		}
		var _ attn.Mechanism = a
		if a.Name() != name {
			t.Errorf("Name() = %q, want %q", a.Name(), name)
		}
	}
}

// TestBigBirdRandom checks the random blocks: reproducible from the seed,
// different across seeds, distinct, never global nor in the window, in the
// past when causal, independent of N (and, causal, of M).
func TestBigBirdRandom(t *testing.T) {
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 4096, M: 4096, D: 1}
	table := func(seed uint64, s attn.Shape, causal bool) *BigBird {
		a, err := NewBigBird(BigBirdConfig{Seed: seed, Block: 16})
		if err != nil {
			t.Fatal(err)
		}
		pat, err := a.Pattern(s, causal)
		if err != nil {
			t.Fatal(err)
		}
		return pat.(*BigBird)
	}
	nb := s.M / 16
	for _, causal := range []bool{false, true} {
		a, b, c := table(1, s, causal), table(1, s, causal), table(2, s, causal)
		differ := 0
		for qb := range nb {
			ra := a.RandomBlocks(qb)
			if !slices.Equal(ra, b.RandomBlocks(qb)) {
				t.Fatalf("causal=%v: block %d: same seed, %v then %v", causal, qb, ra, b.RandomBlocks(qb))
			}
			if !slices.Equal(ra, c.RandomBlocks(qb)) {
				differ++
			}
			want := 3
			switch {
			case qb < 2:
				want = 0 // global rows see everything
			case causal:
				want = min(3, max(0, qb-1-2)) // blocks [2, qb-1)
			}
			if len(ra) != want {
				t.Fatalf("causal=%v: block %d has random blocks %v, want %d", causal, qb, ra, want)
			}
			for i, kb := range ra {
				if kb < 2 || (kb >= qb-1 && kb <= qb+1) || kb >= nb || (causal && kb >= qb) || (i > 0 && kb <= ra[i-1]) {
					t.Fatalf("causal=%v: block %d has random blocks %v", causal, qb, ra)
				}
			}
		}
		if differ < nb/2 {
			t.Errorf("causal=%v: seeds 1 and 2 agree on %d of %d blocks", causal, nb-differ, nb)
		}
		// The draw of a block does not depend on N, nor, causal, on M.
		short := attn.Shape{B: 1, H: 1, HKV: 1, N: 1000, M: s.M, D: 1}
		if causal {
			short.M = 3000
		}
		d := table(1, short, causal)
		for qb := floorDiv(short.M-short.N, 16); qb < short.M/16; qb++ {
			if !slices.Equal(a.RandomBlocks(qb), d.RandomBlocks(qb)) {
				t.Fatalf("causal=%v: block %d draws %v at %+v, %v at %+v", causal, qb, d.RandomBlocks(qb), short, a.RandomBlocks(qb), s)
			}
		}
	}
}

func TestWritePNG(t *testing.T) {
	a, err := NewBigBird(BigBirdConfig{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1000, M: 1024, D: 1}
	pat, err := a.Pattern(s, false)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WritePNG(&buf, pat, s.N, s.M, 64); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 16 || b.Dy() != 16 {
		t.Errorf("image is %v, want 16×16", b)
	}
	if err := WritePNG(&buf, pat, 10, 10, 0); err == nil {
		t.Error("cell 0: no error")
	}
	if _, err := Dense(pat, 1<<20, 1<<20); err == nil {
		t.Error("Dense of 2^40 pairs: no error")
	}
	if _, err := Dense(nil, 1, 1); err == nil {
		t.Error("Dense of nil: no error")
	}
}

func TestAccessors(t *testing.T) {
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 50, M: 60, D: 1}
	lf, err := NewLongformer(LongformerConfig{Left: 3, Right: 2, Globals: []int{9, 1, 9}})
	if err != nil {
		t.Fatal(err)
	}
	pat, err := lf.Pattern(s, false)
	if err != nil {
		t.Fatal(err)
	}
	if l, r := pat.(*Longformer).Window(); l != 3 || r != 2 {
		t.Errorf("Window() = %d, %d", l, r)
	}
	if g := pat.(*Longformer).Globals(); !slices.Equal(g, []int{1, 9}) {
		t.Errorf("Globals() = %v", g)
	}
	bb, err := NewBigBird(BigBirdConfig{Block: 7, Random: 1})
	if err != nil {
		t.Fatal(err)
	}
	pat, err = bb.Pattern(s, false)
	if err != nil {
		t.Fatal(err)
	}
	if b := pat.(*BigBird).Block(); b != 7 {
		t.Errorf("Block() = %d", b)
	}
	if r := pat.(*BigBird).RandomBlocks(100); r != nil {
		t.Errorf("RandomBlocks outside the call = %v", r)
	}
}

// TestStridedManySummaries covers the fixed pattern's cover when there are
// more blocks than it lists one by one.
func TestStridedManySummaries(t *testing.T) {
	st := Strided{Mode: ModeFixed, Stride: 3, Summary: 1}
	n, m := 40, 1000
	got, err := Dense(st, n, m)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		p := m - n + i
		for j := range m {
			if want := p/3 == j/3 || j%3 == 2; got[i*m+j] != want {
				t.Fatalf("(p=%d, j=%d): %v, want %v", p, j, got[i*m+j], want)
			}
		}
	}
	checkRanges(t, "fixed l=3", st, m-n, m, m)
}
