package reformer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore"
	"github.com/attnkit/attn/internal/decstore/dectest"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/ref"
)

// decodeKeys recomputes, by brute force over the whole cache, the keys a
// step attends to: per round the 2·Bucket latest keys hashed to the
// query's bucket, plus the Window latest keys, minus the self rule.
func decodeKeys(dec *Decoder, kvh int, qh []float32) []bool {
	keys, _ := storedRows(&dec.sq.heads[kvh])
	return ruleKeys(dec.c, keys, qh, dec.sq.n-1)
}

// ruleKeys recomputes by brute force the keys among keys ([>t][D], as
// stored) that the query qh (as a step sees it: rotated with "+rot") at
// position t attends to by the causal rule, the keys it may see being
// [0, t].
func ruleKeys(c *decodeCore, keys, qh []float32, t int) []bool {
	vis := make([]bool, t+1)
	if t < 0 {
		return vis
	}
	R := c.cfg.Hashes
	proj := c.hs.rowScratch()
	hash := func(x []float32) []int32 {
		b := make([]int32, R)
		c.hs.hashRow(x, proj, b)
		return b
	}
	qb := hash(qh)
	if c.cfg.SharedQK {
		qb = hash(keys[t*c.d:][:c.d])
	}
	for r := range R {
		taken := 0
		for j := t; j >= 0 && taken < 2*c.cfg.Bucket; j-- {
			if hash(keys[j*c.d:][:c.d])[r] == qb[r] {
				vis[j] = true
				taken++
			}
		}
	}
	for j := max(0, t-c.cfg.Window+1); j <= t; j++ {
		vis[j] = true
	}
	if c.cfg.ExcludeSelf {
		vis[t] = false
		vis[t] = !slices.Contains(vis, true)
	}
	return vis
}

// storedRows returns the keys and values of hd as a step reads them,
// [Len][D] each.
func storedRows(hd *decstore.Head) (k, v []float32) {
	row := make([]float32, hd.Stride()/2)
	for j := range hd.Len() {
		k = append(k, hd.K(row, j)...)
		v = append(v, hd.V(row, j)...)
	}
	return k, v
}

// stepKeys returns how many keys a step of query qh in kv head kvh
// attends to.
func stepKeys(dec *Decoder, kvh int, qh []float32) int {
	c := dec.c
	out := make([]float32, c.d)
	c.attend(dec.sq, kvh*(c.h/c.hkv), dec.sq.n-1, qh, dec.w, out)
	return len(dec.w.cand)
}

// checkStep compares one step with exact attention over decodeKeys.
func checkStep(t *testing.T, dec *Decoder, q []float32) {
	t.Helper()
	c, n := dec.c, dec.sq.n
	out := make([]float32, c.h*c.d)
	lse := make([]float32, c.h)
	if err := dec.Step(q, out, lse); err != nil {
		t.Fatal(err)
	}
	g := c.h / c.hkv
	for h := range c.h {
		kvh := h / g
		qh := q[h*c.d : (h+1)*c.d]
		mask := decodeKeys(dec, kvh, qh)
		if k := stepKeys(dec, kvh, qh); k > c.cfg.Hashes*2*c.cfg.Bucket+c.cfg.Window {
			t.Fatalf("step at %d attends %d keys: more than the bound", n-1, k)
		}
		s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: max(n, 1), D: c.d}
		k, v := storedRows(&dec.sq.heads[kvh])
		if n == 0 {
			k, v, mask = make([]float32, c.d), make([]float32, c.d), []bool{false}
		}
		wantOut, wantLSE, err := ref.Attention(s, qh, k, v, ref.Spec{Scale: float64(c.scale), Mask: mask})
		if err != nil {
			t.Fatal(err)
		}
		if e := ref.RelErr(out[h*c.d:(h+1)*c.d], wantOut); e > 2e-5 {
			t.Fatalf("step at %d head %d: out rel err %.3g", n-1, h, e)
		}
		// One lse per check: compare it absolutely near 0, where a
		// relative error means nothing.
		got, want := float64(lse[h]), wantLSE[0]
		if math.IsInf(want, -1) != math.IsInf(got, -1) || (!math.IsInf(want, -1) && math.Abs(got-want) > 2e-5*math.Max(1, math.Abs(want))) {
			t.Fatalf("step at %d head %d: lse %v, want %v", n-1, h, got, want)
		}
	}
}

