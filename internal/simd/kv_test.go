package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn/internal/half"
)

// guard16 surrounds the 16-bit sources: a NaN both as a binary16 and as
// a bfloat16, whose widening would show in dst if a kernel read it.
const guard16 = 0x7fd5

// narrowElem is the element type of the compact operands: uint16 holds
// a bf16 or an f16, int8 a code.
type narrowElem interface{ int8 | uint8 | uint16 }

// guardedInts is a slice v of src with guardLen guard values on either
// side in the same array.
type guardedInts[T narrowElem] struct {
	all, v []T
	guard  T
}

func guardedCopyInts[T narrowElem](src []T, guard T) guardedInts[T] {
	all := make([]T, len(src)+2*guardLen)
	for i := range all {
		all[i] = guard
	}
	v := all[guardLen : guardLen+len(src)]
	copy(v, src)
	return guardedInts[T]{all: all, v: v, guard: guard}
}

// unchanged reports any value of g that differs from src or the guard.
func (g guardedInts[T]) unchanged(t *testing.T, src []T) {
	t.Helper()
	for i, v := range g.all {
		want := g.guard
		if i >= guardLen && i < guardLen+len(src) {
			want = src[i-guardLen]
		}
		if v != want {
			t.Fatalf("src changed at offset %d: %#x, want %#x", i-guardLen, v, want)
		}
	}
}

// narrowFormat is how the tests make and read compact values of type T:
// the guard around them, a random value, and its widening to float32.
type narrowFormat[T narrowElem] struct {
	guard T
	rand  func(r *rand.Rand) T
	widen func(T) float32
}

// halfFormat is the format of bf16 or f16 values, narrow and widen
// converting one: random values in [-1, 1), one in eight of them tiny,
// with guard16 (a NaN in both formats) around them.
func halfFormat(narrow func(float32) uint16, widen func(uint16) float32) narrowFormat[uint16] {
	return narrowFormat[uint16]{
		guard: guard16,
		rand: func(r *rand.Rand) uint16 {
			x := 2*r.Float32() - 1
			if r.IntN(8) == 0 { // subnormal halves, and tiny bf16
				x *= 0x1p-20
			}
			return narrow(x)
		},
		widen: widen,
	}
}

// matrix is rows rows of cols random values at stride ld, with the guard
// in the padding of each row.
func (f narrowFormat[T]) matrix(r *rand.Rand, rows, cols, ld int) []T {
	x := make([]T, matSize(rows, cols, ld))
	for i := range x {
		x[i] = f.guard
	}
	for i := range rows {
		for j := range cols {
			x[i*ld+j] = f.rand(r)
		}
	}
	return x
}

// widenKernels are the two widenings with their reference, the bits
// internal/half gives, quietened for a signalling f16 NaN as VCVTPH2PS
// does.
var widenKernels = []struct {
	name string
	f    func(impl implementation) func(dst []float32, src []uint16)
	want func(h uint16) uint32
}{
	{
		"bf16",
		func(impl implementation) func([]float32, []uint16) { return impl.widenBF16 },
		func(h uint16) uint32 { return math.Float32bits(half.BF16ToF32(h)) },
	},
	{
		"f16",
		func(impl implementation) func([]float32, []uint16) { return impl.widenF16 },
		func(h uint16) uint32 {
			b := math.Float32bits(half.F16ToF32(h))
			if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
				b |= 0x00400000
			}
			return b
		},
	},
}

// TestWiden converts all 65536 bit patterns in one call and compares each
// result with internal/half bit for bit.
func TestWiden(t *testing.T) {
	src := make([]uint16, 1<<16)
	for i := range src {
		src[i] = uint16(i)
	}
	for _, kern := range widenKernels {
		t.Run(kern.name, func(t *testing.T) {
			forEachImpl(t, func(t *testing.T, impl implementation) {
				g := guardedCopyInts(src, guard16)
				dst := newGuarded(len(src))
				kern.f(impl)(dst.v, g.v)
				dst.check(t, "dst")
				g.unchanged(t, src)
				errs := 0
				for i, h := range src {
					if got, want := math.Float32bits(dst.v[i]), kern.want(h); got != want {
						if errs++; errs <= 10 {
							t.Errorf("%#04x: got %#08x, want %#08x", h, got, want)
						}
					}
				}
			})
		})
	}
}

