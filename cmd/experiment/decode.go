package experiment

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/registry"
)

// decodeSeries names the growth series of a mechanism's decode rows of
// one cache configuration.
func decodeSeries(mech string, hkv int, dtype string) string {
	return fmt.Sprintf("%s decode hkv=%d %s", mech, hkv, dtype)
}

// decode times one decode step of each mechanism's incremental decoder
// (registry.NewDecoder) for each cache length n, head count and storage
// type: the decoder is filled with n positions, then one Step appends a
// new position and attends its query of every head to all n+1. Each
// timed step has a query of its own (decodeQueries of them, in turn): a
// decoder that reads a fraction of the cache chosen by the query (quest,
// magicpig) could otherwise find the last step's rows in the processor's
// cache, which a generated token's new query does not. Decoders
// that take positions without attending them (attn.Appender) are filled
// in one Append, as after an exact prefill; others through Step, in
// chunks of decodeChunk positions. Mechanisms without a decoder get a
// skipped row saying why. Errors are against exact attention over the
// same n+1 float32 keys and values.
func (sw *sweep) decode(ctx context.Context, mechs []mechanism) ([]eval.Row, error) {
	cfg := sw.cfg
	var plan []rowKey
	for _, hkv := range cfg.HKVs {
		for _, n := range cfg.Ns {
			for _, dtype := range cfg.DTypes {
				for _, mech := range mechs {
					plan = append(plan, rowKey{mech: mech.name, causal: true, dtype: dtype,
						s: attn.Shape{B: cfg.B, H: cfg.H, HKV: hkv, N: 1, M: n, D: cfg.D}})
				}
			}
		}
	}
	var rows []eval.Row
	step := 0
	for _, hkv := range cfg.HKVs {
		for _, n := range cfg.Ns {
			s := attn.Shape{B: cfg.B, H: cfg.H, HKV: hkv, N: 1, M: n, D: cfg.D}
			var in *decodeInputs
			for _, dtype := range cfg.DTypes {
				dt, _, _ := kvcache.ParseStorage(dtype)
				for _, mech := range mechs {
					row := eval.Row{
						Mode: Decode, Mech: mech.name, B: s.B, H: s.H, HKV: hkv, N: n, M: n, D: s.D,
						Causal: true, DType: dtype, Params: mech.paramsFor(true),
					}
					sw.begin(fmt.Sprintf("decode %s hkv=%d %s n=%d", mech.name, hkv, dtype, n), plan, step)
					step++
					resident := decodeResident(s)
					cache := float64(kvBytes(s, dt))
					switch {
					case mech.m == nil:
						row.Skipped = "the float64 reference has no decoder"
					case cfg.MemBudget > 0 && resident+cache > cfg.MemBudget:
						row.Skipped = fmt.Sprintf("inputs and cache need %s > -mem-budget %s", fmtGiB(resident+cache), fmtGiB(cfg.MemBudget))
					}
					if row.Skipped != "" {
						rows = append(rows, row)
						sw.prog.End("skipped: " + row.Skipped)
						continue
					}
					if in == nil {
						var err error
						if in, err = newDecodeInputs(ctx, s, cfg.Seed, cfg.Workers); err != nil {
							return rows, err
						}
					}
					t := time.Now()
					err := sw.decodeRow(ctx, &row, mech, s, dtype, in)
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
					default:
						sw.prog.End("")
						// The whole row's time, fill included, per call: what
						// progress needs to forecast the next length.
						sw.growthOf(decodeSeries(mech.name, hkv, dtype), true).Add(n, time.Since(t).Seconds()/float64(2+row.Reps), 0)
					}
				}
			}
		}
	}
	return rows, nil
}

// decodeChunk is the length of the Step calls that fill a decoder other
// than exact attention's KV cache: long enough that the fill runs at the
// speed of a prefill, short enough that its buffers stay small.
const decodeChunk = 256

// decodeQueries is the number of queries the timed steps of a decode row
// take in turn: more than a row's usual repetitions.
const decodeQueries = 16

