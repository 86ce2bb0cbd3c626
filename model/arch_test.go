package model

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/ref"
)

// archCases are tiny models of every architecture and feature ReadGGUF
// maps: odd head sizes (6, 10), grouped queries, tied and separate
// outputs, Llama 3.1's frequency factors with linear scaling, Mistral's
// sliding window (shorter than the sequences), Qwen2's biases and NeoX
// rotary. freqs asks for random rope frequency factors.
var archCases = []struct {
	name  string
	cfg   Config
	freqs bool
}{
	{"llama", Config{Dim: 18, Hidden: 29, Layers: 2, Heads: 3, KVHeads: 1, Vocab: 37, SeqLen: 64}, false},
	{"llama3.1", Config{Arch: "llama", Dim: 40, Hidden: 27, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 41, RopeBase: 500000, RopeScale: 2.5, TiedOutput: true}, true},
	{"llama bias", Config{Dim: 24, Hidden: 19, Layers: 1, Heads: 4, KVHeads: 2, Vocab: 29, QKVBias: true}, false},
	{"mistral", Config{Arch: "mistral", Dim: 24, Hidden: 31, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 33, SlidingWindow: 5, NormEps: 1e-6}, false},
	{"qwen2", Config{Arch: "qwen2", Dim: 36, Hidden: 23, Layers: 2, Heads: 6, KVHeads: 2, Vocab: 43, RopeBase: 1e6, NormEps: 1e-6, TiedOutput: true}, false},
	{"qwen2 window freqs", Config{Arch: "qwen2", Dim: 30, Hidden: 17, Layers: 2, Heads: 3, KVHeads: 3, Vocab: 31, SlidingWindow: 4, RopeScale: 0.75}, true},
}

