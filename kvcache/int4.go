package kvcache

import (
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/simd"
)

// Int4 storage (I4), after KIVI (Liu et al. 2024): asymmetric 4-bit codes
// in groups that share a float32 scale and zero, x ≈ zero + scale·code
// with code in 0…15.
//
// Values are quantised per token: each stored row's channels in groups of
// lowbit.ChanGroup, one scale and zero a group, as soon as the row arrives.
// Keys are quantised per channel: i4KeyGroup consecutive rows of a head
// share, channel by channel, one scale and zero, because the outliers of
// keys sit in fixed channels and a scale per channel keeps one outlier
// channel from coarsening all the others. A group is quantised when its
// last row arrives; until then its rows wait in full precision in a
// residual of i4KeyGroup float32 rows per head (KIVI's residual), which
// the kernels read as float32. In a ring (Window), the group being
// refilled still holds the codes of the positions not yet overwritten,
// under the scales they were quantised with; those are replaced together
// when the group completes.
//
// An evicting cache refills single rows in an order that differs between
// heads, so no run of rows can share per-channel scales: its keys are
// quantised per token, as values are (Config.Rotate then spreads outlier
// channels, which is what scales per channel were for).
//
// Rows are packed as package lowbit describes. For keys quantised per
// channel the group's scales are folded into the queries (q'_c = q_c·scale_c,
// plus Σ q_c·zero_c a score), for values the probabilities are multiplied
// by each row's scale of a channel group, then the group's columns go
// through GemmU4, and Σ_j p_j·zero_j is added to them.
const (
	// i4KeyGroup is the number of consecutive rows whose keys share
	// scales per channel.
	i4KeyGroup = 64
	// i4ChanGroup is lowbit.ChanGroup, the number of channels of a row
	// (values, and keys of an evicting cache) that share a scale and a
	// zero.
	i4ChanGroup = lowbit.ChanGroup
)

// valueGroup returns the index in v4s and v4z of the scale and zero of
// channel group cg of row (head·cap + slot): they are kept a channel
// group at a time, [B][Hkv][chanGroups][capacity], so that a block's
// rows have theirs side by side for the kernels.
func (c *Cache) valueGroup(row, cg int) int {
	bh, s := row/c.cap, row%c.cap
	return (bh*lowbit.ChanGroups(c.cfg.D)+cg)*c.cap + s
}

// keyGroups returns the number of per-channel key groups over rows rows
// per head: the sinks in groups of i4KeyGroup, then the rest.
func (c *Cache) keyGroups(rows int) int {
	s := min(c.cfg.Sinks, rows)
	g := i4KeyGroup
	return (s+g-1)/g + (rows-s+g-1)/g
}

// keyGroup returns the per-channel key group of slot s: its index and
// its slots [lo, hi). Groups tile the sinks, then the ring (the last one
// of each cut short at its end) or, without a window, all rows.
func (c *Cache) keyGroup(s int) (gi, lo, hi int) {
	const g = i4KeyGroup
	sinks, w := c.cfg.Sinks, c.cfg.Window
	if s < sinks {
		gi = s / g
		lo = gi * g
		return gi, lo, min(lo+g, sinks)
	}
	t := (s - sinks) / g
	lo = sinks + t*g
	hi = lo + g
	if w > 0 {
		hi = min(hi, sinks+w)
	}
	return (sinks+g-1)/g + t, lo, hi
}

// openGroup returns the slots [lo, wr) of the key group being filled,
// which sit in the residual: wr is the slot the next position goes to.
func (c *Cache) openGroup() (lo, wr int) {
	wr = c.slot(c.n)
	_, lo, _ = c.keyGroup(wr)
	return lo, wr
}

// allocI4 makes room for rows positions per head of an I4 cache, keeping
// what is stored.
func (c *Cache) allocI4(rows int) {
	heads := c.cfg.B * c.cfg.HKV
	pw := c.stride / 2
	ng := lowbit.ChanGroups(c.cfg.D)
	k4, v4 := aligned[uint8](heads*rows*pw), aligned[uint8](heads*rows*pw)
	v4s, v4z := aligned[float32](heads*rows*ng), aligned[float32](heads*rows*ng)
	var k4s, k4z []float32
	kper := ng // scales a head-row (per token) or a head-group (per channel)
	krows, okrows := rows, c.cap
	if !c.ktok {
		kper = c.stride
		krows, okrows = c.keyGroups(rows), c.keyGroups(c.cap)
		if c.kres == nil {
			c.kres = make([]float32, heads*i4KeyGroup*c.stride)
		}
	}
	k4s, k4z = aligned[float32](heads*krows*kper), aligned[float32](heads*krows*kper)
	if c.k4 != nil {
		held := c.Held()
		for h := range heads {
			copy(k4[h*rows*pw:], c.k4[h*c.cap*pw:][:held*pw])
			copy(v4[h*rows*pw:], c.v4[h*c.cap*pw:][:held*pw])
			for cg := range ng {
				copy(v4s[(h*ng+cg)*rows:], c.v4s[(h*ng+cg)*c.cap:][:held])
				copy(v4z[(h*ng+cg)*rows:], c.v4z[(h*ng+cg)*c.cap:][:held])
			}
			copy(k4s[h*krows*kper:], c.k4s[h*okrows*kper:][:okrows*kper])
			copy(k4z[h*krows*kper:], c.k4z[h*okrows*kper:][:okrows*kper])
		}
	}
	c.k4, c.v4, c.v4s, c.v4z, c.k4s, c.k4z = k4, v4, v4s, v4z, k4s, k4z
}

