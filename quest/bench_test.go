package quest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/ref"
)

// BenchmarkDecodeStep times one decode step of Quest with its defaults
// against one step of the exact float32 KV cache at the same length, in
// the same run (H = 32, Hkv = 8, D = 128, B = 1), and reports both and
// their ratio. Each iteration steps both decoders once.
func BenchmarkDecodeStep(b *testing.B) {
	for _, n := range []int{16384, 131072} {
		b.Run(fmt.Sprintf("len%d", n), func(b *testing.B) {
			benchDecodeStep(b, newQuest(b, Config{}), n)
		})
	}
}

func benchDecodeStep(b *testing.B, m attn.Decodable, n int) {
	cfg := attn.DecodeConfig{B: 1, H: 32, HKV: 8, D: 128}
	sparse, err := m.NewDecoder(cfg)
	if err != nil {
		b.Fatal(err)
	}
	exact, err := kvcache.NewDecoder(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	const chunk = 4096
	for at := 0; at < n; at += chunk {
		c := min(chunk, n-at)
		k, v := ref.Normal(rng, cfg.HKV*c*cfg.D), ref.Normal(rng, cfg.HKV*c*cfg.D)
		if err := sparse.(attn.Appender).Append(ctx, k, v, c, nil); err != nil {
			b.Fatal(err)
		}
		if err := exact.Append(ctx, k, v, c, nil); err != nil {
			b.Fatal(err)
		}
	}
	q, k, v := ref.Normal(rng, cfg.H*cfg.D), ref.Normal(rng, cfg.HKV*cfg.D), ref.Normal(rng, cfg.HKV*cfg.D)
	out, lse := make([]float32, cfg.H*cfg.D), make([]float32, cfg.H)
	step := func(d attn.Decoder) time.Duration {
		start := time.Now()
		if err := d.Step(ctx, q, k, v, 1, nil, out, lse); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	step(sparse) // scratch allocated outside the timing
	step(exact)
	var ts, te time.Duration
	for b.Loop() {
		ts += step(sparse)
		te += step(exact)
	}
	b.ReportMetric(float64(ts.Nanoseconds())/float64(b.N), "sparse-ns/step")
	b.ReportMetric(float64(te.Nanoseconds())/float64(b.N), "exact-ns/step")
	b.ReportMetric(float64(te)/float64(ts), "speedup")
}
