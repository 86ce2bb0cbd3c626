//go:build unix

package sparse

import (
	"syscall"
	"time"
)

// cpuTime returns the user and system time the process has used: unlike
// the wall clock it does not grow while other programs hold the cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
