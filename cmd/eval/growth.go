package eval

import (
	"math"
	"slices"
)

// Growth forecasts the time and memory of a call at a length not yet run
// from the calls measured at other lengths, so that a sweep can skip a row
// that would not fit its budget before running it. It extrapolates from the
// nearest measured length below with the power law n^p whose exponent p is
// the slope between the two nearest lengths on log-log axes, clamped to a
// plausible range: [1, 2.5] for time (no call gets cheaper per token; cache
// effects can push past quadratic), [0, 2] for memory. From one length it
// assumes quadratic growth, the worst that attention should do.
type Growth struct {
	pts []growthPoint // sorted by n
}

type growthPoint struct{ n, seconds, bytes float64 }

// Add records a call of length n that took seconds and allocated bytes.
func (g *Growth) Add(n int, seconds float64, bytes uint64) {
	p := growthPoint{float64(n), seconds, float64(bytes)}
	i, found := slices.BinarySearchFunc(g.pts, p.n, func(a growthPoint, n float64) int {
		return cmpFloat(a.n, n)
	})
	if found {
		g.pts[i] = p
		return
	}
	g.pts = slices.Insert(g.pts, i, p)
}

// Seconds forecasts the time of a call of length n; ok is false when no
// length at or below n has been measured.
func (g *Growth) Seconds(n int) (seconds float64, ok bool) {
	return g.forecast(float64(n), func(p growthPoint) float64 { return p.seconds }, 1, 2.5)
}

// Bytes forecasts the bytes a call of length n allocates; ok is false when
// no length at or below n has been measured.
func (g *Growth) Bytes(n int) (bytes float64, ok bool) {
	return g.forecast(float64(n), func(p growthPoint) float64 { return p.bytes }, 0, 2)
}

func (g *Growth) forecast(n float64, val func(growthPoint) float64, lo, hi float64) (float64, bool) {
	i := len(g.pts) - 1
	for i >= 0 && g.pts[i].n > n {
		i--
	}
	if i < 0 {
		return 0, false
	}
	p1 := g.pts[i]
	if p1.n == n {
		return val(p1), true
	}
	slope := 2.0
	if i > 0 {
		p0 := g.pts[i-1]
		if v0, v1 := val(p0), val(p1); v0 > 0 && v1 > 0 {
			slope = math.Log(v1/v0) / math.Log(p1.n/p0.n)
		}
	}
	slope = math.Min(math.Max(slope, lo), hi)
	return val(p1) * math.Pow(n/p1.n, slope), true
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
