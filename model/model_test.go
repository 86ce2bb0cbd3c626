package model

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/kvcache"
)

// Small architectures with odd sizes: head sizes 12, 24 and 40 (not powers
// of two), grouped and multi-query attention, tied and separate outputs.
var testConfigs = []Config{
	{Dim: 48, Hidden: 40, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 61, SeqLen: 64},
	{Dim: 96, Hidden: 72, Layers: 1, Heads: 4, KVHeads: 1, Vocab: 37, SeqLen: 0, TiedOutput: true, RopeBase: 500},
	{Dim: 80, Hidden: 100, Layers: 2, Heads: 2, KVHeads: 2, Vocab: 50, SeqLen: 40, NormEps: 1e-6},
}

func randomModel(t testing.TB, cfg Config, seed uint64, o Options) *Model {
	t.Helper()
	w, err := RandomWeights(cfg, seed)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(w, o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randomTokens(rng *rand.Rand, n, vocab int) []int {
	ts := make([]int, n)
	for i := range ts {
		ts[i] = rng.IntN(vocab)
	}
	return ts
}

// refForward is the model computed directly in float64: the definition
// the package is checked against.
func refForward(w *Weights, tokens []int) [][]float64 {
	c := w.Config.WithDefaults()
	n, d, hd := len(tokens), c.Dim, c.HeadDim()
	kvd := c.KVHeads * hd
	vec := func(rows, cols int) [][]float64 {
		m := make([][]float64, rows)
		for i := range m {
			m[i] = make([]float64, cols)
		}
		return m
	}
	matvec := func(w []float32, x []float64, out int) []float64 {
		y := make([]float64, out)
		in := len(x)
		for o := range y {
			for i, xi := range x {
				y[o] += float64(w[o*in+i]) * xi
			}
		}
		return y
	}
	norm := func(x []float64, g []float32) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(len(x))+float64(c.NormEps))
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * inv * float64(g[i])
		}
		return y
	}
	rot := func(v []float64, pos int) {
		for h := 0; h < len(v); h += hd {
			for i := 0; i < hd/2; i++ {
				th := float64(pos) * math.Pow(float64(c.RopeBase), -float64(2*i)/float64(hd))
				a, b := v[h+2*i], v[h+2*i+1]
				v[h+2*i] = a*math.Cos(th) - b*math.Sin(th)
				v[h+2*i+1] = a*math.Sin(th) + b*math.Cos(th)
			}
		}
	}
	x := vec(n, d)
	for t, tok := range tokens {
		for i := range d {
			x[t][i] = float64(w.Embed[tok*d+i])
		}
	}
	for _, L := range w.Layers {
		q, k, v := vec(n, d), vec(n, kvd), vec(n, kvd)
		for t := range n {
			xn := norm(x[t], L.AttnNorm)
			q[t], k[t], v[t] = matvec(L.Wq, xn, d), matvec(L.Wk, xn, kvd), matvec(L.Wv, xn, kvd)
			rot(q[t], t)
			rot(k[t], t)
		}
		for t := range n {
			o := make([]float64, d)
			for h := range c.Heads {
				kh := h / (c.Heads / c.KVHeads)
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for j := range s {
					for i := range hd {
						s[j] += q[t][h*hd+i] * k[j][kh*hd+i]
					}
					s[j] /= math.Sqrt(float64(hd))
					mx = math.Max(mx, s[j])
				}
				var sum float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				for j := range s {
					for i := range hd {
						o[h*hd+i] += s[j] / sum * v[j][kh*hd+i]
					}
				}
			}
			for i, y := range matvec(L.Wo, o, d) {
				x[t][i] += y
			}
		}
		for t := range n {
			xn := norm(x[t], L.MLPNorm)
			g, u := matvec(L.W1, xn, c.Hidden), matvec(L.W3, xn, c.Hidden)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			for i, y := range matvec(L.W2, g, d) {
				x[t][i] += y
			}
		}
	}
	logits := vec(n, c.Vocab)
	for t := range n {
		logits[t] = matvec(w.output(), norm(x[t], w.Norm), c.Vocab)
	}
	return logits
}

