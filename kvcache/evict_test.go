package kvcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/ref"
)

// heldRows returns what head bh of an evicting cache holds: each row's
// position and its key and value read back (dequantised, rotated back).
func heldRows(c *Cache, bh int) (pos []int, k, v [][]float32) {
	d := c.cfg.D
	for s := range c.ev.held {
		row := bh*c.cap + s
		kr, vr := make([]float32, d), make([]float32, d)
		c.readRow(kr, false, row*c.stride)
		c.readRow(vr, true, row*c.stride)
		c.unrotate(kr)
		c.unrotate(vr)
		pos = append(pos, c.ev.pos[row])
		k, v = append(k, kr), append(v, vr)
	}
	return pos, k, v
}

// checkEvictInvariants checks an evicting cache after a step: every head
// holds the same number of distinct past positions, every sink and every
// position of the window among them, and Sinks+Window+Keep once that many
// came (more during a SnapKV prompt).
func checkEvictInvariants(t *testing.T, name string, c *Cache) {
	t.Helper()
	cfg := c.cfg
	bound := min(c.n, cfg.Sinks+cfg.Window+cfg.Keep)
	if c.ev.held != bound && !(c.ev.prompt && c.ev.held > bound && c.ev.held <= c.n) {
		t.Fatalf("%s: holds %d rows after %d positions, want %d (SnapKV prompt: %v)", name, c.ev.held, c.n, bound, c.ev.prompt)
	}
	for bh := range cfg.B * cfg.HKV {
		pos := slices.Clone(c.ev.pos[bh*c.cap:][:c.ev.held])
		slices.Sort(pos)
		for i, p := range pos {
			if p < 0 || p >= c.n || (i > 0 && pos[i-1] == p) {
				t.Fatalf("%s: head %d holds positions %v", name, bh, pos)
			}
		}
		for p := range c.n {
			if (p < cfg.Sinks || p >= c.n-cfg.Window) && !slices.Contains(pos, p) {
				t.Fatalf("%s: head %d dropped position %d (sinks %d, window %d, length %d)", name, bh, p, cfg.Sinks, cfg.Window, c.n)
			}
		}
	}
}

// evictRef is the float64 reference of a step of queries [t0, t1) of sq
// against an evicting cache c before it: each query head sees what its
// KV head holds (read back) and the chunk causally, in float32.
func evictRef(c *Cache, sq seq, t0, t1 int) (out, lse []float64) {
	s := sq.s
	b, h, hkv, d := s.B, s.H, s.HKV, s.D
	n := t1 - t0
	rs := attn.Shape{B: b, H: h, HKV: hkv, N: n, M: t1, D: d}
	k, v := make([]float32, rs.KVLen()), make([]float32, rs.KVLen())
	mask := make([]bool, b*h*n*t1)
	for bh := range b * hkv {
		pos, kr, vr := heldRows(c, bh)
		for i, p := range pos {
			copy(k[(bh*t1+p)*d:][:d], kr[i])
			copy(v[(bh*t1+p)*d:][:d], vr[i])
		}
		copy(k[(bh*t1+t0)*d:][:n*d], sq.k[(bh*s.M+t0)*d:][:n*d])
		copy(v[(bh*t1+t0)*d:][:n*d], sq.v[(bh*s.M+t0)*d:][:n*d])
		bb, kvh := bh/hkv, bh%hkv
		for r := range h / hkv {
			hd := bb*h + kvh*(h/hkv) + r
			for i := range n {
				m := mask[(hd*n+i)*t1:][:t1]
				for _, p := range pos {
					m[p] = true
				}
				for j := t0; j <= t0+i; j++ {
					m[j] = true
				}
			}
		}
	}
	out, lse, err := ref.Attention(rs, sq.slice(sq.q, h, t0, t1), k, v, ref.Spec{Mask: mask})
	if err != nil {
		panic(err)
	}
	return out, lse
}

// randomChunks returns chunk sizes summing to n: prompts of up to max
// positions, and single positions.
func randomChunks(rng *rand.Rand, n, most int) []int {
	var ch []int
	for n > 0 {
		m := 1
		if rng.IntN(4) == 0 {
			m = 1 + rng.IntN(most)
		}
		m = min(m, n)
		ch = append(ch, m)
		n -= m
	}
	return ch
}

