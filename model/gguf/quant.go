package gguf

import (
	"math"

	"github.com/attnkit/attn/internal/half"
)

// The decoders below follow ggml's dequantize_row_* (ggml-quants.c), block
// layouts from ggml-common.h. Each is called with whole blocks only
// (Decode checks the lengths), so the array conversions cannot fail.
//
// Bit-exactness. A scale is a binary16 (11 significant bits) widened
// exactly; a sub-block scale has at most 7 significant bits (Q6_K's int8),
// a code or a level at most 7 (Q8_0's int8, the IQ4 levels), and no type
// has both: every product in these formulas has at most 23 significant
// bits and is exact in float32, whatever the order of the factors (and
// binary16's range keeps it far from float32's overflow and underflow).
// The only rounding is the final addition of the affine types' min
// (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), one correctly rounded float32 operation
// in ggml as here, fused into an FMA or not (the product being exact). So
// the values equal ggml's on every platform. Order can only change the
// sign of a zero result where a sub-block scale is signed (Q3_K, Q6_K,
// IQ4_XS): those keep ggml's (d·sc)·q.

func f16At(b []byte) float32 { return half.F16ToF32(le16(b)) }

func decodeF32(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(le32(src[4*i:]))
	}
}

func decodeF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = half.F16ToF32(le16(src[2*i:]))
	}
}

func decodeBF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = half.BF16ToF32(le16(src[2*i:]))
	}
}

// decodeQ8_0: {half d; int8 qs[32]}, x = q·d.
func decodeQ8_0(dst []float32, src []byte) {
	for b := range len(dst) / 32 {
		blk := (*[34]byte)(src[34*b:])
		out := (*[32]float32)(dst[32*b:])
		d := f16At(blk[0:])
		for i, q := range blk[2:] {
			out[i] = float32(int8(q)) * d
		}
	}
}

// decodeQ4_0: {half d; uint8 qs[16]}; value j is the low nibble of qs[j],
// value j+16 its high nibble; x = (q−8)·d.
func decodeQ4_0(dst []float32, src []byte) {
	for b := range len(dst) / 32 {
		blk := (*[18]byte)(src[18*b:])
		out := (*[32]float32)(dst[32*b:])
		d := f16At(blk[0:])
		for j, q := range blk[2:] {
			out[j] = float32(int(q&0xf)-8) * d
			out[j+16] = float32(int(q>>4)-8) * d
		}
	}
}

// decodeQ4_1: {half d, m; uint8 qs[16]}, nibbles as Q4_0; x = q·d + m.
func decodeQ4_1(dst []float32, src []byte) {
	for b := range len(dst) / 32 {
		blk := (*[20]byte)(src[20*b:])
		out := (*[32]float32)(dst[32*b:])
		d, m := f16At(blk[0:]), f16At(blk[2:])
		for j, q := range blk[4:] {
			out[j] = float32(q&0xf)*d + m
			out[j+16] = float32(q>>4)*d + m
		}
	}
}

// decodeQ5_0: {half d; uint8 qh[4]; uint8 qs[16]}; bit j of the
// little-endian qh is the fifth bit of value j; x = (q−16)·d.
func decodeQ5_0(dst []float32, src []byte) {
	for b := range len(dst) / 32 {
		blk := (*[22]byte)(src[22*b:])
		out := (*[32]float32)(dst[32*b:])
		d := f16At(blk[0:])
		qh := le32(blk[2:])
		for j, q := range blk[6:] {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			out[j] = float32(int(q&0xf|h0)-16) * d
			out[j+16] = float32(int(q>>4|h1)-16) * d
		}
	}
}

// decodeQ5_1: {half d, m; uint8 qh[4]; uint8 qs[16]}; x = q·d + m.
func decodeQ5_1(dst []float32, src []byte) {
	for b := range len(dst) / 32 {
		blk := (*[24]byte)(src[24*b:])
		out := (*[32]float32)(dst[32*b:])
		d, m := f16At(blk[0:]), f16At(blk[2:])
		qh := le32(blk[4:])
		for j, q := range blk[8:] {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			out[j] = float32(q&0xf|h0)*d + m
			out[j+16] = float32(q>>4|h1)*d + m
		}
	}
}

