package flash

import (
	"context"
	"math"
	"runtime"
	"sync"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Config sets the tile sizes. The zero value uses the defaults.
type Config struct {
	// BlockRows is the number of query rows per tile (default 64). Rows of
	// one tile are the query heads of a GQA group times a run of
	// positions.
	BlockRows int
	// BlockK is the number of keys per key tile (default 64), rounded up
	// to a multiple of simd.Panel.
	BlockK int
}

// The default tiles: 4 panels of 16 query rows against 64 keys. Tiles of
// 96 × 96 (whole register blocks in both directions) run dense attention
// no faster in a whole call, and they straddle the 64-key blocks of
// block-sparse patterns (package sparse), which then take the masked
// path several times as often (figures: results/2026-12-07, "Figures moved out of code comments").
const (
	defaultBlockRows = 64
	defaultBlockK    = 64
)

// Kernel is the fused exact attention kernel. It implements attn.Mechanism
// under the name "exact". A Kernel is safe for concurrent use.
type Kernel struct {
	blockRows, blockK int
}

// New returns a kernel with the tile sizes of cfg.
func New(cfg Config) *Kernel {
	k := &Kernel{blockRows: cfg.BlockRows, blockK: cfg.BlockK}
	if k.blockRows <= 0 {
		k.blockRows = defaultBlockRows
	}
	if k.blockK <= 0 {
		k.blockK = defaultBlockK
	}
	// Keys run along the vector lanes of S = Q·Kᵀ: whole panels only.
	k.blockK = (k.blockK + simd.Panel - 1) / simd.Panel * simd.Panel
	return k
}

// Name returns "exact".
func (*Kernel) Name() string { return "exact" }

// Attention computes exact attention with the default kernel and returns
// newly allocated out[B][H][N][D] and lse[B][H][N].
func Attention(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options) (out, lse []float32, err error) {
	// The inputs are checked before the outputs are allocated, so that a
	// huge shape with short or nil inputs is an error, not out of memory.
	if err := s.CheckTensors(q, k, v, nil, nil); err != nil {
		return nil, nil, err
	}
	if err := o.Check(s); err != nil {
		return nil, nil, err
	}
	out = make([]float32, s.QLen())
	lse = make([]float32, s.LSELen())
	if err := New(Config{}).Forward(ctx, s, q, k, v, o, out, lse); err != nil {
		return nil, nil, err
	}
	return out, lse, nil
}

// Forward writes exact attention of q, k, v into out and, when lse is not
// nil, the log-sum-exp of every query row into lse.
func (kn *Kernel) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	return kn.forward(ctx, s, q, denseKV{s, k, v}, o, dense{}, out, lse)
}

