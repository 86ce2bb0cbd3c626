package model

import (
	"context"
	"math"

	par "github.com/attnkit/attn/internal/parallel"
	"github.com/attnkit/attn/internal/simd"
)

// parallel runs fn(i) for i in [0, n) on up to workers goroutines and
// returns ctx's error if it was cancelled before all items ran.
func parallel(ctx context.Context, workers, n int, fn func(i int)) error {
	return par.For(ctx, workers, n, par.None, func(_ struct{}, i int) error {
		fn(i)
		return nil
	})
}

// Tiles of the prefill matrix products: rows of W (a multiple of the
// micro-kernel's 6), positions (a multiple of simd.Panel) and the inner
// dimension, sized so that a tile's operands stay in a core's L2 (512 KiB or more).
const (
	tileRows = 96
	tileCols = 128
	tileK    = 256
	// stripFloats bounds the strip of B (k rows of a column tile) that
	// gemm packs whole, to stay in a core's L2 with the tiles of A and C.
	stripFloats = 1 << 17
	// gemmMin is the number of positions from which a product goes
	// through simd.Gemm (positions padded to 16) rather than dot
	// products (each weight row read once for all positions).
	gemmMin = 4
)

// scratch is reusable memory for the matrix products of one pass.
type scratch struct {
	xt, ct []float32
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// linear sets dst[t][o] = Σ_i w[o][i]·x[t][i] for t < n positions: y = W·x
// for every position, w being [out][in].
func linear(ctx context.Context, sc *scratch, workers int, dst, x, w []float32, n, out, in int) error {
	if n < gemmMin {
		// Memory-bound: stream W once, spread over the workers.
		const rows = 64
		return parallel(ctx, workers, (out+rows-1)/rows, func(b int) {
			o0 := b * rows
			nr := min(rows, out-o0)
			// s[t][o] = x[t]·W[o]: each weight row is read once for
			// all n positions.
			simd.DotRows(dst[o0:], out, x, in, n, w[o0*in:], in, nr, in)
		})
	}
	return linearChunked(ctx, sc, workers, dst, x, w, n, out, in, linearChunk)
}

// linearChunk bounds the values of Cᵀ that linear holds at once: the
// output layer of a large vocabulary over a long window (150k rows by
// 2048 positions) would otherwise need a second copy of the logits.
const linearChunk = 1 << 23

// linearChunked is linear over at least gemmMin positions, computing Cᵀ
// a block of rows of W at a time so that it holds at most about chunk
// values of it. Blocks are whole tiles of rows, each row's sums running in
// the same order whatever the block, so the result does not depend on
// chunk.
func linearChunked(ctx context.Context, sc *scratch, workers int, dst, x, w []float32, n, out, in, chunk int) error {
	// Cᵀ = W·Xᵀ: W is A (out×in, row-major as stored), Xᵀ is B (in×np,
	// positions along the vector lanes), so no weight is ever copied.
	np := (n + simd.Panel - 1) / simd.Panel * simd.Panel
	rows := max(tileRows, chunk/np/tileRows*tileRows)
	rows = min(rows, out)
	sc.xt = grow(sc.xt, in*np)
	sc.ct = grow(sc.ct, rows*np)
	xt, ct := sc.xt, sc.ct
	transpose(xt, np, x, in, n, in)
	for i := range in {
		clear(xt[i*np+n : (i+1)*np])
	}
	for o0 := 0; o0 < out; o0 += rows {
		nr := min(rows, out-o0)
		if err := productWX(ctx, workers, ct, w[o0*in:(o0+nr)*in], xt, np, nr, in); err != nil {
			return err
		}
		transpose(dst[o0:], out, ct, np, nr, n)
	}
	return nil
}

// transpose sets dst[c*ldd+r] = src[r*lds+c] for r < rows, c < cols, in
// blocks that keep both sides' cache lines in use.
func transpose(dst []float32, ldd int, src []float32, lds, rows, cols int) {
	const blk = 16
	for r0 := 0; r0 < rows; r0 += blk {
		r1 := min(r0+blk, rows)
		for c0 := 0; c0 < cols; c0 += blk {
			c1 := min(c0+blk, cols)
			for r := r0; r < r1; r++ {
				row := src[r*lds+c0 : r*lds+c1]
				for j, v := range row {
					dst[(c0+j)*ldd+r] = v
				}
			}
		}
	}
}

// ropeTable returns cos and sin of the rotary angles for positions
// [pos0, pos0+n): [n][d/2] each, angle pos·base^(-2i/d) computed in
// float64.
func ropeTable(pos0, n, d int, base float32) (cos, sin []float32) {
	h := d / 2
	cos, sin = make([]float32, n*h), make([]float32, n*h)
	inv := make([]float64, h)
	for i := range inv {
		inv[i] = math.Pow(float64(base), -float64(2*i)/float64(d))
	}
	for t := range n {
		p := float64(pos0 + t)
		for i, f := range inv {
			s, c := math.Sincos(p * f)
			cos[t*h+i], sin[t*h+i] = float32(c), float32(s)
		}
	}
	return cos, sin
}

// swiGLU sets g[i] = silu(g[i])·u[i], silu(x) = x/(1+exp(-x)).
func swiGLU(g, u []float32) {
	var e [256]float32
	for i0 := 0; i0 < len(g); i0 += len(e) {
		gs := g[i0:min(i0+len(e), len(g))]
		es, us := e[:len(gs)], u[i0:][:len(gs)]
		for i, x := range gs {
			es[i] = -x
		}
		// exp(-x) overflows to +Inf for x < -88.7, where silu is 0.
		simd.Exp(es, es)
		for i, x := range gs {
			gs[i] = x / (1 + es[i]) * us[i]
		}
	}
}

func addTo(dst, x []float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += x[i]
	}
}

