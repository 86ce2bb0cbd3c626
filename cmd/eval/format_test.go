package eval

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestWriteBenchJSON: -format json prints results.json exactly.
func TestWriteBenchJSON(t *testing.T) {
	r := sampleResults()
	var buf bytes.Buffer
	if err := WriteBench(&buf, r, "json"); err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, &back) {
		t.Error("the JSON form does not round-trip")
	}
	buf.Reset()
	if err := WriteAccuracy(&buf, r.Accuracy, "json"); err != nil {
		t.Fatal(err)
	}
	var acc Results
	if err := json.Unmarshal(buf.Bytes(), &acc); err != nil || !reflect.DeepEqual(acc.Accuracy, r.Accuracy) {
		t.Errorf("the accuracy JSON form does not round-trip: %v", err)
	}
}

// TestWriteBenchCSV: one line a row, every number given back exactly.
func TestWriteBenchCSV(t *testing.T) {
	r := sampleResults()
	r.Rows[3].SecondsSD = 1.0 / 3
	var buf bytes.Buffer
	if err := WriteBench(&buf, r, "csv"); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(r.Rows)+1 || !reflect.DeepEqual(recs[0], RowsCSVHeader) {
		t.Fatalf("%d records, header %v", len(recs), recs[0])
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	for i, row := range r.Rows {
		rec := recs[i+1]
		secs, err := strconv.ParseFloat(rec[col["seconds"]], 64)
		sd, _ := strconv.ParseFloat(rec[col["seconds_sd"]], 64)
		if err != nil || secs != row.Seconds || sd != row.SecondsSD || rec[col["mech"]] != row.Mech || rec[col["skipped"]] != row.Skipped {
			t.Errorf("row %d: %v, want %+v", i, rec, row)
		}
		if (row.RelErr == nil) != (rec[col["rel_err"]] == "") {
			t.Errorf("row %d: rel_err %q for %v", i, rec[col["rel_err"]], row.RelErr)
		}
	}
	buf.Reset()
	if err := WriteAccuracy(&buf, r.Accuracy, "csv"); err != nil {
		t.Fatal(err)
	}
	recs, err = csv.NewReader(&buf).ReadAll()
	if err != nil || len(recs) != len(r.Accuracy.Points)+1 {
		t.Fatalf("accuracy csv: %d records, %v", len(recs), err)
	}
}

// mdTables parses the Markdown tables of md: for each "### title", its
// header and rows, cells unescaped.
func mdTables(md string) map[string][][]string {
	out := map[string][][]string{}
	var title string
	for line := range strings.SplitSeq(md, "\n") {
		switch {
		case strings.HasPrefix(line, "### "):
			title = strings.TrimPrefix(line, "### ")
		case strings.HasPrefix(line, "|") && !strings.HasPrefix(line, "|:--") && !strings.HasPrefix(line, "|---"):
			inner := strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |")
			inner = strings.ReplaceAll(inner, `\|`, "\x00")
			var cells []string
			for c := range strings.SplitSeq(inner, " | ") {
				c = strings.ReplaceAll(c, "\x00", "|")
				cells = append(cells, strings.NewReplacer(`\*`, "*", `\_`, "_").Replace(c))
			}
			out[title] = append(out[title], cells)
		}
	}
	return out
}

// TestWriteBenchMarkdown: the Markdown tables hold the text tables'
// cells, so either can be read back for the other.
func TestWriteBenchMarkdown(t *testing.T) {
	r := fallbackResults()
	var buf bytes.Buffer
	if err := WriteBench(&buf, r, "md"); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	tables := mdTables(md)
	for _, sec := range append(benchSections(r), accuracySection(r.Accuracy)) {
		for _, want := range sec.Tables {
			got := tables[want.Title]
			if !reflect.DeepEqual(got, append([][]string{want.Head}, want.Rows...)) {
				t.Errorf("table %q:\n got %q\nwant %q", want.Title, got, append([][]string{want.Head}, want.Rows...))
			}
		}
	}
	for _, want := range []string{"# attn 9.9.9-test benchmark", "Test CPU 3000", "Fastest mechanism", "- performer n=512 full: M = 512 < min = 2048"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if err := WriteBench(&buf, r, "xml"); err == nil {
		t.Error("format xml: no error")
	}
}

// TestSpreadAndInterrupted: every timed row shows its spread, a wide
// one is marked and explained, and an interrupted row says so instead of
// showing a time of 0.
func TestSpreadAndInterrupted(t *testing.T) {
	r := sampleResults()
	for i := range r.Rows {
		row := &r.Rows[i]
		switch {
		case row.Mech == "window" && !row.Causal && row.N == 512:
			row.SecondsMin, row.SecondsMax, row.SecondsSD = row.Seconds*0.5, row.Seconds*2, row.Seconds*0.4
		case row.Mech == "performer" && row.Causal && row.N == 1024:
			*row = Row{Mode: row.Mode, Mech: row.Mech, B: 1, H: 8, HKV: 8, N: 1024, M: 1024, D: 64, Causal: true, DType: "f32",
				Skipped: "interrupted", Interrupted: true}
		case row.Mech == "exact" && !row.Causal && row.N == 512:
			row.Reps = 1
		}
	}
	var buf bytes.Buffer
	WriteBenchTables(&buf, r)
	out := buf.String()
	for _, want := range []string{"2 ms ±40%!", "10 ms (1×)", "interrupted", "spread over 25% of the median", "40 ms ±10%"} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "0 µs") || strings.Contains(out, "skipped:\n  [3]") {
		t.Errorf("the interrupted row shows a time or a skip:\n%s", out)
	}
}

// TestDecodeTables: the decode heading names every head count and
// storage its rows hold, speed-ups and the summary compare rows of one
// cache configuration, and the error table says what it is against.
func TestDecodeTables(t *testing.T) {
	var rows []Row
	for _, hkv := range []int{8, 1} {
		for _, dt := range []string{"f32", "bf16"} {
			for _, mech := range []string{"exact", "window"} {
				secs := 0.001 * float64(hkv)
				if dt == "bf16" {
					secs /= 2
				}
				if mech == "window" {
					secs *= 0.9
				}
				rows = append(rows, Row{Mode: "decode", Mech: mech, B: 1, H: 32, HKV: hkv, N: 4096, M: 4096, D: 128,
					Causal: true, DType: dt, Seconds: secs, SecondsMin: secs, SecondsMax: secs, Reps: 3, RelErr: f64(0.01)})
			}
		}
	}
	r := &Results{Version: "x", Rows: rows, Bench: &BenchInfo{MaxErr: 0.1, Summary: Summarize(rows, 0.1, "")}}
	var buf bytes.Buffer
	WriteBenchTables(&buf, r)
	out := buf.String()
	for _, want := range []string{"Hkv=8,1", "f32, bf16 storage", "over the float32 keys and values", "1.11×"} {
		if !strings.Contains(out, want) {
			t.Errorf("decode tables lack %q:\n%s", want, out)
		}
	}
	// Every window row is 0.9 of the exact row of its own cache: a
	// comparison across caches would give 0.9·2 or 0.9/8. The table
	// against exact on f32 storage compares across storage only: the
	// bf16 rows of each head count against its exact f32 row (exact 2×,
	// window 2.22×), never the f32 rows, never across head counts.
	same, f32 := tableOf(out, "speed-up over exact (its"), tableOf(out, "speed-up over exact on f32 storage")
	if strings.Contains(same, "2.22×") || strings.Contains(out, "0.556×") || strings.Contains(out, "8.89×") {
		t.Errorf("speed-up across cache configurations:\n%s", out)
	}
	if strings.Count(f32, "2.22×") != 2 || strings.Count(f32, " 2×") != 2 || strings.Contains(f32, "1.11×") {
		t.Errorf("speed-ups over exact on f32 storage:\n%s", f32)
	}
	for _, want := range []string{"decode hkv=8 f32: n=4096 window", "decode hkv=1 bf16: n=4096 window (450 µs, 1.1× faster"} {
		if !strings.Contains(r.Bench.Summary, want) {
			t.Errorf("summary lacks %q: %s", want, r.Bench.Summary)
		}
	}
}

// tableOf returns the lines of the text table of out whose title starts
// with title, up to the blank line after it.
func tableOf(out, title string) string {
	i := strings.Index(out, title)
	if i < 0 {
		return ""
	}
	if j := strings.Index(out[i:], "\n\n"); j >= 0 {
		return out[i : i+j]
	}
	return out[i:]
}
