// Package hyper is HyperAttention (Han, Jayaram, Karbasi, Mirrokni, Woodruff
// and Zandieh, "HyperAttention: Long-context Attention in Near-Linear Time",
// arXiv 2310.05869): an approximation of softmax attention that computes
// the large entries of the attention matrix exactly and estimates the rest
// from a few sampled columns.
//
// # Algorithm
//
// For one batch row and key/value head, with queries Q (every query head
// of the GQA group) and the valid keys K, V:
//
//  1. sortLSH. r random Gaussian directions (Config.Projs, default 7)
//     give each vector an r-bit sign pattern; its bucket is the rank of
//     that pattern in the reflected Gray code (GrayRank), so buckets of
//     adjacent rank differ in one sign. The keys are sorted by bucket,
//     ties in input order.
//  2. Block-diagonal part. The n sorted keys are cut into nb =
//     ceil(n/Block) blocks of as equal sizes as possible (no padding, so no
//     padded key is ever counted). Each query (of every head of the group)
//     joins the block holding the middle of its own bucket's run in the
//     sorted keys, or the place that run would take when no key shares its
//     bucket, and attends exactly, by the fused kernel of package flash,
//     to that key block. The paper sorts the queries as well and pairs the
//     b-th block of queries with the b-th of keys; here a query's block
//     depends on that query and the keys alone, which is what makes the
//     causal result depend on the past only (below), and matches buckets
//     rather than ranks when queries and keys fall in different buckets.
//     Blocks are gathered into per-worker scratch, eight runs of queries
//     at a time as the batch of one kernel call; the tensors are never
//     copied whole.
//  3. Sampled part. Samples columns (default 256) are drawn uniformly,
//     without replacement, from the n keys, once for the whole problem as
//     in the paper, and gathered once. The queries of key block b attend
//     exactly to the c_b of them that lie outside it (those inside are
//     one run of the samples sorted by position, left out), and
//     log(R_b/c_b) is added to that log-sum-exp, R_b being
//     the number of keys outside the block: given c_b, those samples are a
//     uniform sample of the R_b keys, so this is an unbiased estimate of
//     the normaliser over them, and the output the matching estimate of
//     their average value. With Samples >= n every key is taken, c_b = R_b,
//     and the part is exact. Sampling.ValueNorm replaces the product with
//     V by the paper's approximate matrix product from columns drawn by
//     squared value norm.
//  4. The two parts cover disjoint keys and merge by attn.Merge:
//     L = logaddexp(L1, L2), O = e^{L1-L}·O1 + e^{L2-L}·O2. The lse
//     returned is this estimate of the log normaliser.
//
// # Causal masks
//
// Under a causal mask (bottom-right aligned: query i sits at position
// M-N+i) the keys before the first query position form one unmasked
// rectangle, approximated as above, and positions [max(M-N, 0), M) a causal
// square. A square is split at its middle into two causal halves, handled
// the same way, and the rectangle of the later half's queries against the
// earlier half's keys, which no mask touches and which is approximated as
// above. The halving stops when a half would be shorter than Min or would
// fit in one block (its rectangle would be exact anyway); those leaves are
// computed exactly, all in one block-sparse call of the flash kernel. Any
// N and M work: halves differ by at most one position, nothing is padded.
//
// The output at a position depends on the queries, keys and values at
// that position and before it only: every rectangle holds keys earlier
// than all of its queries, a query's block depends on that query and those
// keys, and the samples of a rectangle on the seed, the shape and (for
// value-norm sampling) those keys' values. Changing anything at position t
// changes no output before t, bit for bit.
//
// # Exact fallback
//
// A call with fewer than Min queries or fewer than Min keys (default 4096)
// is computed by the exact kernel, bit for bit its result; so is every
// rectangle of the causal recursion below Min (after key padding) and
// every leaf. Min < 0 never falls back. Fallback says whether, and why, a
// call will be exact.
//
// # Masks, heads and lengths
//
// Key padding (Options.KVLen) removes keys before anything else: they are
// not hashed, sorted, blocked or sampled, and the result equals the call on
// the truncated keys without a causal mask. GQA uses each key/value head
// once for its whole group: the group's queries share the key blocks and
// the samples, and K and V are never expanded. N and M may differ. A
// query that sees no key gets output 0 and lse -Inf.
//
// # Randomness
//
// Everything random comes from Config.Seed, with PCG generators of
// math/rand/v2, and is drawn during Forward, so the same seed and inputs
// give the same output whatever the number of workers:
//   - The projections: r·D standard normals from PCG(Seed, 0x9e3779b97f4a7c15),
//     projection by projection, shared by every batch row and head.
//   - The samples of each problem (the whole call without a causal mask,
//     each rectangle of the recursion with one) for one batch row and
//     key/value head: PCG(Seed, s) with s a SplitMix64 hash of the batch
//     row, the key/value head and the problem's query and key ranges
//     (after padding). Uniform samples are Floyd's algorithm over the
//     positions in key-sort order (a partial Fisher–Yates shuffle when more
//     than an eighth of the keys are taken); value-norm samples then draw
//     Samples more positions, with replacement, from the same stream.
//
// # Gradients
//
// Backward differentiates the estimate Forward computed for the seed: it
// draws the same buckets, key blocks and samples again (Forward and
// Backward share the plan of every phase) and holds them, and the sample
// weights, constant. Each query attends, over all the parts Forward
// merged, to a set of keys with weights (1 in a block, a leaf or an exact
// rectangle, R_b/c_b for a sample), so its output is softmax attention
// over those keys with the log weights as a bias, and the gradient of each
// part is the exact backward pass of package flash on that part's keys,
// with the merged lse less the part's log weight and the merged output in
// the row term rowsum(dO∘O): the leaves in one block-sparse call, each
// job's blocks in a block-diagonal call on its query rows gathered by
// block, its samples in one more with each block's run of samples masked.
// The parts add up in a fixed order, so the gradients do not depend on the
// worker count. Value-norm sampling has no backward pass where its
// estimate is used (its output is no softmax over weighted keys). Without
// a causal mask the work is about 10·N·(Block+Samples)·D flops per query
// head, two and a half times the forward pass's, and the memory that of a
// chunk of gathered rows and of the flash kernel's partials for it.
//
// # Decoding
//
// NewDecoder returns the incremental form, with a rule of its own (Forward
// cuts a whole problem's keys into blocks; a decoded query comes alone,
// against a cache that grows by one key a step). With W =
// max(Block, 1), the query at position p of a sequence sees positions
// [0, p] and
//
//   - attends exactly to the recent positions [p+1-W, p], its own among
//     them;
//   - sorts the n = p+1-W older keys stably by bucket and attends exactly
//     to the m = min(Block, n) of them whose ranks are centred on the
//     middle of its own bucket's run (ranks [c - m/2, c - m/2 + m), c the
//     rank of the middle of the run, or of the place it would take,
//     clamped into [0, n)): its sortLSH neighbourhood;
//   - draws min(Samples, n) distinct ranks uniformly from [0, n), from
//     PCG(Seed, s) with s a SplitMix64 hash of the key/value head and p
//     (the same for every query head of the group, and for the sequence
//     whatever its batch), leaves out those in its neighbourhood, and
//     weights the k kept by (n-m)/k: given k, they are a uniform sample
//     of the n-m other older keys, so the weighted sum of their
//     exponentiated logits is an unbiased estimate of the normaliser over
//     those keys, and likewise of its product with their values;
//   - merges the three by their log-sum-exp: the output is the ratio of
//     the estimated numerator to the estimated normaliser, the lse the log
//     of the latter.
//
// Below Min visible positions (p+1 < Min) the query attends exactly to all
// of them, as Forward is exact below Min. The rule is exact whenever the
// recent positions, the neighbourhood and the samples together take every
// position: up to W + max(Block, Samples) positions. Otherwise the error
// is that of the sampled part: its normaliser is unbiased, with a standard
// deviation of about (n-m)/sqrt(k)·sd(e^{logit}) over the other older keys
// (less by the finite-population factor sqrt(1 - k/(n-m))), and the output
// being a ratio of two such estimates is biased by O(1/k); both vanish
// when the large logits are among the recent keys and the neighbourhood,
// which is what the sortLSH neighbourhood is for.
//
// A step reads W + min(Samples, n) key rows per key/value head and m per
// query head, however long the sequence, plus the index: per sequence and
// key/value head, a Fenwick tree of the counts of the older keys per
// bucket and a list of positions per bucket, updated in O(Projs) as each
// key leaves the recent positions, which find the neighbourhood and map
// sample ranks to positions in O(Projs) per bucket visited or sample. The
// decoder keeps every key and value and 2^Projs counts and lists per
// sequence and key/value head (Projs at most MaxDecodeProjs). Prompt
// chunks (n > 1) are computed position by position, in parallel over the
// sequences and key/value heads.
//
// The keys and values are stored as attn.DecodeConfig.Storage says:
// float32 ("" or "f32"), bfloat16 or binary16 ("bf16", "f16": rounded to
// nearest, widened in registers as they are read), 8-bit codes ("i8": a
// float32 scale a row) or 4-bit codes ("i4": quantised per token, each
// row's channels in groups of 64 with a float32 scale and zero a group),
// each optionally with "+rot": stored rotated by
// a fixed Hadamard rotation R with random signs, the queries rotated alike
// (R·q · R·k = q·k) and the outputs rotated back; lse is unchanged. The
// buckets are those of the keys as stored (rounded or quantised, and
// rotated with "+rot", as the queries then are): the rule is the one above
// over the stored keys, and a rotation changes which keys share a bucket,
// not the logits. The products read the stored rows in place, the recent
// positions where they lie and the neighbourhood and samples gathered, a
// position's value next to its key.
//
// # Cost
//
// Without a causal mask, about 4·N·(Block+Samples)·D flops per query head
// (against 4·N·M·D exact) plus O((N+M)·D·r) for hashing, O(M) per head
// for sorting the keys (a counting sort for r <= 16) and O(N·log M) for
// placing the queries; memory: the buckets and sort orders
// (O(B·(H·N + Hkv·M)) words), the gathered samples of each problem
// (2·Samples·D floats) and per worker scratch of a few blocks.
// Causal: the leaves, exact and causal, are shorter than
// max(2·Min, 2·Block+2) positions, so they hold at most N·max(Min, Block+1)
// (query, key) pairs; each of the about log2(N/Min) levels of halving adds
// N/2 queries at Block+Samples keys each. At N = 131072 and the defaults
// the pair count is 256 times below exact attention, about 20 times causal.
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput (by attn.Check, first), and a bad Config from New wraps
// attn.ErrInput; lengths past 2^31-1 (or a group of query heads holding
// more rows) return attn.ErrUnsupported. A cancelled context stops the
// call between blocks and returns ctx.Err(), once. NaN in the inputs
// propagates as in the exact kernel.
//
// # Differences from the authors' code
//
// The reference implementation (insuhan/hyper-attn) orders buckets by
// gray(pattern) rather than by Gray rank, so about a quarter of adjacent
// buckets differ in more than one sign; pads the last key block with zero
// keys that then enter the normaliser unmasked; on its CUDA path counts
// sampled keys that fall in the query's own block twice; and has no key
// padding, GQA or N ≠ M causal alignment. None of that is copied here. It
// also sorts the queries and pairs blocks by rank, where a query here
// joins the key block of its bucket (see Algorithm).
package hyper
