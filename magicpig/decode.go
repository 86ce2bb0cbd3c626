package magicpig

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore"
	"github.com/attnkit/attn/internal/hugepage"
	"github.com/attnkit/attn/internal/simd"
)

// Decoder is MagicPIG's incremental form (see the package
// documentation): exact attention for prompt chunks, LSH sampling for
// generated tokens. It implements attn.Decoder, attn.Appender and
// attn.Fallbacker and is not safe for concurrent use.
type Decoder struct {
	*decstore.Decoder[*scratch]
	r *rule
}

// rule is the decode rule over the store, with the hash tables.
type rule struct {
	m     *MagicPIG
	st    *decstore.Store
	scale float32
	// planes holds the hyperplanes as the columns of a [D][cols]
	// matrix, column l·K+i the i-th of table l; cols is K·L rounded up to
	// simd.Panel for Gemm, the extra columns zero.
	planes []float32
	cols   int
	logC   []float64 // log binomial(L, j), j = 0 … L
	// table is built by the first step that samples.
	table     *probTable
	tableOnce sync.Once
	heads     []tables // [B][Hkv]
	listsOnce sync.Once

	// Rows the steps have read (the exact part and the samples), for the
	// tests that check a step reads a fraction of the cache.
	rowsRead atomic.Int64
}

// tables is the index of one sequence and key/value head.
type tables struct {
	// lists [L][2^K] holds positions, increasing. Each list is a piece
	// of arena: a step walks 150 of them at random, and the lists of one
	// allocation on huge pages cost far fewer misses of the TLB than
	// lists allocated one by one.
	lists   [][]int32
	arena   []int32 // its length is carved into lists
	indexed int
}

// Sizes of the arena: a list's first capacity, and an arena's least.
const (
	minList  = 4
	minArena = 1 << 16
)

// reserve gives list j room for need positions, doubling its capacity
// where it grows.
func (t *tables) reserve(j, need int) {
	if need <= cap(t.lists[j]) {
		return
	}
	c := max(need, 2*cap(t.lists[j]), minList)
	if len(t.arena)+c > cap(t.arena) {
		t.compact(c)
	}
	nl := t.arena[len(t.arena):][:len(t.lists[j]):c]
	copy(nl, t.lists[j])
	t.lists[j] = nl
	t.arena = t.arena[:len(t.arena)+c]
}

// compact moves every list into a new arena with room for twice their
// capacities and extra more positions: the pieces lists left behind as
// they grew are dropped, and the copies are amortised as a slice's
// growth is.
func (t *tables) compact(extra int) {
	live := extra
	for _, l := range t.lists {
		live += cap(l)
	}
	na := make([]int32, 0, max(2*live, minArena))
	hugepage.Advise(na[:cap(na)])
	for j, l := range t.lists {
		nl := na[len(na):][:len(l):cap(l)]
		copy(nl, l)
		t.lists[j] = nl
		na = na[:len(na)+cap(l)]
	}
	t.arena = na
}

// NewDecoder returns an empty decoder with m's parameters for the batch
// of cfg. A cfg.Storage other than "", "f32", "bf16", "f16", "i8" or
// "i4" (each optionally "+rot") and a cfg.Window are errors wrapping
// attn.ErrUnsupported.
func (m *MagicPIG) NewDecoder(cfg attn.DecodeConfig) (attn.Decoder, error) {
	st, err := decstore.NewStore("magicpig", cfg, math.MaxInt32, 0)
	if err != nil {
		return nil, err
	}
	r := &rule{m: m, st: st, scale: cfg.ScaleFor(), heads: make([]tables, cfg.B*cfg.HKV)}
	kl := m.bits * m.tables
	r.cols = (kl + simd.Panel - 1) / simd.Panel * simd.Panel
	r.planes = make([]float32, cfg.D*r.cols)
	rng := rand.New(rand.NewPCG(m.seed, 0x6d61676963706967))
	for c := range kl {
		for i := range cfg.D {
			r.planes[i*r.cols+c] = float32(rng.NormFloat64())
		}
	}
	r.logC = make([]float64, m.tables+1)
	for j := range r.logC {
		a, _ := math.Lgamma(float64(m.tables + 1))
		b, _ := math.Lgamma(float64(j + 1))
		c, _ := math.Lgamma(float64(m.tables - j + 1))
		r.logC[j] = a - b - c
	}
	return &Decoder{Decoder: decstore.New(st, r), r: r}, nil
}

