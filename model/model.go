package model

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/registry"
)

// Options are the run-time settings of a Model. The zero value runs every
// layer with exact attention on all CPUs.
type Options struct {
	// Workers bounds the goroutines of every product and attention call;
	// 0 means runtime.GOMAXPROCS(0).
	Workers int
	// Patches replace the attention of some layers; layers no patch names
	// use the exact kernel. A layer may be named by one patch only.
	Patches []Patch
	// Seed seeds the patched mechanisms: the mechanism of layer l is
	// built with seed Seed+l, once, in New. Everything a mechanism draws
	// comes from it (see each mechanism's package), so the same Seed gives
	// the same outputs.
	Seed uint64
	// Cache is the element type of the KV caches of sessions (default
	// kvcache.F32).
	Cache kvcache.DType
	// CacheRotate stores keys and values rotated by a fixed Hadamard
	// transform (kvcache.Config.Rotate), which spreads outlier channels
	// before low-bit storage quantises them.
	CacheRotate bool
}

// Model runs a llama-style decoder. It is safe for concurrent use: each
// call allocates its own activations, and sessions their own caches.
type Model struct {
	w       *Weights
	cfg     Config // w.Config with defaults
	workers int
	cache   kvcache.DType
	rotate  bool
	exact   *flash.Kernel
	mechs   []attn.Mechanism // per layer
	patched []bool           // per layer: a mechanism other than exact
	labels  []string         // per layer: "exact" or the patch spec
	freqs   []float64        // the rotary embedding's angular frequencies
}

