package linear

import (
	"context"
	"fmt"
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
// and lse -Inf.
func (a *Attention) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	f := a.fm.Features(s.D)
	if f < 1 {
		return fmt.Errorf("%w: linear: feature map gives %d features for head size %d", attn.ErrInput, f, s.D)
	}
	p := &pass{
		s: s, o: o, q: q, k: k, v: v, out: out, lse: lse,
		scale: o.ScaleFor(s.D),
	}
	// Units of work are (batch row, kv head, a run of the group's query
	// heads). Each unit carries the state of its kv head from the start,
	// so splitting a group repeats the state updates: it is done only
	// when there are fewer (batch, kv head) pairs than workers.
	procs := runtime.GOMAXPROCS(0)
	g := s.Group()
	pairs := s.B * s.HKV
	workers := o.WorkerCount(procs, pairs*g)
	p.split = 1
	if pairs < workers {
		p.split = min(g, (workers+pairs-1)/pairs)
	}
	tasks := pairs * p.split
	workers = min(workers, tasks)

	return parallel.For(ctx, workers, tasks,
		func() *work { return a.newWork(s.D, f, g) },
		func(wk *work, n int) error { return p.run(ctx, wk, n) })
}

// pass is one Forward call's read-only state, shared by the workers.
type pass struct {
	s                 attn.Shape
	o                 attn.Options
	q, k, v, out, lse []float32
	scale             float32
	split             int // units per (batch, kv head)
}

