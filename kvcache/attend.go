package kvcache

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Step attends nq new queries to everything the cache holds and to their
// own keys, then appends those keys and values. q is [B][H][nq][D]; k and v
// are [B][Hkv][nq][D]; out is [B][H][nq][D] and lse, if not nil, [B][H][nq].
// The queries sit at positions Len() … Len()+nq-1 and see keys by the
// causal rule (and the window, if any), whatever o.Causal says. o.KVLen is
// not supported: every batch row of a cache has the same length.
func (c *Cache) Step(ctx context.Context, h int, q, k, v []float32, nq int, o attn.Options, out, lse []float32) error {
	s, err := c.shape(h, nq, nq)
	if err != nil {
		return err
	}
	if err := attn.Check(s, q, k, v, out, lse, c.options(o)); err != nil {
		return err
	}
	if o.KVLen != nil {
		return fmt.Errorf("%w: kvcache: key lengths per batch row", attn.ErrUnsupported)
	}
	o = c.options(o)
	if err := c.checkFull(nq); err != nil {
		return err
	}
	if nq == 1 {
		if err := c.compressPrompt(ctx, o.Workers); err != nil {
			return err
		}
	}
	if lse == nil {
		lse = make([]float32, s.LSELen())
	}
	// Queries rotated as the stored keys and values are.
	qr := q
	if c.Held() > 0 || c.ev != nil {
		qr = c.rotateQ(q)
	}
	attend := c.attendChunk
	if nq == 1 {
		attend = c.attendOne
	}
	if err := attend(ctx, s, q, qr, k, v, o, out, lse); err != nil {
		return err
	}
	k, v = c.rotateKV(k, v)
	if c.ev != nil {
		return c.evictStep(ctx, h, qr, k, v, nq, o, lse)
	}
	return c.appendRows(k, v, nq)
}

// attendChunk is Step's attention for a chunk of new positions (q
// unrotated, qr rotated): the chunk's own part, causal over the new keys
// (and the window; an evicting cache's chunk sees itself whole), then the
// cached part merged in by log-sum-exp, its output rotated back.
func (c *Cache) attendChunk(ctx context.Context, s attn.Shape, q, qr, k, v []float32, o attn.Options, out, lse []float32) error {
	kn := flash.New(flash.Config{})
	selfOpts := o
	selfOpts.Causal = true
	var pat flash.Pattern
	if c.cfg.Window > 0 && c.ev == nil {
		pat = chunkWindow{c.n, c.cfg.Window, c.cfg.Sinks}
	} else {
		pat = allKeys{}
	}
	if err := kn.ForwardPattern(ctx, s, q, k, v, selfOpts, pat, out, lse); err != nil {
		return err
	}
	if c.Held() == 0 {
		return nil
	}
	cOut := make([]float32, len(out))
	cLSE := make([]float32, len(lse))
	if err := c.attendCached(ctx, s.H, qr, s.N, o, cOut, cLSE); err != nil {
		return err
	}
	c.unrotate(cOut)
	return attn.Merge(out, lse, cOut, cLSE, c.cfg.D)
}

// attendOne is Step's attention for one new position a sequence (q
// unrotated, qr rotated): its query sees its own key, always (a window
// holds at least the newest position, and an evicting cache's chunk sees
// itself whole), and that one key's part of the attention is its value
// with lse the scaled logit, merged into the cached part by log-sum-exp.
// Computed so rather than by the fused kernel as a chunk's is, it costs no
// kernel call, tiles or partial rows.
func (c *Cache) attendOne(ctx context.Context, s attn.Shape, q, qr, k, v []float32, o attn.Options, out, lse []float32) error {
	d, g := s.D, s.Group()
	if c.Held() > 0 {
		if err := c.attendCached(ctx, s.H, qr, 1, o, out, lse); err != nil {
			return err
		}
		c.unrotate(out)
	} else {
		clear(out)
		for i := range lse {
			lse[i] = float32(math.Inf(-1))
		}
	}
	for b := range s.B {
		for h := range s.H {
			row := b*s.H + h
			kv := (b*s.HKV + h/g) * d
			own := o.Scale * simd.Dot(q[row*d:][:d], k[kv:][:d])
			attn.MergeRow(out[row*d:][:d], &lse[row], v[kv:][:d], own)
		}
	}
	return nil
}

