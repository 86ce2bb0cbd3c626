package hugepage

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Advise asks Linux to back the whole 2 MiB pages inside s with huge
// pages. It is advice: pages already in memory stay as they are until the
// kernel collapses them, and an error (a kernel without transparent huge
// pages) changes nothing, so none is returned. Call it on a fresh
// allocation before writing to it. Only pages wholly inside s are
// advised, and the advice changes no contents.
func Advise[T any](s []T) {
	n := uintptr(len(s)) * unsafe.Sizeof(*new(T))
	if n < MinBytes {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	lo := (p + Size - 1) &^ (Size - 1)
	hi := (p + n) &^ (Size - 1)
	if hi <= lo {
		return
	}
	// The pages lie inside s, which keeps them alive for the call.
	_ = unix.Madvise(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(s)), lo-p)), hi-lo), unix.MADV_HUGEPAGE)
}
