package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/simd"
)

// stories15M is the shape of llama2.c's 15M-parameter model: dim 288, 6
// layers, 6 heads, hidden 768, a vocabulary of 32000 shared with the output
// layer, context 256.
var stories15M = Config{Dim: 288, Hidden: 768, Layers: 6, Heads: 6, KVHeads: 6, Vocab: 32000, SeqLen: 256, TiedOutput: true}

var (
	benchOnce    sync.Once
	benchWeights *Weights
	benchDRAM    float64
	benchPeak    float64
)

func benchSetup(b *testing.B) *Weights {
	benchOnce.Do(func() {
		w, err := RandomWeights(stories15M, 1)
		if err != nil {
			panic(err)
		}
		benchWeights = w
		// Streaming read bandwidth of all cores over a buffer far larger
		// than the caches: what a decode step, which reads every weight
		// once, is bound by.
		benchDRAM = simd.MeasureReadGBps(256<<20, runtime.GOMAXPROCS(0))
		// FMA peak of all cores, which prefill's products are bound by.
		benchPeak = simd.MeasurePeakGFlops(runtime.GOMAXPROCS(0), 200*time.Millisecond)
	})
	return benchWeights
}

// BenchmarkDecode15M times one generated token of the 15M shape, f32
// weights, with the cache filling up to the context of 256 and starting
// over. It reports tokens/s, the weight bytes read per second and that as
// a fraction of the measured DRAM read bandwidth.
func BenchmarkDecode15M(b *testing.B) {
	w := benchSetup(b)
	for _, name := range []string{"exact", "linear"} {
		b.Run(name, func(b *testing.B) {
			o := Options{}
			if name != "exact" {
				o.Patches = []Patch{{Mechanism: name}}
			}
			m, err := New(w, o)
			if err != nil {
				b.Fatal(err)
			}
			sess, err := m.NewSession()
			if err != nil {
				b.Fatal(err)
			}
			logits := make([]float32, stories15M.Vocab)
			rng := rand.New(rand.NewPCG(1, 1))
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if sess.Len() == stories15M.SeqLen {
					sess.Reset()
				}
				if err := sess.Step(ctx, []int{rng.IntN(stories15M.Vocab)}, logits); err != nil {
					b.Fatal(err)
				}
			}
			s := b.Elapsed().Seconds()
			bytes := 4 * float64(w.Params()) * float64(b.N)
			b.ReportMetric(float64(b.N)/s, "tok/s")
			b.ReportMetric(bytes/s/1e9, "GB/s")
			b.ReportMetric(100*bytes/s/1e9/benchDRAM, "%DRAM")
			b.ReportMetric(benchDRAM, "DRAM_GB/s")
		})
	}
}

// BenchmarkPrefill15M times Forward over 256 tokens of the 15M shape: the
// exact model, the model with linear attention on every layer, and the
// exact attention calls alone (flash, the same shapes, six layers), to
// show attention's share.
func BenchmarkPrefill15M(b *testing.B) {
	w := benchSetup(b)
	const n = 256
	rng := rand.New(rand.NewPCG(2, 2))
	tokens := randomTokens(rng, n, stories15M.Vocab)
	ctx := context.Background()
	for _, name := range []string{"exact", "linear"} {
		b.Run(name, func(b *testing.B) {
			o := Options{}
			if name != "exact" {
				o.Patches = []Patch{{Mechanism: name}}
			}
			m, err := New(w, o)
			if err != nil {
				b.Fatal(err)
			}
			logits := make([]float32, stories15M.Vocab)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := m.Forward(ctx, tokens, n-1, logits); err != nil {
					b.Fatal(err)
				}
			}
			s := b.Elapsed().Seconds() / float64(b.N)
			flops := 2*float64(w.Params()-stories15M.Vocab*stories15M.Dim)*n + 2*float64(stories15M.Vocab*stories15M.Dim)
			b.ReportMetric(n/s, "tok/s")
			b.ReportMetric(flops/s/1e9, "GFLOP/s(weights)")
			b.ReportMetric(100*flops/s/1e9/benchPeak, "%peak")
		})
	}
	b.Run("flash-attention-only", func(b *testing.B) {
		m, _ := New(w, Options{})
		c := m.Config()
		s := attn.Shape{B: 1, H: c.Heads, HKV: c.KVHeads, N: n, M: n, D: c.HeadDim()}
		q := make([]float32, s.QLen())
		k, v := make([]float32, s.KVLen()), make([]float32, s.KVLen())
		for i := range q {
			q[i], k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		out := make([]float32, s.QLen())
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for range c.Layers {
				if err := m.exact.Forward(ctx, s, q, k, v, attn.Options{Causal: true}, out, nil); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(n/(b.Elapsed().Seconds()/float64(b.N)), "tok/s")
	})
}

// BenchmarkTrainStep times one training step (forward, backward, AdamW)
// of small GQA models at a 2048-token context, and reports tokens/s and
// the share of the step spent in attention.
func BenchmarkTrainStep(b *testing.B) {
	for _, c := range []Config{
		{Dim: 256, Hidden: 688, Layers: 4, Heads: 8, KVHeads: 2, Vocab: 4096, SeqLen: 2048},
		{Dim: 384, Hidden: 1024, Layers: 4, Heads: 8, KVHeads: 2, Vocab: 4096, SeqLen: 2048},
		{Dim: 256, Hidden: 688, Layers: 6, Heads: 4, KVHeads: 2, Vocab: 4096, SeqLen: 2048},
	} {
		name := fmt.Sprintf("dim=%d,layers=%d,heads=%d/%d", c.Dim, c.Layers, c.Heads, c.KVHeads)
		b.Run(name, func(b *testing.B) {
			w, err := InitWeights(c, 1)
			if err != nil {
				b.Fatal(err)
			}
			tr, err := NewTrainer(w, TrainConfig{Steps: 1000})
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 1))
			tokens := make([]int, 3*c.SeqLen)
			for i := range tokens {
				tokens[i] = rng.IntN(c.Vocab)
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := tr.Step(ctx, tr.Sample(tokens, i)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*c.SeqLen)/b.Elapsed().Seconds(), "tokens/s")
			b.ReportMetric(tr.AttentionTime().Seconds()/b.Elapsed().Seconds(), "attn-share")
		})
	}
}

