package reformer

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore"
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/kvcache"
)

// decodeCore is what the sequences of a decoder share: the sizes, the
// causal rule, the hash rotations and the storage of the rows.
type decodeCore struct {
	cfg       Config
	ru        rule
	h, hkv, d int
	scale     float32
	hs        *hasher
	lists     int // bucket lists per sequence: Hkv·Hashes·buckets
	dt        kvcache.DType
	// rot, with Storage "+rot", rotates keys, values and queries before
	// they are stored, hashed or attended, and the outputs back; nil
	// without.
	rot *lowbit.Rotation
}

// newDecodeCore checks the sizes of a decoder of b sequences, and what
// they make it allocate, before allocating anything. Rows are stored as
// dt, rotated when rot is set.
func newDecodeCore(cfg Config, b, h, hkv, d int, scale float32, dt kvcache.DType, rot bool) (*decodeCore, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if b <= 0 || h <= 0 || hkv <= 0 || d <= 0 || h%hkv != 0 || d > maxIndex || h > maxIndex {
		return nil, fmt.Errorf("%w: reformer: decoder with B = %d, H = %d, Hkv = %d, D = %d: want positive sizes and H a multiple of Hkv",
			attn.ErrShape, b, h, hkv, d)
	}
	if c.SharedQK && h != hkv {
		return nil, fmt.Errorf("%w: reformer: shared QK needs H == Hkv, got %d and %d", attn.ErrUnsupported, h, hkv)
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return nil, fmt.Errorf("%w: reformer: scale %v is not finite", attn.ErrInput, scale)
	}
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(d)))
	}
	factors := bucketFactors(c.causalBuckets())
	if err := checkRotation(c.Hashes, d, factors); err != nil {
		return nil, err
	}
	nb := 1
	for _, f := range factors {
		nb *= f
	}
	// A list per (sequence, kv head, round, bucket), each a slice header
	// even while empty.
	perSeq := c.Hashes * nb
	if hkv > MaxDecodeLists/perSeq || b > MaxDecodeLists/(hkv*perSeq) {
		return nil, fmt.Errorf("%w: reformer: a decoder of B·Hkv·Hashes·buckets = %d·%d·%d·%d bucket lists exceeds %d; use fewer hashes or buckets",
			attn.ErrUnsupported, b, hkv, c.Hashes, nb, MaxDecodeLists)
	}
	dc := &decodeCore{
		cfg: c, ru: c.rule(), h: h, hkv: hkv, d: d, scale: scale,
		hs:    newHasher(c.Seed, c.Hashes, d, factors),
		lists: hkv * perSeq,
		dt:    dt,
	}
	if rot {
		dc.rot = lowbit.NewRotation(d)
	}
	return dc, nil
}

// sequence is one sequence's keys and values per kv head, with every key
// filed under its bucket in every round.
type sequence struct {
	n     int
	heads []decstore.Head // [kvh]: the rows as stored (rotated with "+rot")
	lists [][]int32       // [(kvh·Hashes + round)·buckets + bucket] → positions, ascending
}

func (c *decodeCore) newSequence() *sequence {
	sq := &sequence{heads: make([]decstore.Head, c.hkv), lists: make([][]int32, c.lists)}
	for kvh := range sq.heads {
		sq.heads[kvh] = *decstore.NewHead(c.d, c.dt)
	}
	return sq
}

// checkGrow rejects appending t tokens to sq past maxLen (when positive)
// or past the int32 positions.
func (sq *sequence) checkGrow(t, maxLen int) error {
	if maxLen > 0 && sq.n+t > maxLen {
		return fmt.Errorf("%w: reformer: %d + %d positions exceed MaxLen = %d", kvcache.ErrFull, sq.n, t, maxLen)
	}
	if t > maxIndex-sq.n {
		return fmt.Errorf("%w: reformer: a sequence of more than 2^31-1 tokens", attn.ErrUnsupported)
	}
	return nil
}

