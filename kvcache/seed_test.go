package kvcache

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// freshRNG returns a generator of fresh inputs for a test, on stream
// stream, and logs its seed so that a failure can be reproduced: run the
// test again with ATTN_TEST_SEED set to it.
func freshRNG(t testing.TB, stream uint64) *rand.Rand {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("ATTN_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ATTN_TEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with ATTN_TEST_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(stream, seed))
}
