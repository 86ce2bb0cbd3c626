// Package reformer computes the LSH attention of Reformer (Kitaev, Kaiser
// and Levskaya, "Reformer: The Efficient Transformer", ICLR 2020): each
// query attends only to keys that hash near it, because the softmax is
// dominated by its largest logits.
//
// # Algorithm
//
// Per hash round r (Config.Hashes rounds, default 4):
//
//  1. Angular LSH with a random rotation: bucket(x) = argmax([x·R; −x·R])
//     for a D×(b/2) Gaussian matrix R, giving one of b buckets. Bucket
//     counts above 64 are factorised into two even factors f1·f2, each
//     with its own rotation, as trax does.
//  2. The valid keys (padding excluded) are sorted by (bucket, position)
//     and cut into chunks of Config.Bucket keys (default 64).
//  3. Each query is placed where it would sort among the keys by (its
//     bucket, its position) and attends to the keys of the chunk it lands
//     in and of the chunk before: at most 2·Bucket keys. With shared QK
//     (Config.SharedQK: keys are the queries normalised to unit length, as
//     in the paper) a query lands exactly at its own key, so this is the
//     paper's scheme; with separate Q and K it is its natural extension.
//     The first chunk has no previous chunk (no wrap-around).
//  4. Inside a window the causal mask applies by original position
//     (bottom-right aligned as in package attn), and under the self rule
//     (Config.ExcludeSelf, always on with shared QK) a query skips the key
//     at its own position.
//
// A (query, key) pair that lies in the windows of c rounds has log c
// subtracted from its logit in each, as the paper does, so it counts once.
// The rounds' results are then merged by their log-sum-exps (attn.MergeRow:
// weights softmax over the rounds' lse, not a plain average). Together the
// two make the result exactly softmax attention over the union of the
// rounds' windows, and the lse output is the log-sum-exp over that union.
// A query that sees no key but its own under the self rule gets that key
// (output v_self, lse its logit); one that sees no key at all gets 0 and
// lse -Inf, never NaN.
//
// Keys past Options.KVLen are never hashed nor sorted: they enter no
// bucket, no chunk and no normaliser. GQA queries of all heads of a group
// are placed among the same sorted keys of their kv head; K and V are not
// copied per query head.
//
// # Causal mode and later tokens
//
// No key after position t contributes to the output at t: changing V (or
// anything else) at positions after t never reaches it through a value or
// a logit. But the choice of keys does depend on later tokens: every valid
// key, later ones included, is sorted into the chunks, so a later key that
// hashes to the same bucket takes a slot and moves the chunk boundaries,
// which changes which earlier keys share a query's window. Outputs up to t
// are therefore a function of all keys K (their hashes), and of values only
// up to t. The Decoder has no such dependence: a step sees only the cache.
//
// # Randomness
//
// Forward draws, on every call, from one generator
// rand.NewPCG(Config.Seed, 0x7265666f726d6572): for each round, for each
// factor f of the bucket count, a D×(f/2) matrix of standard normal
// numbers, in row-major order. The same rotations serve every batch row
// and head. They depend only on the seed, Hashes, D and the bucket count
// (ceil(M/Bucket) by default), so equal calls give identical outputs,
// whatever Options.Workers is. NewDecoder draws the same way once.
//
// # Exact fallback
//
// When N or M is below Config.Min (default 2048 without the causal mask,
// 4096 with it, about where 4 rounds of 64-key chunks overtake the exact
// kernel on 2 AVX2 cores), Forward computes exact attention with the
// fused kernel of package flash instead; under the self rule it computes
// exact attention minus each query's own key (one round, one chunk). A
// negative Min never falls back. Forward with N = 1 against a long cache
// thus falls back too: use the Decoder to decode with LSH.
//
// # Decoding
//
// A Decoder keeps one sequence's keys and values with each key's bucket in
// every round, filed per bucket. Step attends the newest token's query to
// the union of: per round, the 2·Bucket most recent keys of its bucket,
// and the Window most recent keys, each key once, under the self rule when
// set. Its cost, O(H·(Hashes·2·Bucket + Window)·D), does not depend on the
// cache length; Append costs O(Hkv·Hashes·D·Σf/2) per token.
//
// # Cost
//
// Hashing costs (B·H·N + B·Hkv·M)·D·Hashes·Σf/2 multiply-adds (Σf/2 is 32
// at 64 buckets, and grows as the square root of larger counts); sorting
// is a counting sort, O(M + N·log Bucket) per round and head; attention
// costs about 4·Hashes·B·H·N·2·Bucket·D flops, linear in the length, plus
// gathering each key once per round. Extra memory is O(Hashes·(N·H/Hkv +
// M)) indices per (batch row, kv head) being worked on, per worker
// O(128·(D + 2·Bucket)) floats, and with shared QK a normalised copy of Q. Work is shared out by (batch row, kv head),
// or by runs of chunks, one round at a time, when there are too few heads
// for the workers.
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput, out-of-range Config fields attn.ErrInput, and shared QK
// with N ≠ M or H ≠ Hkv (or lengths beyond 2^31-1) attn.ErrUnsupported. A
// cancelled context stops the work and returns its error. NaN in the
// inputs propagates to the rows it reaches, as in package flash; it never
// causes a panic.
package reformer