// appendTokens appends n random tokens and returns their queries [H][n][D]
// or, with shared QK, the keys passed (the tokens' queries) as [Hkv][n][D].
func appendTokens(t *testing.T, rng *rand.Rand, dec *Decoder, n int) []float32 {
	t.Helper()
	k, v := ref.Normal(rng, dec.c.hkv*n*dec.c.d), ref.Normal(rng, dec.c.hkv*n*dec.c.d)
	if err := dec.Append(k, v); err != nil {
		t.Fatal(err)
	}
	return k
}

func TestDecoderAgainstReference(t *testing.T) {
	rng := testRNG(t, 20)
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
	rng := testRNG(t, 21)
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
	rng := testRNG(t, 22)
	cfg := Config{Hashes: 4, Bucket: 8, Buckets: 4, Window: 16}
	dec, err := NewDecoder(cfg, 2, 2, 8, 0)
	if err != nil {
		t.Fatal(err)
	}
	appendTokens(t, rng, dec, 5000)
	for range 20 {
		q := ref.Normal(rng, 8)
		n := stepKeys(dec, 0, q)
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

// tokens is one sequence's inputs: q [H][n][D], k and v [Hkv][n][D].
type tokens struct {
	n       int
	q, k, v []float32
}

func randomTokens(rng *rand.Rand, h, hkv, d, n int) tokens {
	return tokens{n: n, q: ref.Normal(rng, h*n*d), k: ref.Normal(rng, hkv*n*d), v: ref.Normal(rng, hkv*n*d)}
}

// rows returns positions [i, i+c) of x ([heads][n][d]) as [heads][w][d],
// zero past c (padding).
func rows(x []float32, heads, n, d, i, c, w int) []float32 {
	y := make([]float32, heads*w*d)
	for h := range heads {
		copy(y[h*w*d:][:c*d], x[(h*n+i)*d:][:c*d])
	}
	return y
}

// decodeAll runs the sequences through dec in steps of the given sizes
// (each sequence taking as many of a step's positions as it has left:
// ragged) and returns each sequence's out [H][n][D] and lse [H][n].
func decodeAll(t *testing.T, dec attn.Decoder, cfg attn.DecodeConfig, seqs []tokens, steps []int) (outs, lses [][]float32) {
	t.Helper()
	h, hkv, d := cfg.H, cfg.HKV, cfg.D
	for _, sq := range seqs {
		outs = append(outs, make([]float32, h*sq.n*d))
		lses = append(lses, make([]float32, h*sq.n))
	}
	done := make([]int, len(seqs))
	for si := 0; ; si++ {
		n := steps[si%len(steps)]
		var q, k, v []float32
		valid := make([]int, len(seqs))
		left := false
		for b, sq := range seqs {
			c := min(n, sq.n-done[b])
			valid[b] = c
			left = left || c > 0
			q = append(q, rows(sq.q, h, sq.n, d, done[b], c, n)...)
			k = append(k, rows(sq.k, hkv, sq.n, d, done[b], c, n)...)
			v = append(v, rows(sq.v, hkv, sq.n, d, done[b], c, n)...)
		}
		if !left {
			return outs, lses
		}
		out := make([]float32, len(q))
		lse := make([]float32, cfg.B*h*n)
		if err := dec.Step(context.Background(), q, k, v, n, valid, out, lse); err != nil {
			t.Fatal(err)
		}
		for b, sq := range seqs {
			for hd := range h {
				row := (b*h + hd) * n
				copy(outs[b][(hd*sq.n+done[b])*d:][:valid[b]*d], out[row*d:][:valid[b]*d])
				copy(lses[b][hd*sq.n+done[b]:][:valid[b]], lse[row:][:valid[b]])
				for i := valid[b]; i < n; i++ {
					if lse[row+i] != negInf || slices.ContainsFunc(out[(row+i)*d:][:d], func(x float32) bool { return x != 0 }) {
						t.Fatalf("padding row %d of sequence %d head %d: lse %v, out not 0", i, b, hd, lse[row+i])
					}
				}
			}
			done[b] += valid[b]
			if dec.Len(b) != done[b] {
				t.Fatalf("sequence %d: Len %d, want %d", b, dec.Len(b), done[b])
			}
		}
	}
}

// Decoding in any chunks, ragged across a batch, gives causal Forward over
// each whole sequence, bit for bit: both follow the causal rule with the
// same candidates in the same order through the same row kernel.
func TestBatchDecoderMatchesForward(t *testing.T) {
	rng := testRNG(t, 40)
	for _, c := range []struct {
		cfg       Config
		h, hkv, d int
		scale     float32
		lens      []int
		steps     []int
		workers   int
	}{
		{Config{Hashes: 3, Bucket: 4, Buckets: 6, Window: 3, Min: -1}, 4, 2, 23, 0, []int{150, 61, 1, 0}, []int{37, 1, 1, 5, 1, 64, 1}, 0},
		{Config{Hashes: 2, Bucket: 3, Buckets: 100, Window: 5, ExcludeSelf: true, Min: -1, Seed: 4}, 6, 2, 40, 0.2, []int{97}, []int{1}, 1},
		{Config{Hashes: 1, Bucket: 5, Min: -1}, 2, 2, 7, 0, []int{130, 129}, []int{130}, 3},
		{Config{SharedQK: true, Hashes: 2, Bucket: 3, Buckets: 8, Window: 2, Min: -1}, 3, 3, 16, 0, []int{80, 45}, []int{9, 1, 2}, 0},
	} {
		l := mustNew(t, c.cfg)
		dc := attn.DecodeConfig{B: len(c.lens), H: c.h, HKV: c.hkv, D: c.d, Scale: c.scale, Workers: c.workers, MaxLen: 200}
		dec, err := l.NewDecoder(dc)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []tokens
		for _, n := range c.lens {
			seqs = append(seqs, randomTokens(rng, c.h, c.hkv, c.d, n))
		}
		for pass := range 2 { // the second after Reset, in the memory of the first
			outs, lses := decodeAll(t, dec, dc, seqs, c.steps)
			for b, sq := range seqs {
				if sq.n == 0 {
					continue
				}
				s := attn.Shape{B: 1, H: c.h, HKV: c.hkv, N: sq.n, M: sq.n, D: c.d}
				out, lse := forward(t, l, s, sq.q, sq.k, sq.v, attn.Options{Causal: true, Scale: c.scale})
				if e := ref.RelErr(outs[b], widen(out)); e > 1e-5 || !slices.Equal(outs[b], out) || !slices.Equal(lses[b], lse) {
					t.Fatalf("%+v pass %d sequence %d (%d tokens): decoding differs from causal Forward (out rel err %.3g)", c.cfg, pass, b, sq.n, e)
				}
			}
			if dec.Bytes() <= 0 {
				t.Errorf("Bytes() = %d", dec.Bytes())
			}
			dec.Reset()
			for b := range seqs {
				if dec.Len(b) != 0 {
					t.Fatalf("Len(%d) = %d after Reset", b, dec.Len(b))
				}
			}
		}
	}
}

// The single-sequence Decoder follows the same rule: appending then
// stepping each token gives causal Forward.
func TestDecoderMatchesForward(t *testing.T) {
	rng := testRNG(t, 41)
	cfg := Config{Hashes: 2, Bucket: 4, Buckets: 10, Window: 3, Min: -1, Seed: 8}
	const h, hkv, d, n = 4, 2, 19, 90
	sq := randomTokens(rng, h, hkv, d, n)
	dec, err := NewDecoder(cfg, h, hkv, d, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, wantLSE := forward(t, mustNew(t, cfg), attn.Shape{B: 1, H: h, HKV: hkv, N: n, M: n, D: d}, sq.q, sq.k, sq.v, attn.Options{Causal: true})
	out, lse := make([]float32, h*d), make([]float32, h)
	for i := range n {
		if err := dec.Append(rows(sq.k, hkv, n, d, i, 1, 1), rows(sq.v, hkv, n, d, i, 1, 1)); err != nil {
			t.Fatal(err)
		}
		if err := dec.Step(rows(sq.q, h, n, d, i, 1, 1), out, lse); err != nil {
			t.Fatal(err)
		}
		for hd := range h {
			if !slices.Equal(out[hd*d:][:d], want[(hd*n+i)*d:][:d]) || lse[hd] != wantLSE[hd*n+i] {
				t.Fatalf("position %d head %d: the step differs from causal Forward", i, hd)
			}
		}
	}
}

func TestBatchDecoderErrors(t *testing.T) {
	l := mustNew(t, Config{Hashes: 2, Bucket: 4})
	base := attn.DecodeConfig{B: 2, H: 4, HKV: 2, D: 8}
	for _, c := range []struct {
		name string
		mod  func(*attn.DecodeConfig)
		mech *LSH
		want error
	}{
		{"rotation of nothing", func(c *attn.DecodeConfig) { c.Storage = "+rot" }, nil, attn.ErrInput},
		{"unknown storage", func(c *attn.DecodeConfig) { c.Storage = "f8" }, nil, attn.ErrInput},
		{"StreamingLLM window", func(c *attn.DecodeConfig) { c.Window = 16 }, nil, attn.ErrUnsupported},
		{"shared QK with GQA", func(*attn.DecodeConfig) {}, mustNew(t, Config{SharedQK: true}), attn.ErrUnsupported},
		{"H not a multiple of Hkv", func(c *attn.DecodeConfig) { c.H = 3 }, nil, attn.ErrShape},
		{"no sequences", func(c *attn.DecodeConfig) { c.B = 0 }, nil, attn.ErrShape},
		{"NaN scale", func(c *attn.DecodeConfig) { c.Scale = float32(math.NaN()) }, nil, attn.ErrInput},
	} {
		cfg := base
		c.mod(&cfg)
		m := l
		if c.mech != nil {
			m = c.mech
		}
		if _, err := m.NewDecoder(cfg); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	for _, st := range decodeStorages {
		cfg := base
		cfg.Storage = st
		if _, err := l.NewDecoder(cfg); err != nil {
			t.Errorf("storage %q: %v", st, err)
		}
	}

	cfg := base
	cfg.MaxLen = 5
	dec, err := l.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	step := func(n int, valid []int) error {
		q, kv := make([]float32, 2*4*n*8), make([]float32, 2*2*n*8)
		return dec.Step(context.Background(), q, kv, kv, n, valid, make([]float32, len(q)), nil)
	}
	if err := step(4, []int{4, 1}); err != nil {
		t.Fatal(err)
	}
	if err := step(2, []int{2, 0}); !errors.Is(err, kvcache.ErrFull) {
		t.Errorf("step past MaxLen: got %v, want kvcache.ErrFull", err)
	}
	if dec.Len(0) != 4 || dec.Len(1) != 1 {
		t.Errorf("a failed step changed the lengths to %d and %d", dec.Len(0), dec.Len(1))
	}
	if err := step(1, []int{1, 3}); !errors.Is(err, attn.ErrInput) {
		t.Errorf("valid count above n: got %v, want ErrInput", err)
	}
	if err := step(0, nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("empty step: got %v, want ErrInput", err)
	}
	if err := dec.Step(context.Background(), make([]float32, 8), make([]float32, 32), make([]float32, 32), 1, nil, make([]float32, 64), nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short q: got %v, want ErrShape", err)
	}
	if err := step(1, nil); err != nil {
		t.Errorf("a step to exactly MaxLen: %v", err)
	}
}

// At the documented maxima of Config and of the sizes, the decoders return
// an error instead of allocating what they cannot: these calls would ask
// for gigabytes to terabytes.
func TestDecoderSizesAtMaxima(t *testing.T) {
	huge := Config{Hashes: MaxHashes, Buckets: MaxBuckets, Bucket: MaxBucket, Window: MaxWindow}
	for _, c := range []struct {
		cfg       Config
		h, hkv, d int
	}{
		{huge, 8, 8, 64},
		{huge, 1, 1, 1},
		{Config{}, maxIndex, maxIndex, 64},
		{Config{}, 8, 8, maxIndex},
		{Config{Buckets: MaxBuckets}, 1 << 20, 1 << 20, 64},
	} {
		if _, err := NewDecoder(c.cfg, c.h, c.hkv, c.d, 0); !errors.Is(err, attn.ErrUnsupported) {
			t.Errorf("NewDecoder(%+v, %d, %d, %d): got %v, want ErrUnsupported", c.cfg, c.h, c.hkv, c.d, err)
		}
	}
	// Where int has 32 bits, the larger of these are already shapes no
	// tensor can hold.
	tooBig := func(err error) bool {
		return errors.Is(err, attn.ErrUnsupported) || strconv.IntSize == 32 && errors.Is(err, attn.ErrShape)
	}
	l := mustNew(t, huge)
	for _, dc := range []attn.DecodeConfig{
		{B: 1, H: 8, HKV: 8, D: 64},
		{B: 1 << 30, H: 8, HKV: 8, D: 64},
	} {
		if _, err := l.NewDecoder(dc); !tooBig(err) {
			t.Errorf("NewDecoder(%+v) at the Config maxima: got %v, want ErrUnsupported", dc, err)
		}
	}
	if _, err := mustNew(t, Config{}).NewDecoder(attn.DecodeConfig{B: 1 << 24, H: 64, HKV: 64, D: 64, MaxLen: min(1<<32, math.MaxInt>>3)}); !tooBig(err) {
		t.Errorf("2^24 sequences of 64 kv heads: got %v, want ErrUnsupported", err)
	}
	if _, err := NewDecoder(Config{Hashes: 8, Buckets: 1024}, 8, 8, 64, 0); err != nil {
		t.Errorf("a decoder of 64k bucket lists: %v", err)
	}
}

// decodeStorages are the storages of the batch decoder.
var decodeStorages = []string{"", "f32", "bf16", "f16", "i8", "i4", "f32+rot", "bf16+rot", "f16+rot", "i8+rot", "i4+rot"}

// storedTol bounds the relative error of a step against float64
// attention over the same stored rows: float32 rounding in the products,
// which reach about 2e-5 in the lse with bf16 rows at D = 72 and a scale
// of 0.3 (logits of a few units).
const storedTol = 5e-5

// newBatchDecoder returns l's decoder for cfg, failing the test on an
// error.
func newBatchDecoder(t *testing.T, l *LSH, cfg attn.DecodeConfig) *BatchDecoder {
	t.Helper()
	dec, err := l.NewDecoder(cfg)
	if err != nil {
		t.Fatalf("%+v: %v", cfg, err)
	}
	return dec.(*BatchDecoder)
}

// In every storage a step is the causal rule over the rows as stored:
// the keys hashed as read back (rotated with "+rot"), the query rotated
// alike, exact softmax attention over the chosen rows read back, and the
// output rotated back.
func TestBatchDecoderStoragesFollowTheRule(t *testing.T) {
	rng := testRNG(t, 42)
	for _, c := range []struct {
		cfg Config
		dc  attn.DecodeConfig
	}{
		{Config{Hashes: 3, Bucket: 3, Buckets: 6, Window: 3, Seed: 2}, attn.DecodeConfig{B: 2, H: 4, HKV: 2, D: 24}},
		{Config{Hashes: 2, Bucket: 2, Buckets: 8, Window: 2, ExcludeSelf: true, Seed: 5}, attn.DecodeConfig{B: 2, H: 4, HKV: 1, D: 72, Scale: 0.3}},
		{Config{SharedQK: true, Hashes: 2, Bucket: 3, Buckets: 8, Window: 2}, attn.DecodeConfig{B: 2, H: 3, HKV: 3, D: 20}},
	} {
		for _, storage := range decodeStorages {
			dc := c.dc
			dc.Storage = storage
			dec := newBatchDecoder(t, mustNew(t, c.cfg), dc)
			core, d := dec.c, dc.D
			dectest.Run(t, dec, dc, rng, dectest.Script(dc.B, 40, 15), func(hs *dectest.History, st dectest.Step, before []int, out, lse []float32) {
				keys, vals := make([][]float32, dc.B*dc.HKV), make([][]float32, dc.B*dc.HKV)
				for b := range dc.B {
					for kvh := range dc.HKV {
						keys[b*dc.HKV+kvh], vals[b*dc.HKV+kvh] = storedRows(&dec.seqs[b].heads[kvh])
					}
				}
				what := fmt.Sprintf("%+v %q", c.cfg, storage)
				dectest.Compare(t, what, hs, st, before, out, lse, storedTol, func(b, h, p int) ([]float64, float64, bool) {
					kvh := h / (dc.H / dc.HKV)
					q := slices.Clone(hs.Query(b, h, p))
					if core.rot != nil {
						core.rot.Rows(q, false)
					}
					k, v := keys[b*dc.HKV+kvh], vals[b*dc.HKV+kvh]
					mask := ruleKeys(core, k, q, p)
					if dectest.Count(st.N, st.Valid, b) == 1 && dec.SingleAsGiven() {
						// A generated token attends to its own rows as
						// given (rotated), though it hashed its key as
						// stored.
						k, v = slices.Clone(k[:(p+1)*d]), slices.Clone(v[:(p+1)*d])
						copy(k[p*d:], hs.InK[b][kvh][p*d:(p+1)*d])
						copy(v[p*d:], hs.InV[b][kvh][p*d:(p+1)*d])
						if core.rot != nil {
							core.rot.Rows(k[p*d:], false)
							core.rot.Rows(v[p*d:], false)
						}
					}
					s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: p + 1, D: d}
					o, l, err := ref.Attention(s, q, k[:(p+1)*d], v[:(p+1)*d], ref.Spec{Scale: float64(core.scale), Mask: mask})
					if err != nil {
						t.Fatal(err)
					}
					if core.rot != nil {
						// Back in float32: an error of about 1e-7,
						// far below the tolerance.
						o32 := make([]float32, d)
						for i, x := range o {
							o32[i] = float32(x)
						}
						core.rot.Rows(o32, true)
						o = widen(o32)
					}
					return o, l[0], true
				})
			})
		}
	}
}

// With a window over the whole sequence every key is chosen: a step is
// exact causal attention over the rows as read back. The reference takes
// them rotated back (so that it checks the rotation of the queries and
// of the outputs too) and attends with the queries as given.
func TestBatchDecoderStoragesExact(t *testing.T) {
	rng := testRNG(t, 43)
	l := mustNew(t, Config{Hashes: 1, Bucket: 1, Buckets: 4, Window: 1000})
	for _, storage := range decodeStorages {
		for _, d := range []int{20, 72} {
			dc := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: d, Storage: storage, MaxLen: 1000}
			dec := newBatchDecoder(t, l, dc)
			dectest.Run(t, dec, dc, rng, dectest.Script(dc.B, 33, 12), func(hs *dectest.History, st dectest.Step, before []int, out, lse []float32) {
				for b := range dc.B {
					for kvh := range dc.HKV {
						k, v := storedRows(&dec.seqs[b].heads[kvh])
						if r := dec.c.rot; r != nil {
							r.Rows(k, true)
							r.Rows(v, true)
						}
						hs.K[b][kvh], hs.V[b][kvh] = k, v
					}
				}
				dectest.Compare(t, fmt.Sprintf("%q D=%d", storage, d), hs, st, before, out, lse, storedTol, func(b, h, p int) ([]float64, float64, bool) {
					o, l := hs.Exact(b, h, p)
					return o, l, true
				})
			})
		}
	}
}

// A ragged batch decodes each sequence as it decodes alone, and the
// worker count changes no bit, in the narrow and rotated storages too.
func TestBatchDecoderRaggedAndWorkers(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		dc  attn.DecodeConfig
	}{
		{Config{Hashes: 3, Bucket: 3, Buckets: 6, Window: 3}, attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 24, Storage: "i4+rot"}},
		{Config{Hashes: 2, Bucket: 4, Buckets: 8, Window: 2, ExcludeSelf: true}, attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 20, Storage: "i4+rot"}},
		{Config{SharedQK: true, Hashes: 2, Bucket: 3, Buckets: 8, Window: 2}, attn.DecodeConfig{B: 3, H: 3, HKV: 3, D: 72, Storage: "i4+rot"}},
		{Config{Hashes: 2, Bucket: 3, Buckets: 6, Window: 3}, attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 20, Storage: "bf16+rot"}},
	} {
		l := mustNew(t, c.cfg)
		newDec := func(dc attn.DecodeConfig) attn.Decoder { return newBatchDecoder(t, l, dc) }
		dectest.CheckRagged(t, newDec, c.dc, testRNG(t, 44), dectest.Script(c.dc.B, 47, 12))
		dectest.CheckWorkers(t, newDec, c.dc, 45, dectest.Script(c.dc.B, 47, 12))
	}
}

