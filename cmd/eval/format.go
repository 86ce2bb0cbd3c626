package eval

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/attnkit/attn"
)

// Formats are the forms WriteBench and WriteAccuracy print: aligned text
// tables, Markdown tables, CSV with one line a row (or point) and every
// field, and the results.json document. Markdown, CSV and JSON are for
// programs and pages: they carry what the text does, without the
// machine's banner in CSV.
var Formats = []string{"text", "md", "csv", "json"}

// CheckFormat returns an error wrapping attn.ErrInput unless f is one of
// Formats.
func CheckFormat(f string) error {
	if !slices.Contains(Formats, f) {
		return fmt.Errorf("%w: -format %q: want %s", attn.ErrInput, f, strings.Join(Formats, ", "))
	}
	return nil
}

// WriteBench prints a benchmark's tables (and its accuracy sweeps, if
// any) and summary in format f.
func WriteBench(w io.Writer, r *Results, f string) error {
	switch f {
	case "text":
		WriteBenchTables(w, r)
		if r.Accuracy != nil {
			fmt.Fprintln(w)
			WriteAccuracyTables(w, r.Accuracy)
		}
		WriteSummary(w, r)
	case "md":
		fmt.Fprintf(w, "# attn %s benchmark\n\n", r.Version)
		writeMachineMD(w, r)
		if r.Bench != nil && r.Bench.Summary != "" {
			fmt.Fprintf(w, "\n%s\n", mdEscape(r.Bench.Summary))
		}
		secs := benchSections(r)
		if r.Accuracy != nil {
			secs = append(secs, accuracySection(r.Accuracy))
		}
		writeSections(w, secs, true)
	case "csv":
		return writeRowsCSV(w, r.Rows)
	case "json":
		return writeJSON(w, r)
	default:
		return CheckFormat(f)
	}
	return nil
}

// WriteAccuracy prints an accuracy run's tables in format f; with json,
// the results.json document holding it alone.
func WriteAccuracy(w io.Writer, a *Accuracy, f string) error {
	switch f {
	case "text":
		WriteAccuracyTables(w, a)
	case "md":
		writeSections(w, []Section{accuracySection(a)}, true)
	case "csv":
		return writePointsCSV(w, a.Points)
	case "json":
		return writeJSON(w, &Results{Version: attn.Version, Accuracy: a})
	default:
		return CheckFormat(f)
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func writeMachineMD(w io.Writer, r *Results) {
	m := r.Machine
	fmt.Fprintf(w, "%s, %d threads (%d cores), kernels %s", mdEscape(m.CPU), m.Threads, m.Cores, mdEscape(m.Kernels))
	if m.PeakGFlops > 0 || m.DRAMGBps > 0 {
		fmt.Fprintf(w, "; measured peak %.1f GFLOP/s (fp32 FMA), DRAM read %.1f GB/s", m.PeakGFlops, m.DRAMGBps)
	}
	fmt.Fprintln(w, ".")
}

// RowsCSVHeader is the first line of the CSV form of bench rows: the
// JSON field names of Row, params last as name=value;name=value.
var RowsCSVHeader = []string{"mode", "mech", "b", "h", "hkv", "n", "m", "d", "causal", "dtype",
	"seconds", "seconds_min", "seconds_max", "seconds_sd", "reps", "gflops", "gbps", "extra_bytes",
	"rel_err", "max_row_err", "lse_rel_err", "lse_max_abs", "spectral_err", "fallback", "skipped", "interrupted", "params"}

func writeRowsCSV(w io.Writer, rows []Row) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(RowsCSVHeader); err != nil {
		return err
	}
	for _, r := range rows {
		rec := []string{r.Mode, r.Mech, itoa(r.B), itoa(r.H), itoa(r.HKV), itoa(r.N), itoa(r.M), itoa(r.D),
			strconv.FormatBool(r.Causal), r.DType,
			ftoa(r.Seconds), ftoa(r.SecondsMin), ftoa(r.SecondsMax), ftoa(r.SecondsSD), itoa(r.Reps),
			ftoa(r.GFlops), ftoa(r.GBps), strconv.FormatUint(r.ExtraBytes, 10),
			ptoa(r.RelErr), ptoa(r.MaxRowErr), ptoa(r.LSERelErr), ptoa(r.LSEMaxAbs), ptoa(r.SpectralErr),
			r.Fallback, r.Skipped, strconv.FormatBool(r.Interrupted), paramsText(r.Params)}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// PointsCSVHeader is the first line of the CSV form of accuracy points.
var PointsCSVHeader = []string{"sweep", "mech", "param", "value", "unit", "rel_err", "rel_err_min", "rel_err_max",
	"max_row_err", "lse_rel_err", "lse_max_abs", "spectral_err", "seconds", "seeds", "fallback", "skipped", "params"}

func writePointsCSV(w io.Writer, pts []AccuracyPoint) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(PointsCSVHeader); err != nil {
		return err
	}
	for _, p := range pts {
		rec := []string{p.Sweep, p.Mech, p.Param, itoa(p.Value), p.Unit, ptoa(p.RelErr), ptoa(p.RelErrMin), ptoa(p.RelErrMax),
			ptoa(p.MaxRowErr), ptoa(p.LSERelErr), ptoa(p.LSEMaxAbs), ptoa(p.SpectralErr), ftoa(p.Seconds), itoa(p.Seeds),
			p.Fallback, p.Skipped, paramsText(p.Params)}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func itoa(v int) string { return strconv.Itoa(v) }

// ftoa prints x so that ParseFloat gives it back exactly.
func ftoa(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// ptoa is ftoa of *p, or "" for a metric not measured (null in JSON).
func ptoa(p *float64) string {
	if p == nil {
		return ""
	}
	return ftoa(*p)
}

func paramsText(p map[string]string) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(p)) {
		kv = append(kv, k+"="+p[k])
	}
	return strings.Join(kv, ";")
}
