package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/attnkit/attn/internal/half"
)

// tdpTile is TDPBF16PS on tiles at offsets of packed operands, in
// float64: c[i][j] += Σ_k a[i][2k]·b[k][2j] + a[i][2k+1]·b[k][2j+1] for
// A 16 rows of 32 bfloat16 (lda values apart) and B 16 rows of 16 pairs.
func tdpTile(c *[16][16]float64, a []uint16, lda int, b []uint16) {
	for i := range 16 {
		for j := range 16 {
			s := 0.0
			for k := range 16 {
				for e := range 2 {
					s += float64(half.BF16ToF32(a[i*lda+2*k+e])) * float64(half.BF16ToF32(b[k*32+2*j+e]))
				}
			}
			c[i][j] += s
		}
	}
}

// TestPackAMXLayouts checks that the packed operands multiply as the
// tiles multiply them: S = K·Qᵀ from PackKAMX and PackQAMX by the
// TDPBF16PS formula, tile by tile, against the dot products of the rows,
// and that PackVAMX is Vᵀ, all with zeros past the rows, keys and columns
// given.
func TestPackAMXLayouts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 22))
	for _, d := range []int{1, 24, 32, 40, 80, 128} {
		for _, rows := range []int{1, 17, 64} {
			n := 1 + rng.IntN(AMXKeys)
			dp := AMXPad(d)
			q := randBF16(rng, (rows+3)*d)
			off := make([]int, rows)
			for r := range off {
				off[r] = (r + 3) * d // rows after 3 of padding
			}
			k, v := randBF16(rng, n*d), randBF16(rng, n*d)
			qb, kb, vb := make([]uint16, AMXQLen(d)), make([]uint16, AMXBlockLen(d)), make([]uint16, AMXBlockLen(d))
			for i := range kb {
				kb[i], vb[i] = 0xffff, 0xffff // a NaN wherever the packing leaves a value
			}
			PackQAMX(qb, q, off, d, false)
			PackKAMX(kb, k, n, d)
			PackVAMX(vb, v, n, d)
			for g := range AMXKeys / 16 {
				for p := range AMXRows / Panel {
					var c [16][16]float64
					for ch := range dp / AMXCols {
						tdpTile(&c, kb[g*16*dp+ch*AMXCols:], dp, qb[ch*AMXRows*AMXCols+p*Panel*AMXCols:])
					}
					for i := range 16 {
						for j := range 16 {
							key, row := g*16+i, p*16+j
							want := 0.0
							if key < n && row < rows {
								for x := range d {
									want += float64(half.BF16ToF32(k[key*d+x])) * float64(half.BF16ToF32(q[off[row]+x]))
								}
							}
							if math.Abs(c[i][j]-want) > 1e-9*(1+math.Abs(want)) {
								t.Fatalf("d=%d rows=%d n=%d: S[key %d][row %d] = %v, want %v", d, rows, n, key, row, c[i][j], want)
							}
						}
					}
				}
			}
			for x := range dp {
				for j := range AMXKeys {
					want := uint16(0)
					if x < d && j < n {
						want = v[j*d+x]
					}
					if got := vb[x*AMXKeys+j]; got != want {
						t.Fatalf("d=%d n=%d: Vᵀ[%d][%d] = %#x, want %#x", d, n, x, j, got, want)
					}
				}
			}
		}
	}
	// The sign flip.
	q := []uint16{half.F32ToBF16(1.5), half.F32ToBF16(-2)}
	qb := make([]uint16, AMXQLen(2))
	PackQAMX(qb, q, []int{0}, 2, true)
	if half.BF16ToF32(qb[0]) != -1.5 || half.BF16ToF32(qb[1]) != 2 {
		t.Errorf("negated: %v %v", half.BF16ToF32(qb[0]), half.BF16ToF32(qb[1]))
	}
}

func randBF16(rng *rand.Rand, n int) []uint16 {
	x := make([]uint16, n)
	for i := range x {
		x[i] = half.F32ToBF16(float32(rng.NormFloat64()))
	}
	return x
}

// amxCase is one tile: rows query rows of d columns against n keys, each
// row seeing keys [0, lim[r]), with scale (1/sqrt(d) when 0).
type amxCase struct {
	rows, d, n int
	lim        []int32
	scale      float64
	q, k, v    []uint16 // rows·d, n·d, n·d
}

