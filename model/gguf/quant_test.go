package gguf

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/half"
)

// The tests here describe each quantised type twice over, independently of
// the decoders in quant.go: a packer written from the packing loops of
// ggml's quantize_row_*_ref (the decoders follow its dequantize_row_*),
// and the value formula of ggml-common.h's comments with ggml's float32
// operation order.

// qblock is one block in the terms of its formula: codes and sub-block
// scales as the formula uses them (signed where ggml's are).
type qblock struct {
	d, dmin uint16 // binary16 scale and min (Q4_1 and Q5_1: d and m)
	sc, mn  []int  // per sub-block scale and min; {0} for single-scale types
	q       []int  // per value
}

// qspec describes one quantised type for the tests.
type qspec struct {
	t          TensorType
	n, sub     int // values per block and per sub-block
	qlo, qhi   int // code range
	sclo, schi int // sub-block scale range
	mnhi       int // sub-block mins are 0 to mnhi
	hasMin     bool
	// value is ggml's formula in its float32 order; alt multiplies in
	// another order (only where a signed sub-block scale makes the sign
	// of a zero depend on it); exact is the formula in float64.
	value, alt func(d, m float32, sc, mn, q int) float32
	exact      func(d, m float64, sc, mn, q int) float64
	pack       func(b *qblock) []byte
	// params picks the scales of the reference quantiser (codes then go
	// to the nearest value); bound is the error it may make per value.
	params func(x []float32) *qblock
	bound  func(x []float32) []float64
	// stable: quantising the dequantised values again gives the same
	// bytes (the scale is recovered exactly from the largest value).
	stable bool
}

func fv(h uint16) float32 { return half.F16ToF32(h) }

func (s *qspec) val(b *qblock, i, q int) float32 {
	j := i / s.sub
	return s.value(fv(b.d), fv(b.dmin), b.sc[j], b.mn[j], q)
}

// codes sets b.q to the code whose decoded value is nearest each x.
func (s *qspec) codes(x []float32, b *qblock) {
	b.q = make([]int, s.n)
	for i, v := range x {
		best := math.Inf(1)
		for q := s.qlo; q <= s.qhi; q++ {
			if e := math.Abs(float64(s.val(b, i, q)) - float64(v)); e < best {
				best, b.q[i] = e, q
			}
		}
	}
}

// quant is the reference quantiser: round to nearest under simple scales.
func (s *qspec) quant(x []float32) []byte {
	var out []byte
	for o := 0; o < len(x); o += s.n {
		b := s.params(x[o : o+s.n])
		s.codes(x[o:o+s.n], b)
		out = append(out, s.pack(b)...)
	}
	return out
}

func le16b(v uint16) []byte { return []byte{byte(v), byte(v >> 8)} }

// nibbles packs 32 codes as ggml's 32-value blocks do: value j in the
// low nibble of byte j, value j+16 in its high nibble.
func nibbles(q []int) []byte {
	out := make([]byte, 16)
	for j := range 16 {
		out[j] = byte(q[j]&0xf | (q[j+16]&0xf)<<4)
	}
	return out
}

// fifthBits is Q5_0's and Q5_1's qh: bit i is the fifth bit of value i.
func fifthBits(q []int) []byte {
	var qh uint32
	for i, v := range q {
		qh |= uint32(v>>4&1) << i
	}
	return []byte{byte(qh), byte(qh >> 8), byte(qh >> 16), byte(qh >> 24)}
}

// twoBits packs 256 two-bit codes as Q2_K's and Q3_K's qs.
func twoBits(L []int) []byte {
	qs := make([]byte, 64)
	for j := 0; j < 256; j += 128 {
		for l := range 32 {
			qs[j/4+l] = byte(L[j+l] | L[j+l+32]<<2 | L[j+l+64]<<4 | L[j+l+96]<<6)
		}
	}
	return qs
}