// logitErr is the largest difference between a and the rows of want,
// relative to the largest |want| (at least 1).
func logitErr(a []float32, want [][]float64) float64 {
	var scale, diff float64 = 1, 0
	v := len(want[0])
	for t, row := range want {
		for i, x := range row {
			scale = math.Max(scale, math.Abs(x))
			diff = math.Max(diff, math.Abs(float64(a[t*v+i])-x))
		}
	}
	return diff / scale
}

func TestForwardMatchesFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for ci, cfg := range testConfigs {
		m := randomModel(t, cfg, uint64(ci), Options{Workers: 1 + ci%2})
		for _, n := range []int{1, 2, 3, 5, 37} { // dot products below 4 positions, Gemm from 4
			tokens := randomTokens(rng, n, cfg.Vocab)
			want := refForward(m.Weights(), tokens)
			from := rng.IntN(n)
			got := make([]float32, (n-from)*cfg.Vocab)
			if err := m.Forward(context.Background(), tokens, from, got); err != nil {
				t.Fatal(err)
			}
			if e := logitErr(got, want[from:]); e > 2e-5 {
				t.Errorf("config %d, n = %d: logits differ from float64 by %.2g (relative)", ci, n, e)
			}
		}
	}
}

// TestDecodeMatchesForward feeds a sequence to a session in chunks and
// token by token: the logits after every position must be those of one
// Forward over the whole sequence.
func TestDecodeMatchesForward(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ctx := context.Background()
	for ci, cfg := range testConfigs {
		for _, dt := range []kvcache.DType{kvcache.F32, kvcache.BF16, kvcache.I8} {
			m := randomModel(t, cfg, uint64(10+ci), Options{Cache: dt})
			n := 29
			tokens := randomTokens(rng, n, cfg.Vocab)
			full := make([]float32, n*cfg.Vocab)
			if err := m.Forward(ctx, tokens, 0, full); err != nil {
				t.Fatal(err)
			}
			sess, err := m.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			logits := make([]float32, cfg.Vocab)
			tol := 1e-4
			if dt != kvcache.F32 {
				// Keys and values rounded to 8 bits: bf16 mantissas, or
				// i8 codes of a row's largest value (measured: under
				// 2e-2 for both).
				tol = 5e-2
			}
			// A prompt of 7, then one token at a time, then a chunk of 5.
			for pos := 0; pos < n; {
				step := 1
				switch {
				case pos == 0:
					step = 7
				case pos == 20:
					step = 5
				}
				step = min(step, n-pos)
				if err := sess.Step(ctx, tokens[pos:pos+step], logits); err != nil {
					t.Fatal(err)
				}
				pos += step
				want := full[(pos-1)*cfg.Vocab:][:cfg.Vocab]
				// 1e-4 of the logits' scale (about 1 with these weights).
				scale := max(1, float64(slices.Max(want)), -float64(slices.Min(want)))
				if e := maxDiff(logits, want) / scale; e > tol {
					t.Fatalf("config %d, cache %v: logits after position %d differ from Forward by %.2g", ci, dt, pos-1, e)
				}
			}
			if sess.Len() != n {
				t.Errorf("Len = %d, want %d", sess.Len(), n)
			}
			sess.Reset()
			if err := sess.Step(ctx, tokens[:1], logits); err != nil {
				t.Fatal(err)
			}
			if e := maxDiff(logits, full[:cfg.Vocab]); e > tol {
				t.Errorf("after Reset, logits differ by %.2g", e)
			}
		}
	}
}

func maxDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// TestExactPatchChangesNothing patches every layer with "exact": prefill
// and decode must give the same bits as the unpatched model.
func TestExactPatchChangesNothing(t *testing.T) {
	ctx := context.Background()
	cfg := testConfigs[0]
	w, _ := RandomWeights(cfg, 5)
	plain, err := New(w, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := ParsePatch("exact:layers=all")
	if err != nil {
		t.Fatal(err)
	}
	patched, err := New(w, Options{Patches: ps, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	tokens := randomTokens(rand.New(rand.NewPCG(5, 6)), 23, cfg.Vocab)
	a, b := make([]float32, len(tokens)*cfg.Vocab), make([]float32, len(tokens)*cfg.Vocab)
	if err := plain.Forward(ctx, tokens, 0, a); err != nil {
		t.Fatal(err)
	}
	if err := patched.Forward(ctx, tokens, 0, b); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, b) {
		t.Errorf("Forward with exact patched on every layer differs by %.2g", maxDiff(a, b))
	}
	for l := range cfg.Layers {
		if patched.Patched(l) || patched.Attention(l) != "exact" {
			t.Errorf("layer %d: Patched = %v, Attention = %q", l, patched.Patched(l), patched.Attention(l))
		}
	}
	sa, err := plain.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	sb, err := patched.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	la, lb := make([]float32, cfg.Vocab), make([]float32, cfg.Vocab)
	for i := range tokens {
		if err := sa.Step(ctx, tokens[i:i+1], la); err != nil {
			t.Fatal(err)
		}
		if err := sb.Step(ctx, tokens[i:i+1], lb); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(la, lb) {
			t.Fatalf("decode step %d differs by %.2g", i, maxDiff(la, lb))
		}
	}
}

// TestPatchedDecode checks that a session of a patched model gives what
// Forward gives: mechanisms whose causal outputs do not depend on later
// positions (linear, performer) match Forward over the whole sequence at
// every position.
func TestPatchedDecode(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	for _, spec := range []string{"linear:layers=1", "performer:layers=0-1,features=32,min=0", "window:layers=0,1,left=5"} {
		cfg := testConfigs[0]
		ps, err := ParsePatch(spec)
		if err != nil {
			t.Fatal(err)
		}
		m := randomModel(t, cfg, 11, Options{Patches: ps, Seed: 3})
		exact := randomModel(t, cfg, 11, Options{})
		n := 19
		tokens := randomTokens(rng, n, cfg.Vocab)
		full, ex := make([]float32, n*cfg.Vocab), make([]float32, n*cfg.Vocab)
		if err := m.Forward(ctx, tokens, 0, full); err != nil {
			t.Fatal(err)
		}
		if err := exact.Forward(ctx, tokens, 0, ex); err != nil {
			t.Fatal(err)
		}
		if maxDiff(full, ex) < 1e-3 {
			t.Errorf("%s: patched logits equal the exact model's; the patch did nothing", spec)
		}
		sess, err := m.NewSession()
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		logits := make([]float32, cfg.Vocab)
		for pos := 0; pos < n; {
			step := min(1+pos%3, n-pos)
			if err := sess.Step(ctx, tokens[pos:pos+step], logits); err != nil {
				t.Fatal(err)
			}
			pos += step
			if e := maxDiff(logits, full[(pos-1)*cfg.Vocab:][:cfg.Vocab]); e > 1e-4 {
				t.Fatalf("%s: decode after position %d differs from Forward by %.2g", spec, pos-1, e)
			}
		}
	}
}

func TestSeedDeterminism(t *testing.T) {
	ctx := context.Background()
	cfg := testConfigs[2]
	ps, _ := ParsePatch("performer:features=16,min=0")
	tokens := randomTokens(rand.New(rand.NewPCG(1, 1)), 17, cfg.Vocab)
	run := func(seed uint64) []float32 {
		m := randomModel(t, cfg, 4, Options{Patches: ps, Seed: seed})
		out := make([]float32, cfg.Vocab)
		if err := m.Forward(ctx, tokens, len(tokens)-1, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, b, c := run(1), run(1), run(2)
	if !slices.Equal(a, b) {
		t.Error("the same seed gave different logits")
	}
	if slices.Equal(a, c) {
		t.Error("different seeds gave the same logits")
	}
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	cfg := testConfigs[0]
	w, _ := RandomWeights(cfg, 1)
	m, err := New(w, Options{})
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, cfg.Vocab)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"no tokens", m.Forward(ctx, nil, 0, nil), attn.ErrInput},
		{"token too large", m.Forward(ctx, []int{cfg.Vocab}, 0, logits), attn.ErrInput},
		{"negative token", m.Forward(ctx, []int{-1}, 0, logits), attn.ErrInput},
		{"from past the end", m.Forward(ctx, []int{1}, 2, nil), attn.ErrInput},
		{"short logits", m.Forward(ctx, []int{1, 2}, 0, logits), attn.ErrShape},
	}
	for _, o := range []Options{
		{Workers: -1},
		{Patches: []Patch{{Mechanism: "nosuch"}}},
		{Patches: []Patch{{Mechanism: "exact", Layers: []int{cfg.Layers}}}},
		{Patches: []Patch{{Mechanism: "exact", Layers: []int{0}}, {Mechanism: "linear", Layers: []int{0}}}},
		{Patches: []Patch{{Mechanism: "performer", Settings: []string{"nosuch=1"}}}},
		{Cache: 7},
	} {
		_, err := New(w, o)
		cases = append(cases, struct {
			name string
			err  error
			want error
		}{"options", err, attn.ErrInput})
	}
	bad := *w
	bad.Norm = slices.Clone(w.Norm)
	bad.Norm[3] = float32(math.NaN())
	_, err = New(&bad, Options{})
	cases = append(cases, struct {
		name string
		err  error
		want error
	}{"NaN weight", err, ErrFormat})
	// Linformer has no causal form: the pass reports it.
	lf, err := New(w, Options{Patches: []Patch{{Mechanism: "linformer", Layers: []int{1}}}})
	if err != nil {
		t.Fatal(err)
	}
	cases = append(cases, struct {
		name string
		err  error
		want error
	}{"causal linformer", lf.Forward(ctx, []int{1, 2, 3}, 2, logits), attn.ErrUnsupported})
	_, err = lf.NewSession()
	cases = append(cases, struct {
		name string
		err  error
		want error
	}{"linformer session", err, attn.ErrUnsupported})
	sess, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	cases = append(cases, struct {
		name string
		err  error
		want error
	}{"step logits", sess.Step(ctx, []int{1}, logits[:3]), attn.ErrShape})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	cases = append(cases, struct {
		name string
		err  error
		want error
	}{"cancelled", m.Forward(cancelled, []int{1, 2, 3, 4, 5}, 4, logits), context.Canceled})
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, c.err, c.want)
		}
	}
	for _, c := range []Config{
		{},
		{Dim: 10, Hidden: 4, Layers: 1, Heads: 3, Vocab: 5},
		{Dim: 12, Hidden: 4, Layers: 1, Heads: 4, Vocab: 5},             // head size 3 is odd
		{Dim: 16, Hidden: 4, Layers: 1, Heads: 4, KVHeads: 3, Vocab: 5}, // 4 % 3
		{Dim: 16, Hidden: 4, Layers: 1, Heads: 4, Vocab: 5, RopeBase: -1},
		{Dim: 16, Hidden: 4, Layers: 1, Heads: 4, Vocab: 5, SeqLen: -1},
	} {
		if _, err := NewWeights(c); !errors.Is(err, ErrFormat) {
			t.Errorf("NewWeights(%+v): %v, want ErrFormat", c, err)
		}
	}
}

