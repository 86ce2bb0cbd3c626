package model

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/model/gguf"
)

// bigModelEnv opts in to TestBigModel: "1" or "qwen0.5b" for a model of
// Qwen2.5-0.5B's shape, "llama1b" for Llama 3.2 1B's. bigCtxEnv sets the
// context (default 2048).
const (
	bigModelEnv = "ATTN_BIG_MODEL"
	bigCtxEnv   = "ATTN_BIG_CTX"
)

// bigShapes are published models' architectures, as their GGUF files
// have them.
var bigShapes = map[string]struct {
	cfg   Config
	freqs bool // rope_freqs.weight, as Llama 3.1 and later carry
}{
	"qwen0.5b": {Config{Arch: "qwen2", Dim: 896, Hidden: 4864, Layers: 24, Heads: 14, KVHeads: 2, Vocab: 151936,
		SeqLen: 32768, RopeBase: 1e6, NormEps: 1e-6, TiedOutput: true}, false},
	"llama1b": {Config{Dim: 2048, Hidden: 8192, Layers: 16, Heads: 32, KVHeads: 8, Vocab: 128256,
		SeqLen: 131072, RopeBase: 500000, TiedOutput: true}, true},
}

// q4KM is the type llama.cpp's Q4_K_M recipe gives a matrix (cols values
// a row) of layer l of layers: Q6_K for the output (the embedding when
// tied) and, in the layers use_more_bits picks, for attn_v and ffn_down;
// Q4_K elsewhere; and the recipe's fallbacks (Q5_0 for Q4_K, Q8_0 for
// Q6_K) where rows are not whole 256-value super-blocks, as in every
// 896-wide matrix of Qwen2.5-0.5B.
func q4KM(name string, l, layers, cols int, tied bool) gguf.TensorType {
	more := l < layers/8 || l >= 7*layers/8 || (l-layers/8)%3 == 2
	typ := gguf.Q4_K
	switch {
	case name == "output.weight" || tied && name == "token_embd.weight":
		typ = gguf.Q6_K
	case (strings.HasSuffix(name, "attn_v.weight") || strings.HasSuffix(name, "ffn_down.weight")) && more:
		typ = gguf.Q6_K
	}
	if cols%256 != 0 {
		typ = map[gguf.TensorType]gguf.TensorType{gguf.Q4_K: gguf.Q5_0, gguf.Q6_K: gguf.Q8_0}[typ]
	}
	return typ
}

// randomBlocks returns n values of typ as random blocks whose binary16
// scales make the values spread about sigma around 0: the quantised
// values are uniform, so their spread per unit of scale is known.
func randomBlocks(rng *rand.Rand, typ gguf.TensorType, n int, sigma float64) []byte {
	vals, size, _ := typ.BlockSize()
	raw := make([]byte, n/vals*size)
	for i := 0; i < len(raw); i += 8 {
		u := rng.Uint64()
		for j := i; j < min(i+8, len(raw)); j++ {
			raw[j] = byte(u)
			u >>= 8
		}
	}
	put := func(b []byte, x float64) {
		h := half.F32ToF16(float32(x))
		b[0], b[1] = byte(h), byte(h>>8)
	}
	for b := 0; b < len(raw); b += size {
		blk := raw[b : b+size]
		switch typ {
		case gguf.Q8_0: // d·q, q uniform in int8: spread 74
			put(blk, sigma/74)
		case gguf.Q5_0: // d·(q-16), q 5 bits: 9.2
			put(blk, sigma/9.2)
		case gguf.Q4_K: // d·sc·q - dmin·m, 6-bit sc, m and 4-bit q: 258 with dmin = 7.5d
			put(blk, sigma/258)
			put(blk[2:], 7.5*sigma/258)
		case gguf.Q6_K: // d·sc·(q-32), int8 sc, 6-bit q: 1370
			put(blk[208:], sigma/1370)
		default:
			panic(typ)
		}
	}
	return raw
}

