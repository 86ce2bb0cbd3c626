package simd

// The kernels in use; the assembly files replace them at init where the
// CPU allows.
var (
	gemm   = gemmGeneric
	expSum = expSumGeneric
	maxOf  = maxGeneric
	scale  = scaleGeneric
)
