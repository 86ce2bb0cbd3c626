package reformer

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync/atomic"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// Defaults of the Config fields, exported so that front ends (the
// registry's parameters) can show them.
const (
	// DefaultHashes is Config.Hashes when it is 0.
	DefaultHashes = 4
	// DefaultBucket is Config.Bucket when it is 0; Config.Window defaults
	// to Bucket.
	DefaultBucket = 64
	// DefaultMin is Config.Min when it is 0, without the causal mask: the
	// length below which Forward computes exact attention, about where 4
	// rounds of 64-key chunks overtake the exact kernel (see the package
	// documentation).
	DefaultMin = 2048
	// DefaultMinCausal is Config.Min when it is 0, under the causal mask,
	// where exact attention does half the work.
	DefaultMinCausal = 2 * DefaultMin
	// DefaultCausalBuckets is the bucket count of the causal rule (causal
	// Forward and the decoders) when Config.Buckets is 0. Without the
	// mask the default is ceil(M/Bucket) instead, which the causal rule
	// cannot use: a count that depends on the length would make the
	// output at a position depend on how long the pass is, and a decoder
	// does not know the length yet.
	DefaultCausalBuckets = 64
	// DefaultDecodeBuckets is DefaultCausalBuckets, under its older name.
	DefaultDecodeBuckets = DefaultCausalBuckets
)

// Limits on the Config fields; larger values are rejected with
// attn.ErrInput.
const (
	MaxHashes  = 64
	MaxBucket  = 1 << 20
	MaxBuckets = 1 << 20
	MaxWindow  = 1 << 20
)

// Limits on what a call or a decoder allocates up front, checked before
// anything is allocated (attn.ErrUnsupported beyond them): the random
// rotations (D × Hashes·Σf/2 floats, about D·Hashes·sqrt(Buckets) for
// large counts) and a decoder's bucket lists (B·Hkv·Hashes·buckets of
// them).
const (
	MaxRotationFloats = 1 << 26
	MaxDecodeLists    = 1 << 22
)

// Config sets up Reformer attention. The zero value uses the defaults.
type Config struct {
	// Hashes is the number of hash rounds (default DefaultHashes = 4).
	// The rounds' results are merged by log-sum-exp, so more rounds see
	// more keys: cost and accuracy grow with it.
	Hashes int
	// Bucket is the chunk size in keys (default DefaultBucket = 64).
	// Without the causal mask, after sorting the keys by (bucket,
	// position), each query attends to the chunk it falls in and the one
	// before, at most 2·Bucket keys per round. Under the causal rule a
	// query attends per round to the 2·Bucket latest keys of its bucket
	// that it may see.
	Bucket int
	// Buckets is the number of hash buckets per round. 0 picks
	// ceil(M/Bucket) without the causal mask, so that a bucket holds about
	// one chunk, and DefaultCausalBuckets under the causal rule. 1 puts
	// every key in one bucket. Counts up to 64 are rounded up to even and
	// hashed with one rotation; larger ones become two even factors
	// f1·f2 >= Buckets, each with its own rotation, as trax does.
	Buckets int
	// Min is the length below which Forward computes exact attention
	// instead: when N < Min or M < Min. 0 means DefaultMin without the
	// causal mask and DefaultMinCausal with it; a negative Min never falls
	// back (the command line's min=0). Fallback says whether a call falls
	// back. The decoders never do.
	Min int
	// SharedQK uses the paper's shared query-key space: the keys are the
	// queries normalised to unit length and the k argument of Forward is
	// not read (it must still have the length of K). It needs N == M and
	// H == Hkv, and it implies ExcludeSelf. With SharedQK the decoders
	// take each token's query in place of its key.
	SharedQK bool
	// ExcludeSelf applies the paper's self rule: a query attends to the
	// key at its own position only when it sees no other key in any
	// round. It is always in effect with SharedQK, where q·k_self is the
	// largest logit a query can have.
	ExcludeSelf bool
	// Window is part of the causal rule (causal Forward and the
	// decoders): a query always attends to the Window latest keys it may
	// see, itself included (default Bucket). Without the mask it is not
	// used.
	Window int
	// NonStrictCausal makes causal Forward sort every key into chunks as
	// without the mask (the paper's scheme, with the causal mask applied
	// inside the windows) instead of the causal rule. It is NOT
	// prefix-safe: no key after position t reaches the output at t, but
	// later keys take places in the chunks and change which earlier keys
	// a query sees, and the default bucket count depends on M, so outputs
	// at t change when later tokens or the length do. The decoders do not
	// follow it.
	NonStrictCausal bool
	// Seed seeds the random rotations (see the package documentation for
	// what is drawn and when).
	Seed uint64
}