// writeBigModel writes a GGUF file of architecture cfg with random Q4_K_M
// matrices (and F32 norms, biases and rope frequency factors) to path and
// returns the bytes of its tensors.
func writeBigModel(t *testing.T, path string, cfg Config, freqs bool, seed uint64) int64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0))
	w := &Weights{Config: cfg, Layers: make([]Layer, cfg.Layers)}
	c := cfg.WithDefaults()
	var ts []gguf.Tensor
	var size int64
	for _, tn := range w.Tensors() {
		dims := ggufDims(tn.Shape)
		n := elems(tn.Shape)
		if len(tn.Shape) == 1 {
			d := make([]float32, n)
			for i := range d {
				if strings.HasSuffix(tn.Name, ".bias") {
					d[i] = float32(0.1 * rng.NormFloat64())
				} else {
					d[i] = float32(1 + 0.1*rng.NormFloat64())
				}
			}
			ts = append(ts, gguf.Tensor{Name: tn.Name, Dims: dims, Type: gguf.F32, Data: d})
			size += int64(4 * n)
			continue
		}
		l := -1
		if rest, ok := strings.CutPrefix(tn.Name, "blk."); ok {
			l, _ = strconv.Atoi(rest[:strings.IndexByte(rest, '.')])
		}
		cols := tn.Shape[1]
		typ := q4KM(tn.Name, l, c.Layers, cols, c.TiedOutput)
		raw := randomBlocks(rng, typ, n, 1/math.Sqrt(float64(cols)))
		ts = append(ts, gguf.Tensor{Name: tn.Name, Dims: dims, Type: typ, Raw: raw})
		size += int64(len(raw))
	}
	if freqs {
		// Llama 3.1's factors: 1 for the fast frequencies, 8 for the
		// slow, a ramp between.
		h := c.HeadDim() / 2
		f := make([]float32, h)
		for i := range f {
			f[i] = float32(1 + 7*math.Min(1, math.Max(0, float64(i-h/3)/float64(h/3))))
		}
		ts = append(ts, gguf.Tensor{Name: tensorRopeFreqs, Dims: []uint64{uint64(h)}, Type: gguf.F32, Data: f})
	}
	key := func(k string) string { return archKey(c.arch(), k) }
	kv := []gguf.KV{
		{Key: keyArch, Value: c.arch()},
		{Key: "general.name", Value: "random " + c.arch()},
		{Key: "general.file_type", Value: uint32(15)}, // MOSTLY_Q4_K_M
		{Key: key(keyContext), Value: uint32(c.SeqLen)},
		{Key: key(keyDim), Value: uint32(c.Dim)},
		{Key: key(keyLayers), Value: uint32(c.Layers)},
		{Key: key(keyHidden), Value: uint32(c.Hidden)},
		{Key: key(keyHeads), Value: uint32(c.Heads)},
		{Key: key(keyKVHeads), Value: uint32(c.KVHeads)},
		{Key: key(keyEps), Value: c.NormEps},
		{Key: key(keyRopeBase), Value: c.RopeBase},
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := gguf.Write(f, kv, ts); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return size
}

