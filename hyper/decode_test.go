package hyper

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// history keeps every real position a decoder was given, per sequence and
// head, for the reference.
type history struct {
	cfg     attn.DecodeConfig
	q, k, v [][][]float32 // q [B][H], k and v [B][Hkv]: rows [positions][D]
}

func newHistory(cfg attn.DecodeConfig) *history {
	hs := &history{cfg: cfg}
	for range cfg.B {
		hs.q = append(hs.q, make([][]float32, cfg.H))
		hs.k = append(hs.k, make([][]float32, cfg.HKV))
		hs.v = append(hs.v, make([][]float32, cfg.HKV))
	}
	return hs
}

func (hs *history) add(q, k, v []float32, n int, valid []int) {
	c, d := hs.cfg, hs.cfg.D
	for b := range c.B {
		nb := n
		if valid != nil {
			nb = valid[b]
		}
		for h := range c.H {
			row := (b*c.H + h) * n
			hs.q[b][h] = append(hs.q[b][h], q[row*d:(row+nb)*d]...)
		}
		for kvh := range c.HKV {
			row := (b*c.HKV + kvh) * n
			hs.k[b][kvh] = append(hs.k[b][kvh], k[row*d:(row+nb)*d]...)
			hs.v[b][kvh] = append(hs.v[b][kvh], v[row*d:(row+nb)*d]...)
		}
	}
}

// refDecode is the decode rule in float64, written from its description:
// the weight of every key the query at position p of sequence b, head h,
// sees (1 for the recent positions and the bucket's neighbourhood in the
// stable sort of the older keys by bucket, rest/kept for the kept samples)
// and the weighted softmax. Buckets and sample ranks come from SortLSH and
// picks, tested on their own.
func refDecode(t *testing.T, a *Attention, hs *history, b, h, p int) (out []float64, lse float64) {
	t.Helper()
	c := hs.cfg
	d, g := c.D, c.H/c.HKV
	kvh := h / g
	keys, vals := hs.k[b][kvh], hs.v[b][kvh]
	qrow := hs.q[b][h][p*d : (p+1)*d]
	visible := p + 1
	weight := map[int]float64{}
	old := 0
	if a.min <= 0 || visible >= a.min {
		old = max(0, visible-max(a.block, 1))
	}
	for j := old; j < visible; j++ {
		weight[j] = 1
	}
	if old > 0 {
		lsh, err := NewSortLSH(a.projs, d, a.seed)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := lsh.Buckets(keys[:old*d])
		qb, _ := lsh.Buckets(qrow)
		sorted := make([]int, old)
		for j := range sorted {
			sorted[j] = j
		}
		slices.SortStableFunc(sorted, func(x, y int) int { return int(kb[x]) - int(kb[y]) })
		below, same := 0, 0
		for _, x := range kb {
			if x < qb[0] {
				below++
			} else if x == qb[0] {
				same++
			}
		}
		m := min(max(a.block, 0), old)
		lo := min(max(below+same/2-m/2, 0), old-m)
		for _, j := range sorted[lo : lo+m] {
			weight[j] = 1
		}
		if ns := min(max(a.samples, 0), old); ns > 0 {
			ch := newChooser()
			var kept []int
			for _, r := range ch.picks(a.seed, kvh, p, old, ns) {
				if int(r) < lo || int(r) >= lo+m {
					kept = append(kept, sorted[r])
				}
			}
			if rest := old - m; len(kept) > 0 && rest > 0 {
				for _, j := range kept {
					weight[j] = float64(rest) / float64(len(kept))
				}
			}
		}
	}
	scale := float64(c.ScaleFor())
	logit := map[int]float64{}
	mx := math.Inf(-1)
	for j := range weight {
		var dot float64
		for x := range d {
			dot += float64(qrow[x]) * float64(keys[j*d+x])
		}
		logit[j] = dot * scale
		mx = max(mx, logit[j])
	}
	out = make([]float64, d)
	var sum float64
	for j, w := range weight {
		e := w * math.Exp(logit[j]-mx)
		sum += e
		for x := range d {
			out[x] += e * float64(vals[j*d+x])
		}
	}
	for x := range out {
		out[x] /= sum
	}
	return out, mx + math.Log(sum)
}

