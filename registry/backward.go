package registry

import (
	"context"
	"fmt"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// Differentiable returns the backward pass of m, a mechanism this
// registry built: its own (attn.Differentiable), or for exact attention
// the fused backward of package flash. A mechanism without one gives an
// error wrapping attn.ErrUnsupported.
func Differentiable(m attn.Mechanism) (attn.Differentiable, error) {
	if d, ok := m.(attn.Differentiable); ok {
		return d, nil
	}
	if k, ok := m.(*flash.Kernel); ok {
		return exactBackward{k}, nil
	}
	return nil, fmt.Errorf("%w: %s has no backward pass", attn.ErrUnsupported, m.Name())
}

// exactBackward is flash's backward without a pattern.
type exactBackward struct{ k *flash.Kernel }

func (e exactBackward) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	return e.k.Backward(ctx, s, q, k, v, out, lse, dout, o, nil, dq, dk, dv)
}
