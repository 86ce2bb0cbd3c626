// Package decstore is what the decoders that read a fraction of the cache
// (packages quest and magicpig) share: keys and values per sequence and
// key/value head, as float32, as 16-bit floats (Storage "bf16" or "f16",
// rounded to nearest as they are stored, read by kernels that widen them
// in registers, at half the bytes a step), as 8-bit codes (Storage "i8",
// see Int8) or as 4-bit codes (Storage "i4", see Int4), optionally
// rotated ("+rot", see Rotation), the exact
// prefill rule, and the skeleton
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
// Either way a step's own keys and values are read as given (float32),
// not as stored, as kvcache attends a step's own rows and FlashAttention
// a prompt's: the prefill reads the chunk's rows from the step, and a
// decoded token's are held (Head.Hold) while the rule runs.
//
// # Int4
//
// Storage "i4" keeps values as 4-bit codes quantised per token: each
// row's channels in groups of lowbit.ChanGroup with a float32 scale and
// zero a group, as kvcache stores them. Keys are quantised per channel
// over groups of KeyGroup positions (KIVI, as kvcache does) where the
// decoder asks for it (NewStore's keyGroup, which quest does), the
// positions after the last complete group kept in float32 until it
// completes (Head.Settle, at commit). Rules that read single rows at
// scattered positions (Gather: magicpig; hyper and reformer, which keep
// their rows in Heads) have keys quantised per token instead, so that a
// row carries its own scales; "+rot" then spreads their outlier
// channels, which is what scales per channel were for, though not as
// well (perplexity of austen-long: see results/long). A position's codes
// and scales are one run of bytes, read by the kernels in place
// (simd.DotRowsU4, simd.GemmU4): a D = 128 position is 160 bytes
// (per-token keys) or 144 plus its share of the group's scales, against
// 1024 in float32.
//
// # Int8
//
// Storage "i8" keeps each key and each value as int8 codes with one
// float32 scale a row (lowbit.QuantI8, as kvcache's I8 stores them), the
// scales and the key's norm beside the codes: a D = 128 position is 268
// bytes, against 512 in bfloat16, and every position carries its own
// scales, so that rules reading scattered rows (Gather) read one run of
// bytes a position. A value is read back within a 254th of its row's
// largest magnitude, where int4's is within a 30th of its group's range.
//
// # Rotation
//
// Storage "+rot" (after any element type) stores R·k and R·v for kvcache's
// rotation R (package lowbit), rotates the queries alike (R·q · R·k = q·k)
// and rotates the outputs back. Rules see rotated queries and keys only,
// so that their indexes (page bounds, hashes) are of the rotated keys.
package decstore

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/hugepage"
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
	"github.com/attnkit/attn/kvcache"
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
// interleaved: row j ([2][D]) is key j, then value j, in KV (float32
// storage) or in KV16 (bfloat16 or binary16; DType says which), or
// position j's i8Row in KV8 or i4Row in KV4. A decode rule that gathers scattered
// positions then finds a value next to its key, one run of memory for
// the prefetchers to bring in.
//
// The methods that compute (DotKeys, AddValues) use memory of the Head's
// own for int8 and int4 rows: a Head is used by one goroutine at a time.
type Head struct {
	KV   []float32
	KV16 []uint16
	KV4  []uint8
	KV8  []int8
	d    int
	dt   kvcache.DType
	tmp  []float32 // int8 and int4 products' scratch

	// Int4 keys quantised per channel (kg > 0, see Int4): groups of kg
	// positions; kp holds the scales and zeros of the complete groups
	// ([groups][2][D]), kres the float32 keys of the positions after
	// them, not yet quantised.
	kg   int
	kp   []float32
	kres []float32

	// held > 0: position held-1's key and value are read as fk and fv,
	// the rows as given, not as stored (Hold). 0, a Head's zero value,
	// holds nothing.
	held   int
	fk, fv []float32
}