// bytesI4 is Bytes of an I4 cache, without eviction's bookkeeping.
func (c *Cache) bytesI4() int {
	heads := c.cfg.B * c.cfg.HKV
	ng := lowbit.ChanGroups(c.cfg.D)
	n := 2 * heads * c.cap * (c.stride / 2) // codes
	n += heads * c.cap * ng * 8             // value scales and zeros
	if c.ktok {
		return n + heads*c.cap*ng*8
	}
	return n + heads*c.keyGroups(c.cap)*c.stride*8 + len(c.kres)*4
}

// storeI4 stores one position's key and value rows in row (head·cap +
// slot). Rows of a head must arrive in slot order within a key group.
func (c *Cache) storeI4(row int, k, v []float32) {
	pw := c.stride / 2
	ng := lowbit.ChanGroups(c.cfg.D)
	i := c.valueGroup(row, 0)
	lowbit.QuantRow(c.v4[row*pw:][:pw], c.v4s[i:], c.v4z[i:], c.cap, v, pw)
	if c.ktok {
		lowbit.QuantRow(c.k4[row*pw:][:pw], c.k4s[row*ng:][:ng], c.k4z[row*ng:][:ng], 1, k, pw)
		return
	}
	bh, s := row/c.cap, row%c.cap
	gi, lo, hi := c.keyGroup(s)
	copy(c.kres[(bh*i4KeyGroup+s-lo)*c.stride:][:c.cfg.D], k)
	if s+1 == hi {
		c.closeKeyGroup(bh, gi, lo, hi)
	}
}

// closeKeyGroup quantises the residual rows of head bh, slots [lo, hi)
// of key group gi, per channel.
func (c *Cache) closeKeyGroup(bh, gi, lo, hi int) {
	st, pw, d := c.stride, c.stride/2, c.cfg.D
	m := hi - lo
	res := c.kres[bh*i4KeyGroup*st:][:m*st]
	codes := c.k4[(bh*c.cap+lo)*pw:][:m*pw]
	clear(codes)
	ng := c.keyGroups(c.cap)
	scale := c.k4s[(bh*ng+gi)*st:][:st]
	zero := c.k4z[(bh*ng+gi)*st:][:st]
	lowbit.QuantColumns(codes, pw, pw, scale, zero, res, st, m, d)
}

// readRowI4 writes the stored key (values false) or value row of row
// (head·cap + slot) into dst (D values), dequantised: zero + scale·code
// in float32, or the residual's float32 for a key not yet quantised.
func (c *Cache) readRowI4(dst []float32, values bool, row int) {
	pw, d := c.stride/2, c.cfg.D
	codes, scale, zero := c.v4, c.v4s, c.v4z
	if !values {
		codes, scale, zero = c.k4, c.k4s, c.k4z
	}
	packed := codes[row*pw:][:pw]
	ng := lowbit.ChanGroups(d)
	if values {
		i := c.valueGroup(row, 0)
		lowbit.Dequant(dst[:d], packed, scale[i:], zero[i:], c.cap)
		return
	}
	if c.ktok {
		lowbit.Dequant(dst[:d], packed, scale[row*ng:][:ng], zero[row*ng:][:ng], 1)
		return
	}
	bh, s := row/c.cap, row%c.cap
	if lo, wr := c.openGroup(); s >= lo && s < wr {
		copy(dst[:d], c.kres[(bh*i4KeyGroup+s-lo)*c.stride:][:d])
		return
	}
	gi, _, _ := c.keyGroup(s)
	g := (bh*c.keyGroups(c.cap) + gi) * c.stride
	lowbit.Dequant(dst[:d], packed, scale[g:][:d], zero[g:][:d], 0)
}

