// Package tensorio reads and writes tensors as NumPy .npy and safetensors
// files, so that inputs can come from, and outputs be checked by, any other
// framework. A Tensor is a dense row-major []float32 with a shape; whatever
// the file stored is converted to float32 and the stored type is kept in
// Tensor.DType.
//
// # NumPy .npy
//
// ReadNPY reads format versions 1.0, 2.0 and 3.0 with dtype '<f4', '<f8'
// (rounded to float32) or '<f2' (widened exactly), in C order, of any shape
// including 0-d and shapes with zero dimensions. Big-endian data, integer
// and structured dtypes and fortran_order True are rejected with an error
// naming what was found. The header, a Python dict literal, is parsed by a
// small parser of Python literals: key order and spacing do not matter, but
// the keys must be exactly 'descr', 'fortran_order' and 'shape', as numpy
// itself requires.
//
// WriteNPY writes '<f4' (WriteNPYFloat64 '<f8') byte for byte as numpy.save
// of NumPy 1.23 or later writes the same array: format 1.0, or 2.0 when the
// header needs more than 65535 bytes, the header padded with spaces and a
// '\n' so that the data starts at a multiple of 64 bytes.
//
// ReadNPY stops at the end of the array's data and leaves the rest of the
// stream unread; ReadNPYFile rejects a file with bytes after the array.
//
// # safetensors
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON mapping each tensor's name to its dtype, shape and data_offsets
// (relative to the end of the header) plus optional "__metadata__" strings,
// then the data. ReadSafetensors reads F32, F64, F16 and BF16 tensors and
// returns them with the metadata; it enforces the reference
// implementation's rules (header at most 100,000,000 bytes, offsets that
// agree with the shapes and tile the data section exactly) and rejects
// duplicate names and shapes of more than 64 dimensions (numpy's limit;
// the format has none). The header is walked in place once it is known to
// be valid JSON, and an array is counted before its elements are decoded,
// so reading a header costs time linear in its length and memory a small
// multiple of it. WriteSafetensors writes float32 tensors as the reference
// implementation does.
//
// # Errors and resources
//
// No input makes a reader panic or allocate more than the input's size
// justifies: a header that declares 2^40 elements gets an error, not an
// attempt to allocate them (fuzz tests check both). Every error about file
// contents wraps ErrFormat and quotes at most the start of a name or value
// from the file; a file that ends early also wraps
// io.ErrUnexpectedEOF. Errors from the underlying reader or writer are
// wrapped as they are. Writers refuse a tensor whose Data does not match
// its Shape with an error wrapping ErrInvalidTensor.
//
// Formats: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
// and https://github.com/huggingface/safetensors.
package tensorio
