package simd

import (
	"fmt"
	"slices"
	"strings"

	"github.com/attnkit/attn"
)

// The kernel families, least capable first. A family is one complete set
// of kernels; the more capable ones replace some kernels of the family
// before them and keep the others (see the package documentation).
// neon (arm64) sits below the amd64 families: the ranks only order the
// families of one architecture, and asking an arm64 machine for an amd64
// family gives neon, the most capable one it has.
var familyNames = []string{"generic", "neon", "avx2", "avx512", "avx512bf16", "amx"}

// familyNeeds says what a family needs of the CPU, for KernelsNote.
var familyNeeds = map[string]string{
	"generic":    "nothing",
	"neon":       "arm64 assembly with Advanced SIMD (ASIMD)",
	"avx2":       "amd64 assembly with AVX2 and FMA",
	"avx512":     "amd64 assembly with AVX-512 F, BW, VL and DQ",
	"avx512bf16": "amd64 assembly with AVX-512 F, BW, VL, DQ and BF16",
	"amx":        "amd64 assembly with AVX-512 F, BW, VL, DQ and BF16, AMX-TILE and AMX-BF16, on Linux",
}

// amxNote, when not empty, says why a CPU with AMX-TILE and AMX-BF16 does
// not get the amx family (the OS refused the tile state); set once by
// asmImplementations.
var amxNote string

// Kernels names the family of kernels in use: "amx" (avx512bf16 and the
// AMX tiles of Intel CPUs for bfloat16 attention, see AttendAMX),
// "avx512bf16" (AVX-512 with the bfloat16 dot products of AVX512-BF16 for
// 16-bit KV caches, and, where the CPU has AVX512-VNNI too, the int4
// decode kernels of NativeU4),
// "avx512" (AVX-512 F, BW, VL and DQ), "avx2" (AVX2 and FMA), "neon"
// (arm64 Advanced SIMD) or "generic" (plain Go, the only family of a
// purego build or another architecture). By default it is the most capable family the CPU and
// the build allow; the environment variable ATTN_KERNELS, read once at
// start-up, chooses a less capable one (see KernelsNote).
func Kernels() string { return active.name }

// Implementation is Kernels, under its older name.
func Implementation() string { return active.name }

// Families lists the kernel families this CPU and build can run, least
// capable first; the last is the default. Every family is correct on
// every input; they differ in speed and in the rounding of their sums.
func Families() []string {
	names := make([]string, len(implementations))
	for i, impl := range implementations {
		names[i] = impl.name
	}
	return names
}

// KernelsNote says why the family in use is not the one ATTN_KERNELS
// asked for: "" when ATTN_KERNELS names a family that is in use, or is
// unset or empty, but on a CPU with AMX whose OS refused this process
// the tile state, where it says so. ATTN_KERNELS takes a family name ("go" and "purego"
// are other names of "generic"), case and surrounding space ignored. A
// family this CPU cannot run gives the most capable one below it; an
// unknown name gives the default.
func KernelsNote() string { return kernelsNote }

// UseKernels makes family the kernel family in use and returns the one
// in use before, so that tests and benchmarks can run the exported
// functions under every family (see Families). It takes the names
// ATTN_KERNELS takes and returns an error wrapping attn.ErrUnsupported,
// changing nothing, for a family this CPU or build cannot run and one
// wrapping attn.ErrInput for an unknown name. UseKernels must not be
// called while any kernel runs, in any goroutine.
func UseKernels(family string) (prev string, err error) {
	prev = active.name
	name, ok := canonicalFamily(family)
	if !ok {
		return prev, fmt.Errorf("simd: %w: kernel family %q is none of %s", attn.ErrInput, family, strings.Join(familyNames, ", "))
	}
	for i := range implementations {
		if implementations[i].name == name {
			active = &implementations[i]
			return prev, nil
		}
	}
	return prev, fmt.Errorf("simd: %w: kernel family %s needs %s, which this CPU or build lacks", attn.ErrUnsupported, name, familyNeeds[name])
}

// canonicalFamily maps a requested family name to one of familyNames.
func canonicalFamily(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case "go", "purego":
		s = "generic"
	}
	return s, slices.Contains(familyNames, s)
}

// chooseKernels returns the implementation ATTN_KERNELS=request selects
// and the note KernelsNote reports.
func chooseKernels(request string) (*implementation, string) {
	best := &implementations[len(implementations)-1]
	if strings.TrimSpace(request) == "" {
		if amxNote != "" {
			return best, fmt.Sprintf("no amx kernels: %s: using %s", amxNote, best.name)
		}
		return best, ""
	}
	name, ok := canonicalFamily(request)
	if !ok {
		return best, fmt.Sprintf("ATTN_KERNELS=%s is none of %s: using %s", request, strings.Join(familyNames, ", "), best.name)
	}
	rank := slices.Index(familyNames, name)
	for i := len(implementations) - 1; i >= 0; i-- {
		impl := &implementations[i]
		if slices.Index(familyNames, impl.name) <= rank {
			if impl.name == name {
				return impl, ""
			}
			why := ""
			if name == "amx" && amxNote != "" {
				why = " (" + amxNote + ")"
			}
			return impl, fmt.Sprintf("ATTN_KERNELS=%s needs %s, which this CPU or build lacks%s: using %s", request, familyNeeds[name], why, impl.name)
		}
	}
	return &implementations[0], ""
}