// Attend computes attention for queries of the newest positions, already
// appended: q is [B][H][1][D] for position Len()-1, which sees every held
// key allowed by the window. It is the decode step when keys and values are
// appended separately, and what the decode benchmark times.
func (c *Cache) Attend(ctx context.Context, h int, q []float32, o attn.Options, out, lse []float32) error {
	if c.n == 0 {
		return fmt.Errorf("%w: Attend on an empty cache", attn.ErrInput)
	}
	s, o, err := c.checkOne("Attend", h, c.Held(), q, o, out, lse)
	if err != nil {
		return err
	}
	if lse == nil {
		lse = make([]float32, s.LSELen())
	}
	// The query is the newest position: it sees every held key but those
	// that left its window, and the decode kernel checks each row.
	qr := c.rotateQ(q)
	if err := c.decode(ctx, s, qr, c.n-1, true, o, out, lse); err != nil {
		return err
	}
	c.unrotate(out)
	if c.ev != nil && c.ev.policy == H2O {
		return c.h2oAttend(ctx, h, qr, o, lse)
	}
	return nil
}

// h2oAttend adds the probabilities of Attend's queries (rotated q, their
// lse) to the scores of the held rows.
func (c *Cache) h2oAttend(ctx context.Context, h int, q []float32, o attn.Options, lse []float32) error {
	heads := c.cfg.B * c.cfg.HKV
	g, d, held := h/c.cfg.HKV, c.cfg.D, c.ev.held
	add := make([]float64, heads*held)
	err := parallel.For(ctx, o.WorkerCount(runtime.GOMAXPROCS(0), heads), heads,
		func() *scoreScratch { return newScoreScratch(c.stride) },
		func(sc *scoreScratch, bh int) error {
			b, kvh := bh/c.cfg.HKV, bh%c.cfg.HKV
			rows := make([]scoreQuery, g)
			for r := range rows {
				hd := b*h + kvh*g + r
				rows[r] = scoreQuery{q: q[hd*d:][:d], scale: o.Scale, lse: lse[hd], pos: c.n - 1}
			}
			c.scoreHeld(sc, bh, rows, add[bh*held:][:held])
			return nil
		})
	if err != nil {
		return err
	}
	for bh := range heads {
		sc := c.ev.score[bh*c.cap:][:held]
		for j, x := range add[bh*held:][:held] {
			sc[j] += x
		}
	}
	return nil
}

// checkOne validates the arguments of a one-query-a-head call (Attend,
// AttendRanges) against m keys and returns its shape and options.
func (c *Cache) checkOne(what string, h, m int, q []float32, o attn.Options, out, lse []float32) (attn.Shape, attn.Options, error) {
	s, err := c.shape(h, 1, m)
	if err != nil {
		return s, o, err
	}
	if len(q) != s.QLen() || len(out) != s.QLen() || (lse != nil && len(lse) != s.LSELen()) {
		return s, o, fmt.Errorf("%w: %s wants len(q) = len(out) = B·H·D = %d and len(lse) = B·H = %d, got %d, %d, %d",
			attn.ErrShape, what, s.QLen(), s.LSELen(), len(q), len(out), len(lse))
	}
	if o.KVLen != nil {
		return s, o, fmt.Errorf("%w: kvcache: key lengths per batch row", attn.ErrUnsupported)
	}
	o = c.options(o)
	return s, o, o.Check(s)
}

// shape is the attention shape of nq queries from h heads against m keys.
func (c *Cache) shape(h, nq, m int) (attn.Shape, error) {
	s := attn.Shape{B: c.cfg.B, H: h, HKV: c.cfg.HKV, N: nq, M: max(m, 1), D: c.cfg.D}
	return s, s.Validate()
}

// options fills in the defaults the cache's kernels rely on.
func (c *Cache) options(o attn.Options) attn.Options {
	o.Scale = o.ScaleFor(c.cfg.D)
	o.Causal = false
	return o
}

// attendCached attends the nq new queries (positions Len()…) to the held
// keys only, all of which are in their past.
func (c *Cache) attendCached(ctx context.Context, h int, q []float32, nq int, o attn.Options, out, lse []float32) error {
	s, err := c.shape(h, nq, c.Held())
	if err != nil {
		return err
	}
	if nq == 1 {
		return c.decode(ctx, s, q, c.n, false, o, out, lse)
	}
	var pat flash.Pattern
	if c.cfg.Window > 0 && c.ev == nil {
		pat = cachedWindow{c, s.N}
	}
	return flash.New(flash.Config{}).ForwardKV(ctx, s, q, cacheKV{c}, o, pat, out, lse)
}

