package flash

import (
	"context"
	"fmt"

	"github.com/attnkit/attn"
)

// KV is key/value storage the kernel reads one tile at a time, so that
// caches with their own layout or element type (a KV cache in bf16, a ring
// buffer) run through the same kernel without being copied out first. The
// kernel calls each method once per tile, never per element.
type KV interface {
	// PackK writes keys [j0, j0+n) of kv head kvh in batch row b,
	// transposed, as float32: element c of key j0+j goes to dst[c*ld+j].
	PackK(dst []float32, ld, b, kvh, j0, n int)
	// PackV writes values [j0, j0+n) as float32 rows: element c of value
	// j0+j goes to dst[j*ld+c]. Columns past D are left as they are.
	PackV(dst []float32, ld, b, kvh, j0, n int)
}

// ForwardKV is ForwardPattern with keys and values read from kv, which must
// hold s.B·s.HKV heads of s.M positions. pat may be nil for dense
// attention.
func (kn *Kernel) ForwardKV(ctx context.Context, s attn.Shape, q []float32, kv KV, o attn.Options, pat Pattern, out, lse []float32) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if len(q) != s.QLen() || len(out) != s.QLen() || (lse != nil && len(lse) != s.LSELen()) {
		return fmt.Errorf("%w: ForwardKV wants len(Q) = len(out) = B·H·N·D = %d and len(lse) = B·H·N = %d, got %d, %d, %d",
			attn.ErrShape, s.QLen(), s.LSELen(), len(q), len(out), len(lse))
	}
	if err := o.Check(s); err != nil {
		return err
	}
	if kv == nil {
		return fmt.Errorf("%w: nil KV", attn.ErrInput)
	}
	if pat == nil {
		pat = dense{}
	}
	return kn.forward(ctx, s, q, kv, o, pat, out, lse)
}

// denseKV is the layout of the attn package: K, V[B][Hkv][M][D].
type denseKV struct {
	s    attn.Shape
	k, v []float32
}

func (kv denseKV) PackK(dst []float32, ld, b, kvh, j0, n int) {
	d := kv.s.D
	k := kv.k[((b*kv.s.HKV+kvh)*kv.s.M+j0)*d:][:n*d]
	for j := range n {
		for c, x := range k[j*d : (j+1)*d] {
			dst[c*ld+j] = x
		}
	}
}

func (kv denseKV) PackV(dst []float32, ld, b, kvh, j0, n int) {
	d := kv.s.D
	v := kv.v[((b*kv.s.HKV+kvh)*kv.s.M+j0)*d:][:n*d]
	for j := range n {
		copy(dst[j*ld:][:d], v[j*d:(j+1)*d])
	}
}
