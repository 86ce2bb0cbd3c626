// Package simdtest runs tests of the packages that use package simd
// under every kernel family the machine has, so that each family's
// kernels are tested where they can run and the tests say which ran.
package simdtest

import (
	"slices"
	"testing"

	"github.com/attnkit/attn/internal/simd"
)

// allFamilies lists every kernel family of package simd: the Go one,
// arm64's, then amd64's least capable first; simd.Families says which
// this machine runs.
var allFamilies = []string{"generic", "neon", "avx2", "avx512", "avx512bf16", "amx"}

// ForEachFamily runs f as a subtest named after each kernel family this
// CPU and build can run (simd.Families), with that family in use, and
// restores the family in use before. It logs the families it covered and
// those the machine lacks, which it cannot cover. With short set (go test
// -short) it runs only the default family and the least capable one
// besides it, which between them cover the assembly and the Go kernels.
//
// ForEachFamily switches the kernels of the whole process: it must not
// be used in parallel tests (t.Parallel) or while other goroutines call
// the kernels.
func ForEachFamily(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	fams := simd.Families()
	run := fams
	if testing.Short() && len(fams) > 2 {
		run = []string{fams[0], fams[len(fams)-1]}
	}
	var missing []string
	for _, name := range allFamilies {
		if !slices.Contains(fams, name) {
			missing = append(missing, name)
		}
	}
	orig := simd.Kernels()
	defer simd.UseKernels(orig)
	for _, name := range run {
		if _, err := simd.UseKernels(name); err != nil {
			t.Fatal(err)
		}
		t.Run(name, f)
	}
	t.Logf("kernel families covered: %v; not on this machine: %v", run, missing)
}
