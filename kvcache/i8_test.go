package kvcache

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/ref"
)

// TestI8Storage checks that an I8 cache stores what lowbit.QuantI8 gives, in the
// ring buffer and across regrowths: each position's row read back with at
// is within scale/2 of what was appended.
func TestI8Storage(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const d = 70
	for _, cfg := range []Config{{Capacity: 1}, {Window: 5, Sinks: 2}} {
		cfg.B, cfg.HKV, cfg.D, cfg.DType = 2, 3, d, I8
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if c.stride%64 != 0 || c.stride < d {
			t.Fatalf("stride %d for D = %d", c.stride, d)
		}
		if want := 2 * 2 * 3 * c.cap * (c.stride + 4); c.Bytes() != want {
			t.Errorf("Bytes %d, want %d", c.Bytes(), want)
		}
		const n = 40
		k, v := ref.Normal(rng, 6*n*d), ref.Normal(rng, 6*n*d)
		// Position 3 is all zeros; position 4 has one huge value.
		for h := range 6 {
			clear(k[(h*n+3)*d:][:d])
			clear(v[(h*n+3)*d:][:d])
			k[(h*n+4)*d+5] = 1e30
			v[(h*n+4)*d+6] = -1e30
		}
		for p := range n {
			kp, vp := make([]float32, 6*d), make([]float32, 6*d)
			for h := range 6 {
				copy(kp[h*d:][:d], k[(h*n+p)*d:][:d])
				copy(vp[h*d:][:d], v[(h*n+p)*d:][:d])
			}
			if err := c.Append(kp, vp, 1); err != nil {
				t.Fatal(err)
			}
		}
		for h := range 6 {
			for p := range n {
				if cfg.Window > 0 && p >= cfg.Sinks && p < n-cfg.Window {
					continue
				}
				r := h*c.cap + c.slot(p)
				for i := range d {
					for _, kv := range []struct {
						v     bool
						x     []float32
						scale float32
					}{{false, k, c.ks[r]}, {true, v, c.vs[r]}} {
						want := kv.x[(h*n+p)*d+i]
						got := c.at(kv.v, r*c.stride+i)
						if err := math.Abs(float64(got - want)); !(err <= float64(kv.scale)*(0.5+1e-5)) {
							t.Fatalf("%+v head %d position %d [%d]: %v stored as %v (scale %v)", cfg, h, p, i, want, got, kv.scale)
						}
					}
				}
			}
		}
	}
}

// dequantized returns x ([heads][n][d]) with each row replaced by its
// codes times its scale: what an I8 cache stores.
func dequantized(x []float32, d int) []float32 {
	y := make([]float32, len(x))
	q := make([]int8, d)
	for r := 0; r < len(x); r += d {
		scale := lowbit.QuantI8(q, x[r:][:d])
		for i, c := range q {
			y[r+i] = float32(c) * scale
		}
	}
	return y
}

// TestI8Extremes decodes from an I8 cache holding rows of zeros and rows
// with one huge value (1e30, whose row's other values all round to code 0;
// in a key, a logit of about 1e29), step by step and with Attend, through the streaming
// kernels (4 query heads a KV head), the fused ones (32) and the row path
// of large groups (32, with a window). The outputs must be finite, and
// match attention on what the cache stores (each row dequantised; in a
// step, the new position's own key and value in float32) to float32
// rounding: these rows are far from Gaussian, and their quantisation
// error is no longer what tolFor(I8) bounds.
func TestI8Extremes(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const d, n, tol = 36, 90, 1e-4
	for _, sh := range []struct{ h, w int }{{4, 0}, {32, 0}, {32, 50}} {
		sq := newSeq(rng, 1, sh.h, 1, n, d)
		for p := 10; p+2 < n; p += 13 {
			clear(sq.k[p*d:][:d]) // a zero key row: logit 0
			clear(sq.v[(p+1)*d:][:d])
			sq.v[(p+2)*d+7] = -1e30
		}
		// One key with a huge logit: all of the weight (or none) from
		// step 40 on. (Two would make which of them wins a matter of
		// float32 rounding at 1e29.)
		sq.k[40*d+2] = 1e30
		kq, vq := dequantized(sq.k, d), dequantized(sq.v, d)
		cfg := Config{B: 1, HKV: 1, D: d, DType: I8, Window: sh.w}
		c, _ := New(cfg)
		finite := func(what string, x []float32) {
			t.Helper()
			for i, v := range x {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%+v %s: [%d] is %v", sh, what, i, v)
				}
			}
		}
		for p := range n {
			out := make([]float32, sh.h*d)
			lse := make([]float32, sh.h)
			err := c.Step(context.Background(), sh.h, sq.slice(sq.q, sh.h, p, p+1), sq.slice(sq.k, 1, p, p+1),
				sq.slice(sq.v, 1, p, p+1), 1, attn.Options{}, out, lse)
			if err != nil {
				t.Fatal(err)
			}
			finite(fmt.Sprintf("step %d out", p), out)
			finite(fmt.Sprintf("step %d lse", p), lse)
			// The reference on the stored rows before p, p's own in float32.
			stored := seq{sq.s, sq.q, append(kq[:p*d:p*d], sq.k[p*d:]...), append(vq[:p*d:p*d], sq.v[p*d:]...)}
			wantOut, wantLSE := stored.want(p, p+1, sh.w, 0)
			if e := ref.RelErr(out, wantOut); e > tol {
				t.Fatalf("%+v step %d: out rel err %.3g", sh, p, e)
			}
			if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
				t.Fatalf("%+v step %d: lse rel err %.3g %v", sh, p, e, err)
			}
		}
		out := make([]float32, sh.h*d)
		lse := make([]float32, sh.h)
		if err := c.Attend(context.Background(), sh.h, sq.slice(sq.q, sh.h, n-1, n), attn.Options{}, out, lse); err != nil {
			t.Fatal(err)
		}
		finite("Attend out", out)
		finite("Attend lse", lse)
		wantOut, wantLSE := seq{sq.s, sq.q, kq, vq}.want(n-1, n, sh.w, 0)
		if e := ref.RelErr(out, wantOut); e > tol {
			t.Errorf("%+v Attend: out rel err %.3g", sh, e)
		}
		if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
			t.Errorf("%+v Attend: lse rel err %.3g %v", sh, e, err)
		}
	}
}
