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
// # Cost
//
// 4·B·H·N·M·D flops (half that, causal). Every key and value tile is
// packed once per call (Kᵀ, and V padded to whole vector panels) and then
// read by every query tile that needs it, so the extra memory is one
// packed copy of K and V, O(B·Hkv·M·D), plus O(BlockRows·(D+BlockK)) per
// worker; never O(N·M). Tiles are handed to goroutines from a shared
// counter, longest (latest causal) tiles first, so causal work stays
// balanced.
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput. NaN in the inputs propagates to the rows it reaches, as
// in IEEE arithmetic and PyTorch; the attn command line rejects it before
// calling. A row that sees no key gets out 0 and lse -Inf.
package flash