// TestWidenTail converts every length of testLengths at four alignments
// of src and dst, random patterns among them NaNs and subnormals.
func TestWidenTail(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, kern := range widenKernels {
		t.Run(kern.name, func(t *testing.T) {
			forEachImpl(t, func(t *testing.T, impl implementation) {
				for _, n := range testLengths {
					for off := range 4 {
						src := make([]uint16, n)
						for i := range src {
							src[i] = uint16(r.Uint32())
						}
						g := guardedCopyInts(src, guard16)
						dst := newGuarded(n + off)
						kern.f(impl)(dst.v[off:], g.v)
						dst.check(t, fmt.Sprintf("n=%d off=%d", n, off))
						g.unchanged(t, src)
						for i := range off {
							if math.Float32bits(dst.v[i]) != math.Float32bits(guard) {
								t.Fatalf("n=%d off=%d: dst[%d] before the slice written", n, off, i)
							}
						}
						for i, h := range src {
							if got, want := math.Float32bits(dst.v[off+i]), kern.want(h); got != want {
								t.Fatalf("n=%d off=%d: [%d] = %#04x: got %#08x, want %#08x", n, off, i, h, got, want)
							}
						}
					}
				}
			})
		})
	}
}

// dotRowsSQ holds the float32 operands of a DotRows problem, whatever the
// type of k: s all guard values before the call, q random with NaN in the
// padding of each row and around it.
type dotRowsSQ struct {
	rows, n, d, lds, ldq, ldk int
	s, q                      guarded
	// roundQ, when set, is the rounding the kernel applies to q first
	// (bfloat16 for the VDPBF16PS kernels), which checkS applies too.
	roundQ func(float32) float32
}

func newDotRowsSQ(r *rand.Rand, rows, n, d, lds, ldq, ldk int) dotRowsSQ {
	return dotRowsSQ{
		rows: rows, n: n, d: d, lds: lds, ldq: ldq, ldk: ldk,
		s: newGuarded(matSize(rows, n, lds)),
		q: randMatrix(r, rows, d, ldq),
	}
}

// checkS compares each score with the float64 dot product of its row of
// q (rounded by roundQ) and its key, k(j, p) being element p of key j, within (d+2)·2^-24 of
// the sum of the magnitudes of the terms, and checks that the padding of
// s is untouched.
func (c *dotRowsSQ) checkS(t *testing.T, k func(j, p int) float64) {
	t.Helper()
	if c.n == 0 {
		return
	}
	for i := range c.rows {
		for j := range c.lds {
			if i == c.rows-1 && j >= c.n {
				break
			}
			got := c.s.v[i*c.lds+j]
			if j >= c.n {
				if math.Float32bits(got) != math.Float32bits(guard) {
					t.Fatalf("s padding [%d][%d] written: %v", i, j, got)
				}
				continue
			}
			var want, abs float64
			for p := range c.d {
				x := c.q.v[i*c.ldq+p]
				if c.roundQ != nil {
					x = c.roundQ(x)
				}
				v := float64(x) * k(j, p)
				want += v
				abs += math.Abs(v)
			}
			if tol := float64(c.d+2) * 0x1p-24 * abs; !(math.Abs(float64(got)-want) <= tol) {
				t.Fatalf("s[%d][%d] = %v, want %v (tol %g)", i, j, got, want, tol)
			}
		}
	}
}

// dotRowsCase is one DotRows problem: q and k with NaN in the padding
// of each row and around them, s all guard values before the call.
type dotRowsCase struct {
	dotRowsSQ
	k guarded
}

func newDotRowsCase(r *rand.Rand, rows, n, d, lds, ldq, ldk int) *dotRowsCase {
	c := &dotRowsCase{dotRowsSQ: newDotRowsSQ(r, rows, n, d, lds, ldq, ldk)}
	c.k = randMatrix(r, n, d, ldk)
	return c
}

func (c *dotRowsCase) check(t *testing.T) {
	t.Helper()
	c.s.check(t, "s")
	c.q.check(t, "q")
	c.k.check(t, "k")
	c.checkS(t, func(j, p int) float64 { return float64(c.k.v[j*c.ldk+p]) })
}

func TestDotRows(t *testing.T) {
	rowsList := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16}
	var ns []int
	for n := range 18 {
		ns = append(ns, n)
	}
	ns = append(ns, 64, 65)
	var ds []int
	for d := range 18 {
		ds = append(ds, d)
	}
	ds = append(ds, 31, 64, 80, 128)
	r := rand.New(rand.NewPCG(23, 24))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		run := func(rows, n, d, lds, ldq, ldk int) {
			c := newDotRowsCase(r, rows, n, d, lds, ldq, ldk)
			checkDotRows(len(c.s.v), lds, len(c.q.v), ldq, rows, len(c.k.v), ldk, n, d)
			impl.dotRows(c.s.v, lds, c.q.v, ldq, rows, c.k.v, ldk, n, d)
			t.Run(fmt.Sprintf("rows=%d n=%d d=%d lds=%d ldq=%d ldk=%d", rows, n, d, lds, ldq, ldk), c.check)
		}
		for _, rows := range rowsList {
			for _, n := range ns {
				for _, d := range ds {
					// Tight strides, then odd padded ones.
					run(rows, n, d, n, d, d)
					run(rows, n, d, n+3, d+5, d+7)
				}
			}
		}
		run(32, 65, 67, 67, 69, 71)
		run(32, 64, 128, 64, 128, 128)
	})
}

