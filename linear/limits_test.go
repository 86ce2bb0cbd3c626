package linear

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/attnkit/attn"
)

// TestHugeSizes: a state or scratch past MaxStateBytes is an error before
// anything is allocated, at sizes attn.Shape accepts (each tensor at most
// 2^40 elements), where allocating would exhaust memory or overflow.
func TestHugeSizes(t *testing.T) {
	for _, a := range []*Attention{New(Config{}), New(Config{Map: expMap{}, Chunk: MaxChunk})} {
		for _, c := range [][4]int{ // B, H, Hkv, D
			{1 << 20, 1 << 10, 1 << 10, 1 << 10},
			{1 << 30, 1, 1, 1 << 10},
			{1, 1, 1, min(1<<40, math.MaxInt)},
			{1, min(1<<40, math.MaxInt), 1, 1},
			{1 << 13, 1 << 13, 1 << 13, 1 << 14},
		} {
			st, err := a.NewState(c[0], c[1], c[2], c[3], 0)
			if !errors.Is(err, attn.ErrShape) || st != nil {
				t.Errorf("%T NewState(B=%d, H=%d, Hkv=%d, D=%d): %v", a.fm, c[0], c[1], c[2], c[3], err)
			}
		}
	}
	// Forward's scratch holds F×D prefix sums: with elu+1 (F = D) a head
	// size of 2^22 needs 2^46 bytes, though q, k and v are 16 MiB each.
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 1, D: 1 << 22}
	x := make([]float32, s.D)
	out := make([]float32, s.D)
	err := New(Config{}).Forward(context.Background(), s, x, x, x, attn.Options{}, out, nil)
	if !errors.Is(err, attn.ErrShape) {
		t.Errorf("Forward with D = 2^22: %v", err)
	}
	// Near the bound but within it: a large decoding state is fine.
	if _, err := New(Config{}).NewState(8, 32, 8, 128, 0); err != nil {
		t.Errorf("NewState(8, 32, 8, 128): %v", err)
	}
}
