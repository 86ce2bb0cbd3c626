package eval

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// series is one line of a table or plot: a mechanism in one mode, causal
// or not.
type series struct {
	mode, mech string
	causal     bool
}

func (s series) mask() string {
	if s.causal {
		return "causal"
	}
	return "full"
}

func (s series) label() string {
	if s.causal {
		return s.mech + " (causal)"
	}
	return s.mech
}

// grid arranges the rows of one mode by series and length.
type grid struct {
	mode   string
	ns     []int
	series []series
	cells  map[series]map[int]*Row
}

// modes returns the modes of rows in order of appearance.
func modes(rows []Row) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Mode) {
			out = append(out, r.Mode)
		}
	}
	return out
}

// gridOf returns the rows of mode, series in order of first appearance.
func gridOf(rows []Row, mode string) grid {
	g := grid{mode: mode, cells: map[series]map[int]*Row{}}
	for i := range rows {
		r := &rows[i]
		if r.Mode != mode {
			continue
		}
		k := series{r.Mode, seriesName(r), r.Causal}
		if g.cells[k] == nil {
			g.cells[k] = map[int]*Row{}
			g.series = append(g.series, k)
		}
		g.cells[k][r.N] = r
		if !slices.Contains(g.ns, r.N) {
			g.ns = append(g.ns, r.N)
		}
	}
	slices.Sort(g.ns)
	// Full before causal, then the order of appearance.
	slices.SortStableFunc(g.series, func(a, b series) int {
		return boolCmp(a.causal, b.causal)
	})
	return g
}

