package linear

import (
	"context"
	"fmt"
	"math"
	"runtime"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Config sets up linear attention. The zero value is elu+1 attention with
// the default chunk.
type Config struct {
	// Map is the feature map φ; nil means ELU (elu(x)+1).
	Map FeatureMap
	// Chunk is the number of query positions in one chunk of the causal
	// pass (default DefaultChunk, at most MaxChunk). Within a chunk the
	// weights are a dense Chunk×Chunk block; across chunks a
	// Features×(D+1) state is carried.
	Chunk int
}

const (
	// DefaultChunk is the chunk length used when Config.Chunk is 0.
	DefaultChunk = 64
	// MaxChunk bounds Config.Chunk: each worker holds a block of
	// Chunk×Chunk weights per query head of a group.
	MaxChunk = 1024
)

// Attention is linear attention with one feature map. It implements
// attn.Mechanism under the name "linear". An Attention is safe for
// concurrent use.
type Attention struct {
	fm    FeatureMap
	chunk int
}

// New returns linear attention configured by cfg. A Chunk below 1 means
// DefaultChunk; one above MaxChunk means MaxChunk.
func New(cfg Config) *Attention {
	a := &Attention{fm: cfg.Map, chunk: cfg.Chunk}
	if a.fm == nil {
		a.fm = ELU{}
	}
	if a.chunk <= 0 {
		a.chunk = DefaultChunk
	}
	a.chunk = min(a.chunk, MaxChunk)
	return a
}

// Name returns "linear".
func (*Attention) Name() string { return "linear" }

// Chunk returns the chunk length in effect.
func (a *Attention) Chunk() int { return a.chunk }

// Forward writes linear attention of q, k, v into out and, when lse is
// non-nil, the log of each row's normaliser φ(q_i)·Σ_j φ(k_j) into lse.
// Causal and padding masks restrict the sum to the keys a query may see;
// a row that sees none, or whose normaliser is not positive, gets out 0
// and lse -Inf. A row that sees a key whose k or v holds a NaN or an
// infinity, or whose own q does, gets NaN in out and lse, as PyTorch
// propagates them. The result does not depend on o.Workers.
func (a *Attention) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	f := a.fm.Features(s.D)
	if f < 1 {
		return fmt.Errorf("%w: linear: feature map gives %d features for head size %d", attn.ErrInput, f, s.D)
	}
	g := s.Group()
	if err := a.checkSize(s.D, f, g, 0); err != nil {
		return err
	}
	p := &pass{
		ctx: ctx, s: s, o: o, q: q, k: k, v: v, out: out, lse: lse,
		scale: o.ScaleFor(s.D),
	}
	// Units of work are (batch row, kv head, a run of the group's query
	// heads). Each unit carries the state of its kv head from the start,
	// so splitting a group repeats the state updates: it is done only
	// when there are fewer (batch, kv head) pairs than workers. Each
	// head's rows go through products of their own (work.perHead), so
	// how a group is split changes no bit of the result.
	procs := runtime.GOMAXPROCS(0)
	pairs := s.B * s.HKV
	workers := o.WorkerCount(procs, pairs*g)
	p.split = 1
	if pairs < workers {
		p.split = min(g, (workers+pairs-1)/pairs)
	}
	tasks := pairs * p.split
	workers = min(workers, tasks)

	return parallel.For(ctx, workers, tasks,
		func() *work { return a.newWork(s.D, f, g, true) },
		p.run)
}

// MaxStateBytes bounds the memory of a State or Decoder (its prefix sums
// and one worker's scratch) and of one Forward worker's scratch. It is
// far past any model's recurrent state, and low enough that sizes taken
// from a corrupt configuration fail with an error instead of exhausting
// memory: B, H and D may each be near 2^40 for attn.Shape, and their
// product with the features would not even fit an int.
//
// It is 2^34, or the largest int where int has 32 bits.
const MaxStateBytes = min(1<<34, math.MaxInt)