// TestEvictStreams feeds random streams (prompts and single positions,
// through Step and Append, with explicit compressions) to evicting caches
// of both policies, every element type, with and without rotation, for
// groups of 3 query heads (streaming kernels) and 20 (the fused one), in
// batches of 2. After every call the cache must keep every sink and the
// window and hold its bound (checkEvictInvariants); every Step's output
// must be attention over what each head held before it and the chunk's
// own keys (evictRef).
func TestEvictStreams(t *testing.T) {
	rng := ref.FreshRNG(t, 40)
	for _, policy := range []Policy{H2O, SnapKV} {
		for _, dt := range []DType{F32, BF16, F16, I8, I4} {
			for _, sh := range []struct{ h, hkv, d int }{{6, 2, 20}, {20, 1, 36}} {
				rot := rng.IntN(2) == 0
				cfg := Config{B: 2, HKV: sh.hkv, D: sh.d, DType: dt, Rotate: rot, Evict: policy,
					Window: 1 + rng.IntN(12), Sinks: rng.IntN(4), Keep: 1 + rng.IntN(20)}
				name := fmt.Sprintf("%+v g=%d", cfg, sh.h/sh.hkv)
				const n = 160
				sq := newSeq(rng, 2, sh.h, sh.hkv, n, sh.d)
				c, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				t0 := 0
				for _, m := range randomChunks(rng, n, 40) {
					t1 := t0 + m
					k, v := sq.slice(sq.k, sh.hkv, t0, t1), sq.slice(sq.v, sh.hkv, t0, t1)
					switch r := rng.IntN(8); {
					case r == 0:
						if err := c.Append(k, v, m); err != nil {
							t.Fatal(err)
						}
					default:
						if r == 1 {
							if err := c.Compress(context.Background(), 2); err != nil {
								t.Fatal(err)
							}
							checkEvictInvariants(t, name+" compressed", c)
						}
						if m == 1 { // what Step does first
							if err := c.compressPrompt(context.Background(), 0); err != nil {
								t.Fatal(err)
							}
						}
						wantOut, wantLSE := evictRef(c, sq, t0, t1)
						out := make([]float32, 2*sh.h*m*sh.d)
						lse := make([]float32, 2*sh.h*m)
						if err := c.Step(context.Background(), sh.h, sq.slice(sq.q, sh.h, t0, t1), k, v, m, attn.Options{Workers: 3}, out, lse); err != nil {
							t.Fatal(err)
						}
						if e := ref.RelErr(out, wantOut); e > storedTol(cfg.DType, 2e-5) {
							t.Fatalf("%s: step [%d, %d): out rel err %.3g", name, t0, t1, e)
						}
						if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > storedTol(cfg.DType, 2e-5) {
							t.Fatalf("%s: step [%d, %d): lse rel err %.3g %v", name, t0, t1, e, err)
						}
					}
					t0 = t1
					checkEvictInvariants(t, fmt.Sprintf("%s after %d", name, t0), c)
				}
			}
		}
	}
}

// plantSeq returns a sequence in which the positions hits get much of
// the attention of every query in qs (their queries and its key share
// the direction u, strongly: a logit of 24/√D against Gaussian ones of
// about 0.3), the others being Gaussian.
func plantSeq(rng *rand.Rand, h, hkv, n, d int, hits []int, qs func(p int) bool, u []float32) seq {
	sq := newSeq(rng, 1, h, hkv, n, d)
	for hd := range h {
		for p := range n {
			if qs(p) {
				for i := range d {
					sq.q[(hd*n+p)*d+i] = 0.3*sq.q[(hd*n+p)*d+i] + 3*u[i]
				}
			}
		}
	}
	for kv := range hkv {
		for _, p := range hits {
			for i := range d {
				sq.k[(kv*n+p)*d+i] = 8 * u[i]
			}
		}
	}
	return sq
}

// unit returns a random unit vector of d.
func unit(rng *rand.Rand, d int) []float32 {
	u := ref.Normal(rng, d)
	var s float64
	for _, x := range u {
		s += float64(x) * float64(x)
	}
	for i := range u {
		u[i] /= float32(math.Sqrt(s))
	}
	return u
}

// TestH2OKeepsHeavyHitter decodes one position at a time a sequence in
// which a position gets much of every later query's attention: H2O must
// keep it in every head long after it left the window, while the
// positions around it, which no query favours, are gone. (Scored alike,
// ties evicting the older first, it would have left before them; the
// first positions, which the first queries attended among few, keep
// their share.)
func TestH2OKeepsHeavyHitter(t *testing.T) {
	rng := ref.FreshRNG(t, 41)
	const h, hkv, n, d, hit = 8, 2, 300, 32, 100
	for _, dt := range []DType{F32, I4} {
		sq := plantSeq(rng, h, hkv, n, d, []int{hit}, func(p int) bool { return p > hit }, unit(rng, d))
		c, _ := New(Config{B: 1, HKV: hkv, D: d, DType: dt, Rotate: dt == I4, Evict: H2O, Window: 16, Sinks: 2, Keep: 8})
		for p := range n {
			out := make([]float32, h*d)
			if err := c.Step(context.Background(), h, sq.slice(sq.q, h, p, p+1), sq.slice(sq.k, hkv, p, p+1), sq.slice(sq.v, hkv, p, p+1),
				1, attn.Options{}, out, nil); err != nil {
				t.Fatal(err)
			}
		}
		if !c.Holds(hit) {
			t.Errorf("%v: the heavy hitter at %d was evicted", dt, hit)
		}
		for p := hit - 30; p < hit+30; p++ {
			if p != hit && c.Holds(p) {
				t.Errorf("%v: position %d, which no query favours, is still held", dt, p)
			}
		}
	}
}

