package quest

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/simd"
)

// Decoder is Quest's incremental form (see the package documentation):
// exact attention for prompt chunks, page selection for generated
// tokens. It implements attn.Decoder, attn.Appender and attn.Fallbacker
// and is not safe for concurrent use.
type Decoder struct {
	*decstore.Decoder[*scratch]
	r *rule
}

// rule is the decode rule over the store, with the page summaries.
type rule struct {
	m     *Quest
	st    *decstore.Store
	scale float32
	// summ holds, per sequence and key/value head, a row of 2·D per
	// page: the channel-wise maximum of its keys rounded up to
	// bfloat16, then the minimum rounded down. Scoring the summaries
	// is most of a step's work outside the pages it reads; rounded
	// outward they still bound every logit, at half the bytes.
	summ    [][]uint16
	indexed []int
	// settled[i] is the head's Settled count when it was indexed: keys
	// past it were read in float32 and change when their int4 group is
	// quantised (decstore.Head.Settle), so their pages are summarised
	// again.
	settled []int

	// Rows the steps have read: keys and values, and page summaries,
	// for the tests that check a step reads a fraction of the cache.
	rowsRead, pagesScored atomic.Int64
}

// NewDecoder returns an empty decoder with m's parameters for the batch
// of cfg. A cfg.Storage other than "", "f32", "bf16", "f16", "i8" or
// "i4" (each optionally "+rot") and a cfg.Window are errors wrapping
// attn.ErrUnsupported.
func (m *Quest) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	st, err := decstore.NewStore("quest", cfg, math.MaxInt, decstore.KeyGroup)
	if err != nil {
		return nil, err
	}
	r := &rule{m: m, st: st, scale: cfg.ScaleFor(), summ: make([][]uint16, cfg.B*cfg.HKV),
		indexed: make([]int, cfg.B*cfg.HKV), settled: make([]int, cfg.B*cfg.HKV)}
	return &Decoder{Decoder: decstore.New(st, r), r: r}, nil
}

// scratch is one worker's.
type scratch struct {
	q, q2      []float32 // the group's scaled queries [g][D], and [g][q⁺, q⁻]
	score      []float32 // [g][pages]
	comb, work []float32
	mark       []bool
	ranges     []span
	blocks     []span    // the ranges cut into blocks
	logits     []float32 // [g][attended]
	acc        []float32 // [g][D]
	row        []float32 // [D] a key or value widened from 16 bits
	unrot      []float32 // [D] a key or query rotated back
	sums, maxs []float32 // [g] the online softmax's sums and maxima
}

type span struct{ lo, hi int }

func (r *rule) NewScratch() *scratch { return &scratch{} }

func (r *rule) Reset() {
	for i := range r.summ {
		r.summ[i] = r.summ[i][:0]
	}
	clear(r.indexed)
	clear(r.settled)
}

func (r *rule) Bytes() int {
	n := 0
	for _, s := range r.summ {
		n += 2 * cap(s)
	}
	return n
}

// Index folds positions [indexed, n) into their pages' summaries, and
// summarises again the pages of keys that changed since (see settled).
func (r *rule) Index(sc *scratch, b, kvh, n int) {
	cfg := r.st.Config()
	dd, page := cfg.D, r.m.page
	i := b*cfg.HKV + kvh
	hd := r.st.Head(b, kvh)
	from := min(r.indexed[i], r.settled[i]) / page * page
	summ := r.summ[i][:from/page*2*dd]
	sc.row = grow(sc.row, dd)
	rot := r.st.Rotation()
	for p := from; p < n; p++ {
		key := hd.K(sc.row, p)
		if rot != nil {
			key = r.unrotate(sc, key)
		}
		if p%page == 0 {
			for _, x := range key {
				summ = append(summ, half.F32ToBF16Up(x))
			}
			for _, x := range key {
				summ = append(summ, half.F32ToBF16Down(x))
			}
			continue
		}
		row := summ[p/page*2*dd:][:2*dd]
		hi, lo := row[:dd], row[dd:]
		for c, x := range key {
			// The bounds are bfloat16 values already: the bound of the
			// maximum is the maximum rounded up.
			hi[c] = half.F32ToBF16Up(max(half.BF16ToF32(hi[c]), x))
			lo[c] = half.F32ToBF16Down(min(half.BF16ToF32(lo[c]), x))
		}
	}
	r.summ[i] = summ
	r.indexed[i] = n
	r.settled[i] = hd.Settled()
}

