package sparse

import (
	"fmt"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// StridedMode selects one of the two factorised patterns of the Sparse
// Transformer.
type StridedMode string

const (
	// ModeStrided: the previous Stride keys and every Stride-th key.
	ModeStrided StridedMode = "strided"
	// ModeFixed: the query's block of Stride keys and the last Summary
	// keys of every block.
	ModeFixed StridedMode = "fixed"
)

// Strided is the Sparse Transformer pattern (Child et al., 2019, §4.2),
// with l = Stride and c = Summary. With d = p-j the query at position p
// sees key j when
//
//	strided: |d| <= l  or  d ≡ 0 (mod l)
//	fixed:   ⌊p/l⌋ = ⌊j/l⌋  or  j mod l >= l-c
//
// Intersected with the causal mask these are the paper's causal patterns
// (A⁽¹⁾ ∪ A⁽²⁾, with A⁽¹⁾ = {max(0, p-l), …, p} for strided); without it,
// their two-sided versions. Stride must be in [1, 2^40] (2^29 where int
// has 32 bits) and Summary in [0, Stride]; Summary is used in fixed mode
// only.
//
// KeyRanges is a plain cover: in strided mode one masked range over all
// keys besides the band, in fixed mode one range per block's summary
// columns. Forward does not use it; it runs the stride columns regrouped
// by residue and the summary columns gathered, so its cost is
// O(l + M/l) keys per query for strided and O(l + c·M/l) for fixed.
type Strided struct {
	Mode            StridedMode
	Stride, Summary int
}

// Visible reports whether the query at position p sees key j.
func (st Strided) Visible(p, j int) bool {
	l := st.Stride
	if st.Mode == ModeFixed {
		return floorDiv(p, l) == floorDiv(j, l) || floorMod(j, l) >= l-st.Summary
	}
	d := p - j
	return (d >= -l && d <= l) || floorMod(d, l) == 0
}

// maxSummaryRanges bounds the ranges KeyRanges returns for summary columns
// in fixed mode; beyond it they become one masked range.
const maxSummaryRanges = 256

// KeyRanges appends the keys that queries [p0, p1) may see.
func (st Strided) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	l, c := st.Stride, st.Summary
	var cands []flash.Range
	if st.Mode != ModeFixed {
		cands = bandRanges(cands, p0, p1-1, -l, l)
		cands = append(cands, flash.Range{Lo: 0, Hi: m})
		return appendRanges(dst, cands, m)
	}
	qa, qb := floorDiv(p0, l), floorDiv(p1-1, l)
	cands = append(cands, flash.Range{Lo: qa * l, Hi: (qb + 1) * l, Full: qa == qb})
	if c > 0 {
		blocks := (m + l - 1) / l
		if blocks > maxSummaryRanges && c < l {
			cands = append(cands, flash.Range{Lo: l - c, Hi: m})
		} else {
			for b := range blocks {
				cands = append(cands, flash.Range{Lo: b*l + l - c, Hi: (b + 1) * l, Full: true})
			}
		}
	}
	return appendRanges(dst, cands, m)
}

// StridedConfig configures the "strided" mechanism.
type StridedConfig struct {
	// Mode is ModeStrided (the default when empty) or ModeFixed.
	Mode StridedMode
	// Stride is l in tokens; 0 means 128, the paper's stride for text.
	Stride int
	// Summary is c, the summary columns per block in fixed mode; 0 means
	// max(1, Stride/16). It must be 0 in strided mode.
	Summary int
	// Tiles sets the exact kernel's tile sizes; the zero value is flash's
	// default.
	Tiles flash.Config
}

// DefaultStride is the stride of a zero StridedConfig.
const DefaultStride = 128

// NewStrided returns the "strided" mechanism: the Sparse Transformer's
// strided or fixed factorised pattern, both heads' sets in one attention
// (the "merged" variant of the paper).
func NewStrided(cfg StridedConfig) (*Attention, error) {
	switch cfg.Mode {
	case "":
		cfg.Mode = ModeStrided
	case ModeStrided, ModeFixed:
	default:
		return nil, fmt.Errorf("%w: sparse.NewStrided: mode %q, want %q or %q", attn.ErrInput, cfg.Mode, ModeStrided, ModeFixed)
	}
	if cfg.Stride == 0 {
		cfg.Stride = DefaultStride
	}
	if err := validate("NewStrided", "Stride", cfg.Stride, 1); err != nil {
		return nil, err
	}
	switch {
	case cfg.Mode == ModeStrided && cfg.Summary != 0:
		return nil, fmt.Errorf("%w: sparse.NewStrided: Summary = %d applies to fixed mode only", attn.ErrInput, cfg.Summary)
	case cfg.Summary < 0 || cfg.Summary > cfg.Stride:
		return nil, fmt.Errorf("%w: sparse.NewStrided: Summary = %d is outside [0, Stride = %d]", attn.ErrInput, cfg.Summary, cfg.Stride)
	case cfg.Mode == ModeFixed && cfg.Summary == 0:
		cfg.Summary = max(1, cfg.Stride/16)
	}
	st := Strided{Mode: cfg.Mode, Stride: cfg.Stride, Summary: cfg.Summary}
	return &Attention{name: "strided", kernel: flash.New(cfg.Tiles), layout: stridedLayout{st}}, nil
}

type stridedLayout struct{ st Strided }

func (l stridedLayout) pattern(s attn.Shape, causal bool) (flash.Pattern, error) { return l.st, nil }

func (sl stridedLayout) plan(s attn.Shape, causal bool) (merged, rows []part, err error) {
	st, l := sl.st, sl.st.Stride
	if st.Mode == ModeStrided {
		// The band |d| <= l directly, and the columns d ≡ 0 (mod l)
		// outside it, |d| >= 2l, regrouped by residue: in class space
		// those are the keys t with |t-a| > 1.
		right := maxExtent
		if causal {
			right = 0
		}
		return []part{
			direct{causalBand(Window{Left: l, Right: l, Dilation: 1}, causal)},
			classPart(s, l, maxExtent, right, 1),
		}, nil, nil
	}
	// The query's block directly, and the summary columns of the other
	// blocks gathered.
	merged = []part{direct{blockLocal{l}}}
	c := st.Summary
	merged = append(merged, columnsPart(s, causal, hole{block: l}, func(valid int) []int {
		var cols []int
		for b := 0; b*l < valid; b++ {
			for j := b*l + l - c; j < min((b+1)*l, valid); j++ {
				cols = append(cols, j)
			}
		}
		return cols
	}))
	return merged, nil, nil
}

// blockLocal is the pattern ⌊p/l⌋ = ⌊j/l⌋: each query sees its block.
type blockLocal struct{ l int }

func (bl blockLocal) Visible(p, j int) bool { return floorDiv(p, bl.l) == floorDiv(j, bl.l) }

func (bl blockLocal) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	qa, qb := floorDiv(p0, bl.l), floorDiv(p1-1, bl.l)
	cands := [1]flash.Range{{Lo: qa * bl.l, Hi: (qb + 1) * bl.l, Full: qa == qb}}
	return appendRanges(dst, cands[:], m)
}
