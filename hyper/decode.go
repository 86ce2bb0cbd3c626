package hyper

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore"
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/kvcache"
)

// MaxDecodeProjs is the largest number of LSH projections a Decoder
// supports: its index holds a count and a list for each of the 2^Projs
// buckets, per sequence and key/value head.
const MaxDecodeProjs = 16

// Decoder is HyperAttention's incremental form (see the package
// documentation, Decoding): each new query attends exactly to the most
// recent positions and to the keys around its bucket in the sort of the
// older keys, and estimates the rest from uniformly sampled columns. It
// implements attn.Decoder and is not safe for concurrent use.
type Decoder struct {
	a       *Attention
	cfg     attn.DecodeConfig
	scale   float32
	lsh     *SortLSH
	window  int              // recent positions attended exactly, the query's own included
	nbhd    int              // keys of the bucket's neighbourhood
	samples int              // sampled columns of the older keys
	heads   []*decodeHead    // [B][Hkv]
	lens    []int            // positions of each sequence
	rot     *lowbit.Rotation // nil without "+rot"

	// A step's rows rotated (q, k, v), with "+rot".
	rq, rk, rv []float32

	mu         sync.Mutex
	free, used []*decodeScratch

	// rowsRead counts the key rows the steps have read, for the tests
	// that check a step reads a fraction of the cache.
	rowsRead int
}

// decodeHead is the state of one sequence and key/value head: the keys
// and values, their buckets, and the index of the older keys by bucket.
type decodeHead struct {
	kv     decstore.Head // keys and values, in cfg.Storage
	bucket []uint32      // bucket of every position's key, as stored
	// Positions [0, indexed) are in the index: fen is a Fenwick tree of
	// their counts per bucket (1-based, 2^Projs entries), lists their
	// positions per bucket in increasing order. Their concatenation in
	// bucket order is the stable sort of the indexed keys by bucket.
	indexed int
	fen     []int32
	lists   [][]int32
}

// NewDecoder returns an empty Decoder with a's parameters for the batch of
// cfg. cfg.Storage says how keys and values are kept: "" or "f32"
// (float32), "bf16" or "f16" (rounded to nearest, widened as they are
// read), "i8" (8-bit codes, a float32 scale a row) or "i4" (4-bit codes
// quantised per token: a row's channels in groups of 64, a float32 scale
// and zero a group), each optionally with
// "+rot" (stored rotated by a Hadamard rotation, queries rotated alike,
// outputs rotated back). Keys are hashed as stored: the buckets are of
// the rounded or quantised keys, rotated with "+rot".
//
// An element type other than those, a cfg.Window
// (HyperAttention keeps every key), value-norm sampling (its
// distribution is over all cached values, redrawn each step) and more
// than MaxDecodeProjs projections are errors wrapping
// attn.ErrUnsupported; a malformed cfg.Storage is an error wrapping
// attn.ErrInput.
func (a *Attention) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dt, rot, err := decstore.ParseStorage("hyper", cfg.Storage)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.Window > 0:
		return nil, fmt.Errorf("%w: hyper: the decoder has no sliding window (Window = %d): its buckets and samples range over every cached key", attn.ErrUnsupported, cfg.Window)
	case a.sampling != Uniform:
		return nil, fmt.Errorf("%w: hyper: the decoder samples uniformly; %v sampling would redraw from every cached value each step", attn.ErrUnsupported, a.sampling)
	case a.projs > MaxDecodeProjs:
		return nil, fmt.Errorf("%w: hyper: the decoder indexes 2^Projs buckets, Projs = %d past %d", attn.ErrUnsupported, a.projs, MaxDecodeProjs)
	case cfg.MaxLen > math.MaxInt32:
		return nil, fmt.Errorf("%w: hyper: decode MaxLen = %d past 2^31-1", attn.ErrUnsupported, cfg.MaxLen)
	}
	lsh, err := NewSortLSH(a.projs, cfg.D, a.seed)
	if err != nil {
		return nil, err
	}
	d := &Decoder{
		a: a, cfg: cfg, scale: cfg.ScaleFor(), lsh: lsh,
		window: max(a.block, 1), nbhd: max(a.block, 0), samples: max(a.samples, 0),
		heads: make([]*decodeHead, cfg.B*cfg.HKV), lens: make([]int, cfg.B),
	}
	for i := range d.heads {
		d.heads[i] = &decodeHead{kv: *decstore.NewHead(cfg.D, dt)}
	}
	if rot {
		d.rot = lowbit.NewRotation(cfg.D)
	}
	return d, nil
}