// scratch is one worker's.
type scratch struct {
	proj  []float32     // projections [rows][cols]
	bk    []uint16      // buckets of keys being indexed, [rows][L]
	count []int32       // keys per list in a block being indexed
	codes []uint32      // [g][L] buckets of the group's queries
	q     []float32     // the group's scaled queries [g][D]
	qn    []float32     // their norms
	exact []float32     // [g][sinks and window] logits, then weights
	emax  []float32     // [g] their largest logit
	esum  []float32     // [g] their exponentials' sum
	line  []float32     // one head's sampled logits, less log P(sampled)
	sacc  []float32     // [D] their product with the values
	pos   []int32       // the samples' positions, head by head
	off   []int         // [g+1] where each head's are in pos
	rows  decstore.Head // a batch of samples' rows, key and value
	row   []float32     // [indexRows][D] keys being hashed, or a row widened from 16 bits
	w     []float32     // their weights
	lists [][]int32     // [g][L] the lists of the queries' buckets
	touch int32         // what reading their first entries gave
	sink  float32       // what Gather read
	// seen holds, for each position, the epoch (a count of sample
	// calls) at which it last collided, above hitBits bits of its
	// collisions in that epoch.
	seen  []uint32
	epoch uint32
	// once and twice mark the positions seen once and twice, a bit
	// each, for thresholds of 1 and 2.
	once, twice []uint64
	acc         []float32 // [g][D] the exact part's product with the values
}

func (r *rule) NewScratch() *scratch { return &scratch{} }

func (r *rule) Reset() {
	for i := range r.heads {
		t := &r.heads[i]
		for j := range t.lists {
			t.lists[j] = t.lists[j][:0]
		}
		t.indexed = 0
	}
}

func (r *rule) Bytes() int {
	n := 4 * len(r.planes)
	for _, t := range r.heads {
		n += 24*cap(t.lists) + 4*cap(t.arena)
	}
	return n
}

// hitBits holds a position's collisions in sample's counts: up to
// MaxTables.
const hitBits = 11

// indexRows is the number of keys hashed by one product, indexBlock the
// number whose growth of the lists is sized at once.
const (
	indexRows  = 64
	indexBlock = 4096
)

// Index hashes positions [indexed, n) into the tables.
func (r *rule) Index(sc *scratch, b, kvh, n int) {
	cfg := r.st.Config()
	bits, nt := r.m.bits, r.m.tables
	t := &r.heads[b*cfg.HKV+kvh]
	r.listsOnce.Do(func() {
		// One allocation for every head's lists, on huge pages: a step
		// reads a list at random from each table.
		per := nt << bits
		all := make([][]int32, len(r.heads)*per)
		hugepage.Advise(all)
		for i := range r.heads {
			r.heads[i].lists = all[i*per : (i+1)*per : (i+1)*per]
		}
	})
	hd := r.st.Head(b, kvh)
	sc.row = grow(sc.row, indexRows*cfg.D)
	for p0 := t.indexed; p0 < n; p0 += indexBlock {
		rows := min(indexBlock, n-p0)
		if cap(sc.bk) < rows*nt {
			sc.bk = make([]uint16, rows*nt)
		}
		bk := sc.bk[:rows*nt]
		for i0 := 0; i0 < rows; i0 += indexRows {
			m := min(indexRows, rows-i0)
			keys, st := hd.KeyRows(sc.row, p0+i0, m)
			r.hash(sc, keys, st, m)
			for i := range m {
				for l := range nt {
					bk[(i0+i)*nt+l] = uint16(code(sc.proj[i*r.cols+l*bits:][:bits]))
				}
			}
		}
		if rows > 1 {
			// A prompt's keys spread over every list: each grows once,
			// doubling, rather than in append's steps as they arrive.
			if len(sc.count) != nt<<bits {
				sc.count = make([]int32, nt<<bits)
			}
			clear(sc.count)
			for i := range rows {
				for l, c := range bk[i*nt : (i+1)*nt] {
					sc.count[l<<bits|int(c)]++
				}
			}
			for j, c := range sc.count {
				if c > 0 {
					t.reserve(j, len(t.lists[j])+int(c))
				}
			}
		}
		for i := range rows {
			for l, c := range bk[i*nt : (i+1)*nt] {
				j := l<<bits | int(c)
				t.reserve(j, len(t.lists[j])+1)
				t.lists[j] = append(t.lists[j], int32(p0+i))
			}
		}
	}
	t.indexed = n
}

