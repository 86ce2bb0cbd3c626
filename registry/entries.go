package registry

import (
	"fmt"
	"math"
	"strconv"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/hyper"
	"github.com/attnkit/attn/linear"
	"github.com/attnkit/attn/linformer"
	"github.com/attnkit/attn/performer"
	"github.com/attnkit/attn/reformer"
	"github.com/attnkit/attn/sparse"
)

// maxLen bounds lengths given in tokens: far past any context, small
// enough that the packages' size arithmetic cannot overflow.
const maxLen = attn.MaxElems

// windowParams are the left and right sides of window and longformer.
func windowParams() []Param {
	return []Param{
		intParam("left", sparse.DefaultWindow, 0, maxLen, "keys visible before a query (tokens)"),
		intParam("right", sparse.DefaultWindow, 0, maxLen, "keys visible after a query (tokens); no effect when causal"),
	}
}

// windowSides reads the left and right parameters of a sliding window.
func windowSides(p *Params) (left, right int, err error) {
	if left, err = p.Int("left"); err != nil {
		return 0, 0, err
	}
	right, err = p.Int("right")
	return left, right, err
}

// fallbackMin reads the min parameter of performer and reformer: unset
// leaves the package default (0 in their Config), min=0 never falls back
// (a negative Config.Min).
func fallbackMin(p *Params) (int, error) {
	if !p.Has("min") {
		return 0, nil
	}
	m, err := p.Int("min")
	if m == 0 {
		m = -1
	}
	return m, err
}

// chunkParam is the causal chunk of linear and performer.
var chunkParam = intParam("chunk", linear.DefaultChunk, 1, linear.MaxChunk, "query positions per chunk of the causal pass (tokens)")