var _ attn.Decodable = (*Attention)(nil)

// Len returns the positions appended to sequence b.
func (d *Decoder) Len(b int) int { return d.lens[b] }

// SingleAsGiven reports that a step bringing a sequence one position
// reads that position's key and value as given, not as stored (for the
// tests' references; a prompt chunk's positions read each other as
// stored).
func (d *Decoder) SingleAsGiven() bool { return true }

// Bytes returns the memory of the stored keys, values and buckets and of
// the indexes.
func (d *Decoder) Bytes() int {
	n := 0
	for _, hd := range d.heads {
		n += hd.kv.Bytes() + 4*(cap(hd.bucket)+cap(hd.fen))
		n += 24 * cap(hd.lists) // slice headers
		for _, l := range hd.lists {
			n += 4 * cap(l)
		}
	}
	return n
}

// Reset empties every sequence, keeping the memory.
func (d *Decoder) Reset() {
	for _, hd := range d.heads {
		hd.truncate(0, 0)
	}
	clear(d.lens)
}

// Step implements attn.Decoder. A step that fails (bad arguments, a
// sequence past cfg.MaxLen, a cancelled context) leaves every sequence
// as it was.
func (d *Decoder) Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error {
	cfg := d.cfg
	if err := cfg.CheckStep(q, k, v, n, valid, out, lse); err != nil {
		return err
	}
	count := func(b int) int {
		if valid == nil {
			return n
		}
		return valid[b]
	}
	for b := range cfg.B {
		end := d.lens[b] + count(b)
		switch {
		case cfg.MaxLen > 0 && end > cfg.MaxLen:
			return fmt.Errorf("%w: hyper: sequence %d would hold %d positions, MaxLen = %d", attn.ErrFull, b, end, cfg.MaxLen)
		case end > math.MaxInt32:
			return fmt.Errorf("%w: hyper: sequence %d would hold %d positions, past 2^31-1", attn.ErrUnsupported, b, end)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	h, dd := cfg.H, cfg.D
	var jobs []int // b·Hkv + kvh
	for b := range cfg.B {
		nb := count(b)
		for x := nb; x < n; x++ { // padding
			for hh := range h {
				row := (b*h+hh)*n + x
				clear(out[row*dd : (row+1)*dd])
				if lse != nil {
					lse[row] = negInf
				}
			}
		}
		if nb > 0 {
			for kvh := range cfg.HKV {
				jobs = append(jobs, b*cfg.HKV+kvh)
			}
		}
	}
	if d.rot != nil {
		d.rq, d.rk, d.rv = d.rot.Copy(d.rq, q), d.rot.Copy(d.rk, k), d.rot.Copy(d.rv, v)
		q, k, v = d.rq, d.rk, d.rv
	}
	procs := cfg.Workers
	if procs == 0 {
		procs = runtime.GOMAXPROCS(0)
	}
	err := parallel.For(ctx, min(procs, len(jobs)), len(jobs), d.getScratch, func(sc *decodeScratch, i int) error {
		bh := jobs[i]
		b := bh / cfg.HKV
		return d.job(ctx, sc, b, bh%cfg.HKV, q, k, v, n, count(b), out, lse)
	})
	rows := 0
	d.mu.Lock()
	for _, sc := range d.used {
		rows += sc.rowsRead
		sc.rowsRead = 0
	}
	d.free = append(d.free, d.used...)
	d.used = d.used[:0]
	d.mu.Unlock()
	if err != nil {
		for b := range cfg.B {
			for kvh := range cfg.HKV {
				// The index too goes back to what the last committed
				// position saw: the failed positions brought it up to
				// older keys that the next query sees as recent.
				d.heads[b*cfg.HKV+kvh].truncate(d.lens[b], d.older(d.lens[b]))
			}
		}
		return ctxErr(ctx, err)
	}
	d.rowsRead += rows
	if d.rot != nil {
		// The padding rows are zeros, which rotate to zeros.
		d.rot.Rows(out, true)
	}
	for b := range cfg.B {
		d.lens[b] += count(b)
	}
	return nil
}

// getScratch hands a worker of Step a scratch, reused from earlier steps
// where one is free.
func (d *Decoder) getScratch() *decodeScratch {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sc *decodeScratch
	if n := len(d.free); n > 0 {
		sc, d.free = d.free[n-1], d.free[:n-1]
	} else {
		sc = &decodeScratch{chooser: newChooser()}
	}
	d.used = append(d.used, sc)
	return sc
}

// decodeScratch is one worker's scratch for the positions of a job.
type decodeScratch struct {
	chooser
	q        []float32     // the group's scaled query rows at one position
	qb       []uint32      // their buckets, [g][nb]
	proj     []float32     // LSH projections
	logits   []float32     // [g][keys] of the shared parts
	line     []float32     // one head's logits of every part
	nbhd     []int32       // a head's neighbourhood positions
	nbRows   decstore.Head // their rows
	ranks    []int32       // the samples' ranks among the sorted older keys
	sampPos  []int32       // their positions
	sampRows decstore.Head // their rows
	acc      []float32     // one head's output, unnormalised
	row      []float32     // a value row widened (D not a multiple of 8)
	keys     []float32     // stored keys widened, to hash
	sink     float32       // what Gather read
	rowsRead int
}

// job appends nb positions of sequence b to key/value head kvh and
// computes the outputs of the group's query heads at those positions, in
// order, each seeing the positions up to its own.
func (d *Decoder) job(ctx context.Context, sc *decodeScratch, b, kvh int, q, k, v []float32, n, nb int, out, lse []float32) error {
	cfg := d.cfg
	dd, g := cfg.D, cfg.H/cfg.HKV
	hd := d.heads[b*cfg.HKV+kvh]
	p0 := d.lens[b]
	src := (b*cfg.HKV + kvh) * n * dd
	d.store(sc, hd, p0, k[src:src+nb*dd], v[src:src+nb*dd])
	if nb == 1 {
		// A generated token attends to its own key and value as given,
		// not as stored (decstore.Head.Hold), as kvcache does.
		hd.kv.Hold(k[src:], v[src:])
		defer hd.kv.Release()
	}
	sc.qb = grow(sc.qb, g*nb)
	for hh := range g {
		row := (b*cfg.H + kvh*g + hh) * n
		sc.proj = d.lsh.buckets(sc.qb[hh*nb:(hh+1)*nb], q[row*dd:(row+nb)*dd], sc.proj)
	}
	for i := range nb {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := p0 + i
		sc.q = grow(sc.q, g*dd)
		for hh := range g {
			row := (b*cfg.H+kvh*g+hh)*n + i
			for c, x := range q[row*dd : (row+1)*dd] {
				sc.q[hh*dd+c] = x * d.scale
			}
		}
		d.position(sc, hd, kvh, p)
		for hh := range g {
			row := (b*cfg.H+kvh*g+hh)*n + i
			var l *float32
			if lse != nil {
				l = &lse[row]
			}
			d.head(sc, hd, hh, sc.qb[hh*nb+i], p, out[row*dd:(row+1)*dd], l)
		}
	}
	return nil
}

// store appends the positions of key rows k and value rows v (rotated
// already with "+rot") to hd, which holds p0 positions, and their
// buckets: those of the keys as stored, so that a key rounded or
// quantised is hashed as the steps read it.
func (d *Decoder) store(sc *decodeScratch, hd *decodeHead, p0 int, k, v []float32) {
	dd := d.cfg.D
	nb := len(k) / dd
	hd.kv.Append(k, v, d.cfg.MaxLen)
	hd.bucket = slices.Grow(hd.bucket, nb)[:p0+nb]
	if hd.kv.DType() == kvcache.F32 {
		// The stored rows are k's, bit for bit.
		sc.proj = d.lsh.buckets(hd.bucket[p0:], k, sc.proj)
		return
	}
	for i := 0; i < nb; i += hashRows {
		m := min(hashRows, nb-i)
		sc.keys = grow(sc.keys, m*dd)
		rows, _ := hd.kv.KeyRows(sc.keys, p0+i, m)
		sc.proj = d.lsh.buckets(hd.bucket[p0+i:p0+i+m], rows, sc.proj)
	}
}

// position prepares what the query heads of one group share at position
// p: the index brought up to the older keys, the recent keys' logits (or
// every key's, below Min), and the samples' positions, key rows and
// logits.
func (d *Decoder) position(sc *decodeScratch, hd *decodeHead, kvh, p int) {
	dd, g := d.cfg.D, d.cfg.H/d.cfg.HKV
	visible := p + 1
	old := d.older(visible)
	for hd.indexed < old {
		hd.index(hd.indexed, d.a.projs)
	}
	recent := visible - old
	ns := min(d.samples, old)
	sc.logits = grow(sc.logits, g*(recent+ns))
	hd.kv.DotKeys(sc.logits, recent+ns, sc.q, dd, g, old, recent, 0, 0)
	sc.rowsRead += recent
	sc.sampPos, sc.ranks = sc.sampPos[:0], nil
	if ns == 0 {
		return
	}
	sc.ranks = sc.picks(d.a.seed, kvh, p, old, ns)
	for _, r := range sc.ranks {
		bk, off := hd.find(int(r), d.a.projs)
		sc.sampPos = append(sc.sampPos, hd.lists[bk][off])
	}
	// The samples' rows, values next to their keys, for every head of
	// the group.
	sc.sink += hd.kv.Gather(&sc.sampRows, sc.sampPos)
	sc.sampRows.DotKeys(sc.logits[recent:], recent+ns, sc.q, dd, g, 0, ns, 0, 0)
	sc.rowsRead += ns
}

// older returns how many positions a query sees beyond its exact recent
// ones, when it sees visible positions: 0 below Min, where the decoder is
// exact like Forward.
func (d *Decoder) older(visible int) int {
	if d.a.min > 0 && visible < d.a.min {
		return 0
	}
	return max(0, visible-d.window)
}

// head computes the output of group member hh, whose query has bucket
// bucket, at position p, once position has run: the recent keys and the
// neighbourhood exactly, the kept samples weighted by rest/kept.
func (d *Decoder) head(sc *decodeScratch, hd *decodeHead, hh int, bucket uint32, p int, out []float32, lse *float32) {
	dd := d.cfg.D
	visible := p + 1
	old := d.older(visible)
	recent := visible - old
	ns := len(sc.sampPos)
	stride := recent + ns
	m := min(d.nbhd, old)

	// The neighbourhood: ranks [lo, lo+m) of the sorted older keys,
	// centred on the middle of the query's bucket's run.
	lo := 0
	sc.nbhd = sc.nbhd[:0]
	if m > 0 {
		mid := hd.prefix(bucket) + len(hd.lists[bucket])/2
		lo = min(max(mid-m/2, 0), old-m)
		for r := lo; r < lo+m; {
			bk, off := hd.find(r, d.a.projs)
			take := min(len(hd.lists[bk])-off, lo+m-r)
			sc.nbhd = append(sc.nbhd, hd.lists[bk][off:off+take]...)
			r += take
		}
	}
	n := recent + m + ns
	sc.line = grow(sc.line, n)
	line := sc.line
	copy(line, sc.logits[hh*stride:][:recent])
	if m > 0 {
		sc.sink += hd.kv.Gather(&sc.nbRows, sc.nbhd)
		sc.nbRows.DotKeys(line[recent:], m, sc.q[hh*dd:], dd, 1, 0, m, 0, 0)
		sc.rowsRead += m
	}
	if ns > 0 {
		// The samples whose rank falls in the neighbourhood are left out;
		// the others, kept, are a uniform sample of the rest.
		kept := 0
		for _, r := range sc.ranks {
			if int(r) < lo || int(r) >= lo+m {
				kept++
			}
		}
		logw := negInf
		if rest := old - m; kept > 0 && rest > 0 {
			logw = float32(math.Log(float64(rest) / float64(kept)))
		}
		sl := line[recent+m:]
		for t, r := range sc.ranks {
			sl[t] = negInf
			if int(r) < lo || int(r) >= lo+m {
				sl[t] = sc.logits[hh*stride+recent+t] + logw
			}
		}
	}
	mx := simd.Max(line)
	sum := simd.ExpSum(line, mx)
	sc.acc = grow(sc.acc, dd)
	clear(sc.acc)
	sc.row = grow(sc.row, dd)
	// The values of each part from where its keys were read: the recent
	// run in place, the neighbourhood and the samples from their
	// gathered rows. Samples left out weigh 0 and add nothing.
	hd.kv.AddValues(line, recent, 1, old, recent, sc.acc, sc.row, 0, 0)
	if m > 0 {
		sc.nbRows.AddValues(line[recent:], m, 1, 0, m, sc.acc, sc.row, 0, 0)
	}
	if ns > 0 {
		sc.sampRows.AddValues(line[recent+m:], ns, 1, 0, ns, sc.acc, sc.row, 0, 0)
	}
	inv := 1 / sum
	for c := range out {
		out[c] = sc.acc[c] * inv
	}
	if lse != nil {
		*lse = mx + float32(math.Log(float64(sum)))
	}
}

// index adds position p's key to the index.
func (hd *decodeHead) index(p, projs int) {
	if hd.fen == nil {
		hd.fen = make([]int32, 1<<projs+1)
		hd.lists = make([][]int32, 1<<projs)
	}
	bk := hd.bucket[p]
	hd.lists[bk] = append(hd.lists[bk], int32(p))
	for i := int(bk) + 1; i < len(hd.fen); i += i & -i {
		hd.fen[i]++
	}
	hd.indexed = p + 1
}

// truncate drops the positions from n on out of the store, and those
// from keep on (keep <= n) out of the index (they are the last of their
// buckets' lists).
func (hd *decodeHead) truncate(n, keep int) {
	for hd.indexed > keep {
		hd.indexed--
		bk := hd.bucket[hd.indexed]
		hd.lists[bk] = hd.lists[bk][:len(hd.lists[bk])-1]
		for i := int(bk) + 1; i < len(hd.fen); i += i & -i {
			hd.fen[i]--
		}
	}
	n = min(n, len(hd.bucket))
	hd.kv.Truncate(min(n, hd.kv.Len()))
	hd.bucket = hd.bucket[:n]
}

// prefix returns the number of indexed keys with a bucket below bk.
func (hd *decodeHead) prefix(bk uint32) int {
	s := 0
	for i := int(bk); i > 0; i -= i & -i {
		s += int(hd.fen[i])
	}
	return s
}

// find returns the bucket holding rank r of the sorted indexed keys and
// r's offset in that bucket's list.
func (hd *decodeHead) find(r, projs int) (bk uint32, off int) {
	at := 0
	for step := 1 << projs; step > 0; step >>= 1 {
		if next := at + step; next < len(hd.fen) && int(hd.fen[next]) <= r {
			at = next
			r -= int(hd.fen[next])
		}
	}
	return uint32(at), r
}