// TestSnapKVKeepsObserved compresses a prompt whose observation window
// (its last queries) attends to two positions, while every earlier query
// attends to a third: SnapKV must keep the two and their pooled
// neighbours, and drop the third, which H2O, summing every query's
// attention, keeps.
func TestSnapKVKeepsObserved(t *testing.T) {
	rng := ref.FreshRNG(t, 42)
	const h, hkv, n, d, w = 8, 2, 200, 32, 16
	observed, early := []int{50, 120}, 30
	u1, u2 := unit(rng, d), unit(rng, d)
	sq := plantSeq(rng, h, hkv, n, d, observed, func(p int) bool { return p >= n-w }, u1)
	// The early queries and position 30 share u2.
	for hd := range h {
		for p := early + 1; p < n-w; p++ {
			for i := range d {
				sq.q[(hd*n+p)*d+i] = 0.3*sq.q[(hd*n+p)*d+i] + 3*u2[i]
			}
		}
	}
	for kv := range hkv {
		for i := range d {
			sq.k[(kv*n+early)*d+i] = 8 * u2[i]
		}
	}
	for _, policy := range []Policy{SnapKV, H2O} {
		for _, dt := range []DType{F32, I8, I4} {
			c, _ := New(Config{B: 1, HKV: hkv, D: d, DType: dt, Evict: policy, Window: w, Sinks: 2, Keep: 16})
			out := make([]float32, h*n*d)
			if err := c.Step(context.Background(), h, sq.q, sq.k, sq.v, n, attn.Options{}, out, nil); err != nil {
				t.Fatal(err)
			}
			if err := c.Compress(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
			checkEvictInvariants(t, fmt.Sprintf("%v %v", policy, dt), c)
			if policy == SnapKV {
				for _, x := range observed {
					for p := x - snapPool/2; p <= x+snapPool/2; p++ {
						if !c.Holds(p) {
							t.Errorf("SnapKV %v: position %d, observed or its neighbour, was dropped", dt, p)
						}
					}
				}
			}
			if c.Holds(early) == (policy == SnapKV) {
				t.Errorf("%v %v: holds %d, attended before the observation window: %v", policy, dt, early, c.Holds(early))
			}
		}
	}
}

// TestEvictDeterminism checks that what evicting caches output and hold
// does not depend on the worker count, bit for bit.
func TestEvictDeterminism(t *testing.T) {
	rng := ref.FreshRNG(t, 43)
	sq := newSeq(rng, 1, 8, 2, 400, 40)
	chunks := []int{150, 1, 1, 60}
	for _, policy := range []Policy{H2O, SnapKV} {
		for _, dt := range []DType{F32, I4} {
			cfg := Config{B: 1, HKV: 2, D: 40, DType: dt, Rotate: true, Evict: policy, Window: 20, Sinks: 3, Keep: 30}
			var first []float32
			for _, w := range []int{1, 2, 3, 7} {
				got := decodeAll(t, sq, cfg, chunks, w)
				if first == nil {
					first = got
					continue
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
						t.Fatalf("%v %v: %d workers: output %d = %v, with 1 worker %v", policy, dt, w, i, got[i], first[i])
					}
				}
			}
		}
	}
}

