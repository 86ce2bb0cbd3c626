// Package kvcache stores the keys and values of past positions for
// autoregressive decoding and attends new queries to them.
//
// # Layout
//
// One Cache serves one attention layer: K and V are each
// [B][Hkv][capacity][stride] with stride = D rounded up so that every row
// starts on a 64-byte boundary. Elements are float32, bfloat16, binary16,
// int8 or int4 (DType); compact elements are widened inside the kernel,
// one tile at a time, never ahead of it. Capacity grows by doubling, so
// appending T positions one by one copies O(T) elements in all.
//
// I8 quantises each stored row of K and of V on its own, symmetrically:
// scale = max|x|/127, code = round(x/scale), and keeps the float32 scale
// of each row beside the codes ([B][Hkv][capacity] for K and for V), so
// every value is within scale/2 of code·scale: 1 byte an element plus 4
// a row (1.03 bytes at D = 128, against 2 for bf16), for a relative error
// in the attention output a few times bf16's (the tests bound both).
// The streaming decode kernels read the codes and apply the scales to the
// scores and to the probabilities, one multiply a key rather than one a
// value; the fused tile path widens a block of codes times their scales
// to float32.
//
// I4 packs two 4-bit codes a byte, asymmetric (x ≈ zero + scale·code,
// code 0…15, within scale/2) in groups that share a float32 scale and
// zero, as KIVI (Liu et al. 2024) does: values per token, each row's
// channels in groups of 64; keys per channel, each channel over groups of
// 64 consecutive rows, since the outliers of keys sit in fixed channels.
// The rows of the key group being filled wait in a float32 residual
// until the group completes. At D = 128 that is 0.625 bytes an element of
// K and of V, scales included (int8: 1.03). On Gaussian inputs, where
// every channel spans its range, a group of 64 steps by about a third of
// a standard deviation, so that each value is off by about 9% rms and the
// attention output by over 10%; the concentrated attention and
// structured keys of trained models fare better. Its
// kernels read the codes in place, the key scales folded into the
// queries and the value scales into the probabilities. Where the CPU
// multiplies small integers and bfloat16 (the avx512bf16 kernels with
// AVX512-VNNI, simd.NativeU4), the queries are rounded to int8 and meet
// the key codes as integers, and the probabilities are rounded to
// bfloat16 and meet the value codes as bfloat16, as llama.cpp's int4 dot
// products and FlashAttention's P·V round them, many products an
// instruction where widening (what the other families do) takes several
// instructions a code; the step stays bound by arithmetic rather than by
// memory. The rounding
// of the queries moves each score by up to 1/254 of the query's largest
// value times the codes; on the long-context model it left decoded
// perplexity where float32 queries had it (results/2026-12-06). An
// evicting cache quantises keys per token too (see int4.go), and its
// keys are widened in every family.
//
// # Rotation
//
// Config.Rotate ("+rot" in a Storage string, ParseStorage) stores R·k and
// R·v for a fixed orthonormal R, a Walsh–Hadamard transform over blocks of
// the largest power of two dividing D after seeded sign flips (QuaRot,
// Ashkboos et al. 2024): queries are rotated alike, which leaves q·k as it
// was, and outputs rotated back. Attention is unchanged up to rounding;
// what changes is where the outliers are. Spread over all channels of
// their block, an outlier channel no longer sets the step of the codes of
// every other channel of its row, which cuts the error of values (and of
// keys quantised per token) with outlier channels; keys quantised per
// channel confine an outlier to its channel already, and a rotation keeps
// the sum of their squared errors.
//
// # Attention
//
// Step attends nq new queries to the cache and to their own keys, with
// the bottom-right causal rule of package attn, then appends the new keys
// and values. The two parts are computed separately and joined with
// attn.Merge: the cached part by a decode kernel for a single new token
// (each K/V row is loaded once for all H/Hkv query heads of its group, and
// the cached positions are split across goroutines whose partial results
// merge by log-sum-exp), or by the fused exact kernel of package flash for
// a chunk; a chunk's own part by the fused kernel with a causal mask, and
// a single position's own key (its value, weighted by its logit) in the
// merge.
//
// A decode step streams the cache, and small groups (Hkv = 8 of H = 32)
// are bound by memory: their kernels read 16-bit and int8 rows in place
// and prefetch the next block as they compute (int8 rows, half the bytes
// of 16-bit ones, can leave the step bound by the kernels' arithmetic on
// a machine with few cores). Bound by memory is not free of arithmetic:
// the kernels alone, in L1, take a good part of the time DRAM takes to
// deliver a block, more for a widened 16-bit one, so the step runs at
// the DRAM rate only as far as the prefetches hide one under the other
// (`attn bench -mode decode` gives the fraction of the streaming probe
// measured in the same run; the README quotes it). The rows
// sit on transparent huge pages where Linux allows. Large groups (more than 15
// query heads a KV head, such as MQA with H = 32) do 2·H/Hkv flops for
// every value read, more than the FMA rate over the DRAM rate of the
// CPUs this package has run on; their query rows fill the panels of the fused
// tile kernel (simd.AttendPanels) instead, as a prefill tile would. That
// kernel reads float32, so other storage is widened for it a block at a
// time: int4 caches, whose widening is slow, and bfloat16 ones where the
// CPU multiplies bfloat16 pairs at twice its float32 rate, stream at
// every group size instead.
//
// # Sliding windows
//
// With Window W > 0 the cache keeps only what a query can still see: the
// last W positions in a ring buffer, plus the first Sinks positions
// forever ("attention sinks", Xiao et al. 2023). The query at position p
// sees key j when j <= p and (j > p-W or j < Sinks). Memory is then fixed
// at Sinks+W rows per head however long the sequence grows.
//
// # Eviction
//
// Config.Evict bounds a windowed cache by a policy (Policy; attn's
// DecodeConfig.Evict and Keep): H2O keeps, besides the Sinks and the last
// Window positions, the Keep positions that have received the most
// attention, summed over steps and over the query heads of a KV head;
// SnapKV holds a prompt whole, then keeps the Keep positions its last
// queries (the observation window) attend to most, max-pooled over
// neighbours. Each KV head keeps its own positions, in rows of any order
// with their positions and scores, and a query sees every held row: the
// window protects positions rather than masks them. Eviction happens
// after a step's queries were attended, so a chunk sees itself whole.
//
// # Errors
//
// Wrong shapes, a full cache (MaxLen reached) and options the cache cannot
// honour return errors wrapping attn.ErrShape, ErrFull or
// attn.ErrUnsupported; nothing panics on user input.
package kvcache
