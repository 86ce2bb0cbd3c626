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

// guarded16 is a slice v of src with guardLen guard16 values on either
// side in the same array.
type guarded16 struct {
	all, v []uint16
}

func guardedCopy16(src []uint16) guarded16 {
	all := make([]uint16, len(src)+2*guardLen)
	for i := range all {
		all[i] = guard16
	}
	v := all[guardLen : guardLen+len(src)]
	copy(v, src)
	return guarded16{all: all, v: v}
}

// unchanged reports any value of g that differs from src or the guard.
func (g guarded16) unchanged(t *testing.T, src []uint16) {
	t.Helper()
	for i, v := range g.all {
		want := uint16(guard16)
		if i >= guardLen && i < guardLen+len(src) {
			want = src[i-guardLen]
		}
		if v != want {
			t.Fatalf("src changed at offset %d: %#x, want %#x", i-guardLen, v, want)
		}
	}
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
				g := guardedCopy16(src)
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
						g := guardedCopy16(src)
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

// dotRowsCase is one DotRows problem: q and k with NaN in the padding
// of each row and around them, s all guard values before the call.
type dotRowsCase struct {
	rows, n, d, lds, ldq, ldk int
	s, q, k                   guarded
}

func newDotRowsCase(r *rand.Rand, rows, n, d, lds, ldq, ldk int) *dotRowsCase {
	c := &dotRowsCase{rows: rows, n: n, d: d, lds: lds, ldq: ldq, ldk: ldk}
	size := func(rows, cols, ld int) int {
		if rows == 0 || cols == 0 {
			return 0
		}
		return (rows-1)*ld + cols
	}
	c.s = newGuarded(size(rows, n, lds))
	c.q = newGuarded(size(rows, d, ldq))
	c.k = newGuarded(size(n, d, ldk))
	for i := range rows {
		for p := range d {
			c.q.v[i*ldq+p] = 2*r.Float32() - 1
		}
	}
	for j := range n {
		for p := range d {
			c.k.v[j*ldk+p] = 2*r.Float32() - 1
		}
	}
	return c
}

func (c *dotRowsCase) check(t *testing.T) {
	t.Helper()
	c.s.check(t, "s")
	c.q.check(t, "q")
	c.k.check(t, "k")
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
				v := float64(c.q.v[i*c.ldq+p]) * float64(c.k.v[j*c.ldk+p])
				want += v
				abs += math.Abs(v)
			}
			if tol := float64(c.d+2) * 0x1p-24 * abs; !(math.Abs(float64(got)-want) <= tol) {
				t.Fatalf("s[%d][%d] = %v, want %v (tol %g)", i, j, got, want, tol)
			}
		}
	}
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
		s.check(t, "s")
		for i, v := range s.v {
			if want := float32(0); i%7 >= 4 {
				if math.Float32bits(v) != math.Float32bits(guard) {
					t.Errorf("s padding [%d] written", i)
				}
			} else if v != want {
				t.Errorf("s[%d] = %v, want 0", i, v)
			}
		}
	})
}

// dotRows16Kernels are the DotRows kernels with 16-bit keys, with the
// conversion of a float32 to the key type and the widening of a key.
var dotRows16Kernels = []struct {
	name   string
	f      func(impl implementation) func(s []float32, lds int, q []float32, ldq, rows int, k []uint16, ldk, n, d int)
	narrow func(x float32) uint16
	widen  func(h uint16) float32
}{
	{
		"bf16",
		func(impl implementation) func([]float32, int, []float32, int, int, []uint16, int, int, int) {
			return impl.dotRowsBF16
		},
		half.F32ToBF16, half.BF16ToF32,
	},
	{
		"f16",
		func(impl implementation) func([]float32, int, []float32, int, int, []uint16, int, int, int) {
			return impl.dotRowsF16
		},
		half.F32ToF16, half.F16ToF32,
	},
}

// dotRows16Case is one DotRowsBF16 or DotRowsF16 problem: q with NaN in
// the padding of each row and around it, k with guard16 (a NaN in both
// formats) there, s all guard values before the call.
type dotRows16Case struct {
	rows, n, d, lds, ldq, ldk int
	s, q                      guarded
	k                         guarded16
	kSrc                      []uint16
	widen                     func(uint16) float32
}

func newDotRows16Case(r *rand.Rand, rows, n, d, lds, ldq, ldk int, narrow func(float32) uint16, widen func(uint16) float32) *dotRows16Case {
	c := &dotRows16Case{rows: rows, n: n, d: d, lds: lds, ldq: ldq, ldk: ldk, widen: widen}
	size := func(rows, cols, ld int) int {
		if rows == 0 || cols == 0 {
			return 0
		}
		return (rows-1)*ld + cols
	}
	c.s = newGuarded(size(rows, n, lds))
	c.q = newGuarded(size(rows, d, ldq))
	for i := range rows {
		for p := range d {
			c.q.v[i*ldq+p] = 2*r.Float32() - 1
		}
	}
	c.kSrc = make([]uint16, size(n, d, ldk))
	for i := range c.kSrc {
		c.kSrc[i] = guard16
	}
	for j := range n {
		for p := range d {
			x := 2*r.Float32() - 1
			if r.IntN(8) == 0 { // subnormal halves, and tiny bf16
				x *= 0x1p-20
			}
			c.kSrc[j*ldk+p] = narrow(x)
		}
	}
	c.k = guardedCopy16(c.kSrc)
	return c
}

func (c *dotRows16Case) check(t *testing.T) {
	t.Helper()
	c.s.check(t, "s")
	c.q.check(t, "q")
	c.k.unchanged(t, c.kSrc)
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
				v := float64(c.q.v[i*c.ldq+p]) * float64(c.widen(c.kSrc[j*c.ldk+p]))
				want += v
				abs += math.Abs(v)
			}
			if tol := float64(c.d+2) * 0x1p-24 * abs; !(math.Abs(float64(got)-want) <= tol) {
				t.Fatalf("s[%d][%d] = %v, want %v (tol %g)", i, j, got, want, tol)
			}
		}
	}
}

func TestDotRows16(t *testing.T) {
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
	r := rand.New(rand.NewPCG(25, 26))
	for _, kern := range dotRows16Kernels {
		t.Run(kern.name, func(t *testing.T) {
			forEachImpl(t, func(t *testing.T, impl implementation) {
				f := kern.f(impl)
				run := func(rows, n, d, lds, ldq, ldk int) {
					c := newDotRows16Case(r, rows, n, d, lds, ldq, ldk, kern.narrow, kern.widen)
					checkDotRows(len(c.s.v), lds, len(c.q.v), ldq, rows, len(c.k.v), ldk, n, d)
					f(c.s.v, lds, c.q.v, ldq, rows, c.k.v, ldk, n, d)
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
				run(4, 64, 128, 64, 128, 128)
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
