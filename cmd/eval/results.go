package eval

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/attnkit/attn/internal/simd"
)

// Results is the results.json document: the fields of docs/DESIGN.md §5, which
// keep their meaning, and more. `attn bench` fills Rows and Bench, `attn
// accuracy` fills Accuracy; both write to one DIR without erasing the
// other's part.
type Results struct {
	Version string  `json:"version"`
	Machine Machine `json:"machine"`
	Rows    []Row   `json:"rows"`
	// Bench describes the sweep that produced Rows.
	Bench *BenchInfo `json:"bench,omitempty"`
	// Accuracy holds the budget sweeps of `attn accuracy`.
	Accuracy *Accuracy `json:"accuracy,omitempty"`
}

// Machine describes where the results were measured.
type Machine struct {
	CPU     string `json:"cpu"`
	Threads int    `json:"threads"`
	// PeakGFlops is the fused multiply-add peak of Threads threads and
	// DRAMGBps their streaming read bandwidth from a buffer larger than
	// the last-level cache, both measured in the same process; 0 means not
	// measured.
	PeakGFlops float64 `json:"peak_gflops"`
	DRAMGBps   float64 `json:"dram_gbps"`
	// Cores is the number of logical CPUs; Kernels names the assembly
	// kernel set in use (or "generic").
	Cores   int    `json:"cores"`
	Kernels string `json:"kernels"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
	Go      string `json:"go"`
}

// Row is one mechanism at one size: the row of docs/DESIGN.md §5.
type Row struct {
	Mode   string `json:"mode"`
	Mech   string `json:"mech"`
	B      int    `json:"b"`
	H      int    `json:"h"`
	HKV    int    `json:"hkv"`
	N      int    `json:"n"`
	M      int    `json:"m"`
	D      int    `json:"d"`
	Causal bool   `json:"causal"`
	DType  string `json:"dtype"`
	// Params lists every parameter of the mechanism in effect, defaults
	// included (registry.Effective).
	Params map[string]string `json:"params"`
	// Fallback is why the mechanism ran exact attention instead of its
	// approximation for this row (attn.FallbackOf); empty, and absent
	// from the JSON, when the approximation ran. Such a row's time and
	// error are exact attention's: tables mark it, and it is never a
	// speed-up, the summary's pick or on a Pareto front.
	Fallback string `json:"fallback,omitempty"`
	// Seconds is the median of the timed calls.
	Seconds float64 `json:"seconds"`
	// GFlops is the exact-attention flop rate (ExactFlops / Seconds), for
	// the rows that compute exact attention (ref, exact) only; 0 elsewhere.
	GFlops float64 `json:"gflops"`
	// GBps is the K/V read rate of decode rows; 0 for prefill.
	GBps float64 `json:"gbps"`
	// ExtraBytes is what one call allocated on the Go heap.
	ExtraBytes uint64 `json:"extra_bytes"`
	// RelErr is the relative Frobenius error: for exact against the
	// float64 reference, for every other mechanism against exact; null
	// where not measured.
	RelErr *float64 `json:"rel_err"`
	// Skipped is why the row did not run; empty when it ran.
	Skipped string `json:"skipped"`

	// SecondsMin and SecondsMax bound the timed calls, SecondsSD is their
	// standard deviation (0 for fewer than two); Reps counts them (0:
	// the warm-up call was too slow to repeat and is the only one).
	SecondsMin float64 `json:"seconds_min"`
	SecondsMax float64 `json:"seconds_max"`
	SecondsSD  float64 `json:"seconds_sd"`
	Reps       int     `json:"reps"`
	// Interrupted marks a row that was running when the sweep was
	// stopped: Skipped says so and the row has no measurement.
	Interrupted bool `json:"interrupted,omitempty"`
	// PeakPct is GFlops as a percentage of Machine.PeakGFlops.
	PeakPct float64 `json:"peak_pct,omitempty"`
	// ForwardSeconds and BackwardRatio are train rows' (mode "train",
	// where Seconds is a forward and a backward pass): the median
	// forward alone, and the backward's time over it.
	ForwardSeconds float64 `json:"forward_seconds,omitempty"`
	// Kernels is the kernel family the row ran on (simd.Kernels: avx512bf16,
	// avx512, avx2 or generic).
	Kernels       string  `json:"kernels,omitempty"`
	BackwardRatio float64 `json:"backward_ratio,omitempty"`
	// The other error metrics of Errors, against the same reference.
	MaxRowErr   *float64 `json:"max_row_err,omitempty"`
	LSERelErr   *float64 `json:"lse_rel_err,omitempty"`
	LSEMaxAbs   *float64 `json:"lse_max_abs,omitempty"`
	SpectralErr *float64 `json:"spectral_err,omitempty"`
	// Note explains an error metric left null, such as a non-finite
	// output.
	Note string `json:"note,omitempty"`
}

// SetErrors stores e in the row's error fields. JSON has no Inf or NaN, so
// a non-finite metric is left null and explained in Note.
func (r *Row) SetErrors(e Errors) {
	r.RelErr, r.MaxRowErr, r.SpectralErr = finitePtr(e.Rel), finitePtr(e.MaxRow), finitePtr(e.Spectral)
	r.LSERelErr, r.LSEMaxAbs = finitePtr(e.LSE), finitePtr(e.LSEMaxAbs)
	if math.IsInf(e.Rel, 0) || math.IsNaN(e.Rel) {
		r.Note = "output is not finite or has the wrong size: errors not shown"
	} else if math.IsInf(e.LSE, 0) {
		r.Note = "lse disagrees with the reference on which rows see no key, or is not finite"
	}
}

// BenchInfo describes one `attn bench` sweep.
type BenchInfo struct {
	Command string `json:"command"`
	Date    string `json:"date"`
	// Seconds is the wall time of the whole sweep.
	Seconds float64 `json:"seconds"`
	// Input is the kind of inputs timed ("gaussian").
	Input string `json:"input"`
	// MaxErr is the error bound of Summary: the fastest mechanism with a
	// relative error at most MaxErr, at each length.
	MaxErr  float64 `json:"max_err"`
	Summary string  `json:"summary"`
	// ParetoN is the length of the report's speed/error plot.
	ParetoN int `json:"pareto_n"`
}

// Accuracy is one `attn accuracy` run: error against exact attention as
// each mechanism's budget grows.
type Accuracy struct {
	Command string `json:"command"`
	Date    string `json:"date"`
	// Input is "gaussian", "planted" or the files the tensors came from.
	Input  string          `json:"input"`
	B      int             `json:"b"`
	H      int             `json:"h"`
	HKV    int             `json:"hkv"`
	N      int             `json:"n"`
	M      int             `json:"m"`
	D      int             `json:"d"`
	Causal bool            `json:"causal"`
	Seeds  int             `json:"seeds"`
	Points []AccuracyPoint `json:"points"`
}

// AccuracyPoint is one mechanism at one budget. Errors are means over the
// seeds that ran; RelErrMin and RelErrMax bound the relative error.
type AccuracyPoint struct {
	Sweep string `json:"sweep"`
	Mech  string `json:"mech"`
	Param string `json:"param"`
	Value int    `json:"value"`
	Unit  string `json:"unit"`
	// Params lists every parameter in effect, defaults included.
	Params map[string]string `json:"params"`
	// Fallback is why the mechanism ran exact attention instead of its
	// approximation at this point; empty, and absent, when it did not.
	Fallback string `json:"fallback,omitempty"`

	RelErr      *float64 `json:"rel_err"`
	RelErrMin   *float64 `json:"rel_err_min,omitempty"`
	RelErrMax   *float64 `json:"rel_err_max,omitempty"`
	MaxRowErr   *float64 `json:"max_row_err,omitempty"`
	LSERelErr   *float64 `json:"lse_rel_err,omitempty"`
	LSEMaxAbs   *float64 `json:"lse_max_abs,omitempty"`
	SpectralErr *float64 `json:"spectral_err,omitempty"`
	// Seconds is the median time of one call over the seeds.
	Seconds float64 `json:"seconds"`
	Seeds   int     `json:"seeds"`
	Skipped string  `json:"skipped"`
	Note    string  `json:"note,omitempty"`
}

// finitePtr returns &x, or nil when x is NaN or infinite.
func finitePtr(x float64) *float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	return &x
}

// ProbeMachine describes this machine for threads threads. With measure it
// also measures the FMA peak (about half a second) and the read bandwidth
// from a 256 MiB buffer, eight times the 32 MiB last-level cache of the
// machines this was written on, so that it streams from DRAM.
func ProbeMachine(threads int, measure bool) Machine {
	m := Machine{
		CPU: runtime.GOARCH, Threads: threads, Cores: runtime.NumCPU(),
		Kernels: simd.Kernels(), OS: runtime.GOOS, Arch: runtime.GOARCH, Go: runtime.Version(),
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if measure {
		m.PeakGFlops = simd.MeasurePeakGFlops(threads, 500*time.Millisecond)
		m.DRAMGBps = simd.MeasureReadGBps(256<<20, threads)
	}
	return m
}

// ResultsFile and ReportFile are the names Save writes in its directory.
const (
	ResultsFile = "results.json"
	ReportFile  = "report.html"
)

// Load reads DIR/results.json; a missing file gives (nil, nil).
func Load(dir string) (*Results, error) {
	buf, err := os.ReadFile(filepath.Join(dir, ResultsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(buf, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ResultsFile), err)
	}
	return &r, nil
}

// Save writes r as DIR/results.json, creating DIR, then the report of
// everything in DIR (SaveReport): report.html and its figures in plots/.
func (r *Results) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	buf, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ResultsFile), append(buf, '\n'), 0o644); err != nil {
		return err
	}
	return SaveReport(dir)
}
