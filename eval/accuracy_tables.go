package eval

import (
	"fmt"
	"io"
	"strconv"
)

// sweepGroups returns the points of a grouped by sweep, in order of first
// appearance.
func sweepGroups(a *Accuracy) (names []string, groups map[string][]*AccuracyPoint) {
	groups = map[string][]*AccuracyPoint{}
	for i := range a.Points {
		p := &a.Points[i]
		if groups[p.Sweep] == nil {
			names = append(names, p.Sweep)
		}
		groups[p.Sweep] = append(groups[p.Sweep], p)
	}
	return names, groups
}

// Describe says what inputs and shape a was measured on.
func (a *Accuracy) Describe() string {
	mask := "full mask"
	if a.Causal {
		mask = "causal"
	}
	return fmt.Sprintf("%s inputs, B=%d H=%d Hkv=%d N=%d M=%d D=%d, %s, mean over %d seed(s)",
		a.Input, a.B, a.H, a.HKV, a.N, a.M, a.D, mask, a.Seeds)
}

func errCell(e *float64) string {
	if e == nil {
		return "-"
	}
	return FormatErr(*e)
}

// WriteAccuracyTables prints one table per budget sweep of a: the error
// metrics against exact attention and the time of one call at each value.
func WriteAccuracyTables(w io.Writer, a *Accuracy) {
	fmt.Fprintf(w, "error against exact attention as the budget grows: %s\n", a.Describe())
	names, groups := sweepGroups(a)
	for _, name := range names {
		pts := groups[name]
		p0 := pts[0]
		fmt.Fprintf(w, "\n%s", name)
		if p0.Unit != "" {
			fmt.Fprintf(w, " (%s)", p0.Unit)
		}
		fmt.Fprintln(w)
		param := p0.Param
		if param == "" {
			param = "budget"
		}
		head := []string{param, "rel err", "spectral", "max row", "lse rel", "time"}
		if a.Seeds > 1 {
			head = append(head, "rel err range")
		}
		rows := [][]string{head}
		var skipped, fallbacks []string
		for _, p := range pts {
			v := strconv.Itoa(p.Value)
			if p.Param == "" {
				v = "default"
			}
			if p.Skipped != "" {
				rows = append(rows, []string{v, "skipped"})
				skipped = append(skipped, fmt.Sprintf("%s=%s: %s", param, v, p.Skipped))
				continue
			}
			row := []string{v, errCell(p.RelErr), errCell(p.SpectralErr), errCell(p.MaxRowErr), errCell(p.LSERelErr),
				FormatSeconds(p.Seconds)}
			if a.Seeds > 1 {
				row = append(row, errCell(p.RelErrMin)+" – "+errCell(p.RelErrMax))
			}
			if p.Fallback != "" {
				row[0] += fallbackMark
				fallbacks = append(fallbacks, fmt.Sprintf("%s=%s%s: %s", param, v, fallbackMark, p.Fallback))
			}
			rows = append(rows, row)
		}
		writeText(w, rows, 0)
		for _, s := range skipped {
			fmt.Fprintf(w, "  skipped %s\n", s)
		}
		for _, s := range fallbacks {
			fmt.Fprintf(w, "  ran exact attention instead: %s\n", s)
		}
	}
}