// append adds t tokens: the key and value of token i in kv head kvh are
// the rows (kvh·stride + i)·D of k and v. With shared QK, k holds the
// tokens' queries, which are stored normalised to unit length as keys.
// With a rotation the rows are stored rotated (a key normalised first:
// the rotation keeps its norm). The storage grows as for a sequence of
// at most maxLen positions (0: no limit). w is the scratch of the
// calling goroutine. With hold and t = 1 the token's key and value are
// then held as given (decstore.Head.Hold: the token attends to its own
// rows unrounded) until the caller releases them; its buckets are of the
// key as stored all the same.
func (c *decodeCore) append(sq *sequence, k, v []float32, t, stride, maxLen int, w *decodeScratch, kb []int32, hold bool) {
	d, R, nb := c.d, c.cfg.Hashes, c.hs.buckets
	for kvh := range c.hkv {
		hd := &sq.heads[kvh]
		src := kvh * stride * d
		kr, vr := k[src:src+t*d], v[src:src+t*d]
		if c.cfg.SharedQK {
			w.rk = grow(w.rk, t*d)
			for i := range t {
				normalizeRow(w.rk[i*d:], kr[i*d:(i+1)*d])
			}
			kr = w.rk
		}
		if c.rot != nil {
			if !c.cfg.SharedQK {
				w.rk = append(w.rk[:0], kr...)
				kr = w.rk
			}
			w.rv = append(w.rv[:0], vr...)
			vr = w.rv
			c.rot.Rows(kr, false)
			c.rot.Rows(vr, false)
		}
		at := hd.Len()
		hd.Append(kr, vr, maxLen)
		for i := range t {
			// The key as stored (rounded or quantised, rotated), as a
			// step reads it: a shared-QK query takes its own key's
			// buckets from this row.
			c.hs.hashRow(hd.K(w.row, at+i), w.proj, kb)
			for r := range R {
				l := &sq.lists[(kvh*R+r)*nb+int(kb[r])]
				*l = append(*l, int32(sq.n+i))
			}
		}
		if hold && t == 1 {
			hd.Hold(kr, vr)
		}
	}
	sq.n += t
}

// attend writes to out the attention of qh, the query of head h at
// position p of sq (whose key is in sq, at most p+1 keys being seen), by
// the causal rule, and returns its lse. With a rotation, qh is the
// rotated query and out the rotated output.
func (c *decodeCore) attend(sq *sequence, h, p int, qh []float32, w *decodeScratch, out []float32) float32 {
	kvh := h / (c.h / c.hkv)
	if p < 0 {
		clear(out)
		return negInf
	}
	hd := &sq.heads[kvh]
	if c.cfg.SharedQK {
		// Hashing its own key (the normalised query, as stored) gives
		// the query its key's buckets.
		c.hs.hashRow(hd.K(w.row, p), w.proj, w.qb)
	} else {
		c.hs.hashRow(qh, w.proj, w.qb)
	}
	R, nb := c.cfg.Hashes, c.hs.buckets
	for r := range R {
		w.lists[r] = sq.lists[(kvh*R+r)*nb+int(w.qb[r])]
	}
	w.cand = c.ru.gather(w.cand, &w.seen, p, p+1, w.lists)
	logits := w.logitsFor(len(w.cand))
	if c.dt == kvcache.F32 {
		// The rows in place, through the kernels of causal Forward: the
		// same bits.
		return attendRow(qh, hd.KV, hd.KV[c.d:], hd.Stride(), c.d, w.cand, c.scale, logits, out)
	}
	return w.attendStored(qh, hd, w.cand, c.scale, logits, out)
}

// attendStored is attendRow over the keys and values of hd at the
// positions cand, stored as 16-bit floats, int8 or int4 codes: the
// candidates' rows are first copied into the scratch's Head (their misses
// overlap, and the int8 and int4 products use memory of that Head's own,
// which the goroutines attending other heads of the same kv head must
// not share),
// then one product gives the logits and one more the output.
func (w *decodeScratch) attendStored(qh []float32, hd *decstore.Head, cand []int32, scale float32, logits, out []float32) float32 {
	clear(out)
	if len(cand) == 0 {
		return negInf
	}
	n := len(cand)
	logits = logits[:n]
	w.sink += hd.Gather(&w.kv, cand)
	w.kv.DotKeys(logits, n, qh, len(qh), 1, 0, n, 0, 0)
	for i := range logits {
		logits[i] *= scale
	}
	mx, sum := softmaxWeights(logits)
	w.kv.AddValues(logits, n, 1, 0, n, out, w.row, 0, 0)
	simd.Scale(out, 1/sum)
	return mx + float32(math.Log(float64(sum)))
}

// bytes returns the memory of sq.
func (sq *sequence) bytes() int {
	n := 0
	for kvh := range sq.heads {
		n += sq.heads[kvh].Bytes()
	}
	for _, l := range sq.lists {
		n += 24 + 4*cap(l)
	}
	return n
}

