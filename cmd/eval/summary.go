package eval

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Fastest returns the fastest row of mode and mask at length n whose
// relative error is at most maxErr, and the exact row there (either may be
// nil). Exact qualifies as the baseline even where its error against the
// float64 reference was not measured; ref never does, being the slow
// reference, nor does a row whose error was not measured. Another
// mechanism beats exact only when its median is below exact's fastest
// call: a difference within exact's own spread is noise, not a speed-up.
// An error of exactly 0 means the mechanism computed what exact computes
// (it fell back to exact attention on a short input), so it never counts
// as a faster mechanism either, and nor does a row that says it fell
// back (Row.Fallback).
func Fastest(rows []Row, mode string, causal bool, n int, maxErr float64) (best, exact *Row) {
	for i := range rows {
		r := &rows[i]
		if r.Mode != mode || r.Causal != causal || r.N != n || r.Skipped != "" || r.Mech == "ref" {
			continue
		}
		if r.Mech == "exact" {
			exact = r
			continue
		}
		if r.Fallback != "" || r.RelErr == nil || *r.RelErr > maxErr || *r.RelErr == 0 {
			continue
		}
		if best == nil || r.Seconds < best.Seconds {
			best = r
		}
	}
	if exact != nil && (best == nil || best.Seconds >= min(exact.Seconds, nonzero(exact.SecondsMin))) {
		best = exact
	}
	return best, exact
}

func nonzero(x float64) float64 {
	if x == 0 {
		return math.Inf(1)
	}
	return x
}

// config is the part of a row that its mode sweeps besides the mechanism,
// mask and length, which a comparison must hold fixed: for decode the
// cache's head count and storage; for prefill nothing.
func config(r *Row) string {
	if r.Mode == "decode" {
		return fmt.Sprintf("hkv=%d %s", r.HKV, r.DType)
	}
	return ""
}

// Summarize returns one paragraph naming, for each mode, mask and length,
// the fastest mechanism whose relative error is at most maxErr, with its
// time and its speed-up over exact. Only rows of one configuration are
// compared (decode: the same cache head count and storage), so that a
// speed-up is always against exact attention on the same cache. input
// names the kind of inputs the errors were measured on.
func Summarize(rows []Row, maxErr float64, input string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Fastest mechanism with relative error at most %s against exact attention (median time per call", FormatErr(maxErr))
	if input != "" {
		fmt.Fprintf(&b, ", %s inputs", input)
	}
	b.WriteString(")")
	for _, mode := range modes(rows) {
		var configs []string
		for i := range rows {
			if c := config(&rows[i]); rows[i].Mode == mode && !slices.Contains(configs, c) {
				configs = append(configs, c)
			}
		}
		for _, cfg := range configs {
			var same []Row
			for i := range rows {
				if rows[i].Mode == mode && config(&rows[i]) == cfg {
					same = append(same, rows[i])
				}
			}
			summarizeMode(&b, same, mode, cfg, maxErr)
		}
	}
	b.WriteString(".")
	if input == Gaussian {
		b.WriteString(" On i.i.d. Gaussian inputs attention is spread thinly over all keys, the hardest case for sparse" +
			" patterns and the easiest for sampling; `attn accuracy -input FILE` measures the errors on your own activations.")
	}
	return b.String()
}

// summarizeMode writes the summary of rows, all of one mode and
// configuration cfg.
func summarizeMode(b *strings.Builder, rows []Row, mode, cfg string, maxErr float64) {
	g := gridOf(rows, mode)
	for _, causal := range []bool{false, true} {
		var parts []string
		for _, n := range g.ns {
			if !hasMask(g, causal, n) {
				continue
			}
			best, exact := Fastest(rows, mode, causal, n, maxErr)
			switch {
			case best == nil:
				parts = append(parts, fmt.Sprintf("n=%d none measured", n))
			case best == exact:
				parts = append(parts, fmt.Sprintf("n=%d exact (%s; %s)", n, FormatSeconds(best.Seconds), whyExact(rows, mode, causal, n, maxErr, exact)))
			case exact == nil:
				parts = append(parts, fmt.Sprintf("n=%d %s (%s, error %s; exact not timed)",
					n, best.Mech, FormatSeconds(best.Seconds), FormatErr(*best.RelErr)))
			default:
				parts = append(parts, fmt.Sprintf("n=%d %s (%s, %.1f× faster than exact, error %s)",
					n, best.Mech, FormatSeconds(best.Seconds), exact.Seconds/best.Seconds, FormatErr(*best.RelErr)))
			}
		}
		if len(parts) == 0 {
			continue
		}
		label := "full mask"
		switch {
		case mode == "decode":
			label = cfg // decode rows are all causal
		case causal:
			label = "causal"
		}
		fmt.Fprintf(b, "; %s %s: %s", mode, label, strings.Join(parts, ", "))
	}
}

// whyExact says why no approximation beat exact at (mode, mask, n): the
// most accurate one that approximated and whether it was fast enough, the
// fastest one and how far its error was from the bound, and how many fell
// back to exact attention.
func whyExact(rows []Row, mode string, causal bool, n int, maxErr float64, exact *Row) string {
	var closest, fastest *Row
	fellBack := 0
	for i := range rows {
		r := &rows[i]
		if r.Mode != mode || r.Causal != causal || r.N != n || r.Skipped != "" || r.Mech == "ref" || r.Mech == "exact" {
			continue
		}
		if r.Fallback != "" || (r.RelErr != nil && *r.RelErr == 0) {
			fellBack++
			continue
		}
		if r.RelErr == nil {
			continue
		}
		if closest == nil || *r.RelErr < *closest.RelErr {
			closest = r
		}
		if fastest == nil || r.Seconds < fastest.Seconds {
			fastest = r
		}
	}
	var why []string
	switch {
	case closest == nil:
		why = append(why, "no approximation ran")
	case *closest.RelErr <= maxErr:
		why = append(why, fmt.Sprintf("%s is within the bound (error %s) but no faster than exact (%s)",
			closest.Mech, FormatErr(*closest.RelErr), FormatSeconds(closest.Seconds)))
	default:
		why = append(why, fmt.Sprintf("none within %s: the closest, %s, has error %s", FormatErr(maxErr), closest.Mech, FormatErr(*closest.RelErr)))
		if fastest != closest && exact != nil && fastest.Seconds > 0 {
			why = append(why, fmt.Sprintf("the fastest, %s (%.1f× exact), %s", fastest.Mech, exact.Seconds/fastest.Seconds, FormatErr(*fastest.RelErr)))
		}
	}
	if fellBack > 0 {
		why = append(why, fmt.Sprintf("%d ran exact attention instead", fellBack))
	}
	return strings.Join(why, "; ")
}

func hasMask(g grid, causal bool, n int) bool {
	for _, s := range g.series {
		if s.causal == causal && g.cells[s][n] != nil {
			return true
		}
	}
	return false
}
