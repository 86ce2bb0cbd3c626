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

// accuracySection returns the tables of a: one per budget sweep, with
// the error metrics against exact attention and the time of one call at
// each value.
func accuracySection(a *Accuracy) Section {
	sec := Section{ID: "accuracy", Title: "error against exact attention as the budget grows: " + a.Describe()}
	names, groups := sweepGroups(a)
	for _, name := range names {
		pts := groups[name]
		p0 := pts[0]
		title := name
		if p0.Unit != "" {
			title += " (" + p0.Unit + ")"
		}
		param := p0.Param
		if param == "" {
			param = "budget"
		}
		t := Table{Title: title, Head: []string{param, "rel err", "spectral", "max row", "lse rel", "time"}}
		if a.Seeds > 1 {
			t.Head = append(t.Head, "rel err range")
		}
		for _, p := range pts {
			v := strconv.Itoa(p.Value)
			if p.Param == "" {
				v = "default"
			}
			if p.Skipped != "" {
				t.Rows = append(t.Rows, []string{v, "skipped"})
				sec.Skipped = append(sec.Skipped, fmt.Sprintf("%s: %s=%s: %s", name, param, v, p.Skipped))
				continue
			}
			row := []string{v, errCell(p.RelErr), errCell(p.SpectralErr), errCell(p.MaxRowErr), errCell(p.LSERelErr),
				FormatSeconds(p.Seconds)}
			if a.Seeds > 1 {
				row = append(row, errCell(p.RelErrMin)+" – "+errCell(p.RelErrMax))
			}
			if p.Fallback != "" {
				row[0] += fallbackMark
				sec.Fallbacks = append(sec.Fallbacks, fmt.Sprintf("%s: %s=%s%s: %s", name, param, v, fallbackMark, p.Fallback))
			}
			t.Rows = append(t.Rows, row)
		}
		sec.Tables = append(sec.Tables, t)
	}
	return sec
}

// WriteAccuracyTables prints one table per budget sweep of a: the error
// metrics against exact attention and the time of one call at each value.
func WriteAccuracyTables(w io.Writer, a *Accuracy) {
	writeSections(w, []Section{accuracySection(a)}, false)
}