// hash sets sc.proj [rows][cols] to the products of rows vectors x
// [rows][D] (row stride ld) with the hyperplanes.
func (r *rule) hash(sc *scratch, x []float32, ld, rows int) {
	dd := r.st.Config().D
	sc.proj = grow(sc.proj, rows*r.cols)
	if r.cols > 0 {
		simd.Gemm(rows, r.cols, dd, x, ld, r.planes, r.cols, sc.proj, r.cols, false)
	}
}

// code is the bucket of one table from its K projections: bit i set
// where the i-th is positive.
func code(proj []float32) uint32 {
	var c uint32
	for i, x := range proj {
		if x > 0 {
			c |= 1 << i
		}
	}
	return c
}

// split returns, for a query at position p, the end of the sinks s0
// and the start of the window w0: positions [s0, w0) are sampled.
func (m *MagicPIG) split(p int) (s0, w0 int) {
	visible := p + 1
	s0 = min(m.sinks, visible)
	return s0, max(s0, visible-m.window)
}

// Decode attends the group's queries at position p exactly to the sinks
// and the window, and to the keys they sample with their weights, the
// two parts merged by their log-sum-exp.
func (r *rule) Decode(sc *scratch, b, kvh, p int, q, out, lse []float32) {
	cfg := r.st.Config()
	dd, g := cfg.D, cfg.H/cfg.HKV
	hd := r.st.Head(b, kvh)
	sc.q = grow(sc.q, g*dd)
	for i, x := range q {
		sc.q[i] = x * r.scale
	}
	visible := p + 1
	s0, w0 := r.m.split(p)
	if w0 > s0 {
		// The queries' lists first, the g·L misses of their first lines
		// then overlapping the exact part below rather than holding up
		// the samples' walk.
		r.queryLists(sc, b, kvh, g)
	}
	ranges := [2][2]int{{0, s0}, {w0, visible}}
	ne := s0 + visible - w0
	// The exact part, shared by the group: the logits, each head's
	// softmax, one product with the values.
	sc.exact = grow(sc.exact, g*ne)
	off := 0
	for _, s := range ranges {
		if s[1] == s[0] {
			continue // the first step of a sequence has no window apart from the sinks
		}
		hd.DotKeys(sc.exact[off:], ne, sc.q, dd, g, s[0], s[1]-s[0], 0, 0)
		off += s[1] - s[0]
	}
	sc.emax, sc.esum = grow(sc.emax, g), grow(sc.esum, g)
	for h := range g {
		row := sc.exact[h*ne : (h+1)*ne]
		sc.emax[h] = simd.Max(row)
		sc.esum[h] = simd.ExpSum(row, sc.emax[h])
	}
	sc.acc = grow(sc.acc, g*dd)
	clear(sc.acc)
	sc.row = grow(sc.row, dd)
	off = 0
	for _, s := range ranges {
		n := s[1] - s[0]
		if n == 0 {
			continue
		}
		hd.AddValues(sc.exact[off:], ne, g, s[0], n, sc.acc, sc.row, 0, 0)
		off += n
	}
	// The samples: every head's positions first, then their rows, so
	// that each batch of rows can be requested while the one before it
	// is computed on; then each head's merge.
	if w0 > s0 {
		r.collide(sc, b, kvh, g, s0, w0)
	}
	rows := ne
	sc.sacc = grow(sc.sacc, dd)
	for h := range g {
		ns, smax, ssum := 0, float32(math.Inf(-1)), float32(0)
		clear(sc.sacc)
		if w0 > s0 {
			ns, smax, ssum = r.sample(sc, b, kvh, h)
		}
		rows += ns
		m := max(sc.emax[h], smax)
		a := float32(math.Exp(float64(sc.emax[h] - m)))
		c := float32(0)
		if ns > 0 {
			c = float32(math.Exp(float64(smax - m)))
		}
		z := a*sc.esum[h] + c*ssum
		lse[h] = m + float32(math.Log(float64(z)))
		a, c = a/z, c/z
		for i, x := range sc.acc[h*dd : (h+1)*dd] {
			out[h*dd+i] = a*x + c*sc.sacc[i]
		}
	}
	r.rowsRead.Add(int64(rows))
}