func (sq *sequence) reset() {
	sq.n = 0
	for kvh := range sq.heads {
		sq.heads[kvh].Truncate(0)
	}
	for i := range sq.lists {
		sq.lists[i] = sq.lists[i][:0]
	}
}

// decodeScratch is one goroutine's scratch of a decoder.
type decodeScratch struct {
	rowScratch
	row    []float32     // [D]: a key read back to be hashed, or a value widened
	kv     decstore.Head // the candidates' rows, for storage other than float32
	rk, rv []float32     // keys and values of an append, normalised or rotated
	sink   float32       // what Gather read
}

// newScratch returns the scratch of one goroutine of a decoder.
func (c *decodeCore) newScratch() *decodeScratch {
	return &decodeScratch{
		rowScratch: rowScratch{
			proj:  c.hs.rowScratch(),
			qb:    make([]int32, c.cfg.Hashes),
			lists: make([][]int32, c.cfg.Hashes),
		},
		row: make([]float32, c.d),
	}
}

func (w *decodeScratch) bytes() int {
	return 4*(cap(w.proj)+cap(w.qb)+cap(w.seen.stamp)+cap(w.cand)+cap(w.logits)+cap(w.row)+cap(w.rk)+cap(w.rv)) + w.kv.Bytes()
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// normalizeRow writes src scaled to unit length to dst (a zero row stays
// zero), exactly as normalizedRows does for each of its rows.
func normalizeRow(dst, src []float32) {
	var ss float64
	for _, v := range src {
		ss += float64(v) * float64(v)
	}
	if ss == 0 {
		clear(dst[:len(src)])
		return
	}
	inv := float32(1 / math.Sqrt(ss))
	for c, v := range src {
		dst[c] = v * inv
	}
}

// Decoder is Reformer attention for generating one sequence a token at a
// time, by the causal rule of causal Forward (see the package
// documentation): it keeps the sequence's keys and values per kv head
// with every key filed under its bucket in every round, so that a step
// costs O(H·(Hashes·2·Bucket + Window)·D) whatever the cache length:
//
//   - Append(k, v) adds tokens to the cache and files each key under its
//     bucket of every round;
//   - Step(q) attends the query of the newest token (at position Len()-1)
//     to the keys the causal rule gives it: exactly what causal Forward
//     over the same tokens computes for that position, when Forward does
//     not fall back to exact attention.
//
// It keeps keys and values in float32. For a batch of sequences, prompts
// of several tokens, narrower storage and the attn.Decoder interface, see
// LSH.NewDecoder. A Decoder is not safe for concurrent use.
type Decoder struct {
	c  *decodeCore
	sq *sequence
	w  *decodeScratch
	kb []int32
}

// NewDecoder returns an empty decoder for h query heads reading hkv
// key/value heads of size d. scale multiplies the logits; 0 means
// 1/sqrt(d). The bucket count is Config.Buckets, or DefaultCausalBuckets
// when it is 0. The rotations are drawn here, exactly as causal Forward
// draws them. Sizes whose tables would exceed MaxRotationFloats or
// MaxDecodeLists are rejected (attn.ErrUnsupported) before anything is
// allocated.
func NewDecoder(cfg Config, h, hkv, d int, scale float32) (*Decoder, error) {
	c, err := newDecodeCore(cfg, 1, h, hkv, d, scale, kvcache.F32, false)
	if err != nil {
		return nil, err
	}
	return &Decoder{c: c, sq: c.newSequence(), w: c.newScratch(), kb: make([]int32, c.cfg.Hashes)}, nil
}

// Len returns the number of tokens in the cache.
func (dec *Decoder) Len() int { return dec.sq.n }

// Append adds t tokens to the cache: k and v are [Hkv][t][D], the layout of
// K and V in package attn for one batch row. With Config.SharedQK, k holds
// the tokens' queries, which are normalised to unit length as keys.
func (dec *Decoder) Append(k, v []float32) error {
	row := dec.c.hkv * dec.c.d
	if len(k) != len(v) || len(k)%row != 0 {
		return fmt.Errorf("%w: reformer: Append got len(k) = %d, len(v) = %d, want equal multiples of Hkv·D = %d",
			attn.ErrShape, len(k), len(v), row)
	}
	t := len(k) / row
	if err := dec.sq.checkGrow(t, 0); err != nil {
		return err
	}
	dec.c.append(dec.sq, k, v, t, t, 0, dec.w, dec.kb, false)
	return nil
}

// Step attends q, the queries [H][D] of the newest token (position
// Len()-1), to its keys in the cache and writes out [H][D] and, when lse
// is not nil, lse [H]: the log-sum-exp over the keys used. With an empty
// cache every row gets out 0 and lse -Inf. With Config.SharedQK the
// query's buckets are those of its own key, filed by Append.
func (dec *Decoder) Step(q, out, lse []float32) error {
	c := dec.c
	n := c.h * c.d
	if len(q) != n || len(out) != n || (lse != nil && len(lse) != c.h) {
		return fmt.Errorf("%w: reformer: Step got len(q) = %d, len(out) = %d, len(lse) = %d, want H·D = %d and H = %d",
			attn.ErrShape, len(q), len(out), len(lse), n, c.h)
	}
	for h := range c.h {
		l := c.attend(dec.sq, h, dec.sq.n-1, q[h*c.d:(h+1)*c.d], dec.w, out[h*c.d:(h+1)*c.d])
		if lse != nil {
			lse[h] = l
		}
	}
	return nil
}

// BatchDecoder is the attn.Decoder of Reformer attention, made by
// LSH.NewDecoder: one sequence state (keys and values in the storage of
// DecodeConfig.Storage, each key filed under its bucket in every round)
// per sequence of the batch, so that sequences may hold different
// lengths. A step attends each new position by the causal rule, the one
// causal Forward follows: with float32 storage, decoding a sequence in
// any chunks gives what causal Forward over all its tokens gives, bit for
// bit, when Forward does not fall back to exact attention (the decoder
// never does); with other storage it is the same rule over the stored
// rows and their hashes. A step of one token costs
// O(H·(Hashes·2·Bucket + Window)·D) whatever the length.
//
// With Config.SharedQK a step's keys are its queries (normalised); its k
// must still have the length of K and is not read.
type BatchDecoder struct {
	c       *decodeCore
	dc      attn.DecodeConfig
	seqs    []*sequence
	scratch []*decodeScratch // one per goroutine of a step, kept across steps
	kb      []int32
	rq      []float32 // a step's queries rotated, with Storage "+rot"
}

// NewDecoder implements attn.Decodable: an empty BatchDecoder of cfg.B
// sequences with l's settings. cfg.Storage is "" or "f32" (decoding is
// then causal Forward, bit for bit), "bf16" or "f16" (rows rounded to
// nearest as they are stored), "i8" (8-bit codes, a float32 scale a row)
// or "i4" (4-bit codes quantised per token: each row's channels in
// groups of 64 with a float32 scale and zero a group), each optionally with "+rot" (keys and values stored rotated by
// a Hadamard rotation with sign flips, queries rotated alike, outputs
// rotated back). Keys are hashed as they are stored (rounded or
// quantised, rotated) and queries as they are attended (rotated), so that
// a step is the causal rule over the stored rows; see the package
// documentation, Decoding. cfg.Window (a StreamingLLM window) is not
// supported (attn.ErrUnsupported): evicting old
// keys would drop keys the buckets still reach, changing the rule, and
// decoding would no longer match Forward. Config.Window, the local
// window of the rule, is another thing. A malformed storage name wraps
// attn.ErrInput. Sizes are checked before anything is allocated;
// cfg.MaxLen bounds each sequence but is not allocated up front.
func (l *LSH) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dt, rot, err := decstore.ParseStorage("reformer", cfg.Storage)
	if err != nil {
		return nil, err
	}
	if cfg.Window > 0 {
		return nil, fmt.Errorf("%w: reformer: decoder Window = %d: a StreamingLLM window would evict keys the hash buckets still reach, so decoding would no longer follow the causal rule of Forward",
			attn.ErrUnsupported, cfg.Window)
	}
	c, err := newDecodeCore(l.cfg, cfg.B, cfg.H, cfg.HKV, cfg.D, cfg.ScaleFor(), dt, rot)
	if err != nil {
		return nil, err
	}
	d := &BatchDecoder{c: c, dc: cfg, seqs: make([]*sequence, cfg.B), kb: make([]int32, c.cfg.Hashes)}
	for b := range d.seqs {
		d.seqs[b] = c.newSequence()
	}
	return d, nil
}