// k4Scales packs eight 6-bit scales and mins as Q4_K's and Q5_K's 12 bytes.
func k4Scales(sc, mn []int) []byte {
	s := make([]byte, 12)
	for j := range 8 {
		ls, lm := byte(sc[j]), byte(mn[j])
		if j < 4 {
			s[j] = ls
			s[j+4] = lm
		} else {
			s[j+4] = ls&0xf | (lm&0xf)<<4
			s[j-4] |= (ls >> 4) << 6
			s[j] |= (lm >> 4) << 6
		}
	}
	return s
}

func cat(parts ...[]byte) []byte { return slices.Concat(parts...) }

// Formulas in ggml's order.
func symValue(off int) func(d, m float32, sc, mn, q int) float32 {
	return func(d, m float32, sc, mn, q int) float32 { return float32(q-off) * d }
}

func affineValue(d, m float32, sc, mn, q int) float32 { return float32(float32(q)*d) + m }

func kAffineValue(d, dmin float32, sc, mn, q int) float32 {
	dl, ml := d*float32(sc), dmin*float32(mn)
	return float32(dl*float32(q)) - ml
}

func kSymValue(off int) func(d, m float32, sc, mn, q int) float32 {
	return func(d, m float32, sc, mn, q int) float32 { return d * float32(sc) * float32(q-off) }
}

func kSymAlt(off int) func(d, m float32, sc, mn, q int) float32 {
	return func(d, m float32, sc, mn, q int) float32 { return d * float32(sc*(q-off)) }
}

func symExact(off int) func(d, m float64, sc, mn, q int) float64 {
	return func(d, m float64, sc, mn, q int) float64 { return float64(q-off) * d }
}

func affineExact(d, m float64, sc, mn, q int) float64 { return float64(q)*d + m }

func kAffineExact(d, m float64, sc, mn, q int) float64 { return d*float64(sc*q) - m*float64(mn) }

func kSymExact(off int) func(d, m float64, sc, mn, q int) float64 {
	return func(d, m float64, sc, mn, q int) float64 { return d * float64(sc*(q-off)) }
}

func iq4Value(d, m float32, sc, mn, q int) float32 { return d * float32(iq4nlValues[q]) }

func iq4xsValue(d, m float32, sc, mn, q int) float32 {
	return d * float32(sc) * float32(iq4nlValues[q])
}

func iq4xsAlt(d, m float32, sc, mn, q int) float32 {
	return d * float32(sc*int(iq4nlValues[q]))
}

func iq4Exact(d, m float64, sc, mn, q int) float64 { return d * float64(iq4nlValues[q]) }

func iq4xsExact(d, m float64, sc, mn, q int) float64 { return d * float64(sc*int(iq4nlValues[q])) }

// f16up rounds v ≥ 0 to binary16, upwards, so a scale derived from it
// never falls short of v.
func f16up(v float64) uint16 {
	h := half.F32ToF16(float32(v))
	if float64(fv(h)) < v {
		h++
	}
	return h
}

func amaxOf(x []float32) (amax, ext float32) {
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, ext = a, v
		}
	}
	return amax, ext
}

// symParams: d = the extreme value over div (signed, as ggml's Q4_0, Q5_0
// and IQ4_NL put the extreme at the most negative code), or amax over div
// for Q8_0.
func symParams(div float32, signed bool) func(x []float32) *qblock {
	return func(x []float32) *qblock {
		amax, ext := amaxOf(x)
		if !signed {
			ext = amax
		}
		return &qblock{d: half.F32ToF16(ext / div), sc: []int{0}, mn: []int{0}}
	}
}

func symBound(levels float64) func(x []float32) []float64 {
	return func(x []float32) []float64 {
		amax, _ := amaxOf(x)
		return fill(len(x), float64(amax)*levels*(1+1.0/128))
	}
}

func fill(n int, v float64) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = v
	}
	return b
}