// queryLists sets sc.lists [g][L] to the lists of the group's queries'
// buckets, and requests the first line of each.
func (r *rule) queryLists(sc *scratch, b, kvh, g int) {
	r.queryCodes(sc, g)
	t := &r.heads[b*r.st.Config().HKV+kvh]
	bits, nt := r.m.bits, r.m.tables
	sc.lists = sc.lists[:0]
	for i, c := range sc.codes[:g*nt] {
		list := t.lists[(i%nt)<<bits|int(c)]
		sc.lists = append(sc.lists, list)
		simd.Prefetch(list[:min(len(list), 16)])
	}
}

// queryCodes hashes the group's scaled queries: sc.codes [g][L], and
// their norms sc.qn.
func (r *rule) queryCodes(sc *scratch, g int) {
	dd, bits, nt := r.st.Config().D, r.m.bits, r.m.tables
	r.hash(sc, sc.q, dd, g)
	sc.codes = slices.Grow(sc.codes[:0], g*nt)[:g*nt]
	sc.qn = grow(sc.qn, g)
	for h := range g {
		for l := range nt {
			sc.codes[h*nt+l] = code(sc.proj[h*r.cols+l*bits:][:bits])
		}
		qh := sc.q[h*dd : (h+1)*dd]
		sc.qn[h] = float32(math.Sqrt(float64(simd.Dot(qh, qh))))
	}
}

// sampleBytes is the size of the rows of samples that sample copies into
// one block before their products (at least minBatch rows): a batch's
// rows are requested while the batch before it is computed on. More
// requests at once made the step slower, not faster: the processor
// holds only so many misses in flight.
const (
	sampleBytes = 24 << 10
	minBatch    = 16
)

// batchRows returns the samples of a batch for rows of hd.
func batchRows(hd *decstore.Head) int {
	return max(minBatch, sampleBytes/hd.RowBytes())
}

// collide finds, for each of the group's g heads h, the positions in
// [s0, w0) that share its bucket in at least Threshold tables, in
// increasing order: sc.pos[sc.off[h]:sc.off[h+1]]. It requests the rows
// of the first batch of samples. queryLists must have run.
func (r *rule) collide(sc *scratch, b, kvh, g, s0, w0 int) {
	nt, th := r.m.tables, r.m.threshold
	sc.pos = sc.pos[:0]
	sc.off = append(sc.off[:0], 0)
	for h := range g {
		// The first entries of the head's lists, each a load
		// independent of the others: the processor overlaps their
		// misses, where the walk below would wait for them one table at
		// a time.
		lists := sc.lists[h*nt : (h+1)*nt]
		var touch int32
		for _, list := range lists {
			if len(list) > 0 {
				touch += list[0]
			}
		}
		sc.touch += touch
		start := len(sc.pos)
		if th <= 2 {
			sc.collideBits(lists, s0, w0, th)
		} else {
			sc.collideCounts(lists, s0, w0, th)
			slices.Sort(sc.pos[start:])
		}
		sc.off = append(sc.off, len(sc.pos))
	}
	hd := r.st.Head(b, kvh)
	hd.Prefetch(sc.pos[:min(len(sc.pos), batchRows(hd))])
}

// sample computes head h's samples (collide must have run): their
// logits less the log of their sampling probability into sc.line, and
// returns their number ns and the softmax of those logits over the
// samples, unnormalised: the largest logit smax, the sum ssum of the
// exponentials relative to it, and their product with the values in
// sc.sacc (which must be zero).
func (r *rule) sample(sc *scratch, b, kvh, h int) (ns int, smax, ssum float32) {
	dd := r.st.Config().D
	r.tableOnce.Do(func() { r.table = r.probTableFor() })
	pos := sc.pos[sc.off[h]:sc.off[h+1]]
	ns = len(pos)
	sc.line = grow(sc.line, ns)
	hd := r.st.Head(b, kvh)
	q := sc.q[h*dd : (h+1)*dd]
	qn := float64(sc.qn[h])
	acc := sc.sacc
	smax = float32(math.Inf(-1))
	// The samples a batch at a time: the next batch's rows (which may
	// be the next head's) are requested, then this batch's rows (key
	// and value, stored together) copied into one block, which they
	// mostly are already, then one product gives the batch's logits and
	// one more its share of the values, merged into the others' by an
	// online softmax.
	batch := batchRows(hd)
	sc.w = grow(sc.w, min(ns, batch))
	sc.row = grow(sc.row, dd)
	rows := &sc.rows
	for b0 := 0; b0 < ns; b0 += batch {
		nb := min(batch, ns-b0)
		next := sc.pos[sc.off[h]+b0+nb:]
		hd.Prefetch(next[:min(len(next), batch)])
		sc.sink += hd.Gather(rows, pos[b0:b0+nb])
		line := sc.line[b0 : b0+nb]
		rows.DotKeys(line, nb, q, dd, 1, 0, nb, 0, 0)
		bmax := float32(math.Inf(-1))
		for i, l := range line {
			// The key's norm from the row at hand: a table of norms would
			// be one more miss a sample.
			kn := rows.KeyNorm(sc.row, i)
			line[i] = l - float32(r.logProb(float64(l), qn*kn))
			bmax = max(bmax, line[i])
		}
		if bmax > smax {
			if ssum > 0 {
				f := float32(math.Exp(float64(smax - bmax)))
				simd.Scale(acc, f)
				ssum *= f
			}
			smax = bmax
		}
		w := sc.w[:nb]
		copy(w, line) // line keeps the logits (the tests read them)
		ssum += simd.ExpSum(w, smax)
		rows.AddValues(w, nb, 1, 0, nb, acc, sc.row, 0, 0)
	}
	return ns, smax, ssum
}

