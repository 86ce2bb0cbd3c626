package flash

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/attnkit/attn"
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
	if err := s.Validate(); err != nil {
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
		dp:    (s.D + simd.Panel - 1) / simd.Panel * simd.Panel,
	}
	// A tile covers every head of a group for posPerTile positions.
	g := s.Group()
	p.posPerTile = max(1, kn.blockRows/g)
	p.tilesPerHead = (s.N + p.posPerTile - 1) / p.posPerTile
	p.keyTiles = (s.M + p.bk - 1) / p.bk
	tiles := s.B * s.HKV * p.tilesPerHead
	workers := o.WorkerCount(runtime.GOMAXPROCS(0), tiles)

	// Pack every key and value tile once, for all the query tiles that
	// read it: Kᵀ so that S = Q·Kᵀ is a plain matrix product with keys
	// along the vector lanes, V padded to whole panels. Fresh memory is
	// zero, which is the padding both need.
	heads := s.B * s.HKV
	p.kpack = make([]float32, heads*p.keyTiles*s.D*p.bk)
	p.vpack = make([]float32, heads*p.keyTiles*p.bk*p.dp)
	err := parallel(ctx, o.WorkerCount(runtime.GOMAXPROCS(0), heads*p.keyTiles), heads*p.keyTiles, func(it int) {
		bh, kt := it/p.keyTiles, it%p.keyTiles
		j0 := kt * p.bk
		n := min(p.bk, s.M-j0)
		kv.PackK(p.kpack[it*s.D*p.bk:][:s.D*p.bk], p.bk, bh/s.HKV, bh%s.HKV, j0, n)
		kv.PackV(p.vpack[it*p.bk*p.dp:][:p.bk*p.dp], p.dp, bh/s.HKV, bh%s.HKV, j0, n)
	})
	if err != nil {
		return err
	}
	return parallelWith(ctx, workers, tiles,
		func() *tile { return newTile(g*p.posPerTile, s.D, p.bk) },
		p.run)
}

// parallel calls fn(0) … fn(items-1) on workers goroutines and returns
// ctx's error if it ends first.
func parallel(ctx context.Context, workers, items int, fn func(int)) error {
	return parallelWith(ctx, workers, items, func() struct{} { return struct{}{} },
		func(_ struct{}, it int) { fn(it) })
}

