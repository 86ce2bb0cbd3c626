package reformer

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// Fallback names exactly the calls Forward computes exactly: their output
// is the exact kernel's (or exact attention under the self rule), and the
// others' is not.
func TestFallbackAgreesWithForward(t *testing.T) {
	rng := testRNG(t, 50)
	exact := flash.New(flash.Config{})
	type call struct {
		s      attn.Shape
		causal bool
	}
	small := func(n, m int) attn.Shape { return attn.Shape{B: 1, H: 2, HKV: 1, N: n, M: m, D: 5} }
	for _, c := range []struct {
		cfg   Config
		calls []call
	}{
		{Config{Bucket: 2, Window: 1, Min: 60}, []call{
			{small(59, 59), false}, {small(60, 60), false}, {small(60, 59), true}, {small(1, 200), true}, {small(61, 200), true},
		}},
		{Config{Bucket: 2, Window: 1, Min: 60, ExcludeSelf: true}, []call{{small(59, 90), false}, {small(60, 90), true}, {small(90, 90), false}}},
		{Config{Bucket: 2, Window: 1, Min: -1}, []call{{small(40, 40), false}, {small(40, 40), true}}},
		{Config{Bucket: 2, Window: 1}, []call{ // the defaults
			{small(DefaultMin-1, DefaultMin), false}, {small(DefaultMin, DefaultMin), false},
			{small(DefaultMinCausal-1, DefaultMinCausal-1), true}, {small(DefaultMinCausal, DefaultMinCausal), true},
			{small(DefaultMin, DefaultMin), true},
		}},
	} {
		l := mustNew(t, c.cfg)
		for _, cl := range c.calls {
			s, o := cl.s, attn.Options{Causal: cl.causal}
			reason := l.Fallback(s, o)
			if got := attn.FallbackOf(l, s, o); got != reason {
				t.Errorf("FallbackOf %q, Fallback %q", got, reason)
			}
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			out, _ := forward(t, l, s, q, k, v, o)
			var isExact bool
			if c.cfg.ExcludeSelf {
				want, _, err := ref.Attention(s, q, k, v, ref.Spec{Mask: selfRuleMask(s, o)})
				if err != nil {
					t.Fatal(err)
				}
				isExact = ref.RelErr(out, want) < 1e-5
			} else {
				want, _ := forward(t, exact, s, q, k, v, o)
				isExact = slices.Equal(out, want)
			}
			if isExact != (reason != "") {
				t.Errorf("%+v %+v causal %v: Fallback %q but Forward exact = %v", c.cfg, s, cl.causal, reason, isExact)
			}
			if reason != "" && !strings.Contains(reason, "min = "+strconv.Itoa(l.Config().minFor(cl.causal))) {
				t.Errorf("Fallback %q does not name the threshold", reason)
			}
		}
	}
}

// Logits spread over about ±1e4 (and lse near 1e4) leave every output
// finite and still the attention of the chosen keys, on every path.
func TestLargeLogitsStayFinite(t *testing.T) {
	rng := testRNG(t, 51)
	const amp = 100 // logits amp²·N(0, 1)
	union := func(l *LSH, s attn.Shape, q, k []float32, o attn.Options) []bool { return unionMask(t, l, s, q, k, o) }
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 97, M: 97, D: 24}
	for _, c := range []struct {
		cfg    Config
		causal bool
		rule   func(*LSH, attn.Shape, []float32, []float32, attn.Options) []bool
	}{
		{Config{Hashes: 3, Bucket: 5, Min: -1}, true, causalRuleMask},
		{Config{Hashes: 3, Bucket: 5, Min: -1, ExcludeSelf: true}, true, causalRuleMask},
		{Config{Hashes: 3, Bucket: 5, Min: -1}, false, union},
		{Config{Hashes: 3, Bucket: 5, Min: -1, NonStrictCausal: true}, true, union},
		{Config{Hashes: 3, Bucket: 5, Min: 1000, ExcludeSelf: true}, true, union}, // exact under the self rule
		{Config{Hashes: 3, Bucket: 5, Min: 1000}, false, union},                   // exact kernel
	} {
		o := attn.Options{Causal: c.causal, KVLen: []int{97, 50}}
		checkMask(t, mustNew(t, c.cfg), rng, s, o, 1e-3, amp, c.rule)
	}

	// The decoder: outputs stay finite through large logits too.
	l := mustNew(t, Config{Hashes: 3, Bucket: 5, Min: -1})
	dc := attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 24}
	dec, err := l.NewDecoder(dc)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		q, k, v := ref.Normal(rng, 4*24), ref.Normal(rng, 2*24), ref.Normal(rng, 2*24)
		for i := range q {
			q[i] *= amp
		}
		for i := range k {
			k[i] *= amp
		}
		out, lse := make([]float32, len(q)), make([]float32, 4)
		if err := dec.Step(context.Background(), q, k, v, 1, nil, out, lse); err != nil {
			t.Fatal(err)
		}
		for _, x := range append(out, lse...) {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("decode step with large logits: %v", x)
			}
		}
	}
}
