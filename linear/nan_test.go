package linear

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/attnkit/attn"
)

// TestNonFinitePropagates puts a NaN or an infinity into one query row, or
// into one key or value row, and checks that exactly the rows that use it
// become NaN, in out and in lse, and that every other row keeps its value:
// rows that do not see the key, rows of other heads, padding keys.
func TestNonFinitePropagates(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(41, seed))
	bads := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}
	for _, a := range []*Attention{New(Config{Chunk: 16}), New(Config{Map: expMap{}, Chunk: 7})} {
		for _, causal := range []bool{false, true} {
			s := attn.Shape{B: 2, H: 4, HKV: 2, N: 45, M: 70, D: 13}
			o := attn.Options{Causal: causal, KVLen: []int{s.M, 20 + rng.IntN(s.M-20)}, Workers: 1 + rng.IntN(3)}
			q, k, v := inputs(rng, s)
			out0, lse0 := forward(t, a, s, q, k, v, o)
			for trial := range 12 {
				x := bads[trial%len(bads)]
				b, h := rng.IntN(s.B), rng.IntN(s.H)
				kvh := h / s.Group()
				// uses(b, h, i) reports whether row i of head h of batch b
				// uses the bad element.
				var uses func(bb, hh, i int) bool
				var tensor []float32
				var at int
				var what string
				switch trial % 4 {
				case 0: // a query row
					i := rng.IntN(s.N)
					tensor, at, what = q, ((b*s.H+h)*s.N+i)*s.D+rng.IntN(s.D), fmt.Sprintf("q row %d", i)
					uses = func(bb, hh, ii int) bool {
						return bb == b && hh == h && ii == i && o.VisibleKeys(s, bb, ii) > 0
					}
				case 1, 2: // a visible key or value
					j := rng.IntN(o.KVLen[b])
					tensor, what = k, fmt.Sprintf("k row %d", j)
					if trial%4 == 2 {
						tensor, what = v, fmt.Sprintf("v row %d", j)
					}
					at = ((b*s.HKV+kvh)*s.M+j)*s.D + rng.IntN(s.D)
					uses = func(bb, hh, ii int) bool {
						return bb == b && hh/s.Group() == kvh && o.VisibleKeys(s, bb, ii) > j
					}
				case 3: // a padding key
					j := o.KVLen[1] + rng.IntN(s.M-o.KVLen[1])
					b, kvh = 1, rng.IntN(s.HKV)
					tensor, at, what = k, ((b*s.HKV+kvh)*s.M+j)*s.D, fmt.Sprintf("padding k row %d", j)
					if rng.IntN(2) == 0 {
						tensor = v
					}
					uses = func(int, int, int) bool { return false }
				}
				name := fmt.Sprintf("%T %s: %v in %s of batch %d kv head %d", a.fm, fmtCase(s, o), x, what, b, kvh)
				old := tensor[at]
				tensor[at] = x
				out, lse := forward(t, a, s, q, k, v, o)
				tensor[at] = old
				for bb := range s.B {
					for hh := range s.H {
						for i := range s.N {
							row := (bb*s.H+hh)*s.N + i
							o, o0 := out[row*s.D:][:s.D], out0[row*s.D:][:s.D]
							if uses(bb, hh, i) {
								if !isNaN(lse[row]) || !allNaN(o) {
									t.Fatalf("%s: row %d of head %d of batch %d uses it but has lse %v out %v", name, i, hh, bb, lse[row], o)
								}
								continue
							}
							if !sameRow(o, o0) || !(lse[row] == lse0[row] || lse[row] < negInf+1 && lse0[row] < negInf+1) {
								t.Fatalf("%s: row %d of head %d of batch %d does not use it but changed: lse %v -> %v",
									name, i, hh, bb, lse0[row], lse[row])
							}
						}
					}
				}
			}
		}
	}
}

// TestStateNonFinite: the recurrent state gives NaN from a non-finite key
// on, and for a non-finite query row.
func TestStateNonFinite(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(42, seed))
	for _, a := range []*Attention{New(Config{}), New(Config{Map: expMap{}})} {
		st, err := a.NewState(2, 2, 1, 5, 0)
		if err != nil {
			t.Fatal(err)
		}
		out, lse := make([]float32, 2*2*5), make([]float32, 2*2)
		for step := range 6 {
			k, v, q := randn(rng, 2*5), randn(rng, 2*5), randn(rng, 2*2*5)
			if step == 2 {
				v[5+3] = float32(math.Inf(1)) // batch row 1 from here on
			}
			if step == 4 {
				q[2*5] = float32(math.NaN()) // batch row 1, head 0: row 1 is NaN anyway
				q[1] = float32(math.NaN())   // batch row 0, head 0
			}
			if err := st.Append(k, v, 1, nil); err != nil {
				t.Fatal(err)
			}
			if err := st.Attend(q, out, lse); err != nil {
				t.Fatal(err)
			}
			for row := range 4 {
				want := (row >= 2 && step >= 2) || (row == 0 && step == 4)
				if got := isNaN(lse[row]) && allNaN(out[row*5:][:5]); got != want {
					t.Errorf("%T step %d row %d: NaN = %v, want %v (lse %v)", a.fm, step, row, got, want, lse[row])
				}
			}
		}
		st.Reset()
		if err := st.Append(randn(rng, 10), randn(rng, 10), 1, nil); err != nil {
			t.Fatal(err)
		}
		if err := st.Attend(randn(rng, 20), out, lse); err != nil {
			t.Fatal(err)
		}
		for row, l := range lse {
			if isNaN(l) {
				t.Errorf("%T: row %d still NaN after Reset", a.fm, row)
			}
		}
	}
}

func randn(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

func isNaN(x float32) bool { return x != x }

func allNaN(x []float32) bool {
	for _, v := range x {
		if !isNaN(v) {
			return false
		}
	}
	return true
}

// sameRow reports whether a and b are equal element by element (a zero's
// sign aside), with no NaN.
func sameRow(a, b []float32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
