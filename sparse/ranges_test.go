package sparse

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/attnkit/attn/flash"
)

func TestAppendRanges(t *testing.T) {
	r := func(lo, hi int, full bool) flash.Range { return flash.Range{Lo: lo, Hi: hi, Full: full} }
	for _, c := range []struct {
		cands, want []flash.Range
	}{
		{nil, nil},
		{[]flash.Range{r(5, 5, true), r(-3, 0, false), r(100, 120, true)}, nil},
		{[]flash.Range{r(-10, 200, false)}, []flash.Range{r(0, 100, false)}},
		{[]flash.Range{r(10, 50, false), r(20, 30, true)}, []flash.Range{r(10, 20, false), r(20, 30, true), r(30, 50, false)}},
		{[]flash.Range{r(20, 30, true), r(30, 40, true), r(35, 45, true)}, []flash.Range{r(20, 45, true)}},
		{[]flash.Range{r(60, 70, false), r(0, 10, true), r(5, 20, false)}, []flash.Range{r(0, 10, true), r(10, 20, false), r(60, 70, false)}},
		{[]flash.Range{r(0, 10, false), r(10, 20, false), r(90, 130, true)}, []flash.Range{r(0, 20, false), r(90, 100, true)}},
		{[]flash.Range{r(0, 40, false), r(5, 10, true), r(20, 25, true), r(38, 60, true)}, []flash.Range{r(0, 5, false), r(5, 10, true), r(10, 20, false), r(20, 25, true), r(25, 38, false), r(38, 60, true)}},
	} {
		got := appendRanges([]flash.Range{r(-1, -1, false)}, slices.Clone(c.cands), 100)
		if !slices.Equal(got[1:], c.want) || got[0] != r(-1, -1, false) {
			t.Errorf("appendRanges(%v) = %v, want %v", c.cands, got[1:], c.want)
		}
	}
}

func TestFloorDiv(t *testing.T) {
	for _, c := range [][4]int{{7, 3, 2, 1}, {-7, 3, -3, 2}, {-6, 3, -2, 0}, {0, 5, 0, 0}, {-1, 64, -1, 63}} {
		if q, m := floorDiv(c[0], c[1]), floorMod(c[0], c[1]); q != c[2] || m != c[3] {
			t.Errorf("floorDiv/Mod(%d, %d) = %d, %d, want %d, %d", c[0], c[1], q, m, c[2], c[3])
		}
	}
}

// TestWindowMaskRow checks MaskRow against Visible.
func TestWindowMaskRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, freshSeed(t)))
	for range 2000 {
		w := Window{Left: rng.IntN(100), Right: rng.IntN(100), Dilation: rng.IntN(5)}
		if rng.IntN(4) == 0 {
			w.Right = maxExtent
		}
		p, j0 := rng.IntN(400)-100, rng.IntN(300)
		s := make([]float32, rng.IntN(70))
		for j := range s {
			s[j] = float32(j)
		}
		w.MaskRow(p, j0, s)
		for j, x := range s {
			if vis := w.Visible(p, j0+j); (vis && x != float32(j)) || (!vis && !math.IsInf(float64(x), -1)) {
				t.Fatalf("%+v MaskRow(p=%d, j0=%d): key %d is %v, Visible %v", w, p, j0, j0+j, x, vis)
			}
		}
	}
}