// i4Row is the layout of a position of int4 storage, in bytes: the key's
// packed codes (pw = lowbit.Stride(D)/2 bytes), the value's, then, for
// keys per token (tok 1), ng = lowbit.ChanGroups(D) float32 key scales
// and ng key zeros, in any case ng value scales and ng value zeros, and
// for keys per token the norm of the key as read back (KeyNorm), which a
// rule reading scattered rows would otherwise dequantise the key for.
type i4Row struct{ pw, ng, tok, size int }

func (h *Head) layout() i4Row {
	pw, ng, tok := lowbit.Stride(h.d)/2, lowbit.ChanGroups(h.d), 1
	if h.kg > 0 {
		tok = 0
	}
	return i4Row{pw: pw, ng: ng, tok: tok, size: 2*pw + 8*(tok+1)*ng + 4*tok}
}

// params returns the scales and zeros (2·(tok+1)·ng float32: key scales
// and zeros for keys per token, value scales, value zeros; then the key's
// norm for keys per token) of the int4 row at byte offset off of buf.
func (r i4Row) params(buf []uint8, off int) []float32 {
	return floatsAt(buf[off+2*r.pw:], 2*(r.tok+1)*r.ng+r.tok)
}

// floatsAt returns the n float32 that the low-bit rows keep beside their
// codes, from b[0], in place. Their offsets are multiples of 4 and the
// rows' memory is 4-aligned (Go allocates byte slices 8-aligned at
// least).
func floatsAt[T int8 | uint8](b []T, n int) []float32 {
	b = b[:4*n]
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// floatColumn sets dst[i] to the float32 at b[i·stride], for i <
// len(dst): one parameter (a scale, a zero) of consecutive low-bit rows,
// in the byte order floatsAt wrote it in (the machine's).
func floatColumn[T int8 | uint8](dst []float32, b []T, stride int) {
	for i := range dst {
		dst[i] = *(*float32)(unsafe.Pointer(&b[i*stride]))
	}
}

// values returns the value scales and zeros of the params of a row.
func (r i4Row) values(p []float32) (scale, zero []float32) {
	o := 2 * r.tok * r.ng
	return p[o:][:r.ng], p[o+r.ng:][:r.ng]
}

// DType returns the element type of the stored rows: kvcache.F32, BF16,
// F16, I8 or I4.
func (h *Head) DType() kvcache.DType { return h.dt }

// K returns key row j as float32: the stored row itself for float32
// storage, else the row widened into dst (len >= D).
func (h *Head) K(dst []float32, j int) []float32 { return h.row(dst, 2*j) }

// V returns value row j as K returns key rows.
func (h *Head) V(dst []float32, j int) []float32 { return h.row(dst, 2*j+1) }

func (h *Head) row(dst []float32, r int) []float32 {
	if h.held > 0 && r/2 == h.held-1 {
		if r%2 == 0 {
			return append(dst[:0], h.fk...)
		}
		return append(dst[:0], h.fv...)
	}
	switch h.dt {
	case kvcache.F32:
		return h.KV[r*h.d:][:h.d]
	case kvcache.I8:
		return h.rowI8(dst[:h.d], r/2, r%2 == 1)
	case kvcache.I4:
		return h.rowI4(dst[:h.d], r/2, r%2 == 1)
	}
	dst = dst[:h.d]
	h.widen(dst, h.KV16[r*h.d:][:h.d])
	return dst
}

func (h *Head) widen(dst []float32, src []uint16) {
	if h.dt == kvcache.BF16 {
		simd.WidenBF16(dst, src)
	} else {
		simd.WidenF16(dst, src)
	}
}

// KeyNorm returns the Euclidean norm of key j as K reads it, computed
// in float32 products summed by simd.Dot, or, for int8 keys and int4 keys
// quantised per token, as stored beside the codes (within rounding of
// the same).
// dst (len >= D) may hold the key.
func (h *Head) KeyNorm(dst []float32, j int) float64 {
	if h.held == 0 || j != h.held-1 { // the norm stored beside the codes
		switch {
		case h.dt == kvcache.I8:
			return float64(h.paramsI8(j)[2])
		case h.dt == kvcache.I4 && h.kg == 0:
			l := h.layout()
			return float64(l.params(h.KV4, j*l.size)[4*l.ng])
		}
	}
	k := h.K(dst, j)
	return math.Sqrt(float64(simd.Dot(k, k)))
}

// KeyRows returns keys [j, j+n) as float32 rows and their stride: the
// stored rows themselves (stride Stride) for float32 storage, else the
// rows widened into dst (len >= n·D, stride D).
func (h *Head) KeyRows(dst []float32, j, n int) ([]float32, int) {
	switch h.dt {
	case kvcache.F32:
		return h.KV[2*j*h.d:], 2 * h.d
	case kvcache.I8:
		for i := range n {
			h.rowI8(dst[i*h.d:][:h.d], j+i, false)
		}
	case kvcache.I4:
		for i := range n {
			h.rowI4(dst[i*h.d:][:h.d], j+i, false)
		}
	default:
		for i := range n {
			h.widen(dst[i*h.d:][:h.d], h.KV16[2*(j+i)*h.d:][:h.d])
		}
	}
	if i := h.heldIn(j, n); i >= 0 {
		copy(dst[i*h.d:][:h.d], h.fk)
	}
	return dst[:n*h.d], h.d
}

// Prefetch asks the processor to bring the rows (key and value) of
// positions pos into its caches without waiting for them (see
// simd.Prefetch), so that a rule can request the next batch of scattered
// rows while it computes on the current one and Gather then finds them
// in cache. Rows of int4 keys quantised per channel are not requested.
func (h *Head) Prefetch(pos []int32) {
	switch {
	case h.dt == kvcache.F32:
		prefetchRows(h.KV, pos, 2*h.d)
	case h.dt == kvcache.I8:
		prefetchRows(h.KV8, pos, i8Layout(h.d).size)
	case h.dt == kvcache.I4:
		if h.kg == 0 {
			prefetchRows(h.KV4, pos, h.layout().size)
		}
	default:
		prefetchRows(h.KV16, pos, 2*h.d)
	}
}

func prefetchRows[T float32 | uint16 | uint8 | int8](src []T, pos []int32, st int) {
	for _, x := range pos {
		if j := int(x) * st; j >= 0 && j+st <= len(src) {
			simd.Prefetch(src[j : j+st])
		}
	}
}

// Gather sets dst to the rows (key and value) of positions pos, in that
// order, in h's element type (a held position stays held: its last
// place in pos is), reusing dst's memory, and returns a sum of
// some of their elements, which the caller keeps somewhere the compiler
// cannot see through. The lines of all the rows are read once, with four
// independent sums, before any row is copied, so that their misses are
// in flight together; the copy then reads them from cache, where copying
// row by row would wait for each row's misses in turn.
func (h *Head) Gather(dst *Head, pos []int32) float32 {
	dst.d, dst.dt, dst.held = h.d, h.dt, 0
	if h.held > 0 {
		// The held position stays held in the copy, at its place
		// there.
		for i, x := range pos {
			if int(x) == h.held-1 {
				dst.held = i + 1
				dst.fk, dst.fv = append(dst.fk[:0], h.fk...), append(dst.fv[:0], h.fv...)
			}
		}
	}
	switch h.dt {
	case kvcache.F32:
		var sink float32
		dst.KV, sink = gather(dst.KV, h.KV, pos, 2*h.d)
		return sink
	case kvcache.I8:
		var sink int8
		dst.KV8, sink = gather(dst.KV8, h.KV8, pos, i8Layout(h.d).size)
		return float32(sink)
	case kvcache.I4:
		if h.kg > 0 {
			panic("decstore: Gather of int4 keys quantised per channel")
		}
		var sink uint8
		dst.KV4, sink = gather(dst.KV4, h.KV4, pos, h.layout().size)
		return float32(sink)
	}
	var sink uint16
	dst.KV16, sink = gather(dst.KV16, h.KV16, pos, 2*h.d)
	return float32(sink)
}

func gather[T float32 | uint16 | uint8 | int8](dst, src []T, pos []int32, st int) ([]T, T) {
	// One element of every 64-byte line. The four chains run on across
	// rows: kvcache's touchLines called a row at a time, its chains
	// restarting at each, made MagicPIG's float32 step slower.
	var zero T
	per := 64 / int(unsafe.Sizeof(zero))
	var s0, s1, s2, s3 T
	for _, x := range pos {
		row := src[int(x)*st:][:st]
		i := 0
		for ; i+4*per <= st; i += 4 * per {
			s0 += row[i]
			s1 += row[i+per]
			s2 += row[i+2*per]
			s3 += row[i+3*per]
		}
		for ; i < st; i += per {
			s0 += row[i]
		}
	}
	if cap(dst) < len(pos)*st {
		dst = make([]T, len(pos)*st)
	}
	dst = dst[:len(pos)*st]
	for i, x := range pos {
		copy(dst[i*st:][:st], src[int(x)*st:][:st])
	}
	return dst, s0 + s1 + s2 + s3
}

// Stride is the distance, in elements, between consecutive keys (and
// values).
func (h *Head) Stride() int { return 2 * h.d }

// Len returns the positions stored.
func (h *Head) Len() int {
	switch h.dt {
	case kvcache.I8:
		return len(h.KV8) / i8Layout(h.d).size
	case kvcache.I4:
		return len(h.KV4) / h.layout().size
	}
	return (len(h.KV) + len(h.KV16)) / (2 * h.d)
}

// DotKeys sets s[r*lds+i], for the rows query rows of q (row stride ldq,
// D columns) and keys j+i, i < n, to their dot product, as simd.DotRows
// does, reading the keys in place. It prefetches the rows of positions
// [next, next+nn) (nn may be 0) as it computes.
func (h *Head) DotKeys(s []float32, lds int, q []float32, ldq, rows, j, n, next, nn int) {
	i := h.heldIn(j, n)
	if i < 0 {
		h.dotKeys(s, lds, q, ldq, rows, j, n, next, nn)
		return
	}
	h.dotKeys(s, lds, q, ldq, rows, j, i, next, nn)
	h.dotKeys(s[i+1:], lds, q, ldq, rows, j+i+1, n-i-1, 0, 0)
	for r := range rows {
		s[r*lds+i] = simd.Dot(q[r*ldq:][:h.d], h.fk)
	}
}

func (h *Head) dotKeys(s []float32, lds int, q []float32, ldq, rows, j, n, next, nn int) {
	if n == 0 {
		return
	}
	d, st := h.d, 2*h.d
	switch h.dt {
	case kvcache.F32:
		simd.DotRowsPF(s, lds, q, ldq, rows, h.KV[j*st:], st, n, d, h.KV[next*st:][:nn*st])
	case kvcache.BF16:
		simd.DotRowsBF16PF(s, lds, q, ldq, rows, h.KV16[j*st:], st, n, d, h.KV16[next*st:][:nn*st])
	case kvcache.I8:
		h.dotKeysI8(s, lds, q, ldq, rows, j, n, next, nn)
	case kvcache.I4:
		h.dotKeysI4(s, lds, q, ldq, rows, j, n)
	default:
		simd.DotRowsF16PF(s, lds, q, ldq, rows, h.KV16[j*st:], st, n, d, h.KV16[next*st:][:nn*st])
	}
}

// AddValues adds P·V to acc: for the rows rows of p (row stride ldp, n
// columns) and values j+i, i < n, acc[r*D+c] += Σ_i p[r*ldp+i]·v_{j+i,c}.
// It prefetches the rows of positions [next, next+nn) as it computes.
// tmp (len >= D) holds a widened row where D is not a multiple of 8.
func (h *Head) AddValues(p []float32, ldp, rows, j, n int, acc, tmp []float32, next, nn int) {
	i := h.heldIn(j, n)
	if i < 0 {
		h.addValues(p, ldp, rows, j, n, acc, tmp, next, nn)
		return
	}
	h.addValues(p, ldp, rows, j, i, acc, tmp, next, nn)
	h.addValues(p[i+1:], ldp, rows, j+i+1, n-i-1, acc, tmp, 0, 0)
	for r := range rows {
		simd.Axpy(p[r*ldp+i], h.fv, acc[r*h.d:][:h.d])
	}
}

func (h *Head) addValues(p []float32, ldp, rows, j, n int, acc, tmp []float32, next, nn int) {
	if n == 0 {
		return
	}
	d, st := h.d, 2*h.d
	if d%8 != 0 {
		for r := range rows {
			a := acc[r*d:][:d]
			for i, w := range p[r*ldp:][:n] {
				// No skipping of zero weights: 0·NaN is NaN, as in
				// the products of the Gemm kernels.
				simd.Axpy(w, h.V(tmp, j+i), a)
			}
		}
		return
	}
	switch h.dt {
	case kvcache.F32:
		simd.GemmPF(rows, d, n, p, ldp, h.KV[j*st+d:], st, acc, d, true, h.KV[next*st+d:][:max(nn*st-d, 0)])
	case kvcache.BF16:
		simd.GemmBF16(rows, d, n, p, ldp, h.KV16[j*st+d:], st, acc, d, true, h.KV16[next*st+d:][:max(nn*st-d, 0)])
	case kvcache.I8:
		h.addValuesI8(p, ldp, rows, j, n, acc, next, nn)
	case kvcache.I4:
		h.addValuesI4(p, ldp, rows, j, n, acc)
	default:
		simd.GemmF16(rows, d, n, p, ldp, h.KV16[j*st+d:], st, acc, d, true, h.KV16[next*st+d:][:max(nn*st-d, 0)])
	}
}

// Store is the cache of a batch of sequences.
type Store struct {
	cfg   attn.DecodeConfig
	name  string
	limit int
	heads []Head // [B][Hkv]
	lens  []int
	rot   *lowbit.Rotation // nil without "+rot"

	// A step's rows rotated (q, k, v), with Storage "+rot".
	rq, rk, rv []float32
}

// Config returns the configuration of the batch.
func (s *Store) Config() attn.DecodeConfig { return s.cfg }

// KeyGroup is the number of positions whose int4 keys share scales per
// channel in a store that quantises keys per channel (NewStore's
// keyGroup), as in kvcache.
const KeyGroup = 64

// KeyGroup returns the positions a group of per-channel int4 key scales
// spans, 0 where keys are not quantised per channel.
func (s *Store) KeyGroup() int { return s.heads[0].kg }

// StepAsGiven reports that a step's queries read the step's own keys and
// values as given, not as stored (the prefill rule, and Hold for a
// decoded token), for the tests' references.
func (d *Decoder[S]) StepAsGiven() bool { return true }

// Rotation returns the rotation the rows are stored under, nil without
// "+rot": a rule whose index is not rotation-invariant (quest's
// channel-wise bounds) rotates keys and queries back with it.
func (s *Store) Rotation() *lowbit.Rotation { return s.rot }

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
// store. With Storage "i4", keyGroup > 0 quantises keys per channel over
// groups of keyGroup positions (see Int4), which Gather cannot read;
// keyGroup 0 quantises them per token. cfg.Storage is "" or "f32",
// "bf16", "f16", "i8" or "i4", each with "+rot" or not; a StreamingLLM
// window is an error wrapping attn.ErrUnsupported: the rules range over
// every cached key, read in place at scattered positions.
func NewStore(name string, cfg attn.DecodeConfig, limit, keyGroup int) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dt, rot, err := ParseStorage(name, cfg.Storage)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.Window > 0:
		return nil, fmt.Errorf("%w: %s: the decoder has no StreamingLLM window (Window = %d): it has its own sinks and recent window, and its index ranges over every cached key", attn.ErrUnsupported, name, cfg.Window)
	case cfg.MaxLen > limit:
		return nil, fmt.Errorf("%w: %s: decode MaxLen = %d past %d positions", attn.ErrUnsupported, name, cfg.MaxLen, limit)
	}
	st := &Store{cfg: cfg, name: name, limit: limit, heads: make([]Head, cfg.B*cfg.HKV), lens: make([]int, cfg.B)}
	for i := range st.heads {
		st.heads[i] = *NewHead(cfg.D, dt)
		if dt == kvcache.I4 {
			st.heads[i].kg = max(keyGroup, 0)
		}
	}
	if rot {
		st.rot = lowbit.NewRotation(cfg.D)
	}
	return st, nil
}

