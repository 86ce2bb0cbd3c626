package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// u4Rows returns n packed rows of stride ld bytes, random codes in the
// first pw bytes of each and 0xff (code 15 in both nibbles, which a
// kernel reading past pw would add visibly) after them.
func u4Rows(r *rand.Rand, n, ld, pw int) []uint8 {
	k := make([]uint8, max(0, (n-1)*ld+pw))
	for j := range n {
		for i := range ld {
			if j*ld+i >= len(k) {
				break
			}
			if i < pw {
				k[j*ld+i] = uint8(r.Uint32())
			} else {
				k[j*ld+i] = 0xff
			}
		}
	}
	return k
}

// dotRowsU4Q8Impl is DotRowsU4Q8 through impl's kernel.
func dotRowsU4Q8Impl(impl implementation, s []float32, lds int, q []float32, ldq, rows int, scale, zero []float32, k []uint8, ldk, n, d, pw int) {
	for r0 := 0; r0 < rows; r0 += 4 {
		impl.dotRowsU4Q8(s[r0*lds:], lds, q[r0*ldq:], ldq, min(4, rows-r0), scale, zero, k, ldk, n, d, pw)
	}
}

// TestDotRowsU4Q8 checks every family's DotRowsU4Q8 against the Go
// definition, bit for bit, over half widths that are and are not
// multiples of the 64-byte chunk, d below, at and above pw, key counts
// around the blocks of 16 and 1 to 6 query rows (the kernels take 4 at
// a time). It also checks the definition against float64 products of
// the codes with the unrounded queries, within the int8 rounding bound.
func TestDotRowsU4Q8(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, pw := range []int{8, 16, 24, 64, 72, 136, 256} {
			for _, d := range []int{1, pw - 3, pw, pw + 5, 2*pw - 1, 2 * pw} {
				if d < 1 {
					continue
				}
				for _, n := range []int{1, 5, 16, 17, 45} {
					rows := 1 + r.IntN(6)
					ldk, ldq, lds := pw+8*r.IntN(2), d+r.IntN(3), n+r.IntN(5)
					k := u4Rows(r, n, ldk, pw)
					q := make([]float32, (rows-1)*ldq+d)
					for i := range q {
						q[i] = float32(r.NormFloat64()) * []float32{1, 1e-30, 3e4}[r.IntN(3)]
					}
					// Channel scales of every size, some 0 (a constant
					// channel), and zeros.
					scale, zero := make([]float32, d), make([]float32, d)
					for c := range scale {
						scale[c] = r.Float32() * []float32{1, 0, 30, 1e-3}[r.IntN(4)]
						zero[c] = float32(r.NormFloat64())
					}
					want := make([]float32, (rows-1)*lds+n)
					got := make([]float32, len(want))
					dotRowsU4Q8Generic(want, lds, q, ldq, rows, scale, zero, k, ldk, n, d, pw)
					dotRowsU4Q8Impl(impl, got, lds, q, ldq, rows, scale, zero, k, ldk, n, d, pw)
					name := fmt.Sprintf("pw=%d d=%d n=%d rows=%d", pw, d, n, rows)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s: s[%d] = %v, want %v", name, i, got[i], want[i])
						}
					}
					if impl.name != "generic" {
						continue
					}
					for i := range rows {
						var m float64
						for c, v := range q[i*ldq:][:d] {
							m = max(m, math.Abs(float64(v)*float64(scale[c])))
						}
						for j := range n {
							var exact, bound float64
							for c := range d {
								code := float64(k[j*ldk+c%pw] & 15)
								if c >= pw {
									code = float64(k[j*ldk+c-pw] >> 4)
								}
								qc := float64(q[i*ldq+c])
								exact += qc*float64(zero[c]) + qc*float64(scale[c])*code
								// The codes count from 8, and the rest
								// goes in as q·(zero + 8·scale).
								mid := float64(zero[c]) + 8*float64(scale[c])
								bound += math.Abs(code-8)*m/254 + 1e-6*math.Abs(qc*mid)
							}
							if e := math.Abs(float64(want[i*lds+j]) - exact); e > 1.01*bound+1e-6*math.Abs(exact)+1e-30 {
								t.Fatalf("%s: s[%d][%d] = %v, exact %v: error %.3g > bound %.3g", name, i, j, want[i*lds+j], exact, e, bound)
							}
						}
					}
				}
			}
		}
	})
}

