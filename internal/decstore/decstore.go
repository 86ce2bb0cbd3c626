// Package decstore is what the decoders that read a fraction of the cache
// (packages quest and magicpig) share: float32 keys and values per
// sequence and key/value head, the exact prefill rule, and the skeleton
// of attn.Decoder and attn.Appender (argument checks, ragged batches,
// MaxLen, a failed step leaving every sequence as it was) around a Rule
// that decodes one position and keeps its own index of the cache.
//
// The prefill rule is the one the long-context decoding papers assume:
// a step that brings a sequence more than one position is a prompt chunk
// for it, attended exactly and causally over everything stored and the
// chunk itself; a step that brings it one position is a generated token,
// decoded by the Rule. The rule goes by each sequence's own count, so
// that a ragged batch gives every sequence what it would get alone.
package decstore

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/hugepage"
	"github.com/attnkit/attn/internal/parallel"
)

// Rule is a decode rule over a Store. S is a worker's scratch.
type Rule[S any] interface {
	// NewScratch returns a scratch for one worker.
	NewScratch() S
	// Decode computes the outputs of the group of query heads of
	// key/value head kvh of sequence b at position p, which is stored
	// and sees positions [0, p]. q holds the group's query rows
	// [g][D], unscaled; Decode writes out [g][D] and lse [g]. Positions
	// below the rule's indexed count (see Index) are indexed; the rest,
	// up to p, are stored only.
	Decode(sc S, b, kvh, p int, q, out, lse []float32)
	// Index brings the rule's index of sequence b, head kvh, up to the
	// first n stored positions. It is called once positions are
	// committed (a step or an append succeeded), never for positions a
	// failed step dropped, and is not cancelled.
	Index(sc S, b, kvh, n int)
	// Reset empties the index, keeping its memory.
	Reset()
	// Bytes returns the memory of the index.
	Bytes() int
}

// Head holds the keys and values of one sequence and key/value head,
// interleaved: row j of KV ([positions][2][D]) is key j, then value j.
// A decode rule that gathers scattered positions then finds a value next
// to its key, one run of memory for the prefetchers to bring in.
type Head struct {
	KV []float32
	d  int
}

// K returns key row j.
func (h *Head) K(j int) []float32 { return h.KV[2*j*h.d:][:h.d] }

// V returns value row j.
func (h *Head) V(j int) []float32 { return h.KV[(2*j+1)*h.d:][:h.d] }

// Keys returns the keys from position j on, for kernels that take rows
// of stride Stride.
func (h *Head) Keys(j int) []float32 { return h.KV[2*j*h.d:] }

// Values returns the values from position j on, of stride Stride.
func (h *Head) Values(j int) []float32 { return h.KV[(2*j+1)*h.d:] }

// Stride is the distance between consecutive keys (and values).
func (h *Head) Stride() int { return 2 * h.d }

// Len returns the positions stored.
func (h *Head) Len() int { return len(h.KV) / (2 * h.d) }

// Store is the float32 cache of a batch of sequences.
type Store struct {
	cfg   attn.DecodeConfig
	name  string
	limit int
	heads []Head // [B][Hkv]
	lens  []int
}

// Config returns the configuration of the batch.
func (s *Store) Config() attn.DecodeConfig { return s.cfg }

// Head returns the keys and values of sequence b, key/value head kvh.
func (s *Store) Head(b, kvh int) *Head { return &s.heads[b*s.cfg.HKV+kvh] }

// Len returns the positions committed to sequence b.
func (s *Store) Len(b int) int { return s.lens[b] }

// Decoder is an attn.Decoder and attn.Appender over a Store with a Rule.
// It is not safe for concurrent use.
type Decoder[S any] struct {
	*Store
	rule Rule[S]
	kn   *flash.Kernel

	mu   sync.Mutex
	free []S

	// Compaction buffers of one sequence's rows at a prefill.
	q, out, lse []float32
}