// ParseStorage parses the Storage of a decoder called name (for errors)
// that keeps its rows in Heads: "" or "f32", "bf16", "f16", "i8" or "i4", each
// optionally with "+rot" (rot true: keys and values are stored rotated by
// lowbit.NewRotation(D), queries rotated alike, outputs rotated back).
// Other element types are errors wrapping attn.ErrUnsupported, malformed
// names errors wrapping attn.ErrInput.
func ParseStorage(name, storage string) (dt kvcache.DType, rot bool, err error) {
	dt, rot, err = kvcache.ParseStorage(storage)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", name, err)
	}
	if dt != kvcache.F32 && dt != kvcache.BF16 && dt != kvcache.F16 && dt != kvcache.I8 && dt != kvcache.I4 {
		return 0, false, fmt.Errorf("%w: %s: the decoder stores keys as f32, bf16, f16, i8 or i4 (each optionally +rot), not %q", attn.ErrUnsupported, name, storage)
	}
	return dt, rot, nil
}

// NewHead returns an empty Head of rows of d values stored as dt
// (kvcache.F32, BF16, F16, I8 or I4).
func NewHead(d int, dt kvcache.DType) *Head { return &Head{d: d, dt: dt} }

// Hold makes the products and reads of the last stored position use k
// and v (D values each, copied), the rows it was given, until Release:
// a decoded token attends to its own key and value as given, as
// kvcache's Step attends a step's own rows, while later tokens read them
// as stored. Rounding its own row, the one a query weighs most in many
// heads, costs more than rounding all the others: with int4 rows, exact
// decoding over decstore's rows of austen-long had 3.3 times the KL from
// float32 that it has with the own row held. Float32 storage ignores it.
func (h *Head) Hold(k, v []float32) {
	if h.dt == kvcache.F32 {
		return
	}
	h.held = h.Len()
	h.fk = append(h.fk[:0], k[:h.d]...)
	h.fv = append(h.fv[:0], v[:h.d]...)
}

