package hyper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore/dectest"
	"github.com/attnkit/attn/ref"
)

// refDecode is the decode rule in float64, written from its description,
// over the keys and values as the decoder stores them (hs records them
// read back): the weight of every key the query at position p of
// sequence b, head h, sees (1 for the recent positions and the bucket's
// neighbourhood in the stable sort of the older keys by bucket, rest/kept
// for the kept samples) and the weighted softmax. Buckets and sample ranks
// come from SortLSH and picks, tested on their own. The buckets are of
// hs's keys, the decoder's only without "+rot" (with it the decoder
// hashes the rotated keys).
func refDecode(t *testing.T, a *Attention, hs *dectest.History, b, h, p int) (out []float64, lse float64) {
	t.Helper()
	c := hs.Cfg
	d, g := c.D, c.H/c.HKV
	kvh := h / g
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
		kb, _ := lsh.Buckets(hs.K[b][kvh][:old*d])
		qb, _ := lsh.Buckets(hs.Query(b, h, p))
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
	return hs.Weighted(b, h, p, func(j int) (float64, bool) {
		w, ok := weight[j]
		return math.Log(w), ok
	})
}

// script is the steps the decoder tests run (see dectest.Script): a
// ragged prompt chunk, single positions with a sequence idle now and
// then, another chunk, and more single positions. The decoder runs its
// rule on every position, the prompt's included.
func script(b int) []dectest.Step { return dectest.Script(b, 41, 15) }

// runScript runs the steps of script on a fresh decoder of a for cfg, with
// inputs from rng, and checks every output row against want.
func runScript(t *testing.T, a *Attention, cfg attn.DecodeConfig, rng *rand.Rand, what string,
	want func(hs *dectest.History, b, h, p int) ([]float64, float64)) {
	t.Helper()
	dec, err := a.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dectest.Run(t, dec, cfg, rng, script(cfg.B), func(hs *dectest.History, st dectest.Step, before []int, out, lse []float32) {
		dectest.Compare(t, what, hs, st, before, out, lse, decodeTol(cfg.Storage), func(b, h, p int) ([]float64, float64, bool) {
			o, l := want(hs, b, h, p)
			return o, l, true
		})
	})
}

// decodeTol is the tolerance of the outputs of a decoder storing rows
// as storage against the float64 references over the stored rows: tol,
// but 5e-5 where the kernels reading the stored form are less exact than
// float32 products: bfloat16 (the avx512bf16 kernels split each query
// value and probability into two bfloat16 halves, each product within
// 2^-18 of itself) and int4 (a score is scale·Σ q·code + zero·Σ q a
// channel group, terms that cancel).
func decodeTol(storage string) float64 {
	if strings.HasPrefix(storage, "bf16") || strings.HasPrefix(storage, "i4") {
		return 5e-5
	}
	return tol
}

