package sparse

import (
	"slices"

	"github.com/attnkit/attn/flash"
)

// floorDiv returns ⌊a/b⌋ for b > 0, also for negative a (query positions
// are negative when N > M).
func floorDiv(a, b int) int {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// floorMod returns a - b·⌊a/b⌋, in [0, b) for b > 0.
func floorMod(a, b int) int { return a - b*floorDiv(a, b) }

// appendRanges appends to dst the union of cands as ranges sorted by Lo,
// disjoint and clipped to [0, m). A key is Full when some Full candidate
// holds it: every query of the call sees it. cands may overlap, come in
// any order and be empty; it is reordered.
//
// Full ranges are kept exactly as large as they are: the kernel visits
// each key tile a query tile touches once, unmasked when Full ranges cover
// all of its keys in use, so shrinking a Full range or filling a hole only
// adds Visible calls.
func appendRanges(dst []flash.Range, cands []flash.Range, m int) []flash.Range {
	// Clip, drop empties, sort.
	k := 0
	for _, c := range cands {
		c.Lo, c.Hi = max(c.Lo, 0), min(c.Hi, m)
		if c.Lo < c.Hi {
			cands[k] = c
			k++
		}
	}
	cands = cands[:k]
	slices.SortFunc(cands, func(a, b flash.Range) int { return a.Lo - b.Lo })

	for i := 0; i < len(cands); {
		// One connected component [lo, hi) of the union.
		lo, hi := cands[i].Lo, cands[i].Hi
		j := i + 1
		for ; j < len(cands) && cands[j].Lo <= hi; j++ {
			hi = max(hi, cands[j].Hi)
		}
		// Within it, emit the Full parts (merged, in order) and the
		// masked parts between them.
		at := lo
		for f := i; f < j; {
			if !cands[f].Full {
				f++
				continue
			}
			flo, fhi := cands[f].Lo, cands[f].Hi
			for f++; f < j; f++ {
				if cands[f].Full {
					if cands[f].Lo > fhi {
						break
					}
					fhi = max(fhi, cands[f].Hi)
				}
			}
			if at < flo {
				dst = append(dst, flash.Range{Lo: at, Hi: flo})
			}
			dst = append(dst, flash.Range{Lo: flo, Hi: fhi, Full: true})
			at = fhi
		}
		if at < hi {
			dst = append(dst, flash.Range{Lo: at, Hi: hi})
		}
		i = j
	}
	return dst
}

// bandRanges returns the candidates of a band pattern over one run of
// queries: query a sees keys [a+dl, a+dh] for a in [a0, a1] (inclusive).
// The union is masked; the keys every query sees are Full.
func bandRanges(cands []flash.Range, a0, a1, dl, dh int) []flash.Range {
	if dl > dh || a0 > a1 {
		return cands
	}
	cands = append(cands, flash.Range{Lo: a0 + dl, Hi: a1 + dh + 1})
	if lo, hi := a1+dl, a0+dh+1; lo < hi {
		cands = append(cands, flash.Range{Lo: lo, Hi: hi, Full: true})
	}
	return cands
}

// causalBand returns a window pattern equivalent to w under the causal
// mask, whose keys right of the diagonal are Full instead of masked: the
// kernel's causal bound then masks them as a prefix, with no Visible call.
func causalBand(w Window, causal bool) Window {
	if causal && w.Dilation <= 1 {
		w.Right = maxExtent
	}
	return w
}