// checkSize returns an error when a State of prefixes (batch rows × kv
// heads, 0 for Forward) with the scratch of one worker for head size d,
// f features and g query heads per kv head would exceed MaxStateBytes.
func (a *Attention) checkSize(d, f, g, prefixes int) error {
	n, ok := a.stateFloats(d, f, g, prefixes)
	if !ok || n > MaxStateBytes/4 {
		return fmt.Errorf("%w: linear: %d prefixes of %d features × head size %d with %d heads a group need more than MaxStateBytes = %d bytes",
			attn.ErrShape, prefixes, f, d, g, MaxStateBytes)
	}
	return nil
}

// stateFloats returns the float32s of prefixes prefix states and one
// work, or false if the count overflows. It mirrors newPrefix and
// newWork.
func (a *Attention) stateFloats(d, f, g, prefixes int) (int, bool) {
	const limit = math.MaxInt / 8
	mul := func(xs ...int) int {
		p := 1
		for _, x := range xs {
			if x != 0 && p > limit/x {
				return limit
			}
			p *= x
		}
		return p
	}
	c := a.chunk
	cp, ld, dp := pad(c), pad(f), pad(d)
	rows := mul(g, c)
	parts := []int{
		mul(prefixes, f, dp+1), // prefix sums and normalisers
		mul(f, dp+1),           // the work's own prefix
		mul(rows, ld+cp+dp+3),  // qf, a, acc, ql, den, bad
		mul(c, ld+dp+6),        // kf, vp, kl, mi, pm, ex, ones
		mul(f, cp),             // kt
		d,                      // zero
	}
	n := 0
	for _, x := range parts {
		if x >= limit || n > limit-x {
			return 0, false
		}
		n += x
	}
	return n, true
}

// pass is one Forward call's read-only state, shared by the workers.
type pass struct {
	ctx               context.Context
	s                 attn.Shape
	o                 attn.Options
	q, k, v, out, lse []float32
	scale             float32
	split             int // units per (batch, kv head)
}

// run computes unit n: heads [h0, h1) of the group of one (batch, kv
// head), every query position.
func (p *pass) run(w *work, n int) error {
	s := p.s
	g := s.Group()
	pair, part := n/p.split, n%p.split
	b, kvh := pair/s.HKV, pair%s.HKV
	h0 := kvh*g + part*g/p.split
	h1 := kvh*g + (part+1)*g/p.split
	d := s.D
	first := (b*s.H + h0) * s.N // the unit's first query row
	t := span{
		q: p.q[first*d:], out: p.out[first*d:], stride: s.N, nh: h1 - h0, nq: s.N,
		k: p.k[pair*s.M*d:][:s.M*d], v: p.v[pair*s.M*d:][:s.M*d],
		kend:  p.o.KeyEnd(s, b),
		vis:   func(i int) int { return p.o.VisibleKeys(s, b, i) },
		scale: p.scale,
	}
	if p.lse != nil {
		t.lse = p.lse[first:]
	}
	w.st.reset(w.logScaled)
	return w.sweep(p.ctx, &w.st, &t)
}

// span is what sweep computes: query positions [0, nq) of nh consecutive
// heads sharing one kv head. Head hh's rows of q and out start at row
// hh·stride (stride rows of D per head), its lse at hh·stride. k and v
// hold the kv head's keys [off, kend); vis(i) is the end of the keys
// position i sees, never below the keys the state holds, never above
// kend, and never falling with i.
type span struct {
	q, out, lse []float32
	stride      int
	nh, nq      int
	k, v        []float32
	off, kend   int
	vis         func(i int) int
	scale       float32
}