// run packs the case, calls AttendAMX over the blocks some row sees and
// returns out (rows·d) and lse (rows) as a caller would finish them.
func (c amxCase) run() (out, lse []float32) {
	d, dp := c.d, AMXPad(c.d)
	scale := c.scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(d))
	}
	off := make([]int, c.rows)
	for r := range off {
		off[r] = r * d
	}
	qb := make([]uint16, AMXQLen(d))
	PackQAMX(qb, c.q, off, d, scale < 0)
	minLim, maxLim := int32(c.n), int32(0)
	lim := make([]int32, AMXRows)
	for r := range c.rows {
		lim[r] = c.lim[r]
		minLim, maxLim = min(minLim, lim[r]), max(maxLim, lim[r])
	}
	nblk := (int(maxLim) + AMXKeys - 1) / AMXKeys
	nfull := int(minLim) / AMXKeys
	blk := AMXBlockLen(d)
	kb, vb := make([]uint16, nblk*blk), make([]uint16, nblk*blk)
	for b := range nblk {
		j0 := b * AMXKeys
		nk := min(AMXKeys, c.n-j0)
		PackKAMX(kb[b*blk:], c.k[j0*d:], nk, d)
		PackVAMX(vb[b*blk:], c.v[j0*d:], nk, d)
	}
	m, l := make([]float32, AMXRows), make([]float32, AMXRows)
	for i := range m {
		m[i] = float32(math.Inf(-1))
	}
	acc := make([]float32, AMXAccLen(d))
	st, pb := make([]float32, AMXStLen), make([]uint16, AMXPLen)
	AttendAMX(c.rows, nfull, nblk, d, qb, kb, vb, st, pb, lim, m, l, acc, float32(math.Abs(scale)*math.Log2E))
	out, lse = make([]float32, c.rows*d), make([]float32, c.rows)
	for r := range c.rows {
		p, x := r/Panel, r%Panel
		lse[r] = float32(math.Inf(-1))
		if l[r] == 0 {
			continue
		}
		lse[r] = float32((float64(m[r]) + math.Log2(float64(l[r]))) * math.Ln2)
		for col := range d {
			out[r*d+col] = acc[p*dp*Panel+col*Panel+x] / l[r]
		}
	}
	return out, lse
}

// ref returns the float64 attention of the case, its log-sum-exps, and
// for each output the sum of p_j·|v_j| over the row's keys (with Σ p_j =
// 1): rounding each p_j to bfloat16 (relative error at most 2^-8) moves
// the output by at most 2^-8 times that.
func (c amxCase) ref() (out, lse, absOut []float64) {
	d := c.d
	scale := c.scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(d))
	}
	f := func(x uint16) float64 { return float64(half.BF16ToF32(x)) }
	out, lse, absOut = make([]float64, c.rows*d), make([]float64, c.rows), make([]float64, c.rows*d)
	s := make([]float64, c.n)
	for r := range c.rows {
		n := int(c.lim[r])
		lse[r] = math.Inf(-1)
		if n == 0 {
			continue
		}
		mx := math.Inf(-1)
		for j := range n {
			dot := 0.0
			for x := range d {
				dot += f(c.q[r*d+x]) * f(c.k[j*d+x])
			}
			s[j] = dot * scale
			mx = max(mx, s[j])
		}
		sum := 0.0
		for j := range n {
			s[j] = math.Exp(s[j] - mx)
			sum += s[j]
		}
		for j := range n {
			p := s[j] / sum
			for x := range d {
				out[r*d+x] += p * f(c.v[j*d+x])
				absOut[r*d+x] += p * math.Abs(f(c.v[j*d+x]))
			}
		}
		lse[r] = mx + math.Log(sum)
	}
	return out, lse, absOut
}

