package sparse

import (
	"context"
	"fmt"
	"math"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
)

// stepRule is a layout's causal pattern for one query at a time, as a
// decoder reads it: the exact set of keys, not a cover of a tile's.
type stepRule interface {
	// keys appends to dst the keys j <= p that the query at position p
	// (>= 0) sees, as sorted, disjoint, non-adjacent Full ranges.
	keys(dst []flash.Range, p int) []flash.Range
	// reach returns r >= 0 when no query at p or later sees a key below
	// p-r, so that a decoder may forget those; -1 when queries may see
	// any key of the past.
	reach() int
}

// addRange appends [lo, hi) (clipped at 0) to sorted ranges, joining it
// to the last one when they touch.
func addRange(dst []flash.Range, lo, hi int) []flash.Range {
	lo = max(lo, 0)
	if lo >= hi {
		return dst
	}
	if n := len(dst); n > 0 && lo <= dst[n-1].Hi {
		dst[n-1].Hi = max(dst[n-1].Hi, hi)
		return dst
	}
	return append(dst, flash.Range{Lo: lo, Hi: hi, Full: true})
}

func (l windowLayout) stepRule() stepRule { return windowRule{l.w} }

type windowRule struct{ w Window }

func (r windowRule) keys(dst []flash.Range, p int) []flash.Range {
	w := r.w
	if w.Dilation <= 1 {
		return addRange(dst, p-w.Left, p+1)
	}
	d := w.Dilation
	for j := p - min(w.Left/d, p/d)*d; j <= p; j += d {
		dst = addRange(dst, j, j+1)
	}
	return dst
}

func (r windowRule) reach() int { return r.w.Left }

func (l stridedLayout) stepRule() stepRule { return stridedRule{l.st} }

type stridedRule struct{ st Strided }

func (r stridedRule) keys(dst []flash.Range, p int) []flash.Range {
	l := r.st.Stride
	if r.st.Mode == ModeFixed {
		// The summary columns of the blocks before p's, then its block.
		qb, c := p/l, r.st.Summary
		if c > 0 {
			for b := range qb {
				dst = addRange(dst, b*l+l-c, (b+1)*l)
			}
		}
		return addRange(dst, qb*l, p+1)
	}
	// The columns p-k·l for k >= 2, then the band [p-l, p].
	for j := p % l; j <= p-2*l; j += l {
		dst = addRange(dst, j, j+1)
	}
	return addRange(dst, p-l, p+1)
}

func (stridedRule) reach() int { return -1 }

func (l longformerLayout) stepRule() stepRule { return longformerRule{l.lf} }

type longformerRule struct{ lf *Longformer }

func (r longformerRule) keys(dst []flash.Range, p int) []flash.Range {
	lf := r.lf
	if lf.isGlobal(p) {
		return addRange(dst, 0, p+1)
	}
	for _, g := range lf.globals {
		if g >= p-lf.left {
			break
		}
		dst = addRange(dst, g, g+1)
	}
	return addRange(dst, p-lf.left, p+1)
}

func (longformerRule) reach() int { return -1 }

func (l bigBirdLayout) stepRule() stepRule { return &bigBirdRule{l: l, qb: -1} }

// bigBirdRule keeps the key blocks of the last query block it was asked
// about: a decoder asks about each block Block times in a row.
type bigBirdRule struct {
	l      bigBirdLayout
	qb     int
	blocks []flash.Range // in blocks, [0, qb+1)
}

func (r *bigBirdRule) keys(dst []flash.Range, p int) []flash.Range {
	b := r.l.cfg.Block
	qb := p / b
	if qb != r.qb {
		// The pattern of a call whose only queries are block qb's: its
		// causal random draw is the one a whole causal Forward makes for
		// that block, whatever the length.
		pat, _ := r.l.pattern(attn.Shape{N: 1, M: p + 1}, true)
		r.blocks = pat.(*BigBird).blocksOf(r.blocks[:0], qb, qb+1)
		r.qb = qb
	}
	for _, x := range r.blocks {
		dst = addRange(dst, x.Lo*b, min(x.Hi*b, p+1))
	}
	return dst
}

