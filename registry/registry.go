// Package registry is the one list of attention mechanisms by name, used by
// the command line, the benchmarks and the model to build a mechanism from
// a name and `-set name=value` parameters (DESIGN.md §7).
//
// Parameters are checked strictly: an unknown name, a malformed value or a
// value out of range is an error naming the parameter, never ignored.
package registry

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/hyper"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/linear"
	"github.com/attnkit/attn/linformer"
	"github.com/attnkit/attn/performer"
	"github.com/attnkit/attn/reformer"
	"github.com/attnkit/attn/sparse"
)

// Param documents one parameter a mechanism accepts.
type Param struct {
	Name, Default, Doc string
}

// Entry describes one mechanism.
type Entry struct {
	Name    string
	Summary string
	Params  []Param
	// Build makes the mechanism from parsed parameters and a seed for
	// whatever it draws at random.
	Build func(p *Params, seed uint64) (attn.Mechanism, error)
}

// windowSides parses the left and right parameters of a sliding window
// (window and longformer).
func windowSides(p *Params) (left, right int, err error) {
	if left, err = p.Int("left", sparse.DefaultWindow, 0, 1<<40); err != nil {
		return 0, 0, err
	}
	right, err = p.Int("right", sparse.DefaultWindow, 0, 1<<40)
	return left, right, err
}

