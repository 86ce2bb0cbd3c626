// Package attn holds the contracts every attention mechanism in this module
// shares: the tensor shapes and their validation, the mask rules, the
// options, the Mechanism interface and Merge for (out, lse) partials.
//
// # Layout
//
// Tensors are dense row-major []float32. Queries are Q[B][H][N][D], keys and
// values K, V[B][Hkv][M][D], the output O[B][H][N][D] and the natural-log
// normaliser L[B][H][N]. Query head h reads key/value head h/(H/Hkv): Hkv == H
// is multi-head, Hkv == 1 multi-query, anything between grouped-query
// attention. K and V are never copied to expand heads.
//
// # Masks
//
// Causal masks are bottom-right aligned, as in FlashAttention 2: when N < M,
// query i sits at absolute position M-N+i and sees keys j <= M-N+i, so
// prefill against a cache and one-token decoding follow the same rule. Key
// padding is a valid length per batch row (Options.KVLen); keys at or past
// it contribute nothing, not even to the normaliser. The two compose by
// intersection. A query row that sees no key gets output 0 and lse -Inf.
//
// # The (out, lse) contract
//
// L[i] = log Σ_j exp(s_ij) over the keys a mechanism used, with s the scaled
// logits. Two results over disjoint key sets combine exactly with Merge:
//
//	L = logaddexp(L1, L2);  O = exp(L1-L)·O1 + exp(L2-L)·O2
//
// Errors on user input are returned, never panicked; they wrap ErrShape or
// ErrInput so callers can tell bad arguments from other failures.
package attn
