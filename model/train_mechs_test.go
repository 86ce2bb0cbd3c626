package model

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn/registry"
)

// trainSpecs gives every registered mechanism with a causal backward pass
// settings under which it approximates (no fallback to exact) at the tiny
// training contexts of these tests.
func trainSpecs(t *testing.T) []string {
	t.Helper()
	settings := map[string]string{
		"window":     ":left=5",
		"strided":    ":stride=4",
		"longformer": ":left=4,globals=0",
		"bigbird":    ":block=4",
		"reformer":   ":min=0,bucket=4,hashes=2",
		"performer":  ":min=0,features=16",
		"hyper":      ":min=0,block=8,samples=8",
	}
	var specs []string
	for _, name := range registry.Names() {
		e, _ := registry.Lookup(name)
		if e.Backward && e.Causal {
			specs = append(specs, name+settings[name])
		}
	}
	return specs
}

// TestTrainEveryMechanism trains with every mechanism that has a backward
// pass: steps on one batch lower its loss, the weights are bit-identical
// for 1, 2 and 3 workers, and saving, resuming and continuing gives what
// an uninterrupted run gives.
func TestTrainEveryMechanism(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	tokens := randomSeq(rng, 500, 48)
	ctx := context.Background()
	for _, spec := range trainSpecs(t) {
		t.Run(strings.ReplaceAll(spec, ":", "/"), func(t *testing.T) {
			run := func(workers, steps int) *Trainer {
				w, err := InitWeights(trainConfig(false), 6)
				if err != nil {
					t.Fatal(err)
				}
				tr, err := NewTrainer(w, TrainConfig{Attention: spec, Context: 20, Batch: 2, Steps: 6, Warmup: 1, LR: 3e-3, Seed: 2, Workers: workers})
				if err != nil {
					t.Fatal(err)
				}
				trainRun(t, tr, tokens, steps)
				return tr
			}
			// The loss of one batch falls as the trainer steps on it.
			w, _ := InitWeights(trainConfig(false), 6)
			tr, err := NewTrainer(w, TrainConfig{Attention: spec, Context: 20, Batch: 2, Steps: 20, Warmup: 1, LR: 1e-2, Seed: 2})
			if err != nil {
				t.Fatal(err)
			}
			batch := tr.Sample(tokens, 0)
			first, err := tr.Step(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			var last StepStats
			for range 5 {
				if last, err = tr.Step(ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			if !(last.Loss < first.Loss) {
				t.Errorf("loss on one batch went from %.4f to %.4f", first.Loss, last.Loss)
			}
			// Any worker count, the same weights.
			one := run(1, 4)
			for _, workers := range []int{2, 3} {
				other := run(workers, 4)
				for i, ts := range one.Weights().Tensors() {
					if !slices.Equal(*ts.Data, *other.Weights().Tensors()[i].Data) {
						t.Fatalf("%d workers: %s differs from 1 worker's", workers, ts.Name)
					}
				}
			}
			// Save at step 2, resume, continue to 4: as uninterrupted.
			part := run(2, 2)
			var buf bytes.Buffer
			if err := part.Save(&buf, nil, "test"); err != nil {
				t.Fatal(err)
			}
			res, _, err := Resume(bytes.NewReader(buf.Bytes()), int64(buf.Len()), 1)
			if err != nil {
				t.Fatal(err)
			}
			trainRun(t, res, tokens, 4)
			for i, ts := range one.Weights().Tensors() {
				if !slices.Equal(*ts.Data, *res.Weights().Tensors()[i].Data) {
					t.Fatalf("resumed run: %s differs from the uninterrupted one", ts.Name)
				}
			}
			// The trained model runs with its attention, and decodes.
			m, err := New(one.Weights(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.NewSession(); err != nil {
				t.Fatalf("the trained model's session: %v", err)
			}
		})
	}
}
