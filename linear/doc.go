// Package linear computes linear attention (Katharopoulos et al., 2020,
// "Transformers are RNNs: Fast Autoregressive Transformers with Linear
// Attention"): with a feature map φ, the weight of key j for query i is
// φ(q_i)·φ(k_j) instead of exp(scale·q_i·k_j), so
//
//	out_i = φ(q_i)ᵀ·Σ_j φ(k_j) v_jᵀ  /  φ(q_i)ᵀ·Σ_j φ(k_j)
//
// and the F×D matrix Σ_j φ(k_j) v_jᵀ, computed once, serves every query:
// O(n) instead of O(n²). The default map is elu(x)+1 (ELU); any other can
// be plugged in through FeatureMap, which is how package performer runs
// FAVOR+ on the same engine.
//
// Linear attention is a function of its own, not an approximation of
// softmax attention: models are trained with it, so it never falls back to
// exact attention. Options.Scale is passed to the feature map; elu+1
// ignores it, as in the paper (a trained model's scale lives in its
// weights).
//
// # Causal attention in chunks
//
// Causal masks are bottom-right aligned as everywhere in this module: query
// i sees keys j ≤ M-N+i. The pass walks the queries in chunks of C
// positions (Config.Chunk, default 64). A chunk's rows see every key
// before the first row's end through the carried state S = Σ φ(k_j) v_jᵀ
// (and z = Σ φ(k_j)), one matrix product; the at most C-1 keys between
// the first and the last row's end form a dense C×C block of weights
// φ(Q)·φ(K)ᵀ, masked and multiplied by V; then the chunk's keys are
// folded into S with one more product. Every step is a matrix product
// (simd.Gemm), so the causal pass runs at matrix-multiply speed instead of
// one token at a time (fast-transformers #83 reports its token-by-token
// causal kernel slower than softmax attention at n = 1024; this one is
// about 3 times faster there, see Cost). Key padding (Options.KVLen)
// bounds the keys, so padded keys enter neither the numerator nor the
// normaliser: removing them after the feature map, not by zeroing keys or
// values before it (performer-pytorch #89, fla #1263, where φ of a zeroed
// key still adds to the normaliser). Grouped-query heads share their kv head's state; K and V
// are never copied per query head.
//
// State is the same computation one token at a time, for decoding: O(F·D)
// per token and head whatever the length, equal to the chunked pass up to
// float32 rounding.
//
// # Log-scaled feature maps
//
// A map may return its features as exp(ℓ_r)·ψ_r with ψ bounded (see
// FeatureMap). The state then carries a stabiliser m, the running maximum
// of the keys' ℓ over the keys folded in so far, and rescales itself when m
// grows, as online softmax does; in the dense block each query row uses
// the running maximum over exactly the keys it sees. No statistic is ever
// taken over keys a query cannot see, so causal outputs up to position t
// are bit-for-bit independent of everything after t (the bug of
// performer-pytorch #82, where a maximum over the whole sequence leaks the
// future), and no exponential overflows, whatever the inputs' scale.
//
// # lse
//
// lse is log(φ(q_i)·Σ_j φ(k_j)), the log of the row's normaliser (with a
// log-scaled map, including the scales). Because out is a ratio of sums
// over keys and lse the log of its denominator, attn.Merge of two passes
// over disjoint key sets gives exactly the pass over their union, as for
// softmax attention. A row that sees no key, or whose normaliser is not a
// positive float32 (only possible with maps that are not positive, or when
// it underflows), gets out 0 and lse -Inf.
//
// # Cost
//
// Per query head and position, with F features (F = D for elu+1) and chunk
// C: about 4·F·D flops for the state (applying it and folding keys in) and
// 2·C·(F+D) for the dense block when causal, plus the feature map. Extra
// memory is O(workers·(F·D + G·C·(F+D))) for G query heads per kv head.
// Work is split over (batch, kv head) pairs, and over the heads of a group
// when there are fewer pairs than workers.
//
// On the reference machine (2 cores, AMD EPYC Zen 3, AVX2; B=1, H=8, D=64)
// causal elu+1 attention overtakes exact causal attention (package flash)
// at about n = 256 (BenchmarkCausal; exact time / linear time, best of
// repeated runs):
//
//	n        128    256    512    1024   2048   4096
//	ratio    0.7    1.0    1.7    3.2    5.7    15
//
// Exact causal attention grows as n², linear attention as n: about 0.9 µs
// of one core per token and head at every length above a few chunks.
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput; a cancelled context stops the pass and returns its error.
package linear