// decodeInputs are the inputs of the decode rows of one cache length and
// head count: the n positions that fill the decoder (kp, vp [B][Hkv][n][D];
// qc, random queries of one fill chunk), the new position (q1 [B][H][1][D],
// k1, v1 [B][Hkv][1][D]), exact attention of q1 over all n+1 keys, and
// the timed steps' queries (qs [decodeQueries][B][H][1][D]).
type decodeInputs struct {
	kp, vp, qc, q1, k1, v1 []float32
	want                   []float32
	qs                     []float32
}

// decodeResident is the bytes decodeInputs and a row's buffers hold for
// shape s (N = 1, M = n).
func decodeResident(s attn.Shape) float64 {
	fill := s.B * s.H * decodeChunk * s.D
	fillKV := s.B * s.HKV * decodeChunk * s.D
	return 4 * float64(2*s.KVLen()+2*fill+2*fillKV+(5+decodeQueries)*s.QLen())
}

func newDecodeInputs(ctx context.Context, s attn.Shape, seed uint64, workers int) (*decodeInputs, error) {
	rng := rand.New(rand.NewPCG(seed, uint64(s.M)))
	one := attn.Shape{B: s.B, H: s.H, HKV: s.HKV, N: 1, M: 1, D: s.D}
	in := &decodeInputs{
		q1: ref.Normal(rng, s.QLen()), kp: ref.Normal(rng, s.KVLen()), vp: ref.Normal(rng, s.KVLen()),
		k1: ref.Normal(rng, one.KVLen()), v1: ref.Normal(rng, one.KVLen()),
		qc: ref.Normal(rng, s.B*s.H*min(decodeChunk, s.M)*s.D),
	}
	in.qs = ref.Normal(rng, decodeQueries*s.QLen())
	// Exact attention over the n+1 keys: over the n, merged by lse with
	// the new one, so that no copy of all n+1 is needed.
	o := attn.Options{Workers: workers}
	out, lse, err := flash.Attention(ctx, s, in.q1, in.kp, in.vp, o)
	if err != nil {
		return nil, err
	}
	out1, lse1, err := flash.Attention(ctx, one, in.q1, in.k1, in.v1, o)
	if err != nil {
		return nil, err
	}
	if err := attn.Merge(out, lse, out1, lse1, s.D); err != nil {
		return nil, err
	}
	in.want = out
	return in, nil
}

// decodeRow fills a decoder of mech with in's n positions, steps it once
// for the error and then times Step on one new position. The decoder's
// own errors and panics make a skipped row; only ctx ending is returned.
func (sw *sweep) decodeRow(ctx context.Context, row *eval.Row, mech mechanism, s attn.Shape, dtype string, in *decodeInputs) error {
	n := s.M
	// Every call appends a position: the error's step, the warm-up and
	// the timed ones.
	dcfg := attn.DecodeConfig{B: s.B, H: s.H, HKV: s.HKV, D: s.D, Workers: sw.cfg.Workers, Storage: dtype, MaxLen: n + sw.cfg.Reps + 2}
	d, err := registry.NewDecoder(mech.m, dcfg)
	switch {
	case errors.Is(err, attn.ErrUnsupported):
		row.Skipped = "no decoder: " + err.Error()
		return nil
	case err != nil:
		row.Skipped = "error: " + err.Error()
		return nil
	}
	if err := sw.fillDecoder(ctx, row, mech, d, s, in); err != nil || row.Skipped != "" {
		return err
	}
	out, lse := make([]float32, s.QLen()), make([]float32, s.LSELen())
	step := func() error { return d.Step(ctx, in.q1, in.k1, in.v1, 1, nil, out, lse) }
	if err := eval.Guard(step); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		row.Skipped = "error: " + err.Error()
		return nil
	}
	e := eval.RelFrobenius(out, in.want)
	// The mechanism's own rule (FallbackOf) is Forward's and need not be
	// its decoder's (reformer's never falls back): only a decoder that
	// says so itself, for a step of one position onto n, marks the row.
	if f, ok := d.(attn.Fallbacker); ok {
		step := attn.Shape{B: s.B, H: s.H, HKV: s.HKV, N: 1, M: n + 1, D: s.D}
		row.Fallback = f.Fallback(step, attn.Options{Causal: true, Workers: sw.cfg.Workers})
	}
	calls := 0
	timed := func() error {
		q := in.qs[calls%decodeQueries*s.QLen():][:s.QLen()]
		calls++
		return d.Step(ctx, q, in.k1, in.v1, 1, nil, out, lse)
	}
	if err := sw.measure(ctx, row, timed); err != nil || row.Skipped != "" {
		return err
	}
	row.GFlops, row.GBps = 0, 0
	if mech.name == "exact" {
		dt, _, _ := kvcache.ParseStorage(dtype)
		row.GBps = float64(kvBytes(s, dt)) / row.Seconds / 1e9
		row.GFlops = eval.GFlops(eval.ExactFlops(s, false), row.Seconds)
	}
	row.RelErr = &e
	return nil
}

