package hyper

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/simd"
)

// MaxProjs is the largest number of LSH projections: buckets are r-bit
// sign patterns held in a uint32 with room to spare.
const MaxProjs = 30

// SortLSH is the locality-sensitive hash of HyperAttention: r random
// Gaussian directions, the sign of a vector's projection on each giving one
// bit, and the bucket of the vector the rank of that r-bit pattern in the
// reflected binary Gray code. Buckets that are adjacent in rank therefore
// differ in exactly one sign, so sorting by bucket puts vectors on either
// side of a single hyperplane next to each other. The projections do not
// depend on the vectors' length; only directions matter.
type SortLSH struct {
	r, d, width int
	// wt holds the projections transposed, [d][width], zero past column
	// r: width is r rounded up to simd.Panel, so one Gemm hashes a batch
	// of rows.
	wt []float32
}

// NewSortLSH draws r projections for vectors of length d from
// PCG(seed, projStream): r·d standard normals, projection by projection,
// each in coordinate order.
func NewSortLSH(r, d int, seed uint64) (*SortLSH, error) {
	if r < 1 || r > MaxProjs {
		return nil, fmt.Errorf("%w: hyper: %d LSH projections, want 1 to %d", attn.ErrInput, r, MaxProjs)
	}
	if d < 1 {
		return nil, fmt.Errorf("%w: hyper: LSH over vectors of length %d", attn.ErrShape, d)
	}
	width := (r + simd.Panel - 1) / simd.Panel * simd.Panel
	l := &SortLSH{r: r, d: d, width: width, wt: make([]float32, d*width)}
	rng := rand.New(rand.NewPCG(seed, projStream))
	for t := range r {
		for c := range d {
			l.wt[c*width+t] = float32(rng.NormFloat64())
		}
	}
	return l, nil
}

// projStream is the PCG stream the projections are drawn from; samples use
// streams derived from the block they serve (see blockStream).
const projStream = 0x9e3779b97f4a7c15

// hashRows is how many rows Buckets projects with one Gemm.
const hashRows = 128

// Buckets returns the bucket of each row of x, row-major vectors of the
// length d the projections were drawn for.
func (l *SortLSH) Buckets(x []float32) ([]uint32, error) {
	if len(x)%l.d != 0 {
		return nil, fmt.Errorf("%w: hyper: %d values are no whole number of vectors of length %d", attn.ErrShape, len(x), l.d)
	}
	dst := make([]uint32, len(x)/l.d)
	l.buckets(dst, x, nil)
	return dst, nil
}

// buckets writes the bucket of each of the len(dst) rows of x into dst.
// scratch is reused when large enough and returned.
func (l *SortLSH) buckets(dst []uint32, x []float32, scratch []float32) []float32 {
	scratch = grow(scratch, hashRows*l.width)
	for r0 := 0; r0 < len(dst); r0 += hashRows {
		n := min(hashRows, len(dst)-r0)
		p := scratch[:n*l.width]
		simd.Gemm(n, l.width, l.d, x[r0*l.d:], l.d, l.wt, l.width, p, l.width, false)
		for i := range n {
			row := p[i*l.width:][:l.r]
			var pattern uint32
			for t, y := range row {
				if y > 0 {
					pattern |= 1 << t
				}
			}
			dst[r0+i] = GrayRank(pattern)
		}
	}
	return scratch
}

// GrayRank returns the position of pattern in the reflected binary Gray code
// sequence g(0), g(1), … with g(i) = i XOR i>>1, that is the i with
// g(i) = pattern. Patterns of consecutive rank differ in exactly one bit.
//
// (Sorting by g(pattern) instead, as the authors' code does, leaves about a
// quarter of neighbouring buckets more than one bit apart.)
func GrayRank(pattern uint32) uint32 {
	// The inverse of g is the prefix XOR of the bits from the top down.
	i := pattern
	i ^= i >> 1
	i ^= i >> 2
	i ^= i >> 4
	i ^= i >> 8
	i ^= i >> 16
	return i
}

// sortByBucket writes into idx the positions 0…len(bucket)-1 ordered by
// bucket, ties by position (a stable sort). counts is scratch for the
// counting sort used when there are few buckets; it is returned for reuse.
func sortByBucket(idx []int32, bucket []uint32, r int, counts []int32, keys []uint64) ([]int32, []uint64) {
	n := len(bucket)
	idx = idx[:n]
	if nb := 1 << r; r <= 16 && nb <= 4*n+256 {
		counts = grow(counts, nb+1)
		clear(counts)
		for _, x := range bucket {
			counts[x+1]++
		}
		for i := 1; i <= nb; i++ {
			counts[i] += counts[i-1]
		}
		for i, x := range bucket {
			idx[counts[x]] = int32(i)
			counts[x]++
		}
		return counts, keys
	}
	// Many buckets: sort (bucket, position) pairs packed in one word.
	keys = grow(keys, n)
	for i, x := range bucket {
		keys[i] = uint64(x)<<32 | uint64(i)
	}
	slices.Sort(keys)
	for i, key := range keys {
		idx[i] = int32(uint32(key))
	}
	return counts, keys
}

// grow returns buf resliced to length n, reallocated when too small.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n, n+n/4)
	}
	return buf[:n]
}