// visible reports whether the query at position p sees the key at
// position j (j <= p is the caller's business).
func (c *Cache) visible(p, j int) bool {
	return c.cfg.Window == 0 || j < c.cfg.Sinks || j > p-c.cfg.Window
}

// decodeBlock is the number of cached rows a decode worker scores at once;
// block16 that for a 16-bit cache and i4Block for an int4 one, both
// streamed by groups of up to streamGroup query heads. An int4 block's
// kernels do more per call besides the block's arithmetic (the queries
// rounded again for each key group, the zeros' sums, a GemmU4BF16 call
// per channel group), and blocks of 256 rows made its step faster. For
// 16-bit caches blocks of 128 rows made the step faster (f16 at 16k and
// 64k positions, bf16 at 64k), with 256 no faster still; float32 caches
// measured the same with 128, and int8 ones were slower with 256
// (results/2026-12-07 has the figures).
const (
	decodeBlock = 64
	block16     = 128
	i4Block     = 256
)

// spanBlocks returns the number of blocks of one head's rows a work item
// of a decode step takes, for blocks a head and heads heads (B·Hkv): about
// decodeItems items in all, at most maxSpans a head and at least
// minSpanBlocks blocks an item. That is enough items to keep as many
// workers busy, and no more, since fewer, longer items make a step faster:
// each costs a start, a finish and a partial row to merge, and its first
// block is read without the prefetch that the block before gives each of
// the others. The rules the steps had before (each head's rows split 16
// ways, in spans of at most 16 blocks; 4 blocks an item for
// AttendRanges) were slower with 8 or more heads, and so were items of 1
// or 2 blocks, or 32 items, with one head (results/2026-12-07, "Sixteenth
// session"). The items depend on the shape and the rows alone, never on
// the worker count, so that the rounding of the merge, and the output,
// do not either.
func spanBlocks(blocks, heads int) int {
	perHead := min(maxSpans, max(1, (decodeItems+heads-1)/heads))
	return max(minSpanBlocks, (blocks+perHead-1)/perHead)
}

const (
	decodeItems   = 32
	maxSpans      = 16
	minSpanBlocks = 4
)

// decodeRows returns the rows of a decode block for groups of g query
// heads.
func (c *Cache) decodeRows(g int) int {
	if c.fusedGroup(g) {
		return decodeBlock
	}
	switch c.cfg.DType {
	case I4:
		return i4Block
	case BF16, F16:
		return block16
	}
	return decodeBlock
}

// streamGroup is the largest group of query heads per key/value head for
// which the decode step streams every cache: its kernels read 16-bit and
// int8 rows in place and prefetch the next block as they compute. Larger groups
// (Hkv = 1 of H = 32) do enough arithmetic per byte to be bound by it
// rather than by memory. They take the fused tile kernel (fusedDecode)
// unless rows must be checked against a window; on that path the kernels
// without prefetch hints are faster, and so is widening a block of 16-bit
// values once into a float32 scratch rather than once per 6-row block of
// queries (figures: results/2026-12-07, "Figures moved out of code comments").
// See fusedGroup for the caches that stream all the same.
const streamGroup = 15

// fusedGroup reports whether groups of g query heads take the fused tile
// kernel, or the row path with its blocks widened once (see streamGroup),
// rather than the streaming kernels. Two storage types stream at any g:
// int4, whose fused path widens each row in Go, and bfloat16 where the
// CPU multiplies in it (simd.NativeBF16), whose streaming kernels multiply
// bfloat16 pairs at twice the float32 rate where the fused kernel would
// widen every element (results/2026-12-08, "Large groups on bfloat16 and
// int4 caches stream").
func (c *Cache) fusedGroup(g int) bool {
	if g <= streamGroup {
		return false
	}
	switch c.cfg.DType {
	case I4:
		return false
	case BF16:
		return !simd.NativeBF16()
	}
	return true
}

