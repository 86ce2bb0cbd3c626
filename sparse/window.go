package sparse

import (
	"math"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// Window is the sliding-window pattern: the query at position p sees key j
// when p-Left <= j <= p+Right and p-j is a multiple of Dilation (0 or 1:
// every key). Under a causal mask Right has no effect. Left and Right must
// be in [0, 2^40] and Dilation in [0, 2^40] (2^29 where int has 32 bits).
//
// Its KeyRanges returns, per query tile, the band's union as masked ranges
// and the keys every query of the tile sees as one Full range, so the
// per-tile cost is independent of N. With Dilation > 1 the whole band is
// one masked range: ForwardPattern then computes Left+Right+tile keys per
// query and masks most of them, which is why Forward runs dilated windows
// on keys regrouped by residue instead.
type Window struct {
	Left, Right, Dilation int
}

// Visible reports whether the query at position p sees key j.
func (w Window) Visible(p, j int) bool {
	// One unsigned comparison for p-Left <= j <= p+Right: the kernel calls
	// this once per (row, key) of every masked tile.
	if uint(p-j+w.Right) > uint(w.Left+w.Right) {
		return false
	}
	return w.Dilation <= 1 || (p-j)%w.Dilation == 0
}

// MaskRow sets s[j] to -Inf for every key j0+j that the query at
// position p does not see and leaves the others: Visible for a whole row
// of a key tile in one call. It is the method of the row-masking fast path
// proposed for package flash (a RowMasker interface that the kernel would
// prefer to per-key Visible calls); it cuts a causal window-64 layer's
// time by about a fifth.
func (w Window) MaskRow(p, j0 int, s []float32) {
	lo := min(max(p-w.Left-j0, 0), len(s))
	hi := min(max(p+w.Right+1-j0, lo), len(s))
	fill(s[:lo], negInf)
	fill(s[hi:], negInf)
	if w.Dilation > 1 {
		for j := lo; j < hi; j++ {
			if (p-j0-j)%w.Dilation != 0 {
				s[j] = negInf
			}
		}
	}
}

var negInf = float32(math.Inf(-1))

func fill(s []float32, x float32) {
	for i := range s {
		s[i] = x
	}
}

// KeyRanges appends the keys that queries [p0, p1) may see.
func (w Window) KeyRanges(dst []flash.Range, p0, p1, m int) []flash.Range {
	if p1 <= p0 {
		return dst
	}
	var buf [2]flash.Range
	if w.Dilation > 1 {
		buf[0] = flash.Range{Lo: p0 - w.Left, Hi: p1 + w.Right}
		return appendRanges(dst, buf[:1], m)
	}
	return appendRanges(dst, bandRanges(buf[:0], p0, p1-1, -w.Left, w.Right), m)
}

// WindowConfig configures the "window" mechanism.
type WindowConfig struct {
	// Left and Right are the keys visible before and after each query
	// (tokens). When both are 0 they default to 64 each; the window of a
	// query alone is not worth a mechanism. Causal attention ignores Right.
	Left, Right int
	// Dilation is the step between visible keys: 0 or 1 is every key, 2
	// every other key, and so on (Longformer's dilated window).
	Dilation int
	// Tiles sets the exact kernel's tile sizes; the zero value is flash's
	// default.
	Tiles flash.Config
}

// DefaultWindow is the extent on each side that a zero WindowConfig and a
// zero LongformerConfig use.
const DefaultWindow = 64

// DefaultDilation is the dilation of a zero WindowConfig: every key.
const DefaultDilation = 1

// NewWindow returns the "window" mechanism: sliding-window attention as in
// Longformer's local attention and Mistral's sliding window. Per query row
// it costs O((Left+Right)/Dilation + T) key reads and products, where T is
// the query tile length (flash's BlockRows divided by the GQA group).
func NewWindow(cfg WindowConfig) (*Attention, error) {
	if cfg.Left == 0 && cfg.Right == 0 {
		cfg.Left, cfg.Right = DefaultWindow, DefaultWindow
	}
	if cfg.Dilation == 0 {
		cfg.Dilation = DefaultDilation
	}
	for _, c := range []struct {
		name   string
		v, min int
	}{{"Left", cfg.Left, 0}, {"Right", cfg.Right, 0}, {"Dilation", cfg.Dilation, 1}} {
		if err := validate("NewWindow", c.name, c.v, c.min); err != nil {
			return nil, err
		}
	}
	w := Window{Left: cfg.Left, Right: cfg.Right, Dilation: cfg.Dilation}
	return &Attention{name: "window", kernel: flash.New(cfg.Tiles), layout: windowLayout{w}}, nil
}

type windowLayout struct{ w Window }

func (l windowLayout) pattern(s attn.Shape, causal bool) (flash.Pattern, error) { return l.w, nil }

func (l windowLayout) plan(s attn.Shape, causal bool) (merged, rows []part, err error) {
	w := l.w
	if w.Dilation == 1 {
		return []part{direct{causalBand(w, causal)}}, nil, nil
	}
	right := w.Right
	if causal {
		right = 0
	}
	// Query p and key j meet only when p ≡ j (mod Dilation): within one
	// residue class the dilated window is a plain window of
	// Left/Dilation keys before and Right/Dilation after.
	return []part{classPart(s, w.Dilation, w.Left/w.Dilation, right/w.Dilation, -1)}, nil, nil
}
