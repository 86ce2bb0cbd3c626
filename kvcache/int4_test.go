package kvcache

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/ref"
)

// checkGroup4 checks the codes of a group of values x quantised with
// scale and zero, read back as y: each within scale/2 of the value (up
// to the float32 rounding of zero + scale·code), the group's least value
// stored exactly and a NaN-free, finite result.
func checkGroup4(t *testing.T, name string, x, y []float32, scale, zero float32) {
	t.Helper()
	lo, hi, bad := lowbit.Range(x)
	if bad {
		t.Fatalf("%s: non-finite input", name)
	}
	if zero != lo {
		t.Errorf("%s: zero %v, want the least value %v", name, zero, lo)
	}
	if want := (float64(hi) - float64(lo)) / 15; float64(scale) < want || float64(scale) > want*(1+0x1p-22)+0x1p-149 {
		t.Errorf("%s: scale %v, want (max-min)/15 = %v rounded up", name, scale, want)
	}
	tol := lowbit.MaxError(scale, lo, hi)
	for i := range x {
		if math.IsInf(float64(y[i]), 0) || math.IsNaN(float64(y[i])) {
			t.Fatalf("%s: [%d] reads back as %v", name, i, y[i])
		}
		if e := math.Abs(float64(x[i]) - float64(y[i])); e > tol {
			t.Fatalf("%s: [%d] = %v reads back as %v, error %.3g > scale/2 (tol %.3g, scale %v)", name, i, x[i], y[i], e, tol, scale)
		}
	}
}

// TestPackedHalves checks that the packing of a row is what the kernels
// read: the dot products of a query with both halves of packed rows,
// through simd.DotRowsU4, are those with the codes in channel order.
func TestPackedHalves(t *testing.T) {
	rng := ref.FreshRNG(t, 21)
	for _, st := range []int{16, 48, 128} {
		const rows = 5
		pw := st / 2
		codes := make([]uint8, rows*st)
		packed := make([]uint8, rows*pw)
		for r := range rows {
			for c := range st {
				x := uint8(rng.IntN(16))
				codes[r*st+c] = x
				lowbit.SetCode(packed[r*pw:][:pw], c, x, pw)
			}
		}
		q := make([]float32, st)
		for i := range q {
			q[i] = float32(rng.IntN(9) - 4) // small integers: exact sums
		}
		lo, hi := make([]float32, rows), make([]float32, rows)
		simd.DotRowsU4(lo, rows, q, st, 1, packed, pw, rows, pw, false)
		simd.DotRowsU4(hi, rows, q[pw:], st, 1, packed, pw, rows, pw, true)
		for r := range rows {
			var want float32
			for c := range st {
				want += q[c] * float32(codes[r*st+c])
			}
			if got := lo[r] + hi[r]; got != want {
				t.Fatalf("stride %d row %d: %v from the halves, want %v", st, r, got, want)
			}
		}
	}
}

// TestI4KeyGroups appends positions one by one and in chunks to I4
// caches (no window and regrowth, a ring with sinks whose groups are cut
// short, a window smaller than a group) and checks every held key: in
// the residual (the open group) exactly the appended value, otherwise
// within half a step of its channel's group scale, the group's scale and
// zero those of its values; every value within half a step of its row's
// channel group.
func TestI4KeyGroups(t *testing.T) {
	rng := ref.FreshRNG(t, 22)
	const d, n = 70, 300
	for _, cfg := range []Config{{Capacity: 1}, {Window: 150, Sinks: 5}, {Window: 20, Sinks: 70}, {Window: 30}} {
		for _, chunked := range []bool{false, true} {
			cfg.B, cfg.HKV, cfg.D, cfg.DType = 1, 2, d, I4
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			k, v := ref.Normal(rng, 2*n*d), ref.Normal(rng, 2*n*d)
			for h := range 2 {
				k[(h*n+9)*d+3] = 40 // an outlier: its channel's group only
			}
			sq := seq{attn.Shape{B: 1, H: 2, HKV: 2, N: n, M: n, D: d}, nil, k, v}
			sizes := []int{1}
			if chunked {
				sizes = []int{7, 100, 1, 64, 3, 125}
			}
			for t0, i := 0, 0; t0 < n; i++ {
				m := min(sizes[i%len(sizes)], n-t0)
				if err := c.Append(sq.slice(k, 2, t0, t0+m), sq.slice(v, 2, t0, t0+m), m); err != nil {
					t.Fatal(err)
				}
				t0 += m
				if !testing.Short() || chunked || t0%5 == 0 {
					checkStoredI4(t, fmt.Sprintf("%+v chunked %v len %d", cfg, chunked, t0), c, k, v, n)
				}
			}
		}
	}
}

