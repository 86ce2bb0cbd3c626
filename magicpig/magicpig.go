package magicpig

import (
	"context"
	"fmt"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// Defaults of Config: the paper's hash tables, collision threshold,
// sinks and window.
const (
	DefaultBits      = 10
	DefaultTables    = 150
	DefaultThreshold = 2
	DefaultSinks     = 4
	DefaultWindow    = 64
)

// Limits of Config. A decoder keeps a list per bucket of every table,
// for each sequence and key/value head: MaxLists bounds Tables·2^Bits.
const (
	MaxBits   = 16
	MaxTables = 1024
	MaxLists  = 1 << 20
	MaxTokens = attn.MaxElems
)

// Config holds MagicPIG's parameters. The zero value is the defaults.
type Config struct {
	// Bits is K, the hyperplanes of a table (default DefaultBits),
	// at most MaxBits; negative means 0: one bucket per table.
	Bits int
	// Tables is L, the hash tables (default DefaultTables).
	Tables int
	// Threshold is T, the tables a key must share the query's bucket in
	// to be sampled (default DefaultThreshold), at most Tables.
	Threshold int
	// Sinks is the number of first positions always attended (default
	// DefaultSinks); negative means none.
	Sinks int
	// Window is the number of last positions always attended (default
	// DefaultWindow), the query's own included; negative means only the
	// query's own.
	Window int
	// Seed determines the hyperplanes.
	Seed uint64
}

// MagicPIG is the mechanism: exact attention in Forward and in prompt
// chunks, LSH sampling in decoding. It implements attn.Mechanism under
// the name "magicpig", attn.Decodable, attn.Fallbacker and
// attn.Differentiable, and is safe for concurrent use.
type MagicPIG struct {
	bits, tables, threshold, sinks, window int
	seed                                   uint64
	kn                                     *flash.Kernel
}

// New returns MagicPIG with the parameters of cfg, or an error wrapping
// attn.ErrInput if one is out of range.
func New(cfg Config) (*MagicPIG, error) {
	m := &MagicPIG{bits: cfg.Bits, tables: cfg.Tables, threshold: cfg.Threshold, sinks: cfg.Sinks, window: cfg.Window, seed: cfg.Seed, kn: flash.New(flash.Config{})}
	for _, f := range []struct {
		v   *int
		def int
	}{{&m.bits, DefaultBits}, {&m.tables, DefaultTables}, {&m.threshold, DefaultThreshold}, {&m.sinks, DefaultSinks}, {&m.window, DefaultWindow}} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	m.bits, m.sinks, m.window = max(m.bits, 0), max(m.sinks, 0), max(m.window, 1)
	switch {
	case m.bits > MaxBits:
		return nil, fmt.Errorf("%w: magicpig: Bits = %d, want at most %d", attn.ErrInput, cfg.Bits, MaxBits)
	case m.tables < 1 || m.tables > MaxTables:
		return nil, fmt.Errorf("%w: magicpig: Tables = %d, want 1 to %d", attn.ErrInput, cfg.Tables, MaxTables)
	case m.tables<<m.bits > MaxLists:
		return nil, fmt.Errorf("%w: magicpig: Tables·2^Bits = %d·2^%d lists per head, more than %d", attn.ErrInput, m.tables, m.bits, MaxLists)
	case m.threshold < 1 || m.threshold > m.tables:
		return nil, fmt.Errorf("%w: magicpig: Threshold = %d, want 1 to Tables = %d", attn.ErrInput, cfg.Threshold, m.tables)
	case m.sinks > MaxTokens || m.window > MaxTokens:
		return nil, fmt.Errorf("%w: magicpig: Sinks = %d, Window = %d: at most %d tokens", attn.ErrInput, cfg.Sinks, cfg.Window, MaxTokens)
	}
	return m, nil
}

// Name returns "magicpig".
func (*MagicPIG) Name() string { return "magicpig" }

// Config returns the configuration in effect, defaults filled in; Bits
// 0 and no sinks read -1, a window of the query alone 1.
func (m *MagicPIG) Config() Config {
	c := Config{Bits: m.bits, Tables: m.tables, Threshold: m.threshold, Sinks: m.sinks, Window: m.window, Seed: m.seed}
	for _, f := range []*int{&c.Bits, &c.Sinks} {
		if *f == 0 {
			*f = -1
		}
	}
	return c
}

// Forward is exact attention (package flash): MagicPIG's prefill rule.
func (m *MagicPIG) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	return m.kn.Forward(ctx, s, q, k, v, o, out, lse)
}

// Fallback says that Forward is exact attention, for every call:
// MagicPIG approximates in decoding only.
func (m *MagicPIG) Fallback(s attn.Shape, o attn.Options) string {
	return "magicpig approximates only in decoding; Forward, the prefill rule, is exact attention"
}

// Backward is the gradient of Forward, exact attention (package flash).
func (m *MagicPIG) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	return m.kn.Backward(ctx, s, q, k, v, out, lse, dout, o, nil, dq, dk, dv)
}

var (
	_ attn.Mechanism      = (*MagicPIG)(nil)
	_ attn.Decodable      = (*MagicPIG)(nil)
	_ attn.Fallbacker     = (*MagicPIG)(nil)
	_ attn.Differentiable = (*MagicPIG)(nil)
)
