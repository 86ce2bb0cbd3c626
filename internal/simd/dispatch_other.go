//go:build purego || !(amd64 || arm64)

package simd

// asmImplementations returns nothing: without assembly the generic
// kernels are the only ones.
func asmImplementations() []implementation { return nil }