// checkStoredI4 checks what an I4 cache holds against the appended k
// and v ([Hkv][n][D]): the residual (the open key group's first rows)
// exactly; every key group once quantised, channel by channel against
// the keys it was quantised from (in the open group of a ring, the
// positions its rows held before the ring came round); every held value
// row per channel group.
func checkStoredI4(t *testing.T, name string, c *Cache, k, v []float32, n int) {
	t.Helper()
	d, st, pw := c.cfg.D, c.stride, c.stride/2
	rlo, wr := c.openGroup()
	written := func(s int) bool { return s < c.n }
	for bh := range c.cfg.HKV {
		for s := rlo; s < wr; s++ {
			y := make([]float32, d)
			c.readRowI4(y, false, bh*c.cap+s)
			x := k[(bh*n+c.position(s))*d:][:d]
			for i := range x {
				if x[i] != y[i] {
					t.Fatalf("%s: head %d slot %d in the residual: [%d] = %v reads %v", name, bh, s, i, x[i], y[i])
				}
			}
		}
		for gi := range c.keyGroups(c.cap) {
			var lo, hi int
			for s := 0; s < c.cap; s++ {
				if g, l, h := c.keyGroup(s); g == gi {
					lo, hi = l, h
					break
				}
			}
			if !written(hi-1) || hi > c.cap {
				continue // never quantised
			}
			at := func(s int) int { // the position slot s held when the group was quantised
				if lo == rlo && s < wr {
					return c.position(s) - c.cfg.Window
				}
				return c.position(s)
			}
			g := (bh*c.keyGroups(c.cap) + gi) * st
			for i := range d {
				var x, y []float32
				for s := lo; s < hi; s++ {
					x = append(x, k[(bh*n+at(s))*d+i])
					y = append(y, c.k4z[g+i]+c.k4s[g+i]*float32(lowbit.GetCode(c.k4[(bh*c.cap+s)*pw:][:pw], i, pw)))
				}
				checkGroup4(t, fmt.Sprintf("%s: head %d key group %d [%d, %d) channel %d", name, bh, gi, lo, hi, i), x, y, c.k4s[g+i], c.k4z[g+i])
			}
		}
		ng := lowbit.ChanGroups(d)
		for s := range c.Held() {
			row := bh*c.cap + s
			x, y := v[(bh*n+c.position(s))*d:][:d], make([]float32, d)
			c.readRowI4(y, true, row)
			for cg := range ng {
				c0, c1 := cg*i4ChanGroup, min(d, (cg+1)*i4ChanGroup)
				checkGroup4(t, fmt.Sprintf("%s: head %d slot %d value group %d", name, bh, s, cg), x[c0:c1], y[c0:c1],
					c.v4s[c.valueGroup(row, cg)], c.v4z[c.valueGroup(row, cg)])
			}
		}
	}
}

// storedRef is the float64 reference of queries [t0, t1) of sq against
// what cache c holds before them (each held position read back with
// Read: dequantised, rotated back) and the chunk's own keys and values
// in float32, under the window rule.
func storedRef(t *testing.T, c *Cache, sq seq, t0, t1, w, sinks int) (out, lse []float64) {
	t.Helper()
	s := sq.s
	d := s.D
	k := append([]float32(nil), sq.k...)
	v := append([]float32(nil), sq.v...)
	one := make([]float32, s.B*s.HKV*d)
	onev := make([]float32, s.B*s.HKV*d)
	for p := range t0 {
		if !c.Holds(p) {
			continue
		}
		if err := c.Read(one, onev, p, p+1); err != nil {
			t.Fatal(err)
		}
		for bh := range s.B * s.HKV {
			copy(k[(bh*s.M+p)*d:][:d], one[bh*d:][:d])
			copy(v[(bh*s.M+p)*d:][:d], onev[bh*d:][:d])
		}
	}
	return seq{s, sq.q, k, v}.want(t0, t1, w, sinks)
}

