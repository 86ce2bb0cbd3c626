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

func TestSampler(t *testing.T) {
	logits := []float32{1, 3, 3, -2, 0.5}
	g, _ := NewSampler(0, 0, 1)
	if got := g.Sample(logits); got != 1 {
		t.Errorf("greedy = %d, want 1 (ties to the lowest id)", got)
	}
	// Top-1 at any temperature is greedy.
	s, _ := NewSampler(5, 1, 1)
	for range 20 {
		if got := s.Sample(logits); got != 1 {
			t.Fatalf("top-1 = %d", got)
		}
	}
	// Top-2 only ever picks 1 or 2, about equally.
	s, _ = NewSampler(1, 2, 7)
	var count [5]int
	for range 2000 {
		count[s.Sample(logits)]++
	}
	if count[0]+count[3]+count[4] != 0 || count[1] < 850 || count[2] < 850 {
		t.Errorf("top-2 counts %v", count)
	}
	// Frequencies follow softmax(logits/temp).
	s, _ = NewSampler(2, 0, 9)
	count = [5]int{}
	const n = 20000
	for range n {
		count[s.Sample(logits)]++
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l) / 2)
	}
	for i, l := range logits {
		p := math.Exp(float64(l)/2) / z
		if got := float64(count[i]) / n; math.Abs(got-p) > 4*math.Sqrt(p*(1-p)/n)+1e-3 {
			t.Errorf("token %d drawn %.4f of the time, want %.4f", i, got, p)
		}
	}
	for _, c := range []struct {
		temp float64
		k    int
	}{{-1, 0}, {math.NaN(), 0}, {math.Inf(1), 0}, {1, -1}} {
		if _, err := NewSampler(c.temp, c.k, 1); !errors.Is(err, attn.ErrInput) {
			t.Errorf("NewSampler(%v, %d): %v", c.temp, c.k, err)
		}
	}
}

func TestGenerate(t *testing.T) {
	ctx := context.Background()
	cfg := testConfigs[0] // SeqLen 64
	m := randomModel(t, cfg, 21, Options{})
	prompt := randomTokens(rand.New(rand.NewPCG(1, 2)), 9, cfg.Vocab)
	gen := func(temp float64, seed uint64, n, eos int) ([]int, Stats) {
		smp, err := NewSampler(temp, 10, seed)
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		st, err := m.Generate(ctx, prompt, n, smp, eos, func(tok int) error { out = append(out, tok); return nil })
		if err != nil {
			t.Fatal(err)
		}
		return out, st
	}
	// Greedy generation is the argmax of Forward over prompt+generated.
	out, st := gen(0, 1, 12, -1)
	if st.Prompt != 9 || st.Generated != 12 || len(out) != 12 || st.Stop != "length" {
		t.Fatalf("stats %+v, %d tokens", st, len(out))
	}
	seq := append(slices.Clone(prompt), out...)
	logits := make([]float32, (len(seq)-len(prompt)+1)*cfg.Vocab)
	if err := m.Forward(ctx, seq, len(prompt)-1, logits); err != nil {
		t.Fatal(err)
	}
	for i, tok := range out {
		row := logits[i*cfg.Vocab:][:cfg.Vocab]
		if best := slices.Index(row, slices.Max(row)); best != tok {
			t.Errorf("greedy token %d = %d, Forward's argmax is %d", i, tok, best)
		}
	}
	// Sampling is reproducible by seed.
	a, _ := gen(0.8, 5, 15, -1)
	b, _ := gen(0.8, 5, 15, -1)
	c, _ := gen(0.8, 6, 15, -1)
	if !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Errorf("seeded sampling: %v, %v, %v", a, b, c)
	}
	// Stops at EOS (not emitted) and at the context.
	stopAt, st := gen(0, 1, 12, out[3])
	if first := slices.Index(out, out[3]); st.Stop != "eos" || !slices.Equal(stopAt, out[:first]) {
		t.Errorf("eos: %v, %+v", stopAt, st)
	}
	long, st := gen(0.5, 1, 1000, -1)
	if st.Stop != "context" || len(prompt)+len(long) != cfg.SeqLen+1 {
		t.Errorf("context: %d tokens, %+v", len(long), st)
	}
	if st.PrefillRate() <= 0 || st.DecodeRate() <= 0 {
		t.Errorf("rates %v %v", st.PrefillRate(), st.DecodeRate())
	}
	smp, _ := NewSampler(0, 0, 1)
	stop := errors.New("stop")
	if _, err := m.Generate(ctx, prompt, 5, smp, -1, func(int) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("emit error: %v", err)
	}
	if _, err := m.Generate(ctx, nil, 5, smp, -1, nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("empty prompt: %v", err)
	}
	if _, err := m.Generate(ctx, make([]int, cfg.SeqLen+1), 5, smp, -1, nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("prompt past the context: %v", err)
	}
}