// exactDecode is causal attention of position p over the positions up to
// it, in float64.
func exactDecode(t *testing.T, hs *history, b, h, p int) (out []float64, lse float64) {
	t.Helper()
	c := hs.cfg
	kvh := h / (c.H / c.HKV)
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: p + 1, D: c.D}
	o, l, err := ref.Attention(s, hs.q[b][h][p*c.D:(p+1)*c.D], hs.k[b][kvh][:(p+1)*c.D], hs.v[b][kvh][:(p+1)*c.D],
		ref.Spec{Scale: float64(c.Scale)})
	if err != nil {
		t.Fatal(err)
	}
	return o, l[0]
}

// step is one Step's arguments.
type step struct {
	n     int
	valid []int
}

// script is the steps the decoder tests run: a ragged prompt chunk, single
// positions with a sequence idle now and then, another chunk, and more
// single positions.
func script(b int) []step {
	ragged := func(full int, f func(i int) int) []int {
		if b == 1 {
			return nil
		}
		v := make([]int, b)
		for i := range v {
			v[i] = min(full, f(i))
		}
		return v
	}
	steps := []step{{41, ragged(41, func(i int) int { return 41 - 9*i })}}
	for x := range 15 {
		steps = append(steps, step{1, ragged(1, func(i int) int { return (x + i) % 3 })})
	}
	steps = append(steps, step{7, ragged(7, func(i int) int { return 7 - 2*i })})
	for range 12 {
		steps = append(steps, step{1, nil})
	}
	return steps
}

// runScript runs the steps of script on a fresh decoder of a for cfg, with
// inputs from rng, and hands each step's inputs and outputs to check.
func runScript(t *testing.T, a *Attention, cfg attn.DecodeConfig, rng *rand.Rand, steps []step,
	check func(hs *history, st step, before []int, out, lse []float32)) attn.Decoder {
	t.Helper()
	dec, err := a.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := newHistory(cfg)
	for _, st := range steps {
		q := ref.Normal(rng, cfg.B*cfg.H*st.n*cfg.D)
		k := ref.Normal(rng, cfg.B*cfg.HKV*st.n*cfg.D)
		v := ref.Normal(rng, cfg.B*cfg.HKV*st.n*cfg.D)
		out := make([]float32, len(q))
		lse := make([]float32, cfg.B*cfg.H*st.n)
		before := make([]int, cfg.B)
		for b := range before {
			before[b] = dec.Len(b)
		}
		if err := dec.Step(context.Background(), q, k, v, st.n, st.valid, out, lse); err != nil {
			t.Fatalf("step %+v: %v", st, err)
		}
		hs.add(q, k, v, st.n, st.valid)
		check(hs, st, before, out, lse)
	}
	return dec
}

// compare checks every real output row of a step against want, and the
// padding rows for 0 and -Inf.
func compare(t *testing.T, what string, hs *history, st step, before []int, out, lse []float32,
	want func(b, h, p int) ([]float64, float64)) {
	t.Helper()
	c := hs.cfg
	d := c.D
	for b := range c.B {
		nb := st.n
		if st.valid != nil {
			nb = st.valid[b]
		}
		for h := range c.H {
			for i := range st.n {
				row := (b*c.H+h)*st.n + i
				got := out[row*d : (row+1)*d]
				if i >= nb {
					if slices.ContainsFunc(got, func(x float32) bool { return x != 0 }) || !math.IsInf(float64(lse[row]), -1) {
						t.Fatalf("%s: padding row %d of sequence %d: out %v lse %v, want 0 and -Inf", what, i, b, got, lse[row])
					}
					continue
				}
				p := before[b] + i
				wo, wl := want(b, h, p)
				if e := ref.RelErr(got, wo); e > tol {
					t.Fatalf("%s: sequence %d head %d position %d: out rel err %.3g", what, b, h, p, e)
				}
				if e := math.Abs(float64(lse[row])-wl) / max(1, math.Abs(wl)); e > tol {
					t.Fatalf("%s: sequence %d head %d position %d: lse %v, want %v", what, b, h, p, lse[row], wl)
				}
			}
		}
	}
}