// collideAhead is how many lists ahead collideBits requests a list's
// lines.
const collideAhead = 4

// collideBits appends to sc.pos, in increasing order, the positions in
// [s0, w0) that appear in th (1 or 2) of lists: the walk
// marks positions in two bitmaps, a bit a position, which stay in a
// core's first cache however long the cache, where counts would not; a
// scan of the bitmap then lists them in order, with no sort.
func (sc *scratch) collideBits(lists [][]int32, s0, w0, th int) {
	words := (w0 + 63) / 64
	if cap(sc.once) < words {
		sc.once, sc.twice = make([]uint64, words), make([]uint64, words)
	}
	once, twice := sc.once[:words], sc.twice[:words]
	for i, list := range lists {
		if i+collideAhead < len(lists) {
			// A list is a few lines, too few for the processor's own
			// prefetcher to follow: the rest of a list some tables
			// ahead is requested while this one is walked.
			simd.Prefetch(lists[i+collideAhead])
		}
		start := 0
		for start < len(list) && int(list[start]) < s0 { // the sinks, few
			start++
		}
		for _, x := range list[start:] {
			if int(x) >= w0 {
				break
			}
			w, bit := x>>6, uint64(1)<<(x&63)
			twice[w] |= once[w] & bit
			once[w] |= bit
		}
	}
	hits := twice
	if th == 1 {
		hits = once
	}
	for w := s0 / 64; w < words; w++ {
		for b := hits[w]; b != 0; b &= b - 1 {
			sc.pos = append(sc.pos, int32(w*64+bits.TrailingZeros64(b)))
		}
		once[w], twice[w] = 0, 0
	}
}

// collideCounts is collideBits for any threshold, with a count a
// position, stamped with the call's epoch so that it is never cleared.
func (sc *scratch) collideCounts(lists [][]int32, s0, w0, th int) {
	if len(sc.seen) < w0 {
		sc.seen = make([]uint32, max(w0, 2*len(sc.seen)))
		sc.epoch = 0
	}
	sc.epoch++
	if sc.epoch == 1<<(32-hitBits) { // wrapped: no stamp is older than every other
		clear(sc.seen)
		sc.epoch = 1
	}
	ep := sc.epoch << hitBits
	for _, list := range lists {
		start := 0
		for start < len(list) && int(list[start]) < s0 {
			start++
		}
		for _, x := range list[start:] {
			if int(x) >= w0 {
				break
			}
			c := sc.seen[x]
			if c&^(1<<hitBits-1) != ep {
				c = ep
			}
			c++
			sc.seen[x] = c
			if int(c-ep) == th {
				sc.pos = append(sc.pos, x)
			}
		}
	}
}

// logProb returns the log of the probability that a key whose product
// with the scaled query is dot, the product of their norms norms, is
// sampled: P(Binomial(L, (1 - θ/π)^K) >= T), θ their angle.
func (r *rule) logProb(dot, norms float64) float64 {
	cos := 0.0 // a zero vector's signs are all 0: it agrees with any other half the time
	if norms > 0 {
		cos = max(-1, min(1, dot/norms))
	}
	if t := r.table; t != nil && cos >= tableLo && cos <= tableHi {
		x := (cos - tableLo) * t.inv
		i := min(int(x), len(t.v)-2)
		f := x - float64(i)
		return t.v[i] + f*(t.v[i+1]-t.v[i])
	}
	return r.logProbCos(cos)
}