// procStatus returns a field of /proc/self/status in bytes (0 if absent).
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestBigModel writes a published model's architecture with random
// Q4_K_M-shaped weights through package gguf's writer, loads it with
// Open (timed) and scores a context of random tokens with Perplexity, as
// attn ppl does, logging the load time, the peak resident memory of load
// and pass, and the prefill throughput with the share of the weight
// products. It runs only when ATTN_BIG_MODEL is set: the file is hundreds
// of megabytes and the pass takes minutes on a few cores.
func TestBigModel(t *testing.T) {
	which := os.Getenv(bigModelEnv)
	if which == "" {
		t.Skipf("set %s=qwen0.5b (or 1) or llama1b to run", bigModelEnv)
	}
	if which == "1" {
		which = "qwen0.5b"
	}
	shape, ok := bigShapes[which]
	if !ok {
		t.Fatalf("%s=%q: want qwen0.5b or llama1b", bigModelEnv, which)
	}
	ctxLen := 2048
	if s := os.Getenv(bigCtxEnv); s != "" {
		var err error
		if ctxLen, err = strconv.Atoi(s); err != nil || ctxLen < 2 {
			t.Fatalf("%s=%q", bigCtxEnv, s)
		}
	}
	path := filepath.Join(t.TempDir(), which+".gguf")
	t0 := time.Now()
	size := writeBigModel(t, path, shape.cfg, shape.freqs, 1)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %.0f MB (%.0f MB of tensors) in %v", filepath.Base(path), float64(st.Size())/1e6, float64(size)/1e6, time.Since(t0).Round(time.Millisecond))

	// The peak of what follows, not of writing the file.
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	base := procStatus("VmRSS")

	t0 = time.Now()
	w, _, err := Open(path, "")
	if err != nil {
		t.Fatal(err)
	}
	load := time.Since(t0)
	loadPeak := procStatus("VmHWM")
	params := w.Params()
	t.Logf("loaded %d parameters (%+v) in %v: %.2f bytes a weight in memory; peak resident %.2f GB (%.2f GB before)",
		params, w.Config, load.Round(time.Millisecond), float64(procStatus("VmRSS")-base)/float64(params), float64(loadPeak)/1e9, float64(base)/1e9)
	// The target is for a 0.5B model; larger ones are logged.
	if which == "qwen0.5b" && load > 10*time.Second {
		t.Errorf("load took %v, more than 10 s", load)
	}
	m, err := New(w, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(2, 0))
	tokens := randomTokens(rng, ctxLen, w.Config.Vocab)
	t0 = time.Now()
	r, err := Perplexity(context.Background(), m, tokens, PerplexityOptions{Context: ctxLen, Stride: ctxLen})
	if err != nil {
		t.Fatal(err)
	}
	pass := time.Since(t0)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c := m.Config()
	// Multiply-adds of the weight products a token: the layers' matrices
	// and the output layer (the embedding is a lookup).
	kv := c.KVDim()
	perTok := int64(c.Layers)*int64(2*c.Dim*c.Dim+2*kv*c.Dim+3*c.Dim*c.Hidden) + int64(c.Vocab*c.Dim)
	products := pass.Seconds() - r.AttnSeconds
	gflops := 2 * float64(perTok) * float64(ctxLen) / products / 1e9
	peak := simd.MeasurePeakGFlops(runtime.GOMAXPROCS(0), 500*time.Millisecond)
	t.Logf("ppl over %d tokens (%d window): %.4g in %v, %.1f tokens/s; attention %.1f s, the rest (weight products, norms, softmax of the logits) %.1f s = %.1f GFLOP/s of weight products on %d workers, %.0f%% of the FMA peak measured after the pass (%.0f GFLOP/s, kernels %s)",
		r.Tokens, r.Windows, r.PPL(), pass.Round(time.Millisecond), float64(ctxLen)/pass.Seconds(), r.AttnSeconds, products,
		gflops, runtime.GOMAXPROCS(0), 100*gflops/peak, peak, simd.Kernels())
	t.Logf("peak resident %.2f GB (VmHWM), Go heap %.2f GB of %.2f GB from the OS; logits of the window %.2f GB",
		float64(procStatus("VmHWM"))/1e9, float64(ms.HeapInuse)/1e9, float64(ms.Sys)/1e9, float64(ctxLen*c.Vocab*4)/1e9)
	if math.IsNaN(r.PPL()) || math.IsInf(r.NLL, 0) {
		t.Errorf("perplexity %v", r.PPL())
	}
}