// runStored feeds sq through a cache of cfg in chunks and checks every
// chunk's output and lse against storedRef to tol: the kernels' error
// alone, not the quantisation's.
func runStored(t *testing.T, sq seq, cfg Config, chunks []int, workers int, tol float64) {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t0 := 0
	for _, n := range chunks {
		t1 := t0 + n
		wantOut, wantLSE := storedRef(t, c, sq, t0, t1, cfg.Window, cfg.Sinks)
		out := make([]float32, sq.s.B*sq.s.H*n*sq.s.D)
		lse := make([]float32, sq.s.B*sq.s.H*n)
		err := c.Step(context.Background(), sq.s.H, sq.slice(sq.q, sq.s.H, t0, t1), sq.slice(sq.k, sq.s.HKV, t0, t1),
			sq.slice(sq.v, sq.s.HKV, t0, t1), n, attn.Options{Workers: workers}, out, lse)
		if err != nil {
			t.Fatal(err)
		}
		if e := ref.RelErr(out, wantOut); e > tol {
			t.Fatalf("%+v chunk [%d,%d): out rel err %.3g against the stored rows", cfg, t0, t1, e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
			t.Fatalf("%+v chunk [%d,%d): lse rel err %.3g %v against the stored rows", cfg, t0, t1, e, err)
		}
		t0 = t1
	}
}

// TestI4Kernels checks I4 decoding, with and without rotation, against
// attention on what the cache stores: step by step (the streaming
// kernels, groups of 3 and of 20 query heads a KV head: int4 streams at
// any group size, see fusedGroup), a prefill and a chunk (the fused kernel of package
// flash reading dequantised rows), windows with sinks (rows checked one
// by one, ring groups cut short), at odd sizes. Rotation of an odd D
// flips signs only, of D = 40 mixes blocks of 8.
func TestI4Kernels(t *testing.T) {
	rng := ref.FreshRNG(t, 23)
	ones := func(n int) []int {
		x := make([]int, n)
		for i := range x {
			x[i] = 1
		}
		return x
	}
	for _, rot := range []bool{false, true} {
		for _, tc := range []struct {
			h, hkv, d int
			cfg       Config
			chunks    []int
		}{
			{6, 2, 40, Config{}, ones(150)},
			{20, 1, 33, Config{}, ones(140)},
			{6, 2, 40, Config{}, append([]int{131, 7}, ones(70)...)},
			{3, 1, 40, Config{Window: 70, Sinks: 4}, append([]int{5, 1, 1, 90, 1, 40, 100, 16}, ones(70)...)},
			{20, 1, 24, Config{Window: 100, Sinks: 2}, ones(160)},
			{4, 2, 128, Config{Capacity: 1}, append([]int{200}, ones(80)...)},
		} {
			cfg := tc.cfg
			cfg.B, cfg.HKV, cfg.D, cfg.DType, cfg.Rotate = 2, tc.hkv, tc.d, I4, rot
			total := 0
			for _, n := range tc.chunks {
				total += n
			}
			sq := newSeq(rng, 2, tc.h, tc.hkv, total, tc.d)
			runStored(t, sq, cfg, tc.chunks, 3, storedTol(I4, 2e-5))
		}
	}
}

// TestLongSpans decodes, for every element type, from a cache long enough
// that a span holds several of the streaming path's blocks (decodeRows
// rows), so that the running softmax is carried from block to block,
// against attention on the stored rows, and for 1 and 3 workers alike.
func TestLongSpans(t *testing.T) {
	rng := ref.FreshRNG(t, 26)
	const h, hkv, d = 6, 2, 40
	for _, dt := range []DType{F32, BF16, F16, I8, I4} {
		cfg := Config{B: 1, HKV: hkv, D: d, DType: dt, Rotate: dt == I4}
		c0, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n := 16*c0.decodeRows(h/hkv) + 301
		tol := storedTol(dt, 2e-5)
		sq := newSeq(rng, 1, h, hkv, n+3, d)
		var outs [2][]float32
		for i, workers := range []int{1, 3} {
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Append(sq.slice(sq.k, hkv, 0, n), sq.slice(sq.v, hkv, 0, n), n); err != nil {
				t.Fatal(err)
			}
			for t0 := n; t0 < n+3; t0++ {
				wantOut, wantLSE := storedRef(t, c, sq, t0, t0+1, 0, 0)
				out, lse := make([]float32, h*d), make([]float32, h)
				if err := c.Step(context.Background(), h, sq.slice(sq.q, h, t0, t0+1), sq.slice(sq.k, hkv, t0, t0+1),
					sq.slice(sq.v, hkv, t0, t0+1), 1, attn.Options{Workers: workers}, out, lse); err != nil {
					t.Fatal(err)
				}
				if e := ref.RelErr(out, wantOut); e > tol {
					t.Fatalf("%v, %d workers, position %d: out rel err %.3g against the stored rows", dt, workers, t0, e)
				}
				if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
					t.Fatalf("%v, %d workers, position %d: lse rel err %.3g %v against the stored rows", dt, workers, t0, e, err)
				}
				outs[i] = append(outs[i], out...)
			}
		}
		if !slices.Equal(outs[0], outs[1]) {
			t.Errorf("%v: outputs differ between 1 and 3 workers", dt)
		}
	}
}