func (*bigBirdRule) reach() int { return -1 }

// maxRing bounds the positions a decoder keeps in a ring buffer, which is
// allocated whole up front; a longer reach stores every position instead,
// growing with the sequence, and still reads only the visible ones.
const maxRing = 1 << 16

// NewDecoder returns the mechanism's incremental causal decoder: each
// sequence's keys and values are stored in a kvcache.Cache (element type
// cfg.Storage), and each new query reads only the keys its pattern lets
// it see, through kvcache's AttendRanges. At length T a step reads
// O(Left) keys for a window (O(Left/Dilation) dilated), which keeps
// Left+1 positions in a ring (up to 2^16; a longer window keeps every
// position and still reads only its own); O(l + T/l) for strided mode,
// O(l + c·T/l) for fixed mode, O(Left + globals) for Longformer (T for a
// global query) and O(Block·(Window+Globals+Random)) for BigBird (T in a
// global block). The outputs are those of one causal Forward over the
// whole sequence; BigBird's random blocks are its causal draw, which does
// not depend on the length.
//
// A chunk of n > 1 positions runs through Forward itself, its queries
// against its own keys and the stored ones, widened to float32 (for a
// window only the last Left); single positions go through AttendRanges.
//
// cfg.Window and cfg.Sinks restrict the pattern further, as for exact
// attention: the query at p sees key j when the pattern allows it and
// j > p-Window or j < Sinks. That is an intersection: a sink outside a
// window pattern's Left stays unseen. The caches then keep the Sinks and
// the last Window positions (for a window pattern, at most Left+1), and
// every step, chunks included, goes one position at a time.
//
// Bad configurations return errors wrapping attn.ErrShape or
// attn.ErrInput; a step past cfg.MaxLen one wrapping kvcache.ErrFull,
// with nothing appended.
func (a *Attention) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dt, rot, err := kvcache.ParseStorage(cfg.Storage)
	if err != nil {
		return nil, err
	}
	d := &decoder{a: a, cfg: cfg, rules: make([]stepRule, cfg.B), caches: make([]*kvcache.Cache, cfg.B)}
	for b := range d.rules {
		d.rules[b] = a.layout.stepRule()
	}
	// Positions kept past the sinks: what the pattern and the window can
	// still show a later query; -1 all.
	keep := -1
	if r := d.rules[0].reach(); r >= 0 && r < maxRing {
		keep = r + 1
	}
	if cfg.Window > 0 && (keep < 0 || cfg.Window < keep) {
		keep = cfg.Window
	}
	cc := kvcache.Config{B: 1, HKV: cfg.HKV, D: cfg.D, DType: dt, Rotate: rot}
	if keep > 0 && cfg.Sinks+keep <= maxRing && (cfg.MaxLen == 0 || cfg.Sinks+keep < cfg.MaxLen) {
		cc.Window, cc.Sinks = keep, cfg.Sinks
	} else if cfg.MaxLen > 0 {
		// The cache doubles as it fills; a long bound should not cost
		// its memory up front.
		cc.MaxLen, cc.Capacity = cfg.MaxLen, min(cfg.MaxLen, 2048)
	}
	for b := range d.caches {
		c, err := kvcache.New(cc)
		if err != nil {
			return nil, err
		}
		d.caches[b] = c
	}
	return d, nil
}

// decoder is the Decoder of a sparse Attention: one cache and one step
// rule per sequence.
type decoder struct {
	a               *Attention
	cfg             attn.DecodeConfig
	rules           []stepRule
	caches          []*kvcache.Cache
	ranges, clipped []flash.Range
	// Scratch: one sequence's rows, one position's rows, and the dense
	// keys of a chunk.
	q, k, v, out, lse  []float32
	q1, k1, v1, o1, l1 []float32
	kd, vd, kp, vp     []float32
	// lastRows is the number of keys the last single-position step
	// attended to: what it read.
	lastRows int
}