// NewStore validates cfg for a decoder called name (for errors) whose
// sequences may hold at most limit positions, and returns an empty
// store. Storage other than float32 and a StreamingLLM window are
// errors wrapping attn.ErrUnsupported: the rules range over every cached
// key, stored as float32.
func NewStore(name string, cfg attn.DecodeConfig, limit int) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.Storage != "" && cfg.Storage != "f32":
		return nil, fmt.Errorf("%w: %s: the decoder stores keys as f32, not %q", attn.ErrUnsupported, name, cfg.Storage)
	case cfg.Window > 0:
		return nil, fmt.Errorf("%w: %s: the decoder has no StreamingLLM window (Window = %d): it has its own sinks and recent window, and its index ranges over every cached key", attn.ErrUnsupported, name, cfg.Window)
	case cfg.MaxLen > limit:
		return nil, fmt.Errorf("%w: %s: decode MaxLen = %d past %d positions", attn.ErrUnsupported, name, cfg.MaxLen, limit)
	}
	st := &Store{cfg: cfg, name: name, limit: limit, heads: make([]Head, cfg.B*cfg.HKV), lens: make([]int, cfg.B)}
	for i := range st.heads {
		st.heads[i].d = cfg.D
	}
	return st, nil
}

// New returns a decoder over st with rule r.
func New[S any](st *Store, r Rule[S]) *Decoder[S] {
	return &Decoder[S]{Store: st, rule: r, kn: flash.New(flash.Config{})}
}

// Bytes returns the memory of the keys, values and the rule's index.
func (d *Decoder[S]) Bytes() int {
	n := 0
	for _, h := range d.heads {
		n += 4 * cap(h.KV)
	}
	return n + d.rule.Bytes()
}

// Reset empties every sequence, keeping the memory.
func (d *Decoder[S]) Reset() {
	for i := range d.heads {
		d.heads[i].KV = d.heads[i].KV[:0]
	}
	clear(d.lens)
	d.rule.Reset()
}

// counts returns each sequence's real positions among n, after checking
// that they fit MaxLen and the store's limit.
func (d *Decoder[S]) counts(n int, valid []int) ([]int, error) {
	cfg := d.cfg
	counts := make([]int, cfg.B)
	for b := range counts {
		counts[b] = n
		if valid != nil {
			counts[b] = valid[b]
		}
		end := d.lens[b] + counts[b]
		switch {
		case cfg.MaxLen > 0 && end > cfg.MaxLen:
			return nil, fmt.Errorf("%w: %s: sequence %d would hold %d positions, MaxLen = %d", attn.ErrFull, d.name, b, end, cfg.MaxLen)
		case end > d.limit:
			return nil, fmt.Errorf("%w: %s: sequence %d would hold %d positions, past %d", attn.ErrUnsupported, d.name, b, end, d.limit)
		}
	}
	return counts, nil
}

// store appends the real rows of k and v ([B][Hkv][n][D]).
func (d *Decoder[S]) store(k, v []float32, n int, counts []int) {
	hkv, dd := d.cfg.HKV, d.cfg.D
	for b, nb := range counts {
		for kvh := range hkv {
			h := d.Head(b, kvh)
			src := (b*hkv + kvh) * n * dd
			h.KV = d.appendRows(h.KV, k[src:src+nb*dd], v[src:src+nb*dd])
		}
	}
}

// appendRows appends key and value rows to buf, interleaved, doubling
// its capacity (up to MaxLen) when it runs out: append's growth of a
// quarter for large slices would copy a long cache every few thousand
// tokens, inside a decode step.
func (d *Decoder[S]) appendRows(buf, k, v []float32) []float32 {
	dd := d.cfg.D
	n := len(buf)
	if need := n + 2*len(k); need > cap(buf) {
		c := max(need, 2*cap(buf), 512*dd)
		if d.cfg.MaxLen > 0 {
			c = max(need, min(c, 2*d.cfg.MaxLen*dd))
		}
		nb := make([]float32, n, c)
		// Samples and pages are read at scattered rows: on 4 KiB pages
		// nearly every row would also miss the TLB.
		hugepage.Advise(nb[:c])
		copy(nb, buf)
		buf = nb
	}
	buf = buf[:n+2*len(k)]
	for i := range len(k) / dd {
		copy(buf[n+2*i*dd:][:dd], k[i*dd:])
		copy(buf[n+(2*i+1)*dd:][:dd], v[i*dd:])
	}
	return buf
}