func minMax(x []float32) (lo, hi float32) {
	lo, hi = x[0], x[0]
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// affineParams: Q4_1 and Q5_1, m = min, d = (max−min)/L.
func affineParams(L float32) func(x []float32) *qblock {
	return func(x []float32) *qblock {
		lo, hi := minMax(x)
		return &qblock{d: half.F32ToF16((hi - lo) / L), dmin: half.F32ToF16(lo), sc: []int{0}, mn: []int{0}}
	}
}

func affineBound(L float64) func(x []float32) []float64 {
	return func(x []float32) []float64 {
		lo, hi := minMax(x)
		r := float64(hi - lo)
		return fill(len(x), 0.5*r/L+(math.Abs(float64(lo))+r)/1024+1e-7)
	}
}

// kAffineParams: per sub-block j the values must fit in [−M_j, L·D_j −
// M_j] with M_j = dmin·mn_j and D_j = d·sc_j. The mins are quantised
// upwards first, then the scales upwards to cover the rest, so nothing
// is clipped and the error is at most D_j/2.
func kAffineParams(sub int, L, scmax, mnmax float64) func(x []float32) *qblock {
	return func(x []float32) *qblock {
		nb := len(x) / sub
		b := &qblock{sc: make([]int, nb), mn: make([]int, nb)}
		m := make([]float64, nb)
		hi := make([]float64, nb)
		var maxm float64
		for j := range nb {
			lo, h := minMax(x[j*sub : (j+1)*sub])
			m[j], hi[j] = -min(0, float64(lo)), float64(h)
			maxm = max(maxm, m[j])
		}
		b.dmin = f16up(maxm / mnmax)
		s := make([]float64, nb)
		var maxs float64
		for j := range nb {
			if b.dmin != 0 {
				b.mn[j] = int(min(mnmax, math.Ceil(m[j]/float64(fv(b.dmin)))))
			}
			M := float64(fv(b.dmin) * float32(b.mn[j]))
			s[j] = max(0, (hi[j]+M)/L)
			maxs = max(maxs, s[j])
		}
		b.d = f16up(maxs / scmax)
		for j := range nb {
			if b.d != 0 {
				b.sc[j] = int(min(scmax, math.Ceil(s[j]/float64(fv(b.d)))))
			}
		}
		return b
	}
}

func kAffineBound(sub int, L, scmax, mnmax float64) func(x []float32) []float64 {
	return func(x []float32) []float64 {
		nb := len(x) / sub
		r := make([]float64, nb)
		var maxm, maxr, amax float64
		for j := range nb {
			lo, hi := minMax(x[j*sub : (j+1)*sub])
			r[j] = float64(hi) - min(0, float64(lo))
			maxm = max(maxm, -min(0, float64(lo)))
			maxr = max(maxr, r[j])
			amax = max(amax, math.Abs(float64(lo)), math.Abs(float64(hi)))
		}
		dm := maxm / mnmax * (1 + 1.0/512)
		dd := (maxr + dm) / L / scmax * (1 + 1.0/512)
		out := make([]float64, len(x))
		for i := range out {
			out[i] = 0.5*((r[i/sub]+dm)/L+dd)*(1+1e-6) + 1e-6*amax
		}
		return out
	}
}

// kSymParams: per sub-block the scale S_j = extreme/−div (the extreme at
// the most negative code, as ggml does), quantised away from zero as
// d·k_j with |k_j| ≤ kmax.
func kSymParams(sub int, div, kmax float64) func(x []float32) *qblock {
	return func(x []float32) *qblock {
		nb := len(x) / sub
		b := &qblock{sc: make([]int, nb), mn: make([]int, nb)}
		S := make([]float64, nb)
		var maxS float64
		for j := range nb {
			_, ext := amaxOf(x[j*sub : (j+1)*sub])
			S[j] = float64(ext) / -div
			maxS = max(maxS, math.Abs(S[j]))
		}
		b.d = f16up(maxS / kmax)
		for j := range nb {
			if b.d != 0 {
				k := min(kmax, math.Ceil(math.Abs(S[j])/float64(fv(b.d))))
				b.sc[j] = int(math.Copysign(k, S[j]))
			}
		}
		return b
	}
}

// kSymBound: |D_j| ≤ |S_j| + d; values on the short side of the code
// range may clip by up to one step (levels steps for IQ4_XS's levels).
func kSymBound(sub int, div, kmax, steps float64) func(x []float32) []float64 {
	return func(x []float32) []float64 {
		nb := len(x) / sub
		S := make([]float64, nb)
		var maxS float64
		for j := range nb {
			a, _ := amaxOf(x[j*sub : (j+1)*sub])
			S[j] = float64(a) / div
			maxS = max(maxS, S[j])
		}
		dd := maxS / kmax * (1 + 1.0/512)
		out := make([]float64, len(x))
		for i := range out {
			out[i] = steps*(S[i/sub]+dd)*(1+1e-6) + 1e-6*maxS*div
		}
		return out
	}
}

var qspecs = []*qspec{
	{t: Q4_0, n: 32, sub: 32, qhi: 15, value: symValue(8), exact: symExact(8),
		pack:   func(b *qblock) []byte { return cat(le16b(b.d), nibbles(b.q)) },
		params: symParams(-8, true), bound: symBound(1.0 / 8), stable: true},
	{t: Q4_1, n: 32, sub: 32, qhi: 15, hasMin: true, value: affineValue, exact: affineExact,
		pack:   func(b *qblock) []byte { return cat(le16b(b.d), le16b(b.dmin), nibbles(b.q)) },
		params: affineParams(15), bound: affineBound(15)},
	{t: Q5_0, n: 32, sub: 32, qhi: 31, value: symValue(16), exact: symExact(16),
		pack:   func(b *qblock) []byte { return cat(le16b(b.d), fifthBits(b.q), nibbles(b.q)) },
		params: symParams(-16, true), bound: symBound(1.0 / 16), stable: true},
	{t: Q5_1, n: 32, sub: 32, qhi: 31, hasMin: true, value: affineValue, exact: affineExact,
		pack: func(b *qblock) []byte {
			return cat(le16b(b.d), le16b(b.dmin), fifthBits(b.q), nibbles(b.q))
		},
		params: affineParams(31), bound: affineBound(31)},
	{t: Q8_0, n: 32, sub: 32, qlo: -128, qhi: 127, value: symValue(0), exact: symExact(0),
		pack: func(b *qblock) []byte {
			out := le16b(b.d)
			for _, q := range b.q {
				out = append(out, byte(int8(q)))
			}
			return out
		},
		params: symParams(127, false), bound: symBound(0.5/127 + 1.0/2048), stable: true},
	{t: Q2_K, n: 256, sub: 16, qhi: 3, schi: 15, mnhi: 15, hasMin: true, value: kAffineValue, exact: kAffineExact,
		pack: func(b *qblock) []byte {
			scales := make([]byte, 16)
			for j := range scales {
				scales[j] = byte(b.sc[j] | b.mn[j]<<4)
			}
			return cat(scales, twoBits(b.q), le16b(b.d), le16b(b.dmin))
		},
		params: kAffineParams(16, 3, 15, 15), bound: kAffineBound(16, 3, 15, 15)},
	{t: Q3_K, n: 256, sub: 16, qlo: 0, qhi: 7, sclo: -32, schi: 31, value: kSymValue(4), alt: kSymAlt(4), exact: kSymExact(4),
		pack: func(b *qblock) []byte {
			hmask := make([]byte, 32)
			L := make([]int, 256)
			for i, q := range b.q {
				L[i] = q
				if L[i] > 3 {
					hmask[i%32] |= 1 << (i / 32)
					L[i] -= 4
				}
			}
			scales := make([]byte, 12)
			for j, s := range b.sc {
				l := byte(s + 32)
				if j < 8 {
					scales[j] |= l & 0xf
				} else {
					scales[j-8] |= (l & 0xf) << 4
				}
				scales[8+j%4] |= (l >> 4) << (2 * (j / 4))
			}
			return cat(hmask, twoBits(L), scales, le16b(b.d))
		},
		params: kSymParams(16, 4, 31), bound: kSymBound(16, 4, 31, 1)},
	{t: Q4_K, n: 256, sub: 32, qhi: 15, schi: 63, mnhi: 63, hasMin: true, value: kAffineValue, exact: kAffineExact,
		pack: func(b *qblock) []byte {
			qs := make([]byte, 128)
			for c := range 4 {
				for l := range 32 {
					qs[32*c+l] = byte(b.q[64*c+l] | b.q[64*c+l+32]<<4)
				}
			}
			return cat(le16b(b.d), le16b(b.dmin), k4Scales(b.sc, b.mn), qs)
		},
		params: kAffineParams(32, 15, 63, 63), bound: kAffineBound(32, 15, 63, 63)},
	{t: Q5_K, n: 256, sub: 32, qhi: 31, schi: 63, mnhi: 63, hasMin: true, value: kAffineValue, exact: kAffineExact,
		pack: func(b *qblock) []byte {
			qh, qs := make([]byte, 32), make([]byte, 128)
			m1, m2 := byte(1), byte(2)
			for c := range 4 {
				for l := range 32 {
					l1, l2 := b.q[64*c+l], b.q[64*c+l+32]
					if l1 > 15 {
						l1 -= 16
						qh[l] |= m1
					}
					if l2 > 15 {
						l2 -= 16
						qh[l] |= m2
					}
					qs[32*c+l] = byte(l1 | l2<<4)
				}
				m1 <<= 2
				m2 <<= 2
			}
			return cat(le16b(b.d), le16b(b.dmin), k4Scales(b.sc, b.mn), qh, qs)
		},
		params: kAffineParams(32, 31, 63, 63), bound: kAffineBound(32, 31, 63, 63)},
	{t: Q6_K, n: 256, sub: 16, qhi: 63, sclo: -128, schi: 127, value: kSymValue(32), alt: kSymAlt(32), exact: kSymExact(32),
		pack: func(b *qblock) []byte {
			ql, qh, scales := make([]byte, 128), make([]byte, 64), make([]byte, 16)
			L := b.q
			for h := range 2 {
				j := 128 * h
				for l := range 32 {
					ql[64*h+l] = byte(L[j+l]&0xf | (L[j+l+64]&0xf)<<4)
					ql[64*h+l+32] = byte(L[j+l+32]&0xf | (L[j+l+96]&0xf)<<4)
					qh[32*h+l] = byte(L[j+l]>>4 | (L[j+l+32]>>4)<<2 | (L[j+l+64]>>4)<<4 | (L[j+l+96]>>4)<<6)
				}
			}
			for j, s := range b.sc {
				scales[j] = byte(int8(s))
			}
			return cat(ql, qh, scales, le16b(b.d))
		},
		params: kSymParams(16, 32, 127), bound: kSymBound(16, 32, 127, 1)},
	{t: IQ4_NL, n: 32, sub: 32, qhi: 15, value: iq4Value, exact: iq4Exact,
		pack:   func(b *qblock) []byte { return cat(le16b(b.d), nibbles(b.q)) },
		params: symParams(-127, true), bound: symBound(14.0 / 127), stable: true},
	{t: IQ4_XS, n: 256, sub: 32, qhi: 15, sclo: -32, schi: 31, value: iq4xsValue, alt: iq4xsAlt, exact: iq4xsExact,
		pack: func(b *qblock) []byte {
			var sh uint16
			sl, qs := make([]byte, 4), make([]byte, 128)
			for ib, s := range b.sc {
				l := s + 32
				sl[ib/2] |= byte(l&0xf) << (4 * (ib % 2))
				sh |= uint16(l>>4) << (2 * ib)
				copy(qs[16*ib:], nibbles(b.q[32*ib:]))
			}
			return cat(le16b(b.d), le16b(sh), sl, qs)
		},
		params: kSymParams(32, 127, 31), bound: kSymBound(32, 127, 31, 14)},
}

// TestLayouts checks the block sizes against ggml's type traits.
func TestLayouts(t *testing.T) {
	want := map[TensorType][2]int{
		F32: {1, 4}, F16: {1, 2}, BF16: {1, 2}, Q4_0: {32, 18}, Q4_1: {32, 20}, Q5_0: {32, 22},
		Q5_1: {32, 24}, Q8_0: {32, 34}, Q2_K: {256, 84}, Q3_K: {256, 110}, Q4_K: {256, 144},
		Q5_K: {256, 176}, Q6_K: {256, 210}, IQ4_NL: {32, 18}, IQ4_XS: {256, 136},
	}
	var worst float64
	for typ, l := range layouts {
		w, ok := want[typ]
		if ok != typ.Readable() {
			t.Errorf("%v: Readable = %v", typ, typ.Readable())
		}
		if !ok {
			continue
		}
		vals, bytes, ok := typ.BlockSize()
		if !ok || vals != w[0] || bytes != w[1] || l.vals != w[0] || l.bytes != w[1] {
			t.Errorf("%v: block of %d values in %d bytes, want %d in %d", typ, vals, bytes, w[0], w[1])
		}
		if n, err := EncodedLen(typ, 3*vals); n != 3*bytes || err != nil {
			t.Errorf("%v: EncodedLen = %d, %v", typ, n, err)
		}
		if _, err := EncodedLen(typ, vals+1); vals > 1 && !errors.Is(err, attn.ErrInput) {
			t.Errorf("%v: EncodedLen of a partial block: %v", typ, err)
		}
		worst = max(worst, 4*float64(vals)/float64(bytes))
	}
	for typ := range want {
		if !typ.Readable() {
			t.Errorf("%v is not Readable", typ)
		}
	}
	if worst > maxExpansion || worst < maxExpansion-1 {
		t.Errorf("largest expansion %.2f, maxExpansion %d", worst, maxExpansion)
	}
	if len(qspecs) != len(want)-3 {
		t.Errorf("%d quantised types tested, %d readable", len(qspecs), len(want)-3)
	}
}

func randF16(rng *rand.Rand) uint16 {
	// Normal binary16 values from 2^-10 to 2^5, either sign, all mantissas.
	return uint16(rng.IntN(2))<<15 | uint16(5+rng.IntN(16))<<10 | uint16(rng.IntN(1024))
}

// TestDequantFormulas builds blocks byte by byte from known scales and
// codes and checks every decoded value bit for bit against ggml's
// formula in ggml's float32 order. It also checks that value against the
// formula evaluated exactly and rounded once: every product is exact in
// float32, so no order or fusion can change a value but for the sign of
// a zero, and where that sign depends on the order (signed sub-block
// scales) the other order must differ somewhere in the data, so the
// bitwise check tells them apart.
func TestDequantFormulas(t *testing.T) {
	seed := uint64(21)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, s := range qspecs {
		const blocks = 40
		var raw []byte
		var bs []*qblock
		for range blocks {
			b := &qblock{d: randF16(rng), sc: make([]int, s.n/s.sub), mn: make([]int, s.n/s.sub), q: make([]int, s.n)}
			if s.hasMin {
				b.dmin = randF16(rng)
			}
			for j := range b.sc {
				b.sc[j] = s.sclo + rng.IntN(s.schi-s.sclo+1)
				b.mn[j] = rng.IntN(s.mnhi + 1)
			}
			for i := range b.q {
				b.q[i] = s.qlo + rng.IntN(s.qhi-s.qlo+1)
			}
			bs = append(bs, b)
			raw = append(raw, s.pack(b)...)
		}
		if n, _ := EncodedLen(s.t, blocks*s.n); n != len(raw) {
			t.Fatalf("%v: packed %d bytes, want %d", s.t, len(raw), n)
		}
		got := make([]float32, blocks*s.n)
		if err := Decode(got, raw, s.t); err != nil {
			t.Fatal(err)
		}
		bad, differ := 0, 0
		for k, b := range bs {
			for i, q := range b.q {
				want := s.val(b, i, q)
				g := got[k*s.n+i]
				if math.Float32bits(g) != math.Float32bits(want) {
					if bad++; bad <= 3 {
						t.Errorf("%v block %d value %d: %v (%#x), want %v (%#x)", s.t, k, i, g, math.Float32bits(g), want, math.Float32bits(want))
					}
				}
				j := i / s.sub
				if ex := float32(s.exact(float64(fv(b.d)), float64(fv(b.dmin)), b.sc[j], b.mn[j], q)); ex != want {
					if bad++; bad <= 3 {
						t.Errorf("%v block %d value %d: formula gives %v, exactly rounded %v", s.t, k, i, want, ex)
					}
				}
				if s.alt != nil && math.Float32bits(s.alt(fv(b.d), fv(b.dmin), b.sc[j], b.mn[j], q)) != math.Float32bits(want) {
					differ++
				}
			}
		}
		if s.alt != nil && differ == 0 {
			t.Errorf("%v: the other operation order never differs; the test cannot tell them apart", s.t)
		}
		// One byte short or long, or a partial block, is an error.
		for _, c := range []struct{ vals, bytes int }{{s.n, len(raw)/blocks - 1}, {s.n, len(raw)/blocks + 1}, {s.n - 1, len(raw) / blocks}} {
			if err := Decode(got[:c.vals], raw[:c.bytes], s.t); !errors.Is(err, ErrFormat) {
				t.Errorf("%v: %d values from %d bytes: %v", s.t, c.vals, c.bytes, err)
			}
		}
	}
}

// quantData is blocks of test data: an all-zero block, a block with a
// zero sub-block, a constant one and non-negative values, then normal
// values of varying scale with an outlier, and an all-negative block.
func quantData(rng *rand.Rand, s *qspec, blocks int) []float32 {
	x := make([]float32, blocks*s.n)
	for k := range blocks {
		b := x[k*s.n : (k+1)*s.n]
		scale := float32(math.Exp(rng.NormFloat64()))
		for i := range b {
			b[i] = scale * float32(rng.NormFloat64())
		}
		switch {
		case k == 0:
			clear(b)
		case k == 1:
			half := s.sub // a whole sub-block of zeros, one of 0.37
			if s.sub == s.n {
				half = s.n / 4
			}
			clear(b[:half])
			for i := half; i < 2*half; i++ {
				b[i] = 0.37
			}
			for i := 2 * half; i < len(b); i++ {
				b[i] = float32(math.Abs(float64(b[i])))
			}
		case k == blocks-1:
			for i := range b {
				b[i] = -float32(math.Abs(float64(b[i]))) - 0.5
			}
		default:
			b[rng.IntN(len(b))] *= 5
		}
	}
	return x
}

// TestQuantRoundTrip quantises random data with the reference quantiser
// and checks the decoded values against each type's error bound, and that
// the decoded values quantise to the same codes again.
func TestQuantRoundTrip(t *testing.T) {
	seed := uint64(2024)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 6))
	for _, s := range qspecs {
		blocks := 7
		if s.n == 256 {
			blocks = 5
		}
		x := quantData(rng, s, blocks)
		enc := s.quant(x)
		dec := make([]float32, len(x))
		if err := Decode(dec, enc, s.t); err != nil {
			t.Fatal(err)
		}
		var worst float64
		for k := range blocks {
			xb := x[k*s.n : (k+1)*s.n]
			bound := s.bound(xb)
			for i, v := range xb {
				e := math.Abs(float64(dec[k*s.n+i] - v))
				if !(e <= bound[i]) {
					t.Errorf("%v block %d value %d: %v decodes as %v, error %.3g > %.3g", s.t, k, i, v, dec[k*s.n+i], e, bound[i])
				}
				if bound[i] > 0 {
					worst = max(worst, e/bound[i])
				}
			}
			// The decoded values quantise to the same codes under the
			// same scales.
			b := s.params(xb)
			s.codes(xb, b)
			again := *b
			s.codes(dec[k*s.n:(k+1)*s.n], &again)
			if !slices.Equal(again.q, b.q) {
				t.Errorf("%v block %d: decoded values quantise to other codes", s.t, k)
			}
		}
		// A bound far above every error would be no test.
		if worst < 0.3 {
			t.Errorf("%v: largest error is %.2f of the bound", s.t, worst)
		}
		if s.stable {
			if re := s.quant(dec); !bytes.Equal(re, enc) {
				t.Errorf("%v: quantising the decoded values gives other bytes", s.t)
			}
		}
	}
}