func TestPerplexity(t *testing.T) {
	ctx := context.Background()
	cfg := testConfigs[2]
	w, _ := RandomWeights(cfg, 31)
	exact, _ := New(w, Options{})
	tokens := randomTokens(rand.New(rand.NewPCG(3, 1)), 45, cfg.Vocab)
	// Non-overlapping windows of 16: each window scores its tokens but the
	// first, which nothing in the window predicts.
	var calls int
	r, err := Perplexity(ctx, exact, tokens, PerplexityOptions{Context: 16, Stride: 16, Reference: exact,
		Progress: func(done, total int) { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	if r.Tokens != 42 || r.Windows != 3 || calls != 3 {
		t.Fatalf("%d tokens, %d windows, %d progress calls", r.Tokens, r.Windows, calls)
	}
	var want float64
	for b := 0; b < len(tokens); b += 16 {
		e := min(b+16, len(tokens))
		logits := make([]float32, (e-b)*cfg.Vocab)
		if err := exact.Forward(ctx, tokens[b:e], 0, logits); err != nil {
			t.Fatal(err)
		}
		lp := make([]float64, cfg.Vocab)
		for i := b + 1; i < e; i++ {
			logSoftmax(lp, logits[(i-1-b)*cfg.Vocab:][:cfg.Vocab])
			want -= lp[tokens[i]]
		}
	}
	if math.Abs(r.NLL-want) > 1e-9*want || r.RefNLL != r.NLL || r.KL != 0 {
		t.Errorf("NLL %v (reference %v, KL %v), want %v", r.NLL, r.RefNLL, r.KL, want)
	}
	if r.PPL() != math.Exp(want/42) || r.BitsPerChar(88) != want/math.Ln2/88 {
		t.Errorf("PPL %v, bits/char %v", r.PPL(), r.BitsPerChar(88))
	}
	for l, e := range r.LayerErr {
		if e != 0 {
			t.Errorf("exact model, layer %d error %v", l, e)
		}
	}
	// Overlapping windows score every token once.
	r2, err := Perplexity(ctx, exact, tokens, PerplexityOptions{Context: 20, Stride: 7})
	if err != nil || r2.Tokens != 44 {
		t.Fatalf("stride 7: %d tokens, %v", r2.Tokens, err)
	}
	// A patched layer has an error, the other none, and the KL is positive.
	ps, _ := ParsePatch("performer:layers=1,features=8,min=0")
	patched, err := New(w, Options{Patches: ps})
	if err != nil {
		t.Fatal(err)
	}
	r3, err := Perplexity(ctx, patched, tokens, PerplexityOptions{Context: 16, Stride: 16, Reference: exact})
	if err != nil {
		t.Fatal(err)
	}
	if r3.LayerErr[0] != 0 || !(r3.LayerErr[1] > 0.01) || !(r3.KL > 0) || r3.RefNLL != r.NLL {
		t.Errorf("patched: layer errors %v, KL %v, reference NLL %v (want %v)", r3.LayerErr, r3.KL, r3.RefNLL, r.NLL)
	}
	for _, o := range []PerplexityOptions{{Context: 1}, {Context: 8, Stride: 9}, {Stride: -1}} {
		if _, err := Perplexity(ctx, exact, tokens, o); !errors.Is(err, attn.ErrInput) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if _, err := Perplexity(ctx, exact, tokens[:1], PerplexityOptions{}); !errors.Is(err, attn.ErrInput) {
		t.Errorf("one token: %v", err)
	}
}

// TestDecodedPerplexity checks Perplexity with Decode: on an exact
// model it scores what the whole-window pass scores, within the float32
// differences of the decode kernels, on overlapping windows; with an
// int4 KV cache, which only decoding uses, the model's scores move away
// from its reference's while the reference stays the exact pass.
func TestDecodedPerplexity(t *testing.T) {
	ctx := context.Background()
	cfg := testConfigs[2]
	w, _ := RandomWeights(cfg, 31)
	exact, _ := New(w, Options{})
	tokens := randomTokens(rand.New(rand.NewPCG(3, 1)), 45, cfg.Vocab)
	o := PerplexityOptions{Context: 20, Stride: 7}
	whole, err := Perplexity(ctx, exact, tokens, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Decode, o.Reference = true, exact
	dec, err := Perplexity(ctx, exact, tokens, o)
	if err != nil {
		t.Fatal(err)
	}
	// The reference's NLL comes from logSoftmax in float64 and the whole
	// pass's from nllOf, within about 1e-6 nats a position of it (the
	// same logits, but a float32 sum of float32 exponentials).
	if dec.Tokens != whole.Tokens || dec.Windows != whole.Windows || math.Abs(dec.NLL-whole.NLL) > 1e-5*whole.NLL ||
		math.Abs(dec.RefNLL-whole.NLL) > 1e-6*float64(whole.Tokens) || !(dec.KL >= 0 && dec.KL < 1e-6*float64(dec.Tokens)) {
		t.Errorf("decoded: %d tokens %d windows NLL %v reference %v KL %v; whole windows: %d tokens %d windows NLL %v",
			dec.Tokens, dec.Windows, dec.NLL, dec.RefNLL, dec.KL, whole.Tokens, whole.Windows, whole.NLL)
	}
	if dec.LayerErr != nil || dec.AttnSeconds != 0 {
		t.Errorf("decoded: layer errors %v, attention seconds %v, want none", dec.LayerErr, dec.AttnSeconds)
	}
	i4, err := New(w, Options{Cache: kvcache.I4})
	if err != nil {
		t.Fatal(err)
	}
	q, err := Perplexity(ctx, i4, tokens, o)
	if err != nil {
		t.Fatal(err)
	}
	if q.RefNLL != dec.RefNLL || !(q.KL > 1e-6*float64(q.Tokens)) || q.NLL == dec.NLL {
		t.Errorf("int4 cache: NLL %v (exact decoded %v), reference %v (want %v), KL %v", q.NLL, dec.NLL, q.RefNLL, dec.RefNLL, q.KL)
	}
	if q2, err := Perplexity(ctx, i4, tokens, PerplexityOptions{Context: 20, Stride: 7}); err != nil || q2.NLL != whole.NLL {
		t.Errorf("int4 cache, whole windows: NLL %v, want the exact %v (%v)", q2.NLL, whole.NLL, err)
	}
}

func TestWindows(t *testing.T) {
	b, e, f := Windows(10, 4, 3)
	if !slices.Equal(b, []int{0, 3, 6}) || !slices.Equal(e, []int{4, 7, 10}) || !slices.Equal(f, []int{1, 4, 7}) {
		t.Errorf("Windows(10, 4, 3) = %v %v %v", b, e, f)
	}
	b, e, f = Windows(3, 8, 4)
	if !slices.Equal(b, []int{0}) || !slices.Equal(e, []int{3}) || !slices.Equal(f, []int{1}) {
		t.Errorf("Windows(3, 8, 4) = %v %v %v", b, e, f)
	}
}

// TestNLLOf checks the fast negative log-likelihood of Perplexity
// against logSoftmax's float64, on vocabularies around its block and of a
// published model's size, logits spread over a wide range, and that
// non-finite logits give NaN as logSoftmax does.
func TestNLLOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 0))
	for _, v := range []int{1, 7, 1023, 1024, 1025, 4096, 151936} {
		for _, spread := range []float64{0.1, 5, 60} {
			x := make([]float32, v)
			for i := range x {
				x[i] = float32(spread * rng.NormFloat64())
			}
			target := rng.IntN(v)
			want := make([]float64, v)
			logSoftmax(want, x)
			got := nllOf(slices.Clone(x), target)
			if d := math.Abs(got + want[target]); d > 2e-6*(1+math.Abs(want[target])) {
				t.Errorf("vocab %d spread %g: nll %.9g, float64 %.9g", v, spread, got, -want[target])
			}
		}
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		x := []float32{1, 2, bad, 3}
		if got := nllOf(x, 0); !math.IsNaN(got) {
			t.Errorf("logit %v: nll %v, want NaN", bad, got)
		}
	}
	if got := nllOf([]float32{float32(math.Inf(-1)), 0, 1}, 2); math.Abs(got-math.Log1p(math.Exp(-1))) > 1e-6 {
		t.Errorf("a -Inf logit: nll %v, want %v", got, math.Log1p(math.Exp(-1)))
	}
}
