package registry

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Sweep is one budget curve of `attn accuracy` (and of `attn bench`'s
// report): the mechanism run with each parameter of Params set to each of
// Values in turn, and Fixed held.
type Sweep struct {
	// Params move together: a window's left and right.
	Params []string
	Values []int
	// Fixed settings hold for every point; "min=0" stops the mechanisms
	// that fall back to exact attention on short inputs from doing so, so
	// that the curve shows the approximation at every length.
	Fixed []string
	// Unit says what Values count.
	Unit string
}

// Settings returns the `name=value` settings of the point with value v.
func (s Sweep) Settings(v int) []string {
	out := append([]string(nil), s.Fixed...)
	for _, p := range s.Params {
		out = append(out, fmt.Sprintf("%s=%d", p, v))
	}
	return out
}

func pow2(lo, hi int) []int {
	var v []int
	for x := lo; x <= hi; x *= 2 {
		v = append(v, x)
	}
	return v
}

// Budget is what a mechanism runs with in `attn patching` for windows of
// one length.
type Budget struct {
	Settings []string // name=value, as for New
	Rule     string   // how Settings follow from the window length n
	// Keys estimates the keys a query sees, averaged over the n causal
	// queries (for performer, its features); 0 where not estimated.
	Keys float64
}

// Budget returns the entry's `attn patching` budget for windows of n
// tokens, the shortest of which has shortest tokens: Scaled's, or the
// defaults when the entry has no rule.
func (e Entry) Budget(n, shortest int) Budget {
	if e.Scaled == nil {
		return Budget{Rule: "the registry's defaults"}
	}
	return e.Scaled(n, shortest)
}

// The Scaled rules below aim at about n/8 keys per query, averaged over
// the causal queries (exact attention averages (n+1)/2), so that `attn
// patching` compares the mechanisms at one budget rather than at their
// packages' defaults, which were chosen for other lengths. min=0
// throughout: the fallbacks to exact attention below 2048 or 4096 tokens
// would otherwise hide the approximation at the lengths small models run
// at.

var itoa = strconv.Itoa

func windowBudget(n, _ int) Budget {
	k := max(1, n/8)
	// right has no effect under the causal mask; 0 says so.
	return Budget{[]string{"left=" + itoa(k), "right=0"}, "left = n/8", float64(k)}
}

func stridedBudget(n, _ int) Budget {
	// The Sparse Transformer's l ≈ √n: the previous l keys and every
	// l-th, l + n/(2l) on average, fewer than n/8 beyond n = 256; a
	// larger l would make it a sliding window.
	l := max(1, int(math.Round(math.Sqrt(float64(n)))))
	return Budget{[]string{"stride=" + itoa(l)}, "stride = √n (Sparse Transformer): previous √n keys and every √n-th",
		float64(l) + float64(n)/float64(2*l)}
}

func longformerBudget(n, shortest int) Budget {
	// A pretrained LM's global tokens are its first ones (attention
	// sinks, where heads park attention they do not need): the window
	// gives up as many keys as there are globals. Globals must lie
	// inside every window, hence shortest.
	k := max(1, n/8)
	g := max(1, min(4, shortest))
	gs := make([]string, g)
	for i := range gs {
		gs[i] = itoa(i)
	}
	left := max(1, k-g)
	return Budget{[]string{"left=" + itoa(left), "right=0", "globals=" + strings.Join(gs, ",")},
		fmt.Sprintf("left = n/8 − %d, globals = the first %d positions (attention sinks)", g, g), float64(left + g)}
}

func bigbirdBudget(n, _ int) Budget {
	// Causal, the window of 3 blocks leaves the previous block and on
	// average half the query's own; one global block (the sinks again);
	// random blocks fill the budget up to n/8.
	k := max(1, n/8)
	b := min(64, max(1, n/32))
	r := max(1, k/b-3)
	return Budget{[]string{"block=" + itoa(b), "window=3", "globals=1", "random=" + itoa(r)},
		"block = min(64, n/32), window 3 blocks, 1 global block, random = n/(8·block) − 3 blocks", (2.5 + float64(r)) * float64(b)}
}

func reformerBudget(n, _ int) Budget {
	// Causal, a query sees the window's latest keys and, in each round,
	// up to 2·bucket latest keys of its bucket: 2·2·n/48 + n/24 = n/8.
	b, w := max(1, n/48), max(1, n/24)
	return Budget{[]string{"hashes=2", "bucket=" + itoa(b), "window=" + itoa(w), "min=0"}, "2 hashes, bucket = n/48, window = n/24", float64(4*b + w)}
}

func performerBudget(n, _ int) Budget {
	k := max(1, n/8)
	return Budget{[]string{"features=" + itoa(k), "min=0"}, "features = n/8 (a rank, not keys)", float64(k)}
}

func hyperBudget(n, _ int) Budget {
	// Causal, the recursion halves the square until a half fits in a
	// block; a query meets on average half of the levels' rectangles
	// (block+samples keys each) and half of its exact leaf: with block =
	// samples = n/32, 4 levels and leaves of n/16, 5n/32.
	b := max(1, n/32)
	levels, leaf := 0, n
	for (leaf+1)/2 > b {
		levels++
		leaf = (leaf + 1) / 2
	}
	return Budget{[]string{"block=" + itoa(b), "samples=" + itoa(b), "min=0"},
		"block = samples = n/32 (plus the causal recursion's levels)", float64(levels)*float64(b) + float64(leaf)/2}
}
