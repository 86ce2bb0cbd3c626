package performer

import (
	"flag"
	"math"
	"math/rand/v2"
	"testing"
)

var seedFlag = flag.Uint64("seed", 0, "seed of the random tests' inputs (0: a fresh one, logged)")

// testSeed returns the seed of a random test's inputs, -seed or a fresh
// one, and logs it so that a failure can be rerun with -seed.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	t.Logf("seed %d (rerun with -seed=%d)", seed, seed)
	return seed
}

// firstDiff returns the first index where a and b differ in their bits, or
// -1.
func firstDiff(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}