// check compares the kernel with the reference: each output within
// 2^-8·Σ p|v| (the rounding of P to bfloat16) plus 1e-5 of it and 1e-6
// (the float32 sums), each lse within 1e-5 of max(1, |lse|).
func (c amxCase) check(t *testing.T, name string) (out, lse []float32) {
	t.Helper()
	out, lse = c.run()
	wOut, wLSE, abs := c.ref()
	worst := 0.0
	for i, w := range wOut {
		bound := (1.0/256+1e-5)*abs[i] + 1e-6
		e := math.Abs(float64(out[i]) - w)
		if !(e <= bound) { // NaN fails too
			t.Fatalf("%s: out[row %d][%d] = %v, want %v ± %.3g", name, i/c.d, i%c.d, out[i], w, bound)
		}
		if abs[i] > 0 {
			worst = max(worst, (e-1e-6)/abs[i])
		}
	}
	for r, w := range wLSE {
		g := float64(lse[r])
		if math.IsInf(w, -1) != math.IsInf(g, -1) || (!math.IsInf(w, -1) && !(math.Abs(g-w) <= 1e-5*max(1, math.Abs(w)))) {
			t.Fatalf("%s: lse[%d] = %v, want %v", name, r, g, w)
		}
	}
	if testing.Verbose() && worst > 0 {
		t.Logf("%s: largest error %.3g of Σ p|v| (bound 2^-8 = %.3g)", name, worst, 1.0/256)
	}
	return out, lse
}

func randCase(rng *rand.Rand, rows, d, n int, lims string) amxCase {
	c := amxCase{rows: rows, d: d, n: n, lim: make([]int32, rows),
		q: randBF16(rng, rows*d), k: randBF16(rng, n*d), v: randBF16(rng, n*d)}
	for r := range c.lim {
		switch lims {
		case "all":
			c.lim[r] = int32(n)
		case "random":
			c.lim[r] = int32(rng.IntN(n + 1))
		case "causal": // row r at absolute position n - rows + r
			c.lim[r] = int32(max(0, min(n, n-rows+r+1)))
		}
	}
	return c
}

func TestAttendAMX(t *testing.T) {
	forEachTiles(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(2, 22))
		for _, d := range []int{24, 40, 64, 80, 128} {
			for _, rows := range []int{1, 16, 31, 33, 64} {
				for _, n := range []int{1, 77, 128, 129, 300} {
					for _, lims := range []string{"all", "random", "causal"} {
						c := randCase(rng, rows, d, n, lims)
						c.check(t, fmt.Sprintf("d=%d rows=%d n=%d %s", d, rows, n, lims))
					}
				}
			}
		}
	})
}

// TestAttendAMXLogits covers logits far from 1: large ones (up to about
// 1e4, from small integers so that the sums are exact and only the
// softmax can err), maxima that keep growing from block to block (rescales at most
// blocks), a negative scale, and rows that see no key.
func TestAttendAMXLogits(t *testing.T) {
	forEachTiles(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 22))
		ints := func(n, lo, hi int) []uint16 {
			x := make([]uint16, n)
			for i := range x {
				x[i] = half.F32ToBF16(float32(lo + rng.IntN(hi-lo+1)))
			}
			return x
		}
		for _, d := range []int{64, 128} {
			// Logits of 64·d ± 5·sqrt(d) or so, hundreds apart.
			c := randCase(rng, 40, d, 700, "random")
			c.q, c.k, c.v = ints(c.rows*d, 0, 16), ints(c.n*d, 0, 16), ints(c.n*d, -8, 8)
			c.scale = 1
			out, lse := c.check(t, fmt.Sprintf("large d=%d", d))
			for i, x := range out {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("large d=%d: out[%d] = %v", d, i, x)
				}
			}
			big := 0.0
			for _, x := range lse {
				if !math.IsInf(float64(x), -1) {
					big = max(big, math.Abs(float64(x)))
				}
			}
			if big < 3000 {
				t.Errorf("large d=%d: the largest |lse| is only %v", d, big)
			}
		}
		// Key j is key 0 times (1 + j/64): the logits of a row grow (or
		// fall) linearly along the keys, by far more than AMXThreshold over
		// the row.
		c := randCase(rng, 64, 64, 900, "causal")
		for j := range c.n {
			for x := range c.d {
				c.k[j*c.d+x] = half.F32ToBF16(half.BF16ToF32(c.k[x]) * (1 + float32(j)/64))
			}
		}
		c.scale = 0.5
		c.check(t, "growing")
		c.scale = -0.5
		c.check(t, "growing, negative scale")
		c = randCase(rng, 33, 80, 300, "random")
		for r := range c.lim {
			if r%3 == 0 {
				c.lim[r] = 0
			}
		}
		c.check(t, "empty rows")
	})
}

