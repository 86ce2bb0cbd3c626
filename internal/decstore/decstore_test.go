package decstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/decstore"
	"github.com/attnkit/attn/internal/decstore/dectest"
)

// exactRule decodes by exact attention over every stored position, and
// records what Index was asked for.
type exactRule struct {
	st      *decstore.Store
	indexed []int
}

func (r *exactRule) NewScratch() []float64 { return nil }
func (r *exactRule) Reset()                { clear(r.indexed) }
func (r *exactRule) Bytes() int            { return 8 * len(r.indexed) }

func (r *exactRule) Index(_ []float64, b, kvh, n int) {
	cfg := r.st.Config()
	if n != r.st.Len(b) || n != r.st.Head(b, kvh).Len() {
		panic("Index past the committed positions")
	}
	r.indexed[b*cfg.HKV+kvh] = n
}

func (r *exactRule) Decode(sc []float64, b, kvh, p int, q, out, lse []float32) {
	cfg := r.st.Config()
	d, g := cfg.D, cfg.H/cfg.HKV
	if r.indexed[b*cfg.HKV+kvh] != p || r.st.Head(b, kvh).Len() != p+1 {
		panic("Decode without the earlier positions indexed or its own stored")
	}
	hd := r.st.Head(b, kvh)
	row := make([]float32, d)
	scale := float64(cfg.ScaleFor())
	for h := range g {
		logits := make([]float64, p+1)
		mx := math.Inf(-1)
		for j := range logits {
			var s float64
			for c := range d {
				s += float64(q[h*d+c]) * float64(hd.K(row, j)[c])
			}
			logits[j] = s * scale
			mx = max(mx, logits[j])
		}
		acc := make([]float64, d)
		var sum float64
		for j, l := range logits {
			w := math.Exp(l - mx)
			sum += w
			for c := range d {
				acc[c] += w * float64(hd.V(row, j)[c])
			}
		}
		for c := range d {
			out[h*d+c] = float32(acc[c] / sum)
		}
		lse[h] = float32(mx + math.Log(sum))
	}
}

func newExact(t *testing.T, keyGroup int) func(attn.DecodeConfig) attn.Decoder {
	return func(cfg attn.DecodeConfig) attn.Decoder {
		st, err := decstore.NewStore("exact", cfg, 1<<20, keyGroup)
		if err != nil {
			t.Fatal(err)
		}
		return decstore.New(st, &exactRule{st: st, indexed: make([]int, cfg.B*cfg.HKV)})
	}
}

// With an exact rule the decoder is exact attention for any steps, the
// prompt chunks (flash over the stored rows) included.
func TestExactRule(t *testing.T) {
	rng := dectest.FreshRNG(t, 1)
	for _, c := range []struct {
		cfg      attn.DecodeConfig
		keyGroup int
	}{
		{attn.DecodeConfig{B: 3, H: 6, HKV: 2, D: 19}, 0},
		{attn.DecodeConfig{B: 1, H: 4, HKV: 4, D: 32, Scale: -0.3}, 0},
		{attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 19, Storage: "bf16"}, 0},
		{attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 32, Storage: "f16"}, 0},
		{attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 19, Storage: "i4"}, 0},
		{attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 136, Storage: "i4"}, 0},
		{attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 72, Storage: "i4+rot"}, 0},
		{attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 19, Storage: "i8"}, 0},
		{attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 40, Storage: "i8+rot"}, 0},
		{attn.DecodeConfig{B: 1, H: 3, HKV: 1, D: 24, Storage: "bf16+rot"}, 0},
		{attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 40, Storage: "f32+rot"}, 0},
		// Keys per channel: groups completed by a prompt, by single
		// steps, and the open group read as float32.
		{attn.DecodeConfig{B: 2, H: 6, HKV: 2, D: 19, Storage: "i4"}, 5},
		{attn.DecodeConfig{B: 1, H: 4, HKV: 2, D: 72, Storage: "i4+rot"}, 5},
		{attn.DecodeConfig{B: 2, H: 4, HKV: 2, D: 24, Storage: "i4+rot"}, decstore.KeyGroup},
	} {
		cfg := c.cfg
		dectest.Run(t, newExact(t, c.keyGroup)(cfg), cfg, rng, dectest.Script(cfg.B, 41, 9), func(hs *dectest.History, st dectest.Step, before []int, out, lse []float32) {
			dectest.Compare(t, "exact rule", hs, st, before, out, lse, 2e-5, func(b, h, p int) ([]float64, float64, bool) {
				o, l := hs.Exact(b, h, p)
				return o, l, true
			})
		})
	}
}