// archRef is the model computed directly in float64 from c (taken as
// given, defaults already applied, so that a test can switch one feature
// off): embedding; per layer RMSNorm, Q/K/V (+ bias), the rotary
// embedding (pairs 2i, 2i+1 or i, i+d/2; frequency base^(-2i/d) /
// freqs[i] / scale), causal softmax attention with grouped heads (within
// the sliding window), output projection and residual, RMSNorm, SwiGLU
// MLP and residual; final RMSNorm and logits, [n][Vocab].
func archRef(w *Weights, c Config, freqs []float32, tokens []int) [][]float64 {
	n, d, hd := len(tokens), c.Dim, c.Dim/c.Heads
	kvd := c.KVHeads * hd
	matvec := func(w []float32, x []float64, out int) []float64 {
		y := make([]float64, out)
		for o := range y {
			for i, xi := range x {
				y[o] += float64(w[o*len(x)+i]) * xi
			}
		}
		return y
	}
	addBias := func(y []float64, b []float32) {
		if c.QKVBias {
			for i := range y {
				y[i] += float64(b[i])
			}
		}
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
	scale := 1.0
	if c.RopeScale != 0 {
		scale = float64(c.RopeScale)
	}
	rot := func(v []float64, pos int) {
		for h := 0; h < len(v); h += hd {
			for i := range hd / 2 {
				f := math.Pow(float64(c.RopeBase), -float64(2*i)/float64(hd)) / scale
				if freqs != nil {
					f /= float64(freqs[i])
				}
				th := float64(pos) * f
				ia, ib := h+2*i, h+2*i+1
				if c.RopeNeoX {
					ia, ib = h+i, h+i+hd/2
				}
				a, b := v[ia], v[ib]
				v[ia] = a*math.Cos(th) - b*math.Sin(th)
				v[ib] = a*math.Sin(th) + b*math.Cos(th)
			}
		}
	}
	x := make([][]float64, n)
	for t, tok := range tokens {
		x[t] = make([]float64, d)
		for i := range d {
			x[t][i] = float64(w.Embed[tok*d+i])
		}
	}
	for _, L := range w.Layers {
		q, k, v := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for t := range n {
			xn := norm(x[t], L.AttnNorm)
			q[t], k[t], v[t] = matvec(L.Wq, xn, d), matvec(L.Wk, xn, kvd), matvec(L.Wv, xn, kvd)
			addBias(q[t], L.Bq)
			addBias(k[t], L.Bk)
			addBias(v[t], L.Bv)
			rot(q[t], t)
			rot(k[t], t)
		}
		for t := range n {
			lo := 0
			if c.SlidingWindow > 0 {
				lo = max(0, t-c.SlidingWindow+1)
			}
			o := make([]float64, d)
			for h := range c.Heads {
				kh := h / (c.Heads / c.KVHeads)
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for j := lo; j <= t; j++ {
					for i := range hd {
						s[j] += q[t][h*hd+i] * k[j][kh*hd+i]
					}
					s[j] /= math.Sqrt(float64(hd))
					mx = math.Max(mx, s[j])
				}
				var sum float64
				for j := lo; j <= t; j++ {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				for j := lo; j <= t; j++ {
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
	out := w.Output
	if c.TiedOutput {
		out = w.Embed
	}
	logits := make([][]float64, n)
	for t := range n {
		logits[t] = matvec(out, norm(x[t], w.Norm), c.Vocab)
	}
	return logits
}

// archWeights returns random weights of case cfg (with frequency factors
// in [1, 8) when freqs) written as an F32 GGUF file and read back.
func archWeights(t *testing.T, rng *rand.Rand, cfg Config, freqs bool) (*Weights, []byte) {
	t.Helper()
	w, err := RandomWeights(cfg, rng.Uint64())
	if err != nil {
		t.Fatal(err)
	}
	if freqs {
		w.RopeFreqs = make([]float32, cfg.HeadDim()/2)
		for i := range w.RopeFreqs {
			w.RopeFreqs[i] = float32(1 + 7*rng.Float64())
		}
	}
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, w, nil, gguf.F32, "arch"); err != nil {
		t.Fatal(err)
	}
	back, tok, err := ReadGGUF(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	want := *w
	want.Config = cfg.WithDefaults()
	if cfg.Arch == "llama" {
		want.Config.Arch = ""
	}
	if tok != nil || !reflect.DeepEqual(back, &want) {
		t.Fatalf("read back as %+v, want %+v", back.Config, want.Config)
	}
	return back, buf.Bytes()
}

// TestArchForward checks every architecture's Forward, on a model read
// back from its GGUF file, against archRef, at lengths on both sides of
// the dot-product path (gemmMin) and past the sliding windows; and that
// the reference with the case's feature switched off is far from it, so
// the feature is exercised.
func TestArchForward(t *testing.T) {
	rng := ref.FreshRNG(t, 21)
	for _, ac := range archCases {
		w, _ := archWeights(t, rng, ac.cfg, ac.freqs)
		c := w.Config.WithDefaults()
		m, err := New(w, Options{Workers: 3})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{3, 23} {
			tokens := randomTokens(rng, n, c.Vocab)
			logits := make([]float32, n*c.Vocab)
			if err := m.Forward(context.Background(), tokens, 0, logits); err != nil {
				t.Fatal(err)
			}
			if e := logitErr(logits, archRef(w, c, w.RopeFreqs, tokens)); e > 2e-5 {
				t.Errorf("%s, n = %d: error %.3g against the float64 reference", ac.name, n, e)
			}
			if n < 8 {
				continue
			}
			// Each feature off in the reference must be seen.
			type ablation struct {
				what  string
				c     Config
				freqs []float32
			}
			var abl []ablation
			off := c
			off.RopeNeoX = !c.RopeNeoX
			abl = append(abl, ablation{"rotary style", off, w.RopeFreqs})
			if w.RopeFreqs != nil {
				abl = append(abl, ablation{"frequency factors", c, nil})
			}
			if c.RopeScale != 0 {
				off := c
				off.RopeScale = 0
				abl = append(abl, ablation{"rope scale", off, w.RopeFreqs})
			}
			if c.QKVBias {
				off := c
				off.QKVBias = false
				abl = append(abl, ablation{"biases", off, w.RopeFreqs})
			}
			if c.SlidingWindow > 0 {
				off := c
				off.SlidingWindow = 0
				abl = append(abl, ablation{"sliding window", off, w.RopeFreqs})
			}
			for _, a := range abl {
				if e := logitErr(logits, archRef(w, a.c, a.freqs, tokens)); e < 1e-3 {
					t.Errorf("%s: without its %s the reference is as close (%.3g)", ac.name, a.what, e)
				}
			}
		}
	}
}

// TestArchSession checks that a session decoding every architecture (a
// prompt chunk, then one token a step) gives Forward's logits at each
// step: the sliding window through the window mechanism's decoder.
func TestArchSession(t *testing.T) {
	rng := ref.FreshRNG(t, 22)
	for _, ac := range archCases {
		w, _ := archWeights(t, rng, ac.cfg, ac.freqs)
		c := w.Config.WithDefaults()
		m, err := New(w, Options{Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		if c.SlidingWindow > 0 && m.Attention(0) != "window:left="+strconv.Itoa(c.SlidingWindow-1) {
			t.Errorf("%s: layer 0 runs %q", ac.name, m.Attention(0))
		}
		const n, prompt = 19, 7
		tokens := randomTokens(rng, n, c.Vocab)
		all := make([]float32, n*c.Vocab)
		if err := m.Forward(context.Background(), tokens, 0, all); err != nil {
			t.Fatal(err)
		}
		s, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, c.Vocab)
		for p := prompt; p <= n; p++ {
			step := tokens[p-1 : p]
			if p == prompt {
				step = tokens[:prompt]
			}
			if err := s.Step(context.Background(), step, got); err != nil {
				t.Fatal(err)
			}
			want := all[(p-1)*c.Vocab:][:c.Vocab]
			var diff, scale float64 = 0, 1
			for i := range got {
				diff = math.Max(diff, math.Abs(float64(got[i]-want[i])))
				scale = math.Max(scale, math.Abs(float64(want[i])))
			}
			if diff/scale > 1e-5 {
				t.Errorf("%s: position %d: session logits differ from Forward's by %.3g", ac.name, p-1, diff/scale)
			}
		}
	}
}

// TestArchMetadata checks the keys each architecture's file carries, that
// llama files stay as they were (no new keys), and the metadata forms
// llama.cpp also reads: the older rope.scale_linear, scaling "none".
func TestArchMetadata(t *testing.T) {
	rng := ref.FreshRNG(t, 23)
	keys := func(data []byte) map[string]any {
		f, err := gguf.Read(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any{}
		for _, kv := range f.KV {
			m[kv.Key] = kv.Value
		}
		return m
	}
	for _, ac := range archCases {
		_, data := archWeights(t, rng, ac.cfg, ac.freqs)
		kv := keys(data)
		arch := ac.cfg.arch()
		if kv[keyArch] != arch || kv[arch+".embedding_length"] != uint32(ac.cfg.Dim) {
			t.Errorf("%s: architecture %v, %s.embedding_length %v", ac.name, kv[keyArch], arch, kv[arch+".embedding_length"])
		}
		if got, ok := kv[arch+".attention.sliding_window"]; ac.cfg.SlidingWindow > 0 && got != uint32(ac.cfg.SlidingWindow) || ac.cfg.SlidingWindow == 0 && ok {
			t.Errorf("%s: sliding window key %v", ac.name, got)
		}
		if got, ok := kv[arch+".rope.scaling.factor"]; ac.cfg.RopeScale != 0 && got != ac.cfg.RopeScale || ac.cfg.RopeScale == 0 && ok {
			t.Errorf("%s: rope scaling factor key %v", ac.name, got)
		}
	}
	// A plain llama file has exactly the keys it had before architectures.
	w, _ := RandomWeights(archCases[0].cfg, 1)
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, w, nil, gguf.F32, "plain"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range keys(buf.Bytes()) {
		got = append(got, k)
	}
	slices.Sort(got)
	want := []string{"general.architecture", "general.name", "llama.attention.head_count", "llama.attention.head_count_kv",
		"llama.attention.layer_norm_rms_epsilon", "llama.block_count", "llama.context_length", "llama.embedding_length",
		"llama.feed_forward_length", "llama.rope.dimension_count", "llama.rope.freq_base", "llama.vocab_size"}
	if !slices.Equal(got, want) {
		t.Errorf("plain llama keys %v, want %v", got, want)
	}
	// Linear scaling by the older key, or none.
	for _, c := range []struct {
		kv    []gguf.KV
		scale float32
	}{
		{[]gguf.KV{{Key: "llama.rope.scale_linear", Value: float32(4)}}, 4},
		{[]gguf.KV{{Key: "llama.rope.scaling.factor", Value: float32(8)}}, 8},
		{[]gguf.KV{{Key: "llama.rope.scaling.type", Value: "linear"}, {Key: "llama.rope.scaling.factor", Value: float32(2)}}, 2},
		{[]gguf.KV{{Key: "llama.rope.scaling.type", Value: "none"}, {Key: "llama.rope.scaling.factor", Value: float32(2)}}, 0},
		{[]gguf.KV{{Key: "llama.rope.scaling.factor", Value: float32(1)}}, 0},
	} {
		buf.Reset()
		if err := writeGGUF(&buf, w, nil, gguf.F32, "scaled", c.kv, nil); err != nil {
			t.Fatal(err)
		}
		back, _, err := ReadGGUF(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil {
			t.Fatal(err)
		}
		if back.Config.RopeScale != c.scale {
			t.Errorf("%v: RopeScale %v, want %v", c.kv, back.Config.RopeScale, c.scale)
		}
	}
}

// TestArchErrors checks that files and configs the architectures do not
// allow are errors naming what is wrong or missing.
func TestArchErrors(t *testing.T) {
	rng := ref.FreshRNG(t, 24)
	edit := func(data []byte, fn func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor)) []byte {
		f, err := gguf.Read(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		var ts []gguf.Tensor
		for _, ti := range f.Tensors {
			d, _ := f.ReadTensor(ti.Name)
			ts = append(ts, gguf.Tensor{Name: ti.Name, Dims: ti.Dims, Type: ti.Type, Data: d})
		}
		kv, ts := fn(slices.Clone(f.KV), ts)
		var buf bytes.Buffer
		if err := gguf.Write(&buf, kv, ts); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	setKey := func(key string, v any) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			for i := range kv {
				if kv[i].Key == key {
					kv[i].Value = v
					return kv, ts
				}
			}
			return append(kv, gguf.KV{Key: key, Value: v}), ts
		}
	}
	drop := func(name string) func([]gguf.KV, []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
		return func(kv []gguf.KV, ts []gguf.Tensor) ([]gguf.KV, []gguf.Tensor) {
			return kv, slices.DeleteFunc(ts, func(t gguf.Tensor) bool { return t.Name == name })
		}
	}
	_, llama := archWeights(t, rng, archCases[0].cfg, false)
	_, qwen := archWeights(t, rng, archCases[4].cfg, false)
	_, biased := archWeights(t, rng, archCases[2].cfg, false)
	for _, c := range []struct {
		name string
		data []byte
		want error
		says string
	}{
		{"unknown architecture", edit(llama, setKey(keyArch, "gemma3")), attn.ErrUnsupported, `"gemma3" (this package runs llama, mistral, qwen2)`},
		{"qwen2 without biases", edit(qwen, drop("blk.1.attn_k.bias")), ErrFormat, "no tensor blk.1.attn_k.bias"},
		{"qwen2 keys", edit(qwen, setKey(keyArch, "llama")), gguf.ErrFormat, "llama.embedding_length"},
		{"llama half of the biases", edit(biased, drop("blk.0.attn_v.bias")), ErrFormat, "no tensor blk.0.attn_v.bias"},
		{"missing output norm", edit(llama, drop("output_norm.weight")), ErrFormat, "no tensor output_norm.weight"},
		{"yarn", edit(llama, setKey("llama.rope.scaling.type", "yarn")), attn.ErrUnsupported, `rope scaling "yarn"`},
		{"key length", edit(qwen, setKey("qwen2.attention.key_length", uint32(8))), attn.ErrUnsupported, "qwen2.attention.key_length = 8"},
		{"window type", edit(llama, setKey("llama.attention.sliding_window", "wide")), gguf.ErrFormat, "sliding_window"},
		{"window and attention", edit(edit(llama, setKey("llama.attention.sliding_window", uint32(4))), setKey(keyAttention, "linear")), ErrFormat, "sliding window"},
	} {
		_, _, err := ReadGGUF(bytes.NewReader(c.data), int64(len(c.data)))
		if !errors.Is(err, c.want) || !strings.Contains(fmtErr(err), c.says) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.want, c.says)
		}
	}
	for _, c := range []struct {
		cfg  Config
		says string
	}{
		{Config{Arch: "gpt2", Dim: 8, Hidden: 8, Layers: 1, Heads: 2, Vocab: 4}, `architecture "gpt2"`},
		{Config{Dim: 8, Hidden: 8, Layers: 1, Heads: 2, Vocab: 4, RopeNeoX: true}, "NeoX"},
		{Config{Dim: 8, Hidden: 8, Layers: 1, Heads: 2, Vocab: 4, RopeScale: -1}, "RopeScale"},
		{Config{Dim: 8, Hidden: 8, Layers: 1, Heads: 2, Vocab: 4, SlidingWindow: -1}, "SlidingWindow"},
		{Config{Dim: 8, Hidden: 8, Layers: 1, Heads: 2, Vocab: 4, SlidingWindow: 3, Attention: "linear"}, "sliding window"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.says)
		}
	}
	w, _ := RandomWeights(archCases[0].cfg, 1)
	w.Layers[0].Bq = make([]float32, w.Config.Dim)
	if err := w.Validate(); !errors.Is(err, ErrFormat) {
		t.Errorf("biases without QKVBias: %v", err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestPlainLlama checks the account of what the backward pass does not
// differentiate.
func TestPlainLlama(t *testing.T) {
	rng := ref.FreshRNG(t, 25)
	for i, ac := range archCases {
		w, _ := archWeights(t, rng, ac.cfg, ac.freqs)
		err := w.plainLlama()
		if (i == 0) != (err == nil) || err != nil && !errors.Is(err, attn.ErrUnsupported) {
			t.Errorf("%s: %v", ac.name, err)
		}
	}
}

// TestAustenUnchanged checks that the embedded model still loads as the
// plain llama architecture it is and writes back to the same metadata.
func TestAustenUnchanged(t *testing.T) {
	data, err := os.ReadFile("austen/austen.gguf")
	if err != nil {
		t.Skip(err)
	}
	w, tok, err := ReadGGUF(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	c := w.Config
	if c.Arch != "" || c.RopeNeoX || c.QKVBias || c.RopeScale != 0 || c.SlidingWindow != 0 || w.RopeFreqs != nil || tok == nil {
		t.Fatalf("austen reads as %+v", c)
	}
	if err := w.plainLlama(); err != nil {
		t.Error(err)
	}
}

// TestNonFinite checks the exponent test of Weights.Validate on the edges
// of the finite float32 values.
func TestNonFinite(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, c := range []struct {
		x    float32
		want bool
	}{
		{0, false}, {float32(math.Copysign(0, -1)), false}, {math.MaxFloat32, false}, {-math.MaxFloat32, false},
		{math.SmallestNonzeroFloat32, false}, {1, false}, {inf, true}, {-inf, true}, {float32(math.NaN()), true},
		{math.Float32frombits(0xffffffff), true}, {math.Float32frombits(0x7f800001), true},
	} {
		d := []float32{1, 2, c.x, 3}
		if got := nonFinite(d); (got == 2) != c.want || !c.want && got != -1 {
			t.Errorf("%v (%#x): nonFinite = %d", c.x, math.Float32bits(c.x), got)
		}
	}
	// A tensor scanned in stretches on several CPUs: the first bad value
	// is found wherever the stretches end.
	big := make([]float32, 3<<20+7)
	if got := nonFinite(big); got != -1 {
		t.Errorf("finite tensor: nonFinite = %d", got)
	}
	big[len(big)-1] = inf
	big[2<<20+5] = float32(math.NaN())
	if got := nonFinite(big); got != 2<<20+5 {
		t.Errorf("nonFinite = %d, want %d", got, 2<<20+5)
	}
	big[1<<20-1] = -inf
	if got := nonFinite(big); got != 1<<20-1 {
		t.Errorf("nonFinite = %d, want %d", got, 1<<20-1)
	}
}