// sweep computes t in chunks of query positions, carrying st, which on
// entry holds the keys [0, t.off) at least. On return st holds some of the
// keys the last chunk's first row sees; advance folds in the rest.
func (w *work) sweep(ctx context.Context, st *prefix, t *span) error {
	c, d := w.c, w.d
	for i0 := 0; i0 < t.nq; i0 += c {
		if i0%(16*c) == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		np := min(c, t.nq-i0)
		// Visible key ends rise by at most one per position, so every row
		// of the chunk sees [0, ea) and the rows see at most [0, eb).
		ea, eb := t.vis(i0), t.vis(i0+np-1)
		w.advance(st, t.k, t.v, t.off, ea, t.scale)

		nb := 0 // keys [ea, ea+nb) loaded for the intra-chunk block
		if eb > ea {
			nb = min(c, t.kend-ea)
			w.load(st, t.k[(ea-t.off)*d:], t.v[(ea-t.off)*d:], ea, nb, t.scale)
		}
		for hh := range t.nh {
			qRows := t.q[(hh*t.stride+i0)*d:][:np*d]
			var ls []float32
			if w.logScaled {
				ls = w.ql[hh*np:][:np]
			}
			w.fm.Map(w.qf[hh*np*w.ld:], w.ld, ls, qRows, np, d, t.scale, false)
			for i := range np {
				w.bad[hh*np+i] = !w.finite(qRows[i*d:][:d])
			}
		}
		w.attendChunk(st, t.nh, np, ea, func(i int) int { return t.vis(i0 + i) })

		for r := range t.nh * np {
			hh, i := r/np, r%np
			row := hh*t.stride + i0 + i
			vis := t.vis(i0 + i)
			l := w.finish(r, i, t.out[row*d:][:d], vis > 0 && (w.bad[r] || st.bad < vis))
			if t.lse != nil {
				t.lse[row] = l
			}
		}

		// Fold the keys the next chunk sees in full into the state, from
		// the loaded block when it holds them.
		if i0+np < t.nq {
			next := t.vis(i0 + np)
			if next > ea && next-ea <= nb {
				w.fold(st, next-ea)
				st.n = next
			}
		}
	}
	return nil
}

// prefix is the carried state of one (batch, kv head): over the keys
// [0, n) it holds exp(m)·s = Σ_j φ(k_j)·v_jᵀ, F rows of D columns padded
// to dp, and exp(m)·z = Σ_j φ(k_j), the normaliser's F numbers. m is the
// running maximum of the keys' log scales, the stabiliser: it only ever
// covers keys already folded in, so no later key can change it. bad is
// the first key loaded whose k or v is not finite (math.MaxInt if none):
// the rows that see it are NaN, whatever the sums hold.
type prefix struct {
	s, z []float32
	m    float32
	n    int
	bad  int
}

func newPrefix(f, dp int, logScaled bool) prefix {
	st := prefix{s: make([]float32, f*dp), z: make([]float32, f)}
	st.reset(logScaled)
	return st
}

func (st *prefix) reset(logScaled bool) {
	clear(st.s)
	clear(st.z)
	st.n = 0
	st.bad = math.MaxInt
	st.m = 0
	if logScaled {
		st.m = negInf
	}
}

// work is one worker's scratch, reused for every unit it computes.
type work struct {
	fm        FeatureMap
	logScaled bool
	// perHead makes attendChunk multiply each head's rows on their own:
	// the products' row blocking, and so their rounding, then does not
	// depend on which heads share a unit.
	perHead  bool
	c, cp    int // chunk, chunk padded to simd.Panel
	d, f, ld int // head size, features, feature row stride
	dp       int // D padded to simd.Panel
	st       prefix
	qf       []float32 // [rows][ld] query features
	ql       []float32 // [rows] query log scales
	bad      []bool    // [rows] query rows that are not finite
	kf       []float32 // [c][ld] key features
	kt       []float32 // [f][cp] key features transposed
	kl       []float32 // [c] key log scales
	vp       []float32 // [c][dp] values
	a        []float32 // [rows][cp] intra-chunk weights
	acc      []float32 // [rows][dp] unnormalised outputs
	den      []float32 // [rows] normalisers
	mi       []float32 // [c] stabiliser of each chunk position
	pm       []float32 // [c] running maximum over the loaded block
	ex       []float32 // [c] exponents, then factors
	ones     []float32 // [c] ones, to sum with simd.Dot
	zero     []float32 // [d] zeros, to test finiteness with simd.Dot
}

func pad(n int) int { return (n + simd.Panel - 1) / simd.Panel * simd.Panel }

