package kvcache

import (
	"context"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/hugepage"
	"github.com/attnkit/attn/internal/lowbit"
)

// DType is the element type of the stored keys and values.
type DType uint8

const (
	F32  DType = iota // float32
	BF16              // bfloat16: float32's range, 8 bits of precision
	F16               // IEEE binary16: 11 bits of precision, |x| < 65520
	// I8 stores each row of K and of V as int8 codes and one float32
	// scale, max|x|/127: each value is within scale/2 of code·scale.
	I8
	// I4 stores 4-bit codes, two a byte, asymmetric in groups that share
	// a float32 scale and zero (x ≈ zero + scale·code, code 0…15, each
	// value within scale/2): values per token in groups of 64 channels,
	// keys per channel in groups of 64 consecutive positions, the group
	// being filled kept in float32 until it completes (KIVI). See the
	// package documentation.
	I4
)

func (t DType) String() string {
	switch t {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case I8:
		return "i8"
	case I4:
		return "i4"
	}
	return fmt.Sprintf("DType(%d)", uint8(t))
}

// Size returns the bytes per element (for I8, not counting the float32
// scale of each row), rounded up: I4's half a byte reports 1. Bits is
// exact.
func (t DType) Size() int {
	switch t {
	case F32:
		return 4
	case I8, I4:
		return 1
	}
	return 2
}

// Bits returns the bits per stored element, not counting scales.
func (t DType) Bits() int {
	if t == I4 {
		return 4
	}
	return 8 * t.Size()
}

