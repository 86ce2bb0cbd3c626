package sparse

import (
	"math/rand/v2"
	"slices"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// BigBird is the BigBird pattern (Zaheer et al., 2020, ITC variant) over
// blocks of Block positions: position p is in block ⌊p/Block⌋. The query
// block qb sees the key block kb when
//
//	qb is global (qb < Globals),          a global block attends to all
//	or kb is global (kb < Globals),       and all attend to it
//	or qb-⌊W/2⌋ <= kb <= qb+⌊(W-1)/2⌋    for W = Window > 0 blocks
//	or kb is one of qb's random blocks
//
// Each query block draws min(Random, candidates) distinct random blocks
// among the blocks that are neither global nor in its window: in
// [Globals, ⌈M/Block⌉) without the window, or, causal, in [Globals,
// qb-⌊W/2⌋), strictly before the window, so that no random block lies in
// the future and the draw does not depend on M. The draw uses a PCG
// generator seeded with (Seed, qb): it is the same for the same seed and
// block whatever N, and, causal, whatever M.
//
// A pattern is built for one call's N, M and causal flag by
// (*Attention).Pattern; query blocks outside that call have no random
// blocks. KeyRanges returns whole blocks, Full where every query block of
// the tile sees them, so Forward runs it directly.
type BigBird struct {
	block, window, globals int
	wl, wr                 int // window blocks before and after, when window > 0
	qb0                    int // first query block of rnd
	rnd                    [][]int
}

// Block returns the block size in positions.
func (bb *BigBird) Block() int { return bb.block }

// RandomBlocks returns the random key blocks of query block qb, ascending:
// nil for global blocks and for blocks outside the call the pattern was
// built for.
func (bb *BigBird) RandomBlocks(qb int) []int {
	if qb < bb.qb0 || qb >= bb.qb0+len(bb.rnd) {
		return nil
	}
	return slices.Clone(bb.rnd[qb-bb.qb0])
}

// Visible reports whether the query at position p sees key j.
func (bb *BigBird) Visible(p, j int) bool {
	qb, kb := floorDiv(p, bb.block), floorDiv(j, bb.block)
	switch {
	case qb >= 0 && qb < bb.globals, kb >= 0 && kb < bb.globals:
		return true
	case bb.window > 0 && kb >= qb-bb.wl && kb <= qb+bb.wr:
		return true
	case qb >= bb.qb0 && qb < bb.qb0+len(bb.rnd):
		return slices.Contains(bb.rnd[qb-bb.qb0], kb)
	}
	return false
}

// blocksOf appends the key blocks query block qb sees, as sorted disjoint
// intervals [Lo, Hi) of block indices in [0, nb).
func (bb *BigBird) blocksOf(dst []flash.Range, qb, nb int) []flash.Range {
	if qb >= 0 && qb < bb.globals {
		return append(dst, flash.Range{Lo: 0, Hi: nb})
	}
	base := len(dst)
	dst = append(dst, flash.Range{Lo: 0, Hi: bb.globals})
	if bb.window > 0 {
		dst = append(dst, flash.Range{Lo: qb - bb.wl, Hi: qb + bb.wr + 1})
	}
	if qb >= bb.qb0 && qb < bb.qb0+len(bb.rnd) {
		for _, kb := range bb.rnd[qb-bb.qb0] {
			dst = append(dst, flash.Range{Lo: kb, Hi: kb + 1})
		}
	}
	set := dst[base:]
	slices.SortFunc(set, func(a, b flash.Range) int { return a.Lo - b.Lo })
	out := base
	for _, r := range set {
		r.Lo, r.Hi = max(r.Lo, 0), min(r.Hi, nb)
		switch {
		case r.Lo >= r.Hi:
		case out > base && r.Lo <= dst[out-1].Hi:
			dst[out-1].Hi = max(dst[out-1].Hi, r.Hi)
		default:
			dst[out] = r
			out++
		}
	}
	return dst[:out]
}

// intersect returns the intersection of two sorted disjoint interval lists.
func intersect(dst, a, b []flash.Range) []flash.Range {
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].Lo, b[j].Lo), min(a[i].Hi, b[j].Hi)
		if lo < hi {
			dst = append(dst, flash.Range{Lo: lo, Hi: hi})
		}
		if a[i].Hi < b[j].Hi {
			i++
		} else {
			j++
		}
	}
	return dst
}

// KeyRanges appends the keys that queries [p0, p1) may see: the union of
// the blocks of the tile's query blocks, Full where all of them see it.
// The cost is O(query blocks in the tile × (Globals+Window+Random)),
// independent of N.
func (bb *BigBird) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	b := bb.block
	nb := (m + b - 1) / b
	var union, common, set, tmp []flash.Range
	for qb := floorDiv(p0, b); qb <= floorDiv(p1-1, b); qb++ {
		set = bb.blocksOf(set[:0], qb, nb)
		union = append(union, set...)
		if qb == floorDiv(p0, b) {
			common = append(common[:0], set...)
		} else {
			tmp = intersect(tmp[:0], common, set)
			common, tmp = tmp, common
		}
	}
	cands := make([]flash.Range, 0, len(union)+len(common))
	for _, r := range union {
		cands = append(cands, flash.Range{Lo: r.Lo * b, Hi: r.Hi * b})
	}
	for _, r := range common {
		cands = append(cands, flash.Range{Lo: r.Lo * b, Hi: r.Hi * b, Full: true})
	}
	return appendRanges(dst, cands, m)
}