// forward runs the kernel on arguments its caller has checked.
func (kn *Kernel) forward(ctx context.Context, s attn.Shape, q []float32, kv KV, o attn.Options, pat Pattern, out, lse []float32) error {
	p := plan{
		s: s, o: o, q: q, out: out, lse: lse, pat: pat,
		scale: o.ScaleFor(s.D),
		bk:    kn.blockK,
	}
	// A tile covers every head of a group for posPerTile positions.
	g := s.Group()
	p.posPerTile = max(1, kn.blockRows/g)
	p.tilesPerHead = (s.N + p.posPerTile - 1) / p.posPerTile
	p.keyTiles = (s.M + p.bk - 1) / p.bk
	tiles := s.B * s.HKV * p.tilesPerHead
	workers := o.WorkerCount(runtime.GOMAXPROCS(0), tiles)

	// The kernels read keys and values as they lie in dense K and V. A
	// cache behind the KV interface is packed first, every tile once for
	// all the query tiles that read it: Kᵀ with rows of BlockK keys, V
	// as rows of D values.
	if dkv, ok := kv.(denseKV); ok {
		p.k, p.v = dkv.k, dkv.v
		p.kr, p.kc, p.vr, p.vc = s.D, 1, 1, s.D
		p.kvStride = s.M * s.D
		p.tileStride = p.bk * s.D
	} else {
		heads := s.B * s.HKV
		ts := s.D * p.bk // floats per packed tile
		kbuf, vbuf := getPack(heads*p.keyTiles*ts), getPack(heads*p.keyTiles*ts)
		defer putPack(kbuf)
		defer putPack(vbuf)
		p.k, p.v = *kbuf, *vbuf
		p.kr, p.kc, p.vr, p.vc = 1, p.bk, 1, s.D
		p.kvStride = p.keyTiles * ts
		p.tileStride = ts
		err := parallel.For(ctx, o.WorkerCount(runtime.GOMAXPROCS(0), heads*p.keyTiles), heads*p.keyTiles, parallel.None, func(_ struct{}, it int) error {
			bh, kt := it/p.keyTiles, it%p.keyTiles
			j0 := kt * p.bk
			n := min(p.bk, s.M-j0)
			kv.PackK(p.k[it*ts:][:ts], p.bk, bh/s.HKV, bh%s.HKV, j0, n)
			kv.PackV(p.v[it*ts:][:ts], s.D, bh/s.HKV, bh%s.HKV, j0, n)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return parallel.For(ctx, workers, tiles,
		func() *tile { return newTile(g*p.posPerTile, s.D, p.bk) },
		func(t *tile, n int) error { p.run(t, n); return nil })
}

// packPool holds the buffers of packed keys and values between calls.
var packPool sync.Pool

// getPack returns a buffer of n floats from packPool, or a new one. The
// kernels read no padding of the packed tiles, so the buffers need not be
// zeroed.
func getPack(n int) *[]float32 {
	if b, ok := packPool.Get().(*[]float32); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]float32, n)
	return &b
}

func putPack(b *[]float32) { packPool.Put(b) }

// plan is one Forward call's read-only state, shared by the workers.
type plan struct {
	s                        attn.Shape
	o                        attn.Options
	q, out, lse              []float32
	pat                      Pattern
	scale                    float32
	bk                       int // keys per tile
	posPerTile, tilesPerHead int
	keyTiles                 int // key tiles per kv head
	// Keys and values: element c of key j of kv head bh (= b·Hkv + kvh)
	// at k[bh·kvStride + tile·tileStride + j'·kr + c·kc], j = tile·bk +
	// j', and likewise element c of its value at v[… + c·vr + j'·vc].
	k, v                 []float32
	kr, kc, vr, vc       int
	kvStride, tileStride int
}

// run computes query tile number n. Tiles are numbered so that, within
// each (batch, kv head), the last query positions come first: under a
// causal mask they see the most keys, and starting them early balances the
// workers.
func (p *plan) run(t *tile, n int) {
	s := p.s
	const P = simd.Panel
	bh, ti := n/p.tilesPerHead, n%p.tilesPerHead
	b, kvh := bh/s.HKV, bh%s.HKV
	pos0 := (p.tilesPerHead - 1 - ti) * p.posPerTile
	npos := min(p.posPerTile, s.N-pos0)
	g := s.Group()

	// Gather the group's rows, pre-scaled, as the columns of Qᵀ: row r =
	// head (r / npos) of the group at position pos0 + r%npos.
	t.setRows(g * npos)
	maxEnd, minEnd := 0, s.M
	for r := range t.rows {
		h, i := kvh*g+r/npos, pos0+r%npos
		t.row[r] = (b*s.H+h)*s.N + i
		end := p.o.VisibleKeys(s, b, i)
		t.end[r] = end
		t.pos[r] = s.M - s.N + i
		maxEnd, minEnd = max(maxEnd, end), min(minEnd, end)
	}
	for q := range t.np {
		off := t.off[q*P : min(t.rows, (q+1)*P)]
		for x := range off {
			off[x] = t.row[q*P+x] * s.D
		}
		simd.PanelFromRows(t.qt[q*s.D*P:][:s.D*P], p.q, off, s.D, p.scale)
	}

	// Turn the pattern's ranges into visits of whole key tiles: a tile
	// two ranges share is visited once, with the keys between them left
	// to the pattern's Visible.
	shift := s.M - s.N // absolute position of query 0
	t.ranges = p.pat.KeyRanges(t.ranges[:0], shift+pos0, shift+pos0+npos, s.M)
	var cur visit
	cur.tile = -1
	flush := func() {
		if cur.tile < 0 {
			return
		}
		j0 := cur.tile * p.bk
		var perKey Pattern
		if !cur.full {
			perKey = p.pat
		}
		base := bh*p.kvStride + cur.tile*p.tileStride
		// The next key tile is the one most likely read next: the kernel
		// fetches it into L2 as it goes.
		var pfk, pfv []float32
		if cur.tile+1 < p.keyTiles {
			next := base + p.tileStride
			pfk = p.k[next:min(next+p.tileStride, len(p.k))]
			pfv = p.v[next:min(next+p.tileStride, len(p.v))]
		}
		t.attend(p, p.k[base:], p.v[base:], j0, min(p.bk, s.M-j0), cur.c0, cur.c1, j0+cur.c1 > minEnd, perKey, pfk, pfv)
	}
	for _, rg := range t.ranges {
		lo, hi := max(rg.Lo, 0), min(rg.Hi, maxEnd)
		for j := lo; j < hi; {
			kt := j / p.bk
			c0, c1 := j-kt*p.bk, min(hi-kt*p.bk, p.bk)
			if kt == cur.tile {
				// Joining a second range: whatever lies between is
				// outside both, so the tile needs per-key checks.
				cur.full = cur.full && rg.Full && c0 == cur.c1
				cur.c1 = c1
			} else {
				flush()
				cur = visit{tile: kt, c0: c0, c1: c1, full: rg.Full}
			}
			j = kt*p.bk + c1
		}
	}
	flush()

	t.finish(p.out, p.lse)
}

// visit is the part [c0, c1) of one key tile that a query tile reads.
type visit struct {
	tile, c0, c1 int
	full         bool
}

// tile is one worker's scratch, reused for every tile the worker computes:
// O(BlockRows·(D+BlockK)) floats. The query rows of a tile run along the
// vector lanes in panels of simd.Panel rows: Qᵀ, the logits Sᵀ and the
// output accumulator Oᵀ are stored panel after panel, each panel line
// after line (a line being one column of Q or O, or one key of S) with
// simd.Panel values a line. Then the softmax of a row is the same lane
// of every line, and its maximum and sum need no reduction across lanes.
type tile struct {
	d, bk  int       // head size, keys per tile
	rows   int       // query rows in the current tile
	np     int       // panels in use: ⌈rows/Panel⌉
	qt     []float32 // [panels][d][Panel], scaled queries
	st     []float32 // [bk][Panel], one panel's logits then probabilities
	acc    []float32 // [panels][d][Panel], unnormalised output
	m, l   []float32 // running max and sum per row
	lim    []float32 // keys of the current visit each row sees
	end    []int     // visible keys [0, end) per row
	pos    []int     // absolute position of each row's query
	row    []int     // index of each row's query in Q[B][H][N]
	off    []int     // row·D: each row's offset in Q and out
	inv    []float32 // 1/l of a panel's rows
	line   []float32 // one row's logits, for a pattern's masks
	ranges []Range   // the pattern's key ranges for the current tile
}

func newTile(rows, d, bk int) *tile {
	q := (rows + simd.Panel - 1) / simd.Panel * simd.Panel
	return &tile{
		d: d, bk: bk,
		qt:   make([]float32, q*d),
		st:   make([]float32, 2*simd.Panel*bk), // two panels: simd.AttendPanels may take two at a time
		acc:  make([]float32, q*d),
		m:    make([]float32, q),
		l:    make([]float32, q),
		lim:  make([]float32, q),
		end:  make([]int, q),
		pos:  make([]int, q),
		row:  make([]int, q),
		off:  make([]int, q),
		inv:  make([]float32, simd.Panel),
		line: make([]float32, bk),
	}
}

var negInf = float32(math.Inf(-1))

// setRows starts a tile of rows query rows: accumulators 0, m = -Inf and
// l = 0 in every lane of the panels in use, those past the last row
// included (the kernels compute them along with the others, on zero
// queries, and finish ignores them).
func (t *tile) setRows(rows int) {
	const P = simd.Panel
	t.rows = rows
	t.np = (rows + P - 1) / P
	q := t.np * P
	clear(t.acc[:q*t.d])
	for r := range q {
		t.m[r] = negInf
		t.l[r] = 0
	}
}

// attend folds keys j0+c0 … j0+c1-1 of one key tile (k, v: its keys and
// values in the layout of p, nk keys from j0) into every row of the
// tile. When masked is set some row cannot see all of them, and each row
// then uses only the keys before its end. A non-nil pat masks further,
// key by key. The unmasked case, that of almost every tile, is one call
// of the fused kernel for the whole tile, which also prefetches pfk and
// pfv; the others go panel by panel, each panel over the keys its rows
// see.
func (t *tile) attend(p *plan, k, v []float32, j0, nk, c0, c1 int, masked bool, pat Pattern, pfk, pfv []float32) {
	const P = simd.Panel
	if !masked && pat == nil {
		d := t.d
		simd.AttendPanels(t.np, c1-c0, d, k[c0*p.kr:], p.kr, p.kc, t.qt, d*P, t.st,
			v[c0*p.vc:], p.vr, p.vc, t.m, t.l, t.acc, d*P, pfk, pfv)
		return
	}
	for q := range t.np {
		lim := t.lim[q*P:][:P]
		hi := 0
		for x := range lim {
			r, n := q*P+x, 0
			if r < t.rows {
				n = c1 - c0
				if masked {
					n = max(0, min(n, t.end[r]-j0-c0))
				}
			}
			lim[x] = float32(n)
			hi = max(hi, n)
		}
		if hi > 0 {
			t.panel(p, k, v, j0, q, c0, c0+hi, lim, pat)
		}
	}
}

// panel folds keys j0+c0 … j0+c1-1 into the rows of panel q: Sᵀ = K·Qᵀ,
// the pattern's masks, one step of the online softmax (which also
// rescales the accumulator where a row's maximum grew), and Oᵀ += Vᵀ·Pᵀ.
// lim holds the keys from c0 each row of the panel sees.
func (t *tile) panel(p *plan, k, v []float32, j0, q, c0, c1 int, lim []float32, pat Pattern) {
	const P = simd.Panel
	d, n := t.d, c1-c0
	pq := d * P
	st := t.st[:n*P]
	acc := t.acc[q*pq:][:pq]
	simd.GemmPanels(n, P, d, k[c0*p.kr:], p.kr, p.kc, t.qt[q*pq:][:pq], pq, st, n*P, false)
	if pat != nil {
		t.mask(st, j0, q, c0, lim, pat)
	}
	simd.OnlineSoftmax(st, n*P, n, 1, lim, t.m[q*P:], t.l[q*P:], acc, pq, d)
	simd.GemmPanels(d, P, n, v[c0*p.vc:], p.vr, p.vc, st, n*P, acc, pq, true)
}

// mask sets to -Inf the logits st (one panel, keys from c0), among the
// first lim keys of each row of panel q, of the keys pat hides from the
// row's query.
func (t *tile) mask(st []float32, j0, q, c0 int, lim []float32, pat Pattern) {
	const P = simd.Panel
	rm, isRM := pat.(RowMasker)
	for r := q * P; r < min((q+1)*P, t.rows); r++ {
		n := int(lim[r-q*P])
		if n <= 0 {
			continue
		}
		x := r % P
		line := t.line[:n]
		for j := range line {
			line[j] = st[j*P+x]
		}
		if isRM {
			rm.MaskRow(t.pos[r], j0+c0, line)
		} else {
			for j := range line {
				if !pat.Visible(t.pos[r], j0+c0+j) {
					line[j] = negInf
				}
			}
		}
		for j, v := range line {
			st[j*P+x] = v
		}
	}
}

// finish writes the normalised output and the lse (when lse is not nil)
// of every row: out = acc / l and lse = m + log l, or 0 and -Inf for a
// row that saw no key (l = 0).
func (t *tile) finish(out, lse []float32) {
	const P = simd.Panel
	for q := range t.np {
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
					v = t.m[r] + float32(math.Log(float64(l)))
				}
				lse[t.row[r]] = v
			}
		}
		simd.RowsFromPanel(out, off, t.acc[q*t.d*P:][:t.d*P], t.inv, t.d)
	}
}
