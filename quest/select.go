package quest

import (
	"math"
	"slices"
)

// pick marks in mark the k largest of scores (k < len(scores)), ties to
// the lower index, NaN counted as +Inf. work is scratch of len(scores).
// It takes expected linear time: a step scores every page of the cache,
// and sorting them would cost more than reading their summaries.
func pick(scores []float32, k int, work []float32, mark []bool) {
	if k <= 0 {
		return
	}
	copy(work, scores)
	for i, x := range work {
		work[i] = nanInf(x)
	}
	thr := kthLargest(work, k)
	above := 0
	for _, x := range scores {
		if nanInf(x) > thr {
			above++
		}
	}
	tied := k - above
	for j, x := range scores {
		switch x = nanInf(x); {
		case x > thr:
			mark[j] = true
		case x == thr && tied > 0:
			mark[j] = true
			tied--
		}
	}
}

func nanInf(x float32) float32 {
	if x != x {
		return float32(math.Inf(1))
	}
	return x
}

// kthLargest returns the k-th largest element of a (1 <= k <= len(a),
// no NaN), reordering a: quickselect with a median-of-three pivot and a
// three-way partition, so that runs of equal scores (pages of identical
// keys) cost no more than distinct ones, and a sort once the range is
// small or the partitions keep coming out lopsided.
func kthLargest(a []float32, k int) float32 {
	lo, hi, target := 0, len(a), k-1 // a[lo:hi] holds the target rank
	for round := 0; ; round++ {
		if hi-lo <= 16 || round > 64 {
			s := a[lo:hi]
			slices.SortFunc(s, func(x, y float32) int {
				switch {
				case x > y:
					return -1
				case x < y:
					return 1
				}
				return 0
			})
			return a[target]
		}
		x, y, z := a[lo], a[lo+(hi-lo)/2], a[hi-1]
		pivot := max(min(x, y), min(max(x, y), z))
		// Descending three-way partition: a[lo:lt] > pivot,
		// a[lt:i] == pivot, a[gt:hi] < pivot.
		lt, i, gt := lo, lo, hi
		for i < gt {
			switch v := a[i]; {
			case v > pivot:
				a[lt], a[i] = a[i], a[lt]
				lt++
				i++
			case v < pivot:
				gt--
				a[gt], a[i] = a[i], a[gt]
			default:
				i++
			}
		}
		switch {
		case target < lt:
			hi = lt
		case target >= gt:
			lo = gt
		default:
			return pivot
		}
	}
}
