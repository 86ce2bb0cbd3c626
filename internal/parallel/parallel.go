// Package parallel runs numbered work items on a fixed number of
// goroutines: the one worker pool every kernel of this module uses.
package parallel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// For calls fn(scratch, i) for every i in [0, items) on workers goroutines
// (at least one), each with its own scratch made by newScratch before its
// first item. Items are handed out as ForWorker does.
func For[T any](ctx context.Context, workers, items int, newScratch func() T, fn func(T, int) error) error {
	scratch := make([]T, max(1, min(workers, items)))
	made := make([]bool, len(scratch))
	return ForWorker(ctx, workers, items, func(w, i int) error {
		if !made[w] {
			scratch[w], made[w] = newScratch(), true
		}
		return fn(scratch[w], i)
	})
}

// ForWorker calls fn(w, i) for every i in [0, items) on workers goroutines
// (at least one, at most items), w being the index in [0, workers) of the
// goroutine that runs the item: a caller can keep scratch per index that
// outlives one call (a kernel's phases). Items are handed out in increasing
// order from a shared counter, so callers that number their longest items
// first balance the load. A goroutine stops taking items once ctx ends or
// fn returns an error; ForWorker returns the distinct errors joined (ctx's
// error once, first, if it ended), or nil. With one worker the items run in
// the calling goroutine: small calls (a decode step's matrix-vector
// products) pay no goroutine start.
func ForWorker(ctx context.Context, workers, items int, fn func(w, i int) error) error {
	workers = max(1, min(workers, items))
	if workers == 1 {
		if err := ctx.Err(); err != nil || items == 0 {
			return err
		}
		for i := range items {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(0, i); err != nil {
				return err
			}
		}
		return nil
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for {
				if err := ctx.Err(); err != nil {
					errs[w] = err
					return
				}
				i := int(next.Add(1)) - 1
				if i >= items {
					return
				}
				if err := fn(w, i); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return joinOnce(ctx, errs)
}

// joinOnce joins errs, each distinct error once: when ctx has ended every
// worker stops with its error (or one wrapping it, from a nested call), and
// "context canceled" should be said once, not once a worker.
func joinOnce(ctx context.Context, errs []error) error {
	cerr := ctx.Err()
	var out []error
	if cerr != nil {
		out = append(out, cerr)
	}
	for _, err := range errs {
		if err == nil || (cerr != nil && errors.Is(err, cerr)) {
			continue
		}
		dup := false
		for _, o := range out {
			dup = dup || o == err
		}
		if !dup {
			out = append(out, err)
		}
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}

// None is the scratch of a loop that needs none.
func None() struct{} { return struct{}{} }
