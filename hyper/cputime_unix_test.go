//go:build unix

package hyper

import "syscall"

// cpuSeconds returns the user and system CPU time of the process: on a
// machine shared with other work it measures what a call costs better than
// the wall clock does.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}
