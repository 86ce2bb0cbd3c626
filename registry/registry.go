// Package registry is the one list of attention mechanisms by name, used by
// the command line, the benchmarks and the model to build a mechanism from
// a name and `-set name=value` parameters (docs/DESIGN.md §7).
//
// Each Entry is the single descriptor of its mechanism: its typed
// parameters with their defaults (from the package's own constants) and
// ranges, what it can do (causal masks, incremental decoding, a backward
// pass), the budget sweeps of `attn accuracy` and the budget rule of `attn
// patching`. Adding a mechanism means one package and one entry here.
//
// Parameters are checked strictly: an unknown name, a malformed value or a
// value out of range is an error naming the parameter, never ignored.
package registry

import (
	"fmt"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
)

// Entry describes one mechanism.
type Entry struct {
	Name    string
	Summary string
	Params  []Param
	// Causal, Decode and Backward say what a mechanism built from the
	// entry does: Forward honours Options.Causal (without it Forward
	// returns attn.ErrUnsupported under the mask), NewDecoder gives it an
	// incremental decoder, Differentiable a backward pass. A test checks
	// them against what the built mechanism implements.
	Causal, Decode, Backward bool
	// Sweeps are the budget curves of `attn accuracy`; none means the
	// mechanism is measured once at its defaults.
	Sweeps []Sweep
	// Scaled, when not nil, gives the mechanism's `attn patching` budget
	// for windows of n tokens, the shortest of which has shortest tokens
	// (see Budget).
	Scaled func(n, shortest int) Budget
	// Build makes the mechanism from parameters already checked against
	// Params, read through p.Int and the like, and a seed for whatever
	// it draws at random.
	Build func(p *Params, seed uint64) (attn.Mechanism, error)
}

// Names lists the registered mechanisms in registration order.
func Names() []string {
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name
	}
	return names
}

// Lookup returns the entry called name.
func Lookup(name string) (Entry, error) {
	for _, e := range entries {
		if e.Name == name {
			return e, nil
		}
	}
	return Entry{}, fmt.Errorf("registry: unknown mechanism %q (known: %s)", name, strings.Join(Names(), ", "))
}

// New builds mechanism name from `name=value` settings. Every setting must
// be one the mechanism knows.
func New(name string, settings []string, seed uint64) (attn.Mechanism, error) {
	e, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	p, err := ParseSettings(settings)
	if err != nil {
		return nil, err
	}
	return e.New(p, seed)
}

// Param returns the entry's parameter called name.
func (e Entry) Param(name string) (Param, bool) {
	for _, d := range e.Params {
		if d.Name == name {
			return d, true
		}
	}
	return Param{}, false
}

// New checks p against the entry's parameters and builds the mechanism.
func (e Entry) New(p *Params, seed uint64) (attn.Mechanism, error) {
	if err := p.bind(e.Params); err != nil {
		return nil, fmt.Errorf("registry: %s: %w", e.Name, err)
	}
	m, err := e.Build(p, seed)
	if err != nil {
		return nil, fmt.Errorf("registry: %s: %w", e.Name, err)
	}
	// A parameter that was set, declared and never read would be ignored
	// silently: Build is wrong, and says so rather than run without it.
	if left := p.unused(); len(left) > 0 {
		return nil, fmt.Errorf("registry: %s: parameter %q is declared but not read", e.Name, left[0])
	}
	return m, nil
}

// Effective returns every parameter of mechanism name in effect under
// settings, defaults included (those of the causal mask when causal), as
// the command line writes them: what results.json records as a row's
// "params". A parameter that does not apply under the others (strided's
// summary outside fixed mode) is left out.
func Effective(name string, settings []string, causal bool) (map[string]string, error) {
	e, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	return e.Effective(settings, causal)
}

// Effective is the package-level Effective for entry e.
func (e Entry) Effective(settings []string, causal bool) (map[string]string, error) {
	p, err := ParseSettings(settings)
	if err != nil {
		return nil, err
	}
	if err := p.bind(e.Params); err != nil {
		return nil, fmt.Errorf("registry: %s: %w", e.Name, err)
	}
	out := make(map[string]string, len(e.Params))
	for _, d := range e.Params {
		if s, ok := p.values[d.Name]; ok {
			out[d.Name], _ = d.Check(s) // bind checked it
			continue
		}
		def := d.Default
		if causal && d.CausalDefault != "" {
			def = d.CausalDefault
		}
		if def != "" || d.Kind == KindInts {
			out[d.Name] = def
		}
	}
	for _, d := range e.Params {
		if _, set := p.values[d.Name]; set || d.Derive == nil {
			continue
		}
		if v := d.Derive(out); v != "" {
			out[d.Name] = v
		} else {
			delete(out, d.Name)
		}
	}
	return out, nil
}

// NewDecoder returns the incremental decoder of m, a mechanism this
// registry built: its own (attn.Decodable), or for exact attention a KV
// cache. A mechanism without one gives an error wrapping
// attn.ErrUnsupported that says why.
func NewDecoder(m attn.Mechanism, cfg attn.DecodeConfig) (attn.Decoder, error) {
	if _, ok := m.(*flash.Kernel); ok {
		return kvcache.NewDecoder(cfg)
	}
	// Eviction (H2O, SnapKV) is a policy of exact attention's cache: a
	// decoder with a rule of its own would ignore it.
	if cfg.Evict != "" {
		return nil, fmt.Errorf("%w: %s: eviction (%s) applies to exact attention's KV cache only", attn.ErrUnsupported, m.Name(), cfg.Evict)
	}
	if d, ok := m.(attn.Decodable); ok {
		return d.NewDecoder(cfg)
	}
	return nil, fmt.Errorf("%w: %s has no incremental decoder", attn.ErrUnsupported, m.Name())
}
