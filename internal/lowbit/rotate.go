package lowbit

import (
	"math"
	"math/rand/v2"
)

// Rotation, after QuaRot (Ashkboos et al. 2024): keys and
// values are stored as R·k and R·v for a fixed orthonormal R, queries are
// rotated alike before they meet the keys (R·q · R·k = q·k), and the
// output, a combination of rotated values, is rotated back (Rᵀ·o). R
// spreads a channel of outliers over all channels of its block, which is
// what low-bit codes with a shared scale need: one large channel no longer
// sets the step of the others.
//
// R = H·S/√b: S flips the sign of each channel by a fixed pseudo-random
// draw (seed rotSeed, the same for every cache, so that what one cache
// stores another reads alike), and H applies the Walsh–Hadamard matrix of
// size b to each block of b consecutive channels, b the largest power of
// two dividing D (all of D when it is one; D = 96 takes 3 blocks of 32).
// An odd D has b = 1: R only flips signs, which changes no error. The
// transform is the fast one, b·log2(b) additions a block.
type Rotation struct {
	d, block int
	sign     []float32
	norm     float32 // 1/√block
}

// rotSeed seeds the sign flips of every rotation.
const rotSeed = 0x6b76636163686521

// NewRotation returns the rotation of rows of d values.
func NewRotation(d int) *Rotation {
	b := d & -d // the largest power of two dividing d
	rng := rand.New(rand.NewPCG(rotSeed, uint64(d)))
	r := &Rotation{d: d, block: b, sign: make([]float32, d), norm: float32(1 / math.Sqrt(float64(b)))}
	for i := range r.sign {
		r.sign[i] = 1
		if rng.Uint64()&1 != 0 {
			r.sign[i] = -1
		}
	}
	return r
}

// Apply sets x (D values) to R·x.
func (r *Rotation) Apply(x []float32) {
	x = x[:r.d]
	for i, s := range r.sign {
		x[i] *= s
	}
	r.hadamard(x)
}

// Invert sets x (D values) to Rᵀ·x.
func (r *Rotation) Invert(x []float32) {
	x = x[:r.d]
	r.hadamard(x)
	for i, s := range r.sign {
		x[i] *= s
	}
}

// hadamard applies H/√b to each block of x: H is symmetric and H·H =
// b·I, so it is its own inverse.
func (r *Rotation) hadamard(x []float32) {
	b := r.block
	if b == 1 {
		return
	}
	for o := 0; o < len(x); o += b {
		blk := x[o : o+b]
		for h := 1; h < b; h *= 2 {
			for i := 0; i < b; i += 2 * h {
				lo, hi := blk[i:i+h], blk[i+h:i+2*h]
				for j := range lo {
					a, c := lo[j], hi[j]
					lo[j], hi[j] = a+c, a-c
				}
			}
		}
		for j := range blk {
			blk[j] *= r.norm
		}
	}
}

// Copy returns the rows of x rotated (R on each row of D values), in
// dst's memory when it is large enough: a step's queries, keys or values
// rotated for storage without touching the caller's.
func (r *Rotation) Copy(dst, x []float32) []float32 {
	dst = append(dst[:0], x...)
	r.Rows(dst, false)
	return dst
}

// Rows applies (inv false) or inverts R on each row of D values of x.
func (r *Rotation) Rows(x []float32, inv bool) {
	for o := 0; o+r.d <= len(x); o += r.d {
		if inv {
			r.Invert(x[o : o+r.d])
		} else {
			r.Apply(x[o : o+r.d])
		}
	}
}