// truncate drops what store appended past the committed lengths.
func (d *Decoder[S]) truncate() {
	dd := d.cfg.D
	for b, l := range d.lens {
		for kvh := range d.cfg.HKV {
			h := d.Head(b, kvh)
			h.KV = h.KV[:2*l*dd]
		}
	}
}

func (d *Decoder[S]) workers() int {
	if d.cfg.Workers > 0 {
		return d.cfg.Workers
	}
	return runtime.GOMAXPROCS(0)
}

// getScratch hands a worker a scratch, reused from earlier calls.
func (d *Decoder[S]) getScratch() S {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.free); n > 0 {
		sc := d.free[n-1]
		d.free = d.free[:n-1]
		return sc
	}
	return d.rule.NewScratch()
}

func (d *Decoder[S]) putScratch(sc S) {
	d.mu.Lock()
	d.free = append(d.free, sc)
	d.mu.Unlock()
}

// commit makes the stored rows part of the sequences and indexes them.
func (d *Decoder[S]) commit(counts []int) {
	var jobs []int // b·Hkv + kvh
	for b, nb := range counts {
		d.lens[b] += nb
		if nb > 0 {
			for kvh := range d.cfg.HKV {
				jobs = append(jobs, b*d.cfg.HKV+kvh)
			}
		}
	}
	var used []S
	var mu sync.Mutex
	newScratch := func() S {
		sc := d.getScratch()
		mu.Lock()
		used = append(used, sc)
		mu.Unlock()
		return sc
	}
	// Indexing is not cancelled: the positions are committed, and the
	// index must cover them for the next step.
	_ = parallel.For(context.Background(), d.workers(), len(jobs), newScratch, func(sc S, i int) error {
		b, kvh := jobs[i]/d.cfg.HKV, jobs[i]%d.cfg.HKV
		d.rule.Index(sc, b, kvh, d.lens[b])
		return nil
	})
	for _, sc := range used {
		d.putScratch(sc)
	}
}

// Step implements attn.Decoder: a sequence that the step brings more
// than one position is attended exactly (the prefill rule), one that it
// brings one position by the rule. A step that fails (bad arguments, a
// sequence past MaxLen, a cancelled context) leaves every sequence as it
// was.
func (d *Decoder[S]) Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error {
	cfg := d.cfg
	if err := cfg.CheckStep(q, k, v, n, valid, out, lse); err != nil {
		return err
	}
	counts, err := d.counts(n, valid)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	h, dd := cfg.H, cfg.D
	for b, nb := range counts {
		for x := nb; x < n; x++ { // padding
			for hh := range h {
				row := (b*h+hh)*n + x
				clear(out[row*dd : (row+1)*dd])
				if lse != nil {
					lse[row] = float32(math.Inf(-1))
				}
			}
		}
	}
	d.store(k, v, n, counts)
	if err := d.attend(ctx, q, n, counts, out, lse); err != nil {
		d.truncate()
		return err
	}
	d.commit(counts)
	return nil
}

// Append implements attn.Appender: the keys and values are stored and
// indexed, no query is attended. A failed append leaves every sequence
// as it was.
func (d *Decoder[S]) Append(ctx context.Context, k, v []float32, n int, valid []int) error {
	if err := d.cfg.CheckAppend(k, v, n, valid); err != nil {
		return err
	}
	counts, err := d.counts(n, valid)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.store(k, v, n, counts)
	d.commit(counts)
	return nil
}