// resolve checks cfg and fills in the defaults.
func (cfg Config) resolve() (Config, error) {
	check := func(name string, v, limit int) error {
		if v < 0 || v > limit {
			return fmt.Errorf("%w: reformer: %s = %d, want 0 (default) to %d", attn.ErrInput, name, v, limit)
		}
		return nil
	}
	for _, c := range []struct {
		name     string
		v, limit int
	}{
		{"Hashes", cfg.Hashes, MaxHashes},
		{"Bucket", cfg.Bucket, MaxBucket},
		{"Buckets", cfg.Buckets, MaxBuckets},
		{"Window", cfg.Window, MaxWindow},
	} {
		if err := check(c.name, c.v, c.limit); err != nil {
			return cfg, err
		}
	}
	if cfg.Hashes == 0 {
		cfg.Hashes = DefaultHashes
	}
	if cfg.Bucket == 0 {
		cfg.Bucket = DefaultBucket
	}
	if cfg.Window == 0 {
		cfg.Window = cfg.Bucket
	}
	if cfg.SharedQK {
		cfg.ExcludeSelf = true
	}
	return cfg, nil
}

// minFor returns the fallback length in effect: Min, or by default
// DefaultMin, DefaultMinCausal under the causal mask.
func (cfg Config) minFor(causal bool) int {
	switch {
	case cfg.Min != 0:
		return cfg.Min
	case causal:
		return DefaultMinCausal
	}
	return DefaultMin
}

// causalBuckets is the bucket count of the causal rule.
func (cfg Config) causalBuckets() int {
	if cfg.Buckets == 0 {
		return DefaultCausalBuckets
	}
	return cfg.Buckets
}

// checkRotation rejects rotations too large to allocate.
func checkRotation(rounds, d int, factors []int) error {
	cols := 0
	for _, f := range factors {
		cols += f / 2
	}
	if cols == 0 {
		return nil
	}
	ld := (rounds*cols + simd.Panel - 1) / simd.Panel * simd.Panel
	if d > MaxRotationFloats/ld {
		return fmt.Errorf("%w: reformer: rotations of D·Hashes·Σf/2 = %d·%d floats exceed %d; use fewer hashes or buckets",
			attn.ErrUnsupported, d, ld, MaxRotationFloats)
	}
	return nil
}

// LSH is Reformer's LSH attention. It implements attn.Mechanism under the
// name "reformer" and is safe for concurrent use.
type LSH struct {
	cfg   Config
	exact *flash.Kernel
}

// New returns Reformer attention with the settings of cfg. It fails with
// attn.ErrInput when a field is out of range.
func New(cfg Config) (*LSH, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	return &LSH{cfg: c, exact: flash.New(flash.Config{})}, nil
}

// Name returns "reformer".
func (*LSH) Name() string { return "reformer" }

// Config returns the settings in effect, defaults filled in, except Min
// and Buckets, which stay 0 when they were: their defaults depend on the
// causal mask (and Buckets' on M).
func (l *LSH) Config() Config { return l.cfg }

// maxIndex bounds M and the rows of a GQA group, which are stored as
// int32.
const maxIndex = math.MaxInt32

// Forward writes Reformer attention of q, k, v into out and, when lse is
// not nil, the log-sum-exp of the keys each query row used. See the
// package documentation for the algorithm and its options.
func (l *LSH) Forward(ctx context.Context, s attn.Shape, q, k, v []float32, o attn.Options, out, lse []float32) error {
	if err := attn.Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	rt, err := l.route(s, o)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	cfg := l.cfg
	if rt.exact && !cfg.ExcludeSelf {
		return l.exact.Forward(ctx, s, q, k, v, o, out, lse)
	}
	if cfg.SharedQK {
		k = normalizedRows(q, s.D)
	}
	if rt.causalRule {
		return l.causalForward(ctx, s, q, k, v, o, rt.factors, out, lse)
	}
	p := l.newPlan(s, o, q, k, v, rt)
	p.out, p.lse = out, lse
	return p.run(ctx)
}

// route is what a call of Forward or Backward computes, decided from the
// shape, the options and the Config before any work.
type route struct {
	exact      bool  // exact attention below Min
	causalRule bool  // the causal rule rather than sorted chunks
	factors    []int // of the bucket count; none when exact
}