// Release ends Hold.
func (h *Head) Release() { h.held = 0 }

// heldIn returns the index of the held position in [j, j+n), or -1.
func (h *Head) heldIn(j, n int) int {
	if p := h.held - 1; h.held > 0 && p >= j && p < j+n {
		return p - j
	}
	return -1
}

// Append stores n = len(k)/D positions (key rows k, value rows v), the
// memory growing as for a cache of at most maxLen positions (0: no
// limit).
func (h *Head) Append(k, v []float32, maxLen int) {
	cfg := attn.DecodeConfig{D: h.d, MaxLen: maxLen}
	switch h.dt {
	case kvcache.F32:
		h.KV = appendRows(cfg, h.KV, k, v, func(x float32) float32 { return x })
	case kvcache.BF16:
		h.KV16 = appendRows(cfg, h.KV16, k, v, half.F32ToBF16)
	case kvcache.I8:
		h.appendI8(k, v, maxLen)
	case kvcache.I4:
		h.appendI4(k, v, maxLen)
	default:
		h.KV16 = appendRows(cfg, h.KV16, k, v, half.F32ToF16)
	}
}

// Truncate keeps the first n positions, and ends Hold.
func (h *Head) Truncate(n int) {
	h.held = 0
	switch h.dt {
	case kvcache.F32:
		h.KV = h.KV[:2*n*h.d]
	case kvcache.I8:
		h.KV8 = h.KV8[:n*i8Layout(h.d).size]
	case kvcache.I4:
		h.truncateI4(n)
	default:
		h.KV16 = h.KV16[:2*n*h.d]
	}
}

