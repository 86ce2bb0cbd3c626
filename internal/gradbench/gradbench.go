// Package gradbench times a mechanism's forward and backward passes, for
// the backward benchmarks of the mechanisms' packages.
package gradbench

import (
	"context"
	"testing"
	"time"

	"github.com/attnkit/attn"
)

// Mechanism is a mechanism with a backward pass.
type Mechanism interface {
	attn.Mechanism
	attn.Differentiable
}

// Run times m's forward pass on q, k and v and its backward pass with
// the gradient g, alternating the two in one loop so that both see the
// same machine load, and reports their mean times (fwd-ms, bwd-ms) and
// the ratio of the means (bwd/fwd).
func Run(b *testing.B, m Mechanism, s attn.Shape, o attn.Options, q, k, v, g []float32) {
	b.Helper()
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	dq, dk, dv := make([]float32, s.QLen()), make([]float32, s.KVLen()), make([]float32, s.KVLen())
	ctx := context.Background()
	var tf, tb time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := m.Forward(ctx, s, q, k, v, o, out, lse); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := m.Backward(ctx, s, q, k, v, out, lse, g, o, dq, dk, dv); err != nil {
			b.Fatal(err)
		}
		tf += t1.Sub(t0)
		tb += time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(tf.Seconds()/n*1e3, "fwd-ms")
	b.ReportMetric(tb.Seconds()/n*1e3, "bwd-ms")
	b.ReportMetric(tb.Seconds()/tf.Seconds(), "bwd/fwd")
}