// TestDotRowsU4Q8Special checks rows of zeros (scores 0 exactly) and a
// NaN or an infinity among a row's values (that row's scores NaN, the
// others not).
func TestDotRowsU4Q8Special(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		const pw, d, n, rows = 64, 120, 20, 3
		k := u4Rows(r, n, pw, pw)
		for _, bad := range []float32{0, float32(math.NaN()), float32(math.Inf(-1))} {
			q := make([]float32, rows*d)
			for i := d; i < len(q); i++ {
				q[i] = float32(r.NormFloat64())
			}
			if bad != 0 {
				q[2*d+d-1] = bad
			}
			scale, zero := make([]float32, d), make([]float32, d)
			for c := range scale {
				scale[c], zero[c] = r.Float32(), float32(r.NormFloat64())
			}
			s := make([]float32, rows*n)
			dotRowsU4Q8Impl(impl, s, n, q, d, rows, scale, zero, k, pw, n, d, pw)
			for j := range n {
				if s[j] != 0 {
					t.Fatalf("bad=%v: zero query row: s[%d] = %v, want 0", bad, j, s[j])
				}
				if v := s[n+j]; math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("bad=%v: row 1 score %d = %v", bad, j, v)
				}
				if v := s[2*n+j]; math.IsNaN(float64(v)) != (bad != 0) {
					t.Fatalf("bad=%v: row 2 score %d = %v", bad, j, v)
				}
			}
		}
	})
}

// gemmU4BF16Impl is GemmU4BF16 through impl's kernels.
func gemmU4BF16Impl(impl implementation, m, n, k int, a []float32, lda int, rs []float32, b []uint8, ldb int, c []float32, ldc int, hi bool) {
	f := impl.gemmU4BF16[b2i(hi)]
	for i0 := 0; i0 < m; i0 += 4 {
		for p0 := 0; p0 < k; p0 += 256 {
			f(min(4, m-i0), n, min(256, k-p0), a[i0*lda+p0:], lda, rs[p0:], b[p0*ldb:], ldb, c[i0*ldc:], ldc)
		}
	}
}

// TestGemmU4BF16 checks every family's GemmU4BF16 against the Go
// definition, bit for bit, on both halves, over column counts around the
// 64-column blocks, odd and even k around the 256-step chunks, 1 to 6
// rows and row scales of every size (0 and products that flush to zero
// included); and the definition against float64 products within the
// bfloat16 rounding of A times the scales.
func TestGemmU4BF16(t *testing.T) {
	r := rand.New(rand.NewPCG(65, 66))
	forEachImpl(t, func(t *testing.T, impl implementation) {
		for _, hi := range []bool{false, true} {
			for _, n := range []int{8, 16, 24, 56, 64, 72, 136} {
				for _, k := range []int{1, 2, 3, 17, 64, 255, 256, 301, 513} {
					m := 1 + r.IntN(6)
					lda, ldb, ldc := k+r.IntN(3), n+8*r.IntN(2), n+r.IntN(3)
					a := make([]float32, (m-1)*lda+k)
					for i := range a {
						a[i] = r.Float32() * []float32{1, 1e-3, 1e-39}[r.IntN(3)]
					}
					rs := make([]float32, k)
					for p := range rs {
						rs[p] = r.Float32() * []float32{1, 0, 1e3, 1e-20}[r.IntN(4)]
					}
					b := u4Rows(r, k, ldb, n)
					c0 := make([]float32, (m-1)*ldc+n)
					for i := range c0 {
						c0[i] = float32(r.NormFloat64())
					}
					want, got := append([]float32(nil), c0...), append([]float32(nil), c0...)
					for i0 := 0; i0 < m; i0 += 4 {
						for p0 := 0; p0 < k; p0 += 256 {
							gemmU4BF16Generic(min(4, m-i0), n, min(256, k-p0), a[i0*lda+p0:], lda, rs[p0:], b[p0*ldb:], ldb, want[i0*ldc:], ldc, hi)
						}
					}
					gemmU4BF16Impl(impl, m, n, k, a, lda, rs, b, ldb, got, ldc, hi)
					name := fmt.Sprintf("hi=%v n=%d k=%d m=%d", hi, n, k, m)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s: c[%d] = %v, want %v", name, i, got[i], want[i])
						}
					}
					if impl.name != "generic" {
						continue
					}
					for i := range m {
						for j := range n {
							exact, bound := float64(c0[i*ldc+j]), 0.0
							for p := range k {
								code := float64(b[p*ldb+j] & 15)
								if hi {
									code = float64(b[p*ldb+j] >> 4)
								}
								ap := float64(a[i*lda+p]) * float64(rs[p])
								exact += ap * code
								bound += ap * code * 0x1p-8
							}
							if e := math.Abs(float64(want[i*ldc+j]) - exact); e > bound+1e-6*(math.Abs(exact)+1) {
								t.Fatalf("%s: c[%d][%d] = %v, exact %v: error %.3g > %.3g", name, i, j, want[i*ldc+j], exact, e, bound)
							}
						}
					}
				}
			}
		}
	})
}

