package attn

import (
	"context"
	"errors"
	"fmt"
	"math"
)

// ErrFull is wrapped by the error of a decoder step (or a cache append)
// past DecodeConfig.MaxLen: the context is full.
var ErrFull = errors.New("attn: context full")

// DecodeConfig describes the batch of sequences a Decoder holds.
type DecodeConfig struct {
	B   int // sequences decoded side by side
	H   int // query heads
	HKV int // key/value heads; H must be a multiple of HKV
	D   int // head size
	// Scale multiplies the logits; 0 means 1/sqrt(D).
	Scale float32
	// Workers bounds the goroutines of a step; 0 means GOMAXPROCS.
	Workers int
	// Storage is the element type of stored keys and values for decoders
	// that store them: "" or "f32", "bf16", "f16", "i8", "i4", each
	// optionally with "+rot" for a Hadamard rotation of queries, keys and
	// values ("i4+rot"; package kvcache, ParseStorage). Decoders that keep
	// no keys (recurrent states) ignore it.
	Storage string
	// Window, when positive, makes a decoder that stores keys keep only the
	// last Window positions plus the first Sinks (StreamingLLM) on top of
	// its own pattern. Decoders that keep no keys ignore both.
	Window, Sinks int
	// MaxLen, when positive, bounds the positions a sequence may reach;
	// an append past it is an error. Decoders may size memory by it.
	MaxLen int
	// Evict, with a Window and Keep > 0, bounds a decoder that stores
	// keys by an eviction policy: "h2o" (accumulated attention) or
	// "snapkv" (a prompt's observation window). Besides the Sinks and the
	// last Window positions it keeps Keep more, those the policy scores
	// highest per KV head, and queries see every position kept (package
	// kvcache, Policy). Decoders that cannot evict return an error
	// wrapping ErrUnsupported; "" keeps what Window keeps.
	Evict string
	// Keep is the number of positions an evicting decoder keeps past the
	// sinks and the window.
	Keep int
}

// maxDecodeLen bounds DecodeConfig.MaxLen and Window: far past any context
// a model here runs, small enough that sizes derived from it cannot
// overflow: 2^32, or MaxElems where int has 32 bits.
const maxDecodeLen = min(1<<32, MaxElems)

// Validate checks the dimensions and bounds before anything is allocated.
func (c DecodeConfig) Validate() error {
	s := Shape{B: c.B, H: c.H, HKV: c.HKV, N: 1, M: 1, D: c.D}
	if err := s.Validate(); err != nil {
		return err
	}
	switch {
	case math.IsNaN(float64(c.Scale)) || math.IsInf(float64(c.Scale), 0):
		return fmt.Errorf("%w: decode scale %v is not finite", ErrInput, c.Scale)
	case c.Workers < 0:
		return fmt.Errorf("%w: decode workers = %d, want >= 0", ErrInput, c.Workers)
	case c.Window < 0 || c.Sinks < 0 || c.MaxLen < 0:
		return fmt.Errorf("%w: decode Window = %d, Sinks = %d, MaxLen = %d, want >= 0", ErrInput, c.Window, c.Sinks, c.MaxLen)
	case c.Window > maxDecodeLen || c.Sinks > maxDecodeLen || c.MaxLen > maxDecodeLen:
		return fmt.Errorf("%w: decode Window = %d, Sinks = %d, MaxLen = %d: at most %d positions", ErrInput, c.Window, c.Sinks, c.MaxLen, maxDecodeLen)
	case c.Sinks > 0 && c.Window == 0:
		return fmt.Errorf("%w: decode Sinks = %d needs a Window", ErrInput, c.Sinks)
	case c.Keep < 0 || c.Keep > maxDecodeLen:
		return fmt.Errorf("%w: decode Keep = %d, want 0 to %d", ErrInput, c.Keep, maxDecodeLen)
	case c.Evict != "" && c.Evict != "h2o" && c.Evict != "snapkv":
		return fmt.Errorf("%w: decode eviction policy %q (want h2o or snapkv)", ErrInput, c.Evict)
	case c.Evict != "" && (c.Window == 0 || c.Keep == 0):
		return fmt.Errorf("%w: decode eviction %q needs a Window and Keep > 0, got Window = %d, Keep = %d", ErrInput, c.Evict, c.Window, c.Keep)
	case c.Evict == "" && c.Keep > 0:
		return fmt.Errorf("%w: decode Keep = %d needs an eviction policy", ErrInput, c.Keep)
	}
	return nil
}

// ScaleFor returns the scale in effect.
func (c DecodeConfig) ScaleFor() float32 { return Options{Scale: c.Scale}.ScaleFor(c.D) }