// decodeCfgs approximate on short sequences: small blocks and few samples,
// with and without Min, a block part and samples.
func decodeCfgs() []Config {
	return []Config{
		{Block: 6, Samples: 5, Projs: 3, Min: -1, Seed: 7},
		{Block: 5, Samples: 9, Projs: 5, Min: 30, Seed: 8},
		{Block: 4, Samples: -1, Projs: 2, Min: -1, Seed: 9},
		{Block: -1, Samples: 7, Min: -1, Seed: 10},
		{Block: 3, Samples: 4, Projs: 16, Min: -1, Seed: 11},
	}
}

// The decoder follows its rule: the float64 reference of the same rule,
// with the same buckets and sample ranks, gives the same output and lse,
// for ragged batches, chunks and single positions, GQA and an odd head
// size.
func TestDecoderMatchesReference(t *testing.T) {
	rng := testRNG(t, 20)
	cfg := attn.DecodeConfig{B: 3, H: 6, HKV: 2, D: 13}
	for _, hc := range decodeCfgs() {
		a := newAttention(t, hc)
		runScript(t, a, cfg, rng, script(cfg.B), func(hs *history, st step, before []int, out, lse []float32) {
			compare(t, "rule", hs, st, before, out, lse, func(b, h, p int) ([]float64, float64) {
				return refDecode(t, a, hs, b, h, p)
			})
		})
	}
}

// The approximation shows: on the same inputs the rule differs from exact
// attention once the older keys outnumber the neighbourhood and the
// samples, which the tests of the rule above would not see if the rule
// were exact.
func TestDecoderApproximates(t *testing.T) {
	rng := testRNG(t, 21)
	cfg := attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 8}
	a := newAttention(t, Config{Block: 4, Samples: 3, Projs: 3, Min: -1, Seed: 1})
	worst := 0.0
	runScript(t, a, cfg, rng, script(1), func(hs *history, st step, before []int, out, lse []float32) {
		for i := range st.n {
			want, _ := exactDecode(t, hs, 0, 0, before[0]+i)
			worst = max(worst, ref.RelErr(out[i*cfg.D:(i+1)*cfg.D], want))
		}
	})
	if worst < 1e-3 {
		t.Errorf("largest error against exact attention %.3g: the rule did not approximate", worst)
	}
}

// With recent positions, neighbourhood and samples covering every position
// (or below Min) the rule is exact attention.
func TestDecoderExactWithinBudget(t *testing.T) {
	rng := testRNG(t, 22)
	cfg := attn.DecodeConfig{B: 2, H: 4, HKV: 1, D: 11, Scale: 0.4}
	for _, hc := range []Config{
		{Block: 8, Samples: 70, Projs: 4, Min: -1, Seed: 1},  // 8 recent + 70 samples: every key to 78 positions
		{Block: 40, Samples: -1, Projs: 4, Min: -1, Seed: 2}, // 40 recent + 40 around the bucket
		{Block: 2, Samples: 2, Min: 1000, Seed: 3},           // below Min
	} {
		a := newAttention(t, hc)
		runScript(t, a, cfg, rng, script(cfg.B), func(hs *history, st step, before []int, out, lse []float32) {
			compare(t, "exact", hs, st, before, out, lse, func(b, h, p int) ([]float64, float64) {
				return exactDecode(t, hs, b, h, p)
			})
		})
	}
}