func TestParsePatch(t *testing.T) {
	for _, c := range []struct {
		spec string
		want []Patch
	}{
		{"hyper:layers=2-3,block=32,samples=32", []Patch{{"hyper", []int{2, 3}, []string{"block=32", "samples=32"}}}},
		{"exact", []Patch{{"exact", nil, nil}}},
		{"exact:layers=all", []Patch{{"exact", nil, nil}}},
		{"linear:layers=0,2,4-5;performer:features=64,layers=1",
			[]Patch{{"linear", []int{0, 2, 4, 5}, nil}, {"performer", []int{1}, []string{"features=64"}}}},
		{"longformer:globals=0,5,left=8", []Patch{{"longformer", nil, []string{"globals=0,5", "left=8"}}}},
		{" ; exact ; ", []Patch{{"exact", nil, nil}}},
	} {
		got, err := ParsePatch(c.spec)
		if err != nil {
			t.Errorf("ParsePatch(%q): %v", c.spec, err)
			continue
		}
		if len(got) != len(c.want) {
			t.Errorf("ParsePatch(%q) = %v, want %v", c.spec, got, c.want)
			continue
		}
		for i := range got {
			g, w := got[i], c.want[i]
			if g.Mechanism != w.Mechanism || !slices.Equal(g.Layers, w.Layers) || !slices.Equal(g.Settings, w.Settings) {
				t.Errorf("ParsePatch(%q)[%d] = %+v, want %+v", c.spec, i, g, w)
			}
			if again, err := ParsePatch(g.String()); err != nil || !slices.Equal(again[0].Layers, g.Layers) {
				t.Errorf("ParsePatch(%q) does not read back: %v %v", g.String(), again, err)
			}
		}
	}
	for _, bad := range []string{":layers=1", "exact:block", "exact:layers=x", "exact:layers=3-1",
		"exact:layers=-1", "exact:layers=1,layers=2", "exact:layers=", "exact:layers=0-99999999"} {
		if _, err := ParsePatch(bad); !errors.Is(err, attn.ErrInput) {
			t.Errorf("ParsePatch(%q): %v, want ErrInput", bad, err)
		}
	}
}

