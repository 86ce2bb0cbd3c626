package parallel

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

func TestFor(t *testing.T) {
	for _, workers := range []int{0, 1, 3, 64} {
		for _, items := range []int{0, 1, 7, 100} {
			seen := make([]atomic.Int32, items)
			var made atomic.Int32
			err := For(context.Background(), workers, items, func() *int {
				made.Add(1)
				return new(int)
			}, func(s *int, i int) error {
				*s++
				seen[i].Add(1)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range seen {
				if seen[i].Load() != 1 {
					t.Fatalf("workers %d items %d: item %d ran %d times", workers, items, i, seen[i].Load())
				}
			}
			if m := int(made.Load()); m > max(1, min(workers, items)) || (items > 0 && m < 1) || (items == 0 && m != 0) {
				t.Errorf("workers %d items %d: %d scratches", workers, items, m)
			}
		}
	}
}

func TestForErrors(t *testing.T) {
	boom := errors.New("boom")
	err := For(context.Background(), 2, 50, None, func(_ struct{}, i int) error {
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("got %v, want boom", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err = For(ctx, 2, 5, None, func(struct{}, int) error { ran = true; return nil })
	if !errors.Is(err, context.Canceled) || ran {
		t.Errorf("cancelled: err %v, ran %v", err, ran)
	}
}

// TestForOneWorker: one worker runs the items in order in the caller.
func TestForOneWorker(t *testing.T) {
	var order []int
	err := For(context.Background(), 1, 5, None, func(_ struct{}, i int) error {
		order = append(order, i) // no lock: the caller's goroutine only
		return nil
	})
	if err != nil || len(order) != 5 {
		t.Fatalf("err %v, order %v", err, order)
	}
	for i, x := range order {
		if x != i {
			t.Fatalf("order %v", order)
		}
	}
}

// TestCancelOnce cancels a call with many workers: its error is the
// context's, said once.
func TestCancelOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var started atomic.Int32
	err := For(ctx, 8, 1000, None, func(struct{}, int) error {
		if started.Add(1) == 4 {
			cancel()
		}
		return nil
	})
	if err != context.Canceled {
		t.Errorf("err = %q, want exactly context.Canceled", err)
	}
	boom := errors.New("boom")
	err = For(context.Background(), 4, 100, None, func(struct{}, int) error { return boom })
	if err != boom {
		t.Errorf("err = %q, want boom once", err)
	}
}

// ForWorker's index names one goroutine: no two items run at once under
// the same index, and every index is below the worker count.
func TestForWorkerIndex(t *testing.T) {
	for _, workers := range []int{1, 2, 5} {
		busy := make([]atomic.Bool, workers)
		err := ForWorker(context.Background(), workers, 200, func(w, i int) error {
			if w < 0 || w >= workers {
				return errors.New("index out of range")
			}
			if busy[w].Swap(true) {
				return errors.New("two items at once on one index")
			}
			for range 100 {
				_ = i * i
			}
			busy[w].Store(false)
			return nil
		})
		if err != nil {
			t.Errorf("workers %d: %v", workers, err)
		}
	}
}
