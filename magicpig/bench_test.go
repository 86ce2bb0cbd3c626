package magicpig

import (
	"fmt"
	"testing"

	"github.com/attnkit/attn/internal/decstore/dectest"
)

// BenchmarkDecodeStep times decode steps of MagicPIG with its defaults
// against steps of the exact float32 KV cache at the same length, in
// the same run (H = 32, Hkv = 8, D = 128, B = 1), its own keys and
// values stored as float32, as bfloat16, as int8 and as rotated int4, and reports
// the median step of each and their ratio (speedup; see
// dectest.BenchStep).
func BenchmarkDecodeStep(b *testing.B) {
	for _, n := range []int{16384, 131072} {
		for _, st := range []string{"f32", "bf16", "i8", "i4+rot"} {
			b.Run(fmt.Sprintf("len%d/%s", n, st), func(b *testing.B) {
				dectest.BenchStep(b, newPIG(b, Config{}), n, st)
			})
		}
	}
}