// layout returns, for a query at position p, the end of the sinks s0,
// the start of the recent window r0 and the candidate pages [jlo, jhi):
// those not inside [0, s0) or [r0, p].
func (m *Quest) layout(p int) (s0, r0, jlo, jhi int) {
	visible := p + 1
	s0 = min(m.sinks, visible)
	r0 = max(s0, min(visible-m.recent, p/m.page*m.page))
	jlo, jhi = s0/m.page, (r0+m.page-1)/m.page
	return s0, r0, jlo, max(jlo, jhi)
}

// Decode attends the group's queries at position p to the sinks, the
// recent window and the chosen pages.
func (r *rule) Decode(sc *scratch, b, kvh, p int, q, out, lse []float32) {
	m := r.m
	cfg := r.st.Config()
	dd, g, page := cfg.D, cfg.H/cfg.HKV, m.page
	sc.q = grow(sc.q, g*dd)
	for i, x := range q {
		sc.q[i] = x * r.scale
	}
	visible := p + 1
	s0, r0, jlo, jhi := m.layout(p)
	nc, kp := jhi-jlo, m.budget/page
	sc.ranges = sc.ranges[:0]
	if nc <= kp {
		sc.ranges = append(sc.ranges, span{0, visible})
	} else {
		sc.mark = growBool(sc.mark, nc)
		clear(sc.mark)
		r.choose(sc, b, kvh, jlo, nc, kp)
		sc.add(0, s0)
		for j, ok := range sc.mark {
			if ok {
				sc.add(max((jlo+j)*page, s0), min((jlo+j+1)*page, r0))
			}
		}
		sc.add(r0, visible)
	}
	r.attend(sc, r.st.Head(b, kvh), g, out, lse)
}

// unrotate returns x rotated back (a copy in sc.unrot): with "+rot" the
// summaries are of the keys as they were given, and so are the queries
// scored against them. A rotation spreads each key's channels over its
// block, widening every channel's range in a page and loosening the
// bound (on austen-long's needle at 1024 tokens and a budget of 64,
// quest on f32+rot rows found 0.85 of the needles against 0.97 on f32).
func (r *rule) unrotate(sc *scratch, x []float32) []float32 {
	sc.unrot = append(sc.unrot[:0], x...)
	r.st.Rotation().Invert(sc.unrot)
	return sc.unrot
}

// scores sets sc.score [g][nc] to the scores of candidate pages
// [jlo, jlo+nc) for the group's scaled queries sc.q: the upper bound
// [q⁺, q⁻]·[max, min] of each head's logits within each page.
func (r *rule) scores(sc *scratch, b, kvh, jlo, nc int) {
	cfg := r.st.Config()
	dd, g := cfg.D, cfg.H/cfg.HKV
	sc.q2 = grow(sc.q2, g*2*dd)
	for h := range g {
		qh := sc.q[h*dd : (h+1)*dd]
		if r.st.Rotation() != nil {
			qh = r.unrotate(sc, qh)
		}
		for c, x := range qh {
			sc.q2[h*2*dd+c] = max(x, 0)
			sc.q2[h*2*dd+dd+c] = min(x, 0)
		}
	}
	sc.score = grow(sc.score, g*nc)
	summ := r.summ[b*cfg.HKV+kvh][jlo*2*dd:]
	simd.DotRowsBF16PF(sc.score, nc, sc.q2, 2*dd, g, summ, 2*dd, nc, 2*dd, nil)
	r.pagesScored.Add(int64(nc))
}

// choose marks the pages the group reads among candidates [jlo, jlo+nc),
// kp of them for each head (GroupUnion) or for the group (GroupMax).
func (r *rule) choose(sc *scratch, b, kvh, jlo, nc, kp int) {
	cfg := r.st.Config()
	g := cfg.H / cfg.HKV
	r.scores(sc, b, kvh, jlo, nc)
	sc.work = grow(sc.work, nc)
	if r.m.group == GroupMax {
		sc.comb = grow(sc.comb, nc)
		copy(sc.comb, sc.score[:nc])
		for h := 1; h < g; h++ {
			for j, x := range sc.score[h*nc : (h+1)*nc] {
				sc.comb[j] = max(nanInf(sc.comb[j]), nanInf(x))
			}
		}
		pick(sc.comb, kp, sc.work, sc.mark)
		return
	}
	for h := range g {
		pick(sc.score[h*nc:(h+1)*nc], kp, sc.work, sc.mark)
	}
}

