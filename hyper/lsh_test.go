package hyper

import (
	"errors"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// grayCode is g(i) = i XOR i>>1, the inverse of GrayRank.
func grayCode(i uint32) uint32 { return i ^ i>>1 }

// oneBitApart reports whether two patterns differ in exactly one bit.
func oneBitApart(a, b uint32) bool { return bits.OnesCount32(a^b) == 1 }

// Sorted by Gray rank, every pair of adjacent buckets is one sign apart,
// and the rank is a bijection on r-bit patterns.
func TestGrayRankAdjacentBucketsOneBitApart(t *testing.T) {
	for r := 1; r <= 16; r++ {
		n := uint32(1) << r
		byRank := make([]uint32, n)
		seen := make([]bool, n)
		for p := range n {
			k := GrayRank(p)
			if k >= n || seen[k] {
				t.Fatalf("r=%d: rank %d of pattern %b is out of range or taken", r, k, p)
			}
			seen[k] = true
			byRank[k] = p
		}
		for k := 1; k < int(n); k++ {
			if !oneBitApart(byRank[k-1], byRank[k]) {
				t.Fatalf("r=%d: buckets %d and %d are patterns %b and %b", r, k-1, k, byRank[k-1], byRank[k])
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		i := rng.Uint32()
		if GrayRank(grayCode(i)) != i {
			t.Fatalf("GrayRank(g(%d)) = %d", i, GrayRank(grayCode(i)))
		}
	}
	// The authors' order, by g(pattern), breaks adjacency for about a
	// quarter of neighbours: the bug GrayRank avoids.
	bad := 0
	const r = 7
	byCode := make([]uint32, 1<<r)
	for p := range uint32(1 << r) {
		byCode[grayCode(p)] = p
	}
	for k := 1; k < 1<<r; k++ {
		if !oneBitApart(byCode[k-1], byCode[k]) {
			bad++
		}
	}
	if bad == 0 {
		t.Errorf("ordering by g(pattern) kept every neighbour one bit apart")
	}
	t.Logf("ordering by g(pattern): %d of %d neighbours more than one bit apart", bad, 1<<r-1)
}

// Buckets depend on directions only, lie in [0, 2^r) and follow the signs
// of the projections.
func TestSortLSHBuckets(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, r := range []int{1, 7, 16, 17, 30} {
		const n, d = 300, 24
		l, err := NewSortLSH(r, d, 5)
		if err != nil {
			t.Fatal(err)
		}
		x := ref.Normal(rng, n*d)
		scaled := slices.Clone(x)
		for i := range scaled {
			scaled[i] *= 3.5
		}
		b1, err := l.Buckets(x)
		if err != nil {
			t.Fatal(err)
		}
		b2, _ := l.Buckets(scaled)
		if !slices.Equal(b1, b2) {
			t.Errorf("r=%d: scaling the vectors changed their buckets", r)
		}
		for i, b := range b1 {
			if r < 32 && b >= 1<<r {
				t.Fatalf("r=%d: bucket %d out of range", r, b)
			}
			var pattern uint32
			for p := range r {
				var dot float64
				for c := range d {
					dot += float64(x[i*d+c]) * float64(l.wt[c*l.width+p])
				}
				if dot > 0 {
					pattern |= 1 << p
				}
			}
			if GrayRank(pattern) != b {
				t.Fatalf("r=%d row %d: bucket %d, want rank of %b", r, i, b, pattern)
			}
		}
		if _, err := l.Buckets(x[1:]); !errors.Is(err, attn.ErrShape) {
			t.Errorf("r=%d: a partial vector gave %v, want ErrShape", r, err)
		}
		// The same seed gives the same projections; another seed others.
		l2, _ := NewSortLSH(r, d, 5)
		l3, _ := NewSortLSH(r, d, 6)
		if !slices.Equal(l.wt, l2.wt) || slices.Equal(l.wt, l3.wt) {
			t.Errorf("r=%d: projections do not follow the seed", r)
		}
	}
}

// Both sorting paths are stable sorts by bucket.
func TestSortByBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, r := range []int{1, 4, 12, 16, 20, 30} {
		for _, n := range []int{0, 1, 5, 1000} {
			bucket := make([]uint32, n)
			for i := range bucket {
				bucket[i] = rng.Uint32() % (1 << min(r, 6)) << (r - min(r, 6)) // ties
			}
			want := make([]int32, n)
			for i := range want {
				want[i] = int32(i)
			}
			slices.SortStableFunc(want, func(a, b int32) int { return int(bucket[a]) - int(bucket[b]) })
			got := make([]int32, n)
			sortByBucket(got, bucket, r, nil, nil)
			if !slices.Equal(got, want) {
				t.Fatalf("r=%d n=%d: not a stable sort by bucket", r, n)
			}
		}
	}
}