// RowBytes returns the bytes a position takes, key and value (for int4
// keys quantised per channel, without their share of the group's scales).
func (h *Head) RowBytes() int {
	switch h.dt {
	case kvcache.F32:
		return 8 * h.d
	case kvcache.I8:
		return i8Layout(h.d).size
	case kvcache.I4:
		return h.layout().size
	}
	return 4 * h.d
}

// Bytes returns the memory of the stored rows.
func (h *Head) Bytes() int {
	return 4*cap(h.KV) + 2*cap(h.KV16) + cap(h.KV4) + cap(h.KV8) + 4*(cap(h.tmp)+cap(h.kp)+cap(h.kres)+cap(h.fk)+cap(h.fv))
}

// New returns a decoder over st with rule r.
func New[S any](st *Store, r Rule[S]) *Decoder[S] {
	return &Decoder[S]{Store: st, rule: r, kn: flash.New(flash.Config{})}
}

// Bytes returns the memory of the keys, values and the rule's index.
func (d *Decoder[S]) Bytes() int {
	n := 0
	for i := range d.heads {
		n += d.heads[i].Bytes()
	}
	return n + d.rule.Bytes()
}

// Reset empties every sequence, keeping the memory.
func (d *Decoder[S]) Reset() {
	for i := range d.heads {
		d.heads[i].Truncate(0)
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
			src := (b*hkv + kvh) * n * dd
			d.Head(b, kvh).Append(k[src:src+nb*dd], v[src:src+nb*dd], d.cfg.MaxLen)
		}
	}
}

