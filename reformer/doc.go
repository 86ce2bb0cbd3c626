// Package reformer computes the LSH attention of Reformer (Kitaev, Kaiser
// and Levskaya, "Reformer: The Efficient Transformer", ICLR 2020): each
// query attends only to keys that hash near it, because the softmax is
// dominated by its largest logits.
//
// # Algorithm
//
// Without the causal mask, per hash round r (Config.Hashes rounds,
// default 4):
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
//  4. Under the self rule (Config.ExcludeSelf, always on with shared QK)
//     a query skips the key at its own position.
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
// # The causal rule
//
// Sorting every key into chunks makes the output at t depend on later
// keys: a later key that hashes to the same bucket takes a slot and moves
// the chunk boundaries, and the default bucket count ceil(M/Bucket) moves
// with the length. Under the causal mask Forward therefore follows the
// causal rule instead, which the decoders follow too. A query at position
// p that may see the keys [0, vis) (vis = p+1, or less under KVLen)
// attends to the union of:
//
//   - its window: the Config.Window latest of those keys (default Bucket),
//     p itself included;
//   - per round, the 2·Bucket latest of those keys hashed to the query's
//     bucket, out of Config.Buckets buckets (default DefaultCausalBuckets,
//     whatever the length);
//
// each key once, exact softmax attention over that set (lse its
// log-sum-exp), under the self rule when set. A key's buckets depend on
// that key alone (each vector is hashed by a one-row product, so its
// rounding does not depend on the rows hashed with it) and the set holds
// no key after p, so the output at p is a function of the inputs at
// positions <= p only: changing or adding later tokens, or evaluating a
// sequence in a longer pass, leaves it bit for bit as it was. Each row is
// computed on its own, through one kernel, in one order of its keys;
// decoding a sequence in any chunks therefore gives what causal Forward
// gives, bit for bit. A step costs O(H·(Hashes·2·Bucket + Window)·D)
// whatever the length.
//
// Config.NonStrictCausal brings back the sorted chunks under the causal
// mask (the causal mask is then applied inside the windows). No key after
// t reaches the output at t through a value or a logit, but it is not
// prefix-safe: which earlier keys a query sees depends on later keys and
// on M.
//
// # Randomness
//
// Forward draws, on every call, from one generator
// rand.NewPCG(Config.Seed, 0x7265666f726d6572): for each round, for each
// factor f of the bucket count, a D×(f/2) matrix of standard normal
// numbers, in row-major order. The same rotations serve every batch row
// and head. They depend only on the seed, Hashes, D and the bucket count
// (ceil(M/Bucket) by default without the causal mask, DefaultCausalBuckets
// with it), so equal calls give identical outputs, whatever
// Options.Workers is. The decoders draw the same way once, as causal
// Forward does.
//
// # Exact fallback
//
// When N or M is below Config.Min (default DefaultMin = 2048 without the
// causal mask, about where 4 rounds of 64-key chunks overtake the exact
// kernel, and DefaultMinCausal = 4096 with it, where exact attention does
// half the work), Forward computes exact
// attention with the fused kernel of package flash instead; under the
// self rule it computes exact attention minus each query's own key (one
// round, one chunk). A negative Min never falls back. LSH.Fallback says
// whether and why a call falls back. Forward with N = 1 against a long
// cache thus falls back too: use a decoder to decode with LSH. The
// decoders never fall back, so they give causal Forward's results for
// lengths at or above Min (or with a negative Min); below it Forward is
// exact and they are not.
//
// # Decoding
//
// LSH.NewDecoder returns the attn.Decoder of a batch of sequences
// (BatchDecoder: ragged lengths, prompts in chunks); NewDecoder returns
// the older single-sequence Decoder. Both keep each sequence's keys and
// values with every key filed under its bucket in every round, and
// attend each new position by the causal rule. Appending costs
// O(Hkv·Hashes·D·Σf/2) per token for the hashing.
//
// The Decoder stores float32. The BatchDecoder stores what
// DecodeConfig.Storage says: "" or "f32" (bit for bit causal Forward),
// "bf16" or "f16" (rounded to nearest, half the bytes), or "i4": 4-bit
// codes quantised per token, each row's channels in groups of 64 with a
// float32 scale and zero a group (see package kvcache), read in place by
// kernels that dequantise in registers. Each may take the suffix "+rot": keys and values are stored
// rotated by a fixed Hadamard rotation with sign flips (which spreads
// outlier channels over their block before they are quantised), queries
// are rotated alike and outputs rotated back; the lse is unchanged. A key
// is hashed as it is read back from storage (rounded or quantised, and
// rotated), and a query as it is attended (rotated), so that a step is
// the causal rule applied to the stored rows: outside f32 the buckets,
// and so the keys chosen, may differ from causal Forward's on the
// original inputs. With shared QK a key is normalised, then rotated.
//
// # Cost
//
// Without the causal mask, hashing costs (B·H·N + B·Hkv·M)·D·Hashes·Σf/2
// multiply-adds (Σf/2 is 32 at 64 buckets, and grows as the square root
// of larger counts); sorting is a counting sort, O(M + N·log Bucket) per
// round and head; attention costs about 4·Hashes·B·H·N·2·Bucket·D flops,
// linear in the length, plus gathering each key once per round. Extra
// memory is O(Hashes·(N·H/Hkv + M)) indices per (batch row, kv head)
// being worked on, per worker O(128·(D + 2·Bucket)) floats, and with
// shared QK a normalised copy of Q. Work is shared out by (batch row, kv
// head), or by runs of chunks, one round at a time, when there are too
// few heads for the workers.
//
// Under the causal rule hashing costs the same; each query row then
// gathers at most Hashes·2·Bucket + Window keys and attends to them one
// row at a time, about 4·(Hashes·2·Bucket + Window)·D flops a row, with
// no matrix products shared between rows: the price of every row being
// independent of the others. Extra memory is 2·Hashes·M indices per
// (batch row, kv head) and per worker O(M) stamps.
//
// # Backward
//
// LSH.Backward (attn.Differentiable) differentiates what Forward
// computes with the hash choices held fixed: every form of Forward is
// softmax attention of each query over its chosen keys, each key once
// (the log c correction makes the lse merge of the rounds exactly the
// union's softmax, not a sum weighted by how many rounds saw a key), so
// the gradients are those of that attention: through the sorted chunks
// round by round, or under the causal rule through each query's window
// (package flash's Backward with a band pattern) and then its bucket's
// band round by round, each pair where the rule first takes it, in tiles
// with matrix products. With shared QK they reach
// q through the keys' normalisation too. Below Min they are exact
// attention's. They do not depend on Options.Workers.
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput, out-of-range Config fields attn.ErrInput, and shared QK
// with N ≠ M or H ≠ Hkv, lengths beyond 2^31-1, or rotations and decoder
// tables beyond MaxRotationFloats and MaxDecodeLists (checked before
// anything is allocated) attn.ErrUnsupported, as does a decoder storage
// of int8 codes or a StreamingLLM window (a malformed storage name wraps
// attn.ErrInput). A decoder step past
// DecodeConfig.MaxLen wraps kvcache.ErrFull and appends nothing. A
// cancelled context stops the work and returns its error. NaN in the
// inputs propagates to the rows it reaches, as in package flash; it never
// causes a panic.
package reformer
