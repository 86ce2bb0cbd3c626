package hugepage

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// vmFlags returns the VmFlags of the mapping that holds address a, from
// /proc/self/smaps.
func vmFlags(t *testing.T, a uintptr) []string {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				in = uintptr(l) <= a && a < uintptr(h)
				continue
			}
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.Fields(strings.TrimPrefix(line, "VmFlags:"))
		}
	}
	t.Fatalf("no mapping holds %#x", a)
	return nil
}

func TestAdvise(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("kernel without transparent huge pages:", err)
	}
	s := make([]float32, 3*Size/4) // 6 MiB: at least two whole huge pages
	Advise(s)
	for i := range s {
		s[i] = float32(i)
	}
	p := uintptr(unsafe.Pointer(&s[0]))
	inside := (p + Size - 1) &^ (Size - 1)
	if flags := vmFlags(t, inside); !slices.Contains(flags, "hg") {
		t.Errorf("whole huge page inside the buffer: VmFlags %v, want hg (MADV_HUGEPAGE)", flags)
	}
	for i, x := range s {
		if x != float32(i) {
			t.Fatalf("s[%d] = %v after Advise, want %d", i, x, i)
		}
	}
}
