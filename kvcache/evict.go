package kvcache

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Policy is the eviction policy of a bounded cache (Config.Evict).
//
// An evicting cache holds the Sinks first positions and the last Window
// positions of every head, and besides them, per KV head, the Keep
// positions its policy scores highest; when more are candidates, the
// lowest-scored go (ties: the older first). Heads keep different
// positions, so rows are stored in any order, each with its position and
// score, and a step's queries see every held row. The queries of a chunk
// see the chunk whole (causally) and what was held before it: eviction
// happens after the chunk has been attended, with the chunk's own scores.
type Policy uint8

const (
	// NoEvict keeps what the window keeps.
	NoEvict Policy = iota
	// H2O (Zhang et al. 2023, heavy hitters): a position's score is the
	// attention probability it has received, summed over every query
	// since it was appended and over the query heads of its KV head.
	// Scoring reads the held keys once more a step (and a chunk's keys
	// against its queries once more, the cost of the chunk's attention
	// again), since the attention kernels keep no probabilities.
	H2O
	// SnapKV (Li et al. 2024): a prompt (positions that come more than
	// one at a time, in Step or Append) is held whole; the next single
	// position, or Compress, scores it by the attention of its
	// observation window (the last min(Window, snapObs) queries of the
	// prompt that went through Step), summed over those queries and the
	// query heads of a KV head, max-pooled over snapPool neighbouring
	// positions, and keeps the Keep best besides the sinks and the
	// window. Positions decoded one at a time afterwards are not scored:
	// they fill the Keep rows the prompt left free, then leave with the
	// window.
	SnapKV
)

const (
	// snapObs bounds SnapKV's observation window.
	snapObs = 32
	// snapPool is the width of SnapKV's max pooling of scores, which
	// keeps the neighbours of a strongly attended position with it.
	snapPool = 7
)