// Len returns the positions appended to sequence b.
func (d *BatchDecoder) Len(b int) int { return d.seqs[b].n }

// Bytes returns the memory of the sequences, the scratch and the
// rotations.
func (d *BatchDecoder) Bytes() int {
	n := 4 * (len(d.c.hs.rot) + cap(d.rq))
	if d.c.rot != nil {
		n += 4 * d.c.d // its signs
	}
	for _, sq := range d.seqs {
		n += sq.bytes()
	}
	for _, w := range d.scratch {
		n += w.bytes()
	}
	return n
}

// Reset empties every sequence, keeping the memory.
func (d *BatchDecoder) Reset() {
	for _, sq := range d.seqs {
		sq.reset()
	}
}

// decodeRowsPerWorker is the least number of query rows worth a goroutine
// of their own in a step: a one-token step of one sequence runs in the
// calling goroutine.
const decodeRowsPerWorker = 16

// Step implements attn.Decoder. A step that fails its checks (shapes,
// MaxLen) appends nothing.
func (d *BatchDecoder) Step(ctx context.Context, q, k, v []float32, n int, valid []int, out, lse []float32) error {
	cfg, c := d.dc, d.c
	if err := cfg.CheckStep(q, k, v, n, valid, out, lse); err != nil {
		return err
	}
	count := func(b int) int {
		if valid == nil {
			return n
		}
		return valid[b]
	}
	for b, sq := range d.seqs {
		if err := sq.checkGrow(count(b), cfg.MaxLen); err != nil {
			return fmt.Errorf("sequence %d: %w", b, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	h, hkv, dd := c.h, c.hkv, c.d
	start := make([]int, len(d.seqs)) // each sequence's length before the step
	if len(d.scratch) == 0 {
		d.scratch = append(d.scratch, c.newScratch())
	}
	for b, sq := range d.seqs {
		start[b] = sq.n
		src := k[b*hkv*n*dd:]
		if c.cfg.SharedQK {
			src = q[b*h*n*dd:] // H == Hkv: the same layout
		}
		// A generated token reads its own rows as given, as kvcache
		// does; not with shared QK, whose query hashes its own key as
		// stored to find its key's buckets.
		c.append(sq, src, v[b*hkv*n*dd:], count(b), n, cfg.MaxLen, d.scratch[0], d.kb, d.SingleAsGiven())
	}
	defer func() {
		for _, sq := range d.seqs {
			for kvh := range sq.heads {
				sq.heads[kvh].Release()
			}
		}
	}()
	if c.rot != nil {
		// The padding rows too (they are not read): one pass over q.
		d.rq = c.rot.Copy(d.rq, q)
		q = d.rq
	}
	blocks := (n + causalRows - 1) / causalRows
	tasks := cfg.B * h * blocks
	workers := attn.Options{Workers: cfg.Workers}.WorkerCount(runtime.GOMAXPROCS(0), (cfg.B*h*n+decodeRowsPerWorker-1)/decodeRowsPerWorker)
	workers = min(workers, tasks)
	for len(d.scratch) < workers {
		d.scratch = append(d.scratch, c.newScratch())
	}
	var next atomic.Int64
	scratch := func() *decodeScratch { return d.scratch[next.Add(1)-1] }
	return parallel.For(ctx, workers, tasks, scratch, func(w *decodeScratch, t int) error {
		bh, blk := t/blocks, t%blocks
		b, hd := bh/h, bh%h
		sq, cnt := d.seqs[b], count(b)
		for i := blk * causalRows; i < min((blk+1)*causalRows, n); i++ {
			row := bh*n + i
			o := out[row*dd:][:dd]
			var x float32
			if i < cnt {
				x = c.attend(sq, hd, start[b]+i, q[row*dd:][:dd], w, o)
				if c.rot != nil {
					c.rot.Invert(o)
				}
			} else {
				clear(o)
				x = negInf
			}
			if lse != nil {
				lse[row] = x
			}
		}
		return nil
	})
}

// SingleAsGiven reports whether a step that brings a sequence one
// position reads that position's key and value as given, not as stored:
// without shared QK (see Step).
func (d *BatchDecoder) SingleAsGiven() bool { return !d.c.cfg.SharedQK }

var (
	_ attn.Decoder    = (*BatchDecoder)(nil)
	_ attn.Decodable  = (*LSH)(nil)
	_ attn.Fallbacker = (*LSH)(nil)
)