// TestAttendAMXRowsIndependent checks that a row's results are the same
// bits whatever rows share its tile and whatever panel it lies in.
func TestAttendAMXRowsIndependent(t *testing.T) {
	forEachTiles(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(4, 22))
		a := randCase(rng, 64, 80, 400, "random")
		outA, lseA := a.run()
		// Row r of a becomes row perm[r] of b, among other rows.
		perm := rng.Perm(64)
		b := randCase(rng, 64, 80, 400, "random")
		copy(b.k, a.k)
		copy(b.v, a.v)
		keep := 40
		for r := range keep {
			pr := perm[r]
			copy(b.q[pr*b.d:(pr+1)*b.d], a.q[r*a.d:(r+1)*a.d])
			b.lim[pr] = a.lim[r]
		}
		outB, lseB := b.run()
		for r := range keep {
			pr := perm[r]
			if math.Float32bits(lseA[r]) != math.Float32bits(lseB[pr]) ||
				!slices.Equal(f32bits(outA[r*a.d:(r+1)*a.d]), f32bits(outB[pr*b.d:(pr+1)*b.d])) {
				t.Fatalf("row %d (row %d of the other tile): different results", r, pr)
			}
		}
	})
}

// threadSeconds is the CPU time of the calling thread (Linux), or 0.
func threadSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1, &ru); err != nil { // RUSAGE_THREAD
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)*1e-6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func f32bits(x []float32) []uint32 {
	b := make([]uint32, len(x))
	for i, v := range x {
		b[i] = math.Float32bits(v)
	}
	return b
}

func TestAttendAMXPanics(t *testing.T) {
	d := 32
	type args struct {
		rows, nfull, nblk, d int
		qb, kb, vb           []uint16
		st                   []float32
		pb                   []uint16
		lim                  []int32
		m, l, acc            []float32
		c                    float32
	}
	ok := func() args {
		return args{1, 0, 1, d, make([]uint16, AMXQLen(d)), make([]uint16, AMXBlockLen(d)), make([]uint16, AMXBlockLen(d)),
			make([]float32, AMXStLen), make([]uint16, AMXPLen), make([]int32, AMXRows),
			make([]float32, AMXRows), make([]float32, AMXRows), make([]float32, AMXAccLen(d)), 1}
	}
	call := func(a args) (panicked bool) {
		defer func() { panicked = recover() != nil }()
		AttendAMX(a.rows, a.nfull, a.nblk, a.d, a.qb, a.kb, a.vb, a.st, a.pb, a.lim, a.m, a.l, a.acc, a.c)
		return false
	}
	// Without the avx512bf16 or amx kernels every call panics.
	orig := active
	active = &implementations[0]
	if !call(ok()) {
		t.Error("AttendAMX without the avx512bf16 or amx kernels did not panic")
	}
	active = orig
	forEachTiles(t, func(t *testing.T) {
		if call(ok()) {
			t.Fatal("AttendAMX panicked on good arguments")
		}
		for i, mod := range []func(a *args){
			func(a *args) { a.rows = 0 },
			func(a *args) { a.rows = AMXRows + 1 },
			func(a *args) { a.nblk = 2 },
			func(a *args) { a.d = 33 },
			func(a *args) { a.qb = a.qb[1:] },
			func(a *args) { a.pb = a.pb[1:] },
			func(a *args) { a.lim = a.lim[1:] },
			func(a *args) { a.acc = a.acc[1:] },
			func(a *args) { a.c = 0 },
			func(a *args) { a.c = float32(math.NaN()) },
			func(a *args) { a.c = float32(math.Inf(1)) },
		} {
			a := ok()
			mod(&a)
			if !call(a) {
				t.Errorf("case %d did not panic", i)
			}
		}
	})
}