// appendRows appends key and value rows to buf, interleaved and each
// element converted by conv, doubling its capacity (up to MaxLen) when
// it runs out: append's growth of a quarter for large slices would copy
// a long cache every few thousand tokens, inside a decode step.
func appendRows[T float32 | uint16](cfg attn.DecodeConfig, buf []T, k, v []float32, conv func(float32) T) []T {
	dd := cfg.D
	n := len(buf)
	buf = grow8(buf, n+2*len(k), 512*dd, 2*cfg.MaxLen*dd)
	buf = buf[:n+2*len(k)]
	for i := range len(k) / dd {
		kr, vr := buf[n+2*i*dd:][:dd], buf[n+(2*i+1)*dd:][:dd]
		for c := range dd {
			kr[c], vr[c] = conv(k[i*dd+c]), conv(v[i*dd+c])
		}
	}
	return buf
}

// grow8 returns buf (its length kept) with room for need elements: at
// least twice its capacity and least, at most most where most > 0 (the
// rows of MaxLen), and need in any case.
func grow8[T float32 | uint16 | uint8 | int8](buf []T, need, least, most int) []T {
	if need <= cap(buf) {
		return buf
	}
	c := max(need, 2*cap(buf), least)
	if most > 0 {
		c = max(need, min(c, most))
	}
	nb := make([]T, len(buf), c)
	// Samples and pages are read at scattered rows: on 4 KiB pages
	// nearly every row would also miss the TLB.
	hugepage.Advise(nb[:c])
	copy(nb, buf)
	return nb
}

