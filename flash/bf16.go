package flash

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// BF16Path names the path ForwardBF16 takes with the kernels in use:
// the family of the bfloat16 tile kernel, "amx" (on the AMX tiles) or
// "avx512bf16" (VDPBF16PS), or "widened to f32 (family)" with the kernel
// family (simd.Kernels) of the float32 kernel it runs on.
func BF16Path() string {
	if simd.HasBF16Tile() {
		return simd.Kernels()
	}
	return "widened to f32 (" + simd.Kernels() + ")"
}

// AttentionBF16 is Attention on bfloat16 q, k and v (see ForwardBF16): it
// returns newly allocated out[B][H][N][D] and lse[B][H][N].
func AttentionBF16(ctx context.Context, s attn.Shape, q, k, v []uint16, o attn.Options) (out, lse []float32, err error) {
	// As in Attention, the inputs are checked before the outputs are
	// allocated.
	if err := checkBF16(s, q, k, v, nil, nil, o, false); err != nil {
		return nil, nil, err
	}
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	if err := New(Config{}).ForwardBF16(ctx, s, q, k, v, o, out, lse); err != nil {
		return nil, nil, err
	}
	return out, lse, nil
}

// ForwardBF16 is Forward on bfloat16 inputs: q[B][H][N][D] and
// k, v[B][Hkv][M][D] hold bfloat16 bit patterns, out[B][H][N][D] and lse
// (nil, or [B][H][N]) get float32. The options, the checks and their
// errors are Forward's, and so is the result of a row that sees no key
// (out 0, lse -Inf). The path depends on the kernels in use (BF16Path):
// on the bfloat16 tile (the AMX tiles, or VDPBF16PS with AVX512-BF16) the
// probabilities are rounded to bfloat16 before their product with the
// values (see the package documentation), so each output is within about
// 2^-8 of Σ_j p_j·|v_j| of the exact value, where the float32 fallback is
// within float32 rounding. Either way a row's result does not depend on
// o.Workers.
//
// On the bfloat16 tile path the tiles are the Kernel's BlockRows rows (at
// most 64) by 128 keys; keys at or past a batch row's KVLen are never
// read.
func (kn *Kernel) ForwardBF16(ctx context.Context, s attn.Shape, q, k, v []uint16, o attn.Options, out, lse []float32) error {
	if err := checkBF16(s, q, k, v, out, lse, o, true); err != nil {
		return err
	}
	// The tiles take key indices as int32 and a positive, finite
	// log2-scale; anything else (never in practice) takes the fallback.
	c := float32(math.Abs(float64(o.ScaleFor(s.D))) * math.Log2E)
	if simd.HasBF16Tile() && s.M <= math.MaxInt32-simd.AMXKeys && c > 0 && c <= math.MaxFloat32 {
		return kn.forwardAMX(ctx, s, q, k, v, o, c, out, lse)
	}
	// The fallback: Q widened whole (it is read once a key tile), K and V
	// packed tile by tile.
	q32 := make([]float32, len(q))
	simd.WidenBF16(q32, q)
	return kn.forward(ctx, s, q32, bf16KV{s, k, v}, o, dense{}, out, lse)
}

// checkBF16 is attn.Check for bfloat16 inputs, with the same errors, and
// out required only with needOut.
func checkBF16(s attn.Shape, q, k, v []uint16, out, lse []float32, o attn.Options, needOut bool) error {
	if err := attn.CheckTensorsOf(s, q, k, v, out, lse); err != nil {
		return err
	}
	if needOut && out == nil {
		return fmt.Errorf("%w: out is nil", attn.ErrShape)
	}
	return o.Check(s)
}

// bf16KV is the KV of bfloat16 K, V[B][Hkv][M][D], widened to float32 as
// the float32 kernel packs its tiles.
type bf16KV struct {
	s    attn.Shape
	k, v []uint16
}