// decode attends one query per head, at position p, to the held rows, in
// parallel over (batch, kv head, span of rows). inclusive says whether the
// key at position p itself is held (Attend) or not (Step).
func (c *Cache) decode(ctx context.Context, s attn.Shape, q []float32, p int, inclusive bool, o attn.Options, out, lse []float32) error {
	held := c.Held()
	g := s.Group()
	procs := runtime.GOMAXPROCS(0)
	workers := o.WorkerCount(procs, s.B*s.HKV*held)
	// Spans of rows, whole blocks each (see spanBlocks).
	blk := c.decodeRows(g)
	spanLen := spanBlocks((held+blk-1)/blk, s.B*s.HKV) * blk
	spans := (held + spanLen - 1) / spanLen
	items := s.B * s.HKV * spans

	part := getParts(items * g * (s.D + 1))
	defer partsPool.Put(part)
	partOut, partLSE := (*part)[:items*g*s.D], (*part)[items*g*s.D:]
	var (
		mu   sync.Mutex
		used []*decodeScratch
	)
	defer func() {
		for _, sc := range used {
			scratchPool.Put(sc)
		}
	}()
	err := parallel.For(ctx, workers, items,
		func() *decodeScratch {
			sc := getDecodeScratch(g, c.stride, blk, c.fusedGroup(g))
			mu.Lock()
			used = append(used, sc)
			mu.Unlock()
			return sc
		},
		func(sc *decodeScratch, it int) error {
			bh, sp := it/spans, it%spans
			b, kvh := bh/s.HKV, bh%s.HKV
			lo, hi := sp*spanLen, min((sp+1)*spanLen, held)
			po, pl := partOut[it*g*s.D:][:g*s.D], partLSE[it*g:][:g]
			if sc.fused != nil && !c.checkRows() {
				sc.fused.span(c, q[(b*s.H+kvh*g)*s.D:][:g*s.D], o.Scale, bh, lo, hi, po, pl)
				return nil
			}
			sc.setQueries(q[(b*s.H+kvh*g)*s.D:][:g*s.D], s.D, o.Scale)
			c.decodeSpan(sc, bh, lo, hi, p, inclusive, po, pl)
			return nil
		})
	if err != nil {
		return err
	}
	// Merge each head's spans.
	for bh := range s.B * s.HKV {
		b, kvh := bh/s.HKV, bh%s.HKV
		for r := range g {
			row := b*s.H + kvh*g + r
			mergeSpans(out[row*s.D:][:s.D], &lse[row], partOut[(bh*spans*g+r)*s.D:], partLSE[bh*spans*g+r:], spans, g*s.D, g)
		}
	}
	return nil
}

// partsPool keeps the spans' partial outputs between steps: allocated
// afresh, their pages were faulted in again at every step, which took
// as long as the step's arithmetic on a VM measured.
var partsPool sync.Pool

// getParts returns a buffer of n float32 from partsPool, or a new one.
func getParts(n int) *[]float32 {
	if p, ok := partsPool.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	p := make([]float32, n)
	return &p
}

// mergeSpans sets o and *l to the attention output and lse of one query
// row over all its spans: spans partial rows, the first at part[0:len(o)]
// and each the next stride elements further, their lse at lses[0], then
// each lseStride further. It is attn.MergeRow over the spans in one pass:
// the weights exp(lse - max) with one exp a span, a vector multiply-add
// a span and one log, where merging pair by pair took two exps, a log and
// a scalar loop a span, a large share of a step with many spans a row
// (figures: results/2026-12-07, "Figures moved out of code comments").
func mergeSpans(o []float32, l *float32, part []float32, lses []float32, spans, stride, lseStride int) {
	m := math.Inf(-1)
	for sp := range spans {
		m = max(m, float64(lses[sp*lseStride]))
	}
	clear(o)
	if math.IsInf(m, -1) {
		*l = float32(m)
		return
	}
	var sum float64
	for sp := range spans {
		w := math.Exp(float64(lses[sp*lseStride]) - m)
		if w == 0 {
			continue
		}
		sum += w
		simd.Axpy(float32(w), part[sp*stride:][:len(o)], o)
	}
	simd.Scale(o, float32(1/sum))
	*l = float32(m + math.Log(sum))
}

// decodeScratch is one decode worker's memory, reused across items.
type decodeScratch struct {
	g, stride int
	q         []float32 // [g][stride] scaled queries, zero past D
	lds       int       // rows of a block (decodeRows), the row stride of s
	s         []float32 // [g][lds] scores, then probabilities
	vb        []float32 // [lds][stride] widened values, for fusedGroup
	acc       []float32 // [g][stride]
	m, l      []float32
	sink      float32 // keeps the touch loads from being optimised away
	// fused, for fusedGroup, runs spans without window masks
	// through the fused attention kernel.
	fused *fusedDecode
	q4    *i4Scratch // for I4 blocks, made on first use
}

// setQueries copies the group's queries, len(q)/d rows of d values, into
// sc.q (rows sc.stride apart), scaled.
func (sc *decodeScratch) setQueries(q []float32, d int, scale float32) {
	for r := range len(q) / d {
		dst := sc.q[r*sc.stride:][:d]
		for i, x := range q[r*d:][:d] {
			dst[i] = x * scale
		}
	}
}