// feed runs one sequence's positions through dec in the given chunk sizes
// and returns the outputs and lse of all of them, [H][positions][D] and
// [H][positions].
func feed(t *testing.T, dec attn.Decoder, cfg attn.DecodeConfig, q, k, v []float32, total int, chunks []int) (out, lse []float32) {
	t.Helper()
	d := cfg.D
	out = make([]float32, cfg.H*total*d)
	lse = make([]float32, cfg.H*total)
	at := 0
	for x := 0; at < total; x++ {
		n := min(chunks[x%len(chunks)], total-at)
		qs, ks, vs := sliceHeads(q, cfg.H, total, at, n, d), sliceHeads(k, cfg.HKV, total, at, n, d), sliceHeads(v, cfg.HKV, total, at, n, d)
		o := make([]float32, cfg.H*n*d)
		l := make([]float32, cfg.H*n)
		if err := dec.Step(context.Background(), qs, ks, vs, n, nil, o, l); err != nil {
			t.Fatal(err)
		}
		for h := range cfg.H {
			copy(out[(h*total+at)*d:], o[h*n*d:(h+1)*n*d])
			copy(lse[h*total+at:], l[h*n:(h+1)*n])
		}
		at += n
	}
	return out, lse
}

// sliceHeads returns positions [at, at+n) of x [heads][total][d] as
// [heads][n][d].
func sliceHeads(x []float32, heads, total, at, n, d int) []float32 {
	var y []float32
	for h := range heads {
		y = append(y, x[(h*total+at)*d:(h*total+at+n)*d]...)
	}
	return y
}

// How a sequence is cut into steps, and the number of workers, change
// nothing: one chunk, single positions and chunks of 3 give the same
// outputs, bit for bit.
func TestDecoderChunksEqualSteps(t *testing.T) {
	rng := testRNG(t, 23)
	cfg := attn.DecodeConfig{B: 1, H: 6, HKV: 3, D: 13}
	const total = 90
	for _, hc := range decodeCfgs() {
		a := newAttention(t, hc)
		q := ref.Normal(rng, cfg.H*total*cfg.D)
		k := ref.Normal(rng, cfg.HKV*total*cfg.D)
		v := ref.Normal(rng, cfg.HKV*total*cfg.D)
		var first, firstLSE []float32
		for _, run := range []struct {
			chunks  []int
			workers int
		}{{[]int{total}, 1}, {[]int{1}, 1}, {[]int{3}, 2}, {[]int{50, 1, 7}, 3}} {
			c := cfg
			c.Workers = run.workers
			dec, err := a.NewDecoder(c)
			if err != nil {
				t.Fatal(err)
			}
			out, lse := feed(t, dec, c, q, k, v, total, run.chunks)
			if first == nil {
				first, firstLSE = out, lse
				continue
			}
			if !slices.Equal(out, first) || !slices.Equal(lse, firstLSE) {
				t.Errorf("%+v: chunks %v on %d workers differ from one chunk", hc, run.chunks, run.workers)
			}
		}
	}
}

// Within a chunk, a position sees no later one: changing the queries, keys
// and values after position i of a chunk leaves the outputs up to i
// unchanged, bit for bit.
func TestDecoderNoFuture(t *testing.T) {
	rng := testRNG(t, 24)
	cfg := attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 9}
	const total = 60
	a := newAttention(t, decodeCfgs()[0])
	q := ref.Normal(rng, cfg.H*total*cfg.D)
	k := ref.Normal(rng, cfg.HKV*total*cfg.D)
	v := ref.Normal(rng, cfg.HKV*total*cfg.D)
	dec, _ := a.NewDecoder(cfg)
	out, lse := feed(t, dec, cfg, q, k, v, total, []int{total})
	cut := 1 + rng.IntN(total-1)
	q2, k2, v2 := slices.Clone(q), slices.Clone(k), slices.Clone(v)
	for _, x := range [][]float32{q2, k2, v2} {
		heads := len(x) / (total * cfg.D)
		for h := range heads {
			for i := (h*total + cut) * cfg.D; i < (h+1)*total*cfg.D; i++ {
				x[i] = float32(rng.NormFloat64())
			}
		}
	}
	dec.Reset()
	out2, lse2 := feed(t, dec, cfg, q2, k2, v2, total, []int{total})
	for h := range cfg.H {
		for i := range total {
			row := h*total + i
			same := slices.Equal(out[row*cfg.D:(row+1)*cfg.D], out2[row*cfg.D:(row+1)*cfg.D]) && lse[row] == lse2[row]
			if i < cut && !same {
				t.Fatalf("head %d position %d changed with the inputs from position %d on", h, i, cut)
			}
			if i == cut && same {
				t.Fatalf("head %d position %d did not change with its own inputs", h, i)
			}
		}
	}
}

