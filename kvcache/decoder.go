package kvcache

import (
	"context"
	"fmt"
	"math"

	"github.com/attnkit/attn"
)

// Decoder is exact causal attention as an attn.Decoder: one Cache per
// sequence, so that sequences of a batch may hold different lengths
// (ragged prompts, FlashAttention's cache_seqlens). With cfg.Window it is
// the sliding window with sinks of Cache; with cfg.Evict and cfg.Keep, the
// bounded cache of that policy (see Policy). cfg.Storage is parsed by
// ParseStorage: an element type, and "+rot" for Config.Rotate.
type Decoder struct {
	cfg    attn.DecodeConfig
	caches []*Cache
	// Scratch for one sequence's rows: q and out [H][n][D], k and v
	// [Hkv][n][D], lse [H][n].
	q, k, v, out, lse []float32
}

// NewDecoder returns an empty exact decoder.
func NewDecoder(cfg attn.DecodeConfig) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dt, rot, err := ParseStorage(cfg.Storage)
	if err != nil {
		return nil, err
	}
	ev, err := ParsePolicy(cfg.Evict)
	if err != nil {
		return nil, err
	}
	cc := Config{B: 1, HKV: cfg.HKV, D: cfg.D, DType: dt, Window: cfg.Window, Sinks: cfg.Sinks,
		Rotate: rot, Evict: ev, Keep: cfg.Keep}
	if cfg.Window == 0 {
		cc.MaxLen = cfg.MaxLen
		if cfg.MaxLen > 0 {
			// The cache doubles as it fills; a long bound should not cost
			// its memory up front.
			cc.Capacity = min(cfg.MaxLen, 2048)
		}
	}
	d := &Decoder{cfg: cfg, caches: make([]*Cache, cfg.B)}
	for b := range d.caches {
		c, err := New(cc)
		if err != nil {
			return nil, err
		}
		d.caches[b] = c
	}
	return d, nil
}

// Len returns the positions appended to sequence b.
func (d *Decoder) Len(b int) int { return d.caches[b].Len() }

// Bytes returns the memory of the caches.
func (d *Decoder) Bytes() int {
	n := 0
	for _, c := range d.caches {
		n += c.Bytes()
	}
	return n
}

// Reset empties every sequence.
func (d *Decoder) Reset() {
	for _, c := range d.caches {
		c.Reset()
	}
}

// Cache returns the cache of sequence b, for callers that attend to it
// directly (the decode benchmark's Attend).
func (d *Decoder) Cache(b int) *Cache { return d.caches[b] }

// Compress ends a SnapKV prompt in every sequence now rather than at its
// next single position (see Cache.Compress); it does nothing for other
// policies.
func (d *Decoder) Compress(ctx context.Context) error {
	for b, c := range d.caches {
		if err := c.Compress(ctx, d.cfg.Workers); err != nil {
			return fmt.Errorf("sequence %d: %w", b, err)
		}
	}
	return nil
}

// Step implements attn.Decoder.
func (d *Decoder) Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error {
	cfg := d.cfg
	if err := cfg.CheckStep(q, k, v, n, valid, out, lse); err != nil {
		return err
	}
	o := attn.Options{Scale: cfg.Scale, Workers: cfg.Workers}
	if cfg.B == 1 && valid == nil {
		return d.caches[0].Step(ctx, cfg.H, q, k, v, n, o, out, lse)
	}
	h, hkv, dd := cfg.H, cfg.HKV, cfg.D
	for b, c := range d.caches {
		nb := n
		if valid != nil {
			nb = valid[b]
		}
		ob := out[b*h*n*dd:][:h*n*dd]
		var lb []float32
		if lse != nil {
			lb = lse[b*h*n:][:h*n]
		}
		if nb < n {
			clear(ob)
			for i := range lb {
				lb[i] = float32(math.Inf(-1))
			}
		}
		if nb == 0 {
			continue
		}
		d.q = compact(d.q, q[b*h*n*dd:], h, n, nb, dd)
		d.k = compact(d.k, k[b*hkv*n*dd:], hkv, n, nb, dd)
		d.v = compact(d.v, v[b*hkv*n*dd:], hkv, n, nb, dd)
		d.out = grow(d.out, h*nb*dd)
		d.lse = grow(d.lse, h*nb)
		if err := c.Step(ctx, h, d.q, d.k, d.v, nb, o, d.out, d.lse); err != nil {
			return fmt.Errorf("sequence %d: %w", b, err)
		}
		for hd := range h {
			copy(ob[hd*n*dd:][:nb*dd], d.out[hd*nb*dd:][:nb*dd])
			if lb != nil {
				copy(lb[hd*n:][:nb], d.lse[hd*nb:][:nb])
			}
		}
	}
	return nil
}

// compact copies the first nb of n positions of each of heads rows of x
// ([heads][n][d]) into dst as [heads][nb][d].
func compact(dst, x []float32, heads, n, nb, d int) []float32 {
	dst = grow(dst, heads*nb*d)
	for hd := range heads {
		copy(dst[hd*nb*d:][:nb*d], x[hd*n*d:][:nb*d])
	}
	return dst
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

var _ attn.Decoder = (*Decoder)(nil)

// Append implements attn.Appender: the positions are stored, nothing is
// attended.
func (d *Decoder) Append(ctx context.Context, k, v []float32, n int, valid []int) error {
	cfg := d.cfg
	if err := cfg.CheckAppend(k, v, n, valid); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	hkv, dd := cfg.HKV, cfg.D
	count := func(b int) int {
		if valid == nil {
			return n
		}
		return valid[b]
	}
	// A failed append leaves every sequence as it was.
	for b, c := range d.caches {
		if cfg.MaxLen > 0 && cfg.Window == 0 && c.Len()+count(b) > cfg.MaxLen {
			return fmt.Errorf("%w: sequence %d: %d + %d positions exceed MaxLen = %d", ErrFull, b, c.Len(), count(b), cfg.MaxLen)
		}
	}
	for b, c := range d.caches {
		nb := count(b)
		if nb == 0 {
			continue
		}
		d.k = compact(d.k, k[b*hkv*n*dd:], hkv, n, nb, dd)
		d.v = compact(d.v, v[b*hkv*n*dd:], hkv, n, nb, dd)
		if err := c.Append(d.k, d.v, nb); err != nil {
			return fmt.Errorf("sequence %d: %w", b, err)
		}
	}
	return nil
}

var _ attn.Appender = (*Decoder)(nil)