func TestSkeleton(t *testing.T) {
	cfg := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 7}
	dectest.CheckRagged(t, newExact(t, 0), cfg, dectest.FreshRNG(t, 2), dectest.Script(cfg.B, 23, 6))
	dectest.CheckWorkers(t, newExact(t, 0), cfg, 3, dectest.Script(cfg.B, 23, 6))
	dectest.CheckState(t, newExact(t, 0), attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 5, MaxLen: 40})
	i4 := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 16, Storage: "i4+rot"}
	dectest.CheckRagged(t, newExact(t, 5), i4, dectest.FreshRNG(t, 4), dectest.Script(i4.B, 23, 6))
	dectest.CheckWorkers(t, newExact(t, 5), i4, 3, dectest.Script(i4.B, 23, 6))
	dectest.CheckState(t, newExact(t, 5), attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 5, MaxLen: 40, Storage: "i4"})
	i8 := attn.DecodeConfig{B: 3, H: 4, HKV: 2, D: 13, Storage: "i8+rot"}
	dectest.CheckRagged(t, newExact(t, 0), i8, dectest.FreshRNG(t, 5), dectest.Script(i8.B, 23, 6))
	dectest.CheckWorkers(t, newExact(t, 0), i8, 3, dectest.Script(i8.B, 23, 6))
	dectest.CheckState(t, newExact(t, 0), attn.DecodeConfig{B: 2, H: 2, HKV: 1, D: 5, MaxLen: 40, Storage: "i8"})
}

func TestNewStoreErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  attn.DecodeConfig
		want error
	}{
		{attn.DecodeConfig{B: 1, H: 3, HKV: 2, D: 4}, attn.ErrShape},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Storage: "i2"}, attn.ErrInput},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Storage: "+rot"}, attn.ErrInput},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Storage: "f8"}, attn.ErrInput},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, Window: 8}, attn.ErrUnsupported},
		{attn.DecodeConfig{B: 1, H: 2, HKV: 1, D: 4, MaxLen: 1 << 21}, attn.ErrUnsupported},
	} {
		if _, err := decstore.NewStore("test", c.cfg, 1<<20, 0); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v, want %v", c.cfg, err, c.want)
		}
	}
}