// A ragged batch decodes each sequence as if alone: B = 3 with different
// valid counts equals three B = 1 decoders fed the real positions, bit
// for bit.
func TestDecoderRaggedEqualsPerSequence(t *testing.T) {
	rng := testRNG(t, 25)
	cfg := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 10}
	for _, hc := range decodeCfgs() {
		a := newAttention(t, hc)
		alone := make([]attn.Decoder, cfg.B)
		one := cfg
		one.B = 1
		for b := range alone {
			alone[b], _ = a.NewDecoder(one)
		}
		runScript(t, a, cfg, rng, script(cfg.B), func(hs *history, st step, before []int, out, lse []float32) {
			d := cfg.D
			for b := range cfg.B {
				nb := st.n
				if st.valid != nil {
					nb = st.valid[b]
				}
				if nb == 0 {
					continue
				}
				p := before[b]
				q := sliceHeads(flatHeads(hs.q[b]), cfg.H, len(hs.q[b][0])/d, p, nb, d)
				k := sliceHeads(flatHeads(hs.k[b]), cfg.HKV, len(hs.k[b][0])/d, p, nb, d)
				v := sliceHeads(flatHeads(hs.v[b]), cfg.HKV, len(hs.v[b][0])/d, p, nb, d)
				o := make([]float32, cfg.H*nb*d)
				l := make([]float32, cfg.H*nb)
				if err := alone[b].Step(context.Background(), q, k, v, nb, nil, o, l); err != nil {
					t.Fatal(err)
				}
				for h := range cfg.H {
					row := (b*cfg.H + h) * st.n
					if !slices.Equal(o[h*nb*d:(h+1)*nb*d], out[row*d:(row+nb)*d]) || !slices.Equal(l[h*nb:(h+1)*nb], lse[row:row+nb]) {
						t.Fatalf("%+v: sequence %d head %d at %d: the batch differs from the sequence alone", hc, b, h, p)
					}
				}
			}
		})
	}
}

// flatHeads concatenates per-head rows.
func flatHeads(x [][]float32) []float32 {
	var y []float32
	for _, r := range x {
		y = append(y, r...)
	}
	return y
}

// A step reads the recent positions, the samples and each query head's
// neighbourhood: a fixed number of key rows, however long the cache.
func TestDecoderReadsAFraction(t *testing.T) {
	rng := testRNG(t, 26)
	cfg := attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 8}
	hc := Config{Block: 16, Samples: 24, Projs: 6, Min: -1, Seed: 1}
	a := newAttention(t, hc)
	di, _ := a.NewDecoder(cfg)
	dec := di.(*Decoder)
	const total = 3000
	q := ref.Normal(rng, cfg.H*total*cfg.D)
	k := ref.Normal(rng, cfg.HKV*total*cfg.D)
	v := ref.Normal(rng, cfg.HKV*total*cfg.D)
	feed(t, dec, cfg, q, k, v, total, []int{total})
	for range 5 {
		before := dec.rowsRead
		feed(t, dec, cfg, q[:cfg.H*cfg.D], k[:cfg.HKV*cfg.D], v[:cfg.HKV*cfg.D], 1, []int{1})
		want := cfg.HKV*(hc.Block+hc.Samples) + cfg.H*hc.Block
		if got := dec.rowsRead - before; got != want {
			t.Errorf("a step at %d positions read %d key rows, want %d", dec.Len(0), got, want)
		}
	}
}