// start resets the running maxima, sums and accumulators for a span.
func (sc *decodeScratch) start() {
	clear(sc.acc)
	for r := range sc.m {
		sc.m[r] = float32(math.Inf(-1))
		sc.l[r] = 0
	}
	if sc.q4 != nil {
		clear(sc.q4.zacc)
	}
}

// exp turns query row r's scores of a block, sr, into probabilities
// under its running maximum, in place, and adds them to its running sum.
// When the block raises the maximum, the sum and the accumulators are
// rescaled to it first; a row whose scores are all -Inf so far gets
// zeros.
func (sc *decodeScratch) exp(r int, sr []float32) {
	mx := max(sc.m[r], simd.Max(sr))
	if mx == float32(math.Inf(-1)) {
		clear(sr)
		return
	}
	if mx > sc.m[r] {
		f := float32(math.Exp(float64(sc.m[r] - mx)))
		sc.l[r] *= f
		simd.Scale(sc.acc[r*sc.stride:][:sc.stride], f)
		if sc.q4 != nil {
			ng := len(sc.q4.zacc) / sc.g
			simd.Scale(sc.q4.zacc[r*ng:][:ng], f)
		}
		sc.m[r] = mx
	}
	sc.l[r] += simd.ExpSum(sr, mx)
}

// finish writes each query row's output (d values) and lse at the end of
// a span.
func (sc *decodeScratch) finish(d int, out, lse []float32) {
	st := sc.stride
	if sc.q4 != nil {
		sc.q4.addZeros(sc.acc, st, d)
	}
	for r := range sc.m {
		o := out[r*d:][:d]
		if sc.l[r] == 0 {
			clear(o)
			lse[r] = float32(math.Inf(-1))
			continue
		}
		inv := 1 / sc.l[r]
		for i, a := range sc.acc[r*st:][:d] {
			o[i] = a * inv
		}
		lse[r] = sc.m[r] + float32(math.Log(float64(sc.l[r])))
	}
}

// scratchPool keeps decode scratch between steps: a step of a few
// microseconds' arithmetic would otherwise spend as long again allocating
// and zeroing it, and collecting it later.
var scratchPool sync.Pool

// getDecodeScratch returns scratch for groups of g query heads, rows
// of stride elements and blocks of lds rows, with the fused kernel's
// (fusedGroup) or not, from scratchPool if it holds such.
func getDecodeScratch(g, stride, lds int, fused bool) *decodeScratch {
	if sc, ok := scratchPool.Get().(*decodeScratch); ok && sc.g == g && sc.stride == stride && sc.lds == lds && (sc.fused != nil) == fused {
		return sc
	}
	return newDecodeScratch(g, stride, lds, fused)
}

func newDecodeScratch(g, stride, lds int, fused bool) *decodeScratch {
	sc := &decodeScratch{
		g: g, stride: stride, lds: lds,
		q:   make([]float32, g*stride),
		s:   make([]float32, g*lds),
		acc: make([]float32, g*stride),
		m:   make([]float32, g),
		l:   make([]float32, g),
	}
	if fused {
		sc.vb = make([]float32, lds*stride)
		sc.fused = newFusedDecode(g, stride)
	}
	return sc
}

// decodeSpan attends the group's queries to rows [lo, hi) of head bh and
// writes the partial output and lse of each query row.
func (c *Cache) decodeSpan(sc *decodeScratch, bh, lo, hi, p int, inclusive bool, out, lse []float32) {
	g := len(sc.m)
	st, d := c.stride, c.cfg.D
	sc.start()
	checkRows := c.checkRows()
	base := bh * c.cap * st
	stream := sc.vb == nil
	blk := sc.lds
	for j0 := lo; j0 < hi; j0 += blk {
		nb := min(blk, hi-j0)
		// The kernels prefetch the next block as they compute (see
		// touch): the keys while they score, the values while they add
		// them up.
		next := min(j0+nb, hi)
		nn := min(blk, hi-next)
		if !stream {
			nn = 0
		}
		if j0 == lo || !stream || c.cfg.DType == F32 || c.cfg.DType == BF16 || g == 1 {
			c.touch(sc, base+j0*st, nb)
		}
		// Each key row is loaded once for all g query rows of the group;
		// 16-bit and int8 keys are widened in registers as they are read.
		c.scores(sc, base+j0*st, nb, g, base+next*st, nn)
		for r := range g {
			sr := sc.s[r*blk:][:nb]
			if checkRows {
				for j := range nb {
					if pos := c.position(j0 + j); !c.visible(p, pos) || (!inclusive && pos == p) {
						sr[j] = float32(math.Inf(-1))
					}
				}
			}
			sc.exp(r, sr)
		}
		c.values(sc, base+j0*st, nb, g, base+next*st, nn)
	}
	sc.finish(d, out, lse)
}