func (kv bf16KV) PackK(dst []float32, ld, b, kvh, j0, n int) {
	d := kv.s.D
	k := kv.k[((b*kv.s.HKV+kvh)*kv.s.M+j0)*d:][:n*d]
	for j := range n {
		for c, x := range k[j*d : (j+1)*d] {
			dst[c*ld+j] = math.Float32frombits(uint32(x) << 16)
		}
	}
}

func (kv bf16KV) PackV(dst []float32, ld, b, kvh, j0, n int) {
	d := kv.s.D
	v := kv.v[((b*kv.s.HKV+kvh)*kv.s.M+j0)*d:][:n*d]
	for j := range n {
		simd.WidenBF16(dst[j*ld:][:d], v[j*d:(j+1)*d])
	}
}

// amxPlan is one AMX call's read-only state, shared by the workers.
type amxPlan struct {
	s      attn.Shape
	o      attn.Options
	q      []uint16
	out    []float32
	lse    []float32
	neg    bool    // the scale is negative: negate Q
	c      float32 // |scale|·log2 e
	kb, vb []uint16
	nblk   int // key blocks of a kv head
	// A tile holds heads heads of a group (of g) at posPerTile positions;
	// the tiles of a kv head are headTiles groups of heads times
	// posTiles runs of positions.
	heads, posPerTile   int
	headTiles, posTiles int
}

// amxTile is one worker's scratch.
type amxTile struct {
	qb             []uint16
	st             []float32
	pb             []uint16
	lim            []int32
	m, l           []float32
	acc            []float32
	off            []int // each row's offset in Q and out
	row            []int // each row's index in lse
	inv            []float32
	dp             int // D rounded up to simd.AMXCols
	rows           int // rows in the current tile
	minLim, maxLim int // the fewest and the most keys a row sees
}

// bf16Pool holds the packed keys and values between calls.
var bf16Pool sync.Pool

func getBF16(n int) *[]uint16 {
	if b, ok := bf16Pool.Get().(*[]uint16); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]uint16, n)
	return &b
}

// forwardAMX runs ForwardBF16 on the bfloat16 tile (simd.AttendAMX), for
// checked arguments.
// c is |scale|·log2 e.
func (kn *Kernel) forwardAMX(ctx context.Context, s attn.Shape, q, k, v []uint16, o attn.Options, c float32, out, lse []float32) error {
	p := amxPlan{s: s, o: o, q: q, out: out, lse: lse, neg: o.ScaleFor(s.D) < 0, c: c}
	p.nblk = (s.M + simd.AMXKeys - 1) / simd.AMXKeys
	blk := simd.AMXBlockLen(s.D)
	heads := s.B * s.HKV
	kbuf, vbuf := getBF16(heads*p.nblk*blk), getBF16(heads*p.nblk*blk)
	defer bf16Pool.Put(kbuf)
	defer bf16Pool.Put(vbuf)
	p.kb, p.vb = *kbuf, *vbuf

	// Pack each block of K and V once for all the query tiles that read
	// it, with the keys at or past the batch row's length left 0: no tile
	// reads padding. Blocks wholly past it are not packed (nor read).
	procs := runtime.GOMAXPROCS(0)
	err := parallel.For(ctx, o.WorkerCount(procs, heads*p.nblk), heads*p.nblk, parallel.None, func(_ struct{}, it int) error {
		bh, kt := it/p.nblk, it%p.nblk
		b := bh / s.HKV
		j0 := kt * simd.AMXKeys
		n := min(simd.AMXKeys, o.KeyEnd(s, b)-j0)
		if n <= 0 {
			return nil
		}
		src := (bh*s.M + j0) * s.D
		simd.PackKAMX(p.kb[it*blk:][:blk], k[src:], n, s.D)
		simd.PackVAMX(p.vb[it*blk:][:blk], v[src:], n, s.D)
		return nil
	})
	if err != nil {
		return err
	}

	g := s.Group()
	rows := min(kn.blockRows, simd.AMXRows)
	p.heads = min(g, rows)
	p.headTiles = (g + p.heads - 1) / p.heads
	p.posPerTile = max(1, rows/p.heads)
	p.posTiles = (s.N + p.posPerTile - 1) / p.posPerTile
	tiles := heads * p.headTiles * p.posTiles
	return parallel.For(ctx, o.WorkerCount(procs, tiles), tiles, func() *amxTile { return newAMXTile(s.D) },
		func(t *amxTile, n int) error { p.run(t, n); return nil })
}

