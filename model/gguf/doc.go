// Package gguf reads and writes GGUF files, the single-file model format of
// llama.cpp: a header of typed key/value metadata and tensor descriptions,
// then the tensors' data, each aligned.
//
// # Layout
//
// All numbers are little-endian. The file starts with the magic "GGUF", a
// uint32 version (3; version 2 has the same layout and is read too), the
// uint64 tensor and metadata counts, the metadata (a string key, a uint32
// value type and the value; strings are a uint64 length and UTF-8 bytes;
// arrays a uint32 element type, a uint64 count and the elements), then one
// description per tensor (name, uint32 dimension count, uint64 dimensions
// innermost first, uint32 ggml type, uint64 offset into the data section).
// The data section starts at the next multiple of general.alignment (32 by
// default) after the header; every tensor's offset is a multiple of it.
//
// # Tensor types
//
// ReadTensor returns float32 whatever the stored type, for F32, F16 (IEEE
// binary16, widened exactly), BF16 (the upper 16 bits of a float32) and
// Q8_0 (blocks of 32 values: a binary16 scale d and 32 int8 q, value
// d·q). Other ggml types (the k-quants, Q4_0, …) are described by the
// reader, so a file holding them can be listed, but reading their data
// returns an error wrapping attn.ErrUnsupported. Write encodes float32
// data to any of the four; Q8_0 rounds as llama.cpp's reference
// quantiser does (d = max|x|/127 stored as binary16, q = round(x/d)).
//
// # Errors
//
// Read checks every count and length against the bytes the file holds
// before allocating, so a malformed or truncated file of any size costs
// memory in proportion to its size and returns an error wrapping
// ErrFormat; it never panics (the package is fuzzed). Unknown ggml types,
// unknown metadata value types and other versions wrap
// attn.ErrUnsupported or ErrFormat as appropriate.
package gguf
