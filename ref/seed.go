package ref

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// SeedEnv names the environment variable that fixes the seed of
// FreshRNG, so that a failed run's inputs can be drawn again.
const SeedEnv = "ATTN_TEST_SEED"

// FreshRNG returns a generator of fresh random inputs for a test, on
// stream stream, and logs its seed: run the test again with ATTN_TEST_SEED
// set to it to draw the same inputs.
func FreshRNG(t testing.TB, stream uint64) *rand.Rand {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, SeedEnv, seed)
	return rand.New(rand.NewPCG(stream, seed))
}
