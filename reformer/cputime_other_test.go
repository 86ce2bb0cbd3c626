//go:build !unix

package reformer

// cpuSeconds is not measured here: the benchmarks report 0 cpu-s/op.
func cpuSeconds() float64 { return 0 }
