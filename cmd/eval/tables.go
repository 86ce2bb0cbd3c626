package eval

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
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

// skipList numbers the skipped rows of g in table order. Rows of one
// series skipped for the same reason share a number and a line, so that a
// mechanism that cannot run a mask says so once. Interrupted rows are
// marked in their cells instead.
func (g grid) skipList() (index map[*Row]int, lines []string) {
	index = map[*Row]int{}
	for _, s := range g.series {
		var ns []string
		var last *Row
		flush := func() {
			if last != nil {
				lines = append(lines, fmt.Sprintf("[%d] %s n=%s %s: %s", len(lines)+1, s.mech, strings.Join(ns, ","), s.mask(), last.Skipped))
			}
			last, ns = nil, nil
		}
		for _, n := range g.ns {
			r := g.cells[s][n]
			if r == nil || r.Skipped == "" || r.Interrupted {
				continue
			}
			if last != nil && last.Skipped != r.Skipped {
				flush()
			}
			index[r] = len(lines) + 1
			ns = append(ns, strconv.Itoa(n))
			last = r
		}
		flush()
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
			case r.Interrupted:
				c = "interrupted"
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

// Table is one table of the tables and the report: a title, a header
// and rows of cells, the first Left columns aligned left. The text, the
// Markdown and the HTML forms render the same Tables.
type Table struct {
	Title string
	Head  []string
	Rows  [][]string
	Left  int
}

// Section is the tables of one mode of a benchmark, or of an accuracy
// run: a heading that says what the rows hold, the tables, and the notes
// that explain their marks (skipped rows, fallbacks, wide spreads).
type Section struct {
	ID, Title string
	Tables    []Table
	// Skipped lists the skipped rows, numbered as their cells say;
	// Fallbacks the rows marked fallbackMark; Notes the rest.
	Skipped, Fallbacks, Notes []string
}

// benchTable is one measure of the bench tables; title depends on the
// mode (decode's errors are against another reference).
type benchTable struct {
	title func(mode string) string
	cell  func(m Machine, r *Row) string
	// ofGrid, where cell is nil, gives the cell function from the rows
	// of the table's mode (a speed-up needs its exact row).
	ofGrid func(g grid) func(m Machine, r *Row) string
}

func fixedTitle(t string) func(string) string { return func(string) string { return t } }

// spreadMark follows a time whose timed calls spread widely: the
// median is then a weaker figure, worth a rerun on a quiet machine.
const spreadMark = "!"

// WideSpread is the relative range (Max−Min)/Median beyond which a row's
// time is marked spreadMark.
const WideSpread = 0.25

// wide reports whether r's timed calls spread more than WideSpread.
func wide(r *Row) bool {
	return r.Reps >= 2 && r.Seconds > 0 && (r.SecondsMax-r.SecondsMin)/r.Seconds > WideSpread
}

// spreadText is r's spread as llama-bench prints it, ± one standard
// deviation, relative to the median: "±3.1%"; "(1×)" for a time of one
// call, which has none.
func spreadText(r *Row) string {
	if r.Reps < 2 || r.Seconds <= 0 {
		return "(1×)"
	}
	sd := r.SecondsSD
	if sd == 0 {
		// Results written before seconds_sd: half the range.
		sd = (r.SecondsMax - r.SecondsMin) / 2
	}
	pct := 100 * sd / r.Seconds
	if pct >= 10 {
		return "±" + strconv.FormatFloat(pct, 'f', 0, 64) + "%"
	}
	return "±" + strconv.FormatFloat(pct, 'g', 2, 64) + "%"
}

func timeCell(_ Machine, r *Row) string {
	c := FormatSeconds(r.Seconds) + " " + spreadText(r)
	if wide(r) {
		c += spreadMark
	}
	return c
}

var benchTables = []benchTable{
	{title: fixedTitle("time per call: median of the timed calls, ± their standard deviation"), cell: timeCell},
	{title: fixedTitle("speed-up over exact (its time / the mechanism's)"), ofGrid: grid.speedupCell},
	{title: fixedTitle("speed-up over exact on f32 storage (decode rows on other storages: exact f32's time at the same n and Hkv / the row's)"), ofGrid: grid.speedupF32Cell},
	{title: fixedTitle("exact-attention GFLOP/s (% of the measured peak)"), cell: func(m Machine, r *Row) string {
		if r.GFlops == 0 {
			return ""
		}
		if r.PeakPct > 0 {
			return fmt.Sprintf("%.1f (%.0f%%)", r.GFlops, r.PeakPct)
		}
		return fmt.Sprintf("%.1f", r.GFlops)
	}},
	{title: fixedTitle("K/V read GB/s (% of the measured DRAM read bandwidth)"), cell: func(m Machine, r *Row) string {
		if r.GBps == 0 {
			return ""
		}
		if m.DRAMGBps > 0 {
			return fmt.Sprintf("%.1f (%.0f%%)", r.GBps, 100*r.GBps/m.DRAMGBps)
		}
		return fmt.Sprintf("%.1f", r.GBps)
	}},
	{title: func(mode string) string {
		return "backward / forward time (train rows: the backward pass against the mechanism's own forward)"
	}, cell: func(_ Machine, r *Row) string {
		if r.BackwardRatio == 0 {
			return ""
		}
		return fmt.Sprintf("%.2f", r.BackwardRatio)
	}},
	{title: fixedTitle("extra memory per call (bytes allocated on the Go heap by one call)"), cell: func(_ Machine, r *Row) string { return FormatBytes(r.ExtraBytes) }},
	{title: errTitle, cell: func(_ Machine, r *Row) string {
		if r.RelErr == nil {
			return ""
		}
		return FormatErr(*r.RelErr)
	}},
	{title: fixedTitle("spectral-norm error ‖O−Ô‖₂/‖O‖₂ (worst head)"), cell: func(_ Machine, r *Row) string {
		if r.SpectralErr == nil {
			return ""
		}
		return FormatErr(*r.SpectralErr)
	}},
}

// errTitle names the reference of a mode's errors.
func errTitle(mode string) string {
	if mode == "decode" {
		return "relative error ‖O−Ô‖_F/‖O‖_F against exact attention over the float32 keys and values (so a bf16, f16 or i8 cache shows its rounding)"
	}
	if mode == "train" {
		return "relative error of the gradients (dq, dk, dv together) (exact: against the float64 ref's, to n = 1024; others: against exact's)"
	}
	return "relative error ‖O−Ô‖_F/‖O‖_F (exact: against the float64 ref; others: against exact)"
}

// exactOf returns the exact row that r's speed-up is against: the same
// mode, mask and length, and for decode the same cache head count and
// storage (dtype "" keeps r's) or the storage dtype names.
func (g grid) exactOf(r *Row, dtype string) *Row {
	if dtype == "" {
		dtype = r.DType
	}
	e := Row{Mode: r.Mode, Mech: "exact", HKV: r.HKV, DType: dtype}
	return g.cells[series{r.Mode, seriesName(&e), r.Causal}][r.N]
}

// speedupCell returns the cell function of the speed-up table of g.
func (g grid) speedupCell() func(Machine, *Row) string {
	return func(_ Machine, r *Row) string {
		if r.Mech == "exact" || r.Mech == "ref" {
			return ""
		}
		return speedup(r, g.exactOf(r, ""))
	}
}

// speedupF32Cell returns the cell function of the table of decode rows
// on storages other than f32 against exact on f32 storage: what a
// smaller or sparser read buys against the plain float32 cache.
func (g grid) speedupF32Cell() func(Machine, *Row) string {
	return func(_ Machine, r *Row) string {
		if r.Mode != "decode" || r.DType == "f32" || r.Mech == "ref" {
			return ""
		}
		return speedup(r, g.exactOf(r, "f32"))
	}
}

// speedup is the cell of r's speed-up over the exact row e: e's time over
// r's, marked where either spread widely; "exact" where r itself fell
// back to exact attention, which is no speed-up; empty without e.
func speedup(r, e *Row) string {
	if r.Fallback != "" {
		return "exact"
	}
	if e == nil || e.Skipped != "" || e.Seconds <= 0 || r.Seconds <= 0 {
		return ""
	}
	c := fmt.Sprintf("%.3g×", e.Seconds/r.Seconds)
	if wide(r) || wide(e) {
		c += spreadMark
	}
	return c
}

// describeRows says what the rows of one mode hold: each dimension's
// values (decode sweeps the cache's head count and storage too).
func describeRows(rows []Row, mode string) string {
	var bs, hs, hkvs, ds []int
	var dtypes []string
	add := func(list []int, v int) []int {
		if !slices.Contains(list, v) {
			list = append(list, v)
		}
		return list
	}
	for _, r := range rows {
		if r.Mode != mode {
			continue
		}
		bs, hs, hkvs, ds = add(bs, r.B), add(hs, r.H), add(hkvs, r.HKV), add(ds, r.D)
		if !slices.Contains(dtypes, r.DType) {
			dtypes = append(dtypes, r.DType)
		}
	}
	list := func(v []int) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = strconv.Itoa(x)
		}
		return strings.Join(s, ",")
	}
	shape := fmt.Sprintf("B=%s H=%s Hkv=%s D=%s, %s", list(bs), list(hs), list(hkvs), list(ds), strings.Join(dtypes, ", "))
	if mode == "decode" {
		return "decode: one query per head against a cache of n positions; " + shape + " storage"
	}
	if mode == "train" {
		return "train: a forward and a backward pass per call; " + shape
	}
	return mode + ": " + shape
}