func TestActivations(t *testing.T) {
	cfg := testConfigs[0]
	m := randomModel(t, cfg, 2, Options{})
	tokens := randomTokens(rand.New(rand.NewPCG(2, 2)), 13, cfg.Vocab)
	s, q, k, v, out, err := m.Activations(context.Background(), tokens, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.N != 13 || s.H != cfg.Heads || s.HKV != cfg.KVHeads || s.D != cfg.Dim/cfg.Heads {
		t.Fatalf("shape %+v", s)
	}
	// out is causal attention of q, k, v.
	want := make([]float32, len(out))
	if err := m.exact.Forward(context.Background(), s, q, k, v, attn.Options{Causal: true}, want, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, want) {
		t.Error("Activations' output is not the attention of its q, k, v")
	}
	if _, _, _, _, _, err := m.Activations(context.Background(), tokens, cfg.Layers); !errors.Is(err, attn.ErrInput) {
		t.Errorf("layer out of range: %v", err)
	}
}

// TestDecodeFallback checks that a model reports its decoders' fallbacks,
// not Forward's: Performer's decoder approximates below min, where its
// Forward is exact; HyperAttention's decoder is exact below min.
func TestDecodeFallback(t *testing.T) {
	cfg := testConfigs[0]
	for _, c := range []struct {
		spec            string
		forward, decode bool // whether each falls back at n = 50
	}{
		{"performer:features=16", true, false},
		{"hyper:min=64", true, true},
		{"hyper:min=0,block=8,samples=8", false, false},
		{"window:left=4", false, false},
	} {
		ps, err := ParsePatch(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		m := randomModel(t, cfg, 3, Options{Patches: ps})
		for l := range cfg.Layers {
			if got := m.Fallback(l, 50) != ""; got != c.forward {
				t.Errorf("%s layer %d: Fallback = %q, want fallback %v", c.spec, l, m.Fallback(l, 50), c.forward)
			}
			if got := m.DecodeFallback(l, 50) != ""; got != c.decode {
				t.Errorf("%s layer %d: DecodeFallback = %q, want fallback %v", c.spec, l, m.DecodeFallback(l, 50), c.decode)
			}
		}
	}
}

// TestSessionStorage decodes through int4 and rotated caches: the logits
// stay near Forward's, within what the storage's rounding allows.
func TestSessionStorage(t *testing.T) {
	ctx := context.Background()
	cfg := testConfigs[0]
	rng := rand.New(rand.NewPCG(9, 9))
	tokens := randomTokens(rng, 21, cfg.Vocab)
	for _, c := range []struct {
		o   Options
		tol float64
	}{{Options{Cache: kvcache.BF16, CacheRotate: true}, 5e-2}, {Options{Cache: kvcache.I4}, 0.5}, {Options{Cache: kvcache.I4, CacheRotate: true}, 0.5}} {
		m := randomModel(t, cfg, 12, c.o)
		full := make([]float32, len(tokens)*cfg.Vocab)
		if err := m.Forward(ctx, tokens, 0, full); err != nil {
			t.Fatal(err)
		}
		sess, err := m.NewSession()
		if err != nil {
			t.Fatalf("%+v: %v", c.o, err)
		}
		logits := make([]float32, cfg.Vocab)
		for i := range tokens {
			if err := sess.Step(ctx, tokens[i:i+1], logits); err != nil {
				t.Fatal(err)
			}
			want := full[i*cfg.Vocab:][:cfg.Vocab]
			scale := max(1, float64(slices.Max(want)), -float64(slices.Min(want)))
			if e := maxDiff(logits, want) / scale; !(e <= c.tol) {
				t.Fatalf("%+v: logits after %d differ from Forward by %.2g", c.o, i, e)
			}
		}
	}
}
