package simd

import (
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/attnkit/attn/internal/hugepage"
)

// The probes time many short chunks of work and take the median chunk's
// rate. A chunk lasts 10–100 µs, far less than a scheduler time slice,
// so the chunks that a preemption or an interrupt lands in are a few
// outliers: on a machine busy with other processes the probes still
// measure the hardware, where a rate over the whole run would measure
// the share of it the process got.

// MeasurePeakGFlops runs FMAPeak on workers goroutines at once, each
// locked to its own OS thread, for about dur, and returns the sum of
// their rates in GFLOP/s. With workers = 1 it is the single-core
// floating-point peak that kernel efficiencies are quoted against; with
// one worker per core it shows whether cores (or SMT siblings, or vCPUs
// of a VM) share FMA units. workers < 1 counts as 1.
func MeasurePeakGFlops(workers int, dur time.Duration) float64 {
	const iters = 1 << 12 // a chunk: about 8 µs at 100 GFLOP/s
	rate := runChunks(workers, dur, 3, func(int) int64 {
		active.fmaPeak(iters)
		return iters * PeakFlopsPerIter
	})
	return rate / 1e9
}

// MeasureReadGBps returns the streaming read bandwidth in GB/s (1e9
// bytes a second) of workers goroutines, each locked to an OS thread,
// reading a buffer of bufBytes together: each reads its own contiguous
// part again and again, at least twice and for about 0.2 s. Buffers that
// fit in a core's caches measure the caches, larger ones DRAM. workers <
// 1 counts as 1; bufBytes is rounded up to 256 bytes a worker.
func MeasureReadGBps(bufBytes int, workers int) float64 {
	workers = max(workers, 1)
	per := max((bufBytes+4*workers-1)/(4*workers), 1)
	per = (per + 63) &^ 63 // whole 256-byte blocks
	buf := make([]float32, per*workers)
	// On huge pages where the system allows, as the KV cache is: the
	// probe is the best streaming read this machine does.
	hugepage.Advise(buf)
	for i := range buf {
		buf[i] = 1 // touch every page before timing
	}
	// A chunk reads 256 KiB: a slice of the part, or the whole part
	// several times over when it is smaller.
	const chunkFloats = 64 << 10
	block := min(per, chunkFloats)
	repeat := max(1, chunkFloats/per)
	offs := make([]int, workers)
	chunksPerPass := (per + block - 1) / block
	rate := runChunks(workers, 200*time.Millisecond, 2*chunksPerPass, func(w int) int64 {
		part := buf[w*per:][:per]
		b := part[offs[w]:min(offs[w]+block, per)]
		for range repeat {
			active.readSum(b)
		}
		offs[w] += len(b)
		if offs[w] == per {
			offs[w] = 0
		}
		return int64(len(b)) * 4 * int64(repeat)
	})
	return rate / 1e9
}

// runChunks starts workers goroutines, each locked to an OS thread, and
// has each call chunk (with its worker number) for about dur and at
// least minChunks times, after one untimed call to warm up, all released
// together. It returns the sum over the workers of the units chunk
// reports per call divided by the median time of one call.
func runChunks(workers int, dur time.Duration, minChunks int, chunk func(w int) int64) float64 {
	workers = max(workers, 1)
	var ready, done sync.WaitGroup
	ready.Add(workers)
	done.Add(workers)
	release := make(chan struct{})
	rates := make([]float64, workers)
	for w := range workers {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			defer done.Done()
			chunk(w)
			ready.Done()
			<-release
			var rs []float64
			start := time.Now()
			for len(rs) < max(minChunks, 1) || time.Since(start) < dur {
				t0 := time.Now()
				units := chunk(w)
				if d := time.Since(t0); d > 0 {
					rs = append(rs, float64(units)/d.Seconds())
				}
			}
			slices.Sort(rs)
			rates[w] = rs[len(rs)/2]
		}()
	}
	ready.Wait()
	close(release)
	done.Wait()
	var total float64
	for _, r := range rates {
		total += r
	}
	return total
}