// The pass keeps activations feature-major: a [features][ld] matrix whose
// column t is position t, ld being the positions rounded up to
// simd.Panel (or the positions themselves below gemmMin). A projection
// is then C = W·X with W as stored ([out][in], row-major) and positions
// along the vector lanes: no weight and no activation is transposed for
// it. Columns past the positions are zero and stay zero through every
// step (W·0 = 0, RMSNorm of 0 is 0).

// padded returns the column count of n positions.
func padded(n int) int {
	if n < gemmMin {
		return n
	}
	return (n + simd.Panel - 1) / simd.Panel * simd.Panel
}

// linearT sets dst [out][ld] = W·x for x [in][ld] and W [out][in], over the
// first n columns (all ld when ld is padded).
func linearT(ctx context.Context, sc *scratch, workers int, dst, x, w []float32, n, ld, out, in int) error {
	if n < gemmMin {
		// A few positions: gather them as rows and stream W once.
		sc.xt = grow(sc.xt, n*in)
		sc.ct = grow(sc.ct, n*out)
		xr, cr := sc.xt, sc.ct
		transpose(xr, in, x, ld, in, n)
		if err := linear(ctx, sc, workers, cr, xr, w, n, out, in); err != nil {
			return err
		}
		transpose(dst, ld, cr, out, n, out)
		return nil
	}
	return productWX(ctx, workers, dst, w, x, ld, out, in)
}

// productWX sets c [out][ld] = W·x for W [out][in] and x [in][ld], ld a
// multiple of simd.Panel, in tiles spread over the workers (see gemm).
func productWX(ctx context.Context, workers int, c, w, x []float32, ld, out, in int) error {
	return gemm(ctx, workers, out, ld, in, w, in, x, ld, c, ld, false)
}

