// Package model runs a small llama-style transformer decoder in pure Go,
// with the attention of any layer replaced by any mechanism of this module
// ("monkey patching", as the HyperAttention paper evaluates its method):
// perplexity, generation and the activations of real models for the
// accuracy experiments.
//
// # Architecture
//
// Llama (Touvron et al. 2023, arXiv 2302.13971), as llama2.c and
// llama.cpp's "llama" architecture run it: token embedding; per layer
// x += Wo·Attention(RoPE(Wq·n), RoPE(Wk·n), Wv·n) with n = RMSNorm(x), then
// x += W2·(silu(W1·n) ⊙ W3·n) with n = RMSNorm(x); a final RMSNorm and an
// output layer, tied to the embedding or not. Attention has Heads query
// heads and KVHeads key/value heads (grouped-query attention, never
// expanded), scale 1/sqrt(head size) and a causal mask. The rotary
// embedding turns interleaved pairs (x[2i], x[2i+1]) of each head by
// pos·RopeBase^(-2i/headsize), with angles computed in float64.
//
// # Passes
//
// Forward runs a whole sequence at once (prefill). Activations are kept
// feature-major ([features][positions], positions padded to 16), so that
// every projection is one product C = W·X through the simd.Gemm
// micro-kernel with W read in place as stored and positions along the
// vector lanes: nothing is transposed but each layer's queries, keys,
// values and attention output, to and from attention's [heads][n][D]
// layout. Products are tiled and spread over Options.Workers goroutines.
// Each layer's attention is one call of its mechanism over the sequence
// with the causal mask (exact layers: the fused kernel of package flash).
//
// A Session decodes step by step: every layer attends through its
// mechanism's incremental decoder (attn.Decoder, from registry.NewDecoder)
// and only the new positions are computed. Exact layers keep a KV cache
// (package kvcache; Cache.Step); sparse patterns keep one and read only
// the positions their pattern allows; linear attention and Performer keep
// a recurrent state of fixed size; Reformer and HyperAttention decode by
// their own documented rules. A step of one token is matrix-vector
// products (simd.DotRows: every weight read once, bound by memory
// bandwidth) and one decoder step per layer. Decoding token by token
// matches Forward's logits to float32 rounding for every mechanism whose
// causal Forward is its decoder's rule (the tests ask 1e-4).
//
// Costs per token: 2·P flops for P weights, plus attention: 4·t·Dim for
// the t-th position with exact attention. A decode step reads every
// weight once: 4·P bytes.
//
// # Patches
//
// Options.Patches names a registry mechanism and parameters per set of
// layers ("hyper:layers=2-3,block=32,samples=32", see ParsePatch); the
// mechanism of layer l is built once, in New, with seed Options.Seed+l.
// Mechanisms that approximate softmax attention fall back to exact
// attention below their own length threshold (their parameter min).
// Under the causal mask no key after position t reaches the output at t,
// and nothing after t changes the output at t, whatever the mechanism:
// the LSH-sorted ones (reformer, hyper) choose a query's keys by rules
// that read the prefix only (reformer's causal=nonstrict, which sorts all
// positions, is the one exception, and says so).
//
// # Files
//
// ReadGGUF and WriteGGUF read and write GGUF version 3 files of the llama
// (1, 2, 3.x with rope scaling and rope_freqs), mistral (sliding window)
// and qwen2 (Q/K/V biases, NeoX rotary) architectures, through package
// gguf; quantised tensors (the Q4/Q5/Q8 and k-quant families, IQ4) are
// dequantised once at load to float32, 4 bytes a weight; the file's
// tokenizer, SentencePiece ("llama") or byte-level BPE ("gpt2", with the
// pre-tokenizer tokenizer.ggml.pre names), comes with them, and
// OpenTokenizer reads it from the metadata alone;
// ReadLlama2C and WriteLlama2C read and write llama2.c checkpoints (run.c's
// format) and package tokenizer reads its tokenizer.bin; Open picks the
// format from the file's magic. Every reader checks sizes before
// allocating, returns errors wrapping ErrFormat (malformed),
// gguf.ErrFormat or attn.ErrUnsupported (valid but not supported here),
// and never panics: all are fuzzed.
//
// # Errors
//
// Bad arguments (token ids outside the vocabulary, slices of the wrong
// length, unknown mechanisms, layers out of range) return errors wrapping
// attn.ErrInput or attn.ErrShape; mechanisms that cannot run causally (a
// Linformer) return their attn.ErrUnsupported error from the first pass.
// Every pass honours its context's cancellation between products.
//
// # Training
//
// A Trainer trains Weights in place (NewTrainer, Step): the forward pass
// of Forward keeping every activation, then the backward pass layer by
// layer in reverse, every product through simd.Gemm (dX = Wᵀ·dY with
// Wᵀ copied once a step, dW += dY·Xᵀ with X copied position-major, both
// packed per tile), RMSNorm, SwiGLU and RoPE by their closed-form
// derivatives, and attention by its mechanism's backward pass: the
// FlashAttention-2 kernel of package flash for exact attention (no N×M
// buffer), flash's kernel with a sparse.Window pattern for sliding-window
// attention, the chunked backward of package linear for linear attention
// (TrainConfig.Attention). The loss is the mean cross-entropy of each
// token given those before it. The update is AdamW (decoupled weight
// decay on matrices only) after clipping the gradient's global norm, with
// a linear warm-up then a cosine decay of the learning rate. Every sum
// runs in an order fixed by the shapes, so a run gives the same bits on
// any number of workers, and Save then Resume continue a run exactly:
// the checkpoint is a GGUF model file (which every reader here accepts)
// with the settings, step and Adam's moments added as train.* entries.
// Widths need not be multiples of the products' column panels of 16:
// the last panel is zero-padded. Head sizes may be anything even.
//
// A model trained with linear or window attention records it
// (Config.Attention, GGUF key attn.attention) and runs with it: its
// layers are "patched" with its own mechanism by default.
//
// Costs per token and step: about 6·P flops for P weights (forward 2·P,
// backward 4·P), plus attention's forward and backward; the memory is
// every layer's activations, about (10·Dim + 3·Hidden)·4 bytes a position
// and layer.
package model