// Len, Bytes, Reset and MaxLen; a step that fails changes nothing.
func TestDecoderState(t *testing.T) {
	cfg := attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 5, MaxLen: 40}
	a := newAttention(t, decodeCfgs()[0])
	dec, err := a.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	run := func(dec attn.Decoder, ctx context.Context, n int, valid []int, seed uint64) ([]float32, error) {
		r := rand.New(rand.NewPCG(seed, 1))
		q := ref.Normal(r, cfg.B*cfg.H*n*cfg.D)
		k := ref.Normal(r, cfg.B*cfg.HKV*n*cfg.D)
		v := ref.Normal(r, cfg.B*cfg.HKV*n*cfg.D)
		out := make([]float32, len(q))
		return out, dec.Step(ctx, q, k, v, n, valid, out, nil)
	}
	if dec.Len(0) != 0 || dec.Bytes() != 0 {
		t.Errorf("new decoder: Len %d, Bytes %d", dec.Len(0), dec.Bytes())
	}
	if _, err := run(dec, ctx, 30, []int{30, 12}, 1); err != nil {
		t.Fatal(err)
	}
	if dec.Len(0) != 30 || dec.Len(1) != 12 {
		t.Errorf("Len %d, %d, want 30, 12", dec.Len(0), dec.Len(1))
	}
	bytes := dec.Bytes()
	if bytes < 4*2*(30+12)*cfg.D {
		t.Errorf("Bytes %d below the keys and values stored", bytes)
	}
	// Past MaxLen: an error and nothing appended, to either sequence.
	if _, err := run(dec, ctx, 11, nil, 2); !errors.Is(err, attn.ErrFull) {
		t.Errorf("past MaxLen: got %v, want ErrFull", err)
	}
	// Cancelled in the middle: the context's error once, nothing appended.
	for after := range 4 {
		_, err := run(dec, &countdown{ctx, int64(after)}, 5, nil, 3)
		if !errors.Is(err, context.Canceled) || strings.Count(err.Error(), "context canceled") != 1 {
			t.Errorf("cancelled after %d checks: got %v, want context.Canceled once", after, err)
		}
	}
	if dec.Len(0) != 30 || dec.Len(1) != 12 {
		t.Errorf("after failed steps: Len %d, %d, want 30, 12", dec.Len(0), dec.Len(1))
	}
	// What follows the failed steps is what follows without them.
	fresh, _ := a.NewDecoder(cfg)
	run(fresh, ctx, 30, []int{30, 12}, 1)
	want, _ := run(fresh, ctx, 4, nil, 4)
	got, err := run(dec, ctx, 4, nil, 4)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("after failed steps the decoder differs from one that never saw them (err %v)", err)
	}
	dec.Reset()
	if dec.Len(0) != 0 || dec.Len(1) != 0 || dec.Bytes() < bytes {
		t.Errorf("after Reset: Len %d, %d, Bytes %d (was %d)", dec.Len(0), dec.Len(1), dec.Bytes(), bytes)
	}
	fresh.Reset()
	a1, _ := run(dec, ctx, 9, []int{9, 3}, 5)
	a2, _ := run(fresh, ctx, 9, []int{9, 3}, 5)
	if !slices.Equal(a1, a2) {
		t.Errorf("after Reset the decoder differs from a fresh one")
	}
	if _, err := run(dec, ctx, 32, nil, 6); !errors.Is(err, attn.ErrFull) {
		t.Errorf("to 41 positions with MaxLen 40: got %v, want ErrFull", err)
	}
	if _, err := run(dec, ctx, 31, []int{31, 0}, 6); err != nil {
		t.Errorf("to MaxLen exactly: %v", err)
	}
}