// TestEvictDecoder runs evicting decoders through attn.DecodeConfig on a
// ragged batch: each sequence's outputs must be those of a decoder of
// that sequence alone, bit for bit, and Bytes must count the bound.
func TestEvictDecoder(t *testing.T) {
	rng := ref.FreshRNG(t, 44)
	const b, h, hkv, d, chunk = 2, 4, 2, 24, 40
	for _, ev := range []string{"h2o", "snapkv"} {
		cfg := attn.DecodeConfig{B: b, H: h, HKV: hkv, D: d, Workers: 2, Storage: "i4+rot", Window: 8, Sinks: 2, Evict: ev, Keep: 10}
		dec, err := NewDecoder(cfg)
		if err != nil {
			t.Fatal(err)
		}
		one := cfg
		one.B = 1
		solo := make([]*Decoder, b)
		for i := range solo {
			solo[i], _ = NewDecoder(one)
		}
		valid := []int{chunk, 25}
		steps := []struct {
			n     int
			valid []int
		}{{chunk, valid}, {1, nil}, {1, []int{1, 0}}, {5, []int{5, 3}}, {1, nil}, {1, nil}}
		for si, st := range steps {
			q, k, v := ref.Normal(rng, b*h*st.n*d), ref.Normal(rng, b*hkv*st.n*d), ref.Normal(rng, b*hkv*st.n*d)
			out, lse := make([]float32, b*h*st.n*d), make([]float32, b*h*st.n)
			if err := dec.Step(context.Background(), q, k, v, st.n, st.valid, out, lse); err != nil {
				t.Fatal(err)
			}
			for i := range b {
				m := st.n
				if st.valid != nil {
					m = st.valid[i]
				}
				if m == 0 {
					continue
				}
				pick := func(x []float32, heads int) []float32 {
					var y []float32
					for hd := range heads {
						y = append(y, x[((i*heads+hd)*st.n)*d:][:m*d]...)
					}
					return y
				}
				o1 := make([]float32, h*m*d)
				if err := solo[i].Step(context.Background(), pick(q, h), pick(k, hkv), pick(v, hkv), m, nil, o1, nil); err != nil {
					t.Fatal(err)
				}
				got := pick(out, h)
				for j := range o1 {
					if math.Float32bits(o1[j]) != math.Float32bits(got[j]) {
						t.Fatalf("%s step %d sequence %d: output %d = %v, alone %v", ev, si, i, j, got[j], o1[j])
					}
				}
				if dec.Len(i) != solo[i].Len(0) {
					t.Fatalf("%s: Len(%d) = %d, alone %d", ev, i, dec.Len(i), solo[i].Len(0))
				}
			}
		}
		// H2O's rows are its bound; SnapKV's grew for the prompt.
		c := dec.Cache(0)
		if c.Held() != 2+8+10 || (ev == "h2o") != (c.cap == 20) {
			t.Errorf("%s: holds %d rows of %d", ev, c.Held(), c.cap)
		}
		if err := dec.Compress(context.Background()); err != nil {
			t.Error(err)
		}
	}
}

// TestEvictErrors checks the configurations and calls an evicting cache
// refuses.
func TestEvictErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Evict: H2O, Keep: 4},   // no window
		{Evict: H2O, Window: 4}, // no Keep
		{Keep: 4, Window: 4},    // Keep without a policy
		{Evict: SnapKV + 1, Window: 4, Keep: 1},
		{Evict: H2O, Window: 4, Keep: -1},
		{Evict: H2O, Window: 4, Keep: min(1<<50, math.MaxInt)},
	} {
		cfg.B, cfg.HKV, cfg.D = 1, 1, 4
		if _, err := New(cfg); !errors.Is(err, attn.ErrInput) {
			t.Errorf("New(%+v): %v, want ErrInput", cfg, err)
		}
	}
	for _, cfg := range []attn.DecodeConfig{
		{Evict: "h2o", Keep: 4},
		{Evict: "h2o", Window: 4},
		{Keep: 4, Window: 4},
		{Evict: "lru", Window: 4, Keep: 1},
		{Evict: "h2o", Window: 4, Keep: -1},
	} {
		cfg.B, cfg.H, cfg.HKV, cfg.D = 1, 1, 1, 4
		if err := cfg.Validate(); !errors.Is(err, attn.ErrInput) {
			t.Errorf("Validate(%+v): %v, want ErrInput", cfg, err)
		}
	}
	if _, err := ParsePolicy("lru"); !errors.Is(err, attn.ErrInput) {
		t.Errorf("ParsePolicy(lru): %v", err)
	}
	for _, p := range []Policy{NoEvict, H2O, SnapKV} {
		if got, err := ParsePolicy(p.String()); got != p || err != nil {
			t.Errorf("ParsePolicy(%q) = %v, %v", p.String(), got, err)
		}
	}
	c, _ := New(Config{B: 1, HKV: 1, D: 4, Evict: H2O, Window: 4, Keep: 2})
	x := make([]float32, 12)
	if err := c.Append(x, x, 3); err != nil {
		t.Fatal(err)
	}
	if err := c.Read(x[:4], x[4:8], 0, 1); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("Read: %v", err)
	}
	if err := c.AttendRanges(context.Background(), 1, x[:4], 2, []flash.Range{{Lo: 0, Hi: 1, Full: true}}, nil, attn.Options{}, x[4:8], nil); !errors.Is(err, attn.ErrUnsupported) {
		t.Errorf("AttendRanges: %v", err)
	}
	if err := c.Compress(context.Background(), -1); err != nil {
		t.Errorf("Compress of H2O: %v", err) // nothing to do
	}
}
