//go:build arm64 && !purego

package simd

import (
	"slices"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestFamiliesFollowCPU checks that an arm64 CPU with Advanced SIMD gets
// the neon family, so that its tests run the assembly rather than only
// the Go kernels, and that ATTN_KERNELS can still ask for those.
func TestFamiliesFollowCPU(t *testing.T) {
	want := []string{"generic"}
	if cpu.ARM64.HasASIMD {
		want = append(want, "neon")
	}
	if got := Families(); !slices.Equal(got, want) {
		t.Errorf("families %v, want %v", got, want)
	}
	for _, req := range []string{"generic", "go", "neon"} {
		impl, note := chooseKernels(req)
		if want := atMost(Families(), req); impl.name != want || note != "" {
			t.Errorf("ATTN_KERNELS=%s: %s, note %q; want %s", req, impl.name, note, want)
		}
	}
}