// TestDequantLiteral decodes blocks whose bytes are spelled out, against
// values worked out by hand from ggml-common.h's layouts.
func TestDequantLiteral(t *testing.T) {
	type want struct {
		i int
		v float32
	}
	negZero := float32(math.Copysign(0, -1))
	blk := func(n int, set map[int]byte) []byte {
		b := make([]byte, n)
		for o, v := range set {
			b[o] = v
		}
		return b
	}
	for _, c := range []struct {
		t    TensorType
		raw  []byte
		want []want
	}{
		// d = 2; qh bits 0, 16 and 31; qs[0] = 0x21, qs[15] = 0xf0.
		{Q5_0, blk(22, map[int]byte{1: 0x40, 2: 0x01, 4: 0x01, 5: 0x80, 6: 0x21, 21: 0xf0}),
			[]want{{0, 2 * 1}, {16, 2 * 2}, {15, 2 * -16}, {31, 2 * 15}, {1, 2 * -16}}},
		// d = 1, dmin = 0.5; sub-block scales/mins 3/1, 2/4, and for
		// sub-block 4 (upper bits in scales[0]) 17/2.
		{Q4_K, blk(144, map[int]byte{1: 0x3c, 3: 0x38, 4: 0x43, 5: 0x02, 8: 0x01, 9: 0x04, 12: 0x21, 16: 0x79, 16 + 64: 0x05}),
			[]want{{0, 3*9 - 0.5}, {1, -0.5}, {32, 2*7 - 2}, {128, 17*5 - 1}, {160, 0}}},
		// d = 0.5; scales −3, 1, 5 and 0 for sub-blocks 0, 1, 2 and 4;
		// value 64 is (0.5·0)·(−30), a negative zero.
		{Q6_K, blk(210, map[int]byte{209: 0x38, 192: 0xfd, 193: 1, 194: 5, 0: 0x2a, 128: 0x09}),
			[]want{{0, 0.5 * -3 * -6}, {16, 0.5 * 1 * -32}, {32, 0}, {64, negZero}}},
		// d = 1; sub-block 0 scale 37−32, sub-block 2 scale −32, sub-block
		// 8 scale (3 | 1<<4)−32; high bits of values 0 and 128 set.
		{Q3_K, blk(110, map[int]byte{109: 0x3c, 96: 0x35, 104: 0x12, 0: 0x11, 32: 0x01, 64: 0x03}),
			[]want{{0, 5 * 1}, {1, 5 * -4}, {32, -32 * -4}, {128, -13 * 3}}},
		// d = 1; sub-block scales 33−32 and 3−32.
		{IQ4_XS, blk(136, map[int]byte{1: 0x3c, 2: 0x02, 4: 0x31, 8: 0xf0, 24: 0x08}),
			[]want{{0, -127}, {16, 113}, {32, -29 * 1}, {48, -29 * -127}}},
	} {
		vals, _, _ := c.t.BlockSize()
		got := make([]float32, vals)
		if err := Decode(got, c.raw, c.t); err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if math.Float32bits(got[w.i]) != math.Float32bits(w.v) {
				t.Errorf("%v value %d = %v, want %v", c.t, w.i, got[w.i], w.v)
			}
		}
	}
}