// seriesName is the row's mechanism, with the cache's head count and
// element type for decode rows, which sweep those too.
func seriesName(r *Row) string {
	if r.Mode == "decode" {
		return fmt.Sprintf("%s hkv=%d %s", r.Mech, r.HKV, r.DType)
	}
	return r.Mech
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// skipList numbers the skipped rows of g in table order.
func (g grid) skipList() (index map[*Row]int, lines []string) {
	index = map[*Row]int{}
	for _, s := range g.series {
		for _, n := range g.ns {
			if r := g.cells[s][n]; r != nil && r.Skipped != "" {
				index[r] = len(lines) + 1
				lines = append(lines, fmt.Sprintf("[%d] %s n=%d %s: %s", len(lines)+1, s.mech, n, s.mask(), r.Skipped))
			}
		}
	}
	return index, lines
}

// fallbackMark follows every cell of a row that ran exact attention
// instead of its mechanism's approximation (Row.Fallback).
const fallbackMark = "*"

// fallbackList lists the rows of g that fell back to exact attention, in
// table order, with the reason.
func (g grid) fallbackList() []string {
	var lines []string
	for _, s := range g.series {
		for _, n := range g.ns {
			if r := g.cells[s][n]; r != nil && r.Skipped == "" && r.Fallback != "" {
				lines = append(lines, fmt.Sprintf("%s n=%d %s: %s", s.mech, n, s.mask(), r.Fallback))
			}
		}
	}
	return lines
}

// table renders g with one column per length; cell formats a row that
// ran and returns "" to leave it out. Series with no cell are omitted.
// The cells of rows that fell back to exact attention carry fallbackMark.
func (g grid) table(skips map[*Row]int, cell func(*Row) string) [][]string {
	head := []string{"mech", "mask"}
	for _, n := range g.ns {
		head = append(head, fmt.Sprintf("n=%d", n))
	}
	out := [][]string{head}
	for _, s := range g.series {
		line := []string{s.mech, s.mask()}
		any := false
		for _, n := range g.ns {
			r := g.cells[s][n]
			var c string
			switch {
			case r == nil:
				c = ""
			case r.Skipped != "":
				c = fmt.Sprintf("skip[%d]", skips[r])
			default:
				c = cell(r)
				switch {
				case c == "":
					c = "-"
				case r.Fallback != "":
					any = true
					c += fallbackMark
				default:
					any = true
				}
			}
			line = append(line, c)
		}
		if any {
			out = append(out, line)
		}
	}
	return out
}

// writeText prints rows as columns: the first left columns aligned left,
// the others right.
func writeText(w io.Writer, rows [][]string, left int) {
	var width []int
	for _, r := range rows {
		for i, c := range r {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < left {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// benchTable is one measure of the bench tables.
type benchTable struct {
	title string
	cell  func(m Machine, r *Row) string
}

var benchTables = []benchTable{
	{"time per call (median of the timed calls)", func(_ Machine, r *Row) string { return FormatSeconds(r.Seconds) }},
	{"speed-up over exact (its time / the mechanism's)", nil}, // filled in by speedups
	{"exact-attention GFLOP/s (% of the measured peak)", func(m Machine, r *Row) string {
		if r.GFlops == 0 {
			return ""
		}
		if r.PeakPct > 0 {
			return fmt.Sprintf("%.1f (%.0f%%)", r.GFlops, r.PeakPct)
		}
		return fmt.Sprintf("%.1f", r.GFlops)
	}},
	{"K/V read GB/s (% of the measured DRAM read bandwidth)", func(m Machine, r *Row) string {
		if r.GBps == 0 {
			return ""
		}
		if m.DRAMGBps > 0 {
			return fmt.Sprintf("%.1f (%.0f%%)", r.GBps, 100*r.GBps/m.DRAMGBps)
		}
		return fmt.Sprintf("%.1f", r.GBps)
	}},
	{"extra memory per call (bytes allocated on the Go heap by one call)", func(_ Machine, r *Row) string { return FormatBytes(r.ExtraBytes) }},
	{"relative error ‖O−Ô‖_F/‖O‖_F (exact: against the float64 ref; others: against exact)", func(_ Machine, r *Row) string {
		if r.RelErr == nil {
			return ""
		}
		return FormatErr(*r.RelErr)
	}},
	{"spectral-norm error ‖O−Ô‖₂/‖O‖₂ (worst head)", func(_ Machine, r *Row) string {
		if r.SpectralErr == nil {
			return ""
		}
		return FormatErr(*r.SpectralErr)
	}},
}

// speedupCell returns the cell function of the speed-up table of g.
func (g grid) speedupCell() func(Machine, *Row) string {
	return func(_ Machine, r *Row) string {
		if r.Mech == "exact" || r.Mech == "ref" {
			return ""
		}
		if r.Fallback != "" {
			// Exact attention under another name is no speed-up.
			return "exact"
		}
		e := g.cells[series{r.Mode, "exact", r.Causal}][r.N]
		if e == nil || e.Skipped != "" || e.Seconds <= 0 || r.Seconds <= 0 {
			return ""
		}
		return fmt.Sprintf("%.3g×", e.Seconds/r.Seconds)
	}
}

// WriteBenchTables prints the machine, then for each mode one table per
// measure (rows: mechanism and mask; columns: lengths) and the skipped
// rows with their reasons.
func WriteBenchTables(w io.Writer, r *Results) {
	writeMachine(w, r)
	for _, mode := range modes(r.Rows) {
		g := gridOf(r.Rows, mode)
		first := g.cells[g.series[0]][g.ns[0]]
		fmt.Fprintf(w, "\n%s: B=%d H=%d Hkv=%d D=%d, %s", mode, first.B, first.H, first.HKV, first.D, first.DType)
		if r.Bench != nil && r.Bench.Input != "" {
			fmt.Fprintf(w, ", %s inputs", r.Bench.Input)
		}
		fmt.Fprintln(w)
		skips, lines := g.skipList()
		for _, t := range benchTables {
			cell := t.cell
			if cell == nil {
				cell = g.speedupCell()
			}
			rows := g.table(skips, func(row *Row) string { return cell(r.Machine, row) })
			if len(rows) == 1 {
				continue
			}
			fmt.Fprintf(w, "\n%s\n", t.title)
			writeText(w, rows, 2)
		}
		if len(lines) > 0 {
			fmt.Fprintln(w, "\nskipped:")
			for _, l := range lines {
				fmt.Fprintln(w, "  "+l)
			}
		}
		if fb := g.fallbackList(); len(fb) > 0 {
			fmt.Fprintf(w, "\nran exact attention instead of the approximation (marked %s):\n", fallbackMark)
			for _, l := range fb {
				fmt.Fprintln(w, "  "+l)
			}
		}
	}
}

// WriteSummary prints the benchmark's summary paragraph, if any.
func WriteSummary(w io.Writer, r *Results) {
	if r.Bench != nil && r.Bench.Summary != "" {
		fmt.Fprintf(w, "\n%s\n", wrap(r.Bench.Summary, 78))
	}
}

func writeMachine(w io.Writer, r *Results) {
	m := r.Machine
	fmt.Fprintf(w, "attn %s on %s, %d threads (%d cores), kernels %s\n", r.Version, m.CPU, m.Threads, m.Cores, m.Kernels)
	if m.PeakGFlops > 0 || m.DRAMGBps > 0 {
		fmt.Fprintf(w, "measured: peak %.1f GFLOP/s (fp32 FMA, %d threads), DRAM read %.1f GB/s\n", m.PeakGFlops, m.Threads, m.DRAMGBps)
	}
}

// wrap breaks s into lines of at most width runes at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(s) {
		l := utf8.RuneCountInString(word)
		if i > 0 {
			if n+1+l > width {
				b.WriteByte('\n')
				n = 0
			} else {
				b.WriteByte(' ')
				n++
			}
		}
		b.WriteString(word)
		n += l
	}
	return b.String()
}

// FormatSeconds prints a duration with three significant digits.
func FormatSeconds(s float64) string {
	switch {
	case s >= 100:
		return fmt.Sprintf("%.0f s", s)
	case s >= 1:
		return fmt.Sprintf("%.3g s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3g ms", s*1e3)
	}
	return fmt.Sprintf("%.3g µs", s*1e6)
}

// FormatBytes prints a byte count in binary units.
func FormatBytes(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// FormatErr prints an error metric with two significant digits.
func FormatErr(e float64) string {
	switch {
	case e == 0:
		return "0"
	case math.IsInf(e, 1):
		return "inf"
	case e >= 0.01 && e < 100:
		return fmt.Sprintf("%.2g", e)
	}
	return fmt.Sprintf("%.1e", e)
}
