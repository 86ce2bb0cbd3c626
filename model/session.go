package model

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/registry"
)

// Session decodes one sequence step by step. Every layer attends through
// its mechanism's incremental decoder (attn.Decoder, built by
// registry.NewDecoder): exact layers keep a KV cache, windows read only
// the keys their pattern allows, linear and Performer layers a recurrent
// state, so a step costs what the new positions need and never a pass
// over the past. A mechanism without a causal decoder (Linformer) cannot
// be decoded: NewSession says so. A Session is not safe for concurrent
// use.
type Session struct {
	m    *Model
	decs []attn.Decoder // per layer
	pos  int
}

// NewSession returns an empty session.
func (m *Model) NewSession() (*Session, error) {
	c := m.cfg
	s := &Session{m: m, decs: make([]attn.Decoder, c.Layers)}
	storage := m.cache.String()
	if m.rotate {
		storage += "+rot"
	}
	cfg := attn.DecodeConfig{B: 1, H: c.Heads, HKV: c.KVHeads, D: c.HeadDim(), Workers: m.workers, Storage: storage}
	for l := range c.Layers {
		d, err := registry.NewDecoder(m.mechs[l], cfg)
		if err != nil {
			return nil, fmt.Errorf("layer %d (%s): %w", l, m.labels[l], err)
		}
		s.decs[l] = d
	}
	return s, nil
}

// Len returns the number of positions fed so far.
func (s *Session) Len() int { return s.pos }

// Bytes returns the memory the layers' decoders hold (KV caches, states).
func (s *Session) Bytes() int {
	n := 0
	for _, d := range s.decs {
		n += d.Bytes()
	}
	return n
}

// Reset empties the session, keeping its memory.
func (s *Session) Reset() {
	s.pos = 0
	for _, d := range s.decs {
		d.Reset()
	}
}

// Step feeds tokens at positions Len()…Len()+len(tokens)-1 (a prompt at
// once, or one generated token) and, when logits is not nil, writes the
// logits of the token that follows the last of them ([Vocab]). On error
// the session is left in an undefined state: Reset it.
func (s *Session) Step(ctx context.Context, tokens []int, logits []float32) error {
	m := s.m
	n := len(tokens)
	if n == 0 {
		return fmt.Errorf("%w: no tokens", attn.ErrInput)
	}
	if logits != nil && len(logits) != m.cfg.Vocab {
		return errShape("logits", len(logits), m.cfg.Vocab)
	}
	att := func(ctx context.Context, l int, sh attn.Shape, q, k, v, out []float32) error {
		if err := s.decs[l].Step(ctx, q, k, v, n, nil, out, nil); err != nil {
			return fmt.Errorf("layer %d (%s): %w", l, m.labels[l], err)
		}
		return nil
	}
	if err := m.pass(ctx, tokens, s.pos, att, n-1, logits); err != nil {
		return err
	}
	s.pos += n
	return nil
}

// Activations runs the model over tokens and returns the attention inputs
// and output of layer l, as an Observer sees them, stopping after that
// layer: q and out [1][H][n][D], k and v [1][Hkv][n][D].
func (m *Model) Activations(ctx context.Context, tokens []int, l int) (s attn.Shape, q, k, v, out []float32, err error) {
	if l < 0 || l >= m.cfg.Layers {
		return s, nil, nil, nil, nil, fmt.Errorf("%w: layer %d outside [0, %d)", attn.ErrInput, l, m.cfg.Layers)
	}
	obs := func(layer int, sh attn.Shape, qs, ks, vs, os []float32) error {
		if layer != l {
			return nil
		}
		s, q, k, v, out = sh, slices.Clone(qs), slices.Clone(ks), slices.Clone(vs), slices.Clone(os)
		return errStop
	}
	err = m.ForwardObserve(ctx, tokens, len(tokens), nil, obs)
	if errors.Is(err, errStop) {
		err = nil
	}
	return s, q, k, v, out, err
}

// DecodeFallback returns why layer l's decoder attends exactly, rather
// than by its mechanism's rule, at a step whose query sees n positions
// (itself included), or "" when it approximates or the layer is exact to
// begin with. It is the decoder's own account (attn.Fallbacker), which
// need not be Forward's: Performer's and Reformer's decoders never fall
// back, HyperAttention's is exact below its min.
func (m *Model) DecodeFallback(l, n int) string {
	if !m.Patched(l) || n <= 0 {
		return ""
	}
	c := m.cfg
	d, err := registry.NewDecoder(m.mechs[l], attn.DecodeConfig{B: 1, H: c.Heads, HKV: c.KVHeads, D: c.HeadDim(), Workers: m.workers})
	if err != nil {
		return ""
	}
	f, ok := d.(attn.Fallbacker)
	if !ok {
		return ""
	}
	return f.Fallback(attn.Shape{B: 1, H: c.Heads, HKV: c.KVHeads, N: 1, M: n, D: c.HeadDim()}, attn.Options{Causal: true, Workers: m.workers})
}