// TestStoredOtherTypes runs the stored-rows check over the other element
// types with rotation, which must change nothing but rounding.
func TestStoredOtherTypes(t *testing.T) {
	rng := ref.FreshRNG(t, 24)
	for _, dt := range []DType{F32, BF16, F16, I8} {
		sq := newSeq(rng, 1, 6, 2, 120, 40)
		chunks := []int{50, 3}
		for len(chunks) < 40 {
			chunks = append(chunks, 1)
		}
		for _, w := range []int{0, 30} {
			cfg := Config{B: 1, HKV: 2, D: 40, DType: dt, Rotate: true, Window: w}
			if w > 0 {
				cfg.Sinks = 3
			}
			runStored(t, sq, cfg, chunks, 2, storedTol(dt, 2e-5))
		}
	}
}

// i4Tol bounds the relative error of I4 attention against the float64
// reference on the tests' Gaussian inputs, over all the single-token
// steps together (a chunk's own keys are not quantised, so the prefill
// says little). A group of 64 Gaussian values spans about ±2.4σ, a step
// of 0.32σ, so a stored value is off by about 0.09σ rms (uniform
// rounding): 9% of each value, which the output shows diluted by
// averaging over keys, and the logits as an error of about 0.09 each:
// together about 0.13. Measured: 0.123 median, 0.139 at most over 1000
// runs of these shapes.
const i4Tol = 0.16

// i4StepTol bounds one step's error (out or lse), which is heavy-tailed:
// a head that attends to a few keys, whose logits the rounding moves,
// can be off by 0.4 while the others are near 0.13. Measured: 0.24 at
// most over 1000 runs of 100 steps; a missing scale or zero would show
// as an error of order 1.
const i4StepTol = 0.4