// TestQ4KMShape checks the Q4_K_M recipe on Qwen2.5-0.5B's shape, the
// spread of the random blocks, and that a small file written the big
// test's way loads and runs.
func TestQ4KMShape(t *testing.T) {
	for _, c := range []struct {
		name    string
		l, cols int
		tied    bool
		want    gguf.TensorType
	}{
		{"token_embd.weight", -1, 896, true, gguf.Q8_0},
		{"token_embd.weight", -1, 2048, false, gguf.Q4_K},
		{"output.weight", -1, 2048, false, gguf.Q6_K},
		{"blk.0.attn_q.weight", 0, 896, true, gguf.Q5_0},
		{"blk.0.ffn_down.weight", 0, 4864, true, gguf.Q6_K},
		{"blk.4.ffn_down.weight", 4, 4864, true, gguf.Q4_K},
		{"blk.5.ffn_down.weight", 5, 4864, true, gguf.Q6_K},
		{"blk.5.attn_v.weight", 5, 896, true, gguf.Q8_0},
		{"blk.23.ffn_up.weight", 23, 896, true, gguf.Q5_0},
	} {
		if got := q4KM(c.name, c.l, 24, c.cols, c.tied); got != c.want {
			t.Errorf("%s (%d values a row): %v, want %v", c.name, c.cols, got, c.want)
		}
	}
	rng := rand.New(rand.NewPCG(3, 0))
	for _, typ := range []gguf.TensorType{gguf.Q8_0, gguf.Q5_0, gguf.Q4_K, gguf.Q6_K} {
		const n, sigma = 1 << 16, 0.05
		vals := make([]float32, n)
		if err := gguf.Decode(vals, randomBlocks(rng, typ, n, sigma), typ); err != nil {
			t.Fatal(err)
		}
		var s, ss float64
		for _, v := range vals {
			s += float64(v)
			ss += float64(v) * float64(v)
		}
		mean, sd := s/n, math.Sqrt(ss/n-(s/n)*(s/n))
		if math.Abs(mean) > sigma/2 || sd < sigma/2 || sd > 2*sigma {
			t.Errorf("%v: mean %.3g, spread %.3g, want about 0 and %g", typ, mean, sd, sigma)
		}
	}
	for _, cfg := range []Config{
		{Arch: "qwen2", Dim: 256, Hidden: 512, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 300, TiedOutput: true},
		{Dim: 320, Hidden: 256, Layers: 2, Heads: 4, KVHeads: 1, Vocab: 70},
	} {
		path := filepath.Join(t.TempDir(), "small.gguf")
		writeBigModel(t, path, cfg, cfg.Arch == "", 4)
		w, _, err := Open(path, "")
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(w, Options{Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		logits := make([]float32, 3*cfg.Vocab)
		if err := m.Forward(context.Background(), []int{1, 2, 3, 4, 5}, 2, logits); err != nil {
			t.Fatal(err)
		}
		if (w.RopeFreqs != nil) != (cfg.Arch == "") {
			t.Errorf("%s: rope frequency factors %v", cfg.arch(), w.RopeFreqs)
		}
	}
}

// TestLinearChunked checks that computing a product a block of rows of W
// at a time gives the same bits as all at once, for blocks that split
// the rows unevenly, and the product of a float64 reference.
func TestLinearChunked(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 0))
	const n, out, in = 37, 250, 29
	x, w := make([]float32, n*in), make([]float32, out*in)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	var sc scratch
	whole := make([]float32, n*out)
	if err := linearChunked(context.Background(), &sc, 3, whole, x, w, n, out, in, 1<<30); err != nil {
		t.Fatal(err)
	}
	for t0 := range n {
		for o := range out {
			var s float64
			for i := range in {
				s += float64(x[t0*in+i]) * float64(w[o*in+i])
			}
			if d := math.Abs(float64(whole[t0*out+o]) - s); d > 1e-4*(1+math.Abs(s)) {
				t.Fatalf("[%d][%d] = %v, want %v", t0, o, whole[t0*out+o], s)
			}
		}
	}
	for _, chunk := range []int{1, 96 * 48, 2 * 96 * 48} {
		got := make([]float32, n*out)
		if err := linearChunked(context.Background(), &sc, 2, got, x, w, n, out, in, chunk); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(whole[i]) {
				t.Fatalf("chunk %d: value %d is %v, all at once %v", chunk, i, got[i], whole[i])
			}
		}
	}
}

// TestGemmLoopOrders checks gemm against a float64 product on sizes no
// tile divides (k over several tileK steps, n not a multiple of
// simd.Panel), with and without accumulation, and that both loop orders
// (B's whole strip packed, or tileK rows at a time) and every worker
// count give the same bits: each element sums over k in one order.
func TestGemmLoopOrders(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 0))
	const m, n, k = 197, 141, 2*tileK + 37
	a, b := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = float32(rng.NormFloat64())
	}
	for i := range b {
		b[i] = float32(rng.NormFloat64())
	}
	c0 := make([]float32, m*n)
	for i := range c0 {
		c0[i] = float32(rng.NormFloat64())
	}
	defer func(s int) { gemmStrip = s }(gemmStrip)
	for _, acc := range []bool{false, true} {
		var first []float32
		for _, strip := range []int{0, stripFloats, 1 << 30} {
			gemmStrip = strip
			for _, workers := range []int{1, 3} {
				c := slices.Clone(c0)
				if err := gemm(context.Background(), workers, m, n, k, a, k, b, n, c, n, acc); err != nil {
					t.Fatal(err)
				}
				if first == nil {
					first = c
					for i := range m {
						for j := range n {
							var s float64
							if acc {
								s = float64(c0[i*n+j])
							}
							for p := range k {
								s += float64(a[i*k+p]) * float64(b[p*n+j])
							}
							if d := math.Abs(float64(c[i*n+j]) - s); d > 1e-4*(1+math.Abs(s)) {
								t.Fatalf("acc %v: [%d][%d] = %v, want %v", acc, i, j, c[i*n+j], s)
							}
						}
					}
					continue
				}
				for i := range c {
					if math.Float32bits(c[i]) != math.Float32bits(first[i]) {
						t.Fatalf("acc %v strip %d workers %d: value %d is %v, not %v", acc, strip, workers, i, c[i], first[i])
					}
				}
			}
		}
	}
}
