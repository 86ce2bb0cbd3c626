package reformer

import (
	"context"
	"math"
	"runtime"
	"sort"
	"sync/atomic"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

var _ attn.Differentiable = (*LSH)(nil)

// Backward implements attn.Differentiable: given the inputs, out and lse
// of a Forward call with the same shape and options and dout, the
// gradient of a loss with respect to out, it writes the gradients with
// respect to q, k and v into dq, dk and dv (overwritten, never read; they
// must not overlap the inputs).
//
// Every form of Forward is softmax attention of each query over a set of
// keys that the hashing chose, each key once: the causal rule's union by
// construction, and the sorted chunks' rounds too, because a pair in the
// windows of c rounds has log c off its logit in each and the merge by
// log-sum-exp adds the rounds' exponentials (Σ_r Σ_{j∈W_r} e^{s_j − log
// c_j} = Σ_{j∈∪W_r} e^{s_j}): no key weighs by the number of rounds that
// saw it, and the merge weights, softmax over the rounds' lse, are that
// union softmax split by round. Backward differentiates that attention
// with the hash choices held fixed (recomputed from Config.Seed exactly
// as Forward draws them; buckets are argmaxes, with no gradient, as in
// the reference implementations):
//
//	P = exp(S − lse),  dV = Pᵀ·dO,  dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)),
//	dQ = scale·dS·K,  dK = scale·dSᵀ·Q
//
// over each query's chosen keys, with lse and O those Forward wrote. A
// query that fell back on its own key under the self rule gets dv of that
// key += dout and no dq (its output is that value whatever the logits);
// one that saw nothing gets 0. Keys past Options.KVLen and keys no query
// chose get dk and dv 0; GQA query heads sum into their kv head. Below
// Config.Min the gradients are those of the exact attention Forward
// computed (package flash's Backward, or its self-rule form here).
//
// With SharedQK the keys are the queries normalised, k_j = q_j/|q_j|, so
// dq also gets each position's key gradient carried back through the
// normalisation, (dk_j − (dk_j·k_j)·k_j)/|q_j| (0 for a zero query), and
// dk is 0: Forward never reads k.
//
// # Cost
//
// Without the causal rule the chunks are revisited round by round: per
// chunk and window, five matrix products the size of Forward's two (S,
// dP, dV, dK, dQ) and one exp per pair, so about 2.5 times Forward's
// attention plus the same hashing and sorting. Work is shared out by runs
// of chunks of every (batch row, kv head), one round at a time: each run
// owns the keys of its chunks and keeps what its first chunk adds to the
// chunk before in a spill that is added after the round, so that no two
// tasks write one row and every sum is taken in an order fixed by the
// shape. Extra memory is that of Forward plus O(Bucket·D) per run of
// chunks.
//
// Under the causal rule the pairs are split by where the rule takes each
// key first: the query's window, else the first round whose band (the
// 2·Bucket latest visible keys of its bucket) holds it. The window's
// pairs are a band of positions, package flash's Backward with that
// pattern; round r's are a band in the round's (bucket, position) order,
// so the rows sorted by the end of their bands make tiles whose keys are
// contiguous in it, computed with the same five products as the sorted
// chunks, less the pairs of the window and of earlier rounds (a check per
// earlier round and pair). Rows are shared out in runs of 1024 per round,
// each owning the keys from the end of the previous run's bands on and
// spilling the 2·Bucket before into a buffer added after the round. A
// query's pairs computed are the keys Forward reads for it plus the
// edges of its tiles, but with matrix products where Forward goes row by
// row, and the key gradients are added once per tile. Extra memory is
// O(Hashes·(H/Hkv·N + M)) indices per (batch row, kv head), flash's, and
// per run O(Bucket·D).
//
// The results do not depend on Options.Workers. Errors are those of
// Forward and of attn.CheckBackward (a nil lse, wrong lengths of dout,
// dq, dk, dv); a cancelled ctx stops the pass and returns its error, the
// outputs then being partly written.
func (l *LSH) Backward(ctx context.Context, s attn.Shape, q, k, v, out, lse, dout []float32, o attn.Options, dq, dk, dv []float32) error {
	if err := attn.CheckBackward(s, q, k, v, out, lse, dout, dq, dk, dv, o); err != nil {
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
		return l.exact.Backward(ctx, s, q, k, v, out, lse, dout, o, nil, dq, dk, dv)
	}
	kk := k
	if cfg.SharedQK {
		kk = normalizedRows(q, s.D)
	}
	if rt.causalRule {
		err = l.causalBackward(ctx, s, q, kk, v, out, lse, dout, o, rt.factors, dq, dk, dv)
	} else {
		p := l.newPlan(s, o, q, kk, v, rt)
		p.out, p.lse = out, lse
		g := &gradPlan{plan: p, dout: dout, dq: dq, dk: dk, dv: dv}
		err = g.run(ctx)
	}
	if err != nil {
		return err
	}
	if cfg.SharedQK {
		return foldShared(ctx, s, o, q, kk, dq, dk)
	}
	return nil
}

// foldShared adds to dq the gradient dk of the normalised queries kn
// (keys under shared QK) carried back through kn = q/|q|, and clears dk.
func foldShared(ctx context.Context, s attn.Shape, o attn.Options, q, kn, dq, dk []float32) error {
	d := s.D
	rows := s.B * s.H
	err := parallel.For(ctx, o.WorkerCount(runtime.GOMAXPROCS(0), rows), rows, func() struct{} { return struct{}{} },
		func(_ struct{}, bh int) error {
			for i := range s.N {
				off := (bh*s.N + i) * d
				qi, ki, gk, gq := q[off:][:d], kn[off:][:d], dk[off:][:d], dq[off:][:d]
				var ss float64
				for _, x := range qi {
					ss += float64(x) * float64(x)
				}
				if ss == 0 {
					continue // kn = 0 whatever q near 0 is: no gradient
				}
				inv := float32(1 / math.Sqrt(ss))
				dot := simd.Dot(gk, ki)
				for c := range gq {
					gq[c] += inv * (gk[c] - dot*ki[c])
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	clear(dk)
	return nil
}

// gradPlan is the state of one Backward call by sorted chunks: the
// forward's plan (its out and lse those of the forward call, read only)
// and the gradients.
type gradPlan struct {
	*plan
	dout, dq, dk, dv []float32
	// seen, under the self rule, says of every query row whether some
	// round gave it a key other than its own; a row that got none fell
	// back on its own key.
	seen []bool
}

// gradTile is one worker's scratch for the backward pass of one window:
// the forward's tile (keys transposed in kt, their positions and chunks,
// the rows' positions, chunks and output rows, the duplicate counts; s
// holds the logits, then P) and the backward's operands and results.
type gradTile struct {
	*tile
	maxPos   int
	vt       []float32 // [d][bk]: the keys' values transposed
	kp       []float32 // [bk][dp]: the keys, zero past column d
	qp, gp   []float32 // [rows][dp]: scale·Q and dO, zero past column d
	lse, del []float32 // [rows]: each row's lse and rowsum(dO ∘ O)
	ds       []float32 // [rows][bk]: dP, then dS
	pt, dst  []float32 // [bk][capRows]: Pᵀ and dSᵀ
	dqt      []float32 // [rows][dp]: the tile's unscaled dQ
	dkw, dvw []float32 // [bk][dp]: the keys' dK and dV over the window's rows
	qhi      []int32   // [rows][rounds]: under the causal rule, the ends of the rows' bands
}

func newGradTile(rows, d, bk, rounds, chunks int) *gradTile {
	t := newTile(rows, d, bk, rounds, chunks)
	dp := t.dp
	return &gradTile{
		tile: t,
		vt:   make([]float32, d*bk),
		kp:   make([]float32, bk*dp),
		qp:   make([]float32, rows*dp),
		gp:   make([]float32, rows*dp),
		lse:  make([]float32, rows),
		del:  make([]float32, rows),
		ds:   make([]float32, rows*bk),
		pt:   make([]float32, bk*rows),
		dst:  make([]float32, bk*rows),
		dqt:  make([]float32, rows*dp),
		dkw:  make([]float32, bk*dp),
		dvw:  make([]float32, bk*dp),
		qhi:  make([]int32, rows*rounds),
	}
}

func (g *gradPlan) run(ctx context.Context) error {
	p, s := g.plan, g.s
	procs := runtime.GOMAXPROCS(0)
	heads := make([]headPlan, s.B*s.HKV)
	err := parallel.For(ctx, p.o.WorkerCount(procs, len(heads)), len(heads), p.hs.scratch, func(proj []float32, i int) error {
		p.prepare(&heads[i], i/s.HKV, i%s.HKV, proj)
		return nil
	})
	if err != nil {
		return err
	}
	clear(g.dq)
	clear(g.dk)
	clear(g.dv)
	if p.excludeSelf {
		g.seen = make([]bool, s.LSELen())
	}

	// Tasks are runs of chunkRun chunks of every head, as in runByRound;
	// the runs after a head's first spill into the chunk before them.
	runStart := make([]int, len(heads)+1)
	spillStart := make([]int, len(heads)+1)
	for i := range heads {
		runs := (heads[i].chunks + chunkRun - 1) / chunkRun
		runStart[i+1] = runStart[i] + runs
		spillStart[i+1] = spillStart[i] + max(runs-1, 0)
	}
	tasks := runStart[len(heads)]
	if tasks == 0 {
		return nil
	}
	sz := p.bucket * s.D
	spill := make([]float32, 2*sz*spillStart[len(heads)])
	spillOf := func(h, run int) (dk, dv []float32) {
		if run == 0 {
			return nil, nil
		}
		x := 2 * sz * (spillStart[h] + run - 1)
		return spill[x:][:sz], spill[x+sz:][:sz]
	}
	workers := p.o.WorkerCount(procs, tasks)
	ws := make([]*gradTile, workers)
	maxChunks := (s.M + p.bucket - 1) / p.bucket
	for i := range ws {
		ws[i] = newGradTile(tileRows, s.D, p.keyTile(), p.rounds, maxChunks)
	}
	none := func() struct{} { return struct{}{} }
	for r := range p.rounds {
		var next atomic.Int64
		err := parallel.For(ctx, workers, tasks, func() *gradTile { return ws[next.Add(1)-1] }, func(w *gradTile, i int) error {
			h := sort.SearchInts(runStart, i+1) - 1 // runStart[h] <= i < runStart[h+1]
			run := i - runStart[h]
			c0 := run * chunkRun
			sk, sv := spillOf(h, run)
			g.chunks(w, &heads[h], r, c0, min(c0+chunkRun, heads[h].chunks), sk, sv)
			return nil
		})
		if err != nil {
			return err
		}
		// Each spill goes to the keys of the chunk before its run, which
		// no other spill touches.
		err = parallel.For(ctx, workers, tasks, none, func(_ struct{}, i int) error {
			h := sort.SearchInts(runStart, i+1) - 1
			run := i - runStart[h]
			if run == 0 {
				return nil
			}
			sk, sv := spillOf(h, run)
			hp := &heads[h]
			base := (hp.b*s.HKV + hp.kvh) * s.M
			first := (run*chunkRun - 1) * p.bucket // the chunk before the run
			for x, pos := range hp.perm[r][first : first+p.bucket] {
				row := (base + int(pos)) * s.D
				simd.Axpy(1, sk[x*s.D:][:s.D], g.dk[row:][:s.D])
				simd.Axpy(1, sv[x*s.D:][:s.D], g.dv[row:][:s.D])
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	pairs := s.B * s.HKV
	return parallel.For(ctx, p.o.WorkerCount(procs, pairs), pairs, none, func(_ struct{}, i int) error {
		g.finish(i/s.HKV, i%s.HKV)
		return nil
	})
}

// finish scales the dQ rows of batch row b, kv head kvh, and, under the
// self rule, gives the value of each row that fell back on its own key
// that row's dout.
func (g *gradPlan) finish(b, kvh int) {
	s, d := g.s, g.s.D
	end := g.o.KeyEnd(s, b)
	gs := s.Group()
	for hl := range gs {
		for i := range s.N {
			row := (b*s.H+kvh*gs+hl)*s.N + i
			simd.Scale(g.dq[row*d:][:d], g.scale)
			pos := s.M - s.N + i
			if g.seen == nil || g.seen[row] || pos < 0 || pos >= end {
				continue
			}
			simd.Axpy(1, g.dout[row*d:][:d], g.dv[((b*s.HKV+kvh)*s.M+pos)*d:][:d])
		}
	}
}

// chunks folds, in round r, the queries of chunks [c0, c1) of hp and the
// keys of their windows into dq (unscaled), dk and dv: straight into the
// rows of the run's own keys, and for the keys of chunk c0-1 into spillK
// and spillV (nil when c0 is 0), Bucket rows of D floats in sorted order.
func (g *gradPlan) chunks(w *gradTile, hp *headPlan, r, c0, c1 int, spillK, spillV []float32) {
	s, d, dp := g.s, g.s.D, w.dp
	base := (hp.b*s.HKV + hp.kvh) * s.M * d
	kBase, vBase := g.k[base:][:s.M*d], g.v[base:][:s.M*d]
	dkBase, dvBase := g.dk[base:][:s.M*d], g.dv[base:][:s.M*d]
	clear(spillK)
	clear(spillV)
	for c := c0; c < c1; c++ {
		w0 := max(c-1, 0) * g.bucket
		keys := hp.perm[r][w0:min((c+1)*g.bucket, hp.keys)]
		rows := hp.qOrder[r][hp.qStart[r][c]:hp.qStart[r][c+1]]
		if len(rows) == 0 {
			continue
		}
		ntiles := (len(rows) + w.capRows - 1) / w.capRows
		for k0 := 0; k0 < len(keys); k0 += w.bk {
			kt := keys[k0:min(k0+w.bk, len(keys))]
			w.loadKeys(kt, kBase, vBase)
			w.keyIDs(hp, kt, 0)
			added := false
			for ti := range ntiles {
				if ntiles > 1 || k0 == 0 {
					g.loadRows(w, hp, rows[ti*len(rows)/ntiles:(ti+1)*len(rows)/ntiles])
				}
				added = g.step(w, r) || added
			}
			if !added {
				continue
			}
			for j, pos := range kt {
				dk, dv := dkBase[int(pos)*d:][:d], dvBase[int(pos)*d:][:d]
				if si := w0 + k0 + j; si < c0*g.bucket {
					x := si - (c0-1)*g.bucket
					dk, dv = spillK[x*d:][:d], spillV[x*d:][:d]
				}
				simd.Axpy(1, w.dkw[j*dp:][:d], dk)
				simd.Axpy(1, w.dvw[j*dp:][:d], dv)
			}
		}
	}
}

// loadRows gathers the group rows' scaled queries, output gradients, lse
// and rowsum(dO ∘ O) into w, with their positions and chunks.
func (g *gradPlan) loadRows(w *gradTile, hp *headPlan, rows []int32) {
	s, R := g.s, g.rounds
	gs := s.Group()
	w.rows = len(rows)
	w.maxPos = math.MinInt32
	for x, gr := range rows {
		hl, i := int(gr)/s.N, int(gr)%s.N
		w.loadRow(x, (hp.b*s.H+hp.kvh*gs+hl)*s.N+i, s.M-s.N+i, g.q, g.dout, g.out, g.lse, g.scale)
		copy(w.qc[x*R:][:R], hp.queryChunk[int(gr)*R:][:R])
	}
}

// step folds the w.nk keys of the tile into the gradients of its rows, for
// round r: their dQ (unscaled) into g.dq, their dK and dV into w.dkw and
// w.dvw. It reports false when the causal mask hides every key from every
// row, having done nothing.
//
// The probabilities are those of the forward's round r, e^{s − log c −
// lse} with lse the merged one, so that summed over the rounds each
// chosen key's probability is its union softmax weight.
func (g *gradPlan) step(w *gradTile, r int) bool {
	nk := w.nk
	causal, excl := g.o.Causal, g.excludeSelf
	kpos := w.kpos[:nk]
	minKey, maxKey := int32(math.MaxInt32), int32(-1)
	for _, pos := range kpos {
		minKey, maxKey = min(minKey, pos), max(maxKey, pos)
	}
	if causal && int(minKey) > w.maxPos {
		return false
	}
	w.products()
	if g.rounds > 1 {
		w.duplicates(g.logStep, r, nk)
	}
	for x := range w.rows {
		sr := w.s[x*w.bk:][:nk]
		qp := w.qpos[x]
		vis := nk
		if (causal && maxKey > qp) || excl {
			vis = 0
			for j, kp := range kpos {
				if (causal && kp > qp) || (excl && kp == qp) {
					sr[j] = negInf
				} else {
					vis++
				}
			}
		}
		if vis > 0 && g.seen != nil {
			g.seen[w.orow[x]] = true
		}
	}
	w.fold(g.dq, 1)
	return true
}

// products writes the logits S = (scale·Q)·Kᵀ of the tile's rows and keys
// to w.s and dP = dO·Vᵀ to w.ds.
func (w *gradTile) products() {
	np := (w.nk + simd.Panel - 1) / simd.Panel * simd.Panel
	simd.Gemm(w.rows, np, w.d, w.qp, w.dp, w.kt, w.bk, w.s, w.bk, false)
	simd.Gemm(w.rows, np, w.d, w.gp, w.dp, w.vt, w.bk, w.ds, w.bk, false)
}

// fold turns the logits in w.s, -Inf where a pair is not the tile's, and
// dP in w.ds into P = exp(S − lse) and dS = P ∘ (dP − rowsum(dO ∘ O)),
// adds Pᵀ·dO to w.dvw and dSᵀ·(scale·Q) to w.dkw, and adds dqScale·dS·K
// to the rows' dq.
func (w *gradTile) fold(dq []float32, dqScale float32) {
	nk, rows, d, dp, bk, cr := w.nk, w.rows, w.d, w.dp, w.bk, w.capRows
	posInf := float32(math.Inf(1))
	for x := range rows {
		sr, dr := w.s[x*bk:][:nk], w.ds[x*bk:][:nk]
		l, dl := w.lse[x], w.del[x]
		if l == negInf {
			l = posInf // the row saw no key: every P is 0
		}
		for j := range sr {
			sr[j] -= l
			dr[j] -= dl
		}
		simd.ExpMul(sr, dr)
		for j := range nk {
			w.pt[j*cr+x] = sr[j]
			w.dst[j*cr+x] = dr[j]
		}
	}
	simd.Gemm(nk, dp, rows, w.pt, cr, w.gp, dp, w.dvw, dp, true)
	simd.Gemm(nk, dp, rows, w.dst, cr, w.qp, dp, w.dkw, dp, true)
	simd.Gemm(rows, dp, nk, w.ds, bk, w.kp, dp, w.dqt, dp, false)
	for x := range rows {
		simd.Axpy(dqScale, w.dqt[x*dp:][:d], dq[w.orow[x]*d:][:d])
	}
}

// loadKeys gathers the keys and values at positions keys (of the kv head
// whose rows kBase and vBase are) into the tile and clears their dK and
// dV.
func (w *gradTile) loadKeys(keys []int32, kBase, vBase []float32) {
	d, dp := w.d, w.dp
	gatherKV(w.kt, w.bk, w.kp, dp, kBase, kBase, d, keys)
	gatherKV(w.vt, w.bk, w.vp, dp, vBase, vBase, d, keys)
	copy(w.kpos, keys)
	w.nk = len(keys)
	clear(w.dkw[:w.nk*dp])
	clear(w.dvw[:w.nk*dp])
}

// loadRow gathers query row grow (an index into q, dout, out and lse) at
// position pos into place x of the tile.
func (w *gradTile) loadRow(x, grow, pos int, q, dout, out, lse []float32, scale float32) {
	d, dp := w.d, w.dp
	w.orow[x] = grow
	w.qpos[x] = int32(pos)
	w.maxPos = max(w.maxPos, pos)
	qd := w.qp[x*dp:][:d]
	for c, v := range q[grow*d:][:d] {
		qd[c] = v * scale
	}
	gi := dout[grow*d:][:d]
	copy(w.gp[x*dp:][:d], gi)
	w.lse[x] = lse[grow]
	w.del[x] = simd.Dot(gi, out[grow*d:][:d])
}