// decoderOf returns a constructor of a's decoders, for dectest's checks.
func decoderOf(t *testing.T, a *Attention) func(attn.DecodeConfig) attn.Decoder {
	return func(cfg attn.DecodeConfig) attn.Decoder {
		t.Helper()
		dec, err := a.NewDecoder(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return dec
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
// size, and for keys and values stored as 16-bit floats or int4 codes
// (the reference reads them back as stored, and hashes them so: the rule
// is a known function of the stored keys). Int4 with D not a multiple of
// 8 (a row's codes and values widened) and with D past one channel group.
func TestDecoderMatchesReference(t *testing.T) {
	rng := testRNG(t, 20)
	for _, cfg := range []attn.DecodeConfig{
		{B: 3, H: 6, HKV: 2, D: 13},
		{B: 2, H: 4, HKV: 2, D: 13, Storage: "bf16"},
		{B: 2, H: 4, HKV: 1, D: 16, Storage: "f16"},
		{B: 2, H: 6, HKV: 2, D: 19, Storage: "i4"},
		{B: 1, H: 4, HKV: 2, D: 72, Storage: "i4"},
	} {
		for _, hc := range decodeCfgs() {
			a := newAttention(t, hc)
			runScript(t, a, cfg, rng, "rule "+cfg.Storage, func(hs *dectest.History, b, h, p int) ([]float64, float64) {
				return refDecode(t, a, hs, b, h, p)
			})
		}
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
	dec, err := a.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dectest.Run(t, dec, cfg, rng, script(1), func(hs *dectest.History, st dectest.Step, before []int, out, lse []float32) {
		for i := range st.N {
			want, _ := hs.Exact(0, 0, before[0]+i)
			worst = max(worst, ref.RelErr(out[i*cfg.D:(i+1)*cfg.D], want))
		}
	})
	if worst < 1e-3 {
		t.Errorf("largest error against exact attention %.3g: the rule did not approximate", worst)
	}
}

// With recent positions, neighbourhood and samples covering every position
// (or below Min) the rule is exact attention over the stored keys and
// values, in every storage, rotated or not (whatever the rotated keys'
// buckets).
func TestDecoderExactWithinBudget(t *testing.T) {
	rng := testRNG(t, 22)
	for _, hc := range []Config{
		{Block: 8, Samples: 70, Projs: 4, Min: -1, Seed: 1},  // 8 recent + 70 samples: every key to 78 positions
		{Block: 40, Samples: -1, Projs: 4, Min: -1, Seed: 2}, // 40 recent + 40 around the bucket
		{Block: 2, Samples: 2, Min: 1000, Seed: 3},           // below Min
	} {
		a := newAttention(t, hc)
		for _, c := range []struct {
			storage string
			d       int
		}{{"", 11}, {"f32+rot", 12}, {"bf16+rot", 16}, {"f16", 11}, {"i8", 11}, {"i8+rot", 24}, {"i4", 11}, {"i4+rot", 40}, {"i4+rot", 72}} {
			cfg := attn.DecodeConfig{B: 2, H: 4, HKV: 1, D: c.d, Scale: 0.4, Storage: c.storage}
			runScript(t, a, cfg, rng, "exact "+c.storage, func(hs *dectest.History, b, h, p int) ([]float64, float64) {
				return hs.Exact(b, h, p)
			})
		}
	}
}

// feed runs one sequence's positions through dec in chunks, chunks[0]
// first, then the rest of chunks in turn (chunks[0] again where it is
// alone), and returns the outputs and lse of all of them, [H][positions][D] and
// [H][positions].
func feed(t *testing.T, dec attn.Decoder, cfg attn.DecodeConfig, q, k, v []float32, total int, chunks []int) (out, lse []float32) {
	t.Helper()
	d := cfg.D
	out = make([]float32, cfg.H*total*d)
	lse = make([]float32, cfg.H*total)
	at := 0
	for x := 0; at < total; x++ {
		n := chunks[0]
		if x > 0 && len(chunks) > 1 {
			n = chunks[1+(x-1)%(len(chunks)-1)]
		}
		n = min(n, total-at)
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
// outputs, bit for bit, in float32, rotated or not. (With rows rounded as
// they are stored, a single position reads its own row as given and a
// chunk's positions read each other as stored, so cutting a chunk into
// single positions changes the outputs by that rounding: rotated int4
// runs are cut the same way in each run, on 1 to 3 workers.)
func TestDecoderChunksEqualSteps(t *testing.T) {
	rng := testRNG(t, 23)
	const total = 90
	type run struct {
		chunks  []int
		workers int
	}
	for i, hc := range decodeCfgs() {
		cfg := attn.DecodeConfig{B: 1, H: 6, HKV: 3, D: 13}
		runs := []run{{[]int{total}, 1}, {[]int{1}, 1}, {[]int{3}, 2}, {[]int{50, 1, 7}, 3}}
		switch i % 3 {
		case 1:
			cfg.D, cfg.Storage = 24, "f32+rot"
		case 2:
			cfg.D, cfg.Storage = 24, "i4+rot"
			runs = []run{{[]int{30, 20, 1, 7}, 1}, {[]int{30, 20, 1, 7}, 2}, {[]int{30, 20, 1, 7}, 3}}
		}
		a := newAttention(t, hc)
		q := ref.Normal(rng, cfg.H*total*cfg.D)
		k := ref.Normal(rng, cfg.HKV*total*cfg.D)
		v := ref.Normal(rng, cfg.HKV*total*cfg.D)
		var first, firstLSE []float32
		for _, run := range runs {
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
				t.Errorf("%+v %q: chunks %v on %d workers differ from one chunk", hc, cfg.Storage, run.chunks, run.workers)
			}
		}
	}
}

// Within a chunk, a position sees no later one: changing the queries, keys
// and values after position i of a chunk leaves the outputs up to i
// unchanged, bit for bit, in float32 and in rotated int4 (quantised a row
// at a time, so that no row's codes depend on a later one).
func TestDecoderNoFuture(t *testing.T) {
	for _, storage := range []string{"f32", "i4+rot"} {
		t.Run(storage, func(t *testing.T) { noFuture(t, storage) })
	}
}

func noFuture(t *testing.T, storage string) {
	rng := testRNG(t, 24)
	cfg := attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 9, Storage: storage}
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
// for bit; and the worker count changes no bit. In float32 and in
// rotated int4, a multiple of 8 and not.
func TestDecoderRaggedAndWorkers(t *testing.T) {
	rng := testRNG(t, 25)
	for i, hc := range decodeCfgs() {
		a := newAttention(t, hc)
		for _, cfg := range []attn.DecodeConfig{
			{B: 3, H: 4, HKV: 2, D: 10},
			{B: 3, H: 4, HKV: 2, D: []int{10, 24}[i%2], Storage: "i4+rot"},
		} {
			dectest.CheckRagged(t, decoderOf(t, a), cfg, rng, script(cfg.B))
			dectest.CheckWorkers(t, decoderOf(t, a), cfg, uint64(26+i), script(cfg.B))
		}
	}
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

// dectest's checks of Len, Bytes, Reset, MaxLen, bad arguments,
// cancellation and Append, in every storage.
func TestDecoderStateStorages(t *testing.T) {
	a := newAttention(t, decodeCfgs()[0])
	for _, st := range []string{"", "f32+rot", "bf16", "f16+rot", "i8", "i8+rot", "i4", "i4+rot"} {
		t.Run(fmt.Sprintf("%q", st), func(t *testing.T) {
			dectest.CheckState(t, decoderOf(t, a), attn.DecodeConfig{B: 2, H: 4, HKV: 2, D: 6, MaxLen: 40, Storage: st})
		})
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
		{Config{}, attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 8, Storage: "+rot"}, attn.ErrInput},
		{Config{}, attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 8, Storage: "f64"}, attn.ErrInput},
		{Config{}, attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 8, Window: 64}, attn.ErrUnsupported},
		{Config{Sampling: ValueNorm}, good, attn.ErrUnsupported},
		{Config{Projs: MaxDecodeProjs + 1}, good, attn.ErrUnsupported},
	} {
		if _, err := newAttention(t, c.cfg).NewDecoder(c.dc); !errors.Is(err, c.want) {
			t.Errorf("%+v %+v: got %v, want %v", c.cfg, c.dc, err, c.want)
		}
	}
	for _, st := range []string{"", "f32", "f32+rot", "bf16", "bf16+rot", "f16", "f16+rot", "i8", "i8+rot", "i4", "i4+rot"} {
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
