// Package magicpig is MagicPIG (Chen, Sadhukhan, Ye, Zhou, Zhang, Nolte,
// Tian, Douze, Bottou, Jia and Chen, "MagicPIG: LSH Sampling for
// Efficient LLM Generation", arXiv 2410.16179) as a decoder: each
// generated token samples cached keys by locality-sensitive hashing and
// estimates the softmax from them by importance sampling, so that a step
// reads a fraction of the cache.
//
// # Prefill and decoding
//
// MagicPIG approximates only in decoding. Forward, the prefill rule, is
// exact attention (package flash), and so is a decoder step that brings
// a sequence more than one position (a prompt chunk): exact causal
// attention over everything the sequence holds, as the paper does. A
// step that brings a sequence one position (a generated token) attends
// exactly to the sinks and the recent window and estimates the rest from
// the keys its query collides with.
//
// # Hash tables
//
// L tables (Config.Tables, default 150) of K random hyperplanes each
// (Config.Bits, default 10; the paper's (K, L) = (10, 150)) are drawn
// from the seed, Gaussian and shared by every sequence and head. A
// vector's bucket in table l is the K signs of its products with that
// table's hyperplanes (SimHash). Keys are hashed as they are appended
// (by Decoder.Append or a step), and each table lists, per bucket, the
// positions of its keys in increasing order; the step's query is hashed
// with the same hyperplanes, scaled (a negative Scale flips it).
//
// # The estimator
//
// The query at position p sees positions [0, p]. The sinks [0, Sinks)
// (default 4) and the window, the last Window positions (default 64),
// are attended exactly. Each older key k is sampled when it falls in the
// query's bucket in at least T of the L tables (Config.Threshold, default
// 2, the paper's). For Gaussian hyperplanes one table's K signs all agree
// with probability (1 - θ/π)^K, θ the angle between the scaled query q
// and k, independently across tables, so k is sampled with probability
//
//	u(k) = P(Binomial(L, (1 - θ/π)^K) >= T)
//
// computed in closed form (the binomial head or tail, whichever does not
// cancel; for cosines in [-0.6, 0.9] interpolated in a table of that
// function, within 10⁻⁶ of log u). The sampled keys S enter the softmax
// with their importance weights 1/u:
//
//	Z = Σ_window e^{q·k} + Σ_{k∈S} e^{q·k}/u(k)
//	o = (Σ_window e^{q·k} v + Σ_{k∈S} e^{q·k}/u(k) v) / Z
//
// that is, softmax over the window and S with log u(k) subtracted from
// the sampled logits: the exact part for the whole GQA group at once,
// the samples head by head (an online softmax, each sample's value used
// while its key, stored next to it, is in cache), the two merged by
// their log-sum-exp. Both sums over S are unbiased estimates
// (Horvitz–Thompson, over the draw of the hyperplanes) of the sums over
// all the older keys; their ratio is the paper's self-normalised
// estimate, consistent as L grows. The lse returned is log Z. The paper
// adds 10⁻⁴ to u against rare keys' large weights; this package keeps
// the exact 1/u, so that the sums stay unbiased. The paper also centres
// the keys by their mean over the prompt before hashing; this package
// hashes them as they are, so that a key's buckets never change once it
// is appended.
//
// With Bits 0 every key falls in the one bucket of every table, u = 1,
// and the estimate is exact attention; so it is when the sinks and the
// window cover the query's positions (Decoder.Fallback says both).
//
// The decoder keeps its keys and values as float32, as bfloat16 or
// binary16 at half the bytes a sample reads, or as 8-bit codes (a scale a
// row) or 4-bit codes quantised per token (attn.DecodeConfig's Storage
// "", "f32", "bf16", "f16", "i8" or "i4", optionally Hadamard-rotated
// with "+rot"; see package decstore): keys are hashed as read back,
// rotated where they are. A step's time goes mostly to reading its
// samples' rows at scattered positions, so it follows the bytes of a row.
// Int8 rows are the fewest bytes that keep float32's retrieval on the
// long-context needle test; int4 rows, whose keys share a scale and zero
// across a row's channels, lose much of it (results/long in the
// repository has both). It has no StreamingLLM window of its own (Window
// must be 0): its sinks and window are Config's. The outcome depends on
// the seed and the inputs only, not on the number of workers.
package magicpig