// logProbCos is logProb for the cosine of the angle, computed directly.
func (r *rule) logProbCos(cos float64) float64 {
	p1 := 1 - math.Acos(cos)/math.Pi
	// A sampled key collided, which exact opposites cannot; rounding of
	// the angle must not make its weight infinite.
	p1 = max(p1, 0x1p-60)
	return r.logAtLeast(float64(r.m.bits) * math.Log(p1))
}

// The table of logProbCos over [tableLo, tableHi]: the six
// transcendental functions of the direct computation cost more than a
// sampled key's two rows, and the cosines of random vectors in many
// dimensions stay near 0. Near ±1 the angle's square-root singularity
// (and below, the logarithm of a vanishing probability) defeat
// interpolation, and there the direct computation runs; keys that far
// from the query are seldom sampled.
const (
	tableLo, tableHi = -0.6, 0.9
	// tableSteps keeps the table (64 KiB) in a core's cache: it is read
	// at random, once a sample.
	tableSteps = 1 << 13
	// tableErr bounds the interpolation error of a table in use, in log
	// probability: the relative error of a weight.
	tableErr = 1e-6
)

type probTable struct {
	inv float64 // steps per unit of cosine
	v   []float64
}

// probTables holds a table per (K, L, T), nil where interpolation would
// err by more than tableErr (very steep thresholds).
var probTables sync.Map

// probTableFor returns r's table, built on first use for its (K, L, T).
func (r *rule) probTableFor() *probTable {
	key := [3]int{r.m.bits, r.m.tables, r.m.threshold}
	if t, ok := probTables.Load(key); ok {
		return t.(*probTable)
	}
	step := (tableHi - tableLo) / tableSteps
	t := &probTable{inv: 1 / step, v: make([]float64, tableSteps+1)}
	for i := range t.v {
		t.v[i] = r.logProbCos(tableLo + float64(i)*step)
	}
	for i := range tableSteps {
		mid := r.logProbCos(tableLo + (float64(i)+0.5)*step)
		if e := math.Abs((t.v[i]+t.v[i+1])/2 - mid); !(e <= tableErr) {
			t = nil
			break
		}
	}
	got, _ := probTables.LoadOrStore(key, t)
	return got.(*probTable)
}

// logAtLeast returns log P(X >= T) for X ~ Binomial(L, p), given log p:
// 1 minus the head sum where that is at most one half, else the tail
// summed from T by the ratios of its terms, so that neither cancels.
func (r *rule) logAtLeast(lp float64) float64 {
	nt, th := r.m.tables, r.m.threshold
	if lp >= 0 {
		return 0
	}
	p := math.Exp(lp)
	lq := math.Log1p(-p)
	head := 0.0
	for j := range th {
		head += math.Exp(r.logC[j] + float64(j)*lp + float64(nt-j)*lq)
	}
	if head <= 0.5 {
		return math.Log1p(-head)
	}
	ratio := p / (1 - p)
	sum, term := 1.0, 1.0
	for j := th; j < nt; j++ {
		term *= float64(nt-j) / float64(j+1) * ratio
		sum += term
		if term < sum*0x1p-55 {
			break
		}
	}
	return r.logC[th] + float64(th)*lp + float64(nt-th)*lq + math.Log(sum)
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// Fallback says when a decode step is exact attention: when the sinks
// and the window hold every position the query sees (s.M, its own
// included), or with no bits, where every key is sampled with weight 1.
func (d *Decoder) Fallback(s attn.Shape, o attn.Options) string {
	m := d.r.m
	if s.M <= 0 {
		return ""
	}
	if s0, w0 := m.split(s.M - 1); w0 == s0 {
		return fmt.Sprintf("M = %d positions fit the %d sinks and the window of %d: the decoder attended exactly", s.M, m.sinks, m.window)
	}
	if m.bits == 0 {
		return "0 bits: every key shares the query's bucket in every table and is sampled with weight 1: the decoder attended exactly"
	}
	return ""
}

var (
	_ attn.Decoder    = (*Decoder)(nil)
	_ attn.Appender   = (*Decoder)(nil)
	_ attn.Fallbacker = (*Decoder)(nil)
)
