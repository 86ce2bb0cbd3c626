package sparse

import (
	"context"
	"slices"
	"sort"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// Longformer is the Longformer pattern (Beltagy et al., 2020): a sliding
// window plus global tokens. The query at position p sees key j when
//
//	p-Left <= j <= p+Right,  or j is global,  or p is global
//
// so a global token attends to every key and every query attends to it.
// Intersected with the causal mask a global query sees only the past and
// a query sees only the globals before it. Get one from
// (*Attention).Pattern of a mechanism built by NewLongformer.
//
// KeyRanges is a cover with one range per global key; Forward gathers the
// global keys instead and computes the global rows separately.
type Longformer struct {
	left, right int
	globals     []int // ascending, distinct
}

// Window returns the extents of the local window.
func (lf *Longformer) Window() (left, right int) { return lf.left, lf.right }

// Globals returns the global positions, ascending.
func (lf *Longformer) Globals() []int { return slices.Clone(lf.globals) }

func (lf *Longformer) isGlobal(p int) bool {
	_, ok := slices.BinarySearch(lf.globals, p)
	return ok
}

// Visible reports whether the query at position p sees key j.
func (lf *Longformer) Visible(p, j int) bool {
	return (j >= p-lf.left && j <= p+lf.right) || lf.isGlobal(j) || lf.isGlobal(p)
}

// KeyRanges appends the keys that queries [p0, p1) may see.
func (lf *Longformer) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	// Global rows in the tile see everything; the tile's keys are Full
	// only if all its rows are global.
	a, z := sort.SearchInts(lf.globals, p0), sort.SearchInts(lf.globals, p1)
	if z > a {
		cands := [1]flash.Range{{Lo: 0, Hi: m, Full: z-a == p1-p0}}
		return appendRanges(dst, cands[:], m)
	}
	cands := bandRanges(nil, p0, p1-1, -lf.left, lf.right)
	for _, g := range lf.globals {
		if g >= m {
			break
		}
		cands = append(cands, flash.Range{Lo: g, Hi: g + 1, Full: true})
	}
	return appendRanges(dst, cands, m)
}

// DefaultGlobals returns the global positions of a nil
// LongformerConfig.Globals: position 0, a leading classification token.
func DefaultGlobals() []int { return []int{0} }

// LongformerConfig configures the "longformer" mechanism.
type LongformerConfig struct {
	// Left and Right are the window's keys before and after each query
	// (tokens). When both are 0 they default to DefaultWindow each.
	// Causal attention ignores Right.
	Left, Right int
	// Globals are the absolute positions of the global tokens; a nil
	// slice means {0} (a leading classification token), an empty
	// non-nil one no global token. Order and repeats do not matter.
	// Positions at or past a call's key length M are not part of that
	// call's sequence and play no part in it, so that a model patched
	// with globals can start decoding from a shorter prefix.
	Globals []int
	// Tiles sets the exact kernel's tile sizes; the zero value is flash's
	// default.
	Tiles flash.Config
}

// NewLongformer returns the "longformer" mechanism. Forward runs three
// parts: the window directly; the global keys outside each query's window,
// gathered; and the global query rows against all keys. The first two
// merge by lse, the third replaces its rows. Per query row it costs
// O(Left+Right+T+G) keys for G globals and T the query tile length, plus
// O(M) per global row.
func NewLongformer(cfg LongformerConfig) (*Attention, error) {
	if cfg.Left == 0 && cfg.Right == 0 {
		cfg.Left, cfg.Right = DefaultWindow, DefaultWindow
	}
	if err := validate("NewLongformer", "Left", cfg.Left, 0); err != nil {
		return nil, err
	}
	if err := validate("NewLongformer", "Right", cfg.Right, 0); err != nil {
		return nil, err
	}
	globals := DefaultGlobals()
	if cfg.Globals != nil {
		globals = slices.Clone(cfg.Globals)
		for _, g := range globals {
			if err := validate("NewLongformer", "a global position", g, 0); err != nil {
				return nil, err
			}
		}
		slices.Sort(globals)
		globals = slices.Compact(globals)
	}
	lf := &Longformer{left: cfg.Left, right: cfg.Right, globals: globals}
	return &Attention{name: "longformer", kernel: flash.New(cfg.Tiles), layout: longformerLayout{lf}}, nil
}

