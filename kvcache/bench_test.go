package kvcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// BenchmarkAttend times one decode step (H = 32, D = 128) and reports the
// bytes of K and V read per second (scales, zeros and I4's residual
// included). i4+rot is I4 with Config.Rotate.
func BenchmarkAttend(b *testing.B) {
	const h, d = 32, 128
	for _, st := range []string{"f32", "bf16", "f16", "i8", "i4", "i4+rot"} {
		for _, hkv := range []int{8, 1} {
			for _, n := range []int{1024, 16384, 65536} {
				b.Run(fmt.Sprintf("%s/hkv%d/len%d", st, hkv, n), func(b *testing.B) {
					c := filledCache(b, st, hkv, d, n, n)
					q := benchQueries(h * d)
					out := make([]float32, h*d)
					lse := make([]float32, h)
					ctx := context.Background()
					for b.Loop() {
						if err := c.Attend(ctx, h, q, attn.Options{}, out, lse); err != nil {
							b.Fatal(err)
						}
					}
					bytes := float64(c.Bytes())
					b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkStep times Step with one position (H = 32, D = 128), a
// decoder's step: the cached part, the new position's own key, and the
// append. The cache starts at len positions and grows by one a step, and
// is filled again every 64 steps (untimed), so that the time per step does
// not depend on -benchtime.
func BenchmarkStep(b *testing.B) {
	const h, d, grow = 32, 128, 64
	for _, st := range []string{"f32", "bf16"} {
		for _, hkv := range []int{8, 1} {
			for _, n := range []int{1024, 16384} {
				b.Run(fmt.Sprintf("%s/hkv%d/len%d", st, hkv, n), func(b *testing.B) {
					q := benchQueries(h * d)
					k1, v1 := benchQueries(hkv*d), benchQueries(hkv*d)
					out := make([]float32, h*d)
					lse := make([]float32, h)
					ctx := context.Background()
					c := filledCache(b, st, hkv, d, n, n+grow)
					b.ResetTimer()
					for i := range b.N {
						if i > 0 && i%grow == 0 {
							b.StopTimer()
							c = filledCache(b, st, hkv, d, n, n+grow)
							b.StartTimer()
						}
						if err := c.Step(ctx, h, q, k1, v1, 1, attn.Options{}, out, lse); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkAttendRanges times one decode step of a sliding window (H =
// 32, D = 128, a cache of 65536 positions): the query at the last
// position attends to 4 sink keys and the last w, through AttendRanges,
// the step of package sparse's decoders. It reports the bytes of K and V
// of those rows read per second.
func BenchmarkAttendRanges(b *testing.B) {
	const h, d, n, sinks = 32, 128, 65536, 4
	for _, st := range []string{"f32", "bf16"} {
		for _, hkv := range []int{8, 1} {
			c := filledCache(b, st, hkv, d, n, n)
			q := benchQueries(h * d)
			out := make([]float32, h*d)
			lse := make([]float32, h)
			for _, w := range []int{256, 1024, 4096} {
				b.Run(fmt.Sprintf("%s/hkv%d/window%d", st, hkv, w), func(b *testing.B) {
					p := n - 1
					rs := []flash.Range{{Lo: 0, Hi: sinks, Full: true}, {Lo: p - w + 1, Hi: p + 1, Full: true}}
					ctx := context.Background()
					for b.Loop() {
						if err := c.AttendRanges(ctx, h, q, p, rs, nil, attn.Options{}, out, lse); err != nil {
							b.Fatal(err)
						}
					}
					bytes := float64(c.Bytes()) * float64(sinks+w) / n
					b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// filledCache returns a cache of storage st (see ParseStorage) for hkv
// heads of size d, with room for capacity positions, holding n positions
// of random keys and values.
func filledCache(b *testing.B, st string, hkv, d, n, capacity int) *Cache {
	b.Helper()
	dt, rot, err := ParseStorage(st)
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{B: 1, HKV: hkv, D: d, DType: dt, Rotate: rot, Capacity: capacity})
	if err != nil {
		b.Fatal(err)
	}
	kv := ref.Normal(rand.New(rand.NewPCG(1, 1)), hkv*n*d)
	if err := c.Append(kv, kv, n); err != nil {
		b.Fatal(err)
	}
	return c
}

// benchQueries returns n random values for a benchmark's queries (or new
// keys and values).
func benchQueries(n int) []float32 { return ref.Normal(rand.New(rand.NewPCG(2, 2)), n) }
