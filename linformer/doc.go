// Package linformer computes Linformer attention (Wang et al., 2020,
// "Linformer: Self-Attention with Linear Complexity"): keys and values are
// projected along the length, from n to k rows, before softmax attention:
//
//	K' = Eᵀ·K,  V' = Fᵀ·V  (k×D),   out = softmax(scale·Q·K'ᵀ)·V'
//
// with E and F of shape n×k. Attention then costs O(N·k·D) and the
// projections O(M·k·D), linear in the length for a fixed k.
//
// Linformer is a function of its own, not an approximation of softmax
// attention: models are trained with their E and F, so it never falls
// back to exact attention.
//
// # Projections
//
// E and F are either supplied (Config.E, Config.F: learned parameters,
// for example read with package tensorio from a checkpoint, laid out n×k
// like PyTorch Linformer's (seq_len, k) parameters) or drawn from
// Config.Seed: independent N(0, 1/k) entries, E from PCG(Seed, "LinformE")
// and F from PCG(Seed, "LinformF"), row by row. Drawn rows are generated
// the first time a sequence needs them, in order, so the matrices are the
// same however they are reached. One E and one F are shared by every batch
// row and head.
//
// A sequence of M ≤ n keys uses the first M rows of E and F; M > n is an
// error naming the limit n (Config.Length). Keys past a batch row's valid
// length (Options.KVLen) are dropped before projecting, so padding changes
// nothing (the anchors have no masks at all); a batch row with no valid
// key gets out 0 and lse -Inf. Grouped-query heads share their kv head's
// projected keys and values; N may differ from M.
//
// Causal attention is impossible: every projected key mixes keys from the
// whole sequence, later ones included. Forward refuses it with an error
// wrapping attn.ErrUnsupported rather than silently leaking the future.
//
// # lse
//
// lse is the log-sum-exp of the row's scaled logits over the k projected
// keys: the normaliser of the softmax Linformer actually computes.
//
// # Cost
//
// 4·B·Hkv·M·k·D flops for the projections (blocked matrix products) plus
// exact attention over k keys (package flash), 4·B·H·N·k·D; extra memory
// 2·B·Hkv·k·D for K', V' and O(workers·D·(k+256)) scratch.
//
// Exact attention costs 4·B·H·N·M·D flops, so with N = M and as many kv
// heads as query heads Linformer takes fewer once the length passes 2k;
// BenchmarkForward compares the two across lengths.
//
// # Gradients and training
//
// Backward (attn.Differentiable) gives the gradients with respect to Q, K
// and V: exact attention's backward pass over the k projected keys,
// carried back through the projections (dK = E·dK', dV = F·dV'), padded
// keys getting 0. It costs about twice the forward pass's projections
// (it recomputes K' and V' rather than keeping them) plus exact
// attention's backward over k keys.
//
// BackwardProjections adds the gradients with respect to E and F, which
// is what makes them trainable parameters of a model: dE = Σ K·dK'ᵀ and
// dF = Σ V·dV'ᵀ, M×k like the rows Projections(M) returns, summed over
// batch rows and kv heads as one E and one F serve them all. A model
// keeps E and F as parameters (from Projections or a checkpoint), runs
// Forward and BackwardProjections, updates them and installs them with
// SetProjections before the next step; calls in flight keep the
// projections they started with.
//
// # Errors
//
// Bad configurations are errors from New; bad shapes and options return
// errors wrapping attn.ErrShape or attn.ErrInput; causal requests and
// over-long sequences wrap attn.ErrUnsupported; a cancelled context stops
// the pass and returns its error.
package linformer
