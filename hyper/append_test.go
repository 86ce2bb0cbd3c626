package hyper

import (
	"context"
	"errors"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// TestAppendThenStep checks that positions taken by Append are what a
// later step sees as if they had gone through Step: the next steps' outputs
// agree bit for bit, in float32 and in rotated int4.
func TestAppendThenStep(t *testing.T) {
	for _, st := range []string{"", "i4+rot"} {
		t.Run(st, func(t *testing.T) { testAppendThenStep(t, st) })
	}
}

func testAppendThenStep(t *testing.T, storage string) {
	rng := testRNG(t, 91)
	ctx := context.Background()
	a := newAttention(t, Config{Block: 6, Samples: 5, Projs: 3, Min: 20, Seed: 3})
	cfg := attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 7, Storage: storage}
	const n, steps = 45, 7
	q, k, v := ref.Normal(rng, 2*6*n*7), ref.Normal(rng, 2*2*n*7), ref.Normal(rng, 2*2*n*7)
	valid := []int{45, 31}
	stepped, err := a.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	appended, _ := a.NewDecoder(cfg)
	if err := stepped.Step(ctx, q, k, v, n, valid, make([]float32, len(q)), nil); err != nil {
		t.Fatal(err)
	}
	if err := appended.(attn.Appender).Append(ctx, k, v, n, valid); err != nil {
		t.Fatal(err)
	}
	for st := range steps {
		q1, k1, v1 := ref.Normal(rng, 2*6*7), ref.Normal(rng, 2*2*7), ref.Normal(rng, 2*2*7)
		o1, o2 := make([]float32, len(q1)), make([]float32, len(q1))
		if err := stepped.Step(ctx, q1, k1, v1, 1, nil, o1, nil); err != nil {
			t.Fatal(err)
		}
		if err := appended.Step(ctx, q1, k1, v1, 1, nil, o2, nil); err != nil {
			t.Fatal(err)
		}
		for i := range o1 {
			if o1[i] != o2[i] {
				t.Fatalf("step %d: output %d differs after Append: %v vs %v", st, i, o2[i], o1[i])
			}
		}
	}
	if appended.Len(1) != 31+steps {
		t.Errorf("Len(1) = %d, want %d", appended.Len(1), 31+steps)
	}
	full, _ := a.NewDecoder(attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 3, MaxLen: 4, Storage: storage})
	if err := full.(attn.Appender).Append(ctx, make([]float32, 15), make([]float32, 15), 5, nil); !errors.Is(err, attn.ErrFull) {
		t.Errorf("past MaxLen: %v, want ErrFull", err)
	}
}