// benchSections returns the tables of each mode of r.
func benchSections(r *Results) []Section {
	var out []Section
	for _, mode := range modes(r.Rows) {
		g := gridOf(r.Rows, mode)
		sec := Section{ID: mode, Title: describeRows(r.Rows, mode)}
		if r.Bench != nil && r.Bench.Input != "" && mode != "decode" {
			sec.Title += ", " + r.Bench.Input + " inputs"
		}
		skips, lines := g.skipList()
		anyWide, anyInterrupted := false, false
		for _, t := range benchTables {
			cell := t.cell
			if cell == nil {
				cell = t.ofGrid(g)
			}
			rows := g.table(skips, func(row *Row) string { return cell(r.Machine, row) })
			if len(rows) == 1 {
				continue
			}
			for _, row := range rows[1:] {
				for _, c := range row {
					anyWide = anyWide || strings.HasSuffix(strings.TrimSuffix(c, fallbackMark), spreadMark)
					anyInterrupted = anyInterrupted || c == "interrupted"
				}
			}
			sec.Tables = append(sec.Tables, Table{Title: t.title(mode), Head: rows[0], Rows: rows[1:], Left: 2})
		}
		sec.Skipped, sec.Fallbacks = lines, g.fallbackList()
		if anyWide {
			sec.Notes = append(sec.Notes, fmt.Sprintf("%s: the timed calls spread over %.0f%% of the median (max−min): the machine was busy or the row is short; rerun, or raise -reps", spreadMark, 100*WideSpread))
		}
		if anyInterrupted {
			sec.Notes = append(sec.Notes, "interrupted: the run was stopped while this row ran; it has no measurement")
		}
		out = append(out, sec)
	}
	return out
}

