//go:build amd64 && !purego

package simd

import (
	"slices"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestFamiliesFollowCPU checks that every family the CPU can run is
// offered, so that the tests of a machine with AVX-512 run its kernels
// rather than skip them.
func TestFamiliesFollowCPU(t *testing.T) {
	x := cpu.X86
	avx2 := x.HasAVX && x.HasAVX2 && x.HasFMA
	avx512 := avx2 && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL && x.HasAVX512DQ && x.HasBMI2
	bf16 := avx512 && x.HasAVX512BF16
	// amx needs the OS's permission too: a CPU with AMX whose OS refused
	// it says so in amxNote.
	amx := bf16 && x.HasAMXTile && x.HasAMXBF16 && amxNote == ""
	want := map[string]bool{"avx2": avx2, "avx512": avx512, "avx512bf16": bf16, "amx": amx}
	got := Families()
	for f, ok := range want {
		if slices.Contains(got, f) != ok {
			t.Errorf("family %s offered %v, CPU allows it %v (families %v)", f, !ok, ok, got)
		}
	}
	if amxNote != "" {
		t.Logf("no amx family: %s", amxNote)
	}
}