func TestNewDecoderErrors(t *testing.T) {
	good := attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 8}
	a := newAttention(t, Config{})
	for _, c := range []struct {
		cfg  Config
		dc   attn.DecodeConfig
		want error
	}{
		{Config{}, attn.DecodeConfig{B: 1, H: 3, HKV: 2, D: 8}, attn.ErrShape},
		{Config{}, attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 8, Storage: "bf16"}, attn.ErrUnsupported},
		{Config{}, attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 8, Window: 64}, attn.ErrUnsupported},
		{Config{Sampling: ValueNorm}, good, attn.ErrUnsupported},
		{Config{Projs: MaxDecodeProjs + 1}, good, attn.ErrUnsupported},
	} {
		if _, err := newAttention(t, c.cfg).NewDecoder(c.dc); !errors.Is(err, c.want) {
			t.Errorf("%+v %+v: got %v, want %v", c.cfg, c.dc, err, c.want)
		}
	}
	for _, st := range []string{"", "f32"} {
		g := good
		g.Storage = st
		if _, err := a.NewDecoder(g); err != nil {
			t.Errorf("Storage %q: %v", st, err)
		}
	}
	dec, _ := a.NewDecoder(good)
	x := make([]float32, 4*8)
	if err := dec.Step(context.Background(), x, x[:16], x[:16], 1, nil, x[:31], nil); !errors.Is(err, attn.ErrShape) {
		t.Errorf("short out: got %v, want ErrShape", err)
	}
	if err := dec.Step(context.Background(), x, x[:16], x[:16], 0, nil, x, nil); !errors.Is(err, attn.ErrInput) {
		t.Errorf("n = 0: got %v, want ErrInput", err)
	}
}

// The sample ranks are uniform: distinct, and over many positions every
// rank drawn about equally often, both for draws of a large part of the
// keys (partial Fisher–Yates) and of a small one (Floyd). Fixed seeds:
// the bound is 5 standard deviations.
func TestPicksUniform(t *testing.T) {
	ch := newChooser()
	for _, c := range [][2]int{{50, 9}, {400, 7}} {
		nk, ns := c[0], c[1]
		const draws = 20000
		count := make([]int, nk)
		for p := range draws {
			got := ch.picks(3, 1, p, nk, ns)
			seen := map[int32]bool{}
			for _, r := range got {
				if r < 0 || int(r) >= nk || seen[r] {
					t.Fatalf("nk=%d ns=%d position %d: ranks %v", nk, ns, p, got)
				}
				seen[r] = true
				count[r]++
			}
			if len(got) != ns {
				t.Fatalf("%d ranks, want %d", len(got), ns)
			}
		}
		mean := float64(draws*ns) / float64(nk)
		sd := math.Sqrt(mean * (1 - float64(ns)/float64(nk)))
		for r, x := range count {
			if math.Abs(float64(x)-mean) > 5*sd {
				t.Errorf("nk=%d ns=%d: rank %d drawn %d times, want %.0f ± %.0f", nk, ns, r, x, mean, 5*sd)
			}
		}
	}
}

// TestDecoderFallback checks the decoder's own account of when it is
// exact against older, the rule the step follows.
func TestDecoderFallback(t *testing.T) {
	a := newAttention(t, Config{Block: 4, Samples: 3, Projs: 3, Min: 30, Seed: 1})
	dec, err := a.NewDecoder(attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 5})
	if err != nil {
		t.Fatal(err)
	}
	d := dec.(*Decoder)
	for _, m := range []int{1, 4, 29, 30, 31, 100} {
		why := d.Fallback(attn.Shape{B: 1, H: 2, HKV: 1, N: 1, M: m, D: 5}, attn.Options{Causal: true})
		if (why != "") != (d.older(m) == 0) {
			t.Errorf("M = %d: Fallback %q, but older = %d", m, why, d.older(m))
		}
	}
}