// truncate drops what store appended past the committed lengths.
func (d *Decoder[S]) truncate() {
	for b, l := range d.lens {
		for kvh := range d.cfg.HKV {
			d.Head(b, kvh).Truncate(l)
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
				d.Head(b, kvh).Settle()
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
	if d.rot != nil {
		d.rq, d.rk, d.rv = d.rot.Copy(d.rq, q), d.rot.Copy(d.rk, k), d.rot.Copy(d.rv, v)
		q, k, v = d.rq, d.rk, d.rv
	}
	d.store(k, v, n, counts)
	if err := d.attend(ctx, q, k, v, n, counts, out, lse); err != nil {
		d.truncate()
		return err
	}
	if d.rot != nil {
		// The padding rows are zeros, which rotate to zeros.
		d.rot.Rows(out, true)
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
	if d.rot != nil {
		d.rk, d.rv = d.rot.Copy(d.rk, k), d.rot.Copy(d.rv, v)
		k, v = d.rk, d.rv
	}
	d.store(k, v, n, counts)
	d.commit(counts)
	return nil
}

// attend computes the outputs of the real positions: prompt chunks
// exactly, one sequence after the other (each spreads over the workers),
// then the decoded positions, a job per sequence and key/value head.
func (d *Decoder[S]) attend(ctx context.Context, q, k, v []float32, n int, counts []int, out, lse []float32) error {
	cfg := d.cfg
	for b, nb := range counts {
		if nb > 1 {
			kv := seqKV{st: d.Store, b: b, k: k, v: v, n: n, base: d.lens[b]}
			if err := d.prefill(ctx, b, q, n, nb, kv, out, lse); err != nil {
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
	for _, i := range jobs {
		b, kvh := i/cfg.HKV, i%cfg.HKV
		row := (b*cfg.HKV + kvh) * n * cfg.D
		d.Head(b, kvh).Hold(k[row:], v[row:])
		defer d.Head(b, kvh).Release()
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
func (d *Decoder[S]) prefill(ctx context.Context, b int, q []float32, n, nb int, kv seqKV, out, lse []float32) error {
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
		return d.kn.ForwardKV(ctx, s, qb, kv, o, nil, ob, lb)
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
	if err := d.kn.ForwardKV(ctx, s, d.q, kv, o, nil, d.out, lc); err != nil {
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

// seqKV is one sequence's rows as flash's key/value source: positions
// before base as stored, the step's own (from base on) as given in k and
// v ([B][Hkv][n][D], rotated already).
type seqKV struct {
	st      *Store
	b       int
	k, v    []float32
	n, base int
}

// fresh returns the step's row of position j (at or past base).
func (kv seqKV) fresh(x []float32, kvh, j int) []float32 {
	d := kv.st.cfg.D
	return x[((kv.b*kv.st.cfg.HKV+kvh)*kv.n+j-kv.base)*d:][:d]
}

func (kv seqKV) PackK(dst []float32, ld, _, kvh, j0, n int) {
	h := kv.st.Head(kv.b, kvh)
	var tmp []float32
	if h.dt != kvcache.F32 {
		// Not the Head's own memory: flash packs a head's keys for
		// several query blocks at once.
		tmp = make([]float32, h.d)
	}
	for j := j0; j < j0+n; j++ {
		var row []float32
		if j < kv.base {
			row = h.K(tmp, j)
		} else {
			row = kv.fresh(kv.k, kvh, j)
		}
		for c, x := range row {
			dst[c*ld+j-j0] = x
		}
	}
}

func (kv seqKV) PackV(dst []float32, ld, _, kvh, j0, n int) {
	h := kv.st.Head(kv.b, kvh)
	for j := j0; j < j0+n; j++ {
		if j >= kv.base {
			copy(dst[(j-j0)*ld:], kv.fresh(kv.v, kvh, j))
		} else if h.dt != kvcache.F32 {
			h.V(dst[(j-j0)*ld:], j)
		} else {
			copy(dst[(j-j0)*ld:], h.V(nil, j))
		}
	}
}

var (
	_ attn.Decoder  = (*Decoder[int])(nil)
	_ attn.Appender = (*Decoder[int])(nil)
)
