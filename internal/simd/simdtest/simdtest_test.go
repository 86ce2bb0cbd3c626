package simdtest

import (
	"slices"
	"testing"

	"github.com/attnkit/attn/internal/simd"
)

func TestForEachFamily(t *testing.T) {
	orig := simd.Kernels()
	var ran []string
	ForEachFamily(t, func(t *testing.T) { ran = append(ran, simd.Kernels()) })
	if simd.Kernels() != orig {
		t.Errorf("family in use %s after ForEachFamily, was %s", simd.Kernels(), orig)
	}
	want := simd.Families()
	if testing.Short() && len(want) > 2 {
		want = []string{want[0], want[len(want)-1]}
	}
	if !slices.Equal(ran, want) {
		t.Errorf("ran under %v, want %v", ran, want)
	}
	for _, f := range simd.Families() {
		if !slices.Contains(allFamilies, f) {
			t.Errorf("family %s missing from allFamilies", f)
		}
	}
}