// TestRoundBF16 checks RoundBF16 on ties, subnormals, infinities and
// NaN against the conversion of WidenBF16's inverse.
func TestRoundBF16(t *testing.T) {
	for _, tc := range []struct{ in, want float32 }{
		{1, 1},
		{math.Float32frombits(0x3f808000), 1}, // tie to even (down)
		{math.Float32frombits(0x3f818000), math.Float32frombits(0x3f820000)}, // tie to even (up)
		{math.Float32frombits(0x3f808001), math.Float32frombits(0x3f810000)}, // above the tie
		{math.Float32frombits(0x00400000), 0},                                // subnormal
		{math.Float32frombits(0x80400000), float32(math.Copysign(0, -1))},    // negative subnormal
		{float32(math.Inf(1)), float32(math.Inf(1))},                         // infinity
		{math.MaxFloat32, float32(math.Inf(1))},                              // rounds up to infinity
		{math.Float32frombits(0x7f800001), math.Float32frombits(0x7fc00000)}, // signalling NaN made quiet
	} {
		got := RoundBF16(tc.in)
		if math.Float32bits(got) != math.Float32bits(tc.want) {
			t.Errorf("RoundBF16(%#x) = %#x, want %#x", math.Float32bits(tc.in), math.Float32bits(got), math.Float32bits(tc.want))
		}
	}
}

// TestU4NativeArgumentChecks checks that sizes the kernels would read or
// write past panic in the Go wrappers, before any assembly runs.
func TestU4NativeArgumentChecks(t *testing.T) {
	s, q, f := make([]float32, 64), make([]float32, 64), make([]float32, 64)
	k := make([]uint8, 256)
	for _, tc := range []struct {
		name string
		call func()
	}{
		{"DotRowsU4Q8 d > 2·pw", func() { DotRowsU4Q8(s, 4, q, 40, 1, f, f, k, 16, 4, 40, 16) }},
		{"DotRowsU4Q8 pw not a multiple of 8", func() { DotRowsU4Q8(s, 4, q, 20, 1, f, f, k, 12, 4, 20, 12) }},
		{"DotRowsU4Q8 pw > 256", func() { DotRowsU4Q8(s, 1, q, 8, 1, f, f, make([]uint8, 264), 264, 1, 8, 264) }},
		{"DotRowsU4Q8 short q", func() { DotRowsU4Q8(s, 4, q[:30], 20, 2, f, f, k, 16, 4, 20, 16) }},
		{"DotRowsU4Q8 short k", func() { DotRowsU4Q8(s, 4, q, 20, 1, f, f, k[:40], 16, 4, 20, 16) }},
		{"DotRowsU4Q8 short scale", func() { DotRowsU4Q8(s, 4, q, 20, 1, f[:10], f, k, 16, 4, 20, 16) }},
		{"GemmU4BF16 short rs", func() { GemmU4BF16(1, 8, 4, q, 4, f[:3], k, 8, s, 8, false) }},
		{"GemmU4BF16 n%8", func() { GemmU4BF16(1, 12, 4, q, 4, f, k, 12, s, 12, true) }},
		{"GemmU4BF16 short B", func() { GemmU4BF16(1, 8, 4, q, 4, f, k[:30], 8, s, 8, false) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", tc.name)
				}
			}()
			tc.call()
		}()
	}
}
