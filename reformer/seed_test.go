package reformer

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// testRNG returns the generator of a test's random inputs, on its own PCG
// stream, with a fresh seed that it logs (shown when the test fails or
// with -v); REFORMER_SEED=<seed> reruns a test with that seed.
func testRNG(t testing.TB, stream uint64) *rand.Rand {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("REFORMER_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 0, 64); err != nil {
			t.Fatalf("REFORMER_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (REFORMER_SEED=%d reruns it)", seed, seed)
	return rand.New(rand.NewPCG(stream, seed))
}