// rmsNormT is rmsNorm over the columns of x [len(g)][ld].
func rmsNormT(dst, x, g []float32, ld int, eps float32, ss []float32) {
	d := len(g)
	ss = ss[:ld]
	clear(ss)
	for i := range d {
		for t, v := range x[i*ld:][:ld] {
			ss[t] += v * v
		}
	}
	for t, v := range ss {
		ss[t] = float32(1 / math.Sqrt(float64(v)/float64(d)+float64(eps)))
	}
	for i, gi := range g {
		xr, dr := x[i*ld:][:ld], dst[i*ld:][:ld]
		for t, v := range xr {
			dr[t] = v * ss[t] * gi
		}
	}
}

// ropeTableT is ropeTable laid out [d/2][ld] for the columns of a pass.
func ropeTableT(pos0, n, ld, d int, base float32) (cos, sin []float32) {
	return rotaryTableT(pos0, n, ld, ropeFreqs(d, base, nil, 1))
}

// ropeFreqs returns the angular frequencies of the rotary embedding of a
// head of size d, in float64: base^(-2i/d) / ff[i] / scale, ff being the
// per-frequency divisors (nil: none) and scale linear position
// interpolation, as ggml's rope with freq_factors and freq_scale.
func ropeFreqs(d int, base float32, ff []float32, scale float32) []float64 {
	f := make([]float64, d/2)
	for i := range f {
		f[i] = math.Pow(float64(base), -float64(2*i)/float64(d))
		if ff != nil {
			f[i] /= float64(ff[i])
		}
		if scale != 1 {
			f[i] /= float64(scale)
		}
	}
	return f
}

// rotaryTableT returns cos and sin of pos·freqs[i] for positions
// [pos0, pos0+n), [len(freqs)][ld], angles computed in float64.
func rotaryTableT(pos0, n, ld int, freqs []float64) (cos, sin []float32) {
	h := len(freqs)
	cos, sin = make([]float32, h*ld), make([]float32, h*ld)
	for i, f := range freqs {
		for t := range n {
			s, c := math.Sincos(float64(pos0+t) * f)
			cos[i*ld+t], sin[i*ld+t] = float32(c), float32(s)
		}
	}
	return cos, sin
}

// ropeT is rope on x [heads·d][ld], turning the row pairs (2i, 2i+1) of
// every head.
func ropeT(x, cos, sin []float32, ld, heads, d int) {
	ropePairsT(x, cos, sin, ld, heads, d, false)
}

// ropePairsT turns, by the angles of frequency i, the row pairs (2i, 2i+1)
// of every head of x [heads·d][ld], or (i, i+d/2) when neox.
func ropePairsT(x, cos, sin []float32, ld, heads, d int, neox bool) {
	h := d / 2
	for hd := range heads {
		for i := range h {
			ra, rb := hd*d+2*i, hd*d+2*i+1
			if neox {
				ra, rb = hd*d+i, hd*d+i+h
			}
			a, b := x[ra*ld:][:ld], x[rb*ld:][:ld]
			c, s := cos[i*ld:][:ld], sin[i*ld:][:ld]
			for t := range a {
				u, v := a[t], b[t]
				a[t] = u*c[t] - v*s[t]
				b[t] = u*s[t] + v*c[t]
			}
		}
	}
}

// addBiasT adds b[r] to the first n columns of row r of x [len(b)][ld],
// leaving the padding columns zero.
func addBiasT(x, b []float32, n, ld int) {
	for r, br := range b {
		row := x[r*ld:][:n]
		for t := range row {
			row[t] += br
		}
	}
}

// headsFromT copies the first n columns of x [heads·d][ld] to dst
// [heads][n][d], attention's layout.
func headsFromT(dst, x []float32, n, ld, heads, d int) {
	for h := range heads {
		transpose(dst[h*n*d:], d, x[h*d*ld:], ld, d, n)
	}
}

// headsToT copies src [heads][n][d] to the first n columns of dst
// [heads·d][ld].
func headsToT(dst, src []float32, n, ld, heads, d int) {
	for h := range heads {
		transpose(dst[h*d*ld:], ld, src[h*n*d:], d, n, d)
	}
}
