// Package quest is Quest (Tang, Zhu, Chen, Zhang, Cai, Kasikci and Han,
// "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference", arXiv 2406.10774) as a decoder: query-aware page selection
// over a KV cache, so that each generated token reads a fraction of the
// cache.
//
// # Prefill and decoding
//
// Quest approximates only in decoding. Forward, the prefill rule, is
// exact attention (package flash), and so is a decoder step that brings
// a sequence more than one position (a prompt chunk): exact causal
// attention over everything the sequence holds, as the paper does. A
// step that brings a sequence one position (a generated token) reads the
// page summaries and attends exactly to the chosen pages only.
//
// # Pages and their summaries
//
// The keys of each sequence and key/value head are cut into pages of
// Page consecutive positions (default 16, the paper's). Each page keeps
// the channel-wise maximum and minimum of its keys, updated as keys are
// appended and stored as bfloat16 rounded outward (the maximum up, the
// minimum down, so that they still bound the keys), so that for any
// query q
//
//	max over the page's keys k of q·k  <=  Σ_c max(q_c·max_c, q_c·min_c)
//
// which is the page's score. It is computed as one dot product of
// length 2·D: [q⁺, q⁻]·[max, min], with q⁺ and q⁻ the positive and
// negative parts of the scaled query, so that scoring every page of the
// cache reads 2·D bfloat16 values per page (a sixteenth of float32 keys
// at Page = 16) with the widening kernel of bf16 decode, whose products
// are exact: the bound holds up to the float32 rounding of the sum.
//
// # The decode rule
//
// The query at position p sees positions [0, p] and attends exactly to:
//
//   - the sinks: positions [0, Sinks) (default 4);
//   - the recent window: the last Recent positions (default 64), and
//     always the whole page p lies in, whose summary is still growing;
//   - the chosen pages: Budget/Page complete pages (Budget in tokens,
//     default 2048) out of those not already covered by the two above,
//     by their scores. A page partly covered by the sinks or the window
//     counts as one page, its covered positions attended once.
//
// When the budget covers every candidate page, the step is exact
// attention (Decoder.Fallback says so).
//
// # Grouped-query attention
//
// The paper's models have one query head per key head. Here each query
// head of a GQA group scores the pages with its own query, and the group
// reads one set of pages, shared by all of its heads, chosen by Group:
//
//   - GroupMax (the default): a page's score is the largest of its
//     heads' scores, the bound for the group as a whole, and the group
//     picks Budget/Page pages by it: the reads stay at the budget.
//   - GroupUnion: each head picks its own Budget/Page best pages, and
//     the group attends to the union of the picks. Every head then
//     attends exactly to its own choice and to its neighbours' (the rows
//     are read once for the group, so they cost no further reads), and a
//     group reads up to H/Hkv times the budget: on long contexts, where
//     the heads' picks rarely meet, a step costs about that many times
//     as much.
//
// Ties between scores go to the earlier page, and a NaN score (a NaN in
// the page's keys) ranks first, so that the NaN reaches the output as
// it would in exact attention. The outcome depends on the inputs only,
// not on the number of workers.
//
// The decoder keeps its keys and values as attn.DecodeConfig's Storage
// says: float32 ("" or "f32"), bfloat16 or binary16 ("bf16", "f16", at
// half the bytes a step reads), 8-bit codes with a scale a row ("i8") or
// 4-bit codes, keys per channel and values per token ("i4"), each
// optionally Hadamard-rotated with "+rot" (see packages kvcache and
// decstore).
// The page summaries are of the keys as stored and read back, so they
// stay exact bounds; with "+rot" they are of the keys rotated back, and
// the queries are scored against them rotated back, since a rotation
// spreads each key over all the channels of its block and so widens
// every channel's range in a page. It has no StreamingLLM
// window of its own (Window must be 0): its sinks and recent window are
// Config's.
package quest