// route checks what Check does not (shared QK's shape, the index range,
// the size of the rotations) and decides how a call of shape s runs.
func (l *LSH) route(s attn.Shape, o attn.Options) (route, error) {
	cfg := l.cfg
	if cfg.SharedQK && (s.N != s.M || s.H != s.HKV) {
		return route{}, fmt.Errorf("%w: reformer: shared QK needs N == M and H == Hkv, got N = %d, M = %d, H = %d, Hkv = %d",
			attn.ErrUnsupported, s.N, s.M, s.H, s.HKV)
	}
	if s.M > maxIndex || s.Group()*s.N > maxIndex {
		return route{}, fmt.Errorf("%w: reformer: M = %d or H/Hkv·N = %d exceeds 2^31-1", attn.ErrUnsupported, s.M, s.Group()*s.N)
	}
	rt := route{exact: l.falls(s, o)}
	rt.causalRule = o.Causal && !cfg.NonStrictCausal && !rt.exact
	switch {
	case rt.causalRule:
		rt.factors = bucketFactors(cfg.causalBuckets())
	case !rt.exact:
		t := cfg.Buckets
		if t == 0 {
			t = (s.M + cfg.Bucket - 1) / cfg.Bucket
		}
		rt.factors = bucketFactors(t)
	}
	if err := checkRotation(cfg.Hashes, s.D, rt.factors); err != nil {
		return route{}, err
	}
	return rt, nil
}

// newPlan sets up the sorted chunks of a call that does not follow the
// causal rule; out and lse are left for the caller to set.
func (l *LSH) newPlan(s attn.Shape, o attn.Options, q, k, v []float32, rt route) *plan {
	cfg := l.cfg
	rounds, bucket := cfg.Hashes, cfg.Bucket
	if rt.exact {
		// Exact attention under the self rule: one round, one chunk
		// holding every key.
		rounds, bucket = 1, s.M
	}
	p := &plan{
		s: s, o: o, q: q, k: k, v: v,
		scale:       o.ScaleFor(s.D),
		rounds:      rounds,
		bucket:      bucket,
		excludeSelf: cfg.ExcludeSelf,
		sharedQK:    cfg.SharedQK,
		hs:          newHasher(cfg.Seed, rounds, s.D, rt.factors),
	}
	p.logStep = make([]float32, p.rounds)
	for n := range p.logStep {
		p.logStep[n] = float32(math.Log(float64(n+2)) - math.Log(float64(n+1)))
	}
	return p
}

// falls reports whether Forward computes exact attention for shape s
// under o.
func (l *LSH) falls(s attn.Shape, o attn.Options) bool {
	below := l.cfg.minFor(o.Causal)
	return below > 0 && (s.N < below || s.M < below)
}

// Fallback implements attn.Fallbacker: it returns why Forward computes
// exact attention (without each query's own key under the self rule)
// instead of LSH attention for a call of shape s under o, or "" when it
// does not. Forward falls back when N or M is below Config.Min.
func (l *LSH) Fallback(s attn.Shape, o attn.Options) string {
	if !l.falls(s, o) {
		return ""
	}
	what := "exact attention"
	if l.cfg.ExcludeSelf {
		what = "exact attention without each query's own key"
	}
	mask := "without the causal mask"
	if o.Causal {
		mask = "under the causal mask"
	}
	if l.cfg.Min == 0 {
		mask += ", the default"
	}
	below := l.cfg.minFor(o.Causal)
	var short string
	switch {
	case s.N < below && s.M < below:
		short = fmt.Sprintf("N = %d and M = %d are", s.N, s.M)
	case s.N < below:
		short = fmt.Sprintf("N = %d is", s.N)
	default:
		short = fmt.Sprintf("M = %d is", s.M)
	}
	return fmt.Sprintf("reformer: %s below min = %d (%s): %s", short, below, mask, what)
}

// normalizedRows returns the rows of x (each d long) scaled to unit length;
// a zero row stays zero.
func normalizedRows(x []float32, d int) []float32 {
	y := make([]float32, len(x))
	for i := 0; i < len(x); i += d {
		normalizeRow(y[i:i+d], x[i:i+d])
	}
	return y
}

// plan is one Forward call's state.
type plan struct {
	s                 attn.Shape
	o                 attn.Options
	q, k, v, out, lse []float32
	scale             float32
	rounds, bucket    int
	excludeSelf       bool
	sharedQK          bool
	hs                *hasher
	logStep           []float32 // log(n+2) - log(n+1) for n in [0, rounds-1)
}