// TestI4Accuracy decodes Gaussian inputs from I4 caches, with and
// without rotation, against the float64 reference on the original
// inputs, within i4Tol.
func TestI4Accuracy(t *testing.T) {
	rng := ref.FreshRNG(t, 25)
	for _, rot := range []bool{false, true} {
		for _, cfg := range []Config{{}, {Window: 50, Sinks: 3}} {
			cfg.B, cfg.HKV, cfg.D, cfg.DType, cfg.Rotate = 1, 2, 64, I4, rot
			sq := newSeq(rng, 1, 8, 2, 300, 64)
			chunks := []int{200}
			for len(chunks) < 101 {
				chunks = append(chunks, 1)
			}
			c, _ := New(cfg)
			t0, worst := 0, 0.0
			var steps []float32 // the single-token steps' outputs
			var wantSteps []float64
			for _, n := range chunks {
				t1 := t0 + n
				out := make([]float32, 8*n*64)
				lse := make([]float32, 8*n)
				if err := c.Step(context.Background(), 8, sq.slice(sq.q, 8, t0, t1), sq.slice(sq.k, 2, t0, t1),
					sq.slice(sq.v, 2, t0, t1), n, attn.Options{}, out, lse); err != nil {
					t.Fatal(err)
				}
				wantOut, wantLSE := sq.want(t0, t1, cfg.Window, cfg.Sinks)
				e := ref.RelErr(out, wantOut)
				le, err := ref.LSEErr(lse, wantLSE)
				if err != nil {
					t.Fatal(err)
				}
				worst = max(worst, e, le)
				if n == 1 {
					steps = append(steps, out...)
					wantSteps = append(wantSteps, wantOut...)
				}
				t0 = t1
			}
			e := ref.RelErr(steps, wantSteps)
			t.Logf("%+v: relative error %.3g over the steps, %.3g at worst", cfg, e, worst)
			if e > i4Tol {
				t.Errorf("%+v: relative error %.3g over the steps > %.3g", cfg, e, i4Tol)
			}
			if worst > i4StepTol {
				t.Errorf("%+v: relative error %.3g in one step > %.3g", cfg, worst, i4StepTol)
			}
		}
	}
}

// outlierSeq is a sequence whose values (and keys, if keys) carry a few
// channels of outliers, as those of trained models do: channels 3 and 17
// of every position 30 times larger than the rest.
func outlierSeq(rng *rand.Rand, h, hkv, n, d int, keys bool) seq {
	sq := newSeq(rng, 1, h, hkv, n, d)
	for r := 0; r < len(sq.k); r += d {
		for _, c := range []int{3, 17} {
			sq.v[r+c] *= 30
			if keys {
				sq.k[r+c] *= 30
			}
		}
	}
	return sq
}

// TestRotationOutliers decodes sequences with outlier channels from I4
// caches with and without rotation and compares the error against the
// float64 reference over a chunk of 100 queries after 300 positions.
// Values are quantised per token: rotated, an outlier no longer sets the
// step of its row's other values, and the error must shrink by a third
// (by half measured, the rest being the keys' error); with outliers in
// keys quantised per token too (an evicting cache), by half (by 3
// measured). Keys quantised per channel
// are not checked: per-channel scales already confine an outlier to its
// channel, and a rotation keeps the sum of the channels' squared errors.
func TestRotationOutliers(t *testing.T) {
	rng := ref.FreshRNG(t, 27)
	const h, hkv, n, d, n0 = 8, 2, 400, 64, 300
	for _, tc := range []struct {
		name   string
		keys   bool
		cfg    Config
		factor float64
	}{
		{"value outliers", false, Config{}, 2.0 / 3},
		{"key and value outliers, keys per token", true, Config{Evict: H2O, Keep: 1, Window: n}, 0.5},
	} {
		sq := outlierSeq(rng, h, hkv, n, d, tc.keys)
		errs := map[bool]float64{}
		for _, rot := range []bool{false, true} {
			cfg := tc.cfg
			cfg.B, cfg.HKV, cfg.D, cfg.DType, cfg.Rotate = 1, hkv, d, I4, rot
			c, _ := New(cfg)
			if err := c.Append(sq.slice(sq.k, hkv, 0, n0), sq.slice(sq.v, hkv, 0, n0), n0); err != nil {
				t.Fatal(err)
			}
			out := make([]float32, h*(n-n0)*d)
			if err := c.Step(context.Background(), h, sq.slice(sq.q, h, n0, n), sq.slice(sq.k, hkv, n0, n), sq.slice(sq.v, hkv, n0, n),
				n-n0, attn.Options{}, out, nil); err != nil {
				t.Fatal(err)
			}
			wantOut, _ := sq.want(n0, n, 0, 0)
			errs[rot] = ref.RelErr(out, wantOut)
		}
		t.Logf("%s: relative error %.3g plain, %.3g rotated", tc.name, errs[false], errs[true])
		if !(errs[true] < errs[false]*tc.factor) {
			t.Errorf("%s: rotation did not cut the error to %.2g of it: %.3g plain, %.3g rotated", tc.name, tc.factor, errs[false], errs[true])
		}
	}
}

