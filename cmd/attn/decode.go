package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/eval"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/ref"
)

// decodeDefaults sets what `attn bench -mode decode` sweeps when the flags
// do not say: one query per head (H = 32, D = 128) against caches of 1k to
// 64k positions, MHA-like Hkv = 8 and MQA Hkv = 1, float32 and bfloat16
// storage (-dtype picks one of f32, bf16, f16 and i8 instead; head counts
// that do not divide H are left out). set holds the flags given on the
// command line.
func decodeDefaults(cfg *benchConfig, set map[string]bool) error {
	if !set["n"] {
		cfg.ns = []int{1024, 4096, 16384, 65536}
	}
	if !set["h"] {
		cfg.h = 32
	}
	if !set["d"] {
		cfg.d = 128
	}
	if !set["mech"] {
		cfg.mechs = []string{"exact"}
	}
	cfg.hkvs = nil
	for _, hkv := range []int{8, 1} {
		if hkv <= cfg.h && cfg.h%hkv == 0 {
			cfg.hkvs = append(cfg.hkvs, hkv)
		}
	}
	if set["hkv"] {
		cfg.hkvs = []int{cfg.hkv}
		if cfg.hkv == 0 {
			cfg.hkvs = []int{cfg.h}
		}
	}
	cfg.dtypes = []string{cfg.dtype}
	if !set["dtype"] {
		cfg.dtypes = []string{"f32", "bf16"}
	}
	for _, t := range cfg.dtypes {
		if _, err := kvcache.ParseDType(t); err != nil {
			return fmt.Errorf("-dtype %q: want f32, bf16, f16 or i8", t)
		}
	}
	for _, hkv := range cfg.hkvs {
		if err := (attn.Shape{B: cfg.b, H: cfg.h, HKV: hkv, N: 1, M: 1, D: cfg.d}).Validate(); err != nil {
			return err
		}
	}
	cfg.causal = []bool{true}
	return nil
}

// setFlags returns the names of the flags given on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// decode times one decode step (package kvcache, Cache.Attend) for each
// cache length, head count and storage type: the newest position's query
// of every head against the whole cache. The rows report the K/V bytes
// read per second; their error is against exact attention on the float32
// keys and values the cache was filled from.
func (sw *sweep) decode(ctx context.Context, mechs []mechanism) ([]eval.Row, error) {
	cfg := sw.cfg
	var rows []eval.Row
	for _, hkv := range cfg.hkvs {
		for _, n := range cfg.ns {
			s := attn.Shape{B: cfg.b, H: cfg.h, HKV: hkv, N: 1, M: n, D: cfg.d}
			var q, k, v []float32
			var want []float64
			for _, dtype := range cfg.dtypes {
				dt, _ := kvcache.ParseDType(dtype)
				for _, mech := range mechs {
					row := eval.Row{
						Mode: "decode", Mech: mech.name, B: s.B, H: s.H, HKV: hkv, N: n, M: n, D: s.D,
						Causal: true, DType: dtype, Params: mech.params,
					}
					sw.prog.begin(fmt.Sprintf("decode %s hkv=%d %s n=%d", mech.name, hkv, dtype, n))
					inputs := float64(4 * (2*s.KVLen() + 2*s.QLen()))
					cache := float64(kvBytes(s, dt))
					switch {
					case mech.name != "exact":
						row.Skipped = "the decode benchmark times exact attention from the KV cache only"
					case inputs+cache > cfg.memBudget:
						row.Skipped = fmt.Sprintf("inputs and cache need %s > -mem-budget %s", fmtGiB(inputs+cache), fmtGiB(cfg.memBudget))
					}
					if row.Skipped != "" {
						rows = append(rows, row)
						sw.prog.end("skipped: " + row.Skipped)
						continue
					}
					if q == nil {
						rng := rand.New(rand.NewPCG(cfg.seed, uint64(n)))
						q, k, v = ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
						out, _, err := flash.Attention(ctx, s, q, k, v, attn.Options{Workers: cfg.workers})
						if err != nil {
							return rows, err
						}
						want = widen(out)
					}
					err := sw.decodeRow(ctx, &row, s, dt, q, k, v, want)
					rows = append(rows, row)
					if err != nil {
						sw.prog.end("interrupted")
						return rows, err
					}
					sw.prog.end(row.Skipped)
				}
			}
		}
	}
	return rows, nil
}

// decodeRow fills a cache of type dt with k and v and times Attend.
func (sw *sweep) decodeRow(ctx context.Context, row *eval.Row, s attn.Shape, dt kvcache.DType, q, k, v []float32, want []float64) error {
	c, err := kvcache.New(kvcache.Config{B: s.B, HKV: s.HKV, D: s.D, DType: dt, Capacity: s.M})
	if err == nil {
		err = c.Append(k, v, s.M)
	}
	if err != nil {
		row.Skipped = "error: " + err.Error()
		return nil
	}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	o := attn.Options{Workers: sw.cfg.workers}
	if err := sw.measure(ctx, row, func() error { return c.Attend(ctx, s.H, q, o, out, lse) }); err != nil || row.Skipped != "" {
		return err
	}
	row.GBps = float64(kvBytes(s, dt)) / row.Seconds / 1e9
	row.GFlops = eval.GFlops(eval.ExactFlops(s, false), row.Seconds)
	e := ref.RelErr(out, want)
	row.RelErr = &e
	return nil
}

// kvBytes is the size of the keys and values of a cache of type dt for
// shape s, which a decode step reads: with i8, the codes and the float32
// scale of each row.
func kvBytes(s attn.Shape, dt kvcache.DType) int {
	n := 2 * s.KVLen() * dt.Size()
	if dt == kvcache.I8 {
		n += 2 * s.B * s.HKV * s.M * 4
	}
	return n
}

func widen(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}