// moveRowI4 copies the stored row src to dst (rows head·cap + slot) of an
// evicting cache (keys per token).
func (c *Cache) moveRowI4(dst, src int) {
	pw, ng := c.stride/2, lowbit.ChanGroups(c.cfg.D)
	copy(c.k4[dst*pw:][:pw], c.k4[src*pw:][:pw])
	copy(c.v4[dst*pw:][:pw], c.v4[src*pw:][:pw])
	copy(c.k4s[dst*ng:][:ng], c.k4s[src*ng:][:ng])
	copy(c.k4z[dst*ng:][:ng], c.k4z[src*ng:][:ng])
	for cg := range ng {
		i, j := c.valueGroup(dst, cg), c.valueGroup(src, cg)
		c.v4s[i], c.v4z[i] = c.v4s[j], c.v4z[j]
	}
}

// i4Scratch is a decode worker's memory for I4 blocks.
type i4Scratch struct {
	tmp []float32 // [g][lds] scores of a row's second half (lds: the decode scratch's)
	// zacc is Σ_j p_j·zero_j over a span's value rows, [g][chanGroups],
	// rescaled with the accumulator and added to it at the span's end.
	zacc []float32
	qf   []float32 // [g][stride] queries times a key group's scales
	z    []float32 // [g] or [g][chanGroups] query sums against zeros; [g] a block's Σ p·zero
	pt   []float32 // [chanGroups][g][lds] scaled probabilities or partial scores
}

func (sc *decodeScratch) i4() *i4Scratch {
	if sc.q4 == nil {
		ng := lowbit.ChanGroups(sc.stride)
		sc.q4 = &i4Scratch{
			tmp:  make([]float32, sc.g*sc.lds),
			zacc: make([]float32, sc.g*ng),
			qf:   make([]float32, sc.g*sc.stride),
			z:    make([]float32, sc.g*ng),
			pt:   make([]float32, ng*sc.g*sc.lds),
		}
	}
	return sc.q4
}

// scoresI4 is scores for an I4 cache: the block of nb rows from element
// offset off (row·stride) is cut where key groups and the residual begin
// and end, and each piece scored on its own.
func (c *Cache) scoresI4(sc *decodeScratch, off, nb, g int) {
	st, pw, d := c.stride, c.stride/2, c.cfg.D
	row0 := off / st
	bh, s0 := row0/c.cap, row0%c.cap
	x := sc.i4()
	if c.ktok {
		c.scoresI4Token(sc, x, row0, nb, g)
		return
	}
	rlo, wr := c.openGroup()
	nk := c.keyGroups(c.cap)
	native := c.nativeI4()
	for j := 0; j < nb; {
		s := s0 + j
		gi, _, hi := c.keyGroup(s)
		end := min(nb, hi-s0)
		if s >= rlo && s < wr { // the residual: float32 keys
			end = min(end, wr-s0)
			res := c.kres[(bh*i4KeyGroup+s-rlo)*st:][:(end-j-1)*st+d]
			simd.DotRows(sc.s[j:], sc.lds, sc.q, st, g, res, st, end-j, d)
			j = end
			continue
		}
		m := end - j
		scale := c.k4s[(bh*nk+gi)*st:][:d]
		zero := c.k4z[(bh*nk+gi)*st:][:d]
		if native {
			simd.DotRowsU4Q8(sc.s[j:], sc.lds, sc.q, st, g, scale, zero, c.k4[(row0+j)*pw:], pw, m, d, pw)
			j = end
			continue
		}
		for r := range g {
			copy(x.qf[r*st:][:d], sc.q[r*st:][:d])
			x.z[r] = simd.Dot(sc.q[r*st:][:d], zero)
		}
		simd.ScaleColumns(x.qf, st, g, scale)
		c.dotCodes(sc, sc.s[j:], x.qf, g, c.k4[(row0+j)*pw:], m, 0, d)
		for r := range g {
			z := x.z[r]
			for i := range m {
				sc.s[r*sc.lds+j+i] += z
			}
		}
		j = end
	}
}

// scoresI4Token scores keys quantised per token: a dot product of codes
// per channel group, each times its row's scale, plus the group's zero
// times the query's sum over the group.
func (c *Cache) scoresI4Token(sc *decodeScratch, x *i4Scratch, row0, nb, g int) {
	st, pw, d := c.stride, c.stride/2, c.cfg.D
	ng := lowbit.ChanGroups(d)
	for cg := range ng {
		c0, c1 := cg*i4ChanGroup, min(d, (cg+1)*i4ChanGroup)
		c.dotCodes(sc, x.pt[cg*g*sc.lds:], sc.q, g, c.k4[row0*pw:], nb, c0, c1)
		for r := range g {
			var sum float32
			for _, v := range sc.q[r*st+c0 : r*st+c1] {
				sum += v
			}
			x.z[r*ng+cg] = sum
		}
	}
	scale, zero := c.k4s[row0*ng:][:nb*ng], c.k4z[row0*ng:][:nb*ng]
	for r := range g {
		sr := sc.s[r*sc.lds:][:nb]
		clear(sr)
		for cg := range ng {
			pt := x.pt[(cg*g+r)*sc.lds:][:nb]
			qz := x.z[r*ng+cg]
			for j := range sr {
				sr[j] += scale[j*ng+cg]*pt[j] + zero[j*ng+cg]*qz
			}
		}
	}
}

