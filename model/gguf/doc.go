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
// ReadTensor returns float32 whatever the stored type: a quantised tensor
// is dequantised once, as it is read, so in memory it takes 4 bytes per
// weight however few it takes in the file (about 7 times as many for the
// 4-bit types). The types read are those llama-family models are
// published in:
//
//   - F32, F16 (IEEE binary16, widened exactly) and BF16 (the upper 16
//     bits of a float32);
//   - Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: blocks of 32 values with a
//     binary16 scale d (and, for the _1 types, a binary16 min m), the
//     value d·(q−8), d·q+m, d·(q−16), d·q+m or d·q of a 4-, 5- or 8-bit
//     code q;
//   - Q2_K, Q3_K, Q4_K, Q5_K and Q6_K: super-blocks of 256 values with a
//     binary16 scale d (and min scale dmin) and sub-blocks of 16 or 32
//     values with their own 4-, 6- or 8-bit scales (and mins), the value
//     d·sc·q − dmin·m;
//   - IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256 with 6-bit
//     sub-block scales): 4-bit indices into ggml's 16 non-uniform levels.
//
// Each decodes bit for bit as ggml's dequantize_row_* does: every product
// in these formulas is exact in float32, so the only rounding, the
// addition of a min, is ggml's too. A tensor's rows (its first dimension)
// must be whole blocks. Other ggml types (the IQ1, IQ2 and IQ3 families,
// TQ1_0, TQ2_0, MXFP4, …) are described and their extents checked, but
// reading their data returns an error wrapping attn.ErrUnsupported.
//
// Write encodes float32 data as F32, F16, BF16 or Q8_0 (F16 and BF16 round
// to nearest even; Q8_0 rounds as llama.cpp's reference quantiser does,
// d = max|x|/127 stored as binary16, q = round(x/d)), and writes the
// bytes of any type ggml defines given as Tensor.Raw.
//
// # Errors
//
// Read checks every count and length against the bytes the file holds
// before allocating, and refuses tensors whose bytes overlap, so a
// malformed or hostile file costs memory in proportion to its size:
// reading every tensor allocates at most 13 times it (Q2_K's 4·256/84
// bytes of float32 per byte is the largest expansion). Errors about a
// malformed file wrap ErrFormat and quote at most the start of a key or
// name; nothing panics (the package is fuzzed). Unknown ggml types, unknown
// metadata value types and other versions wrap attn.ErrUnsupported or
// ErrFormat as appropriate.
package gguf