func newAMXTile(d int) *amxTile {
	const R = simd.AMXRows
	return &amxTile{
		qb: make([]uint16, simd.AMXQLen(d)), st: make([]float32, simd.AMXStLen), pb: make([]uint16, simd.AMXPLen),
		lim: make([]int32, R), m: make([]float32, R), l: make([]float32, R), acc: make([]float32, simd.AMXAccLen(d)),
		off: make([]int, 0, R), row: make([]int, 0, R), inv: make([]float32, simd.Panel), dp: simd.AMXPad(d),
	}
}

// run computes tile number n: within each kv head, the groups of heads
// in turn, and within each the last positions first (under a causal mask
// they see the most keys; starting them early balances the workers).
func (p *amxPlan) run(t *amxTile, n int) {
	s := p.s
	per := p.headTiles * p.posTiles
	bh, rest := n/per, n%per
	hg, ti := rest/p.posTiles, rest%p.posTiles
	b, kvh := bh/s.HKV, bh%s.HKV
	pos0 := (p.posTiles - 1 - ti) * p.posPerTile
	npos := min(p.posPerTile, s.N-pos0)
	h0 := kvh*s.Group() + hg*p.heads
	nh := min(p.heads, s.Group()-hg*p.heads)

	// Row r: head h0 + r/npos at position pos0 + r%npos.
	t.off, t.row = t.off[:0], t.row[:0]
	t.minLim, t.maxLim = s.M, 0
	clear(t.lim)
	for r := range nh * npos {
		h, i := h0+r/npos, pos0+r%npos
		row := (b*s.H+h)*s.N + i
		t.row = append(t.row, row)
		t.off = append(t.off, row*s.D)
		end := p.o.VisibleKeys(s, b, i)
		t.lim[r] = int32(end)
		t.minLim, t.maxLim = min(t.minLim, end), max(t.maxLim, end)
	}
	t.rows = len(t.row)
	for r := range t.m {
		t.m[r], t.l[r] = negInf, 0
	}
	clear(t.acc)
	nblk := (t.maxLim + simd.AMXKeys - 1) / simd.AMXKeys
	if nblk > 0 {
		simd.PackQAMX(t.qb, p.q, t.off, s.D, p.neg)
		base := bh * p.nblk * simd.AMXBlockLen(s.D)
		simd.AttendAMX(t.rows, t.minLim/simd.AMXKeys, nblk, s.D, t.qb, p.kb[base:], p.vb[base:],
			t.st, t.pb, t.lim, t.m, t.l, t.acc, p.c)
	}
	t.finish(p.out, p.lse, s.D)
}

// finish writes out = acc/l and lse = (m + log2 l)·ln 2 of every row, or
// 0 and -Inf for a row that saw no key (l = 0).
func (t *amxTile) finish(out, lse []float32, d int) {
	const P = simd.Panel
	for q := 0; q*P < t.rows; q++ {
		off := t.off[q*P : min(t.rows, (q+1)*P)]
		for x := range off {
			r := q*P + x
			l := t.l[r]
			t.inv[x] = 0
			if l != 0 {
				t.inv[x] = 1 / l
			}
			if lse != nil {
				v := negInf
				if l != 0 {
					v = float32((float64(t.m[r]) + math.Log2(float64(l))) * math.Ln2)
				}
				lse[t.row[r]] = v
			}
		}
		simd.RowsFromPanel(out, off, t.acc[q*t.dp*P:], t.inv, d)
	}
}