type longformerLayout struct{ lf *Longformer }

func (l longformerLayout) pattern(s attn.Shape, causal bool) (flash.Pattern, error) {
	// Globals at or past M name no key or query of this call: Visible
	// and KeyRanges only ever meet positions below M.
	return l.lf, nil
}

func (l longformerLayout) plan(s attn.Shape, causal bool) (merged, rows []part, err error) {
	if _, err := l.pattern(s, causal); err != nil {
		return nil, nil, err
	}
	lf := l.lf
	shift := s.M - s.N
	merged = []part{direct{causalBand(Window{Left: lf.left, Right: lf.right, Dilation: 1}, causal)}}
	if len(lf.globals) == 0 {
		return merged, nil, nil
	}
	merged = append(merged, columnsPart(s, causal, hole{left: lf.left, right: lf.right}, func(valid int) []int {
		return lf.globals[:sort.SearchInts(lf.globals, valid)]
	}))
	// Global positions that are queries of this call.
	var gr rowsPart
	gr.causal = causal
	for _, g := range lf.globals {
		if g >= shift && g < s.M {
			gr.rows = append(gr.rows, g-shift)
			gr.pos = append(gr.pos, g)
		}
	}
	if len(gr.rows) > 0 {
		rows = []part{gr}
	}
	return merged, rows, nil
}

// rowsPart computes some query rows against all keys, for every batch row
// at once, and writes only those rows.
type rowsPart struct {
	rows, pos []int // query indices and their absolute positions, ascending
	causal    bool
}

func (rp rowsPart) run(ctx context.Context, kn *flash.Kernel, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	n, d := len(rp.rows), s.D
	sub := attn.Shape{B: s.B, H: s.H, HKV: s.HKV, N: n, M: s.M, D: d}
	pq, po, pl := getFloats(sub.QLen()), getFloats(sub.QLen()), getFloats(sub.LSELen())
	defer putFloats(pq, po, pl)
	qs, os, ls := *pq, *po, *pl
	for bh := range s.B * s.H {
		for r, i := range rp.rows {
			copy(qs[(bh*n+r)*d:][:d], q[(bh*s.N+i)*d:][:d])
		}
	}
	// Padding is still a prefix of the keys: the kernel applies it. The
	// causal mask is not (the rows moved), so the pattern carries it.
	so := attn.Options{Scale: o.ScaleFor(d), KVLen: o.KVLen, Workers: o.Workers}
	pat := rowsPattern{off: s.M - n, pos: rp.pos, causal: rp.causal}
	if err := kn.ForwardPattern(ctx, sub, qs, k, v, so, pat, os, ls); err != nil {
		return err
	}
	for bh := range s.B * s.H {
		for r, i := range rp.rows {
			copy(out[(bh*s.N+i)*d:][:d], os[(bh*n+r)*d:][:d])
			lse[bh*s.N+i] = ls[bh*n+r]
		}
	}
	return nil
}

// rowsPattern is the pattern of a rowsPart problem: row r (at sub-problem
// position off+r) is the query at absolute position pos[r] and sees all
// keys, only those up to pos[r] when causal.
type rowsPattern struct {
	off    int
	pos    []int
	causal bool
}

func (rp rowsPattern) Visible(p, j int) bool { return !rp.causal || j <= rp.pos[p-rp.off] }

func (rp rowsPattern) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	if !rp.causal {
		return append(dst, flash.Range{Lo: 0, Hi: m, Full: true})
	}
	first, last := rp.pos[p0-rp.off], rp.pos[p1-1-rp.off]
	cands := [2]flash.Range{{Lo: 0, Hi: first + 1, Full: true}, {Lo: first + 1, Hi: last + 1}}
	return appendRanges(dst, cands[:], m)
}
