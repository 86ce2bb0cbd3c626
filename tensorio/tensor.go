package tensorio

import (
	"errors"
	"fmt"
	"math"
)

// ErrFormat is wrapped by every error about the contents of a file: bad
// magic, unparsable header, unsupported dtype or layout, inconsistent
// offsets, truncated data. I/O errors from the underlying reader are
// returned wrapped but without ErrFormat, so callers can tell a bad file
// from a failing disk.
var ErrFormat = errors.New("bad format")

// ErrInvalidTensor is wrapped by every error a writer returns because of the
// tensor it was given: nil, a negative dimension, or Data whose length is not
// the product of Shape.
var ErrInvalidTensor = errors.New("invalid tensor")

// Values of Tensor.DType: the element type the file stored. Data is always
// float32; F64 data has been rounded to nearest, F16 and BF16 data widened
// exactly.
const (
	F32  = "f32"
	F64  = "f64"
	F16  = "f16"
	BF16 = "bf16"
)

// Tensor is a dense row-major (C-order) array of float32 with an explicit
// shape. An empty Shape is a 0-d scalar holding one value; a zero dimension
// gives an empty Data.
type Tensor struct {
	Shape []int
	Data  []float32
	// DType is the element type the tensor was read from (F32, F64, F16 or
	// BF16). Writers ignore it: they always write Data as float32 unless
	// told otherwise (WriteNPYFloat64).
	DType string
}

// Len returns the number of elements the shape describes: the product of
// Shape, 1 for a 0-d tensor. It does not check for overflow; tensors from
// the readers never overflow.
func (t *Tensor) Len() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// maxElems bounds the element count of any tensor so that its size in bytes,
// at 8 bytes an element, still fits in an int on every platform.
const maxElems = math.MaxInt / 8

// numElems returns the product of shape, or false if a dimension is negative
// or the product exceeds maxElems. A zero dimension makes the product 0
// whatever the other dimensions are, so the answer does not depend on their
// order; each dimension must still be at most maxElems.
func numElems(shape []int64) (int, bool) {
	zero := false
	for _, d := range shape {
		if d < 0 || d > maxElems {
			return 0, false
		}
		zero = zero || d == 0
	}
	if zero {
		return 0, true
	}
	n := int64(1)
	for _, d := range shape {
		if n > maxElems/d {
			return 0, false
		}
		n *= d
	}
	return int(n), true
}

// check reports whether t can be written: non-nil, valid dimensions, and
// exactly as many values as the shape holds.
func (t *Tensor) check() error {
	if t == nil {
		return fmt.Errorf("%w: nil tensor", ErrInvalidTensor)
	}
	shape := make([]int64, len(t.Shape))
	for i, d := range t.Shape {
		shape[i] = int64(d)
	}
	n, ok := numElems(shape)
	if !ok {
		return fmt.Errorf("%w: shape %v has a negative dimension or too many elements", ErrInvalidTensor, t.Shape)
	}
	if n != len(t.Data) {
		return fmt.Errorf("%w: shape %v holds %d values but Data has %d", ErrInvalidTensor, t.Shape, n, len(t.Data))
	}
	return nil
}
