package flash

import (
	"context"
	"fmt"

	"github.com/attnkit/attn"
)

// Range is a run of keys [Lo, Hi). Full says that every query the range
// was returned for sees every key in it (before the causal and padding
// masks); otherwise the kernel asks Pattern.Visible key by key.
type Range struct {
	Lo, Hi int
	Full   bool
}

// Pattern restricts which keys each query may see, on top of the causal and
// padding masks, for block-sparse attention. Positions are absolute: with N
// queries and M keys query i is at position M-N+i, the same bottom-right
// alignment as the causal mask. A pattern depends on positions only, not
// on the batch row or head.
type Pattern interface {
	// KeyRanges appends to dst the keys that queries at positions
	// [p0, p1) may see, as ranges sorted by Lo that do not overlap, and
	// returns the extended slice. Keys outside every range are never
	// read. Ranges may extend past M; the kernel clips them.
	KeyRanges(dst []Range, p0, p1, m int) []Range
	// Visible reports whether the query at position p sees key j. It is
	// called only for keys inside a range that is not Full.
	Visible(p, j int) bool
}

// RowMasker is an optional fast path for a Pattern: MaskRow sets s[j] to
// -Inf for every key j0+j the query at position p does not see, and leaves
// the rest, so one call replaces len(s) calls of Visible on a masked tile.
type RowMasker interface {
	MaskRow(p, j0 int, s []float32)
}

// ForwardPattern is Forward restricted to the keys pat allows: tiles of keys
// outside every range are skipped, whole tiles inside Full ranges run
// unmasked, and the rest are masked key by key. The cost is proportional
// to the keys the pattern touches, not to N·M.
func (kn *Kernel) ForwardPattern(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, pat Pattern, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	if pat == nil {
		return fmt.Errorf("%w: nil pattern", attn.ErrInput)
	}
	return kn.forward(ctx, s, q, denseKV{s, k, v}, o, pat, out, lse)
}

// dense is the pattern of plain attention: one full range of all keys.
type dense struct{}

func (dense) KeyRanges(dst []Range, p0, p1, m int) []Range {
	return append(dst, Range{0, m, true})
}

func (dense) Visible(p, j int) bool { return true }