// TestDotRowsEmpty checks that empty problems read nothing: with d = 0
// the scores are 0 whatever q and k are.
func TestDotRowsEmpty(t *testing.T) {
	forEachImpl(t, func(t *testing.T, impl implementation) {
		impl.dotRows(nil, 0, nil, 0, 0, nil, 0, 5, 3)
		impl.dotRows(nil, 0, nil, 0, 3, nil, 0, 0, 3)
		s := newGuarded(2*5 + 4)
		impl.dotRows(s.v, 7, nil, 0, 2, nil, 0, 4, 0)
		checkZeroScores(t, s)
	})
}

// checkZeroScores checks s after a call on 2 rows of 4 scores at stride
// 7 with d = 0: the scores 0, the padding and the guards untouched.
func checkZeroScores(t *testing.T, s guarded) {
	t.Helper()
	s.check(t, "s")
	for i, v := range s.v {
		if i%7 >= 4 {
			if math.Float32bits(v) != math.Float32bits(guard) {
				t.Errorf("s padding [%d] written", i)
			}
		} else if v != 0 {
			t.Errorf("s[%d] = %v, want 0", i, v)
		}
	}
}

// dotRows16Kernels are the DotRows kernels with 16-bit keys, with the
// conversion of a float32 to the key type and the widening of a key.
var dotRows16Kernels = []struct {
	name   string
	f      func(impl implementation) func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int)
	narrow func(x float32) uint16
	widen  func(h uint16) float32
	// roundQ is the rounding of q a family's kernel does, or nil.
	roundQ func(impl implementation) func(float32) float32
}{
	{
		"bf16",
		func(impl implementation) func([]float32, int, []float32, int, int, []uint16, int, int, int) {
			return impl.dotRowsBF16
		},
		half.F32ToBF16, half.BF16ToF32, bf16Split,
	},
	{
		"bf16native",
		func(impl implementation) func([]float32, int, []float32, int, int, []uint16, int, int, int) {
			return func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int) {
				impl.dotRowsBF16Native(s, lds, q, ldq, rows, k, ldk, n, d, nil)
			}
		},
		half.F32ToBF16, half.BF16ToF32, bf16Rounding,
	},
	{
		"f16",
		func(impl implementation) func([]float32, int, []float32, int, int, []uint16, int, int, int) {
			return impl.dotRowsF16
		},
		half.F32ToF16, half.F16ToF32, noRounding,
	},
}

// bf16Rounding is the rounding of the float32 operand by the native
// bfloat16 kernels of a family: none, or with VDPBF16PS to bfloat16 (see
// roundBF16).
func bf16Rounding(impl implementation) func(float32) float32 {
	if impl.bf16Dot {
		return roundBF16
	}
	return nil
}

// bf16Split is the rounding of the float32 operand by the DotRowsBF16 and
// GemmBF16 kernels of a family: none, or with VDPBF16PS to the sum of two
// bfloat16 (see splitBF16).
func bf16Split(impl implementation) func(float32) float32 {
	if impl.bf16Dot {
		return splitBF16
	}
	return nil
}

// splitBF16 is x as the sum of its two bfloat16 halves, hi = roundBF16(x)
// and lo = roundBF16(x - hi), which has at most 17 significant bits and
// is a float32 exactly.
func splitBF16(x float32) float32 {
	hi := roundBF16(x)
	return hi + roundBF16(x-hi)
}

func noRounding(implementation) func(float32) float32 { return nil }

// roundBF16 is x rounded to bfloat16 as VCVTNE2PS2BF16 does: to nearest
// even, subnormals to zero of their sign.
func roundBF16(x float32) float32 {
	if b := math.Float32bits(x); b&0x7f800000 == 0 {
		return math.Float32frombits(b & 0x80000000)
	}
	return half.BF16ToF32(half.F32ToBF16(x))
}

// dotRowsNarrowCase is one problem of a DotRows kernel with 16-bit or
// int8 keys: q with NaN in the padding of each row and around it, k with
// the guard of its format there (guard16, a NaN in both 16-bit formats,
// or guard8), s all guard values before the call.
type dotRowsNarrowCase[T narrowElem] struct {
	dotRowsSQ
	k     guardedInts[T]
	kSrc  []T
	widen func(T) float32
}