// decodeQ2_K: {uint8 scales[16]; uint8 qs[64]; half d, dmin}. Sub-block i
// (16 values) has scale scales[i]&15 and min scales[i]>>4; each half of the
// super-block takes 32 bytes of qs, whose bit pairs 0-1, 2-3, 4-5, 6-7
// hold four runs of 32 values (two sub-blocks each, bytes 0-15 then
// 16-31). x = (d·sc)·q − dmin·m.
func decodeQ2_K(dst []float32, src []byte) {
	for b := range len(dst) / qkK {
		blk := (*[84]byte)(src[84*b:])
		out := (*[qkK]float32)(dst[qkK*b:])
		d, dmin := f16At(blk[80:]), f16At(blk[82:])
		y, is := 0, 0
		for n := range 2 {
			q := (*[32]byte)(blk[16+32*n:])
			for shift := 0; shift < 8; shift += 2 {
				for h := range 2 {
					sc := blk[is]
					is++
					dl, ml := d*float32(sc&0xf), dmin*float32(sc>>4)
					for _, v := range q[16*h : 16*h+16] {
						out[y] = dl*float32((v>>shift)&3) - ml
						y++
					}
				}
			}
		}
	}
}

// q3Scale is sub-block j's 6-bit scale of a Q3_K block, biased by 32: the
// low nibble in scales[j] (j < 8) or the high nibble of scales[j−8], the
// top two bits at 2·(j/4) of scales[8+j%4]. (ggml unpacks all sixteen at
// once through kmask1/kmask2; the bits are the same.)
func q3Scale(sc *[12]byte, j int) int {
	lo := sc[j&7]
	if j >= 8 {
		lo >>= 4
	}
	hi := sc[8+j%4] >> (2 * (j / 4)) & 3
	return int(lo&0xf|hi<<4) - 32
}

// decodeQ3_K: {uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; half d}.
// The low two bits of a value are laid out as Q2_K's; value i's third bit
// is bit i/32 of hmask[i%32], and a clear bit subtracts 4. x = (d·sc)·q.
func decodeQ3_K(dst []float32, src []byte) {
	for b := range len(dst) / qkK {
		blk := (*[110]byte)(src[110*b:])
		out := (*[qkK]float32)(dst[qkK*b:])
		hm := (*[32]byte)(blk[0:])
		sc := (*[12]byte)(blk[96:])
		d := f16At(blk[108:])
		y, is := 0, 0
		m := byte(1)
		for n := range 2 {
			q := (*[32]byte)(blk[32+32*n:])
			for shift := 0; shift < 8; shift += 2 {
				for h := range 2 {
					dl := d * float32(q3Scale(sc, is))
					is++
					for l := 16 * h; l < 16*h+16; l++ {
						v := int((q[l] >> shift) & 3)
						if hm[l]&m == 0 {
							v -= 4
						}
						out[y] = dl * float32(v)
						y++
					}
				}
				m <<= 1
			}
		}
	}
}

// scaleMinK4 is ggml's get_scale_min_k4: sub-block j's 6-bit scale and
// min in the 12 bytes of a Q4_K or Q5_K block.
func scaleMinK4(q *[12]byte, j int) (sc, m byte) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// decodeQ4_K: {half d, dmin; uint8 scales[12]; uint8 qs[128]}. Eight
// sub-blocks of 32; each 32 bytes of qs hold two of them, low nibbles
// first. x = (d·sc)·q − dmin·m.
func decodeQ4_K(dst []float32, src []byte) {
	for b := range len(dst) / qkK {
		blk := (*[144]byte)(src[144*b:])
		out := (*[qkK]float32)(dst[qkK*b:])
		d, dmin := f16At(blk[0:]), f16At(blk[2:])
		scales := (*[12]byte)(blk[4:])
		for c := range 4 {
			q := (*[32]byte)(blk[16+32*c:])
			y := (*[64]float32)(out[64*c:])
			s1, m1 := scaleMinK4(scales, 2*c)
			s2, m2 := scaleMinK4(scales, 2*c+1)
			d1, min1 := d*float32(s1), dmin*float32(m1)
			d2, min2 := d*float32(s2), dmin*float32(m2)
			for l, v := range q {
				y[l] = d1*float32(v&0xf) - min1
				y[l+32] = d2*float32(v>>4) - min2
			}
		}
	}
}