// newWork allocates scratch for head size d, f features and up to g
// query heads per chunk; perHead is work.perHead.
func (a *Attention) newWork(d, f, g int, perHead bool) *work {
	c := a.chunk
	w := &work{
		fm: a.fm, logScaled: a.fm.LogScaled(), perHead: perHead,
		c: c, cp: pad(c), d: d, f: f, ld: pad(f), dp: pad(d),
	}
	rows := g * c
	w.st = newPrefix(f, w.dp, w.logScaled)
	w.qf = make([]float32, rows*w.ld)
	w.ql = make([]float32, rows)
	w.bad = make([]bool, rows)
	w.kf = make([]float32, c*w.ld)
	w.kt = make([]float32, f*w.cp)
	w.kl = make([]float32, c)
	w.vp = make([]float32, c*w.dp)
	w.a = make([]float32, rows*w.cp)
	w.acc = make([]float32, rows*w.dp)
	w.den = make([]float32, rows)
	w.mi = make([]float32, c)
	w.pm = make([]float32, c)
	w.ex = make([]float32, c)
	w.ones = make([]float32, c)
	for j := range w.ones {
		w.ones[j] = 1
	}
	w.zero = make([]float32, d)
	return w
}

// floats returns the float32s the work holds (the bool flags counted as
// one each), for Decoder.Bytes.
func (w *work) floats() int {
	n := len(w.st.s) + len(w.st.z) + len(w.bad) + len(w.zero) + len(w.ones)
	for _, x := range [][]float32{w.qf, w.ql, w.kf, w.kt, w.kl, w.vp, w.a, w.acc, w.den, w.mi, w.pm, w.ex} {
		n += len(x)
	}
	return n
}

// finite reports whether x (at most d long) holds no NaN and no infinity:
// Σ x·0 is 0 unless some x is.
func (w *work) finite(x []float32) bool { return simd.Dot(x, w.zero[:len(x)]) == 0 }

// load computes the features of nk ≤ c key rows, keys j0 on of st's kv
// head, and packs them, with their value rows, for the products of
// attendChunk and fold. A key whose k or v is not finite is recorded in
// st.bad, and a value row that is not finite packed as zeros: the rows
// that see the key are NaN anyway, and in the intra-chunk product the
// rows that do not see it multiply its value by 0, which must stay 0.
func (w *work) load(st *prefix, k, v []float32, j0, nk int, scale float32) {
	d := w.d
	var ls []float32
	if w.logScaled {
		ls = w.kl[:nk]
	}
	w.fm.Map(w.kf, w.ld, ls, k[:nk*d], nk, d, scale, true)
	transpose(w.kt, w.cp, w.kf, w.ld, nk, w.f)
	for j := range nk {
		vj, dst := v[j*d:(j+1)*d], w.vp[j*w.dp:j*w.dp+d]
		okV := w.finite(vj)
		if okV {
			copy(dst, vj)
		} else {
			clear(dst)
		}
		if !okV || !w.finite(k[j*d:(j+1)*d]) {
			st.bad = min(st.bad, j0+j)
		}
	}
}

// fold adds the first nk loaded keys to the state. It scales the packed
// key features in place, so it comes after any other use of them.
func (w *work) fold(st *prefix, nk int) {
	if nk == 0 {
		return
	}
	if w.logScaled {
		m := max(st.m, maxOf(w.kl[:nk]))
		if st.n > 0 && m > st.m {
			c := exp32(st.m - m)
			scaleBy(st.s, c)
			scaleBy(st.z, c)
		}
		st.m = m
		// Each key's factor is at most 1: its log scale is at most m.
		e := w.ex[:nk]
		for j, l := range w.kl[:nk] {
			e[j] = l - m
		}
		simd.Exp(e, e)
		for f := range w.f {
			mulInto(w.kt[f*w.cp:][:nk], e)
		}
	}
	for f := range w.f {
		st.z[f] += simd.Dot(w.kt[f*w.cp:][:nk], w.ones[:nk])
	}
	simd.Gemm(w.f, w.dp, nk, w.kt, w.cp, w.vp, w.dp, st.s, w.dp, true)
}