// TestI4AttendRanges checks sparse decoding from I4 caches against the
// stored rows: long runs read in place across key groups and the
// residual, single columns gathered (dequantised into a float32 block),
// a range that is not Full; and in a ring with sinks, whose runs wrap.
func TestI4AttendRanges(t *testing.T) {
	rng := ref.FreshRNG(t, 28)
	const h, hkv, d, n = 6, 2, 40, 231
	for _, tc := range []struct {
		rot    bool
		cfg    Config
		ranges []flash.Range
	}{
		{false, Config{}, nil}, {true, Config{}, nil},
		{false, Config{Window: 100, Sinks: 3}, []flash.Range{{Lo: 0, Hi: 3, Full: true}, {Lo: 131, Hi: 132, Full: true}, {Lo: 140, Hi: 231, Full: false}}},
		{true, Config{Window: 150, Sinks: 70}, []flash.Range{{Lo: 0, Hi: 70, Full: true}, {Lo: 81, Hi: 231, Full: true}}},
	} {
		rot := tc.rot
		sq := newSeq(rng, 1, h, hkv, n, d)
		cfg := tc.cfg
		cfg.B, cfg.HKV, cfg.D, cfg.DType, cfg.Rotate = 1, hkv, d, I4, rot
		c, _ := New(cfg)
		if err := c.Append(sq.k, sq.v, n); err != nil {
			t.Fatal(err)
		}
		ranges := tc.ranges
		if ranges == nil {
			ranges = []flash.Range{{Lo: 0, Hi: 3, Full: true}, {Lo: 10, Hi: 11, Full: true}, {Lo: 40, Hi: 150, Full: true},
				{Lo: 160, Hi: 161, Full: true}, {Lo: 170, Hi: 231, Full: false}}
		}
		pat := oddKeys{}
		out := make([]float32, h*d)
		lse := make([]float32, h)
		if err := c.AttendRanges(context.Background(), h, sq.slice(sq.q, h, n-1, n), n-1, ranges, pat, attn.Options{Workers: 2}, out, lse); err != nil {
			t.Fatal(err)
		}
		// The reference: the stored rows, masked to the ranges.
		k, v := make([]float32, hkv*n*d), make([]float32, hkv*n*d)
		for _, r := range ranges {
			m := r.Hi - r.Lo
			kr, vr := make([]float32, hkv*m*d), make([]float32, hkv*m*d)
			if err := c.Read(kr, vr, r.Lo, r.Hi); err != nil {
				t.Fatal(err)
			}
			for kv := range hkv {
				copy(k[(kv*n+r.Lo)*d:][:m*d], kr[kv*m*d:][:m*d])
				copy(v[(kv*n+r.Lo)*d:][:m*d], vr[kv*m*d:][:m*d])
			}
		}
		s := attn.Shape{B: 1, H: h, HKV: hkv, N: 1, M: n, D: d}
		mask := make([]bool, n)
		for _, r := range ranges {
			for j := r.Lo; j < r.Hi; j++ {
				mask[j] = r.Full || pat.Visible(n-1, j)
			}
		}
		wantOut, wantLSE, err := ref.Attention(s, sq.slice(sq.q, h, n-1, n), k, v, ref.Spec{Mask: mask})
		if err != nil {
			t.Fatal(err)
		}
		if e := ref.RelErr(out, wantOut); e > storedTol(I4, 2e-5) {
			t.Errorf("%+v: out rel err %.3g", cfg, e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > storedTol(I4, 2e-5) {
			t.Errorf("%+v: lse rel err %.3g %v", cfg, e, err)
		}
	}
}

// oddKeys sees the odd positions.
type oddKeys struct{}

func (oddKeys) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	return append(dst, flash.Range{Lo: 0, Hi: m})
}
func (oddKeys) Visible(p, j int) bool { return j%2 == 1 }

// TestI4Bytes checks that Bytes reports I4's smaller storage: at D = 128
// under 0.65 of I8's and 1/6 of F32's, residual and scales included.
func TestI4Bytes(t *testing.T) {
	by := map[DType]int{}
	for _, dt := range []DType{F32, I8, I4} {
		c, err := New(Config{B: 1, HKV: 8, D: 128, DType: dt, Capacity: 65536})
		if err != nil {
			t.Fatal(err)
		}
		by[dt] = c.Bytes()
	}
	t.Logf("bytes at 65536 positions, Hkv = 8, D = 128: f32 %d, i8 %d, i4 %d", by[F32], by[I8], by[I4])
	if float64(by[I4]) >= 0.65*float64(by[I8]) || by[I4] >= by[F32]/6 { // float64: by[I8]·65 overflows a 32-bit int
		t.Errorf("I4 Bytes %d, I8 %d, F32 %d", by[I4], by[I8], by[F32])
	}
	// Codes, scales and zeros, and the residual.
	c, _ := New(Config{B: 2, HKV: 3, D: 40, DType: I4, Capacity: 200})
	want := 2*6*200*24 + 6*200*1*8 + 6*4*48*8 + 6*i4KeyGroup*48*4
	if c.Bytes() != want {
		t.Errorf("I4 Bytes %d, want %d", c.Bytes(), want)
	}
}

// TestParseStorage checks the Storage strings of a DecodeConfig.
func TestParseStorage(t *testing.T) {
	for _, c := range []struct {
		s   string
		dt  DType
		rot bool
	}{{"", F32, false}, {"f32", F32, false}, {"i4", I4, false}, {"i4+rot", I4, true}, {"bf16+rot", BF16, true}, {"i8+rot", I8, true}} {
		dt, rot, err := ParseStorage(c.s)
		if err != nil || dt != c.dt || rot != c.rot {
			t.Errorf("ParseStorage(%q) = %v, %v, %v", c.s, dt, rot, err)
		}
	}
	for _, s := range []string{"+rot", "i4+", "i3", "i4+rot+rot", "rot"} {
		if _, _, err := ParseStorage(s); err == nil {
			t.Errorf("ParseStorage(%q) accepted", s)
		}
	}
}

// TestI4Determinism checks that I4 outputs, rotated or not, do not
// depend on the worker count, bit for bit.
func TestI4Determinism(t *testing.T) {
	rng := ref.FreshRNG(t, 29)
	sq := newSeq(rng, 1, 8, 2, 700, 40)
	for _, rot := range []bool{false, true} {
		var first []float32
		for _, w := range []int{1, 2, 3, 7} {
			got := decodeAll(t, sq, Config{B: 1, HKV: 2, D: 40, DType: I4, Rotate: rot}, []int{600}, w)
			if first == nil {
				first = got
				continue
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
					t.Fatalf("rotate %v: %d workers: output %d = %v, with 1 worker %v", rot, w, i, got[i], first[i])
				}
			}
		}
	}
}