func (d *decoder) Len(b int) int { return d.caches[b].Len() }

func (d *decoder) Bytes() int {
	n := 0
	for _, c := range d.caches {
		n += c.Bytes()
	}
	return n
}

func (d *decoder) Reset() {
	for _, c := range d.caches {
		c.Reset()
	}
}

// Step implements attn.Decoder. Bad arguments and MaxLen are checked
// before anything is appended; a ctx cancelled during the step may leave
// some of its positions appended.
func (d *decoder) Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error {
	cfg := d.cfg
	if err := cfg.CheckStep(q, k, v, n, valid, out, lse); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	count := func(b int) int {
		if valid == nil {
			return n
		}
		return valid[b]
	}
	if cfg.MaxLen > 0 {
		for b, c := range d.caches {
			if c.Len()+count(b) > cfg.MaxLen {
				return fmt.Errorf("%w: sequence %d: %d + %d positions exceed MaxLen = %d", kvcache.ErrFull, b, c.Len(), count(b), cfg.MaxLen)
			}
		}
	}
	if cfg.B == 1 && valid == nil {
		return d.seqStep(ctx, 0, q, k, v, n, out, lse)
	}
	h, hkv, dd := cfg.H, cfg.HKV, cfg.D
	for b := range d.caches {
		nb := count(b)
		ob := out[b*h*n*dd:][:h*n*dd]
		var lb []float32
		if lse != nil {
			lb = lse[b*h*n:][:h*n]
		}
		if nb < n {
			clear(ob)
			for i := range lb {
				lb[i] = float32(math.Inf(-1))
			}
		}
		if nb == 0 {
			continue
		}
		d.q = compact(d.q, q[b*h*n*dd:], h, n, nb, 0, dd)
		d.k = compact(d.k, k[b*hkv*n*dd:], hkv, n, nb, 0, dd)
		d.v = compact(d.v, v[b*hkv*n*dd:], hkv, n, nb, 0, dd)
		d.out = grow(d.out, h*nb*dd)
		var ls []float32
		if lb != nil {
			d.lse = grow(d.lse, h*nb)
			ls = d.lse
		}
		if err := d.seqStep(ctx, b, d.q, d.k, d.v, nb, d.out, ls); err != nil {
			return fmt.Errorf("sequence %d: %w", b, err)
		}
		for hd := range h {
			copy(ob[hd*n*dd:][:nb*dd], d.out[hd*nb*dd:][:nb*dd])
			if lb != nil {
				copy(lb[hd*n:][:nb], d.lse[hd*nb:][:nb])
			}
		}
	}
	return nil
}

// seqStep appends and attends n positions of sequence b: q and out
// [H][n][D], k and v [Hkv][n][D], lse [H][n] or nil.
func (d *decoder) seqStep(ctx context.Context, b int, q, k, v []float32, n int, out, lse []float32) error {
	if n > 1 && d.cfg.Window == 0 {
		return d.chunk(ctx, b, q, k, v, n, out, lse)
	}
	if n == 1 {
		return d.one(ctx, b, q, k, v, out, lse)
	}
	h, hkv, dd := d.cfg.H, d.cfg.HKV, d.cfg.D
	for i := range n {
		d.q1 = compact(d.q1, q, h, n, 1, i, dd)
		d.k1 = compact(d.k1, k, hkv, n, 1, i, dd)
		d.v1 = compact(d.v1, v, hkv, n, 1, i, dd)
		d.o1 = grow(d.o1, h*dd)
		var l1 []float32
		if lse != nil {
			d.l1 = grow(d.l1, h)
			l1 = d.l1
		}
		if err := d.one(ctx, b, d.q1, d.k1, d.v1, d.o1, l1); err != nil {
			return err
		}
		for hd := range h {
			copy(out[(hd*n+i)*dd:][:dd], d.o1[hd*dd:][:dd])
			if lse != nil {
				lse[hd*n+i] = l1[hd]
			}
		}
	}
	return nil
}

