package model

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/kvcache"
)

// Session decodes one sequence step by step. Exact layers keep their keys
// and values in a kvcache.Cache and attend only the new positions to it.
// Patched layers keep the queries, keys and values of every position and
// run their mechanism over the whole sequence so far at every step (N = M
// = Len), keeping the rows of the new positions: the result is that of
// Forward over the whole sequence, but a step costs a whole pass of the
// mechanism rather than one row. A Session is not safe for concurrent
// use.
type Session struct {
	m      *Model
	caches []*kvcache.Cache // exact layers
	hist   []*history       // patched layers
	pos    int
}

// history holds a patched layer's past, position-major: q [pos][H·D], k and
// v [pos][Hkv·D], after the rotary embedding.
type history struct {
	q, k, v          []float32
	qh, kh, vh, outh []float32 // head-major copies for the mechanism
}

// NewSession returns an empty session.
func (m *Model) NewSession() (*Session, error) {
	c := m.cfg
	s := &Session{m: m, caches: make([]*kvcache.Cache, c.Layers), hist: make([]*history, c.Layers)}
	for l := range c.Layers {
		if m.patched[l] {
			s.hist[l] = &history{}
			continue
		}
		cfg := kvcache.Config{B: 1, HKV: c.KVHeads, D: c.HeadDim(), DType: m.cache}
		if c.SeqLen > 0 {
			// The cache doubles as it fills; a long advertised context
			// should not cost its memory up front.
			cfg.Capacity = min(c.SeqLen, 2048)
		}
		kc, err := kvcache.New(cfg)
		if err != nil {
			return nil, err
		}
		s.caches[l] = kc
	}
	return s, nil
}

// Len returns the number of positions fed so far.
func (s *Session) Len() int { return s.pos }

// Reset empties the session, keeping its memory.
func (s *Session) Reset() {
	s.pos = 0
	for _, c := range s.caches {
		if c != nil {
			c.Reset()
		}
	}
	for _, h := range s.hist {
		if h != nil {
			h.q, h.k, h.v = h.q[:0], h.k[:0], h.v[:0]
		}
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
	opts := attn.Options{Workers: m.workers}
	att := func(ctx context.Context, l int, sh attn.Shape, q, k, v, out []float32) error {
		if kc := s.caches[l]; kc != nil {
			if err := kc.Step(ctx, sh.H, q, k, v, n, opts, out, nil); err != nil {
				return fmt.Errorf("layer %d: %w", l, err)
			}
			return nil
		}
		return s.attendPatched(ctx, l, sh, q, k, v, out)
	}
	if err := m.pass(ctx, tokens, s.pos, att, n-1, logits); err != nil {
		return err
	}
	s.pos += n
	return nil
}

// attendPatched appends the new positions to layer l's history and runs
// its mechanism over the whole sequence, causally.
func (s *Session) attendPatched(ctx context.Context, l int, sh attn.Shape, q, k, v, out []float32) error {
	h := s.hist[l]
	n, d := sh.N, sh.D
	// The pass gives q, k, v head-major for its n positions; the history
	// is position-major so that it grows by appending.
	h.q = appendPositions(h.q, q, n, sh.H, d)
	h.k = appendPositions(h.k, k, n, sh.HKV, d)
	h.v = appendPositions(h.v, v, n, sh.HKV, d)
	t := s.pos + n
	full := attn.Shape{B: 1, H: sh.H, HKV: sh.HKV, N: t, M: t, D: d}
	h.qh = slices.Grow(h.qh[:0], full.QLen())[:full.QLen()]
	h.kh = slices.Grow(h.kh[:0], full.KVLen())[:full.KVLen()]
	h.vh = slices.Grow(h.vh[:0], full.KVLen())[:full.KVLen()]
	h.outh = slices.Grow(h.outh[:0], full.QLen())[:full.QLen()]
	toHeads(h.qh, h.q, t, sh.H, d)
	toHeads(h.kh, h.k, t, sh.HKV, d)
	toHeads(h.vh, h.v, t, sh.HKV, d)
	o := attn.Options{Causal: true, Workers: s.m.workers}
	if err := s.m.mechs[l].Forward(ctx, full, h.qh, h.kh, h.vh, o, h.outh, nil); err != nil {
		return fmt.Errorf("layer %d (%s): %w", l, s.m.labels[l], err)
	}
	// Rows t-n…t-1 of every head are the new positions' outputs.
	for hd := range sh.H {
		copy(out[hd*n*d:][:n*d], h.outh[(hd*t+t-n)*d:][:n*d])
	}
	return nil
}

// appendPositions appends x ([heads][n][d]) to dst position by position.
func appendPositions(dst, x []float32, n, heads, d int) []float32 {
	base := len(dst)
	dst = slices.Grow(dst, n*heads*d)[:base+n*heads*d]
	for hd := range heads {
		for t := range n {
			copy(dst[base+(t*heads+hd)*d:][:d], x[(hd*n+t)*d:][:d])
		}
	}
	return dst
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
