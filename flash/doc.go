// Package flash computes exact scaled dot-product attention with a fused,
// tiled kernel in the manner of FlashAttention (Dao et al., 2022, and
// FlashAttention-2, 2023): the N×M matrix of logits is never built.
//
// # Algorithm
//
// The work is split into tiles of query rows. A tile holds up to BlockRows
// rows: a run of consecutive query positions for every query head of one
// GQA group, so each key/value row that is read serves the whole group
// (K and V are never copied to expand heads). For each tile the kernel
// walks the key tiles of BlockK keys that some row can see and keeps, per
// row, the running maximum m, the running sum l and an unnormalised output
// accumulator (online softmax):
//
//	S   = Q_tile · K_tileᵀ · scale
//	m'  = max(m, rowmax S);  P = exp(S - m')
//	l   = l·exp(m - m') + rowsum P;  acc = acc·exp(m - m') + P · V_tile
//
// and finally writes out = acc / l and lse = m + log l. The rescale is
// skipped when the maximum did not grow.
//
// Causal and padding masks are prefixes of the keys, so they become loop
// bounds: key tiles no row of the tile can see are never visited, and only
// the tiles that straddle a row's boundary are masked element by element.
//
// # Layout and kernels
//
// The query rows of a tile run along the vector lanes, in panels of
// simd.Panel (16) rows: the tile keeps Qᵀ, the logits Sᵀ (keys × rows) and
// the accumulator Oᵀ (D × rows), so the maximum and the sum of a row are
// the same lane of every key, and the softmax needs no reduction across
// lanes. Both products are register-blocked matrix products on these
// panels (simd.GemmPanels: 6 rows × 16 lanes of accumulators): Sᵀ = K·Qᵀ
// reads the rows of K as they lie, Oᵀ += Vᵀ·Pᵀ reads the rows of V as
// they lie, so dense K and V are used in place, without a copy. The
// exponentials are 2^((s - m)·log2 e) by a degree-5 polynomial
// (simd.OnlineSoftmax), within about 3e-7 relative; exp(-Inf) is exactly
// 0, and nothing becomes NaN unless an input is.
//
// A tile that no mask cuts, almost every tile, goes to one call of
// simd.AttendPanels, which for each panel computes the logits (taking their
// maximum as it stores them), the softmax step and the product with V
// while the panel's logits are in the L1 cache, and fetches the next key
// tile into L2 meanwhile. A tile that a mask cuts goes panel by panel,
// each panel over the keys its rows see (so the causal diagonal costs
// little more than the triangle under it), with the masks applied before
// the softmax.
//
// # Cost
//
// 4·B·H·N·M·D flops (half that, causal). Dense K and V are read in place;
// a KV source of another kind (ForwardKV) is packed once per call, Kᵀ and
// V tile by tile, into buffers kept between calls (one copy of K and V,
// O(B·Hkv·M·D)). Each worker keeps O(BlockRows·D + 16·BlockK) floats;
// never O(N·M). Tiles are handed to goroutines from a shared counter,
// longest (latest causal) tiles first, so causal work stays balanced.
//
// With its data in cache a tile spends most of its time in the two
// products, near the FMA peak (simd.FMAPeak), and the rest in the
// exponentials; BenchmarkForward and `attn bench` report the whole call
// against the peak measured in the same run.
//
// # bfloat16
//
// ForwardBF16 and AttentionBF16 take bfloat16 queries, keys and values
// (the upper 16 bits of a float32, as uint16) and give float32 outputs
// and log-sum-exps. With the amx kernels (Intel's AMX) the products run on
// the tiles, with the avx512bf16 kernels on VDPBF16PS (both
// simd.AttendAMX; see BF16Path), with bfloat16 operands and float32
// sums, and the softmax in float32, as FlashAttention does on
// GPUs: the logits are exact sums of exact products, and only the
// probabilities are rounded to bfloat16 before their product with V, so
// each output is within 2^-8·Σ_j p_j·|v_j| (plus float32 rounding) of
// exact attention on the same inputs, and the log-sum-exp within float32
// rounding. K and V are packed once a call into blocks of 128 keys (Vᵀ
// for the tiles), the keys past a batch row's KVLen left zero, and each
// query tile of up to 64 rows (BlockRows) is one call over all the
// blocks it sees, a block that a mask cuts under per-row key limits.
// Elsewhere the inputs are widened to float32 and run through the float32
// kernel (the keys and values tile by tile, through the KV interface,
// never as a whole float32 copy), with float32 accuracy.
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput. NaN in the inputs propagates to the rows it reaches, as
// in IEEE arithmetic and PyTorch; the attn command line rejects it before
// calling. A row that sees no key gets out 0 and lse -Inf.
package flash