// fillDecoder appends in's n positions to d: in one Append where the
// decoder takes positions without attending them (exact attention's KV
// cache, HyperAttention's buckets: the cache a prefill would leave),
// through Step in chunks for any other, forecast and timed as a series of
// its own so that a slow fill is skipped under the budgets like a slow
// row.
func (sw *sweep) fillDecoder(ctx context.Context, row *eval.Row, mech mechanism, d attn.Decoder, s attn.Shape, in *decodeInputs) error {
	n := s.M
	if ap, ok := d.(attn.Appender); ok {
		if err := eval.Guard(func() error { return ap.Append(ctx, in.kp, in.vp, n, nil) }); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			row.Skipped = "error filling the decoder: " + err.Error()
		}
		return nil
	}
	series := mech.name + " (decoder fill)"
	if row.Skipped = sw.plan(series, attn.Shape{B: s.B, H: s.H, HKV: s.HKV, N: n, M: n, D: s.D}, true, 0); row.Skipped != "" {
		row.Skipped = "filling the decoder: " + row.Skipped
		return nil
	}
	c := min(decodeChunk, n)
	k := make([]float32, s.B*s.HKV*c*s.D)
	v := make([]float32, len(k))
	out := make([]float32, s.B*s.H*c*s.D)
	t := time.Now()
	for p := 0; p < n; p += c {
		m := min(c, n-p)
		// k and v of positions [p, p+m), [B][Hkv][m][D].
		for bh := range s.B * s.HKV {
			copy(k[bh*m*s.D:][:m*s.D], in.kp[(bh*n+p)*s.D:][:m*s.D])
			copy(v[bh*m*s.D:][:m*s.D], in.vp[(bh*n+p)*s.D:][:m*s.D])
		}
		nq, nkv := s.B*s.H*m*s.D, s.B*s.HKV*m*s.D
		err := eval.Guard(func() error { return d.Step(ctx, in.qc[:nq], k[:nkv], v[:nkv], m, nil, out[:nq], nil) })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			row.Skipped = fmt.Sprintf("error filling the decoder at position %d: %v", p, err)
			return nil
		}
	}
	sw.growthOf(series, true).Add(n, time.Since(t).Seconds(), 0)
	return nil
}

// kvBytes is the size of the keys and values of a cache of type dt for
// shape s, which a decode step reads: the codes, and with i8 the float32
// scale of each row, with i4 the float32 scale and zero of each group of
// 64 (keys: 64 positions of a channel; values: 64 channels of a
// position).
func kvBytes(s attn.Shape, dt kvcache.DType) int {
	n := 2 * s.KVLen() * dt.Bits() / 8
	rows := s.B * s.HKV * s.M
	switch dt {
	case kvcache.I8:
		n += 2 * rows * 4
	case kvcache.I4:
		groups := func(x int) int { return (x + 63) / 64 }
		n += 8 * (s.B*s.HKV*s.D*groups(s.M) + rows*groups(s.D))
	}
	return n
}