// checkRows reports whether some held row has left the window of the
// newest query, so that the decode kernels must check rows one by one.
func (c *Cache) checkRows() bool {
	return c.ev == nil && c.cfg.Window > 0 && c.n > c.cfg.Sinks+c.cfg.Window-1
}

// touch reads (or for 16-bit rows prefetches) every 64-byte line of nb
// stored K and V rows from element offset off. The kernels read a block
// in an order the hardware prefetcher follows one line at a time (V in
// column panels, K a few rows at a time); this plain pass puts all of the block's lines in
// flight at once, so they arrive at streaming speed and the kernels then
// read the L2 cache.
//
// Its loads hold up the core until their lines arrive, so nothing else
// runs meanwhile. For the groups that stream (see fusedGroup) the
// kernels also prefetch the next block as they compute, which keeps
// memory busy during the arithmetic. A 16-bit block is then mostly in,
// or on its way, by the time it is read, and for groups of 2 or more only
// the first block of a span is touched: touching the others costs more
// than it brings. A float32 block, twice the bytes for the same
// arithmetic, is only partly in (see the prefetcher in _asm/kv.go of
// package simd), and so is a 16-bit one for a single query head, whose
// keys go by the fastest: those are touched still.
//
// A bfloat16 block is touched whole all the same, with the prefetch
// kept: where the CPU has bfloat16 arithmetic (simd.NativeBF16) its
// kernels run ahead of the prefetch, and touching every block made the
// step faster, dropping the prefetch slower (results/2026-12-06, "After
// the int4 rows kept their key norms", with the command).
//
// A 16-bit block's touch is a prefetch of each of its lines
// (simd.Prefetch) rather than a load: loads that miss hold up the core
// until their lines arrive, so the arithmetic waited for the whole block,
// while prefetches retire at once and the kernels start on the first
// lines as the rest arrive. For the other types the loads measured
// faster (results/2026-12-07, "Decode: 16-bit blocks prefetched rather
// than touched").
//
// An int8 block is touched as a 16-bit one is. For groups of 3 or more
// query heads its kernels prefetch all of the next block as they compute
// (DotRowsI8PF a line per pass over 16 columns of 4 keys or fewer, more
// than the pass reads; GemmI8 a line per 4 steps of k, what a pass
// reads), so that at Hkv = 8 the step is bound by their arithmetic: in a
// profile they ran at their speed in L1. Touching every block measured no
// different.
//
// A float32 block is read whole, with vector loads (simd.ReadSum), which
// one core streams faster than a load an element a line. The figures
// behind each choice: results/2026-12-07, "Figures moved out of code comments".
func (c *Cache) touch(sc *decodeScratch, off, nb int) {
	n := nb * c.stride
	switch c.cfg.DType {
	case F32:
		sc.sink += simd.ReadSum(c.kf[off:][:n]) + simd.ReadSum(c.vf[off:][:n])
	case I8:
		sc.sink += float32(touchLines(c.kq[off:][:n], 64) + touchLines(c.vq[off:][:n], 64))
	case I4:
		off, n := off/2, n/2
		sc.sink += float32(touchLines(c.k4[off:][:n], 64) + touchLines(c.v4[off:][:n], 64))
	default:
		simd.Prefetch(c.kh[off:][:n])
		simd.Prefetch(c.vh[off:][:n])
	}
}

// touchLines sums x[0], x[per], x[2·per], … with four independent chains.
func touchLines[T int8 | uint8](x []T, per int) T {
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4*per <= len(x); i += 4 * per {
		s0 += x[i]
		s1 += x[i+per]
		s2 += x[i+2*per]
		s3 += x[i+3*per]
	}
	for ; i < len(x); i += per {
		s0 += x[i]
	}
	return s0 + s1 + s2 + s3
}