// decodeAll feeds sq through a cache of cfg, the chunks given and then
// one position a step to the end, and returns every output and lse.
func decodeAll(t *testing.T, sq seq, cfg Config, chunks []int, workers int) []float32 {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, hkv, d := sq.s.H, sq.s.HKV, sq.s.D
	var all []float32
	t0 := 0
	for i := 0; t0 < sq.s.N; i++ {
		n := 1
		if i < len(chunks) {
			n = chunks[i]
		}
		t1 := t0 + n
		out := make([]float32, sq.s.B*h*n*d)
		lse := make([]float32, sq.s.B*h*n)
		if err := c.Step(context.Background(), h, sq.slice(sq.q, h, t0, t1), sq.slice(sq.k, hkv, t0, t1), sq.slice(sq.v, hkv, t0, t1),
			n, attn.Options{Workers: workers}, out, lse); err != nil {
			t.Fatal(err)
		}
		all = append(append(all, out...), lse...)
		t0 = t1
	}
	return all
}

// TestI4AttendShapes is TestAttendShapes for I4 caches against their
// stored rows: D not a multiple of 16 or 8 (72, 33, 20; the packed row
// rounded up to 16 codes), groups of 1 to 48 query heads (streaming,
// fused with a partial panel), several spans, lengths that leave a
// residual (200, 333) and none (1100 is not a multiple of 64; 128 is).
func TestI4AttendShapes(t *testing.T) {
	rng := ref.FreshRNG(t, 30)
	for _, sh := range []struct{ h, hkv, d, n int }{
		{8, 8, 72, 200}, {8, 2, 128, 333}, {32, 1, 72, 150}, {6, 2, 33, 130}, {5, 1, 20, 70},
		{20, 1, 40, 1100}, {48, 2, 24, 130}, {4, 4, 1, 128},
	} {
		sq := newSeq(rng, 1, sh.h, sh.hkv, sh.n, sh.d)
		c, _ := New(Config{B: 1, HKV: sh.hkv, D: sh.d, DType: I4})
		if err := c.Append(sq.k, sq.v, sh.n); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, sh.h*sh.d)
		lse := make([]float32, sh.h)
		if err := c.Attend(context.Background(), sh.h, sq.slice(sq.q, sh.h, sh.n-1, sh.n), attn.Options{Workers: 3}, out, lse); err != nil {
			t.Fatal(err)
		}
		k, v := make([]float32, sh.hkv*sh.n*sh.d), make([]float32, sh.hkv*sh.n*sh.d)
		if err := c.Read(k, v, 0, sh.n); err != nil {
			t.Fatal(err)
		}
		wantOut, wantLSE := seq{sq.s, sq.q, k, v}.want(sh.n-1, sh.n, 0, 0)
		if e := ref.RelErr(out, wantOut); e > storedTol(I4, 2e-5) {
			t.Errorf("%+v: out rel err %.3g", sh, e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > storedTol(I4, 2e-5) {
			t.Errorf("%+v: lse rel err %.3g %v", sh, e, err)
		}
	}
}

// TestI4Decoder checks that a Decoder with Storage "i4+rot" is the cache
// of I4 with Rotate, bit for bit, and that a bad Storage is refused.
func TestI4Decoder(t *testing.T) {
	rng := ref.FreshRNG(t, 31)
	const h, hkv, d, n = 6, 2, 40, 90
	sq := newSeq(rng, 1, h, hkv, n, d)
	dec, err := NewDecoder(attn.DecodeConfig{B: 1, H: h, HKV: hkv, D: d, Storage: "i4+rot", Window: 50, Sinks: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := decodeAll(t, sq, Config{B: 1, HKV: hkv, D: d, DType: I4, Rotate: true, Window: 50, Sinks: 2}, []int{70}, 0)
	var got []float32
	t0 := 0
	for _, m := range []int{70, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1} {
		out, lse := make([]float32, h*m*d), make([]float32, h*m)
		if err := dec.Step(context.Background(), sq.slice(sq.q, h, t0, t0+m), sq.slice(sq.k, hkv, t0, t0+m), sq.slice(sq.v, hkv, t0, t0+m), m, nil, out, lse); err != nil {
			t.Fatal(err)
		}
		got = append(append(got, out...), lse...)
		t0 += m
	}
	if len(got) != len(want) {
		t.Fatalf("%d outputs, want %d", len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("output %d = %v, the cache's %v", i, got[i], want[i])
		}
	}
	for _, s := range []string{"i3", "i4+rotate", "+rot"} {
		if _, err := NewDecoder(attn.DecodeConfig{B: 1, H: h, HKV: hkv, D: d, Storage: s}); err == nil {
			t.Errorf("Storage %q accepted", s)
		}
	}
}
