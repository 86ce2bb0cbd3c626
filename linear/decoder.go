package linear

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
)

var (
	_ attn.Mechanism      = (*Attention)(nil)
	_ attn.Differentiable = (*Attention)(nil)
	_ attn.Decodable      = (*Attention)(nil)
	_ attn.Decoder        = (*Decoder)(nil)
)

// Decoder is causal linear attention as an attn.Decoder: a State, stepped
// with the chunked causal pass of Forward started from its carried prefix
// sums. A step of n positions costs what Forward over them costs, a single
// generated token O(F·D) per head, and the memory is F·(D+1) numbers per
// sequence and kv head, whatever the length. The outputs equal those of
// one causal Forward pass over all the positions up to float32 rounding
// (the chunks fall elsewhere), and they do not depend on cfg.Workers or on
// the other sequences of the batch.
//
// A step that returns an error other than a bad argument (a cancelled
// context) leaves the sequences partly advanced; Reset them.
//
// A Decoder is not safe for concurrent use.
type Decoder struct {
	cfg   attn.DecodeConfig
	st    *State
	works []*work // one per worker
}

// NewDecoder returns an empty decoder for cfg. A recurrent state keeps no
// keys, so cfg.Storage has no meaning and is ignored, and a window cannot
// be honoured: cfg.Window > 0 is an error wrapping attn.ErrUnsupported.
// cfg.MaxLen, when positive, bounds each sequence's length; a step past
// it is an error wrapping attn.ErrInput. Sizes are checked as by
// NewState before anything is allocated.
func (a *Attention) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	d, err := a.newDecoder(cfg)
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (a *Attention) newDecoder(cfg attn.DecodeConfig) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Window > 0 {
		return nil, fmt.Errorf("%w: linear: a recurrent state keeps no keys to slide a window of %d over", attn.ErrUnsupported, cfg.Window)
	}
	st, err := a.NewState(cfg.B, cfg.H, cfg.HKV, cfg.D, cfg.Scale)
	if err != nil {
		return nil, err
	}
	// Sequences and kv heads are independent, each computed whole by one
	// worker, so the worker count changes no result.
	workers := attn.Options{Workers: cfg.Workers}.WorkerCount(runtime.GOMAXPROCS(0), cfg.B*cfg.HKV)
	d := &Decoder{cfg: cfg, st: st, works: make([]*work, workers)}
	f := a.fm.Features(cfg.D)
	d.works[0] = st.w
	for i := 1; i < workers; i++ {
		d.works[i] = a.newWork(cfg.D, f, cfg.H/cfg.HKV, false)
	}
	return d, nil
}

// State returns the recurrent state the decoder steps.
func (d *Decoder) State() *State { return d.st }

// Len returns the positions appended to sequence b.
func (d *Decoder) Len(b int) int { return d.st.Len(b) }

// Bytes returns the memory of the prefix sums and of the workers' scratch.
func (d *Decoder) Bytes() int {
	n := 0
	for _, p := range d.st.pre {
		n += len(p.s) + len(p.z)
	}
	for _, w := range d.works {
		n += w.floats()
	}
	return 4 * n
}

// Reset empties every sequence.
func (d *Decoder) Reset() { d.st.Reset() }

// Step implements attn.Decoder. Position i of a step's n sees the
// sequence's earlier positions and positions 0..i of the step; padding
// positions (valid) are neither appended nor attended, with out 0 and lse
// -Inf. Rows see NaN and infinities as in Forward: a non-finite key or
// value makes every later row of its sequence and kv head NaN, until
// Reset.
func (d *Decoder) Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error {
	cfg := d.cfg
	if err := cfg.CheckStep(q, k, v, n, valid, out, lse); err != nil {
		return err
	}
	count := func(b int) int {
		if valid == nil {
			return n
		}
		return valid[b]
	}
	if cfg.MaxLen > 0 {
		for b := range cfg.B {
			if l := d.st.Len(b); count(b) > cfg.MaxLen-l {
				return fmt.Errorf("%w: linear: sequence %d: %d + %d positions exceed MaxLen = %d", attn.ErrFull, b, l, count(b), cfg.MaxLen)
			}
		}
	}
	var next atomic.Int32
	return parallel.For(ctx, len(d.works), cfg.B*cfg.HKV,
		func() *work { return d.works[next.Add(1)-1] },
		func(w *work, pair int) error {
			return d.st.step(ctx, w, pair, q, k, v, n, count(pair/cfg.HKV), out, lse)
		})
}

// step advances one (batch row, kv head) of st by the first nb of n
// positions, attending the queries of the kv head's group causally, and
// writes the rest of the group's rows as padding. The layouts are those
// of Decoder.Step.
func (st *State) step(ctx context.Context, w *work, pair int, q, k, v []float32, n, nb int, out, lse []float32) error {
	b, kvh := pair/st.hkv, pair%st.hkv
	g, d := st.h/st.hkv, st.d
	pre := &st.pre[pair]
	first := (b*st.h + kvh*g) * n // the group's first query row
	off := pre.n
	t := span{
		q: q[first*d:], out: out[first*d:], stride: n, nh: g, nq: nb,
		k: k[pair*n*d:][:nb*d], v: v[pair*n*d:][:nb*d],
		off: off, kend: off + nb,
		vis:   func(i int) int { return off + i + 1 },
		scale: st.scale,
	}
	if lse != nil {
		t.lse = lse[first:]
	}
	if err := w.sweep(ctx, pre, &t); err != nil {
		return err
	}
	w.advance(pre, t.k, t.v, off, off+nb, st.scale)
	for hh := range g {
		clear(t.out[(hh*n+nb)*d : (hh+1)*n*d])
		if t.lse != nil {
			for i := nb; i < n; i++ {
				t.lse[hh*n+i] = float32(math.Inf(-1))
			}
		}
	}
	return nil
}