// advance folds keys [st.n, end) into the state, one chunk at a time; k
// and v hold the keys from off on.
func (w *work) advance(st *prefix, k, v []float32, off, end int, scale float32) {
	d := w.d
	for st.n < end {
		nk := min(w.c, end-st.n)
		w.load(st, k[(st.n-off)*d:], v[(st.n-off)*d:], st.n, nk, scale)
		w.fold(st, nk)
		st.n += nk
	}
}

// gemmRows is simd.Gemm over rows laid out as heads × np positions, the
// A and C rows of row r at r·lda and r·ldc: in one product, or one a head
// when w.perHead.
func (w *work) gemmRows(heads, np, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	hs := heads
	if w.perHead {
		hs = 1
	}
	for h := 0; h < heads; h += hs {
		r := h * np
		simd.Gemm(hs*np, n, k, a[r*lda:], lda, b, ldb, c[r*ldc:], ldc, accumulate)
	}
}

// attendChunk computes the unnormalised outputs of the query rows of
// heads × np positions: the carried state covers keys [0, ea) and the
// loaded block keys from ea on; position i sees keys [0, end(i)). It
// leaves in w.mi the stabiliser of each position.
func (w *work) attendChunk(st *prefix, heads, np, ea int, end func(i int) int) {
	rows := heads * np
	acc := w.acc[:rows*w.dp]
	if st.n > 0 {
		w.gemmRows(heads, np, w.dp, w.f, w.qf, w.ld, st.s, w.dp, acc, w.dp, false)
		for r := range rows {
			w.den[r] = simd.Dot(w.qf[r*w.ld:][:w.f], st.z)
		}
	} else {
		clear(acc)
		clear(w.den[:rows])
	}
	// Stabiliser of position i: the running maximum over the keys it
	// sees, so no key past its end enters its result.
	nIntra := end(np-1) - ea
	if w.logScaled {
		m := st.m
		for j := range nIntra {
			m = max(m, w.kl[j])
			w.pm[j] = m
		}
		for i := range np {
			if vis := end(i) - ea; vis > 0 {
				w.mi[i] = w.pm[vis-1]
			} else {
				w.mi[i] = st.m
			}
		}
		if st.n > 0 {
			for r := range rows {
				if mi := w.mi[r%np]; mi > st.m {
					c := exp32(st.m - mi)
					scaleBy(acc[r*w.dp:][:w.dp], c)
					w.den[r] *= c
				}
			}
		}
	} else {
		for i := range np {
			w.mi[i] = 0
		}
	}
	if nIntra <= 0 {
		return
	}
	w.gemmRows(heads, np, w.cp, w.f, w.qf, w.ld, w.kt, w.cp, w.a, w.cp, false)
	for r := range rows {
		i := r % np
		vis := max(end(i)-ea, 0)
		ar := w.a[r*w.cp:][:nIntra]
		if w.logScaled && vis > 0 {
			mi := w.mi[i]
			e := w.ex[:vis]
			for j, l := range w.kl[:vis] {
				e[j] = l - mi
			}
			simd.Exp(e, e)
			mulInto(ar[:vis], e)
		}
		clear(ar[vis:])
		w.den[r] += simd.Dot(ar[:vis], w.ones[:vis])
	}
	w.gemmRows(heads, np, w.dp, nIntra, w.a, w.cp, w.vp, w.dp, acc, w.dp, true)
}

// finish normalises row r, at chunk position i, into out and returns its
// lse. bad marks a row that sees a NaN or an infinity: it is NaN.
func (w *work) finish(r, i int, out []float32, bad bool) float32 {
	if bad {
		nan := float32(math.NaN())
		for c := range out {
			out[c] = nan
		}
		return nan
	}
	acc := w.acc[r*w.dp:][:w.dp]
	den := w.den[r]
	inv := 1 / den
	if !(den > 0) || isInf(inv) {
		clear(out)
		return negInf
	}
	copy(out, acc[:w.d])
	simd.Scale(out, inv)
	// Features that are not positive (trigonometric ones) can make an
	// output of finite inputs overflow; keep the no-Inf promise by
	// treating such a row like a failed normaliser.
	if !w.finite(out) {
		clear(out)
		return negInf
	}
	l := log32(den)
	if w.logScaled {
		l += w.ql[r] + w.mi[i]
	}
	return l
}