// decodeQ5_K: {half d, dmin; uint8 scales[12]; uint8 qh[32]; uint8
// qs[128]}: Q4_K with a fifth bit, for the c-th pair of sub-blocks bits 2c
// and 2c+1 of qh[l]. x = (d·sc)·q − dmin·m.
func decodeQ5_K(dst []float32, src []byte) {
	for b := range len(dst) / qkK {
		blk := (*[176]byte)(src[176*b:])
		out := (*[qkK]float32)(dst[qkK*b:])
		d, dmin := f16At(blk[0:]), f16At(blk[2:])
		scales := (*[12]byte)(blk[4:])
		qh := (*[32]byte)(blk[16:])
		for c := range 4 {
			q := (*[32]byte)(blk[48+32*c:])
			y := (*[64]float32)(out[64*c:])
			s1, m1 := scaleMinK4(scales, 2*c)
			s2, m2 := scaleMinK4(scales, 2*c+1)
			d1, min1 := d*float32(s1), dmin*float32(m1)
			d2, min2 := d*float32(s2), dmin*float32(m2)
			u1, u2 := byte(1)<<(2*c), byte(2)<<(2*c)
			for l, v := range q {
				lo, hi := int(v&0xf), int(v>>4)
				if qh[l]&u1 != 0 {
					lo += 16
				}
				if qh[l]&u2 != 0 {
					hi += 16
				}
				y[l] = d1*float32(lo) - min1
				y[l+32] = d2*float32(hi) - min2
			}
		}
	}
}

// decodeQ6_K: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d}. Each
// half of the super-block takes 64 bytes of ql and 32 of qh: value l
// (0 ≤ l < 32) of its four runs of 32 is the low nibble of ql[l], of
// ql[l+32], the high nibble of ql[l], of ql[l+32], with bit pairs 0-1,
// 2-3, 4-5, 6-7 of qh[l] on top; sub-blocks are 16 values.
// x = (d·sc)·(q−32).
func decodeQ6_K(dst []float32, src []byte) {
	for b := range len(dst) / qkK {
		blk := (*[210]byte)(src[210*b:])
		out := (*[qkK]float32)(dst[qkK*b:])
		d := f16At(blk[208:])
		for n := range 2 {
			ql := (*[64]byte)(blk[64*n:])
			qh := (*[32]byte)(blk[128+32*n:])
			sc := (*[8]byte)(blk[192+8*n:])
			y := (*[128]float32)(out[128*n:])
			for l := range 32 {
				is := l / 16
				h := qh[l]
				q1 := int(ql[l]&0xf|(h&3)<<4) - 32
				q2 := int(ql[l+32]&0xf|(h>>2&3)<<4) - 32
				q3 := int(ql[l]>>4|(h>>4&3)<<4) - 32
				q4 := int(ql[l+32]>>4|(h>>6&3)<<4) - 32
				y[l] = d * float32(int8(sc[is])) * float32(q1)
				y[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
				y[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
				y[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
			}
		}
	}
}

// iq4nlValues is ggml's kvalues_iq4nl: the 16 non-uniform levels of
// IQ4_NL and IQ4_XS.
var iq4nlValues = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// decodeIQ4_NL: {half d; uint8 qs[16]}, nibbles as Q4_0; x = d·level[q].
func decodeIQ4_NL(dst []float32, src []byte) {
	for b := range len(dst) / 32 {
		blk := (*[18]byte)(src[18*b:])
		out := (*[32]float32)(dst[32*b:])
		d := f16At(blk[0:])
		for j, q := range blk[2:] {
			out[j] = d * float32(iq4nlValues[q&0xf])
			out[j+16] = d * float32(iq4nlValues[q>>4])
		}
	}
}

// decodeIQ4_XS: {half d; uint16 scales_h; uint8 scales_l[4]; uint8
// qs[128]}. Sub-block ib (32 values, 16 bytes of qs as IQ4_NL) has the
// 6-bit scale ls: nibble ib%2 of scales_l[ib/2], bits 2ib and 2ib+1 of
// scales_h on top. x = (d·(ls−32))·level[q].
func decodeIQ4_XS(dst []float32, src []byte) {
	for b := range len(dst) / qkK {
		blk := (*[136]byte)(src[136*b:])
		out := (*[qkK]float32)(dst[qkK*b:])
		d := f16At(blk[0:])
		sh := le16(blk[2:])
		for ib := range 8 {
			ls := int(blk[4+ib/2]>>(4*(ib%2))&0xf) | int(sh>>(2*ib)&3)<<4
			dl := d * float32(ls-32)
			q := (*[16]byte)(blk[8+16*ib:])
			y := (*[32]float32)(out[32*ib:])
			for j, v := range q {
				y[j] = dl * float32(iq4nlValues[v&0xf])
				y[j+16] = dl * float32(iq4nlValues[v>>4])
			}
		}
	}
}
