package reformer

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// decodeKeys recomputes, by brute force over the whole cache, the keys a
// step attends to: per round the 2·Bucket latest keys hashed to the
// query's bucket, plus the Window latest keys, minus the self rule.
func decodeKeys(dec *Decoder, kvh int, qh []float32) []bool {
	t := dec.n - 1
	vis := make([]bool, dec.n)
	if t < 0 {
		return vis
	}
	R := dec.cfg.Hashes
	kb := make([]int32, dec.n*R)
	dec.hs.hash(dec.keys[kvh], dec.n, dec.d, dec.hs.scratch(), kb)
	qb := make([]int32, R)
	if dec.cfg.SharedQK {
		copy(qb, kb[t*R:])
	} else {
		dec.hs.hash(qh, 1, dec.d, dec.hs.scratch(), qb)
	}
	for r := range R {
		taken := 0
		for j := t; j >= 0 && taken < 2*dec.cfg.Bucket; j-- {
			if kb[j*R+r] == qb[r] {
				vis[j] = true
				taken++
			}
		}
	}
	for j := max(0, t-dec.cfg.Window+1); j <= t; j++ {
		vis[j] = true
	}
	if dec.cfg.ExcludeSelf {
		vis[t] = false
		vis[t] = !slices.Contains(vis, true)
	}
	return vis
}

// checkStep compares one step with exact attention over decodeKeys.
func checkStep(t *testing.T, dec *Decoder, q []float32) {
	t.Helper()
	out := make([]float32, dec.h*dec.d)
	lse := make([]float32, dec.h)
	if err := dec.Step(q, out, lse); err != nil {
		t.Fatal(err)
	}
	g := dec.h / dec.hkv
	for h := range dec.h {
		kvh := h / g
		qh := q[h*dec.d : (h+1)*dec.d]
		mask := decodeKeys(dec, kvh, qh)
		if n := len(dec.candidates(kvh, qh)); n > dec.cfg.Hashes*2*dec.cfg.Bucket+dec.cfg.Window {
			t.Fatalf("step at %d attends %d keys: more than the bound", dec.n-1, n)
		}
		s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: max(dec.n, 1), D: dec.d}
		k, v := dec.keys[kvh], dec.vals[kvh]
		if dec.n == 0 {
			k, v, mask = make([]float32, dec.d), make([]float32, dec.d), []bool{false}
		}
		wantOut, wantLSE, err := ref.Attention(s, qh, k, v, ref.Spec{Scale: float64(dec.scale), Mask: mask})
		if err != nil {
			t.Fatal(err)
		}
		if e := ref.RelErr(out[h*dec.d:(h+1)*dec.d], wantOut); e > 2e-5 {
			t.Fatalf("step at %d head %d: out rel err %.3g", dec.n-1, h, e)
		}
		// One lse per check: compare it absolutely near 0, where a
		// relative error means nothing.
		got, want := float64(lse[h]), wantLSE[0]
		if math.IsInf(want, -1) != math.IsInf(got, -1) || (!math.IsInf(want, -1) && math.Abs(got-want) > 2e-5*math.Max(1, math.Abs(want))) {
			t.Fatalf("step at %d head %d: lse %v, want %v", dec.n-1, h, got, want)
		}
	}
}

// appendTokens appends n random tokens and returns their queries [H][n][D]
// or, with shared QK, the keys passed (the tokens' queries) as [Hkv][n][D].
func appendTokens(t *testing.T, rng *rand.Rand, dec *Decoder, n int) []float32 {
	t.Helper()
	k, v := ref.Normal(rng, dec.hkv*n*dec.d), ref.Normal(rng, dec.hkv*n*dec.d)
	if err := dec.Append(k, v); err != nil {
		t.Fatal(err)
	}
	return k
}

func TestDecoderAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, uint64(rand.Int64())))
	for _, c := range []struct {
		cfg         Config
		h, hkv, d   int
		scale       float32
		appendSizes []int
	}{
		{Config{Hashes: 3, Bucket: 4, Buckets: 6, Window: 3}, 4, 2, 24, 0, []int{1, 1, 5, 1, 30, 1, 1, 60, 1}},
		{Config{Hashes: 2, Bucket: 3, Buckets: 100, Window: 5, ExcludeSelf: true, Seed: 4}, 4, 1, 40, 0.2, []int{1, 2, 1, 40, 1, 1}},
		{Config{Hashes: 1, Bucket: 5}, 2, 2, 7, 0, []int{3, 1, 100, 1}},
	} {
		dec, err := NewDecoder(c.cfg, c.h, c.hkv, c.d, c.scale)
		if err != nil {
			t.Fatal(err)
		}
		checkStep(t, dec, ref.Normal(rng, c.h*c.d)) // empty cache
		for _, n := range c.appendSizes {
			appendTokens(t, rng, dec, n)
			checkStep(t, dec, ref.Normal(rng, c.h*c.d))
			checkStep(t, dec, ref.Normal(rng, c.h*c.d))
		}
	}
}

func TestDecoderSharedQK(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, uint64(rand.Int64())))
	dec, err := NewDecoder(Config{SharedQK: true, Hashes: 2, Bucket: 3, Buckets: 8, Window: 2}, 3, 3, 16, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 60 {
		qk := appendTokens(t, rng, dec, 1) // one token: [H][1][D] is [H][D]
		checkStep(t, dec, qk)
	}
	// The first step of a decoder saw only itself: out v_0.
	dec, _ = NewDecoder(Config{SharedQK: true}, 1, 1, 4, 0)
	v := []float32{1, 2, 3, 4}
	if err := dec.Append([]float32{1, 0, 0, 0}, v); err != nil {
		t.Fatal(err)
	}
	out, lse := make([]float32, 4), make([]float32, 1)
	if err := dec.Step([]float32{1, 0, 0, 0}, out, lse); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, v) || lse[0] != 0.5 {
		t.Errorf("lonely first token: out %v lse %v, want %v and 0.5", out, lse, v)
	}
}

// A step costs the same whatever the cache length: it attends to at most
// Hashes·2·Bucket + Window keys.
func TestDecoderBoundedKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, uint64(rand.Int64())))
	cfg := Config{Hashes: 4, Bucket: 8, Buckets: 4, Window: 16}
	dec, err := NewDecoder(cfg, 2, 2, 8, 0)
	if err != nil {
		t.Fatal(err)
	}
	appendTokens(t, rng, dec, 5000)
	for range 20 {
		q := ref.Normal(rng, 8)
		n := len(dec.candidates(0, q))
		if n > 4*2*8+16 || n < 16 {
			t.Fatalf("a step over 5000 keys attends %d, want between 16 and %d", n, 4*2*8+16)
		}
	}
}

func TestDecoderValidation(t *testing.T) {
	for _, c := range []struct {
		cfg          Config
		h, hkv, d    int
		scale        float32
		want         error
		errorMessage string
	}{
		{Config{}, 3, 2, 8, 0, attn.ErrShape, "H not a multiple of Hkv"},
		{Config{}, 0, 1, 8, 0, attn.ErrShape, "H = 0"},
		{Config{}, 2, 2, 0, 0, attn.ErrShape, "D = 0"},
		{Config{SharedQK: true}, 2, 1, 8, 0, attn.ErrUnsupported, "shared QK with GQA"},
		{Config{}, 2, 2, 8, float32(math.Inf(1)), attn.ErrInput, "infinite scale"},
		{Config{Hashes: -3}, 2, 2, 8, 0, attn.ErrInput, "negative hashes"},
	} {
		if _, err := NewDecoder(c.cfg, c.h, c.hkv, c.d, c.scale); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.errorMessage, err, c.want)
		}
	}
	dec, err := NewDecoder(Config{}, 2, 1, 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := dec.Append(make([]float32, 4), make([]float32, 8)); !errors.Is(err, attn.ErrShape) {
		t.Errorf("Append with len(k) != len(v): got %v", err)
	}
	if err := dec.Append(make([]float32, 6), make([]float32, 6)); !errors.Is(err, attn.ErrShape) {
		t.Errorf("Append of a partial token: got %v", err)
	}
	if err := dec.Step(make([]float32, 4), make([]float32, 8), nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("Step with a short q: got %v", err)
	}
	if err := dec.Step(make([]float32, 8), make([]float32, 8), make([]float32, 1)); !errors.Is(err, attn.ErrShape) {
		t.Errorf("Step with a short lse: got %v", err)
	}
	if dec.Len() != 0 {
		t.Errorf("failed appends changed the length to %d", dec.Len())
	}
}
