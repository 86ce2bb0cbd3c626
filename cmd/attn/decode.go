package main

import (
	"github.com/attnkit/attn/cmd/experiment"
)

// decodeDefaults sets what `attn bench -mode decode` sweeps when the flags
// do not say: one query per head (H = 32, D = 128) against caches of 1k to
// 64k positions, MHA-like Hkv = 8 and MQA Hkv = 1, float32 and bfloat16
// storage (-dtype picks one or a list of f32, bf16, f16, i8 and i4
// instead; head counts that do not divide H are left out). set holds the flags given on the
// command line.
func decodeDefaults(cfg *experiment.BenchConfig, set map[string]bool) error {
	if !set["n"] {
		cfg.Ns = []int{1024, 4096, 16384, 65536}
	}
	if !set["heads"] {
		cfg.H = 32
	}
	if !set["d"] {
		cfg.D = 128
	}
	if !set["mech"] {
		cfg.Mechs = []string{"exact"}
	}
	cfg.HKVs = nil
	for _, hkv := range []int{8, 1} {
		if hkv <= cfg.H && cfg.H%hkv == 0 {
			cfg.HKVs = append(cfg.HKVs, hkv)
		}
	}
	if set["kv-heads"] {
		cfg.HKVs = []int{cfg.HKV}
		if cfg.HKV == 0 {
			cfg.HKVs = []int{cfg.H}
		}
	}
	cfg.DTypes = parseNames(cfg.DType)
	if !set["dtype"] {
		cfg.DTypes = []string{"f32", "bf16"}
	}
	cfg.Causal = []bool{true}
	return nil
}
