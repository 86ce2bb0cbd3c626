//go:build !unix

package hyper

// cpuSeconds is not measured here; the CPU-time metrics read 0.
func cpuSeconds() float64 { return 0 }
