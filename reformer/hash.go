package reformer

import (
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn/internal/simd"
)

// rotationStream is the PCG stream of the random rotations: the generator
// is rand.NewPCG(Config.Seed, rotationStream) ("reformer" in ASCII).
const rotationStream = 0x7265666f726d6572

// maxSingleFactor is the largest bucket count hashed with one rotation.
// Above it the count is factorised into two even factors f1·f2 (as trax
// does): hashing then costs D·(f1+f2)/2 instead of D·f1·f2/2 multiply-adds
// per vector and round, which keeps it a small part of the cost at 64k
// tokens, where about 1000 buckets are used.
const maxSingleFactor = 64

// bucketFactors returns the factors of the bucket count used for a request
// of about t buckets: none for t <= 1 (one bucket, no hashing), t rounded
// up to even up to maxSingleFactor, and above it two even factors close to
// sqrt(t) whose product is at least t.
func bucketFactors(t int) []int {
	switch {
	case t <= 1:
		return nil
	case t <= maxSingleFactor:
		return []int{roundEven(t)}
	}
	f1 := 2
	for f1*f1 < t {
		f1++
	}
	f1 = roundEven(f1)
	f2 := roundEven((t + f1 - 1) / f1)
	return []int{f1, f2}
}

func roundEven(x int) int { return (x + 1) &^ 1 }

// hasher is the angular LSH of all rounds: for round r and factor f the
// bucket digit of x is argmax([x·R; −x·R]) over a D×(f/2) Gaussian matrix
// R, and the digits of a round combine in mixed radix into a bucket in
// [0, buckets).
type hasher struct {
	rounds  int
	factors []int
	buckets int       // product of factors, 1 without factors
	d       int       // vector size
	cols    int       // projection columns per round: Σ f/2
	ld      int       // row stride of rot: rounds·cols rounded up to simd.Panel
	rot     []float32 // [d][ld], zero past rounds·cols
}

// newHasher draws the rotations: for each round, for each factor f, a
// D×(f/2) matrix of standard normal numbers in row-major order, all from
// one PCG generator seeded with (seed, rotationStream).
func newHasher(seed uint64, rounds, d int, factors []int) *hasher {
	h := &hasher{rounds: rounds, factors: factors, buckets: 1, d: d}
	for _, f := range factors {
		h.buckets *= f
		h.cols += f / 2
	}
	if h.cols == 0 {
		return h
	}
	h.ld = (rounds*h.cols + simd.Panel - 1) / simd.Panel * simd.Panel
	h.rot = make([]float32, d*h.ld)
	rng := rand.New(rand.NewPCG(seed, rotationStream))
	for r := range rounds {
		off := r * h.cols
		for _, f := range factors {
			for i := range d {
				for c := range f / 2 {
					h.rot[i*h.ld+off+c] = float32(rng.NormFloat64())
				}
			}
			off += f / 2
		}
	}
	return h
}

// hashRows is the number of vectors hashed per matrix product.
const hashRows = 64

// scratch returns the projection buffer hash needs.
func (h *hasher) scratch() []float32 { return make([]float32, hashRows*h.ld) }

// hash writes the bucket of each of the n vectors x[i·ldx:][:d] in each
// round to dst[i·rounds+r]. proj is scratch from h.scratch. NaN in x gives
// some valid bucket, never an out-of-range one.
func (h *hasher) hash(x []float32, n, ldx int, proj []float32, dst []int32) {
	if h.cols == 0 {
		clear(dst[:n*h.rounds])
		return
	}
	for i0 := 0; i0 < n; i0 += hashRows {
		rows := min(hashRows, n-i0)
		simd.Gemm(rows, h.ld, h.d, x[i0*ldx:], ldx, h.rot, h.ld, proj, h.ld, false)
		for i := range rows {
			p := proj[i*h.ld:][:h.ld]
			out := dst[(i0+i)*h.rounds:][:h.rounds]
			for r := range h.rounds {
				out[r] = h.bucket(p[r*h.cols:][:h.cols])
			}
		}
	}
}

// hashRow writes the bucket of the vector x[:d] in each round to
// dst[:rounds]. proj is scratch of h.ld floats (h.rowScratch). The
// projections are a one-row product, so a vector gets the same buckets
// whichever call hashes it, alone or among others: hash's products of
// many rows may round a row's projections differently depending on the
// rows blocked with it, which the causal rule, whose decoders hash one
// token at a time, cannot allow.
func (h *hasher) hashRow(x, proj []float32, dst []int32) {
	if h.cols == 0 {
		clear(dst[:h.rounds])
		return
	}
	simd.Gemm(1, h.ld, h.d, x, h.d, h.rot, h.ld, proj, h.ld, false)
	for r := range h.rounds {
		dst[r] = h.bucket(proj[r*h.cols:][:h.cols])
	}
}

// rowScratch returns the projection buffer hashRow needs.
func (h *hasher) rowScratch() []float32 { return make([]float32, h.ld) }

// bucket combines the argmax digits of one round's projections p.
func (h *hasher) bucket(p []float32) int32 {
	b := 0
	for _, f := range h.factors {
		half := f / 2
		b = b*f + argmaxSigned(p[:half])
		p = p[half:]
	}
	return int32(b)
}

// argmaxSigned returns argmax([x; −x]), the first index on ties as
// torch.argmax. Each candidate becomes one integer, its value's order-
// preserving bits above its inverted index, so that a branch-free integer
// max finds value and index together: on random projections the branches
// of a compare-and-keep argmax are mispredicted often. NaN gives some
// index in range.
func argmaxSigned(x []float32) int {
	const idx = 16 // low bits holding the inverted index; f/2 < 2^15
	best := int64(math.MinInt64)
	for c, v := range x {
		o := orderKey(v)
		best = max(best, o<<idx|int64(1<<idx-1-c), (-o-1)<<idx|int64(1<<idx-1-(len(x)+c)))
	}
	return 1<<idx - 1 - int(best&(1<<idx-1))
}

// orderKey maps a float32 to an integer with the same order: -x maps to
// -orderKey(x)-1.
func orderKey(x float32) int64 {
	b := int32(math.Float32bits(x))
	return int64(b ^ int32(uint32(b>>31)>>1))
}
