// Package sparse holds the sparse attention family: sliding window,
// Sparse Transformer strided and fixed, Longformer and BigBird. Each is
// defined once as a pattern (a flash.Pattern over absolute positions,
// query i at M-N+i) and executed exactly by the fused kernel of package
// flash over only the keys the pattern touches; no N×M mask is ever built.
//
// # Mechanisms
//
// Four constructors return an *Attention, which implements attn.Mechanism
// under the command-line names of docs/DESIGN.md §7:
//
//	window      NewWindow      p-Left <= j <= p+Right, p-j ≡ 0 (mod Dilation)
//	strided     NewStrided     Child et al. 2019: strided |p-j| <= l or p-j ≡ 0 (mod l);
//	                           fixed ⌊p/l⌋ = ⌊j/l⌋ or j mod l >= l-c
//	longformer  NewLongformer  Beltagy et al. 2020: window, or j global, or p global
//	bigbird     NewBigBird     Zaheer et al. 2020: window, global and random blocks
//
// Every pattern is intersected with the causal and padding masks of
// attn.Options; for the strided and Longformer patterns the intersection is
// the papers' causal variant (a global token then sees only the past). The
// BigBird pattern depends on the causal flag: causal random blocks are
// drawn from the past only. (*Attention).Pattern returns the pattern of a
// call for tests and pictures; Dense and WritePNG render one.
//
// # Execution
//
// The kernel asks a pattern, per tile of query rows, for key ranges:
// key tiles outside them are never visited, tiles inside Full ranges run
// unmasked and the rest are masked key by key with Visible. Contiguous
// patterns (the window band, the fixed block, BigBird's blocks) run this
// way directly. Patterns whose keys are scattered would cost a whole key
// tile per scattered key, so Forward decomposes them into parts over
// disjoint key sets and merges the parts' (out, lse) with attn.Merge:
//
//   - keys every query may see (fixed summary columns, Longformer global
//     keys) are gathered into a compact K, V per batch row;
//   - keys that depend on the query's residue modulo a step (strided
//     columns, a dilated window) run with queries and keys regrouped by
//     residue, where they form a band;
//   - Longformer's global query rows run separately against all keys and
//     replace their rows.
//
// The regrouped parts carry the causal mask in their pattern and the
// padding mask by gathering only valid keys, since neither is a prefix of
// the regrouped keys.
//
// # Cost
//
// Per query row, with T the query tile length (flash's BlockRows over the
// GQA group): window O((Left+Right)/Dilation + T) keys; strided O(l + M/l);
// fixed O(l + c·M/l); Longformer O(Left+Right+T+G) for G globals, plus M
// per global row; BigBird O(Block·(Window+Globals+Random) + T), plus M per
// row of a global block. Key ranges are computed per query tile in time
// independent of N, so at a fixed window the time is linear in N. Extra
// memory is the kernel's scratch, plus one output buffer for merging and
// one copy of Q, K, V for the gathered and regrouped parts, recycled
// between calls.
//
// # Decoding and gradients
//
// (*Attention).NewDecoder is the causal pattern one token at a time
// (attn.Decodable): keys and values go to a kvcache.Cache per sequence,
// and each new query reads only the keys its pattern lets it see, through
// kvcache's AttendRanges, with the decode kernels of exact attention. A
// window keeps Left+1 positions in a ring, so a step and the memory cost
// O(Left) however long the sequence; the other patterns keep every
// position and read O(l + T/l) (strided), O(l + c·T/l) (fixed),
// O(Left+G) (Longformer, T for a global query) or
// O(Block·(Window+Globals+Random)) (BigBird) keys a step at length T.
// The outputs are those of one causal Forward over the whole sequence.
// A prompt chunk runs through Forward itself.
//
// (*Attention).Backward (attn.Differentiable) is the exact kernel's
// backward pass over the parts Forward ran (window, strided: their
// gradients add up, so the backward reads what the forward read), or
// over the mechanism's pattern (Longformer and BigBird, whose global rows
// replace what the other parts computed).
//
// # Errors
//
// Bad shapes and options return errors wrapping attn.ErrShape or
// attn.ErrInput, as does a bad config (a negative extent or count, an
// unknown mode, a summary larger than the stride, a global position that
// is negative or not below M); constructors and Forward never panic on
// user input. A query row that sees no key, for example one that sees
// only padding, gets output 0 and lse -Inf.
package sparse
