package registry

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// smallSettings are settings that make every mechanism approximate (no
// fallback) at the small sizes of the tests below.
var smallSettings = map[string][]string{
	"window":     {"left=9", "right=4"},
	"strided":    {"stride=8"},
	"longformer": {"left=7", "right=3", "globals=0,33"},
	"bigbird":    {"block=8"},
	"linformer":  {"k=16"},
	"reformer":   {"min=0", "bucket=8", "hashes=2"},
	"performer":  {"min=0", "features=32"},
	"hyper":      {"min=0", "block=16", "samples=16"},
}

// TestForwardWorkers checks that every registered mechanism's Forward gives
// the same bits for 1, 2, 3 and 8 workers, causal and not, with padding,
// at sizes that split work unevenly.
func TestForwardWorkers(t *testing.T) {
	const seed = 23
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 4))
	s := attn.Shape{B: 2, H: 6, HKV: 2, N: 97, M: 97, D: 20}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for _, name := range Names() {
		m, err := New(name, smallSettings[name], 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, causal := range []bool{false, true} {
			var first []float32
			for _, w := range []int{1, 2, 3, 8} {
				out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
				o := attn.Options{Causal: causal, KVLen: []int{97, 60}, Workers: w}
				err := m.Forward(context.Background(), s, q, k, v, o, out, lse)
				if errors.Is(err, attn.ErrUnsupported) {
					break
				}
				if err != nil {
					t.Fatalf("%s causal=%v workers=%d: %v", name, causal, w, err)
				}
				// The settings above make these approximate; decode-only
				// mechanisms (quest, magicpig) prefill exactly by design.
				if why := attn.FallbackOf(m, s, o); why != "" && smallSettings[name] != nil {
					t.Fatalf("%s causal=%v: fell back (%s); the test should see the approximation", name, causal, why)
				}
				if first == nil {
					first = append(out, lse...)
					continue
				}
				if !slices.Equal(first, append(out, lse...)) {
					t.Errorf("%s causal=%v: workers %d differ from 1 worker", name, causal, w)
				}
			}
		}
	}
}