// add appends positions [lo, hi) to the ranges, merged with the last
// range when they touch.
func (sc *scratch) add(lo, hi int) {
	if lo >= hi {
		return
	}
	if n := len(sc.ranges); n > 0 && sc.ranges[n-1].hi == lo {
		sc.ranges[n-1].hi = hi
		return
	}
	sc.ranges = append(sc.ranges, span{lo, hi})
}

// attendBlock bounds the positions attend takes at a time: their keys
// and values stay in a core's cache from the scores to the product with
// the values.
const attendBlock = 128

// attend computes the softmax of the group's scaled queries over the
// positions of sc.ranges, exactly: an online softmax a block of
// positions at a time, each block's keys and then values read while the
// next block's are prefetched.
func (r *rule) attend(sc *scratch, hd *decstore.Head, g int, out, lse []float32) {
	dd := r.st.Config().D
	// The blocks, ranges cut at attendBlock.
	sc.blocks = sc.blocks[:0]
	total := 0
	for _, s := range sc.ranges {
		for lo := s.lo; lo < s.hi; lo += attendBlock {
			sc.blocks = append(sc.blocks, span{lo, min(s.hi, lo+attendBlock)})
		}
		total += s.hi - s.lo
	}
	r.rowsRead.Add(int64(total))
	sc.logits = grow(sc.logits, g*attendBlock)
	sc.acc = grow(sc.acc, g*dd)
	clear(sc.acc)
	sc.sums, sc.maxs = grow(sc.sums, g), grow(sc.maxs, g)
	for h := range g {
		sc.sums[h], sc.maxs[h] = 0, float32(math.Inf(-1))
	}
	for i, s := range sc.blocks {
		n := s.hi - s.lo
		// The next block's rows are prefetched: its first half while
		// the keys are scored, the rest while the values are added.
		var next, nn int
		if i+1 < len(sc.blocks) {
			next, nn = sc.blocks[i+1].lo, sc.blocks[i+1].hi-sc.blocks[i+1].lo
		}
		hd.DotKeys(sc.logits, n, sc.q, dd, g, s.lo, n, next, nn/2)
		for h := range g {
			row := sc.logits[h*n : (h+1)*n]
			if m := simd.Max(row); m > sc.maxs[h] {
				if sc.sums[h] > 0 {
					f := float32(math.Exp(float64(sc.maxs[h] - m)))
					simd.Scale(sc.acc[h*dd:(h+1)*dd], f)
					sc.sums[h] *= f
				}
				sc.maxs[h] = m
			}
			sc.sums[h] += simd.ExpSum(row, sc.maxs[h])
		}
		sc.row = grow(sc.row, dd)
		hd.AddValues(sc.logits, n, g, s.lo, n, sc.acc, sc.row, next+nn/2, nn-nn/2)
	}
	for h := range g {
		lse[h] = sc.maxs[h] + float32(math.Log(float64(sc.sums[h])))
		inv := 1 / sc.sums[h]
		for c, x := range sc.acc[h*dd : (h+1)*dd] {
			out[h*dd+c] = x * inv
		}
	}
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

func growBool(buf []bool, n int) []bool {
	if cap(buf) < n {
		return make([]bool, n)
	}
	return buf[:n]
}

// Fallback says when a decode step is exact attention: when the query,
// which sees s.M positions (its own included), has no more candidate
// pages than its budget.
func (d *Decoder) Fallback(s attn.Shape, o attn.Options) string {
	m := d.r.m
	if s.M <= 0 {
		return ""
	}
	_, _, jlo, jhi := m.layout(s.M - 1)
	if kp := m.budget / m.page; jhi-jlo <= kp {
		return fmt.Sprintf("M = %d positions: the budget of %d pages covers the %d pages outside the sinks and the recent window: the decoder attended exactly", s.M, kp, jhi-jlo)
	}
	return ""
}

var (
	_ attn.Decoder    = (*Decoder)(nil)
	_ attn.Appender   = (*Decoder)(nil)
	_ attn.Fallbacker = (*Decoder)(nil)
)
