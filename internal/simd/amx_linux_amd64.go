//go:build amd64 && linux && !purego

package simd

import (
	"fmt"
	"syscall"
)

// The arch_prctl request and feature number of the AMX tile data
// (arch/x86/include/uapi/asm/prctl.h and the XSAVE feature numbers).
const (
	sysArchPrctl     = 158 // SYS_arch_prctl on amd64
	archReqXcompPerm = 0x1023
	xfeatureTileData = 18
)

// amxPermission asks Linux for the AMX tile data state, which it enables
// per process on request only (since Linux 5.16): before that a tile
// instruction faults. The permission holds for every thread of the
// process, those started later included, so once at start-up is enough.
func amxPermission() error {
	if _, _, e := syscall.RawSyscall(sysArchPrctl, archReqXcompPerm, xfeatureTileData, 0); e != 0 {
		return fmt.Errorf("arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): %w", e)
	}
	return nil
}