// New returns a model that runs w with options o. It validates w (shapes
// and finite values) and builds the patched layers' mechanisms; unknown
// mechanisms or parameters and layers out of range are errors. The
// weights are shared, not copied: several models (an exact one and a
// patched one) may run the same weights.
func New(w *Weights, o Options) (*Model, error) {
	if w == nil {
		return nil, fmt.Errorf("%w: nil weights", attn.ErrInput)
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if o.Workers < 0 {
		return nil, fmt.Errorf("%w: Workers = %d, want >= 0", attn.ErrInput, o.Workers)
	}
	if o.Cache > kvcache.I4 {
		return nil, fmt.Errorf("%w: cache element type %v", attn.ErrInput, o.Cache)
	}
	cfg := w.Config.WithDefaults()
	m := &Model{
		w: w, cfg: cfg, workers: o.Workers, cache: o.Cache, rotate: o.CacheRotate,
		exact:   flash.New(flash.Config{}),
		mechs:   make([]attn.Mechanism, cfg.Layers),
		patched: make([]bool, cfg.Layers),
		labels:  make([]string, cfg.Layers),
		freqs:   ropeFreqs(cfg.HeadDim(), cfg.RopeBase, w.RopeFreqs, cfg.ropeScale()),
	}
	if m.workers == 0 {
		m.workers = runtime.GOMAXPROCS(0)
	}
	for l := range m.mechs {
		mech, err := registry.New("exact", nil, o.Seed+uint64(l))
		if err != nil {
			return nil, err
		}
		m.mechs[l], m.labels[l] = mech, "exact"
	}
	if a := cfg.ownAttention(); a != "" && a != "exact" {
		// The model's own attention: every layer a patch does not name.
		ps, err := ParsePatch(a)
		if err != nil || len(ps) != 1 || ps[0].Layers != nil {
			return nil, fmt.Errorf("%w: the model's attention %q is not one mechanism without layers", ErrFormat, a)
		}
		for l := range m.mechs {
			mech, err := registry.New(ps[0].Mechanism, ps[0].Settings, o.Seed+uint64(l))
			if err != nil {
				return nil, fmt.Errorf("%w: the model's attention %q: %v", ErrFormat, a, err)
			}
			m.mechs[l], m.patched[l], m.labels[l] = mech, true, a
		}
	}
	named := make([]bool, cfg.Layers)
	for _, p := range o.Patches {
		layers := p.Layers
		if layers == nil {
			layers = make([]int, cfg.Layers)
			for l := range layers {
				layers[l] = l
			}
		}
		for _, l := range layers {
			if l < 0 || l >= cfg.Layers {
				return nil, fmt.Errorf("%w: patch %s: layer %d outside [0, %d)", attn.ErrInput, p, l, cfg.Layers)
			}
			if named[l] {
				return nil, fmt.Errorf("%w: layer %d is named by two patches", attn.ErrInput, l)
			}
			named[l] = true
			mech, err := registry.New(p.Mechanism, p.Settings, o.Seed+uint64(l))
			if err != nil {
				return nil, fmt.Errorf("%w: patch %s: %v", attn.ErrInput, p, err)
			}
			m.mechs[l] = mech
			m.patched[l] = mech.Name() != m.exact.Name()
			m.labels[l] = p.String()
		}
	}
	return m, nil
}

// Config returns the architecture, with defaults filled in.
func (m *Model) Config() Config { return m.cfg }

// Weights returns the weights the model runs (shared, not a copy).
func (m *Model) Weights() *Weights { return m.w }

// Attention describes the attention of layer l: "exact" or the patch.
func (m *Model) Attention(l int) string {
	if l < 0 || l >= len(m.labels) {
		return ""
	}
	return m.labels[l]
}

// Patched reports whether layer l runs a mechanism other than exact
// attention.
func (m *Model) Patched(l int) bool { return l >= 0 && l < len(m.patched) && m.patched[l] }

// Observer is called after the attention of every layer of a pass with
// the attention's inputs and output for the positions of the pass: q is
// [1][H][n][D] after the rotary embedding, k and v [1][Hkv][n][D], out
// [1][H][n][D], all in the layout of package attn with s.N = s.M = n. The
// slices are reused afterwards: copy what you keep. An error stops the
// pass and is returned.
type Observer func(layer int, s attn.Shape, q, k, v, out []float32) error

// Forward runs the model over tokens, at positions 0…len(tokens)-1, and
// writes the logits of the token that follows each position from…
// len(tokens)-1 into logits, [len(tokens)-from][Vocab]. Every layer's
// attention runs over the whole sequence with the causal mask: exact
// layers by the fused kernel, patched ones by their mechanism's Forward.
func (m *Model) Forward(ctx context.Context, tokens []int, from int, logits []float32) error {
	return m.ForwardObserve(ctx, tokens, from, logits, nil)
}

// ForwardObserve is Forward that calls obs (if not nil) after every
// layer's attention.
func (m *Model) ForwardObserve(ctx context.Context, tokens []int, from int, logits []float32, obs Observer) error {
	return m.forward(ctx, tokens, from, logits, obs, nil)
}

// forward is ForwardObserve that, when attnTime is not nil, adds to it the
// wall time of the layers' attention calls (the mechanisms' Forward, not
// obs), so that Perplexity can report what the attention costs apart from
// the projections and MLPs around it.
func (m *Model) forward(ctx context.Context, tokens []int, from int, logits []float32, obs Observer, attnTime *time.Duration) error {
	n := len(tokens)
	if n == 0 {
		return fmt.Errorf("%w: no tokens", attn.ErrInput)
	}
	if from < 0 || from > n {
		return fmt.Errorf("%w: from = %d outside [0, %d]", attn.ErrInput, from, n)
	}
	if want := (n - from) * m.cfg.Vocab; len(logits) != want {
		return errShape("logits", len(logits), want)
	}
	h, err := m.forwardHidden(ctx, tokens, from, obs, attnTime)
	if err != nil {
		return err
	}
	return m.logitsOf(ctx, logits, h)
}

// forwardHidden is forward that returns the final hidden states of
// positions from… ([len(tokens)-from][Dim], normalised) instead of their
// logits, so that a caller can take the logits a few rows at a time: a
// window's logits over a large vocabulary take far more memory than its
// hidden states.
func (m *Model) forwardHidden(ctx context.Context, tokens []int, from int, obs Observer, attnTime *time.Duration) ([]float32, error) {
	n := len(tokens)
	if n == 0 {
		return nil, fmt.Errorf("%w: no tokens", attn.ErrInput)
	}
	if from < 0 || from > n {
		return nil, fmt.Errorf("%w: from = %d outside [0, %d]", attn.ErrInput, from, n)
	}
	opts := attn.Options{Causal: true, Workers: m.workers}
	att := func(ctx context.Context, l int, s attn.Shape, q, k, v, out []float32) error {
		t0 := time.Now()
		err := m.mechs[l].Forward(ctx, s, q, k, v, opts, out, nil)
		if attnTime != nil {
			*attnTime += time.Since(t0)
		}
		if err != nil {
			return fmt.Errorf("layer %d (%s): %w", l, m.labels[l], err)
		}
		if obs != nil {
			return obs(l, s, q, k, v, out)
		}
		return nil
	}
	return m.passHidden(ctx, tokens, 0, att, from)
}

// logitsOf writes the logits of hidden states h ([rows][Dim], from
// forwardHidden) into logits, [rows][Vocab].
func (m *Model) logitsOf(ctx context.Context, logits, h []float32) error {
	rows := len(h) / m.cfg.Dim
	if len(logits) != rows*m.cfg.Vocab {
		return errShape("logits", len(logits), rows*m.cfg.Vocab)
	}
	if rows == 0 {
		return ctx.Err()
	}
	var sc scratch
	return linear(ctx, &sc, m.workers, logits, h, m.w.output(), rows, m.cfg.Vocab, m.cfg.Dim)
}

// attendFunc computes one layer's attention for the n positions of a
// pass: q [1][H][n][D], k, v [1][Hkv][n][D] in, out [1][H][n][D] out.
type attendFunc func(ctx context.Context, l int, s attn.Shape, q, k, v, out []float32) error

// pass runs the decoder over tokens at positions pos0…, with att for each
// layer's attention, and writes the logits of positions from… (relative to
// the pass) into logits (nil: none).
func (m *Model) pass(ctx context.Context, tokens []int, pos0 int, att attendFunc, from int, logits []float32) error {
	if logits == nil {
		from = len(tokens)
	}
	h, err := m.passHidden(ctx, tokens, pos0, att, from)
	if err != nil || logits == nil {
		return err
	}
	return m.logitsOf(ctx, logits, h)
}

// passHidden is pass that returns the final normalised hidden states of
// positions from… ([n-from][Dim]) instead of their logits.
func (m *Model) passHidden(ctx context.Context, tokens []int, pos0 int, att attendFunc, from int) ([]float32, error) {
	c := m.cfg
	n := len(tokens)
	for i, t := range tokens {
		if t < 0 || t >= c.Vocab {
			return nil, fmt.Errorf("%w: token %d at %d outside the vocabulary [0, %d)", attn.ErrInput, t, i, c.Vocab)
		}
	}
	hd, kvd := c.HeadDim(), c.KVDim()
	ld := padded(n)
	var sc scratch
	// Feature-major activations, [features][ld] (see linearT).
	x := make([]float32, c.Dim*ld)
	xn := make([]float32, c.Dim*ld)
	q, o := make([]float32, c.Dim*ld), make([]float32, c.Dim*ld)
	k, v := make([]float32, kvd*ld), make([]float32, kvd*ld)
	qh, oh := make([]float32, n*c.Dim), make([]float32, n*c.Dim)
	kh, vh := make([]float32, n*kvd), make([]float32, n*kvd)
	g, u := make([]float32, c.Hidden*ld), make([]float32, c.Hidden*ld)
	ss := make([]float32, ld)
	for t, tok := range tokens {
		for i, e := range m.w.Embed[tok*c.Dim:][:c.Dim] {
			x[i*ld+t] = e
		}
	}
	cos, sin := rotaryTableT(pos0, n, ld, m.freqs)
	s := attn.Shape{B: 1, H: c.Heads, HKV: c.KVHeads, N: n, M: n, D: hd}
	w := m.workers
	for l := range m.w.Layers {
		L := &m.w.Layers[l]
		rmsNormT(xn, x, L.AttnNorm, ld, c.NormEps, ss)
		for _, p := range []struct {
			dst, w []float32
			out    int
		}{{q, L.Wq, c.Dim}, {k, L.Wk, kvd}, {v, L.Wv, kvd}} {
			if err := linearT(ctx, &sc, w, p.dst, xn, p.w, n, ld, p.out, c.Dim); err != nil {
				return nil, err
			}
		}
		if c.QKVBias {
			addBiasT(q, L.Bq, n, ld)
			addBiasT(k, L.Bk, n, ld)
			addBiasT(v, L.Bv, n, ld)
		}
		ropePairsT(q, cos, sin, ld, c.Heads, hd, c.RopeNeoX)
		ropePairsT(k, cos, sin, ld, c.KVHeads, hd, c.RopeNeoX)
		headsFromT(qh, q, n, ld, c.Heads, hd)
		headsFromT(kh, k, n, ld, c.KVHeads, hd)
		headsFromT(vh, v, n, ld, c.KVHeads, hd)
		if err := att(ctx, l, s, qh, kh, vh, oh); err != nil {
			return nil, err
		}
		headsToT(o, oh, n, ld, c.Heads, hd)
		if err := linearT(ctx, &sc, w, xn, o, L.Wo, n, ld, c.Dim, c.Dim); err != nil {
			return nil, err
		}
		addTo(x, xn)
		rmsNormT(xn, x, L.MLPNorm, ld, c.NormEps, ss)
		if err := linearT(ctx, &sc, w, g, xn, L.W1, n, ld, c.Hidden, c.Dim); err != nil {
			return nil, err
		}
		if err := linearT(ctx, &sc, w, u, xn, L.W3, n, ld, c.Hidden, c.Dim); err != nil {
			return nil, err
		}
		swiGLU(g, u)
		if err := linearT(ctx, &sc, w, xn, g, L.W2, n, ld, c.Dim, c.Hidden); err != nil {
			return nil, err
		}
		addTo(x, xn)
	}
	if from == n {
		return nil, ctx.Err()
	}
	rows := n - from
	rmsNormT(xn, x, m.w.Norm, ld, c.NormEps, ss)
	xr := make([]float32, rows*c.Dim)
	transpose(xr, c.Dim, xn[from:], ld, c.Dim, rows)
	return xr, ctx.Err()
}

// errStop is returned by observers that have seen what they wanted; it
// never leaves this package.
var errStop = errors.New("stop")

// Fallback returns why layer l runs exact attention instead of its
// mechanism's approximation in a causal pass over n positions (a
// mechanism's minimum length, say), or "" when the approximation runs or
// the layer is exact to begin with.
func (m *Model) Fallback(l, n int) string {
	if !m.Patched(l) || n <= 0 {
		return ""
	}
	c := m.cfg
	s := attn.Shape{B: 1, H: c.Heads, HKV: c.KVHeads, N: n, M: n, D: c.HeadDim()}
	return attn.FallbackOf(m.mechs[l], s, attn.Options{Causal: true, Workers: m.workers})
}

// Mechanism returns the mechanism of layer l (nil outside the model).
func (m *Model) Mechanism(l int) attn.Mechanism {
	if l < 0 || l >= len(m.mechs) {
		return nil
	}
	return m.mechs[l]
}