// run computes unit n: heads [h0, h1) of the group of one (batch, kv
// head), every query position.
func (p *pass) run(ctx context.Context, w *work, n int) error {
	s := p.s
	g := s.Group()
	pair, part := n/p.split, n%p.split
	b, kvh := pair/s.HKV, pair%s.HKV
	h0 := kvh*g + part*g/p.split
	h1 := kvh*g + (part+1)*g/p.split
	nh := h1 - h0
	d := s.D
	kBase := p.k[(b*s.HKV+kvh)*s.M*d:][:s.M*d]
	vBase := p.v[(b*s.HKV+kvh)*s.M*d:][:s.M*d]
	kend := p.o.KeyEnd(s, b)
	st := &w.st
	st.reset(w.logScaled)
	c := w.c
	for i0 := 0; i0 < s.N; i0 += c {
		if i0%(16*c) == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		np := min(c, s.N-i0)
		// Visible key ends rise by at most one per position, so every row
		// of the chunk sees [0, ea) and the rows see at most [0, eb).
		ea := p.o.VisibleKeys(s, b, i0)
		eb := p.o.VisibleKeys(s, b, i0+np-1)
		w.advance(st, kBase, vBase, ea, d, p.scale)

		nb := 0 // keys [ea, ea+nb) loaded for the intra-chunk block
		if eb > ea {
			nb = min(c, kend-ea)
			w.load(kBase[ea*d:], vBase[ea*d:], nb, d, p.scale)
		}
		rows := nh * np
		for hh := range nh {
			qRows := p.q[((b*s.H+h0+hh)*s.N+i0)*d:][:np*d]
			var ls []float32
			if w.logScaled {
				ls = w.ql[hh*np:][:np]
			}
			w.fm.Map(w.qf[hh*np*w.ld:], w.ld, ls, qRows, np, d, p.scale, false)
		}
		w.attendChunk(st, rows, np, ea, func(i int) int { return p.o.VisibleKeys(s, b, i0+i) })

		for r := range rows {
			hh, i := r/np, r%np
			row := (b*s.H+h0+hh)*s.N + i0 + i
			l := w.finish(r, i, p.out[row*d:][:d])
			if p.lse != nil {
				p.lse[row] = l
			}
		}

		// Fold the keys the next chunk sees in full into the state, from
		// the loaded block when it holds them.
		if i0+np < s.N {
			next := p.o.VisibleKeys(s, b, i0+np)
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
// covers keys already folded in, so no later key can change it.
type prefix struct {
	s, z []float32
	m    float32
	n    int
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
	st.m = 0
	if logScaled {
		st.m = negInf
	}
}

// work is one worker's scratch, reused for every unit it computes.
type work struct {
	fm        FeatureMap
	logScaled bool
	c, cp     int // chunk, chunk padded to simd.Panel
	d, f, ld  int // head size, features, feature row stride
	dp        int // D padded to simd.Panel
	st        prefix
	qf        []float32 // [rows][ld] query features
	ql        []float32 // [rows] query log scales
	kf        []float32 // [c][ld] key features
	kt        []float32 // [f][cp] key features transposed
	kl        []float32 // [c] key log scales
	vp        []float32 // [c][dp] values
	a         []float32 // [rows][cp] intra-chunk weights
	acc       []float32 // [rows][dp] unnormalised outputs
	den       []float32 // [rows] normalisers
	mi        []float32 // [c] stabiliser of each chunk position
	pm        []float32 // [c] running maximum over the loaded block
	ex        []float32 // [c] exponents, then factors
	ones      []float32 // [c] ones, to sum with simd.Dot
	zero      []float32 // [d] zeros, to test finiteness with simd.Dot
}

func pad(n int) int { return (n + simd.Panel - 1) / simd.Panel * simd.Panel }

// newWork allocates scratch for head size d, f features and up to g
// query heads per chunk.
func (a *Attention) newWork(d, f, g int) *work {
	c := a.chunk
	w := &work{
		fm: a.fm, logScaled: a.fm.LogScaled(),
		c: c, cp: pad(c), d: d, f: f, ld: pad(f), dp: pad(d),
	}
	rows := g * c
	w.st = newPrefix(f, w.dp, w.logScaled)
	w.qf = make([]float32, rows*w.ld)
	w.ql = make([]float32, rows)
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

// load computes the features of nk ≤ c key rows and packs them, with their
// value rows, for the products of attendChunk and fold.
func (w *work) load(k, v []float32, nk, d int, scale float32) {
	var ls []float32
	if w.logScaled {
		ls = w.kl[:nk]
	}
	w.fm.Map(w.kf, w.ld, ls, k[:nk*d], nk, d, scale, true)
	transpose(w.kt, w.cp, w.kf, w.ld, nk, w.f)
	for j := range nk {
		copy(w.vp[j*w.dp:j*w.dp+d], v[j*d:(j+1)*d])
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

// advance folds keys [st.n, end) into the state, one chunk at a time.
func (w *work) advance(st *prefix, k, v []float32, end, d int, scale float32) {
	for st.n < end {
		nk := min(w.c, end-st.n)
		w.load(k[st.n*d:], v[st.n*d:], nk, d, scale)
		w.fold(st, nk)
		st.n += nk
	}
}

// attendChunk computes the unnormalised outputs of rows query rows laid
// out as heads × np positions: the carried state covers keys [0, ea) and
// the loaded block keys from ea on; position i sees keys [0, end(i)).
// It leaves in w.mi the stabiliser of each position.
func (w *work) attendChunk(st *prefix, rows, np, ea int, end func(i int) int) {
	acc := w.acc[:rows*w.dp]
	if st.n > 0 {
		simd.Gemm(rows, w.dp, w.f, w.qf, w.ld, st.s, w.dp, acc, w.dp, false)
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
	simd.Gemm(rows, w.cp, w.f, w.qf, w.ld, w.kt, w.cp, w.a, w.cp, false)
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
	simd.Gemm(rows, w.dp, nIntra, w.a, w.cp, w.vp, w.dp, acc, w.dp, true)
}

// finish normalises row r, at chunk position i, into out and returns its
// lse.
func (w *work) finish(r, i int, out []float32) float32 {
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
	// output overflow; keep the no-Inf promise by treating such a row
	// like a failed normaliser. Σ x·0 is 0 unless some x is Inf or NaN.
	if simd.Dot(out, w.zero[:w.d]) != 0 {
		clear(out)
		return negInf
	}
	l := log32(den)
	if w.logScaled {
		l += w.ql[r] + w.mi[i]
	}
	return l
}