// Decoder is the incremental, causal form of a mechanism for a batch of
// sequences: it keeps what the mechanism needs of the past (a KV cache, a
// recurrent state, hashed buckets) so that a step costs what the new
// positions need, not a pass over the whole sequence.
//
// A Decoder is not safe for concurrent use.
type Decoder interface {
	// Step appends n new positions to every sequence and attends their
	// queries to everything the sequence holds, themselves included, by
	// the mechanism's causal rule: position Len(b)+i of sequence b sees
	// positions <= Len(b)+i. q and out are [B][H][n][D], k and v
	// [B][Hkv][n][D], lse nil or [B][H][n] (the mechanism's log
	// normaliser, as in Mechanism.Forward). valid is nil, or holds for
	// each sequence how many of the n positions are real: the rest are
	// padding, not appended, with out 0 and lse -Inf, so that sequences
	// of different lengths (ragged prompts) share one batch.
	Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error
	// Len returns the positions appended to sequence b so far.
	Len(b int) int
	// Bytes returns the memory the decoder's state occupies.
	Bytes() int
	// Reset empties every sequence, keeping the memory.
	Reset()
}

// Appender is implemented by decoders that can take positions without
// attending their queries: a prompt whose outputs were computed elsewhere
// (exact prefill, then sparse decode, as the long-context decoding papers
// do) or are not needed (a benchmark filling a cache). k and v are
// [B][Hkv][n][D]; valid as for Step. What a later Step sees is as if the
// positions had gone through Step.
type Appender interface {
	Append(ctx context.Context, k, v []float32, n int, valid []int) error
}

// Decodable is implemented by mechanisms with an incremental decoder. A
// mechanism that cannot decode at all (or not with cfg) returns an error
// wrapping ErrUnsupported that says why.
type Decodable interface {
	NewDecoder(cfg DecodeConfig) (Decoder, error)
}

// Differentiable is implemented by mechanisms with a backward pass: given
// the forward call's inputs, out and lse, and the gradient dout of the
// loss with respect to out, it writes the gradients dq, dk and dv (same
// layouts as q, k and v; overwritten, not accumulated). Whatever the
// forward pass drew at random is fixed by the mechanism's seed, so the
// gradient is that of the same estimator.
type Differentiable interface {
	Backward(ctx context.Context, s Shape, q, k, v, out, lse, dout []float32, o Options, dq, dk, dv []float32) error
}

// Fallbacker is implemented by mechanisms that run exact attention
// instead of their approximation for some calls (short inputs, a single
// query row). Fallback returns the reason for a call of shape s under o,
// or "" when the approximation runs.
type Fallbacker interface {
	Fallback(s Shape, o Options) string
}

// FallbackOf returns why m would run exact attention for a call of shape s
// under o, or "" when it runs its own method (or is exact to begin with).
func FallbackOf(m Mechanism, s Shape, o Options) string {
	if f, ok := m.(Fallbacker); ok {
		return f.Fallback(s, o)
	}
	return ""
}

// CheckAppend validates the arguments of Appender.Append against cfg.
func (c DecodeConfig) CheckAppend(k, v []float32, n int, valid []int) error {
	if n <= 0 {
		return fmt.Errorf("%w: append of %d positions, want > 0", ErrInput, n)
	}
	s := Shape{B: c.B, H: c.H, HKV: c.HKV, N: n, M: n, D: c.D}
	if err := s.Validate(); err != nil {
		return err
	}
	if len(k) != s.KVLen() || len(v) != s.KVLen() {
		return fmt.Errorf("%w: append of %d positions: len(k) = %d, len(v) = %d, want B·Hkv·n·D = %d", ErrShape, n, len(k), len(v), s.KVLen())
	}
	return c.checkValid(n, valid)
}

func (c DecodeConfig) checkValid(n int, valid []int) error {
	if valid == nil {
		return nil
	}
	if len(valid) != c.B {
		return fmt.Errorf("%w: %d valid counts for B = %d sequences", ErrShape, len(valid), c.B)
	}
	for b, x := range valid {
		if x < 0 || x > n {
			return fmt.Errorf("%w: valid count %d of sequence %d is outside [0, %d]", ErrInput, x, b, n)
		}
	}
	return nil
}

// CheckStep validates the arguments of Decoder.Step against cfg; decoders
// call it first so that every one rejects bad input the same way.
func (c DecodeConfig) CheckStep(q, k, v []float32, n int, valid []int, out, lse []float32) error {
	if n <= 0 {
		return fmt.Errorf("%w: decode step of %d positions, want > 0", ErrInput, n)
	}
	s := Shape{B: c.B, H: c.H, HKV: c.HKV, N: n, M: n, D: c.D}
	if err := s.CheckTensors(q, k, v, out, lse); err != nil {
		return err
	}
	if out == nil {
		return fmt.Errorf("%w: out is nil", ErrShape)
	}
	return c.checkValid(n, valid)
}