// forEachTiles runs f as a subtest (or sub-benchmark) for each family
// with AttendAMX (amx on the tiles, avx512bf16 with VDPBF16PS), that
// family in use; it skips where there is none.
func forEachTiles[T interface {
	testing.TB
	Run(string, func(T)) bool
}](t T, f func(t T)) {
	ran := false
	for i := range implementations {
		if implementations[i].attendAMX == nil {
			continue
		}
		ran = true
		t.Run(implementations[i].name, func(t T) {
			orig := active
			active = &implementations[i]
			defer func() { active = orig }()
			f(t)
		})
	}
	if !ran {
		t.Skipf("no kernels with AttendAMX on this machine (families %v)", Families())
	}
}

// BenchmarkAttendAMX times one call for a tile of 64 query rows against
// n keys (one thread), in GFLOP/s of the conventional 4·rows·n·d, over
// wall-clock time and over the thread's CPU time (cpuGFLOP/s, which a
// busy machine lowers less).
func BenchmarkAttendAMX(b *testing.B) {
	forEachTiles(b, func(b *testing.B) {
		for _, d := range []int{64, 128} {
			for _, n := range []int{1024, 4096} {
				b.Run(fmt.Sprintf("d%d/n%d", d, n), func(b *testing.B) {
					rng := rand.New(rand.NewPCG(5, 22))
					nblk := n / AMXKeys
					blk := AMXBlockLen(d)
					kb, vb := randBF16(rng, nblk*blk), randBF16(rng, nblk*blk)
					qb := randBF16(rng, AMXQLen(d))
					for i := range kb { // modest logits
						kb[i] = half.F32ToBF16(half.BF16ToF32(kb[i]) / 8)
					}
					lim := make([]int32, AMXRows)
					m, l, acc := make([]float32, AMXRows), make([]float32, AMXRows), make([]float32, AMXAccLen(d))
					st, pb := make([]float32, AMXStLen), make([]uint16, AMXPLen)
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					cpu0 := threadSeconds()
					for b.Loop() {
						for i := range m {
							m[i], l[i] = float32(math.Inf(-1)), 0
						}
						clear(acc)
						AttendAMX(AMXRows, nblk, nblk, d, qb, kb, vb, st, pb, lim, m, l, acc, 0.125*math.Log2E)
					}
					f := 4 * float64(AMXRows*n*d) * float64(b.N)
					b.ReportMetric(f/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					if cpu := threadSeconds() - cpu0; cpu > 0 {
						b.ReportMetric(f/cpu/1e9, "cpuGFLOP/s")
					}
				})
			}
		}
	})
}

func BenchmarkPackAMX(b *testing.B) {
	const d = 128
	rng := rand.New(rand.NewPCG(6, 22))
	q := randBF16(rng, AMXRows*d)
	off := make([]int, AMXRows)
	for r := range off {
		off[r] = r * d
	}
	kv := randBF16(rng, AMXKeys*d)
	dst := make([]uint16, AMXBlockLen(d))
	b.Run("Q", func(b *testing.B) {
		for b.Loop() {
			PackQAMX(dst, q, off, d, false)
		}
	})
	b.Run("K", func(b *testing.B) {
		for b.Loop() {
			PackKAMX(dst, kv, AMXKeys, d)
		}
	})
	b.Run("V", func(b *testing.B) {
		for b.Loop() {
			PackVAMX(dst, kv, AMXKeys, d)
		}
	})
}

// TestAMXNote checks that a refusal of the tile state shows in the note,
// with ATTN_KERNELS unset or asking for amx.
func TestAMXNote(t *testing.T) {
	orig := amxNote
	defer func() { amxNote = orig }()
	amxNote = "arch_prctl: operation not permitted"
	for _, req := range []string{"", "amx"} {
		impl, note := chooseKernels(req)
		if slices.Contains(Families(), "amx") {
			// This machine has the family: the note is about a refusal
			// it did not have, and only the request without amx shows it.
			if req == "amx" && impl.name != "amx" {
				t.Errorf("ATTN_KERNELS=%q: %s", req, impl.name)
			}
			continue
		}
		if !strings.Contains(note, amxNote) {
			t.Errorf("ATTN_KERNELS=%q: note %q lacks %q", req, note, amxNote)
		}
	}
	amxNote = ""
	if _, note := chooseKernels(""); note != "" {
		t.Errorf("no refusal, ATTN_KERNELS unset: note %q", note)
	}
}