// scores sets the first nb scores of each of the g rows of sc.s to the
// dot products of the group's queries with nb stored key rows from
// element offset off, prefetching nextN key rows from element offset
// nextOff.
func (c *Cache) scores(sc *decodeScratch, off, nb, g int, nextOff, nextN int) {
	st, d := c.stride, c.cfg.D
	n := nb * st
	switch {
	case c.cfg.DType == I4:
		c.scoresI4(sc, off, nb, g)
	case c.cfg.DType == F32 && nextN == 0:
		simd.DotRows(sc.s, sc.lds, sc.q, st, g, c.kf[off:][:n], st, nb, d)
	case c.cfg.DType == F32:
		simd.DotRowsPF(sc.s, sc.lds, sc.q, st, g, c.kf[off:][:n], st, nb, d, c.kf[nextOff:][:nextN*st])
	case c.cfg.DType == BF16:
		// In the CPU's bfloat16 arithmetic where it has one: the query
		// rounded to bfloat16 like the keys, no key widened (see
		// simd.DotRowsBF16Native).
		var pf []uint16
		if nextN > 0 {
			pf = c.kh[nextOff:][:nextN*st]
		}
		simd.DotRowsBF16Native(sc.s, sc.lds, sc.q, st, g, c.kh[off:][:n], st, nb, d, pf)
	case c.cfg.DType == I8:
		if nextN == 0 {
			simd.DotRowsI8(sc.s, sc.lds, sc.q, st, g, c.kq[off:][:n], st, nb, d)
		} else {
			simd.DotRowsI8PF(sc.s, sc.lds, sc.q, st, g, c.kq[off:][:n], st, nb, d, c.kq[nextOff:][:nextN*st])
		}
		// The scores of the codes, times each row's scale, in the
		// vector kernel rather than a Go loop (faster: results/2026-12-07, "Figures moved out of code comments").
		simd.ScaleColumns(sc.s, sc.lds, g, c.ks[off/st:][:nb])
	case nextN == 0:
		simd.DotRowsF16(sc.s, sc.lds, sc.q, st, g, c.kh[off:][:n], st, nb, d)
	default:
		simd.DotRowsF16PF(sc.s, sc.lds, sc.q, st, g, c.kh[off:][:n], st, nb, d, c.kh[nextOff:][:nextN*st])
	}
}

// values adds the products of the first nb probabilities of each of the g
// rows of sc.s with nb stored value rows from element offset off to the
// group's accumulators, prefetching nextN value rows from element offset
// nextOff. 16-bit and int8 values are widened in registers as they are
// read, over the D values of a row rounded up to 8; for large groups
// (sc.vb not nil) they are widened once into sc.vb instead.
func (c *Cache) values(sc *decodeScratch, off, nb, g int, nextOff, nextN int) {
	st := c.stride
	if c.cfg.DType == F32 && nextN == 0 {
		simd.Gemm(g, st, nb, sc.s, sc.lds, c.vf[off:][:nb*st], st, sc.acc, st, true)
		return
	}
	if sc.vb != nil {
		c.widenRows(sc.vb, true, off, nb)
		simd.Gemm(g, st, nb, sc.s, sc.lds, sc.vb[:nb*st], st, sc.acc, st, true)
		return
	}
	w := (c.cfg.D + 7) &^ 7
	switch c.cfg.DType {
	case I4:
		c.valuesI4(sc, off, nb, g)
	case F32:
		simd.GemmPF(g, w, nb, sc.s, sc.lds, c.vf[off:][:(nb-1)*st+w], st, sc.acc, st, true, c.vf[nextOff:][:nextN*st])
	case BF16:
		// The probabilities rounded to bfloat16 where the CPU multiplies
		// in it, as FlashAttention does on GPUs.
		simd.GemmBF16Native(g, w, nb, sc.s, sc.lds, c.vh[off:][:(nb-1)*st+w], st, sc.acc, st, true, c.vh[nextOff:][:nextN*st])
	case F16:
		simd.GemmF16(g, w, nb, sc.s, sc.lds, c.vh[off:][:(nb-1)*st+w], st, sc.acc, st, true, c.vh[nextOff:][:nextN*st])
	case I8:
		// Σ_j p_j·(code_j·scale_j) = Σ_j (p_j·scale_j)·code_j: the
		// probabilities times each row's scale, then the codes.
		simd.ScaleColumns(sc.s, sc.lds, g, c.vs[off/st:][:nb])
		simd.GemmI8(g, w, nb, sc.s, sc.lds, c.vq[off:][:(nb-1)*st+w], st, sc.acc, st, true, c.vq[nextOff:][:nextN*st])
	}
}