// The defaults of a zero BigBirdConfig: BigBird's block of 64 tokens, 3
// window blocks (the query's and its neighbours), 2 global and 3 random
// blocks.
const (
	DefaultBigBirdBlock   = 64
	DefaultBigBirdWindow  = 3
	DefaultBigBirdGlobals = 2
	DefaultBigBirdRandom  = 3
)

// BigBirdConfig configures the "bigbird" mechanism. Counts are in blocks.
type BigBirdConfig struct {
	// Block is the block size in tokens; 0 means 64.
	Block int
	// Window, Globals and Random are the window blocks (the query's block
	// and its neighbours: 3 is the block ±1), the leading global blocks
	// and the random blocks per query block. When all three are 0 they
	// default to BigBird's 3, 2 and 3; otherwise each is taken as given,
	// so any of them can be 0.
	Window, Globals, Random int
	// Seed selects the random blocks.
	Seed uint64
	// Tiles sets the exact kernel's tile sizes; the zero value is flash's
	// default.
	Tiles flash.Config
}

// NewBigBird returns the "bigbird" mechanism. Its pattern is a block
// layout that the kernel runs directly: per query row it costs
// O(Block·(Window+Globals+Random) + T) keys, with T the query tile
// length, plus O(M) for each row of a global block.
func NewBigBird(cfg BigBirdConfig) (*Attention, error) {
	if cfg.Block == 0 {
		cfg.Block = DefaultBigBirdBlock
	}
	if cfg.Window == 0 && cfg.Globals == 0 && cfg.Random == 0 {
		cfg.Window, cfg.Globals, cfg.Random = DefaultBigBirdWindow, DefaultBigBirdGlobals, DefaultBigBirdRandom
	}
	for _, c := range []struct {
		name   string
		v, min int
	}{{"Block", cfg.Block, 1}, {"Window", cfg.Window, 0}, {"Globals", cfg.Globals, 0}, {"Random", cfg.Random, 0}} {
		if err := validate("NewBigBird", c.name, c.v, c.min); err != nil {
			return nil, err
		}
	}
	return &Attention{name: "bigbird", kernel: flash.New(cfg.Tiles), layout: bigBirdLayout{cfg}}, nil
}

type bigBirdLayout struct{ cfg BigBirdConfig }

func (l bigBirdLayout) pattern(s attn.Shape, causal bool) (flash.Pattern, error) {
	cfg := l.cfg
	b := cfg.Block
	bb := &BigBird{block: b, window: cfg.Window, globals: cfg.Globals}
	if cfg.Window > 0 {
		bb.wl, bb.wr = cfg.Window/2, (cfg.Window-1)/2
	}
	nb := (s.M + b - 1) / b
	bb.qb0 = floorDiv(s.M-s.N, b)
	last := floorDiv(s.M-1, b)
	bb.rnd = make([][]int, last-bb.qb0+1)
	for qb := bb.qb0; qb <= last; qb++ {
		if qb >= 0 && qb < bb.globals {
			continue
		}
		lo, hi := bb.globals, nb
		skipLo, skipHi := qb-bb.wl, qb+bb.wr+1
		if cfg.Window == 0 {
			skipLo, skipHi = qb, qb // nothing to skip
		}
		if causal {
			hi, skipLo, skipHi = skipLo, 0, 0
		}
		bb.rnd[qb-bb.qb0] = drawBlocks(cfg.Seed, qb, lo, hi, skipLo, skipHi, cfg.Random)
	}
	return bb, nil
}

func (l bigBirdLayout) plan(s attn.Shape, causal bool) (merged, rows []part, err error) {
	pat, err := l.pattern(s, causal)
	if err != nil {
		return nil, nil, err
	}
	return []part{direct{pat}}, nil, nil
}

// drawBlocks draws min(r, count) distinct blocks, ascending, from [lo, hi)
// without [skipLo, skipHi), with a generator seeded by (seed, qb). It uses
// Floyd's algorithm: r draws, whatever the number of candidates.
func drawBlocks(seed uint64, qb, lo, hi, skipLo, skipHi, r int) []int {
	if hi <= lo || r == 0 {
		return nil
	}
	s0, s1 := min(max(skipLo, lo), hi), min(max(skipHi, lo), hi)
	s1 = max(s1, s0)
	count := hi - lo - (s1 - s0)
	if count <= 0 {
		return nil
	}
	block := func(x int) int {
		if lo+x >= s0 {
			return lo + x + s1 - s0
		}
		return lo + x
	}
	out := make([]int, 0, min(r, count))
	if count <= r {
		for x := range count {
			out = append(out, block(x))
		}
		return out
	}
	rng := rand.New(rand.NewPCG(seed, uint64(qb)))
	for j := count - r; j < count; j++ {
		x := rng.IntN(j + 1)
		if slices.Contains(out, x) {
			x = j
		}
		out = append(out, x)
	}
	for i, x := range out {
		out[i] = block(x)
	}
	slices.Sort(out)
	return out
}