// ParseDType parses "f32", "bf16", "f16", "i8" or "i4".
func ParseDType(s string) (DType, error) {
	for _, t := range []DType{F32, BF16, F16, I8, I4} {
		if t.String() == s {
			return t, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown element type %q (want f32, bf16, f16, i8 or i4)", attn.ErrInput, s)
}

// rotSuffix marks a rotated storage in ParseStorage.
const rotSuffix = "+rot"

// ParseStorage parses the Storage of an attn.DecodeConfig: "" (F32) or
// an element type of ParseDType, optionally followed by "+rot" for
// Config.Rotate ("i4+rot": int4 codes of Hadamard-rotated keys and
// values).
func ParseStorage(s string) (DType, bool, error) {
	base, rot := strings.CutSuffix(s, rotSuffix)
	if base == "" {
		if rot {
			return 0, false, fmt.Errorf("%w: storage %q rotates no element type (want e.g. i4+rot)", attn.ErrInput, s)
		}
		return F32, false, nil
	}
	t, err := ParseDType(base)
	return t, rot, err
}

// ErrFull is wrapped by the error of an append past Config.MaxLen.
// It is attn.ErrFull, so that callers test one error for every decoder.
var ErrFull = attn.ErrFull

// Config describes a cache. B, HKV and D are required.
type Config struct {
	B, HKV, D int
	// DType is the storage type (default F32).
	DType DType
	// Capacity is the number of positions allocated at first (default
	// 256); the cache doubles it when it runs out.
	Capacity int
	// MaxLen caps the positions a cache without a window holds; an
	// append past it fails with ErrFull. 0 means no limit.
	MaxLen int
	// Window, when positive, keeps only the last Window positions (a
	// ring buffer) plus the first Sinks.
	Window int
	// Sinks is the number of first positions a windowed cache never
	// evicts.
	Sinks int
	// Rotate stores keys and values rotated by a fixed orthonormal
	// Hadamard transform with sign flips, queries rotated alike and
	// outputs rotated back (see the package documentation, Rotation):
	// attention is unchanged up to rounding, and the outlier channels
	// that coarsen low-bit codes are spread over their block. Read
	// returns rows rotated back.
	Rotate bool
	// Evict, with a Window, bounds the cache by a policy (see Policy):
	// besides the Sinks and the last Window positions, it keeps the Keep
	// positions that the policy scores highest, separately for each KV
	// head. A query then sees every held position, its chunk's own
	// causally: the window protects positions from eviction rather than
	// masking them.
	Evict Policy
	// Keep is the number of positions past the sinks and the window that
	// an evicting cache keeps (H2O's heavy hitters, SnapKV's selection).
	Keep int
}

// Cache is one layer's key/value cache. It is not safe for concurrent use.
type Cache struct {
	cfg    Config
	stride int // elements per stored row, a multiple of 64 bytes
	cap    int // rows per head
	n      int // positions appended so far
	kf, vf []float32
	kh, vh []uint16
	kq, vq []int8    // I8 codes
	ks, vs []float32 // I8 scales, [B][Hkv][capacity]: row r's is ks[r/stride]
	// I4 (see int4.go): packed codes [B][Hkv][capacity][stride/2]; value
	// scales and zeros [B][Hkv][chanGroups][capacity]; key scales and
	// zeros per channel [B][Hkv][keyGroups][stride], or per token (ktok)
	// as values; the float32 keys of the open key group [B][Hkv][i4KeyGroup][stride].
	k4, v4             []uint8
	k4s, k4z, v4s, v4z []float32
	kres               []float32
	ktok               bool
	rot                *lowbit.Rotation // nil without Config.Rotate
	ev                 *evictState      // nil without Config.Evict
	rq, rk, rv         []float32        // rotated copies of a step's rows
}

// New returns an empty cache.
func New(cfg Config) (*Cache, error) {
	for _, d := range []struct {
		name string
		v    int
	}{{"B", cfg.B}, {"Hkv", cfg.HKV}, {"D", cfg.D}} {
		if d.v <= 0 {
			return nil, fmt.Errorf("%w: kvcache %s = %d, want > 0", attn.ErrShape, d.name, d.v)
		}
	}
	switch {
	case cfg.DType > I4:
		return nil, fmt.Errorf("%w: kvcache element type %v", attn.ErrInput, cfg.DType)
	case cfg.Capacity < 0 || cfg.MaxLen < 0 || cfg.Window < 0 || cfg.Sinks < 0 || cfg.Keep < 0:
		return nil, fmt.Errorf("%w: kvcache Capacity, MaxLen, Window, Sinks and Keep must be >= 0", attn.ErrInput)
	case cfg.Evict > SnapKV:
		return nil, fmt.Errorf("%w: kvcache eviction policy %v", attn.ErrInput, cfg.Evict)
	case cfg.Evict != NoEvict && (cfg.Window == 0 || cfg.Keep == 0):
		return nil, fmt.Errorf("%w: kvcache eviction (%v) needs a Window and Keep > 0, got Window = %d, Keep = %d", attn.ErrInput, cfg.Evict, cfg.Window, cfg.Keep)
	case cfg.Evict == NoEvict && cfg.Keep > 0:
		return nil, fmt.Errorf("%w: kvcache Keep = %d needs an eviction policy", attn.ErrInput, cfg.Keep)
	case cfg.Sinks > 0 && cfg.Window == 0:
		return nil, fmt.Errorf("%w: kvcache Sinks = %d needs a Window", attn.ErrInput, cfg.Sinks)
	case cfg.Window > 0 && cfg.MaxLen > 0:
		return nil, fmt.Errorf("%w: a windowed kvcache has a fixed size; MaxLen must be 0", attn.ErrInput)
	}
	c := &Cache{cfg: cfg}
	perLine := 64 / cfg.DType.Size()
	if cfg.D > maxBytes {
		return nil, fmt.Errorf("%w: kvcache D = %d is too large", attn.ErrShape, cfg.D)
	}
	c.stride = (cfg.D + perLine - 1) / perLine * perLine
	if cfg.DType == I4 {
		c.stride = lowbit.Stride(cfg.D)
		c.ktok = cfg.Evict != NoEvict
	}
	c.cap = cfg.Capacity
	if c.cap == 0 {
		c.cap = 256
	}
	if cfg.Window > 0 {
		if cfg.Window > maxBytes || cfg.Sinks > maxBytes || cfg.Keep > maxBytes {
			return nil, fmt.Errorf("%w: kvcache Window = %d, Sinks = %d, Keep = %d: too many positions", attn.ErrInput, cfg.Window, cfg.Sinks, cfg.Keep)
		}
		c.cap = cfg.Sinks + cfg.Window + cfg.Keep
	} else if cfg.MaxLen > 0 {
		c.cap = min(c.cap, cfg.MaxLen)
	}
	// What New allocates up front is checked against a bound before it is
	// asked for: a windowed cache's whole ring, or the first Capacity
	// rows, must fit in maxBytes.
	if !fitsBytes(2*c.cfg.DType.Size(), cfg.B, cfg.HKV, c.cap, c.stride) {
		return nil, fmt.Errorf("%w: kvcache of B = %d, Hkv = %d, D = %d and %d positions allocated at once needs more than %d bytes",
			attn.ErrInput, cfg.B, cfg.HKV, cfg.D, c.cap, maxBytes)
	}
	if cfg.Rotate {
		c.rot = lowbit.NewRotation(cfg.D)
	}
	if cfg.Evict != NoEvict {
		c.ev = &evictState{policy: cfg.Evict}
	}
	c.alloc(c.cap)
	return c, nil
}

// maxBytes bounds the memory a cache may ask for: far beyond any machine
// this runs on, small enough that products of sizes below it cannot
// overflow an int (2^40 bytes, or the largest int where int has 32 bits).
const maxBytes = min(1<<40, math.MaxInt)

// fitsBytes reports whether the product of xs is at most maxBytes,
// without overflow.
func fitsBytes(xs ...int) bool {
	p := 1
	for _, x := range xs {
		if x <= 0 || p > maxBytes/x {
			return x == 0
		}
		p *= x
	}
	return true
}

// Config returns the configuration the cache was made with.
func (c *Cache) Config() Config { return c.cfg }

// Len returns the number of positions appended so far; with a window,
// older ones may have been evicted.
func (c *Cache) Len() int { return c.n }

// Held returns the number of positions stored now (in each KV head): Len
// without a window, at most Sinks+Window with one, at most
// Sinks+Window+Keep between steps with eviction (more while SnapKV takes
// a prompt).
func (c *Cache) Held() int {
	if c.ev != nil {
		return c.ev.held
	}
	return min(c.n, c.cap)
}

// Bytes returns the memory the keys and values occupy (with I8 and I4,
// their scales and I4's float32 residual included; with eviction, each
// row's position and score).
func (c *Cache) Bytes() int {
	heads := c.cfg.B * c.cfg.HKV
	rows := 2 * heads * c.cap
	var n int
	switch c.cfg.DType {
	case I8:
		n = rows * (c.stride + 4)
	case I4:
		n = c.bytesI4()
	default:
		n = rows * c.stride * c.cfg.DType.Size()
	}
	if c.ev != nil {
		n += heads * c.cap * 16
	}
	return n
}

// Reset empties the cache, keeping its memory.
func (c *Cache) Reset() {
	c.n = 0
	if c.ev != nil {
		c.ev.reset()
	}
}

// alloc makes room for rows positions per head, keeping what is stored.
func (c *Cache) alloc(rows int) {
	heads := c.cfg.B * c.cfg.HKV
	if c.ev != nil {
		c.ev.grow(heads, c.cap, rows)
	}
	switch c.cfg.DType {
	case I4:
		c.allocI4(rows)
	case I8:
		n := heads * rows * c.stride
		nk, nv := aligned[int8](n), aligned[int8](n)
		nks, nvs := make([]float32, heads*rows), make([]float32, heads*rows)
		for h := range heads {
			if c.kq != nil {
				copy(nk[h*rows*c.stride:], c.kq[h*c.cap*c.stride:][:c.Held()*c.stride])
				copy(nv[h*rows*c.stride:], c.vq[h*c.cap*c.stride:][:c.Held()*c.stride])
				copy(nks[h*rows:], c.ks[h*c.cap:][:c.Held()])
				copy(nvs[h*rows:], c.vs[h*c.cap:][:c.Held()])
			}
		}
		c.kq, c.vq, c.ks, c.vs = nk, nv, nks, nvs
	case F32:
		nk, nv := aligned[float32](heads*rows*c.stride), aligned[float32](heads*rows*c.stride)
		for h := range heads {
			if c.kf != nil {
				copy(nk[h*rows*c.stride:], c.kf[h*c.cap*c.stride:][:c.Held()*c.stride])
				copy(nv[h*rows*c.stride:], c.vf[h*c.cap*c.stride:][:c.Held()*c.stride])
			}
		}
		c.kf, c.vf = nk, nv
	default:
		nk, nv := aligned[uint16](heads*rows*c.stride), aligned[uint16](heads*rows*c.stride)
		for h := range heads {
			if c.kh != nil {
				copy(nk[h*rows*c.stride:], c.kh[h*c.cap*c.stride:][:c.Held()*c.stride])
				copy(nv[h*rows*c.stride:], c.vh[h*c.cap*c.stride:][:c.Held()*c.stride])
			}
		}
		c.kh, c.vh = nk, nv
	}
	c.cap = rows
}

// aligned returns n elements starting on a 64-byte boundary, on huge
// pages where the system allows: the decode step streams them.
func aligned[T float32 | uint16 | int8 | uint8](n int) []T {
	size := int(unsafe.Sizeof(T(0)))
	pad := 64 / size
	buf := make([]T, n+pad)
	hugepage.Advise(buf)
	off := (64 - int(uintptr(unsafe.Pointer(&buf[0]))%64)) % 64 / size
	return buf[off : off+n : off+n]
}

// slot returns the row that position p is stored in.
func (c *Cache) slot(p int) int {
	w, s := c.cfg.Window, c.cfg.Sinks
	if w == 0 || p < s {
		return p
	}
	return s + (p-s)%w
}

// position returns the position stored in row r now.
func (c *Cache) position(r int) int {
	w, s := c.cfg.Window, c.cfg.Sinks
	if w == 0 || r < s || c.n <= c.cap {
		return r
	}
	// Ring rows hold the positions in [n-w, n) (all past the sinks).
	newest := c.n - 1
	newestSlot := s + (newest-s)%w
	back := (newestSlot - r + w) % w
	return newest - back
}

// Append stores n new positions: k and v are [B][Hkv][n][D]. An evicting
// cache scores them 0 (H2O: no query has attended them); for SnapKV more
// than one position is a prompt, kept whole until the next single
// position, which compresses it first (see Compress).
func (c *Cache) Append(k, v []float32, n int) error {
	want := c.cfg.B * c.cfg.HKV * n * c.cfg.D
	if n < 0 || len(k) != want || len(v) != want {
		return fmt.Errorf("%w: Append of %d positions wants len(K) = len(V) = B·Hkv·n·D = %d, got %d and %d",
			attn.ErrShape, n, want, len(k), len(v))
	}
	if err := c.checkFull(n); err != nil {
		return err
	}
	if c.ev != nil && n == 1 {
		if err := c.compressPrompt(context.Background(), 0); err != nil {
			return err
		}
	}
	k, v = c.rotateKV(k, v)
	if c.ev != nil {
		return c.evictAppend(k, v, n, nil)
	}
	return c.appendRows(k, v, n)
}

// checkFull returns ErrFull if n more positions would pass MaxLen.
func (c *Cache) checkFull(n int) error {
	if c.cfg.Window == 0 && c.cfg.MaxLen > 0 && c.n+n > c.cfg.MaxLen {
		return fmt.Errorf("%w: %d + %d positions exceed MaxLen = %d", ErrFull, c.n, n, c.cfg.MaxLen)
	}
	return nil
}

// rotateKV returns k and v rotated for storage (copies), or themselves
// without Config.Rotate.
func (c *Cache) rotateKV(k, v []float32) ([]float32, []float32) {
	if c.rot == nil {
		return k, v
	}
	c.rk, c.rv = c.rot.Copy(c.rk, k), c.rot.Copy(c.rv, v)
	return c.rk, c.rv
}

// rotateQ returns q rotated (a copy), or q itself without Config.Rotate.
func (c *Cache) rotateQ(q []float32) []float32 {
	if c.rot == nil {
		return q
	}
	c.rq = c.rot.Copy(c.rq, q)
	return c.rq
}

// unrotate rotates rows of D values computed against rotated values
// (attention outputs) back, in place.
func (c *Cache) unrotate(x []float32) {
	if c.rot != nil {
		c.rot.Rows(x, true)
	}
}

// appendRows stores n positions (rotated already) in a cache without
// eviction.
func (c *Cache) appendRows(k, v []float32, n int) error {
	if c.cfg.Window == 0 && c.n+n > c.cap {
		if c.cfg.MaxLen > 0 && c.n+n > c.cfg.MaxLen {
			return fmt.Errorf("%w: %d + %d positions exceed MaxLen = %d", ErrFull, c.n, n, c.cfg.MaxLen)
		}
		rows := max(c.cap, 1)
		for rows < c.n+n {
			rows *= 2
		}
		if c.cfg.MaxLen > 0 {
			rows = min(rows, c.cfg.MaxLen)
		}
		if !fitsBytes(2*c.cfg.DType.Size(), c.cfg.B, c.cfg.HKV, rows, c.stride) {
			return fmt.Errorf("%w: %d + %d positions would need more than %d bytes", ErrFull, c.n, n, maxBytes)
		}
		c.alloc(rows)
	}
	d := c.cfg.D
	// With a window only the last Window positions of a long chunk
	// survive; earlier ones past the sinks would be overwritten anyway.
	// I4 keys quantised per channel start at the key group of the first
	// survivor, whose rows must all pass through the residual.
	skipHi := c.n + n - c.cfg.Window
	if c.cfg.DType == I4 && !c.ktok && c.cfg.Window > 0 && skipHi > c.cfg.Sinks {
		s1 := c.slot(skipHi)
		_, lo, _ := c.keyGroup(s1)
		skipHi -= s1 - lo
	}
	for h := range c.cfg.B * c.cfg.HKV {
		for i := range n {
			p := c.n + i
			if c.cfg.Window > 0 && p >= c.cfg.Sinks && p < skipHi {
				continue
			}
			row := (h*c.cap + c.slot(p)) * c.stride
			src := (h*n + i) * d
			c.store(row, k[src:src+d], v[src:src+d])
		}
	}
	c.n += n
	return nil
}

func (c *Cache) store(row int, k, v []float32) {
	switch c.cfg.DType {
	case F32:
		copy(c.kf[row:], k)
		copy(c.vf[row:], v)
	case BF16:
		for i := range k {
			c.kh[row+i] = half.F32ToBF16(k[i])
			c.vh[row+i] = half.F32ToBF16(v[i])
		}
	case F16:
		for i := range k {
			c.kh[row+i] = half.F32ToF16(k[i])
			c.vh[row+i] = half.F32ToF16(v[i])
		}
	case I8:
		c.ks[row/c.stride] = lowbit.QuantI8(c.kq[row:][:len(k)], k)
		c.vs[row/c.stride] = lowbit.QuantI8(c.vq[row:][:len(v)], v)
	case I4:
		c.storeI4(row/c.stride, k, v)
	}
}

// moveRow copies stored row src to row dst (both head·cap + slot).
func (c *Cache) moveRow(dst, src int) {
	st := c.stride
	a, b := dst*st, src*st
	switch c.cfg.DType {
	case F32:
		copy(c.kf[a:][:st], c.kf[b:][:st])
		copy(c.vf[a:][:st], c.vf[b:][:st])
	case I8:
		copy(c.kq[a:][:st], c.kq[b:][:st])
		copy(c.vq[a:][:st], c.vq[b:][:st])
		c.ks[dst], c.vs[dst] = c.ks[src], c.vs[src]
	case I4:
		c.moveRowI4(dst, src)
	default:
		copy(c.kh[a:][:st], c.kh[b:][:st])
		copy(c.vh[a:][:st], c.vh[b:][:st])
	}
}
