package kvcache

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Sparse decoding: a query that sees only some past positions (a sliding
// window, strided columns, global tokens, random blocks) reads only those
// rows. AttendRanges takes the positions as flash.Ranges, as a
// flash.Pattern's KeyRanges returns them, and runs the decode kernels over
// them: long runs of rows in place, short ones (single columns, global
// tokens) gathered into a block first, so that a scattered pattern does
// not pay a kernel call a key.

// Holds reports whether the key and value of position j are stored now:
// j < Len, and with a window j is a sink or one of the last Window
// positions. With eviction it reports whether every KV head holds j.
func (c *Cache) Holds(j int) bool {
	if j < 0 || j >= c.n {
		return false
	}
	if c.ev != nil {
		for bh := range c.cfg.B * c.cfg.HKV {
			if !slices.Contains(c.ev.pos[bh*c.cap:][:c.ev.held], j) {
				return false
			}
		}
		return true
	}
	return c.holdsRange(j, j+1)
}

// errEvicting is returned by the calls that address positions by their
// place in a ring, which an evicting cache does not keep.
func errEvicting(what string) error {
	return fmt.Errorf("%w: kvcache %s of an evicting cache, whose heads hold different positions", attn.ErrUnsupported, what)
}

// holdsRange reports whether every position of [lo, hi), within [0, Len),
// is stored: with a window the evicted ones are [Sinks, Len-Window).
func (c *Cache) holdsRange(lo, hi int) bool {
	if c.cfg.Window == 0 {
		return true
	}
	gapLo, gapHi := c.cfg.Sinks, c.n-c.cfg.Window
	return gapHi <= gapLo || hi <= gapLo || lo >= gapHi
}

// Read writes the stored keys and values of positions [lo, hi), as
// float32 (widened or dequantised as Attend reads them), into k and v,
// each [B][Hkv][hi-lo][D]. Every position must be held.
func (c *Cache) Read(k, v []float32, lo, hi int) error {
	if c.ev != nil {
		return errEvicting("Read")
	}
	if lo < 0 || hi < lo || hi > c.n || !c.holdsRange(lo, hi) {
		return fmt.Errorf("%w: kvcache Read of positions [%d, %d): the cache holds %d positions (window %d, sinks %d)",
			attn.ErrInput, lo, hi, c.n, c.cfg.Window, c.cfg.Sinks)
	}
	n, d := hi-lo, c.cfg.D
	want := c.cfg.B * c.cfg.HKV * n * d
	if len(k) != want || len(v) != want {
		return fmt.Errorf("%w: kvcache Read of %d positions wants len(K) = len(V) = B·Hkv·n·D = %d, got %d and %d",
			attn.ErrShape, n, want, len(k), len(v))
	}
	for h := range c.cfg.B * c.cfg.HKV {
		for i := range n {
			off := (h*c.cap + c.slot(lo+i)) * c.stride
			dst := (h*n + i) * d
			c.readRow(k[dst:][:d], false, off)
			c.readRow(v[dst:][:d], true, off)
		}
	}
	c.unrotate(k)
	c.unrotate(v)
	return nil
}

// readRow widens the stored row at element offset off of the keys, or of
// the values when values is set, into dst (D floats).
func (c *Cache) readRow(dst []float32, values bool, off int) {
	d := c.cfg.D
	f, h, q, s := c.kf, c.kh, c.kq, c.ks
	if values {
		f, h, q, s = c.vf, c.vh, c.vq, c.vs
	}
	switch c.cfg.DType {
	case F32:
		copy(dst, f[off:][:d])
	case BF16:
		simd.WidenBF16(dst, h[off:][:d])
	case F16:
		simd.WidenF16(dst, h[off:][:d])
	case I8:
		simd.WidenI8(dst, q[off:][:d], s[off/c.stride:][:1], d)
	case I4:
		c.readRowI4(dst, values, off/c.stride)
	}
}

// gatherBelow is the shortest run of rows a range plan reads in place;
// shorter runs are copied into a gathered block, where one kernel call
// serves up to decodeBlock of them.
const gatherBelow = 16

// rangeBlock is up to decodeBlock rows that one pair of kernel calls
// scores and adds up: n rows read in place from slot on (positions pos
// on), or, when gathered is set, the rows rows[r0:r0+n] of the plan copied
// together. masked says whether the rows' visibility must be checked.
type rangeBlock struct {
	slot, pos, n int
	r0           int
	gathered     bool
	masked       bool
}

// gatherRow is one row of a gathered block.
type gatherRow struct {
	slot, pos int
	masked    bool
}

// rangePlan is the blocks of an AttendRanges call; it is the same for
// every head.
type rangePlan struct {
	blocks []rangeBlock
	rows   []gatherRow
}

// plan splits ranges (checked by the caller) into blocks.
func (c *Cache) plan(ranges []flash.Range) rangePlan {
	var pl rangePlan
	open := -1 // the gathered block being filled
	gather := func(slot, pos int, masked bool) {
		if open < 0 || pl.blocks[open].n == decodeBlock {
			open = len(pl.blocks)
			pl.blocks = append(pl.blocks, rangeBlock{r0: len(pl.rows), gathered: true})
		}
		pl.rows = append(pl.rows, gatherRow{slot, pos, masked})
		pl.blocks[open].n++
	}
	// run handles positions [pos, pos+n) stored in consecutive slots.
	run := func(pos, n int, masked bool) {
		slot := c.slot(pos)
		if n < gatherBelow {
			for i := range n {
				gather(slot+i, pos+i, masked)
			}
			return
		}
		for i := 0; i < n; i += decodeBlock {
			pl.blocks = append(pl.blocks, rangeBlock{slot: slot + i, pos: pos + i, n: min(decodeBlock, n-i), masked: masked})
		}
	}
	w, s := c.cfg.Window, c.cfg.Sinks
	for _, r := range ranges {
		lo := r.Lo
		if w > 0 && lo < s {
			// The sinks: slots equal positions.
			hi := min(r.Hi, s)
			run(lo, hi-lo, !r.Full)
			lo = hi
		}
		for lo < r.Hi {
			// Ring rows are consecutive up to the end of the ring.
			hi := r.Hi
			if w > 0 {
				hi = min(hi, lo+s+w-c.slot(lo))
			}
			run(lo, hi-lo, !r.Full)
			lo = hi
		}
	}
	return pl
}

// AttendRanges attends one query per head, at position p, to the held
// keys at the positions in ranges: q and out are [B][H][1][D], lse nil or
// [B][H]. ranges must be sorted by Lo, non-empty and disjoint, and every
// position in them held (see Holds); the query sees every key of a Full
// range, and a key j of another range when pat.Visible(p, j) (pat may be
// nil when every range is Full). Causality is the caller's rule: p only
// enters through pat. Keys outside the ranges are never read, so the step
// costs the ranges' rows, not Len. A query that sees no key gets output 0
// and lse -Inf.
//
// The rows are cut into work items by the ranges and the shape alone,
// never the worker count, and the items' partial results merge by
// log-sum-exp in a fixed order, so the output does not depend on
// o.Workers. o.Causal is ignored; o.KVLen is not supported.
func (c *Cache) AttendRanges(ctx context.Context, h int, q []float32, p int, ranges []flash.Range, pat flash.Pattern, o attn.Options, out, lse []float32) error {
	if c.ev != nil {
		return errEvicting("AttendRanges")
	}
	s, o, err := c.checkOne("AttendRanges", h, max(c.Held(), 1), q, o, out, lse)
	if err != nil {
		return err
	}
	prev := 0
	for i, r := range ranges {
		switch {
		case r.Lo >= r.Hi || r.Lo < prev:
			return fmt.Errorf("%w: AttendRanges range %d [%d, %d) is empty, or not after the one before it", attn.ErrInput, i, r.Lo, r.Hi)
		case r.Hi > c.n || !c.holdsRange(r.Lo, r.Hi):
			return fmt.Errorf("%w: AttendRanges range [%d, %d) is not held: the cache holds %d positions (window %d, sinks %d)",
				attn.ErrInput, r.Lo, r.Hi, c.n, c.cfg.Window, c.cfg.Sinks)
		case !r.Full && pat == nil:
			return fmt.Errorf("%w: AttendRanges range [%d, %d) is not Full and there is no pattern", attn.ErrInput, r.Lo, r.Hi)
		}
		prev = r.Hi
	}
	if lse == nil {
		lse = make([]float32, s.LSELen())
	}
	q = c.rotateQ(q)
	pl := c.plan(ranges)
	if len(pl.blocks) == 0 {
		clear(out)
		for i := range lse {
			lse[i] = float32(math.Inf(-1))
		}
		return nil
	}
	g := s.Group()
	itemBlocks := spanBlocks(len(pl.blocks), s.B*s.HKV)
	spans := (len(pl.blocks) + itemBlocks - 1) / itemBlocks
	items := s.B * s.HKV * spans
	partOut := make([]float32, items*g*s.D)
	partLSE := make([]float32, items*g)
	var (
		mu   sync.Mutex
		used []*rangeScratch
	)
	defer func() {
		for _, sc := range used {
			rangePool.Put(sc)
		}
	}()
	workers := o.WorkerCount(runtime.GOMAXPROCS(0), items)
	err = parallel.For(ctx, workers, items,
		func() *rangeScratch {
			sc := c.getRangeScratch(g)
			mu.Lock()
			used = append(used, sc)
			mu.Unlock()
			return sc
		},
		func(sc *rangeScratch, it int) error {
			bh, sp := it/spans, it%spans
			b, kvh := bh/s.HKV, bh%s.HKV
			sc.dec.setQueries(q[(b*s.H+kvh*g)*s.D:][:g*s.D], s.D, o.Scale)
			blocks := pl.blocks[sp*itemBlocks : min((sp+1)*itemBlocks, len(pl.blocks))]
			c.rangeSpan(sc, &pl, blocks, bh, p, pat, partOut[it*g*s.D:][:g*s.D], partLSE[it*g:][:g])
			return nil
		})
	if err != nil {
		return err
	}
	for bh := range s.B * s.HKV {
		b, kvh := bh/s.HKV, bh%s.HKV
		for r := range g {
			row := b*s.H + kvh*g + r
			mergeSpans(out[row*s.D:][:s.D], &lse[row], partOut[(bh*spans*g+r)*s.D:], partLSE[bh*spans*g+r:], spans, g*s.D, g)
		}
	}
	c.unrotate(out)
	return nil
}

// rangeScratch is one AttendRanges worker's memory: the decode scratch and
// a one-head cache of decodeBlock rows that gathered blocks are copied
// into, so that the same kernels read them. For I4, whose keys share
// scales with their neighbours, the gathered rows are dequantised into a
// float32 one.
type rangeScratch struct {
	dec *decodeScratch
	gc  *Cache
}

var rangePool sync.Pool // *rangeScratch

func (c *Cache) getRangeScratch(g int) *rangeScratch {
	dt := c.cfg.DType
	if dt == I4 {
		dt = F32
	}
	if sc, ok := rangePool.Get().(*rangeScratch); ok && sc.dec.g == g && sc.gc.stride == c.stride &&
		sc.gc.cfg.DType == dt && sc.gc.cfg.D == c.cfg.D {
		return sc
	}
	gc := &Cache{cfg: Config{B: 1, HKV: 1, D: c.cfg.D, DType: dt}, stride: c.stride}
	gc.alloc(decodeBlock)
	return &rangeScratch{dec: newDecodeScratch(g, c.stride, decodeBlock, gc.fusedGroup(g)), gc: gc}
}

// gatherRows copies the stored rows of head bh listed in rows into the
// first len(rows) rows of gc.
func (c *Cache) gatherRows(gc *Cache, rows []gatherRow, bh int) {
	st := c.stride
	for r, x := range rows {
		src, dst := (bh*c.cap+x.slot)*st, r*st
		switch c.cfg.DType {
		case F32:
			copy(gc.kf[dst:][:st], c.kf[src:][:st])
			copy(gc.vf[dst:][:st], c.vf[src:][:st])
		case I8:
			copy(gc.kq[dst:][:st], c.kq[src:][:st])
			copy(gc.vq[dst:][:st], c.vq[src:][:st])
			gc.ks[r], gc.vs[r] = c.ks[src/st], c.vs[src/st]
		case I4:
			c.readRowI4(gc.kf[dst:][:c.cfg.D], false, src/st)
			c.readRowI4(gc.vf[dst:][:c.cfg.D], true, src/st)
		default:
			copy(gc.kh[dst:][:st], c.kh[src:][:st])
			copy(gc.vh[dst:][:st], c.vh[src:][:st])
		}
	}
}

// rangeSpan attends the group's scaled queries (in sc.dec.q) to the rows
// of blocks for head bh, with one running softmax over all of them, and
// writes each query row's partial output and lse. It is decodeSpan over
// blocks that need not be adjacent.
func (c *Cache) rangeSpan(sc *rangeScratch, pl *rangePlan, blocks []rangeBlock, bh, p int, pat flash.Pattern, out, lse []float32) {
	ds := sc.dec
	g := len(ds.m)
	st, d := c.stride, c.cfg.D
	ds.start()
	negInf := float32(math.Inf(-1))
	for _, bl := range blocks {
		src, off := c, (bh*c.cap+bl.slot)*st
		var rows []gatherRow
		if bl.gathered {
			rows = pl.rows[bl.r0:][:bl.n]
			c.gatherRows(sc.gc, rows, bh)
			src, off = sc.gc, 0
		} else {
			c.touch(ds, off, bl.n)
		}
		nb := bl.n
		src.scores(ds, off, nb, g, off, 0)
		for j := range nb {
			var pos int
			switch {
			case bl.gathered && rows[j].masked:
				pos = rows[j].pos
			case !bl.gathered && bl.masked:
				pos = bl.pos + j
			default:
				continue
			}
			if !pat.Visible(p, pos) {
				for r := range g {
					ds.s[r*ds.lds+j] = negInf
				}
			}
		}
		for r := range g {
			ds.exp(r, ds.s[r*ds.lds:][:nb])
		}
		src.values(ds, off, nb, g, off, 0)
	}
	ds.finish(d, out, lse)
}