// attend computes the outputs of the real positions: prompt chunks
// exactly, one sequence after the other (each spreads over the workers),
// then the decoded positions, a job per sequence and key/value head.
func (d *Decoder[S]) attend(ctx context.Context, q []float32, n int, counts []int, out, lse []float32) error {
	cfg := d.cfg
	for b, nb := range counts {
		if nb > 1 {
			if err := d.prefill(ctx, b, q, n, nb, out, lse); err != nil {
				return fmt.Errorf("%s: sequence %d: %w", d.name, b, err)
			}
		}
	}
	var jobs []int
	for b, nb := range counts {
		if nb == 1 {
			for kvh := range cfg.HKV {
				jobs = append(jobs, b*cfg.HKV+kvh)
			}
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	h, dd, g := cfg.H, cfg.D, cfg.H/cfg.HKV
	type scratch struct {
		rule        S
		q, out, lse []float32
	}
	var used []S
	var mu sync.Mutex
	newScratch := func() *scratch {
		sc := &scratch{rule: d.getScratch(), q: make([]float32, g*dd), out: make([]float32, g*dd), lse: make([]float32, g)}
		mu.Lock()
		used = append(used, sc.rule)
		mu.Unlock()
		return sc
	}
	err := parallel.For(ctx, d.workers(), len(jobs), newScratch, func(sc *scratch, i int) error {
		b, kvh := jobs[i]/cfg.HKV, jobs[i]%cfg.HKV
		for hh := range g {
			row := (b*h + kvh*g + hh) * n
			copy(sc.q[hh*dd:(hh+1)*dd], q[row*dd:])
		}
		d.rule.Decode(sc.rule, b, kvh, d.lens[b], sc.q, sc.out, sc.lse)
		for hh := range g {
			row := (b*h + kvh*g + hh) * n
			copy(out[row*dd:(row+1)*dd], sc.out[hh*dd:])
			if lse != nil {
				lse[row] = sc.lse[hh]
			}
		}
		return nil
	})
	for _, sc := range used {
		d.putScratch(sc)
	}
	return err
}

// prefill attends the nb new positions of sequence b (stored already)
// exactly and causally over everything the sequence holds.
func (d *Decoder[S]) prefill(ctx context.Context, b int, q []float32, n, nb int, out, lse []float32) error {
	cfg := d.cfg
	h, dd := cfg.H, cfg.D
	s := attn.Shape{B: 1, H: h, HKV: cfg.HKV, N: nb, M: d.lens[b] + nb, D: dd}
	o := attn.Options{Scale: cfg.Scale, Causal: true, Workers: cfg.Workers}
	qb := q[b*h*n*dd:][:h*n*dd]
	ob := out[b*h*n*dd:][:h*n*dd]
	var lb []float32
	if lse != nil {
		lb = lse[b*h*n:][:h*n]
	}
	if nb == n {
		return d.kn.ForwardKV(ctx, s, qb, seqKV{d.Store, b}, o, nil, ob, lb)
	}
	d.q = grow(d.q, h*nb*dd)
	d.out = grow(d.out, h*nb*dd)
	for hh := range h {
		copy(d.q[hh*nb*dd:(hh+1)*nb*dd], qb[hh*n*dd:])
	}
	var lc []float32
	if lb != nil {
		d.lse = grow(d.lse, h*nb)
		lc = d.lse
	}
	if err := d.kn.ForwardKV(ctx, s, d.q, seqKV{d.Store, b}, o, nil, d.out, lc); err != nil {
		return err
	}
	for hh := range h {
		copy(ob[hh*n*dd:][:nb*dd], d.out[hh*nb*dd:(hh+1)*nb*dd])
		if lb != nil {
			copy(lb[hh*n:][:nb], lc[hh*nb:(hh+1)*nb])
		}
	}
	return nil
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// seqKV is one sequence's stored rows as flash's key/value source.
type seqKV struct {
	st *Store
	b  int
}

func (kv seqKV) PackK(dst []float32, ld, _, kvh, j0, n int) {
	h := kv.st.Head(kv.b, kvh)
	for j := range n {
		for c, x := range h.K(j0 + j) {
			dst[c*ld+j] = x
		}
	}
}

func (kv seqKV) PackV(dst []float32, ld, _, kvh, j0, n int) {
	h := kv.st.Head(kv.b, kvh)
	for j := range n {
		copy(dst[j*ld:], h.V(j0+j))
	}
}

var (
	_ attn.Decoder  = (*Decoder[int])(nil)
	_ attn.Appender = (*Decoder[int])(nil)
)