func newDotRowsNarrowCase[T narrowElem](r *rand.Rand, rows, n, d, lds, ldq, ldk int, kf narrowFormat[T]) *dotRowsNarrowCase[T] {
	c := &dotRowsNarrowCase[T]{dotRowsSQ: newDotRowsSQ(r, rows, n, d, lds, ldq, ldk), widen: kf.widen}
	c.kSrc = kf.matrix(r, n, d, ldk)
	c.k = guardedCopyInts(c.kSrc, kf.guard)
	return c
}

func (c *dotRowsNarrowCase[T]) check(t *testing.T) {
	t.Helper()
	c.s.check(t, "s")
	c.q.check(t, "q")
	c.k.unchanged(t, c.kSrc)
	c.checkS(t, func(j, p int) float64 { return float64(c.widen(c.kSrc[j*c.ldk+p])) })
}

// testDotRowsNarrow runs f, a DotRows kernel with keys of format kf, on
// every row count of a block and its tails, every d%8 and d%16, tight and
// padded strides; prefix starts the names of the subtests.
//
// roundQ, which may be nil, is the rounding f applies to q.
func testDotRowsNarrow[T narrowElem](t *testing.T, r *rand.Rand, prefix string, kf narrowFormat[T], roundQ func(float32) float32, f func(s []float32, lds int, q []float32, ldq, rows int, k []T, ldk, n, d int)) {
	rowsList := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16}
	var ns []int
	for n := range 18 {
		ns = append(ns, n)
	}
	ns = append(ns, 64, 65)
	var ds []int
	for d := range 18 {
		ds = append(ds, d)
	}
	ds = append(ds, 31, 64, 80, 128, 300)
	run := func(rows, n, d, lds, ldq, ldk int) {
		c := newDotRowsNarrowCase(r, rows, n, d, lds, ldq, ldk, kf)
		c.roundQ = roundQ
		checkDotRows(len(c.s.v), lds, len(c.q.v), ldq, rows, len(c.k.v), ldk, n, d)
		f(c.s.v, lds, c.q.v, ldq, rows, c.k.v, ldk, n, d)
		t.Run(fmt.Sprintf("%srows=%d n=%d d=%d lds=%d ldq=%d ldk=%d", prefix, rows, n, d, lds, ldq, ldk), c.check)
	}
	for _, rows := range rowsList {
		for _, n := range ns {
			for _, d := range ds {
				// Tight strides, then odd padded ones.
				run(rows, n, d, n, d, d)
				run(rows, n, d, n+3, d+5, d+7)
			}
		}
	}
	run(32, 65, 67, 67, 69, 71)
	run(4, 64, 128, 64, 128, 128)
	// Rows longer than the buffers of the VDPBF16PS kernels.
	run(5, 7, 1030, 9, 1031, 1033)
	run(3, 5, 1024, 5, 1024, 1024)
}

func TestDotRows16(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, kern := range dotRows16Kernels {
		t.Run(kern.name, func(t *testing.T) {
			kf := halfFormat(kern.narrow, kern.widen)
			forEachImpl(t, func(t *testing.T, impl implementation) {
				testDotRowsNarrow(t, r, "", kf, kern.roundQ(impl), kern.f(impl))
			})
		})
	}
}

// TestDotRows16Empty checks that empty problems read nothing: with d = 0
// the scores are 0 whatever q and k are.
func TestDotRows16Empty(t *testing.T) {
	for _, kern := range dotRows16Kernels {
		t.Run(kern.name, func(t *testing.T) {
			forEachImpl(t, func(t *testing.T, impl implementation) {
				f := kern.f(impl)
				f(nil, 0, nil, 0, 0, nil, 0, 5, 3)
				f(nil, 0, nil, 0, 3, nil, 0, 0, 3)
				s := newGuarded(2*5 + 4)
				f(s.v, 7, nil, 0, 2, nil, 0, 4, 0)
				checkZeroScores(t, s)
			})
		})
	}
}

// TestDotRows16NoAlloc checks that the kernels with 16-bit keys do not
// allocate.
func TestDotRows16NoAlloc(t *testing.T) {
	const rows, n, d = 4, 64, 300
	q := make([]float32, rows*d)
	k := make([]uint16, n*d)
	s := make([]float32, rows*n)
	for _, kern := range dotRows16Kernels {
		forEachImpl(t, func(t *testing.T, impl implementation) {
			f := kern.f(impl)
			if a := testing.AllocsPerRun(10, func() { f(s, n, q, d, rows, k, d, n, d) }); a != 0 {
				t.Errorf("%s: %v allocations a call", kern.name, a)
			}
		})
	}
}