// widenRows writes into dst, as float32, nb stored rows of a 16-bit or
// int8 cache from element offset off: keys, or values when values is set
// (int8 codes dequantised, each times its row's scale).
func (c *Cache) widenRows(dst []float32, values bool, off, nb int) {
	n := nb * c.stride
	h, q, scales := c.kh, c.kq, c.ks
	if values {
		h, q, scales = c.vh, c.vq, c.vs
	}
	switch c.cfg.DType {
	case BF16:
		simd.WidenBF16(dst[:n], h[off:][:n])
	case F16:
		simd.WidenF16(dst[:n], h[off:][:n])
	case I8:
		simd.WidenI8(dst[:n], q[off:][:n], scales[off/c.stride:][:nb], c.stride)
	case I4:
		st, d := c.stride, c.cfg.D
		for r := range nb {
			row := dst[r*st:][:st]
			c.readRowI4(row, values, off/st+r)
			clear(row[d:])
		}
	}
}

// cacheKV lets the fused kernel read the held rows, in row order.
type cacheKV struct{ c *Cache }

func (kv cacheKV) PackK(dst []float32, ld, b, kvh, j0, n int) {
	c := kv.c
	d := c.cfg.D
	var row []float32
	if c.cfg.DType == I4 {
		row = make([]float32, d)
	}
	for j := range n {
		off := ((b*c.cfg.HKV+kvh)*c.cap + j0 + j) * c.stride
		if row != nil {
			c.readRowI4(row, false, off/c.stride)
			for i, x := range row {
				dst[i*ld+j] = x
			}
			continue
		}
		if c.cfg.DType == I8 { // the row's scale once
			f := c.ks[off/c.stride]
			for i, x := range c.kq[off:][:d] {
				dst[i*ld+j] = float32(x) * f
			}
			continue
		}
		for i := range d {
			dst[i*ld+j] = c.at(false, off+i)
		}
	}
}

func (kv cacheKV) PackV(dst []float32, ld, b, kvh, j0, n int) {
	c := kv.c
	d := c.cfg.D
	for j := range n {
		off := ((b*c.cfg.HKV+kvh)*c.cap + j0 + j) * c.stride
		row := dst[j*ld:][:d]
		switch c.cfg.DType {
		case I8:
			simd.WidenI8(row, c.vq[off:][:d], c.vs[off/c.stride:][:1], d)
			continue
		case I4:
			c.readRowI4(row, true, off/c.stride)
			continue
		}
		for i := range row {
			row[i] = c.at(true, off+i)
		}
	}
}

// at returns element i of the stored keys (v false) or values (v true)
// as float32.
func (c *Cache) at(v bool, i int) float32 {
	f, h, q, s := c.kf, c.kh, c.kq, c.ks
	if v {
		f, h, q, s = c.vf, c.vh, c.vq, c.vs
	}
	switch c.cfg.DType {
	case BF16:
		return half.BF16ToF32(h[i])
	case F16:
		return half.F16ToF32(h[i])
	case I8:
		return float32(q[i]) * s[i/c.stride]
	case I4:
		row := make([]float32, c.cfg.D)
		c.readRowI4(row, v, i/c.stride)
		return row[i%c.stride]
	}
	return f[i]
}

// allKeys is the dense pattern; the causal mask does the work.
type allKeys struct{}

func (allKeys) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	return append(dst, flash.Range{Lo: 0, Hi: m, Full: true})
}
func (allKeys) Visible(p, j int) bool { return true }

// chunkWindow is the window over a chunk of new tokens that starts at
// absolute position base; with N = M, chunk index and flash position agree.
type chunkWindow struct{ base, w, sinks int }

func (cw chunkWindow) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	// Sinks that fall inside the chunk, then the band (p0-w, p1).
	sinkEnd := min(max(cw.sinks-cw.base, 0), m)
	lo := max(p0-cw.w+1, sinkEnd, 0)
	if sinkEnd > 0 {
		dst = append(dst, flash.Range{Lo: 0, Hi: sinkEnd, Full: true})
	}
	if lo < p1 {
		dst = append(dst, flash.Range{Lo: lo, Hi: p1, Full: false})
	}
	return dst
}

func (cw chunkWindow) Visible(p, j int) bool {
	return j+cw.base < cw.sinks || j > p-cw.w
}

// cachedWindow masks held rows by the window for a chunk of n new queries.
type cachedWindow struct {
	c *Cache
	n int
}

func (cw cachedWindow) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	return append(dst, flash.Range{Lo: 0, Hi: m})
}

func (cw cachedWindow) Visible(p, j int) bool {
	// flash's position p is M-N+i; the query is at cache position Len()+i.
	q := cw.c.n + p - (cw.c.Held() - cw.n)
	return cw.c.visible(q, cw.c.position(j))
}
