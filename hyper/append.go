package hyper

import (
	"context"
	"fmt"
	"math"

	"github.com/attnkit/attn"
)

// Append implements attn.Appender: the keys and values are stored and
// hashed, no query is attended, so a prompt can be prefilled by Forward
// (or not at all, when only the cache matters) and decoded from there by
// the decode rule. A failed append leaves every sequence as it was.
func (d *Decoder) Append(ctx context.Context, k, v []float32, n int, valid []int) error {
	cfg := d.cfg
	if err := cfg.CheckAppend(k, v, n, valid); err != nil {
		return err
	}
	count := func(b int) int {
		if valid == nil {
			return n
		}
		return valid[b]
	}
	for b := range cfg.B {
		end := d.lens[b] + count(b)
		switch {
		case cfg.MaxLen > 0 && end > cfg.MaxLen:
			return fmt.Errorf("%w: hyper: sequence %d would hold %d positions, MaxLen = %d", attn.ErrFull, b, end, cfg.MaxLen)
		case end > math.MaxInt32:
			return fmt.Errorf("%w: hyper: sequence %d would hold %d positions, past 2^31-1", attn.ErrUnsupported, b, end)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d.rot != nil {
		d.rk, d.rv = d.rot.Copy(d.rk, k), d.rot.Copy(d.rv, v)
		k, v = d.rk, d.rv
	}
	dd := cfg.D
	sc := d.getScratch()
	for b := range cfg.B {
		nb := count(b)
		for kvh := range cfg.HKV {
			src := (b*cfg.HKV + kvh) * n * dd
			d.store(sc, d.heads[b*cfg.HKV+kvh], d.lens[b], k[src:src+nb*dd], v[src:src+nb*dd])
		}
	}
	d.mu.Lock()
	d.free = append(d.free, d.used...)
	d.used = d.used[:0]
	d.mu.Unlock()
	for b := range cfg.B {
		d.lens[b] += count(b)
	}
	return nil
}

var _ attn.Appender = (*Decoder)(nil)