// one appends one position of sequence b and attends its query to the
// keys its pattern (and the window) lets it see, itself included.
func (d *decoder) one(ctx context.Context, b int, q, k, v, out, lse []float32) error {
	c := d.caches[b]
	if err := c.Append(k, v, 1); err != nil {
		return err
	}
	p := c.Len() - 1
	rs := d.rules[b].keys(d.ranges[:0], p)
	d.ranges = rs
	if w, s := d.cfg.Window, d.cfg.Sinks; w > 0 {
		rs = clipWindow(d.clipped[:0], rs, p, w, s)
		d.clipped = rs
	}
	d.lastRows = 0
	for _, r := range rs {
		d.lastRows += r.Hi - r.Lo
	}
	o := attn.Options{Scale: d.cfg.Scale, Workers: d.cfg.Workers}
	return c.AttendRanges(ctx, d.cfg.H, q, p, rs, nil, o, out, lse)
}

// clipWindow appends to out the intersection of sorted Full ranges with
// the keys the query at p keeps under a window of w with s sinks: [0, s)
// and (p-w, p].
func clipWindow(out, rs []flash.Range, p, w, s int) []flash.Range {
	for _, r := range rs {
		lo, hi := r.Lo, r.Hi
		if sh := min(hi, s); lo < sh {
			out = append(out, flash.Range{Lo: lo, Hi: sh, Full: true})
		}
		if lo = max(lo, s, p-w+1); lo < hi {
			out = append(out, flash.Range{Lo: lo, Hi: hi, Full: true})
		}
	}
	return out
}

// chunk attends n > 1 new positions of sequence b with Forward, causal,
// over the stored keys they can see and their own, then appends them.
func (d *decoder) chunk(ctx context.Context, b int, q, k, v []float32, n int, out, lse []float32) error {
	c := d.caches[b]
	hkv, dd := d.cfg.HKV, d.cfg.D
	l0 := c.Len()
	lo := 0
	if r := d.rules[b].reach(); r >= 0 {
		// A window's pattern depends on p-j alone, so the positions
		// before lo may be dropped from the call.
		lo = max(0, l0-r)
	}
	past := l0 - lo
	m := past + n
	kd, vd := k, v
	if past > 0 {
		d.kp, d.vp = grow(d.kp, hkv*past*dd), grow(d.vp, hkv*past*dd)
		if err := c.Read(d.kp, d.vp, lo, l0); err != nil {
			return err
		}
		d.kd, d.vd = grow(d.kd, hkv*m*dd), grow(d.vd, hkv*m*dd)
		for h := range hkv {
			copy(d.kd[h*m*dd:][:past*dd], d.kp[h*past*dd:][:past*dd])
			copy(d.vd[h*m*dd:][:past*dd], d.vp[h*past*dd:][:past*dd])
			copy(d.kd[(h*m+past)*dd:][:n*dd], k[h*n*dd:][:n*dd])
			copy(d.vd[(h*m+past)*dd:][:n*dd], v[h*n*dd:][:n*dd])
		}
		kd, vd = d.kd, d.vd
	}
	s := attn.Shape{B: 1, H: d.cfg.H, HKV: hkv, N: n, M: m, D: dd}
	o := attn.Options{Scale: d.cfg.Scale, Causal: true, Workers: d.cfg.Workers}
	if err := d.a.Forward(ctx, s, q, kd, vd, o, out, lse); err != nil {
		return err
	}
	return c.Append(k, v, n)
}

// compact copies positions [i0, i0+nb) of n of each of heads rows of x
// ([heads][n][d]) into dst as [heads][nb][d].
func compact(dst, x []float32, heads, n, nb, i0, d int) []float32 {
	dst = grow(dst, heads*nb*d)
	for hd := range heads {
		copy(dst[hd*nb*d:][:nb*d], x[(hd*n+i0)*d:][:nb*d])
	}
	return dst
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

var (
	_ attn.Decodable      = (*Attention)(nil)
	_ attn.Differentiable = (*Attention)(nil)
)