// valuesI4 is values for an I4 cache: per channel group, the
// probabilities times each row's scale through GemmU4 on the codes in
// place; Σ_j p_j·zero_j goes to the span's zacc (see addZeros).
func (c *Cache) valuesI4(sc *decodeScratch, off, nb, g int) {
	st, pw, d := c.stride, c.stride/2, c.cfg.D
	row0 := off / st
	ng := lowbit.ChanGroups(d)
	x := sc.i4()
	v := c.v4[row0*pw:][:nb*pw]
	native := c.nativeI4()
	pt := x.pt[:g*sc.lds]
	// Σ_j p_j·zero_j for the g rows and every channel group in one call:
	// the groups' zeros, c.cap apart, as the keys of DotRows.
	z0 := c.valueGroup(row0, 0)
	simd.DotRows(x.z, ng, sc.s, sc.lds, g, c.v4z[z0:][:(ng-1)*c.cap+nb], c.cap, ng, nb)
	for i, z := range x.z[:g*ng] {
		x.zacc[i] += z
	}
	for cg := range ng {
		c0 := cg * i4ChanGroup
		c1 := c0 + (min(d, c0+i4ChanGroup)-c0+7)&^7
		sg := c.v4s[c.valueGroup(row0, cg):][:nb]
		if !native {
			copy(pt[:(g-1)*sc.lds+nb], sc.s)
			simd.ScaleColumns(pt, sc.lds, g, sg)
		}
		// The group's columns of each half of the packed rows.
		lowbit.Halves(pw, c0, c1, func(hi bool, b, p0, p1 int) {
			vb := v[b:][:(nb-1)*pw+p1-p0]
			if native {
				simd.GemmU4BF16(g, p1-p0, nb, sc.s, sc.lds, sg, vb, pw, sc.acc[p0:], st, hi)
			} else {
				simd.GemmU4(g, p1-p0, nb, pt, sc.lds, vb, pw, sc.acc[p0:], st, true, hi)
			}
		})
	}
}

// addZeros adds the span's Σ_j p_j·zero_j of each value channel group
// to the group's channels of acc (g rows of stride st, d channels): the
// zeros' part of the product with the dequantised values, the same for
// every channel of a group and so summed over the span once.
func (x *i4Scratch) addZeros(acc []float32, st, d int) {
	ng := lowbit.ChanGroups(d)
	for r := range len(x.zacc) / ng {
		for cg := range ng {
			z := x.zacc[r*ng+cg]
			for i := cg * i4ChanGroup; i < min(d, (cg+1)*i4ChanGroup); i++ {
				acc[r*st+i] += z
			}
		}
	}
}

// nativeI4 reports whether the decode step multiplies the codes in the
// integer and bfloat16 arithmetic of the CPU (simd.NativeU4): keys
// quantised per channel with queries rounded to int8 (simd.DotRowsU4Q8),
// values with probabilities rounded to bfloat16 (simd.GemmU4BF16), as
// llama.cpp's int4 dot products and FlashAttention's P·V round them.
// Elsewhere, and for rows longer than DotRowsU4Q8 takes, queries and
// probabilities stay float32.
func (c *Cache) nativeI4() bool { return simd.NativeU4() && c.stride <= 512 }

// dotCodes sets s[r*sc.lds+j], for the g rows of q (stride) and the
// n packed rows of k, to the dot product of channels [c0, c1) of q's row
// with the row's codes, reading the codes in place from both halves.
func (c *Cache) dotCodes(sc *decodeScratch, s []float32, q []float32, g int, k []uint8, n, c0, c1 int) {
	st, pw, x := c.stride, c.stride/2, sc.i4()
	first := true
	lowbit.Halves(pw, c0, c1, func(hi bool, b, p0, p1 int) {
		kk := k[b:][:(n-1)*pw+p1-p0]
		if first {
			simd.DotRowsU4(s, sc.lds, q[p0:], st, g, kk, pw, n, p1-p0, hi)
			first = false
			return
		}
		simd.DotRowsU4(x.tmp, sc.lds, q[p0:], st, g, kk, pw, n, p1-p0, hi)
		for r := range g {
			simd.Axpy(1, x.tmp[r*sc.lds:][:n], s[r*sc.lds:][:n])
		}
	})
}
