package kvcache

import (
	"testing"
	"unsafe"
)

// TestAligned checks that every element type's storage starts on a
// 64-byte boundary and has the length asked for, small and large (the
// latter advised onto huge pages).
func TestAligned(t *testing.T) {
	for _, n := range []int{1, 77, 3 << 20} {
		check := func(name string, p unsafe.Pointer, got int) {
			if uintptr(p)%64 != 0 || got != n {
				t.Errorf("%s n=%d: address %% 64 = %d, length %d", name, n, uintptr(p)%64, got)
			}
		}
		f, h, q := aligned[float32](n), aligned[uint16](n), aligned[int8](n)
		check("float32", unsafe.Pointer(&f[0]), len(f))
		check("uint16", unsafe.Pointer(&h[0]), len(h))
		check("int8", unsafe.Pointer(&q[0]), len(q))
	}
}