var entries = []Entry{
	{
		Name:    "exact",
		Summary: "fused tiled online-softmax exact attention (package flash)",
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			return flash.New(flash.Config{}), nil
		},
	},
	{
		Name:    "window",
		Summary: "sliding window: keys [p-left, p+right], every dilation-th (package sparse)",
		Params: []Param{
			{Name: "left", Default: "64", Doc: "keys visible before a query (tokens)"},
			{Name: "right", Default: "64", Doc: "keys visible after a query (tokens); no effect when causal"},
			{Name: "dilation", Default: "1", Doc: "step between visible keys"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			left, right, err := windowSides(p)
			if err != nil {
				return nil, err
			}
			dilation, err := p.Int("dilation", 1, 1, 1<<40)
			if err != nil {
				return nil, err
			}
			if left == 0 && right == 0 {
				return nil, fmt.Errorf("parameters left=0 and right=0 leave each query only itself; set one of them")
			}
			return sparse.NewWindow(sparse.WindowConfig{Left: left, Right: right, Dilation: dilation})
		},
	},
	{
		Name:    "strided",
		Summary: "Sparse Transformer strided or fixed factorised pattern (package sparse)",
		Params: []Param{
			{Name: "mode", Default: "strided", Doc: "strided (previous l keys and every l-th) or fixed (block of l and c summary columns per block)"},
			{Name: "stride", Default: "128", Doc: "l (tokens)"},
			{Name: "summary", Default: "stride/16 (fixed mode)", Doc: "c, summary columns per block; fixed mode only"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			mode, err := p.String("mode", string(sparse.ModeStrided), string(sparse.ModeStrided), string(sparse.ModeFixed))
			if err != nil {
				return nil, err
			}
			stride, err := p.Int("stride", sparse.DefaultStride, 1, 1<<40)
			if err != nil {
				return nil, err
			}
			summary, err := p.Int("summary", 0, 1, stride)
			if err != nil {
				return nil, err
			}
			if summary != 0 && mode != string(sparse.ModeFixed) {
				return nil, fmt.Errorf("parameter summary applies to mode=fixed only")
			}
			return sparse.NewStrided(sparse.StridedConfig{Mode: sparse.StridedMode(mode), Stride: stride, Summary: summary})
		},
	},
	{
		Name:    "longformer",
		Summary: "Longformer: sliding window plus global tokens (package sparse)",
		Params: []Param{
			{Name: "left", Default: "64", Doc: "keys visible before a query (tokens)"},
			{Name: "right", Default: "64", Doc: "keys visible after a query (tokens); no effect when causal"},
			{Name: "globals", Default: "0", Doc: "comma-separated global token positions, each below M (empty: none)"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			left, right, err := windowSides(p)
			if err != nil {
				return nil, err
			}
			globals, err := p.Ints("globals", []int{0}, 0, 1<<40)
			if err != nil {
				return nil, err
			}
			if globals == nil {
				globals = []int{} // "globals=" means none; nil would mean the default {0}
			}
			if left == 0 && right == 0 {
				return nil, fmt.Errorf("parameters left=0 and right=0 leave each query only itself and the globals; set one of them")
			}
			return sparse.NewLongformer(sparse.LongformerConfig{Left: left, Right: right, Globals: globals})
		},
	},
	{
		Name:    "bigbird",
		Summary: "BigBird: window, global and random blocks, random blocks from -seed (package sparse)",
		Params: []Param{
			{Name: "block", Default: "64", Doc: "block size (tokens)"},
			{Name: "window", Default: "3", Doc: "window blocks: the query's block and its neighbours (3: block ±1)"},
			{Name: "globals", Default: "2", Doc: "leading global blocks: they see and are seen by all"},
			{Name: "random", Default: "3", Doc: "random blocks per query block (causal: from the past only)"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			cfg := sparse.BigBirdConfig{Seed: seed}
			var err error
			if cfg.Block, err = p.Int("block", 64, 1, 1<<40); err != nil {
				return nil, err
			}
			if cfg.Window, err = p.Int("window", 3, 0, 1<<40); err != nil {
				return nil, err
			}
			if cfg.Globals, err = p.Int("globals", 2, 0, 1<<40); err != nil {
				return nil, err
			}
			if cfg.Random, err = p.Int("random", 3, 0, 1<<40); err != nil {
				return nil, err
			}
			if cfg.Window == 0 && cfg.Globals == 0 && cfg.Random == 0 {
				return nil, fmt.Errorf("parameters window, globals and random are all 0: no query would see a key")
			}
			return sparse.NewBigBird(cfg)
		},
	},
	{
		Name:    "linear",
		Summary: "linear attention, elu+1 features; causal by chunked prefix sums (package linear)",
		Params: []Param{
			{Name: "chunk", Default: "64", Doc: "query positions per chunk of the causal pass (tokens)"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			chunk, err := p.Int("chunk", linear.DefaultChunk, 1, linear.MaxChunk)
			if err != nil {
				return nil, err
			}
			return linear.New(linear.Config{Chunk: chunk}), nil
		},
	},
	{
		Name:    "performer",
		Summary: "FAVOR+ positive orthogonal random features, exact attention below min keys (package performer)",
		Params: []Param{
			{Name: "features", Default: "256", Doc: "number of random features m"},
			{Name: "min", Default: "2048", Doc: "key length below which exact attention is used (tokens); unset: 2048, or 4096 under the causal mask; 0 never falls back"},
			{Name: "kind", Default: "positive", Doc: "positive (FAVOR+) or trig (sin/cos random Fourier features, for comparison)"},
			{Name: "chunk", Default: "64", Doc: "query positions per chunk of the causal pass (tokens)"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			features, err := p.Int("features", performer.DefaultFeatures, 1, 1<<20)
			if err != nil {
				return nil, err
			}
			// Unset leaves the package default (doubled under the causal
			// mask); min=0 means never fall back, a negative Config.Min.
			set := p.Has("min")
			min, err := p.Int("min", 0, 0, 1<<40)
			if err != nil {
				return nil, err
			}
			if set && min == 0 {
				min = -1
			}
			kind, err := p.String("kind", "positive", "positive", "trig")
			if err != nil {
				return nil, err
			}
			chunk, err := p.Int("chunk", linear.DefaultChunk, 1, linear.MaxChunk)
			if err != nil {
				return nil, err
			}
			cfg := performer.Config{Features: features, Min: min, Seed: seed, Chunk: chunk}
			if kind == "trig" {
				cfg.Kind = performer.Trig
			}
			m, err := performer.New(cfg)
			if err != nil {
				return nil, err
			}
			return m, nil
		},
	},
	{
		Name:    "linformer",
		Summary: "low-rank attention: keys and values projected along the length to k rows; not causal (package linformer)",
		Params: []Param{
			{Name: "k", Default: "256", Doc: "projected length (rows)"},
			{Name: "length", Default: "65536", Doc: "longest key length the drawn projections cover (tokens)"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			k, err := p.Int("k", linformer.DefaultK, 1, 1<<20)
			if err != nil {
				return nil, err
			}
			length, err := p.Int("length", linformer.DefaultLength, 1, 1<<30)
			if err != nil {
				return nil, err
			}
			m, err := linformer.New(linformer.Config{K: k, Length: length, Seed: seed})
			if err != nil {
				return nil, err
			}
			return m, nil
		},
	},
	{
		Name:    "reformer",
		Summary: "Reformer LSH attention: angular LSH, sorted chunks, rounds merged by lse (package reformer)",
		Params: []Param{
			{Name: "hashes", Default: "4", Doc: "hash rounds; more rounds see more keys"},
			{Name: "bucket", Default: "64", Doc: "chunk size (tokens): a query attends to its chunk and the previous one, at most 2·bucket keys per round"},
			{Name: "buckets", Default: "0", Doc: "hash buckets per round; 0: ceil(M/bucket); above 64 factorised into two even factors"},
			{Name: "min", Default: "2048", Doc: "use exact attention when N or M is below this (tokens); unset: 2048, or 4096 under the causal mask; 0 never falls back"},
			{Name: "qk", Default: "separate", Doc: "separate, or shared: keys are the queries normalised to unit length (needs N == M and H == Hkv; implies self=exclude)"},
			{Name: "self", Default: "keep", Doc: "keep, or exclude: a query skips the key at its own position unless it sees no other"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			cfg := reformer.Config{Seed: seed}
			var err error
			if cfg.Hashes, err = p.Int("hashes", reformer.DefaultHashes, 1, reformer.MaxHashes); err != nil {
				return nil, err
			}
			if cfg.Bucket, err = p.Int("bucket", reformer.DefaultBucket, 1, reformer.MaxBucket); err != nil {
				return nil, err
			}
			if cfg.Buckets, err = p.Int("buckets", 0, 0, reformer.MaxBuckets); err != nil {
				return nil, err
			}
			if p.Has("min") {
				// The command line's min=0 never falls back; in Config that
				// is a negative Min (0 there means the default).
				m, err := p.Int("min", 0, 0, 1<<40)
				if err != nil {
					return nil, err
				}
				cfg.Min = m
				if m == 0 {
					cfg.Min = -1
				}
			}
			qk, err := p.String("qk", "separate", "separate", "shared")
			if err != nil {
				return nil, err
			}
			self, err := p.String("self", "keep", "keep", "exclude")
			if err != nil {
				return nil, err
			}
			cfg.SharedQK, cfg.ExcludeSelf = qk == "shared", self == "exclude"
			return reformer.New(cfg)
		},
	},
	{
		Name:    "hyper",
		Summary: "HyperAttention: sortLSH blocks + uniform column samples + causal recursion (package hyper)",
		Params: []Param{
			{Name: "projs", Default: "7", Doc: "LSH projections (random hyperplanes), 1 to 30: 2^projs buckets"},
			{Name: "block", Default: "256", Doc: "keys per block of the block-diagonal part (tokens); 0: no block part, samples only"},
			{Name: "samples", Default: "256", Doc: "sampled key columns per query block; 0: no samples, blocks only"},
			{Name: "min", Default: "4096", Doc: "exact attention below this many queries or keys (tokens); 0: never falls back"},
			{Name: "sampling", Default: "uniform", Doc: "uniform, or vnorm: the product with V from columns drawn by squared value norm (paper)"},
		},
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			projs, err := p.Int("projs", hyper.DefaultProjs, 1, hyper.MaxProjs)
			if err != nil {
				return nil, err
			}
			block, err := p.Int("block", hyper.DefaultBlock, 0, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			samples, err := p.Int("samples", hyper.DefaultSamples, 0, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			minLen, err := p.Int("min", hyper.DefaultMin, 0, math.MaxInt32)
			if err != nil {
				return nil, err
			}
			sampling, err := p.String("sampling", "uniform", "uniform", "vnorm")
			if err != nil {
				return nil, err
			}
			cfg := hyper.Config{Projs: projs, Block: block, Samples: samples, Min: minLen, Seed: seed}
			if block == 0 {
				cfg.Block = -1
			}
			if samples == 0 {
				cfg.Samples = -1
			}
			if minLen == 0 {
				cfg.Min = -1
			}
			if sampling == "vnorm" {
				cfg.Sampling = hyper.ValueNorm
			}
			return hyper.New(cfg)
		},
	},
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

// New builds the mechanism from p and fails if p holds a name the
// mechanism did not read.
func (e Entry) New(p *Params, seed uint64) (attn.Mechanism, error) {
	m, err := e.Build(p, seed)
	if err != nil {
		return nil, fmt.Errorf("registry: %s: %w", e.Name, err)
	}
	if left := p.unused(); len(left) > 0 {
		known := make([]string, len(e.Params))
		for i, q := range e.Params {
			known[i] = q.Name
		}
		k := "none"
		if len(known) > 0 {
			k = strings.Join(known, ", ")
		}
		return nil, fmt.Errorf("registry: %s: unknown parameter %q (known: %s)", e.Name, left[0], k)
	}
	return m, nil
}

// Params holds `name=value` settings and records which ones were read.
type Params struct {
	values map[string]string
	used   map[string]bool
}

// ParseSettings parses `name=value` strings; a name given twice is an error.
func ParseSettings(settings []string) (*Params, error) {
	p := &Params{values: map[string]string{}, used: map[string]bool{}}
	for _, s := range settings {
		name, value, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("registry: setting %q is not name=value", s)
		}
		if _, dup := p.values[name]; dup {
			return nil, fmt.Errorf("registry: parameter %q set twice", name)
		}
		p.values[name] = strings.TrimSpace(value)
	}
	return p, nil
}

// Has reports whether name was set.
func (p *Params) Has(name string) bool {
	_, ok := p.values[name]
	return ok
}

// Int returns parameter name as an integer in [lo, hi], or def when unset.
func (p *Params) Int(name string, def, lo, hi int) (int, error) {
	s, ok := p.get(name)
	if !ok {
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("parameter %s=%q is not an integer", name, s)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("parameter %s=%d is outside [%d, %d]", name, v, lo, hi)
	}
	return v, nil
}

// Ints returns parameter name as a comma-separated list of integers, each
// in [lo, hi], or def when unset.
func (p *Params) Ints(name string, def []int, lo, hi int) ([]int, error) {
	s, ok := p.get(name)
	if !ok {
		return def, nil
	}
	return ParseInts(name, s, lo, hi)
}

// String returns parameter name, which must be one of choices, or def when
// unset.
func (p *Params) String(name, def string, choices ...string) (string, error) {
	s, ok := p.get(name)
	if !ok {
		return def, nil
	}
	if !slices.Contains(choices, s) {
		return "", fmt.Errorf("parameter %s=%q is not one of %s", name, s, strings.Join(choices, ", "))
	}
	return s, nil
}

func (p *Params) get(name string) (string, bool) {
	s, ok := p.values[name]
	if ok {
		p.used[name] = true
	}
	return s, ok
}

func (p *Params) unused() []string {
	var left []string
	for _, name := range slices.Sorted(maps.Keys(p.values)) {
		if !p.used[name] {
			left = append(left, name)
		}
	}
	return left
}

// ParseInts parses a comma-separated list of integers in [lo, hi]; what
// names the list in errors. An empty string is an empty list.
func ParseInts(what, s string, lo, hi int) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an integer", what, f)
		}
		if v < lo || v > hi {
			return nil, fmt.Errorf("%s: %d is outside [%d, %d]", what, v, lo, hi)
		}
		out = append(out, v)
	}
	return out, nil
}

// NewDecoder returns the incremental decoder of m, a mechanism this
// registry built: its own (attn.Decodable), or for exact attention a KV
// cache. A mechanism without one gives an error wrapping
// attn.ErrUnsupported that says why.
func NewDecoder(m attn.Mechanism, cfg attn.DecodeConfig) (attn.Decoder, error) {
	if d, ok := m.(attn.Decodable); ok {
		return d.NewDecoder(cfg)
	}
	if _, ok := m.(*flash.Kernel); ok {
		return kvcache.NewDecoder(cfg)
	}
	return nil, fmt.Errorf("%w: %s has no incremental decoder", attn.ErrUnsupported, m.Name())
}