// headPlan holds the hashing and sorting of one (batch row, kv head): its
// keys, and the queries of every query head of the group.
type headPlan struct {
	b, kvh int
	keys   int // valid keys, sorted: positions [0, keys)
	chunks int // ceil(keys / bucket)
	// Per round r, of lengths keys, chunks+1 and g·N:
	perm   [][]int32 // key positions in (bucket, position) order
	qStart [][]int32 // queries of chunk c: qOrder[r][qStart[r][c]:qStart[r][c+1]]
	qOrder [][]int32 // group rows hl·N+i sorted by chunk
	// The chunk of every key and query in every round, for duplicate
	// counting: keyChunk[j·rounds+r], queryChunk[row·rounds+r].
	keyChunk   []int32
	queryChunk []int32
}

func (p *plan) run(ctx context.Context) error {
	s := p.s
	if p.lse == nil {
		p.lse = make([]float32, s.LSELen())
	}
	procs := runtime.GOMAXPROCS(0)
	heads := s.B * s.HKV
	maxChunks := (s.M + p.bucket - 1) / p.bucket
	newWorker := func() *worker {
		return &worker{
			proj: p.hs.scratch(),
			tile: newTile(tileRows, s.D, p.keyTile(), p.rounds, maxChunks),
		}
	}
	var err error
	if workers := p.o.WorkerCount(procs, heads); heads%workers == 0 || heads >= 4*workers {
		// Enough (batch row, kv head) pairs to share out evenly: each
		// task does one from hashing to the last round, so its Q, K, V
		// and output rows stay in cache across the rounds, and no task
		// waits for another.
		err = parallel.For(ctx, workers, heads, newWorker, func(w *worker, i int) error {
			var hp headPlan
			p.initRows(i/s.HKV, i%s.HKV)
			p.prepare(&hp, i/s.HKV, i%s.HKV, w.proj)
			for r := range p.rounds {
				for c0 := 0; c0 < hp.chunks && ctx.Err() == nil; c0 += chunkRun {
					p.chunks(w.tile, &hp, r, c0, min(c0+chunkRun, hp.chunks))
				}
			}
			return nil
		})
	} else {
		err = p.runByRound(ctx, procs, newWorker)
	}
	if err != nil {
		return err
	}
	if p.excludeSelf {
		p.selfFallback()
	}
	return nil
}

// worker is one goroutine's scratch.
type worker struct {
	proj []float32
	tile *tile
}