// Int4 codes, rotated, stay close to float32: with every key chosen (so
// that the hashes do not differ) the outputs on Gaussian inputs differ
// by the quantisation error only. That error is not small: a group of 64
// Gaussian values spans about ±2.4σ, a step of 0.32σ, so each stored
// value is off by about 0.09σ rms, and each logit by about 0.09; the
// outputs measure about 0.12 (as kvcache's TestI4Accuracy finds), and
// the rotation does not lower it on inputs without outlier channels. A
// rotation not undone (about 1.4), or codes read with the wrong scales,
// would be far off the bound of 0.2.
func TestBatchDecoderInt4NearFloat32(t *testing.T) {
	rng := testRNG(t, 46)
	l := mustNew(t, Config{Hashes: 1, Bucket: 1, Buckets: 4, Window: 1000})
	for _, d := range []int{64, 128} {
		dc := attn.DecodeConfig{B: 2, H: 4, HKV: 2, D: d, MaxLen: 1000}
		seqs := []tokens{randomTokens(rng, dc.H, dc.HKV, d, 300), randomTokens(rng, dc.H, dc.HKV, d, 200)}
		steps := []int{64, 1, 1, 3, 1}
		want, _ := decodeAll(t, newBatchDecoder(t, l, dc), dc, seqs, steps)
		for _, c := range []struct {
			storage string
			tol     float64
		}{{"i4+rot", 0.2}, {"i4", 0.2}, {"i8", 0.03}, {"bf16+rot", 0.01}} {
			dc := dc
			dc.Storage = c.storage
			got, _ := decodeAll(t, newBatchDecoder(t, l, dc), dc, seqs, steps)
			for b := range seqs {
				e := ref.RelErr(got[b], widen(want[b]))
				t.Logf("D=%d %q sequence %d: rel err %.3g against f32", d, c.storage, b, e)
				if e > c.tol {
					t.Errorf("D=%d %q sequence %d: rel err %.3g against f32, want at most %g", d, c.storage, b, e, c.tol)
				}
			}
		}
	}
}
