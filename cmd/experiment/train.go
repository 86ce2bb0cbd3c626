package experiment

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/registry"
)

// Train is the bench mode of a forward and a backward pass per call, as
// training takes them.
const Train = "train"

// TrainFlopsFactor is what a forward and a backward pass of exact
// attention cost in flops against the forward alone: the backward's
// five products against the forward's two, FlashAttention's accounting.
const TrainFlopsFactor = 3.5

// train times each mechanism's forward and backward passes at each length
// and mask: Seconds is both, ForwardSeconds the forward alone, and
// BackwardRatio the backward's time over the forward's. Gradient errors
// (dq, dk and dv together) are against exact attention's; exact's own
// are against the float64 reference's (ref.AttentionBackward), where it
// is small enough to run.
func (sw *sweep) train(ctx context.Context, mechs []mechanism) ([]eval.Row, error) {
	cfg := sw.cfg
	var plan []rowKey
	for _, n := range cfg.Ns {
		for _, causal := range cfg.Causal {
			for _, mech := range mechs {
				if mech.name != Ref {
					plan = append(plan, rowKey{mech: mech.name, causal: causal,
						s: attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: n, M: n, D: cfg.D}})
				}
			}
		}
	}
	var rows []eval.Row
	step := 0
	for _, n := range cfg.Ns {
		s := attn.Shape{B: cfg.B, H: cfg.H, HKV: cfg.HKV, N: n, M: n, D: cfg.D}
		// Inputs, dout, one forward's out and lse, three gradients, and
		// exact's gradients kept as the baseline.
		resident := 4 * float64(5*s.KVLen()+4*s.QLen()+s.LSELen())
		for _, causal := range cfg.Causal {
			o := attn.Options{Causal: causal, Workers: cfg.Workers}
			var in *eval.Inputs
			var dout []float32
			fits := cfg.MemBudget == 0 || resident <= cfg.MemBudget
			if fits {
				var err error
				if in, err = cfg.inputs(s, causal, cfg.Seed+uint64(n)); err != nil {
					return rows, err
				}
				dout = ref.Normal(rand.New(rand.NewPCG(cfg.Seed, uint64(n))), s.QLen())
			}
			var base []float32 // exact's dq, dk, dv
			for _, mech := range orderForBaseline(mechs) {
				if mech.name == Ref {
					continue
				}
				mask := "full"
				if causal {
					mask = "causal"
				}
				sw.begin(fmt.Sprintf("%s n=%d %s fwd+bwd", mech.name, n, mask), plan, step)
				step++
				row := eval.Row{Mode: Train, Mech: mech.name, B: s.B, H: s.H, HKV: s.HKV, N: n, M: n, D: s.D,
					Causal: causal, DType: "f32", Params: mech.paramsFor(causal)}
				var grads []float32
				var err error
				switch {
				case !fits:
					row.Skipped = fmt.Sprintf("inputs and gradients need %s > -mem-budget %s", fmtGiB(resident), fmtGiB(cfg.MemBudget))
				default:
					grads, err = sw.trainRow(ctx, &row, mech, s, o, in, dout, resident)
				}
				if err != nil {
					row = interrupted(row)
				}
				rows = append(rows, row)
				switch {
				case err != nil:
					sw.prog.End("interrupted")
					return rows, err
				case row.Skipped != "":
					sw.prog.End("skipped: " + row.Skipped)
					continue
				default:
					sw.prog.End("")
					sw.growthOf(mech.name+" (train)", causal).Add(n, row.Seconds, row.ExtraBytes)
				}
				if mech.name == "exact" {
					base = grads
					if n <= 1024 {
						e := refGradErr(s, o, in, dout, grads)
						row := &rows[len(rows)-1]
						row.RelErr = &e
					}
				} else if base != nil {
					e := relErr32(grads, base)
					rows[len(rows)-1].RelErr = &e
				}
			}
		}
	}
	return rows, nil
}

// trainRow times mech's forward alone and its forward with a backward,
// and returns the gradients dq, dk, dv, concatenated.
func (sw *sweep) trainRow(ctx context.Context, row *eval.Row, mech mechanism, s attn.Shape, o attn.Options, in *eval.Inputs, dout []float32, resident float64) ([]float32, error) {
	d, err := registry.Differentiable(mech.m)
	if err != nil {
		row.Skipped = "no backward pass: " + err.Error()
		return nil, nil
	}
	if row.Skipped = sw.plan(mech.name+" (train)", s, o.Causal, resident); row.Skipped != "" {
		return nil, nil
	}
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	grads := make([]float32, s.QLen()+2*s.KVLen())
	dq, dk, dv := grads[:s.QLen()], grads[s.QLen():s.QLen()+s.KVLen()], grads[s.QLen()+s.KVLen():]
	var fwd eval.Row
	if err := sw.measure(ctx, &fwd, func() error { return mech.m.Forward(ctx, s, in.Q, in.K, in.V, o, out, lse) }); err != nil || fwd.Skipped != "" {
		row.Skipped = fwd.Skipped
		return nil, err
	}
	err = sw.measure(ctx, row, func() error {
		if err := mech.m.Forward(ctx, s, in.Q, in.K, in.V, o, out, lse); err != nil {
			return err
		}
		return d.Backward(ctx, s, in.Q, in.K, in.V, out, lse, dout, o, dq, dk, dv)
	})
	if err != nil || row.Skipped != "" {
		return nil, err
	}
	// The backward alone (out and lse are the last forward's), so that
	// the ratio is of two medians and never the difference of two, which
	// the noise of short calls can make negative.
	var bwd eval.Row
	if err := sw.measure(ctx, &bwd, func() error {
		return d.Backward(ctx, s, in.Q, in.K, in.V, out, lse, dout, o, dq, dk, dv)
	}); err != nil {
		return nil, err
	}
	row.Fallback = mech.fallback(s, o)
	row.ForwardSeconds = fwd.Seconds
	if fwd.Seconds > 0 && bwd.Skipped == "" {
		row.BackwardRatio = bwd.Seconds / fwd.Seconds
	}
	row.GFlops = 0
	if mech.name == "exact" {
		row.GFlops = eval.GFlops(TrainFlopsFactor*eval.ExactFlops(s, o.Causal), row.Seconds)
	}
	return grads, nil
}

// refGradErr is the relative error of exact's gradients against the
// float64 reference's.
func refGradErr(s attn.Shape, o attn.Options, in *eval.Inputs, dout, grads []float32) float64 {
	spec := ref.Spec{Scale: float64(o.Scale), Mask: ref.Mask(s, o)}
	dq, dk, dv, err := ref.AttentionBackward(s, in.Q, in.K, in.V, dout, spec)
	if err != nil {
		return math.NaN()
	}
	return ref.RelErr(grads, append(append(dq, dk...), dv...))
}

// relErr32 is ‖a−b‖/‖b‖ in float64.
func relErr32(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