// parallelWith is parallel with per-goroutine scratch made by newScratch.
// Items are handed out in order from a shared counter.
func parallelWith[T any](ctx context.Context, workers, items int, newScratch func() T, fn func(T, int)) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			scratch := newScratch()
			for {
				if err := ctx.Err(); err != nil {
					errs[w] = err
					return
				}
				it := int(next.Add(1)) - 1
				if it >= items {
					return
				}
				fn(scratch, it)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// plan is one Forward call's read-only state, shared by the workers.
type plan struct {
	s                        attn.Shape
	o                        attn.Options
	q, out, lse              []float32
	pat                      Pattern
	scale                    float32
	bk, dp                   int // keys per tile, D padded to simd.Panel
	posPerTile, tilesPerHead int
	keyTiles                 int       // key tiles per kv head
	kpack, vpack             []float32 // packed tiles, [B·Hkv][keyTiles][D][bk] and [B·Hkv][keyTiles][bk][dp]
}

// run computes query tile number n. Tiles are numbered so that, within
// each (batch, kv head), the last query positions come first: under a
// causal mask they see the most keys, and starting them early balances the
// workers.
func (p *plan) run(t *tile, n int) {
	s := p.s
	bh, ti := n/p.tilesPerHead, n%p.tilesPerHead
	b, kvh := bh/s.HKV, bh%s.HKV
	pos0 := (p.tilesPerHead - 1 - ti) * p.posPerTile
	npos := min(p.posPerTile, s.N-pos0)
	g := s.Group()

	// Gather the group's rows, pre-scaled: row r = head (r / npos) of the
	// group at position pos0 + r%npos.
	t.rows = g * npos
	maxEnd, minEnd := 0, s.M
	for r := range t.rows {
		h, i := kvh*g+r/npos, pos0+r%npos
		src := p.q[((b*s.H+h)*s.N+i)*s.D:][:s.D]
		dst := t.q[r*s.D:][:s.D]
		for c, x := range src {
			dst[c] = x * p.scale
		}
		end := p.o.VisibleKeys(s, b, i)
		t.end[r] = end
		t.pos[r] = s.M - s.N + i
		maxEnd, minEnd = max(maxEnd, end), min(minEnd, end)
	}
	t.reset()

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
		it := bh*p.keyTiles + cur.tile
		var perKey Pattern
		if !cur.full {
			perKey = p.pat
		}
		t.attend(p.kpack[it*s.D*p.bk:][:s.D*p.bk], p.vpack[it*p.bk*p.dp:][:p.bk*p.dp],
			j0, min(p.bk, s.M-j0), cur.c0, cur.c1, j0+cur.c1 > minEnd, perKey)
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

	for r := range t.rows {
		h, i := kvh*g+r/npos, pos0+r%npos
		row := (b*s.H+h)*s.N + i
		l := t.finish(r, p.out[row*s.D:][:s.D])
		if p.lse != nil {
			p.lse[row] = l
		}
	}
}

// visit is the part [c0, c1) of one key tile that a query tile reads.
type visit struct {
	tile, c0, c1 int
	full         bool
}

// tile is one worker's scratch, reused for every tile the worker computes:
// O(BlockRows·(D+BlockK)) floats.
type tile struct {
	d, dp, bk int // head size, head size padded to simd.Panel, keys per tile
	rows      int
	q         []float32 // [rows][d], scaled queries
	s         []float32 // [rows][bk], logits then probabilities
	acc       []float32 // [rows][dp], unnormalised output
	m, l      []float32 // running max and sum per row
	end       []int     // visible keys [0, end) per row
	pos       []int     // absolute position of each row's query
	ranges    []Range   // the pattern's key ranges for the current tile
}

func newTile(rows, d, bk int) *tile {
	dp := (d + simd.Panel - 1) / simd.Panel * simd.Panel
	return &tile{
		d: d, dp: dp, bk: bk,
		q:   make([]float32, rows*d),
		s:   make([]float32, rows*bk),
		acc: make([]float32, rows*dp),
		m:   make([]float32, rows),
		l:   make([]float32, rows),
		end: make([]int, rows),
		pos: make([]int, rows),
	}
}

var negInf = float32(math.Inf(-1))

func (t *tile) reset() {
	clear(t.acc[:t.rows*t.dp])
	for r := range t.rows {
		t.m[r] = negInf
		t.l[r] = 0
	}
}

// attend folds keys j0+c0 … j0+c1-1 of one packed tile (kt = Kᵀ, vp = V, nk
// keys from j0) into every row of the tile. When masked is set some row
// cannot see all of them, and each row then uses only the keys before its
// end. A non-nil pat masks further, key by key.
func (t *tile) attend(kt, vp []float32, j0, nk, c0, c1 int, masked bool, pat Pattern) {
	d, dp, bk := t.d, t.dp, t.bk
	simd.Gemm(t.rows, bk, d, t.q, d, kt, bk, t.s, bk, false)
	for r := range t.rows {
		s := t.s[r*bk:][:nk]
		lo, hi := c0, c1
		if masked {
			hi = min(hi, t.end[r]-j0)
		}
		if hi <= lo {
			clear(s)
			continue
		}
		// Keys outside [lo, hi) get probability 0.
		clear(s[:lo])
		clear(s[hi:])
		vis := s[lo:hi]
		if rm, ok := pat.(RowMasker); ok {
			rm.MaskRow(t.pos[r], j0+lo, vis)
		} else if pat != nil {
			for j := range vis {
				if !pat.Visible(t.pos[r], j0+lo+j) {
					vis[j] = negInf
				}
			}
		}
		mx := max(t.m[r], simd.Max(vis))
		if mx == negInf {
			clear(vis) // nothing visible to this row yet
			continue
		}
		if mx > t.m[r] {
			// The row max grew: bring the old sum and accumulator to the
			// new reference point. On the first tile both are 0 and the
			// factor exp(-Inf) is 0.
			c := exp32(t.m[r] - mx)
			t.l[r] *= c
			simd.Scale(t.acc[r*dp:][:dp], c)
			t.m[r] = mx
		}
		t.l[r] += simd.ExpSum(vis, mx)
	}
	simd.Gemm(t.rows, dp, nk, t.s, bk, vp, dp, t.acc, dp, true)
}

// finish writes the normalised output of row r and returns its lse.
func (t *tile) finish(r int, out []float32) float32 {
	if t.l[r] == 0 {
		clear(out)
		return negInf
	}
	inv := 1 / t.l[r]
	for i, a := range t.acc[r*t.dp:][:t.d] {
		out[i] = a * inv
	}
	return t.m[r] + float32(math.Log(float64(t.l[r])))
}

func exp32(x float32) float32 { return float32(math.Exp(float64(x))) }