// runByRound shares out work when there are few (batch row, kv head)
// pairs: first it hashes and sorts all of them, then runs one round at a
// time (rounds merge into the same output rows), with runs of consecutive
// chunks of every head in parallel.
func (p *plan) runByRound(ctx context.Context, procs int, newWorker func() *worker) error {
	s := p.s
	heads := make([]headPlan, s.B*s.HKV)
	err := parallel.For(ctx, p.o.WorkerCount(procs, len(heads)), len(heads), newWorker, func(w *worker, i int) error {
		p.initRows(i/s.HKV, i%s.HKV)
		p.prepare(&heads[i], i/s.HKV, i%s.HKV, w.proj)
		return nil
	})
	if err != nil {
		return err
	}
	runStart := make([]int, len(heads)+1)
	for i := range heads {
		runStart[i+1] = runStart[i] + (heads[i].chunks+chunkRun-1)/chunkRun
	}
	tasks := runStart[len(heads)]
	workers := p.o.WorkerCount(procs, tasks)
	ws := make([]*worker, workers)
	for i := range ws {
		ws[i] = newWorker()
	}
	for r := range p.rounds {
		var next atomic.Int64
		err := parallel.For(ctx, workers, tasks, func() *worker { return ws[next.Add(1)-1] }, func(w *worker, i int) error {
			h := sort.SearchInts(runStart, i+1) - 1 // runStart[h] <= i < runStart[h+1]
			hp := &heads[h]
			c0 := (i - runStart[h]) * chunkRun
			p.chunks(w.tile, hp, r, c0, min(c0+chunkRun, hp.chunks))
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// chunkRun is the number of consecutive chunks one task attends.
const chunkRun = 8

// maxKeyTile bounds the keys of one matrix product.
const maxKeyTile = 256

// keyTile is the number of keys per matrix product: a whole window of two
// chunks when it fits in maxKeyTile, else maxKeyTile.
func (p *plan) keyTile() int {
	return min((2*p.bucket+simd.Panel-1)/simd.Panel*simd.Panel, maxKeyTile)
}

// slidingWindow reports whether a whole window fits one key tile, so that
// consecutive chunks can share their gathered keys.
func (p *plan) slidingWindow() bool { return 2*p.bucket <= maxKeyTile }

// initRows sets the output rows of batch row b, kv head kvh (every query
// head of its group) to the empty result: 0 and lse -Inf.
func (p *plan) initRows(b, kvh int) {
	s, g := p.s, p.s.Group()
	for hl := range g {
		row := (b*s.H + kvh*g + hl) * s.N
		clear(p.out[row*s.D : (row+s.N)*s.D])
		for i := range s.N {
			p.lse[row+i] = negInf
		}
	}
}

// prepare hashes and sorts the keys and queries of batch row b, kv head
// kvh. It writes nothing but hp.
func (p *plan) prepare(hp *headPlan, b, kvh int, proj []float32) {
	s, R := p.s, p.rounds
	g := s.Group()
	nq := g * s.N
	hp.b, hp.kvh = b, kvh
	hp.keys = p.o.KeyEnd(s, b)
	hp.chunks = (hp.keys + p.bucket - 1) / p.bucket
	if hp.keys == 0 {
		return
	}

	// Buckets of keys and queries in every round.
	keyBucket := make([]int32, hp.keys*R)
	p.hs.hash(p.k[(b*s.HKV+kvh)*s.M*s.D:], hp.keys, s.D, proj, keyBucket)
	queryBucket := make([]int32, nq*R)
	if p.sharedQK {
		// A query hashes exactly as its own key (g == 1, N == M): copying
		// rules out a rounding difference between q and q/|q|. Queries
		// past the valid keys are hashed too.
		copy(queryBucket, keyBucket)
		p.hs.hash(p.k[((b*s.HKV+kvh)*s.M+hp.keys)*s.D:], s.N-hp.keys, s.D, proj, queryBucket[hp.keys*R:])
	} else {
		for hl := range g {
			p.hs.hash(p.q[(b*s.H+kvh*g+hl)*s.N*s.D:], s.N, s.D, proj, queryBucket[hl*s.N*R:(hl+1)*s.N*R])
		}
	}

	nb := p.hs.buckets
	hp.perm = make([][]int32, R)
	hp.qStart = make([][]int32, R)
	hp.qOrder = make([][]int32, R)
	hp.keyChunk = make([]int32, hp.keys*R)
	hp.queryChunk = make([]int32, nq*R)
	bucketStart := make([]int32, nb+1)
	qChunk := make([]int32, nq)
	shift := s.M - s.N // absolute position of query 0
	for r := range R {
		// Counting sort of the keys by bucket; positions ascend within a
		// bucket because keys are visited in order.
		clear(bucketStart)
		for j := range hp.keys {
			bucketStart[keyBucket[j*R+r]+1]++
		}
		for i := range nb {
			bucketStart[i+1] += bucketStart[i]
		}
		perm := make([]int32, hp.keys)
		fill := make([]int32, nb)
		copy(fill, bucketStart[:nb])
		for j := range hp.keys {
			bk := keyBucket[j*R+r]
			perm[fill[bk]] = int32(j)
			hp.keyChunk[j*R+r] = fill[bk] / int32(p.bucket)
			fill[bk]++
		}
		hp.perm[r] = perm

		// A query goes where it would sort among the keys, by (bucket,
		// position): its chunk holds the keys just after it, the previous
		// chunk the keys just before. Under shared QK that is its own
		// key's place, as in the paper.
		last := int32(hp.chunks - 1)
		qs := make([]int32, hp.chunks+1)
		for row := range nq {
			bq := queryBucket[row*R+r]
			pos := int32(shift + row%s.N)
			lo, hi := bucketStart[bq], bucketStart[bq+1]
			for lo < hi { // first key in the bucket at or after pos
				mid := int32(uint32(lo+hi) >> 1)
				if perm[mid] < pos {
					lo = mid + 1
				} else {
					hi = mid
				}
			}
			c := min(lo/int32(p.bucket), last)
			qChunk[row] = c
			hp.queryChunk[row*R+r] = c
			qs[c+1]++
		}
		for c := range hp.chunks {
			qs[c+1] += qs[c]
		}
		order := make([]int32, nq)
		qfill := make([]int32, hp.chunks)
		copy(qfill, qs[:hp.chunks])
		for row := range nq {
			c := qChunk[row]
			order[qfill[c]] = int32(row)
			qfill[c]++
		}
		hp.qStart[r], hp.qOrder[r] = qs, order
	}
}

// chunks attends, in round r, the queries of chunks [c0, c1) of hp to the
// keys of their windows (their chunk and the one before) and merges the
// results into their output rows.
func (p *plan) chunks(t *tile, hp *headPlan, r, c0, c1 int) {
	s := p.s
	kBase := p.k[(hp.b*s.HKV+hp.kvh)*s.M*s.D:][:s.M*s.D]
	vBase := p.v[(hp.b*s.HKV+hp.kvh)*s.M*s.D:][:s.M*s.D]
	block := func(c int) []int32 { // the keys of chunk c, sorted
		return hp.perm[r][c*p.bucket : min((c+1)*p.bucket, hp.keys)]
	}
	sliding := p.slidingWindow()
	t.nk = 0
	if sliding && c0 > 0 {
		t.appendKeys(hp, block(c0-1), kBase, vBase)
	}
	for c := c0; c < c1; c++ {
		if sliding {
			// The window slides by one chunk: keep chunk c-1, add c.
			keep := 0
			if c > 0 {
				keep = len(block(c - 1))
			}
			t.dropFront(t.nk - keep)
			t.appendKeys(hp, block(c), kBase, vBase)
		}
		keys := hp.perm[r][max(c-1, 0)*p.bucket : min((c+1)*p.bucket, hp.keys)]
		rows := hp.qOrder[r][hp.qStart[r][c]:hp.qStart[r][c+1]]
		// Equal tiles rather than full ones and a remainder.
		ntiles := (len(rows) + t.capRows - 1) / t.capRows
		for ti := range ntiles {
			maxPos := p.loadRows(t, hp, rows[ti*len(rows)/ntiles:(ti+1)*len(rows)/ntiles])
			t.reset()
			if sliding {
				t.attend(p, r, maxPos)
			} else {
				for k0 := 0; k0 < len(keys); k0 += t.bk {
					t.nk = 0
					t.appendKeys(hp, keys[k0:min(k0+t.bk, len(keys))], kBase, vBase)
					t.attend(p, r, maxPos)
				}
			}
			for x := range t.rows {
				l, ok := t.finish(x)
				if !ok {
					continue
				}
				grow := t.orow[x]
				if r == 0 {
					// A row is in one chunk per round: in the first
					// round nothing is there to merge with.
					copy(p.out[grow*s.D:][:s.D], t.res)
					p.lse[grow] = l
				} else {
					attn.MergeRow(p.out[grow*s.D:][:s.D], &p.lse[grow], t.res, l)
				}
			}
		}
	}
}

// loadRows gathers the scaled queries of the group rows into t and returns
// the largest query position.
func (p *plan) loadRows(t *tile, hp *headPlan, rows []int32) (maxPos int) {
	s := p.s
	g := s.Group()
	shift := s.M - s.N
	t.rows = len(rows)
	maxPos = math.MinInt32
	for x, gr := range rows {
		hl, i := int(gr)/s.N, int(gr)%s.N
		grow := (hp.b*s.H+hp.kvh*g+hl)*s.N + i
		t.orow[x] = grow
		t.qpos[x] = int32(shift + i)
		maxPos = max(maxPos, shift+i)
		dst := t.q[x*s.D:][:s.D]
		for c, v := range p.q[grow*s.D:][:s.D] {
			dst[c] = v * p.scale
		}
		copy(t.qc[x*p.rounds:][:p.rounds], hp.queryChunk[int(gr)*p.rounds:][:p.rounds])
	}
	return maxPos
}

// selfFallback gives every row that saw no key but its own (excluded) one
// that key: output v_self and lse the self logit, as the paper's self
// rule does.
func (p *plan) selfFallback() {
	s := p.s
	for b := range s.B {
		end := p.o.KeyEnd(s, b)
		for h := range s.H {
			kvh := h / s.Group()
			for i := range s.N {
				row := (b*s.H+h)*s.N + i
				pos := s.M - s.N + i
				if !math.IsInf(float64(p.lse[row]), -1) || pos < 0 || pos >= end {
					continue
				}
				kv := ((b*s.HKV+kvh)*s.M + pos) * s.D
				var dot float32
				for c, x := range p.q[row*s.D : (row+1)*s.D] {
					dot += x * p.k[kv+c]
				}
				p.lse[row] = dot * p.scale
				copy(p.out[row*s.D:(row+1)*s.D], p.v[kv:kv+s.D])
			}
		}
	}
}
