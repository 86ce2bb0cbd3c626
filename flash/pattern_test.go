package flash

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
)

// maskPattern is a pattern given by an arbitrary visibility table over
// absolute positions; its ranges are derived from the table, so they are
// sometimes Full and sometimes not.
type maskPattern struct {
	shift, m int
	vis      [][]bool // [query index][key]
}

func (mp *maskPattern) Visible(p, j int) bool { return mp.vis[p-mp.shift][j] }

func (mp *maskPattern) KeyRanges(dst []Range, p0, p1, m int) []Range {
	for j := 0; j < m; {
		any := func(j int) bool {
			for p := p0; p < p1; p++ {
				if mp.Visible(p, j) {
					return true
				}
			}
			return false
		}
		if !any(j) {
			j++
			continue
		}
		r := Range{Lo: j, Full: true}
		for ; j < m && any(j); j++ {
			for p := p0; p < p1; p++ {
				r.Full = r.Full && mp.Visible(p, j)
			}
		}
		r.Hi = j
		dst = append(dst, r)
	}
	return dst
}

func TestPattern(t *testing.T) {
	rng := ref.FreshRNG(t, 6)
	for c, dims := range [][2]int{{70, 130}, {130, 70}, {1, 200}, {97, 97}} {
		n, m := dims[0], dims[1]
		s := attn.Shape{B: 2, H: 4, HKV: 2, N: n, M: m, D: 19}
		// Bands of visible keys with holes: some tiles empty, some full,
		// some mixed.
		mp := &maskPattern{shift: m - n, m: m, vis: make([][]bool, n)}
		width := 1 + rng.IntN(m)
		for i := range mp.vis {
			mp.vis[i] = make([]bool, m)
			p := m - n + i
			for j := range m {
				mp.vis[i][j] = (j <= p && j > p-width) || (j%37 < 5 && rng.IntN(4) > 0)
			}
		}
		for _, causal := range []bool{false, true} {
			o := attn.Options{Causal: causal, KVLen: []int{m, rng.IntN(m + 1)}}
			q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
			mask := ref.Mask(s, o)
			for b := range s.B {
				for i := range n {
					for j := range m {
						mask[(b*n+i)*m+j] = mask[(b*n+i)*m+j] && mp.vis[i][j]
					}
				}
			}
			wantOut, wantLSE, err := ref.Attention(s, q, k, v, ref.Spec{Mask: mask})
			if err != nil {
				t.Fatal(err)
			}
			for _, kn := range kernels {
				out := make([]float32, s.QLen())
				lse := make([]float32, s.LSELen())
				if err := kn.ForwardPattern(context.Background(), s, q, k, v, o, mp, out, lse); err != nil {
					t.Fatal(err)
				}
				if e := ref.RelErr(out, wantOut); e > tol {
					t.Errorf("case %d causal=%v: out rel err %.3g", c, causal, e)
				}
				if e, err := ref.LSEErr(lse, wantLSE); err != nil || e > tol {
					t.Errorf("case %d causal=%v: lse rel err %.3g %v", c, causal, e, err)
				}
			}
		}
	}
}

// rowMaskPattern is maskPattern with the RowMasker fast path.
type rowMaskPattern struct {
	*maskPattern
	calls *atomic.Int64
}

func (rp rowMaskPattern) MaskRow(p, j0 int, s []float32) {
	rp.calls.Add(1)
	for j := range s {
		if !rp.Visible(p, j0+j) {
			s[j] = negInf
		}
	}
}

// TestRowMasker checks that the row fast path gives what Visible gives.
func TestRowMasker(t *testing.T) {
	rng := ref.FreshRNG(t, 11)
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 90, M: 140, D: 24}
	mp := &maskPattern{shift: s.M - s.N, m: s.M, vis: make([][]bool, s.N)}
	for i := range mp.vis {
		mp.vis[i] = make([]bool, s.M)
		for j := range s.M {
			mp.vis[i][j] = rng.IntN(3) > 0
		}
	}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	o := attn.Options{Causal: true}
	ctx := context.Background()
	for _, kn := range kernels {
		out1, out2 := make([]float32, s.QLen()), make([]float32, s.QLen())
		if err := kn.ForwardPattern(ctx, s, q, k, v, o, mp, out1, nil); err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		if err := kn.ForwardPattern(ctx, s, q, k, v, o, rowMaskPattern{mp, &calls}, out2, nil); err != nil {
			t.Fatal(err)
		}
		if calls.Load() == 0 {
			t.Fatal("MaskRow never called")
		}
		for i := range out1 {
			if out1[i] != out2[i] {
				t.Fatalf("RowMasker path differs at %d: %v vs %v", i, out1[i], out2[i])
			}
		}
	}
}
