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
// causal kernel slower than softmax attention at n = 1024; see Cost).
// Key padding (Options.KVLen)
// bounds the keys, so padded keys enter neither the numerator nor the
// normaliser: removing them after the feature map, not by zeroing keys or
// values before it (performer-pytorch #89, fla #1263, where φ of a zeroed
// key still adds to the normaliser). Grouped-query heads share their kv head's state; K and V
// are never copied per query head.
//
// State is the same computation one token at a time, for decoding: O(F·D)
// per token and head whatever the length, equal to the chunked pass up to
// float32 rounding. Decoder (Attention.NewDecoder) is the State as an
// attn.Decoder: a step of n positions (a prompt) runs the chunked pass
// from the carried sums, and sequences of a batch may have different
// lengths.
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
// # Gradients
//
// Backward (attn.Differentiable) computes the gradients through any map
// that implements DifferentiableMap (ELU and package performer's random
// features do): the query pass carries prefix sums over the keys as
// Forward does, the key pass suffix sums over the queries, each with a
// dense block per chunk under the causal mask, and log-scaled maps use
// Forward's stabilisers. See Attention.Backward.
//
// # NaN and infinities
//
// As in PyTorch, a NaN or an infinity in an input propagates: a row whose
// query holds one, or that sees a key whose k or v does, is NaN in out and
// in lse. Rows that do not see the key (earlier causal positions, other
// heads, other batch rows) are unaffected, and padding keys are never
// read. A non-finite value is kept out of the products of the rows that
// do not see it, where its weight is 0 and 0·Inf would be NaN.
//
// # Cost
//
// Per query head and position, with F features (F = D for elu+1) and chunk
// C: about 4·F·D flops for the state (applying it and folding keys in) and
// 2·C·(F+D) for the dense block when causal, plus the feature map. Extra
// memory is O(workers·(F·D + G·C·(F+D))) for G query heads per kv head;
// one worker's scratch, like a State, is bounded by MaxStateBytes.
// Work is split over (batch, kv head) pairs, and over the heads of a group
// when there are fewer pairs than workers; each head's rows are
// multiplied on their own, so the split, and the worker count, change no
// bit of the result.
//
// Exact causal attention grows as n², linear attention as n, so linear
// attention overtakes exact causal attention (package flash) from a few
// hundred positions on; BenchmarkCausal measures the ratio.
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput (sizes past MaxStateBytes are attn.ErrShape); a cancelled
// context stops the pass and returns its error.
package linear
