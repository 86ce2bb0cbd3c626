// Package dectest holds the test helpers of the decoders built on
// package decstore: a history of what a decoder was given, a float64
// reference of a weighted softmax over it, scripts of ragged steps, and
// the checks every such decoder must pass (a ragged batch equals its
// sequences alone, the worker count changes no bit, a failed step
// changes nothing).
package dectest

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/lowbit"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/ref"
)

// FreshRNG returns a generator of fresh inputs on stream stream and logs
// its seed; ATTN_TEST_SEED reruns one.
func FreshRNG(t testing.TB, stream uint64) *rand.Rand {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("ATTN_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ATTN_TEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with ATTN_TEST_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(stream, seed))
}

// History keeps every real position a decoder was given.
type History struct {
	Cfg     attn.DecodeConfig
	Q, K, V [][][]float32 // Q [B][H], K and V [B][Hkv]: rows [positions][D]
	// InK and InV are the keys and values as given (K and V as read
	// back), [B][Hkv].
	InK, InV [][][]float32
	// KeyGroup > 0: int4 keys are quantised per channel over groups of
	// KeyGroup positions once a step after their group completes, kept
	// in float32 until then (decstore's Settle); pend holds those
	// rotated keys, set the positions quantised, [B][Hkv].
	KeyGroup int
	pend     [][][]float32
	set      [][]int
	// AsGiven: the decoder reads the keys and values of a step's own
	// positions as given, not as stored (decstore's prefill and Hold),
	// so Key and Value return InK and InV rows for positions from
	// from[b] on, the first of the latest Add.
	AsGiven bool
	from    []int
	// GivenSingles: only a one-position step reads its own key and
	// value as given (hyper's Hold); last[b] is the latest Add's count.
	GivenSingles bool
	last         []int
}

// NewHistory returns an empty history for cfg.
func NewHistory(cfg attn.DecodeConfig) *History {
	hs := &History{Cfg: cfg}
	for range cfg.B {
		hs.Q = append(hs.Q, make([][]float32, cfg.H))
		hs.K = append(hs.K, make([][]float32, cfg.HKV))
		hs.V = append(hs.V, make([][]float32, cfg.HKV))
		hs.InK = append(hs.InK, make([][]float32, cfg.HKV))
		hs.InV = append(hs.InV, make([][]float32, cfg.HKV))
	}
	return hs
}

// Add records the real positions of a step (q nil for an append). Keys
// and values are recorded as the decoder reads them back (see stored),
// so that the references are exact attention over the stored rows.
func (hs *History) Add(q, k, v []float32, n int, valid []int) {
	c, d := hs.Cfg, hs.Cfg.D
	ik, iv := k, v
	hs.from, hs.last = hs.from[:0], hs.last[:0]
	for b := range c.B {
		hs.from = append(hs.from, len(hs.K[b][0])/d)
		hs.last = append(hs.last, Count(n, valid, b))
	}
	if hs.KeyGroup > 0 {
		hs.settle()
		k = hs.rotated(k, true)
	} else {
		k = hs.stored(k)
	}
	v = hs.stored(v)
	for b := range c.B {
		nb := Count(n, valid, b)
		for h := range c.H {
			row := (b*c.H + h) * n
			if q != nil {
				hs.Q[b][h] = append(hs.Q[b][h], q[row*d:(row+nb)*d]...)
			} else {
				hs.Q[b][h] = append(hs.Q[b][h], make([]float32, nb*d)...)
			}
		}
		for kvh := range c.HKV {
			row := (b*c.HKV + kvh) * n
			hs.K[b][kvh] = append(hs.K[b][kvh], k[row*d:(row+nb)*d]...)
			hs.V[b][kvh] = append(hs.V[b][kvh], v[row*d:(row+nb)*d]...)
			hs.InK[b][kvh] = append(hs.InK[b][kvh], ik[row*d:(row+nb)*d]...)
			if hs.KeyGroup > 0 {
				hs.pend[b][kvh] = append(hs.pend[b][kvh], hs.rotated(ik[row*d:(row+nb)*d], false)...)
			}
			hs.InV[b][kvh] = append(hs.InV[b][kvh], iv[row*d:(row+nb)*d]...)
		}
	}
}

// rotated returns a copy of x (rows of D) rotated as the decoder stores
// it, and with back, rotated back (float32 rounding the only change).
func (hs *History) rotated(x []float32, back bool) []float32 {
	y := append([]float32(nil), x...)
	if _, rot, _ := kvcache.ParseStorage(hs.Cfg.Storage); rot {
		r := lowbit.NewRotation(hs.Cfg.D)
		r.Rows(y, false)
		if back {
			r.Rows(y, true)
		}
	}
	return y
}

// settle quantises the keys of complete groups per channel, as
// decstore's Settle, and puts them, read back, in K.
func (hs *History) settle() {
	c, d, g := hs.Cfg, hs.Cfg.D, hs.KeyGroup
	if hs.pend == nil {
		for range c.B {
			hs.pend = append(hs.pend, make([][]float32, c.HKV))
			hs.set = append(hs.set, make([]int, c.HKV))
		}
	}
	_, rot, _ := kvcache.ParseStorage(c.Storage)
	col := make([]float32, g)
	for b := range c.B {
		for kvh := range c.HKV {
			for len(hs.pend[b][kvh]) >= g*d {
				keys := hs.pend[b][kvh][:g*d]
				for ch := range d {
					for r := range g {
						col[r] = keys[r*d+ch]
					}
					scale, zero := lowbit.Params(lowbit.Range(col))
					inv := lowbit.Inv(scale)
					for r := range g {
						keys[r*d+ch] = zero + scale*float32(lowbit.Code(col[r], zero, inv))
					}
				}
				if rot {
					lowbit.NewRotation(d).Rows(keys, true)
				}
				copy(hs.K[b][kvh][hs.set[b][kvh]*d:], keys)
				hs.pend[b][kvh] = hs.pend[b][kvh][g*d:]
				hs.set[b][kvh] += g
			}
		}
	}
}

// stored returns x (rows of D) as the decoder reads it back: rotated,
// rounded to 16 bits or quantised to int8 or int4 codes and back
// (decstore's rows and groups), and rotated back.
func (hs *History) stored(x []float32) []float32 {
	d := hs.Cfg.D
	dt, rot, err := kvcache.ParseStorage(hs.Cfg.Storage)
	if err != nil || (dt == kvcache.F32 && !rot) {
		return x
	}
	y := append([]float32(nil), x...)
	var r *lowbit.Rotation
	if rot {
		r = lowbit.NewRotation(d)
		r.Rows(y, false)
	}
	switch dt {
	case kvcache.BF16:
		for i, e := range y {
			y[i] = half.BF16ToF32(half.F32ToBF16(e))
		}
	case kvcache.F16:
		for i, e := range y {
			y[i] = half.F16ToF32(half.F32ToF16(e))
		}
	case kvcache.I8:
		codes := make([]int8, d)
		for o := 0; o < len(y); o += d {
			scale := lowbit.QuantI8(codes, y[o:o+d])
			for i, c := range codes {
				y[o+i] = float32(c) * scale
			}
		}
	case kvcache.I4:
		pw, ng := lowbit.Stride(d)/2, lowbit.ChanGroups(d)
		codes, scale, zero := make([]uint8, pw), make([]float32, ng), make([]float32, ng)
		for o := 0; o < len(y); o += d {
			lowbit.QuantRow(codes, scale, zero, 1, y[o:o+d], pw)
			lowbit.Dequant(y[o:o+d], codes, scale, zero, 1)
		}
	}
	if rot {
		r.Rows(y, true)
	}
	return y
}

// Count is sequence b's real positions among n.
func Count(n int, valid []int, b int) int {
	if valid == nil {
		return n
	}
	return valid[b]
}

// Key returns key row j of sequence b, key/value head kvh, as the
// decoder reads it in the latest step.
func (hs *History) Key(b, kvh, j int) []float32 {
	d := hs.Cfg.D
	if hs.given(b, j) {
		return hs.InK[b][kvh][j*d : (j+1)*d]
	}
	return hs.K[b][kvh][j*d : (j+1)*d]
}

// given reports whether the decoder reads position j of sequence b as
// given in the latest step.
func (hs *History) given(b, j int) bool {
	return hs.AsGiven && j >= hs.from[b] || hs.GivenSingles && hs.last[b] == 1 && j == hs.from[b]
}

// Value returns value row j as Key returns keys.
func (hs *History) Value(b, kvh, j int) []float32 {
	d := hs.Cfg.D
	if hs.given(b, j) {
		return hs.InV[b][kvh][j*d : (j+1)*d]
	}
	return hs.V[b][kvh][j*d : (j+1)*d]
}

// Query returns the query of sequence b, head h, at position p.
func (hs *History) Query(b, h, p int) []float32 {
	d := hs.Cfg.D
	return hs.Q[b][h][p*d : (p+1)*d]
}

// Logit is the scaled logit of the query of (b, h) at p against key j,
// in float64.
func (hs *History) Logit(b, h, p, j int) float64 {
	c := hs.Cfg
	kvh := h / (c.H / c.HKV)
	var s float64
	for i, x := range hs.Query(b, h, p) {
		s += float64(x) * float64(hs.Key(b, kvh, j)[i])
	}
	return s * float64(c.ScaleFor())
}

// Weighted is the float64 softmax of the query of (b, h) at p over the
// keys j < p+1 with weight(j) true, each logit plus its log weight.
func (hs *History) Weighted(b, h, p int, weight func(j int) (logw float64, ok bool)) (out []float64, lse float64) {
	c := hs.Cfg
	d, kvh := c.D, h/(c.H/c.HKV)
	var js []int
	var ls []float64
	mx := math.Inf(-1)
	for j := 0; j <= p; j++ {
		lw, ok := weight(j)
		if !ok {
			continue
		}
		l := hs.Logit(b, h, p, j) + lw
		js, ls = append(js, j), append(ls, l)
		mx = max(mx, l)
	}
	out = make([]float64, d)
	var sum float64
	for t, j := range js {
		w := math.Exp(ls[t] - mx)
		sum += w
		for i, x := range hs.Value(b, kvh, j) {
			out[i] += w * float64(x)
		}
	}
	for i := range out {
		out[i] /= sum
	}
	return out, mx + math.Log(sum)
}

// Exact is exact causal attention of the query of (b, h) at p.
func (hs *History) Exact(b, h, p int) ([]float64, float64) {
	return hs.Weighted(b, h, p, func(int) (float64, bool) { return 0, true })
}

// Step is one call of a script: n positions, valid as for Decoder.Step.
type Step struct {
	N     int
	Valid []int
}

// Script is a ragged prompt chunk of up to prompt positions, single
// positions with a sequence idle now and then, another chunk, and more
// single positions, for b sequences.
func Script(b, prompt, singles int) []Step {
	ragged := func(full int, f func(i int) int) []int {
		if b == 1 {
			return nil
		}
		v := make([]int, b)
		for i := range v {
			v[i] = max(0, min(full, f(i)))
		}
		return v
	}
	steps := []Step{{prompt, ragged(prompt, func(i int) int { return prompt - 9*i })}}
	for x := range singles {
		steps = append(steps, Step{1, ragged(1, func(i int) int { return (x + i + 1) % 3 })})
	}
	steps = append(steps, Step{7, ragged(7, func(i int) int { return 7 - 2*i })})
	for range singles {
		steps = append(steps, Step{1, nil})
	}
	return steps
}

// Run runs steps on dec with inputs from rng and hands each step's
// inputs and outputs to check (which may be nil).
func Run(t testing.TB, dec attn.Decoder, cfg attn.DecodeConfig, rng *rand.Rand, steps []Step,
	check func(hs *History, st Step, before []int, out, lse []float32)) *History {
	t.Helper()
	hs := NewHistory(cfg)
	if kg, ok := dec.(interface{ KeyGroup() int }); ok {
		hs.KeyGroup = kg.KeyGroup()
	}
	if g, ok := dec.(interface{ StepAsGiven() bool }); ok {
		hs.AsGiven = g.StepAsGiven()
	}
	if g, ok := dec.(interface{ SingleAsGiven() bool }); ok {
		hs.GivenSingles = g.SingleAsGiven()
	}
	for _, st := range steps {
		q := ref.Normal(rng, cfg.B*cfg.H*st.N*cfg.D)
		k := ref.Normal(rng, cfg.B*cfg.HKV*st.N*cfg.D)
		v := ref.Normal(rng, cfg.B*cfg.HKV*st.N*cfg.D)
		out := make([]float32, len(q))
		lse := make([]float32, cfg.B*cfg.H*st.N)
		before := make([]int, cfg.B)
		for b := range before {
			before[b] = dec.Len(b)
		}
		if err := dec.Step(context.Background(), q, k, v, st.N, st.Valid, out, lse); err != nil {
			t.Fatalf("step %+v: %v", st, err)
		}
		hs.Add(q, k, v, st.N, st.Valid)
		for b := range before {
			if got, want := dec.Len(b), before[b]+Count(st.N, st.Valid, b); got != want {
				t.Fatalf("step %+v: Len(%d) = %d, want %d", st, b, got, want)
			}
		}
		if check != nil {
			check(hs, st, before, out, lse)
		}
	}
	return hs
}

// Compare checks every real output row of a step against want (skipped
// where want says !ok), within tol, and the padding rows for 0 and -Inf.
func Compare(t testing.TB, what string, hs *History, st Step, before []int, out, lse []float32, tol float64,
	want func(b, h, p int) (out []float64, lse float64, ok bool)) {
	t.Helper()
	c := hs.Cfg
	d := c.D
	for b := range c.B {
		nb := Count(st.N, st.Valid, b)
		for h := range c.H {
			for i := range st.N {
				row := (b*c.H+h)*st.N + i
				got := out[row*d : (row+1)*d]
				if i >= nb {
					if slices.ContainsFunc(got, func(x float32) bool { return x != 0 }) || !math.IsInf(float64(lse[row]), -1) {
						t.Fatalf("%s: padding row %d of sequence %d: out %v lse %v, want 0 and -Inf", what, i, b, got, lse[row])
					}
					continue
				}
				p := before[b] + i
				wo, wl, ok := want(b, h, p)
				if !ok {
					continue
				}
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

// sliceHeads returns positions [at, at+n) of x [heads][total][d] as
// [heads][n][d].
func sliceHeads(x [][]float32, at, n, d int) []float32 {
	var y []float32
	for _, r := range x {
		y = append(y, r[at*d:(at+n)*d]...)
	}
	return y
}

// CheckRagged runs steps on a decoder for cfg and on one decoder per
// sequence fed its real positions alone: the outputs must agree bit for
// bit.
func CheckRagged(t *testing.T, newDec func(attn.DecodeConfig) attn.Decoder, cfg attn.DecodeConfig, rng *rand.Rand, steps []Step) {
	t.Helper()
	alone := make([]attn.Decoder, cfg.B)
	one := cfg
	one.B = 1
	for b := range alone {
		alone[b] = newDec(one)
	}
	d := cfg.D
	Run(t, newDec(cfg), cfg, rng, steps, func(hs *History, st Step, before []int, out, lse []float32) {
		for b := range cfg.B {
			nb := Count(st.N, st.Valid, b)
			if nb == 0 {
				continue
			}
			p := before[b]
			q, k, v := sliceHeads(hs.Q[b], p, nb, d), sliceHeads(hs.InK[b], p, nb, d), sliceHeads(hs.InV[b], p, nb, d)
			o := make([]float32, cfg.H*nb*d)
			l := make([]float32, cfg.H*nb)
			if err := alone[b].Step(context.Background(), q, k, v, nb, nil, o, l); err != nil {
				t.Fatal(err)
			}
			for h := range cfg.H {
				row := (b*cfg.H + h) * st.N
				if !slices.Equal(o[h*nb*d:(h+1)*nb*d], out[row*d:(row+nb)*d]) || !slices.Equal(l[h*nb:(h+1)*nb], lse[row:row+nb]) {
					t.Fatalf("sequence %d head %d at %d (step %+v): the batch differs from the sequence alone", b, h, p, st)
				}
			}
		}
	})
}

// CheckWorkers runs steps with 1, 2 and 3 workers on inputs drawn from
// seed: the outputs must agree bit for bit.
func CheckWorkers(t *testing.T, newDec func(attn.DecodeConfig) attn.Decoder, cfg attn.DecodeConfig, seed uint64, steps []Step) {
	t.Helper()
	var first []float32
	for _, w := range []int{1, 2, 3} {
		c := cfg
		c.Workers = w
		var all []float32
		Run(t, newDec(c), c, rand.New(rand.NewPCG(seed, 9)), steps, func(_ *History, _ Step, _ []int, out, lse []float32) {
			all = append(append(all, out...), lse...)
		})
		if first == nil {
			first = all
		} else if !slices.Equal(all, first) {
			t.Errorf("%d workers differ from 1", w)
		}
	}
}

// CheckState checks Len, Bytes, Reset, MaxLen, bad arguments and
// cancellation on decoders for cfg (which must have B = 2 and MaxLen =
// 40): a step or append that fails changes nothing, and after Reset the
// same steps give the same bits. Append, then single steps, gives what
// a Step over the same chunk, then the same single steps, gives.
func CheckState(t *testing.T, newDec func(attn.DecodeConfig) attn.Decoder, cfg attn.DecodeConfig) {
	t.Helper()
	if cfg.B != 2 || cfg.MaxLen != 40 {
		t.Fatalf("CheckState wants B = 2, MaxLen = 40: %+v", cfg)
	}
	ctx := context.Background()
	inputs := func(n int, seed uint64) (q, k, v []float32) {
		r := rand.New(rand.NewPCG(seed, 1))
		return ref.Normal(r, cfg.B*cfg.H*n*cfg.D), ref.Normal(r, cfg.B*cfg.HKV*n*cfg.D), ref.Normal(r, cfg.B*cfg.HKV*n*cfg.D)
	}
	run := func(dec attn.Decoder, ctx context.Context, n int, valid []int, seed uint64) ([]float32, error) {
		q, k, v := inputs(n, seed)
		out := make([]float32, len(q))
		return out, dec.Step(ctx, q, k, v, n, valid, out, nil)
	}
	dec := newDec(cfg)
	if _, err := run(dec, ctx, 30, []int{30, 12}, 1); err != nil {
		t.Fatal(err)
	}
	if dec.Len(0) != 30 || dec.Len(1) != 12 || dec.Bytes() <= 0 {
		t.Fatalf("Len %d, %d, Bytes %d", dec.Len(0), dec.Len(1), dec.Bytes())
	}
	bytes := dec.Bytes()
	// Failures: past MaxLen, a cancelled context, bad arguments.
	if _, err := run(dec, ctx, 11, nil, 2); !errors.Is(err, attn.ErrFull) {
		t.Errorf("step past MaxLen: %v, want ErrFull", err)
	}
	if ap, ok := dec.(attn.Appender); ok {
		_, k, v := inputs(11, 2)
		if err := ap.Append(ctx, k, v, 11, nil); !errors.Is(err, attn.ErrFull) {
			t.Errorf("append past MaxLen: %v, want ErrFull", err)
		}
	} else {
		t.Error("the decoder is not an attn.Appender")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, n := range []int{1, 4} {
		if _, err := run(dec, cancelled, n, nil, 3); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled step of %d: %v", n, err)
		}
	}
	q, k, v := inputs(2, 4)
	out := make([]float32, len(q))
	for _, c := range []struct {
		err               error
		q, k, v, out, lse []float32
		n                 int
		valid             []int
	}{
		{attn.ErrShape, q[1:], k, v, out, nil, 2, nil},
		{attn.ErrShape, q, k, v[1:], out, nil, 2, nil},
		{attn.ErrShape, q, k, v, nil, nil, 2, nil},
		{attn.ErrShape, q, k, v, out, make([]float32, 3), 2, nil},
		{attn.ErrInput, q, k, v, out, nil, 2, []int{3, 0}},
		{attn.ErrShape, q, k, v, out, nil, 2, []int{1}},
		{attn.ErrInput, nil, nil, nil, nil, nil, 0, nil},
	} {
		if err := dec.Step(ctx, c.q, c.k, c.v, c.n, c.valid, c.out, c.lse); !errors.Is(err, c.err) {
			t.Errorf("bad step: %v, want %v", err, c.err)
		}
	}
	if dec.Len(0) != 30 || dec.Len(1) != 12 || dec.Bytes() != bytes {
		t.Fatalf("failed steps changed the state: Len %d, %d, Bytes %d (was %d)", dec.Len(0), dec.Len(1), dec.Bytes(), bytes)
	}
	// The rest of the context, then one past it.
	var want [][]float32
	for i := range 10 {
		o, err := run(dec, ctx, 1, nil, uint64(10+i))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, o)
	}
	if _, err := run(dec, ctx, 1, []int{1, 0}, 20); !errors.Is(err, attn.ErrFull) {
		t.Errorf("step at MaxLen: %v, want ErrFull", err)
	}
	// A cancelled step in between changed nothing: a fresh decoder gives
	// the same bits, and so does this one after Reset.
	for _, d := range []attn.Decoder{newDec(cfg), dec} {
		d.Reset()
		if d.Len(0) != 0 || d.Len(1) != 0 {
			t.Fatal("Reset left positions")
		}
		if _, err := run(d, ctx, 30, []int{30, 12}, 1); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			o, err := run(d, ctx, 1, nil, uint64(10+i))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o, want[i]) {
				t.Fatalf("step %d after the prompt differs from the first run", i)
			}
		}
	}
	// A step cancelled part way (its context ends after c checks) leaves
	// the sequences as they were: the run goes on as if it had not been.
	for c := 1; c <= 6; c++ {
		for _, n := range []int{1, 3} {
			d := newDec(cfg)
			if _, err := run(d, ctx, 30, []int{30, 12}, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := run(d, newCountdown(ctx, c), n, nil, 5); err == nil {
				continue
			}
			if d.Len(0) != 30 || d.Len(1) != 12 {
				t.Fatalf("a step of %d cancelled after %d checks left Len %d, %d", n, c, d.Len(0), d.Len(1))
			}
			for i := range 10 {
				o, err := run(d, ctx, 1, nil, uint64(10+i))
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(o, want[i]) {
					t.Fatalf("step %d after a step of %d cancelled after %d checks differs", i, n, c)
				}
			}
		}
	}
	// Append then single steps: the single steps as after a Step.
	ap := newDec(cfg).(attn.Appender)
	_, k, v = inputs(30, 1)
	if err := ap.Append(ctx, k, v, 30, []int{30, 12}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		o, err := run(ap.(attn.Decoder), ctx, 1, nil, uint64(10+i))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(o, want[i]) {
			t.Fatalf("step %d after an append differs from after a step", i)
		}
	}
}

// countdown is a context that ends after left calls of Err.
// Workers call Err concurrently.
type countdown struct {
	context.Context
	left atomic.Int64
}

func newCountdown(ctx context.Context, left int) *countdown {
	c := &countdown{Context: ctx}
	c.left.Store(int64(left))
	return c
}

func (c *countdown) Err() error {
	if c.left.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// BenchStep times decode steps of m's decoder, its keys and values in
// storage (as attn.DecodeConfig's Storage), at n cached positions
// against steps of the exact float32 KV cache at the same length, in the
// same run (H = 32, Hkv = 8, D = 128, B = 1, the caches filled by
// Append), and reports the median step of each and the ratio of the
// medians (speedup). Each iteration steps the two decoders in turn,
// stepsPerIter times each: a median of a few steps shrugs off the
// stalls of a shared machine that one step would report. Each step has
// a query of its own, as a generated token does: with one query for
// every step, a decoder that reads the rows its query picks could find
// them in cache from the step before.
func BenchStep(b *testing.B, m attn.Decodable, n int, storage string) {
	const stepsPerIter = 5
	cfg := attn.DecodeConfig{B: 1, H: 32, HKV: 8, D: 128}
	sc := cfg
	sc.Storage = storage
	sparse, err := m.NewDecoder(sc)
	if err != nil {
		b.Fatal(err)
	}
	exact, err := kvcache.NewDecoder(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	const chunk = 4096
	for at := 0; at < n; at += chunk {
		c := min(chunk, n-at)
		k, v := ref.Normal(rng, cfg.HKV*c*cfg.D), ref.Normal(rng, cfg.HKV*c*cfg.D)
		if err := sparse.(attn.Appender).Append(ctx, k, v, c, nil); err != nil {
			b.Fatal(err)
		}
		if err := exact.Append(ctx, k, v, c, nil); err != nil {
			b.Fatal(err)
		}
	}
	const pool = 64 // queries, taken in turn: more than the steps of a usual run
	qs := ref.Normal(rng, pool*cfg.H*cfg.D)
	k, v := ref.Normal(rng, cfg.HKV*cfg.D), ref.Normal(rng, cfg.HKV*cfg.D)
	out, lse := make([]float32, cfg.H*cfg.D), make([]float32, cfg.H)
	query := func(i int) []float32 { i %= pool; return qs[i*cfg.H*cfg.D : (i+1)*cfg.H*cfg.D] }
	step := func(d attn.Decoder, q []float32) time.Duration {
		start := time.Now()
		if err := d.Step(ctx, q, k, v, 1, nil, out, lse); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	// Outside the timing: the scratch, and the caches' growth past the
	// filled length.
	step(sparse, query(0))
	step(exact, query(0))
	var ts, te []time.Duration
	for i := 1; b.Loop(); {
		for range stepsPerIter {
			// The two decoders step with the same query.
			ts = append(ts, step(sparse, query(i)))
			te = append(te, step(exact, query(i)))
			i++
		}
	}
	median := func(x []time.Duration) float64 {
		slices.Sort(x)
		return float64(x[len(x)/2].Nanoseconds())
	}
	ms, me := median(ts), median(te)
	b.ReportMetric(ms, "sparse-ns/step")
	b.ReportMetric(me, "exact-ns/step")
	b.ReportMetric(me/ms, "speedup")
}