var entries = []Entry{
	{
		Name:     "exact",
		Summary:  "fused tiled online-softmax exact attention (package flash)",
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			return flash.New(flash.Config{}), nil
		},
	},
	{
		Name:    "window",
		Summary: "sliding window: keys [p-left, p+right], every dilation-th (package sparse)",
		Params: append(windowParams(),
			intParam("dilation", sparse.DefaultDilation, 1, maxLen, "step between visible keys")),
		Sweeps:   []Sweep{{Params: []string{"left", "right"}, Values: pow2(16, 512), Unit: "keys each side"}},
		Scaled:   windowBudget,
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			left, right, err := windowSides(p)
			if err != nil {
				return nil, err
			}
			dilation, err := p.Int("dilation")
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
			enumParam("mode", string(sparse.ModeStrided), []string{string(sparse.ModeStrided), string(sparse.ModeFixed)},
				"strided (previous l keys and every l-th) or fixed (block of l and c summary columns per block)"),
			intParam("stride", sparse.DefaultStride, 1, maxLen, "l (tokens)"),
			{
				Name: "summary", Kind: KindInt, Lo: 1, Hi: maxLen,
				Doc: "c, summary columns per block, at most stride; fixed mode only (default max(1, stride/16))",
				Derive: func(eff map[string]string) string {
					if eff["mode"] != string(sparse.ModeFixed) {
						return ""
					}
					l, _ := strconv.Atoi(eff["stride"])
					return strconv.Itoa(max(1, l/16))
				},
			},
		},
		Sweeps:   []Sweep{{Params: []string{"stride"}, Values: pow2(16, 256), Unit: "tokens"}},
		Scaled:   stridedBudget,
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			mode, err := p.String("mode")
			if err != nil {
				return nil, err
			}
			stride, err := p.Int("stride")
			if err != nil {
				return nil, err
			}
			summary, err := p.Int("summary")
			if err != nil {
				return nil, err
			}
			if summary != 0 && mode != string(sparse.ModeFixed) {
				return nil, fmt.Errorf("parameter summary applies to mode=fixed only")
			}
			if summary > stride {
				return nil, fmt.Errorf("parameter summary=%d is more than stride=%d", summary, stride)
			}
			return sparse.NewStrided(sparse.StridedConfig{Mode: sparse.StridedMode(mode), Stride: stride, Summary: summary})
		},
	},
	{
		Name:    "longformer",
		Summary: "Longformer: sliding window plus global tokens (package sparse)",
		Params: append(windowParams(),
			intsParam("globals", sparse.DefaultGlobals(), 0, maxLen, "comma-separated global token positions, each below M (empty: none)")),
		Sweeps:   []Sweep{{Params: []string{"left", "right"}, Values: pow2(16, 512), Unit: "keys each side"}},
		Scaled:   longformerBudget,
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			left, right, err := windowSides(p)
			if err != nil {
				return nil, err
			}
			globals, err := p.Ints("globals")
			if err != nil {
				return nil, err
			}
			if globals == nil {
				globals = []int{} // "globals=" means none; nil would mean the package default
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
			intParam("block", sparse.DefaultBigBirdBlock, 1, maxLen, "block size (tokens)"),
			intParam("window", sparse.DefaultBigBirdWindow, 0, maxLen, "window blocks: the query's block and its neighbours (3: block ±1)"),
			intParam("globals", sparse.DefaultBigBirdGlobals, 0, maxLen, "leading global blocks: they see and are seen by all"),
			intParam("random", sparse.DefaultBigBirdRandom, 0, maxLen, "random blocks per query block (causal: from the past only)"),
		},
		Sweeps: []Sweep{
			{Params: []string{"window"}, Values: []int{1, 3, 5, 9, 17}, Unit: "blocks"},
			{Params: []string{"block"}, Values: pow2(16, 256), Unit: "tokens"},
		},
		Scaled:   bigbirdBudget,
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			cfg := sparse.BigBirdConfig{Seed: seed}
			var err error
			if cfg.Block, err = p.Int("block"); err != nil {
				return nil, err
			}
			if cfg.Window, err = p.Int("window"); err != nil {
				return nil, err
			}
			if cfg.Globals, err = p.Int("globals"); err != nil {
				return nil, err
			}
			if cfg.Random, err = p.Int("random"); err != nil {
				return nil, err
			}
			if cfg.Window == 0 && cfg.Globals == 0 && cfg.Random == 0 {
				return nil, fmt.Errorf("parameters window, globals and random are all 0: no query would see a key")
			}
			return sparse.NewBigBird(cfg)
		},
	},
	{
		Name:     "linear",
		Summary:  "linear attention, elu+1 features; causal by chunked prefix sums (package linear)",
		Params:   []Param{chunkParam},
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			chunk, err := p.Int("chunk")
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
			intParam("features", performer.DefaultFeatures, 1, 1<<20, "number of random features m"),
			{
				Name: "min", Kind: KindInt, Lo: 0, Hi: maxLen,
				Default:       strconv.Itoa(performer.DefaultMin),
				CausalDefault: strconv.Itoa(performer.DefaultMinCausal),
				Doc:           "key length below which exact attention is used (tokens); 0 never falls back",
			},
			enumParam("kind", performer.DefaultKind.String(), []string{performer.Positive.String(), performer.Trig.String()},
				"positive (FAVOR+) or trig (sin/cos random Fourier features, for comparison)"),
			intParam("chunk", performer.DefaultChunk, 1, linear.MaxChunk, chunkParam.Doc),
		},
		Sweeps:   []Sweep{{Params: []string{"features"}, Values: pow2(16, 1024), Fixed: []string{"min=0"}, Unit: "random features"}},
		Scaled:   performerBudget,
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			features, err := p.Int("features")
			if err != nil {
				return nil, err
			}
			min, err := fallbackMin(p)
			if err != nil {
				return nil, err
			}
			kind, err := p.String("kind")
			if err != nil {
				return nil, err
			}
			chunk, err := p.Int("chunk")
			if err != nil {
				return nil, err
			}
			cfg := performer.Config{Features: features, Min: min, Seed: seed, Chunk: chunk}
			if kind == performer.Trig.String() {
				cfg.Kind = performer.Trig
			}
			return performer.New(cfg)
		},
	},
	{
		Name:    "linformer",
		Summary: "low-rank attention: keys and values projected along the length to k rows; not causal (package linformer)",
		Params: []Param{
			intParam("k", linformer.DefaultK, 1, 1<<20, "projected length (rows)"),
			intParam("length", linformer.DefaultLength, 1, 1<<30, "longest key length the drawn projections cover (tokens)"),
		},
		Sweeps:   []Sweep{{Params: []string{"k"}, Values: pow2(16, 1024), Unit: "projected rows"}},
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			k, err := p.Int("k")
			if err != nil {
				return nil, err
			}
			length, err := p.Int("length")
			if err != nil {
				return nil, err
			}
			return linformer.New(linformer.Config{K: k, Length: length, Seed: seed})
		},
	},
	{
		Name:    "reformer",
		Summary: "Reformer LSH attention: angular LSH, sorted chunks, rounds merged by lse; causal: a prefix-safe rule per query (package reformer)",
		Params: []Param{
			intParam("hashes", reformer.DefaultHashes, 1, reformer.MaxHashes, "hash rounds; more rounds see more keys"),
			intParam("bucket", reformer.DefaultBucket, 1, reformer.MaxBucket, "chunk size (tokens): a query attends to its chunk and the previous one, at most 2·bucket keys per round; causal: the 2·bucket latest keys of its bucket per round"),
			intParam("window", 0, 0, reformer.MaxWindow, "causal: the latest keys every query also sees (tokens); 0: bucket"),
			{
				Name: "buckets", Kind: KindInt, Lo: 0, Hi: reformer.MaxBuckets,
				Default: "0", CausalDefault: strconv.Itoa(reformer.DefaultCausalBuckets),
				Doc: "hash buckets per round; 0: ceil(M/bucket), or under the causal mask " + strconv.Itoa(reformer.DefaultCausalBuckets) +
					"; above 64 factorised into two even factors",
			},
			{
				Name: "min", Kind: KindInt, Lo: 0, Hi: maxLen,
				Default:       strconv.Itoa(reformer.DefaultMin),
				CausalDefault: strconv.Itoa(reformer.DefaultMinCausal),
				Doc:           "use exact attention when N or M is below this (tokens); 0 never falls back",
			},
			enumParam("qk", "separate", []string{"separate", "shared"}, "separate, or shared: keys are the queries normalised to unit length (needs N == M and H == Hkv; implies self=exclude)"),
			enumParam("self", "keep", []string{"keep", "exclude"}, "keep, or exclude: a query skips the key at its own position unless it sees no other"),
			enumParam("causal", "strict", []string{"strict", "nonstrict"}, "strict: outputs depend on the prefix only (the decoders' rule); nonstrict: the sorted chunks of all positions, NOT prefix-safe (later tokens change earlier outputs)"),
		},
		Sweeps: []Sweep{
			{Params: []string{"hashes"}, Values: pow2(1, 8), Fixed: []string{"min=0"}, Unit: "hash rounds"},
			{Params: []string{"bucket"}, Values: pow2(16, 256), Fixed: []string{"min=0"}, Unit: "tokens"},
		},
		Scaled:   reformerBudget,
		Causal:   true,
		Decode:   true,
		Backward: true,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			cfg := reformer.Config{Seed: seed}
			var err error
			if cfg.Hashes, err = p.Int("hashes"); err != nil {
				return nil, err
			}
			if cfg.Bucket, err = p.Int("bucket"); err != nil {
				return nil, err
			}
			if cfg.Buckets, err = p.Int("buckets"); err != nil {
				return nil, err
			}
			if cfg.Min, err = fallbackMin(p); err != nil {
				return nil, err
			}
			qk, err := p.String("qk")
			if err != nil {
				return nil, err
			}
			self, err := p.String("self")
			if err != nil {
				return nil, err
			}
			cfg.SharedQK, cfg.ExcludeSelf = qk == "shared", self == "exclude"
			if cfg.Window, err = p.Int("window"); err != nil {
				return nil, err
			}
			causal, err := p.String("causal")
			if err != nil {
				return nil, err
			}
			cfg.NonStrictCausal = causal == "nonstrict"
			return reformer.New(cfg)
		},
	},
	{
		Name:    "hyper",
		Summary: "HyperAttention: sortLSH blocks + uniform column samples + causal recursion (package hyper)",
		Params: []Param{
			intParam("projs", hyper.DefaultProjs, 1, hyper.MaxProjs, "LSH projections (random hyperplanes): 2^projs buckets"),
			intParam("block", hyper.DefaultBlock, 0, math.MaxInt32, "keys per block of the block-diagonal part (tokens); 0: no block part, samples only"),
			intParam("samples", hyper.DefaultSamples, 0, math.MaxInt32, "sampled key columns per query block; 0: no samples, blocks only"),
			intParam("min", hyper.DefaultMin, 0, math.MaxInt32, "exact attention below this many queries or keys (tokens); 0: never falls back"),
			enumParam("sampling", hyper.Uniform.String(), []string{hyper.Uniform.String(), hyper.ValueNorm.String()},
				"uniform, or vnorm: the product with V from columns drawn by squared value norm (paper)"),
		},
		Causal:   true,
		Decode:   true,
		Backward: true,
		Sweeps: []Sweep{
			{Params: []string{"samples"}, Values: pow2(16, 1024), Fixed: []string{"min=0"}, Unit: "sampled columns"},
			{Params: []string{"block"}, Values: pow2(16, 512), Fixed: []string{"min=0"}, Unit: "tokens"},
		},
		Scaled: hyperBudget,
		Build: func(p *Params, seed uint64) (attn.Mechanism, error) {
			cfg := hyper.Config{Seed: seed}
			var err error
			if cfg.Projs, err = p.Int("projs"); err != nil {
				return nil, err
			}
			if cfg.Block, err = p.Int("block"); err != nil {
				return nil, err
			}
			if cfg.Samples, err = p.Int("samples"); err != nil {
				return nil, err
			}
			if cfg.Min, err = p.Int("min"); err != nil {
				return nil, err
			}
			sampling, err := p.String("sampling")
			if err != nil {
				return nil, err
			}
			// 0 on the command line means none (never, for min); in
			// Config 0 is the default and a negative value none.
			for _, f := range []*int{&cfg.Block, &cfg.Samples, &cfg.Min} {
				if *f == 0 {
					*f = -1
				}
			}
			if sampling == hyper.ValueNorm.String() {
				cfg.Sampling = hyper.ValueNorm
			}
			return hyper.New(cfg)
		},
	},
}