// TestHeadKernels checks the products a rule computes on a Head (DotKeys,
// AddValues, on the stored rows and on gathered ones) against float64
// products with the rows K and V read back, for every storage and D
// below, at and past a channel group and not a multiple of 8.
func TestHeadKernels(t *testing.T) {
	rng := dectest.FreshRNG(t, 3)
	for _, storage := range []string{"f32", "bf16", "f16", "i8", "i8+rot", "i4", "i4+rot", "i4/5", "i4+rot/5"} {
		for _, d := range []int{5, 24, 64, 72, 136} {
			// "/5": keys per channel over groups of 5 positions.
			storage, group, _ := strings.Cut(storage, "/")
			kg, _ := strconv.Atoi(group)
			cfg := attn.DecodeConfig{B: 1, H: 3, HKV: 1, D: d, Storage: storage}
			st, err := decstore.NewStore("test", cfg, 1<<20, kg)
			if err != nil {
				t.Fatal(err)
			}
			dec := decstore.New(st, &exactRule{st: st, indexed: make([]int, 1)})
			const n = 37
			k, v := normal(rng, n*d, 2), normal(rng, n*d, 1)
			if err := dec.Append(context.Background(), k, v, n, nil); err != nil {
				t.Fatal(err)
			}
			hd := st.Head(0, 0)
			rows := 3
			q := normal(rng, rows*d, 1)
			// With keys per channel, 35 positions quantised and 2 in
			// float32.
			j0, m := 4, n-4
			pos := []int32{30, 2, 17, 17, 0, 36}
			type head struct {
				name string
				h    *decstore.Head
				at   func(i int) int
				j, m int
				hold bool // the last position held as given (Hold)
			}
			row := make([]float32, d)
			heads := []head{{"stored", hd, func(i int) int { return j0 + i }, j0, m, false},
				{"held", hd, func(i int) int { return j0 + i }, j0, m, true}}
			// Prefetch is a hint: positions past the end are skipped.
			hd.Prefetch(append(pos, int32(n), 1<<30, -1))
			if kg == 0 {
				if got := hd.RowBytes() * n; got != 4*len(hd.KV)+2*len(hd.KV16)+len(hd.KV8)+len(hd.KV4) {
					t.Fatalf("%s D=%d: RowBytes·%d = %d, not the rows' bytes", storage, d, n, got)
				}
				var gathered, held decstore.Head
				hd.Gather(&gathered, pos)
				heads = append(heads, head{"gathered", &gathered, func(i int) int { return int(pos[i]) }, 0, len(pos), false})
				// Gathered while the last position (36, pos[5]) is held:
				// it stays held in the copy.
				hk := normal(rng, d, 2)
				hd.Hold(hk, normal(rng, d, 1))
				hd.Gather(&held, pos)
				hd.Release()
				// (Float32 rows are what they were given: Hold ignores them.)
				if got := held.K(row, 5); storage != "f32" && !slices.Equal(got, hk) {
					t.Fatalf("%s D=%d: gathered held key %v, want %v", storage, d, got[:2], hk[:2])
				}
				heads = append(heads, head{"gathered held", &held, nil, 0, len(pos), false})
			}
			for _, c := range heads {
				if c.hold {
					c.h.Hold(normal(rng, d, 2), normal(rng, d, 1))
					if storage != "f32" && slices.Equal(c.h.K(row, n-1), k[(n-1)*d:]) {
						t.Fatalf("%s D=%d: the held key is the stored one", storage, d)
					}
				}
				name := fmt.Sprintf("%s group %d D=%d %s", storage, kg, d, c.name)
				if got := c.h.Len(); c.name == "gathered" && got != len(pos) {
					t.Fatalf("%s: Len %d, want %d", name, got, len(pos))
				}
				s := make([]float32, rows*c.m)
				c.h.DotKeys(s, c.m, q, d, rows, c.j, c.m, 0, 0)
				p := normal(rng, rows*c.m, 1)
				acc := normal(rng, rows*d, 1)
				want := make([]float64, rows*d)
				for i, x := range acc {
					want[i] = float64(x)
				}
				c.h.AddValues(p, c.m, rows, c.j, c.m, acc, make([]float32, d), 0, 0)
				// Row i of the range as read back: from hd at its
				// position, or from the gathered head itself.
				rowOf := func(i int, value bool) []float32 {
					h, j := hd, 0
					if c.at == nil {
						h, j = c.h, i
					} else {
						j = c.at(i)
					}
					if value {
						return h.V(row, j)
					}
					return h.K(row, j)
				}
				for r := range rows {
					for i := range c.m {
						var dot, mag float64
						for ch, x := range rowOf(i, false) {
							dot += float64(q[r*d+ch]) * float64(x)
							mag += math.Abs(float64(q[r*d+ch]) * float64(x))
						}
						if e := math.Abs(float64(s[r*c.m+i]) - dot); e > 1e-5*mag+1e-6 {
							t.Fatalf("%s: score [%d][%d] = %v, want %v", name, r, i, s[r*c.m+i], dot)
						}
						var sq float64
						for _, x := range rowOf(i, false) {
							sq += float64(x) * float64(x)
						}
						if got := c.h.KeyNorm(row, c.j+i); math.Abs(got-math.Sqrt(sq)) > 1e-5*math.Sqrt(sq) {
							t.Fatalf("%s: key %d norm %v, want %v", name, i, got, math.Sqrt(sq))
						}
						for ch, x := range rowOf(i, true) {
							want[r*d+ch] += float64(p[r*c.m+i]) * float64(x)
						}
					}
				}
				for i, w := range want {
					if e := math.Abs(float64(acc[i]) - w); e > 1e-4 {
						t.Fatalf("%s: acc[%d] = %v, want %v", name, i, acc[i], w)
					}
				}
				c.h.Release()
			}
		}
	}
}

func normal(rng *rand.Rand, n int, sd float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64()) * sd
	}
	return x
}