func (p Policy) String() string {
	switch p {
	case NoEvict:
		return ""
	case H2O:
		return "h2o"
	case SnapKV:
		return "snapkv"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy parses "" (NoEvict), "h2o" or "snapkv".
func ParsePolicy(s string) (Policy, error) {
	for _, p := range []Policy{NoEvict, H2O, SnapKV} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown eviction policy %q (want h2o or snapkv)", attn.ErrInput, s)
}

// evictState is an evicting cache's bookkeeping.
type evictState struct {
	policy Policy
	held   int       // rows held in every head
	pos    []int     // [B][Hkv][cap] position of each row
	score  []float64 // [B][Hkv][cap] the policy's score of each row
	// SnapKV: prompt says positions came in chunks since the last
	// compression; the observation window is a ring of the last queries
	// (scaled and rotated) at index position % len(obsP), with their lse.
	prompt bool
	h      int // query heads of the recorded queries
	obsQ   []float32
	obsL   []float32
	obsP   []int
	// scratch
	cands []cand
	free  []int
	drop  []int
	used  []bool
}

// cand is a position that may be evicted: held in row slot, or new (slot
// -1-i for the chunk's position i).
type cand struct {
	pos, slot int
	score     float64
}

func (e *evictState) reset() {
	e.held = 0
	e.prompt = false
	for i := range e.obsP {
		e.obsP[i] = -1
	}
}

// grow resizes the bookkeeping from old to rows rows a head.
func (e *evictState) grow(heads, old, rows int) {
	pos, score := make([]int, heads*rows), make([]float64, heads*rows)
	if e.pos != nil {
		for h := range heads {
			copy(pos[h*rows:], e.pos[h*old:][:e.held])
			copy(score[h*rows:], e.score[h*old:][:e.held])
		}
	}
	e.pos, e.score = pos, score
	e.used = make([]bool, rows)
}

// rank orders scores with NaN lowest.
func rank(s float64) float64 {
	if math.IsNaN(s) {
		return math.Inf(-1)
	}
	return s
}

// worse reports whether a is evicted before b.
func worse(a, b cand) int {
	if c := cmp.Compare(rank(a.score), rank(b.score)); c != 0 {
		return c
	}
	return cmp.Compare(a.pos, b.pos)
}

// evictStep appends a step's n positions (rotated k and v) to an evicting
// cache after its queries (rotated q) were attended with log-sum-exps
// lse: H2O scores them and adds to the held rows' scores, SnapKV records
// a prompt's last queries.
func (c *Cache) evictStep(ctx context.Context, h int, q, k, v []float32, n int, o attn.Options, lse []float32) error {
	var scores []float64
	switch c.ev.policy {
	case H2O:
		var err error
		if scores, err = c.h2oScores(ctx, h, q, k, n, o, lse); err != nil {
			return err
		}
	case SnapKV:
		if n > 1 {
			c.recordObs(h, q, n, o.Scale, lse)
		}
	}
	return c.evictAppend(k, v, n, scores)
}

// evictAppend stores n new positions (rotated k and v, scores
// [B][Hkv][n] or nil for 0) and evicts what the policy drops.
func (c *Cache) evictAppend(k, v []float32, n int, scores []float64) error {
	e := c.ev
	if e.policy == SnapKV && n > 1 {
		e.prompt = true
	}
	bounded := !(e.policy == SnapKV && e.prompt)
	end := c.n + n
	protected := func(p int) bool { return p < c.cfg.Sinks || p >= end-c.cfg.Window }
	// Candidates are the same number in every head: the held rows and
	// new positions outside the sinks and the window.
	others := 0
	if bounded {
		for _, p := range e.pos[:e.held] {
			if !protected(p) {
				others++
			}
		}
		for i := range n {
			if !protected(c.n + i) {
				others++
			}
		}
	}
	victims := max(0, others-c.cfg.Keep)
	final := e.held + n - victims
	if final > c.cap {
		rows := max(c.cap, 1)
		for rows < final {
			rows *= 2
		}
		if !fitsBytes(2*c.cfg.DType.Size(), c.cfg.B, c.cfg.HKV, rows, c.stride) {
			return fmt.Errorf("%w: %d + %d positions would need more than %d bytes", ErrFull, c.n, n, maxBytes)
		}
		c.alloc(rows)
	}
	d := c.cfg.D
	for bh := range c.cfg.B * c.cfg.HKV {
		base := bh * c.cap
		pos, score := e.pos[base:][:c.cap], e.score[base:][:c.cap]
		used := e.used[:c.cap]
		for i := range used {
			used[i] = i < e.held
		}
		free, dropNew := e.free[:0], e.drop[:0] // rows freed, new positions dropped
		if victims > 0 {
			cs := e.cands[:0]
			for s, p := range pos[:e.held] {
				if !protected(p) {
					cs = append(cs, cand{p, s, score[s]})
				}
			}
			for i := range n {
				if p := c.n + i; !protected(p) {
					cs = append(cs, cand{p, -1 - i, newScore(scores, bh, n, i)})
				}
			}
			if victims == 1 {
				w := 0
				for i := range cs {
					if worse(cs[i], cs[w]) < 0 {
						w = i
					}
				}
				cs[0], cs[w] = cs[w], cs[0]
			} else {
				slices.SortFunc(cs, worse)
			}
			for _, x := range cs[:victims] {
				if x.slot >= 0 {
					free = append(free, x.slot)
					used[x.slot] = false
				} else {
					dropNew = append(dropNew, -1-x.slot)
				}
			}
			e.cands = cs
		}
		slices.Sort(free)
		slices.Sort(dropNew)
		// New positions take freed rows first, then rows past the held.
		top := e.held
		nf, nd := 0, 0
		for i := range n {
			if nd < len(dropNew) && dropNew[nd] == i {
				nd++
				continue
			}
			s := top
			if nf < len(free) {
				s, nf = free[nf], nf+1
			} else {
				top++
			}
			src := (bh*n + i) * d
			c.store((base+s)*c.stride, k[src:src+d], v[src:src+d])
			pos[s], score[s] = c.n+i, newScore(scores, bh, n, i)
			used[s] = true
		}
		// Freed rows left over are filled from the top.
		for _, f := range free[nf:] {
			for top > 0 && !used[top-1] {
				top--
			}
			if f >= top {
				break
			}
			c.moveRow(base+f, base+top-1)
			pos[f], score[f] = pos[top-1], score[top-1]
			used[f], used[top-1] = true, false
			top--
		}
		e.free, e.drop = free, dropNew
	}
	e.held = final
	c.n = end
	return nil
}

func newScore(scores []float64, bh, n, i int) float64 {
	if scores == nil {
		return 0
	}
	return scores[bh*n+i]
}

// compressPrompt runs SnapKV's compression if a prompt is waiting.
func (c *Cache) compressPrompt(ctx context.Context, workers int) error {
	if c.ev == nil || c.ev.policy != SnapKV || !c.ev.prompt {
		return nil
	}
	return c.Compress(ctx, workers)
}

// Compress ends a SnapKV prompt: it scores the held positions by the
// attention of the observation window (see SnapKV) and keeps the Keep
// best besides the sinks and the window. The next single position does
// it when Compress was not called; without a waiting prompt it does
// nothing, as it does for other policies. workers bounds the goroutines,
// 0 meaning GOMAXPROCS; the result does not depend on it.
func (c *Cache) Compress(ctx context.Context, workers int) error {
	e := c.ev
	if e == nil || e.policy != SnapKV || !e.prompt {
		return nil
	}
	if workers < 0 {
		return fmt.Errorf("%w: Compress with %d workers", attn.ErrInput, workers)
	}
	heads := c.cfg.B * c.cfg.HKV
	raw := make([]float64, heads*e.held)
	nobs := 0
	for _, p := range e.obsP {
		if p >= 0 {
			nobs++
		}
	}
	if nobs > 0 {
		g := e.h / c.cfg.HKV
		o := attn.Options{Workers: workers}
		err := parallel.For(ctx, o.WorkerCount(runtime.GOMAXPROCS(0), heads), heads,
			func() *scoreScratch { return newScoreScratch(c.stride) },
			func(sc *scoreScratch, bh int) error {
				b, kvh := bh/c.cfg.HKV, bh%c.cfg.HKV
				var rows []scoreQuery
				for r := range g {
					hd := b*e.h + kvh*g + r
					for x, p := range e.obsP {
						if p >= 0 {
							i := hd*len(e.obsP) + x
							rows = append(rows, scoreQuery{q: e.obsQ[i*c.cfg.D:][:c.cfg.D], scale: 1, lse: e.obsL[i], pos: p})
						}
					}
				}
				c.scoreHeld(sc, bh, rows, raw[bh*e.held:][:e.held])
				return nil
			})
		if err != nil {
			return err
		}
	}
	// Max-pool each head's scores over neighbouring positions.
	order := make([]int, e.held)
	pooled := make([]float64, e.held)
	for bh := range heads {
		pos := e.pos[bh*c.cap:][:e.held]
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int { return cmp.Compare(pos[a], pos[b]) })
		r := raw[bh*e.held:][:e.held]
		for i, s := range order {
			m := math.Inf(-1)
			for j := max(0, i-snapPool/2); j <= min(len(order)-1, i+snapPool/2); j++ {
				m = max(m, rank(r[order[j]]))
			}
			pooled[s] = m
		}
		copy(e.score[bh*c.cap:][:e.held], pooled)
	}
	e.prompt = false
	for i := range e.obsP {
		e.obsP[i] = -1
	}
	return c.evictAppend(nil, nil, 0, nil)
}

// recordObs keeps the last of a prompt chunk's n queries (rotated, [B][H][n][D]),
// scaled, with their lse, as SnapKV's observation window.
func (c *Cache) recordObs(h int, q []float32, n int, scale float32, lse []float32) {
	e, d := c.ev, c.cfg.D
	w := min(c.cfg.Window, snapObs)
	if e.h != h || len(e.obsP) != w {
		e.h = h
		e.obsQ = make([]float32, c.cfg.B*h*w*d)
		e.obsL = make([]float32, c.cfg.B*h*w)
		e.obsP = make([]int, w)
		for i := range e.obsP {
			e.obsP[i] = -1
		}
	}
	for i := max(0, n-w); i < n; i++ {
		p := c.n + i
		x := p % w
		e.obsP[x] = p
		for hd := range c.cfg.B * h {
			dst := e.obsQ[(hd*w+x)*d:][:d]
			for j, v := range q[(hd*n+i)*d:][:d] {
				dst[j] = v * scale
			}
			e.obsL[hd*w+x] = lse[hd*n+i]
		}
	}
}

// scoreQuery is one query row of a scoring pass (rotated), with its lse
// and position; its logits are scale·q·k.
type scoreQuery struct {
	q     []float32
	scale float32
	lse   float32
	pos   int
}

// scoreScratch is a scoring worker's memory.
type scoreScratch struct {
	qt  []float32 // [decodeBlock][stride] a tile of queries
	kb  []float32 // [decodeBlock][stride] widened keys
	s   []float32 // [decodeBlock][decodeBlock] logits, then probabilities
	sum []float64 // [decodeBlock] column sums
}

func newScoreScratch(stride int) *scoreScratch {
	return &scoreScratch{
		qt:  make([]float32, decodeBlock*stride),
		kb:  make([]float32, decodeBlock*stride),
		s:   make([]float32, decodeBlock*decodeBlock),
		sum: make([]float64, decodeBlock),
	}
}

// scoreHeld adds to out[j] (float64, one a held row of head bh) the
// attention probability exp(q·k_j - lse) of every query of rows that sees
// row j: every held row up to the query's position.
func (c *Cache) scoreHeld(sc *scoreScratch, bh int, rows []scoreQuery, out []float64) {
	st, d := c.stride, c.cfg.D
	held := c.ev.held
	pos := c.ev.pos[bh*c.cap:][:held]
	for j0 := 0; j0 < held; j0 += decodeBlock {
		nb := min(decodeBlock, held-j0)
		off := (bh*c.cap + j0) * st
		var kb []float32
		if c.cfg.DType == F32 {
			kb = c.kf[off:][:(nb-1)*st+d]
		} else {
			c.widenRows(sc.kb, false, off, nb)
			kb = sc.kb[:(nb-1)*st+d]
		}
		c.scoreTile(sc, rows, kb, st, nb, func(i int) int { return pos[j0+i] }, out[j0:j0+nb])
	}
}

// scoreTile adds to out[j] the probabilities of rows against the nb keys
// of kb (row stride ldk), key j at position at(j): each query sees the
// keys at or before its position.
func (c *Cache) scoreTile(sc *scoreScratch, rows []scoreQuery, kb []float32, ldk, nb int, at func(int) int, out []float64) {
	st, d := c.stride, c.cfg.D
	for r0 := 0; r0 < len(rows); r0 += decodeBlock {
		nr := min(decodeBlock, len(rows)-r0)
		for r, x := range rows[r0 : r0+nr] {
			copy(sc.qt[r*st:][:d], x.q)
		}
		simd.DotRows(sc.s, decodeBlock, sc.qt, st, nr, kb, ldk, nb, d)
		sum := sc.sum[:nb]
		clear(sum)
		for r, x := range rows[r0 : r0+nr] {
			sr := sc.s[r*decodeBlock:][:nb]
			for j := range sr {
				if at(j) > x.pos {
					sr[j] = float32(math.Inf(-1))
				} else {
					sr[j] = sr[j]*x.scale - x.lse
				}
			}
			simd.Exp(sr, sr)
			for j, p := range sr {
				sum[j] += float64(p)
			}
		}
		for j, s := range sum {
			out[j] += s
		}
	}
}

// h2oScores adds the probabilities of a step's n queries (rotated q
// [B][H][n][D], their lse [B][H][n]) to the scores of the held rows and
// returns those of the step's own positions (rotated k) [B][Hkv][n].
func (c *Cache) h2oScores(ctx context.Context, h int, q, k []float32, n int, o attn.Options, lse []float32) ([]float64, error) {
	heads := c.cfg.B * c.cfg.HKV
	g, d := h/c.cfg.HKV, c.cfg.D
	scores := make([]float64, heads*n)
	held := c.ev.held
	heldScores := make([]float64, heads*held)
	err := parallel.For(ctx, o.WorkerCount(runtime.GOMAXPROCS(0), heads), heads,
		func() *scoreScratch { return newScoreScratch(c.stride) },
		func(sc *scoreScratch, bh int) error {
			b, kvh := bh/c.cfg.HKV, bh%c.cfg.HKV
			rows := make([]scoreQuery, 0, g*n)
			for r := range g {
				hd := b*h + kvh*g + r
				for i := range n {
					rows = append(rows, scoreQuery{q: q[(hd*n+i)*d:][:d], scale: o.Scale, lse: lse[hd*n+i], pos: c.n + i})
				}
			}
			c.scoreHeld(sc, bh, rows, heldScores[bh*held:][:held])
			out := scores[bh*n:][:n]
			for j0 := 0; j0 < n; j0 += decodeBlock {
				nb := min(decodeBlock, n-j0)
				kb := k[(bh*n+j0)*d:][:nb*d]
				at := func(i int) int { return c.n + j0 + i }
				// Only the queries at or after the block see it.
				for r := range g {
					c.scoreTile(sc, rows[r*n+j0:(r+1)*n], kb, d, nb, at, out[j0:j0+nb])
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	for bh := range heads {
		sc := c.ev.score[bh*c.cap:][:held]
		for j, x := range heldScores[bh*held:][:held] {
			sc[j] += x
		}
	}
	return scores, nil
}