// WriteBenchTables prints the machine, then for each mode one table per
// measure (rows: mechanism and mask; columns: lengths) and the skipped
// rows with their reasons.
func WriteBenchTables(w io.Writer, r *Results) {
	writeMachine(w, r)
	writeSections(w, benchSections(r), false)
}

// WriteTable prints t as aligned text columns.
func WriteTable(w io.Writer, t Table) {
	writeText(w, append([][]string{t.Head}, t.Rows...), t.Left)
}

// writeSections prints sections as text, or as Markdown with md.
func writeSections(w io.Writer, secs []Section, md bool) {
	for _, sec := range secs {
		if md {
			fmt.Fprintf(w, "\n## %s\n", sec.Title)
		} else {
			fmt.Fprintf(w, "\n%s\n", sec.Title)
		}
		for _, t := range sec.Tables {
			if md {
				fmt.Fprintf(w, "\n### %s\n\n", t.Title)
				writeMarkdown(w, t)
				continue
			}
			if t.Title != "" {
				fmt.Fprintf(w, "\n%s\n", t.Title)
			}
			writeText(w, append([][]string{t.Head}, t.Rows...), t.Left)
		}
		list := func(title string, lines []string) {
			if len(lines) == 0 {
				return
			}
			if md {
				fmt.Fprintf(w, "\n%s\n\n", title)
				for _, l := range lines {
					fmt.Fprintf(w, "- %s\n", mdEscape(l))
				}
				return
			}
			fmt.Fprintf(w, "\n%s\n", title)
			for _, l := range lines {
				fmt.Fprintln(w, "  "+l)
			}
		}
		list("skipped:", sec.Skipped)
		list(fmt.Sprintf("ran exact attention instead of the approximation (marked %s):", fallbackMark), sec.Fallbacks)
		list("notes:", sec.Notes)
	}
}

// writeMarkdown prints t as a GitHub-flavoured Markdown table.
func writeMarkdown(w io.Writer, t Table) {
	row := func(cells []string) {
		esc := make([]string, len(cells))
		for i, c := range cells {
			esc[i] = mdEscape(c)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(esc, " | "))
	}
	row(t.Head)
	align := make([]string, len(t.Head))
	for i := range align {
		align[i] = "---:"
		if i < t.Left {
			align[i] = ":---"
		}
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(align, "|"))
	for _, r := range t.Rows {
		row(r)
	}
}

// mdEscape keeps a cell's text from being read as Markdown: pipes end
// cells, asterisks and underscores emphasise.
func mdEscape(s string) string {
	return strings.NewReplacer("|", `\|`, "*", `\*`, "_", `\_`).Replace(s)
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