// BenchmarkGenerateLong times 64 generated tokens after a 4096-token
// prompt of a model of the default model's shape (context 8192), with
// every layer exact or patched with a window of 256 keys: the per-token
// cost that a patched layer's decoder gives (ms/token, decode only).
func BenchmarkGenerateLong(b *testing.B) {
	cfg := Config{Dim: 256, Hidden: 688, Layers: 4, Heads: 8, KVHeads: 2, Vocab: 4096, SeqLen: 8192}
	w, err := RandomWeights(cfg, 2)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int, 4096)
	for i := range prompt {
		prompt[i] = rng.IntN(cfg.Vocab)
	}
	for _, spec := range []string{"exact", "window:left=256", "linear", "hyper"} {
		b.Run(spec, func(b *testing.B) {
			ps, err := ParsePatch(spec)
			if err != nil {
				b.Fatal(err)
			}
			m, err := New(w, Options{Patches: ps})
			if err != nil {
				b.Fatal(err)
			}
			smp, _ := NewSampler(0, 0, 1)
			var dec time.Duration
			for i := 0; i < b.N; i++ {
				st, err := m.Generate(context.Background(), prompt, 64, smp, -1, nil)
				if err != nil {
					b.Fatal(err)
				}
				dec += st.Decode
			}
			b.ReportMetric(dec.Seconds()*1e3/float64(64*b.N), "ms/token")
		})
	}
}

// BenchmarkProductWX times the prefill weight products on the shapes of
// a Qwen2.5-0.5B layer over 2048 positions and of its 151,936-row output
// layer over a chunk of 64 positions (2 workers), and reports their
// GFLOP/s with the FMA peak measured in the same run.
func BenchmarkProductWX(b *testing.B) {
	peak := simd.MeasurePeakGFlops(2, 300*time.Millisecond)
	for _, sh := range [][3]int{{4864, 896, 2048}, {896, 4864, 2048}, {896, 896, 2048}, {151936, 896, 64}} {
		out, in, np := sh[0], sh[1], sh[2]
		b.Run(fmt.Sprintf("out%d/in%d/np%d", out, in, np), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			w, x, c := make([]float32, out*in), make([]float32, in*np), make([]float32, out*np)
			for i := range w {
				w[i] = float32(rng.NormFloat64())
			}
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			// Once outside the timing: the first touch of c faults its pages.
			if err := productWX(context.Background(), 2, c, w, x, np, out, in); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := productWX(context.Background(), 2, c, w, x, np, out, in); err != nil {
					b.Fatal(err)
				}
			}
			gf := 2 * float64(out*in*np) * float64(b.N) / b.Elapsed().Seconds() / 1e9
			b.ReportMetric(gf, "GFLOP/s")
			b.ReportMetric(100*gf/peak, "%peak")
		})
	}
}
