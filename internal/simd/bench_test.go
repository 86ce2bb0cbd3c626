package simd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/attnkit/attn/internal/half"
	"github.com/attnkit/attn/internal/hugepage"
)

// peakOf is the single-core FMA peak of a family's kernels in GFLOP/s
// (its FMAPeak), measured once per family and test binary so that the
// benchmarks of a run report their share (%peak) of a peak measured in
// that same run. It is the best of many short bursts, the rate of a core
// the process has to itself: on a busy machine the benchmarks' averages
// fall below it while the peak does not.
func peakOf(impl implementation) float64 {
	peakMu.Lock()
	defer peakMu.Unlock()
	if p, ok := peaks[impl.name]; ok {
		return p
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const iters = 1 << 12
	best := time.Duration(math.MaxInt64)
	for range 400 {
		start := time.Now()
		impl.fmaPeak(iters)
		best = min(best, time.Since(start))
	}
	p := iters * PeakFlopsPerIter / best.Seconds() / 1e9
	peaks[impl.name] = p
	return p
}

var (
	peakMu sync.Mutex
	peaks  = map[string]float64{}
)

// timed says whether the benchmarks report best-of-bursts rates and
// %peak for a family: the assembly ones, whose figures are compared.
func timed(impl implementation) bool { return impl.name != "generic" }

// bestSeconds is the time of one call to call in the fastest of 300
// bursts of calls, each burst about 40 µs long: like peakOf, the speed
// of a core the process has to itself, which the averages of a busy
// machine miss. The benchmarks report it next to the average.
func bestSeconds(call func()) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	call()
	group := max(1, int(40*time.Microsecond/max(time.Since(start), time.Nanosecond)))
	best := time.Duration(math.MaxInt64)
	for range 300 {
		start := time.Now()
		for range group {
			call()
		}
		best = min(best, time.Since(start))
	}
	return best.Seconds() / float64(group)
}

func forEachImplB(b *testing.B, f func(b *testing.B, impl implementation)) {
	for _, impl := range implementations {
		b.Run(impl.name, func(b *testing.B) { f(b, impl) })
	}
}

func BenchmarkFMAPeak(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		const iters = 1 << 12
		call := func() { impl.fmaPeak(iters) }
		for b.Loop() {
			call()
		}
		b.ReportMetric(float64(b.N)*iters*PeakFlopsPerIter/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		b.ReportMetric(iters*PeakFlopsPerIter/bestSeconds(call)/1e9, "best-GFLOP/s")
	})
}

func BenchmarkGemm(b *testing.B) {
	sizes := [][3]int{
		{64, 64, 64}, {64, 64, 128}, {64, 128, 64}, {64, 128, 128},
		{65, 64, 64}, {6, 16, 64}, {16, 64, 64}, {128, 128, 128}, {256, 256, 256},
	}
	r := rand.New(rand.NewPCG(1, 2))
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, s := range sizes {
			m, n, k := s[0], s[1], s[2]
			b.Run(fmt.Sprintf("m%dn%dk%d", m, n, k), func(b *testing.B) {
				a := randSlice(r, m*k, -1, 1)
				bb := randSlice(r, k*n, -1, 1)
				c := make([]float32, m*n)
				call := func() { impl.gemm(m, n, k, a, k, bb, n, c, n, true) }
				for b.Loop() {
					call()
				}
				flops := 2 * float64(m*n*k)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				if timed(impl) {
					best := flops / bestSeconds(call) / 1e9
					b.ReportMetric(best, "best-GFLOP/s")
					b.ReportMetric(100*best/peakOf(impl), "%peak")
				}
			})
		}
	})
}

// BenchmarkGemmAllCores runs the product of two 64×64 tiles into a third,
// attention's tile product, on every core at once (GOMAXPROCS workers),
// each worker cycling through its own eight sets of operands (384 KiB,
// more than a first-level cache holds), and reports the sum of their
// rates next to the FMA peak of as many workers measured the same way
// (median chunks, runChunks) in the same iteration: how close to the
// arithmetic peak the products can come when all the cores run them,
// as attention's parallel loops do. BenchmarkGemm measures one core.
func BenchmarkGemmAllCores(b *testing.B) {
	workers := runtime.GOMAXPROCS(0)
	forEachImplB(b, func(b *testing.B, impl implementation) {
		if !timed(impl) {
			b.Skip("the pure-Go products are not compared with the peak")
		}
		const m, n, k, sets = 64, 64, 64, 8
		r := rand.New(rand.NewPCG(1, 2))
		type operands struct{ a, b, c []float32 }
		ops := make([]operands, workers*sets)
		for i := range ops {
			ops[i] = operands{randSlice(r, m*k, -1, 1), randSlice(r, k*n, -1, 1), make([]float32, m*n)}
		}
		products := func(w int) int64 {
			for _, o := range ops[w*sets:][:sets] {
				impl.gemm(m, n, k, o.a, k, o.b, n, o.c, n, true)
			}
			return 2 * m * n * k * sets
		}
		const iters = 1 << 12
		fma := func(int) int64 {
			impl.fmaPeak(iters)
			return iters * PeakFlopsPerIter
		}
		var gemm, peak []float64
		for b.Loop() {
			peak = append(peak, runChunks(workers, 100*time.Millisecond, 3, fma)/1e9)
			gemm = append(gemm, runChunks(workers, 100*time.Millisecond, 3, products)/1e9)
		}
		slices.Sort(gemm)
		slices.Sort(peak)
		g, p := gemm[len(gemm)/2], peak[len(peak)/2]
		b.ReportMetric(g, "GFLOP/s")
		b.ReportMetric(p, "peak-GFLOP/s")
		b.ReportMetric(100*g/p, "%peak")
		b.ReportMetric(float64(workers), "workers")
	})
}

var benchLengths = []int{15, 64, 256, 1024, 4096}

func BenchmarkExpSum(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, n := range benchLengths {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				x := randSlice(rand.New(rand.NewPCG(3, 4)), n, -20, 0)
				y := make([]float32, n)
				call := func() {
					copy(y, x) // keep the inputs in range; a copy costs little
					impl.expSum(y, 0)
				}
				for b.Loop() {
					call()
				}
				b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/float64(n), "ns/elem")
				b.ReportMetric(bestSeconds(call)*1e9/float64(n), "best-ns/elem")
			})
		}
	})
}

func BenchmarkExp(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, n := range benchLengths {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				x := randSlice(rand.New(rand.NewPCG(3, 4)), n, -20, 20)
				y := make([]float32, n)
				call := func() { impl.exp(y, x) }
				for b.Loop() {
					call()
				}
				b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/float64(n), "ns/elem")
				b.ReportMetric(bestSeconds(call)*1e9/float64(n), "best-ns/elem")
			})
		}
	})
}

func BenchmarkMax(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, n := range benchLengths {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				x := randSlice(rand.New(rand.NewPCG(5, 6)), n, -1, 1)
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					impl.max(x)
				}
			})
		}
	})
}

func BenchmarkScale(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, n := range benchLengths {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				x := randSlice(rand.New(rand.NewPCG(7, 8)), n, -1, 1)
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					impl.scale(x, 1)
				}
			})
		}
	})
}

// BenchmarkDot reports the bytes of x and y read per second.
func BenchmarkDot(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, n := range append(benchLengths, 64<<10, 4<<20) {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				r := rand.New(rand.NewPCG(9, 10))
				x, y := randSlice(r, n, -1, 1), randSlice(r, n, -1, 1)
				b.SetBytes(int64(8 * n))
				call := func() { impl.dot(x, y) }
				for b.Loop() {
					call()
				}
				b.ReportMetric(float64(8*n)/bestSeconds(call)/1e9, "best-GB/s")
			})
		}
	})
}

func BenchmarkAxpy(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, n := range benchLengths {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				r := rand.New(rand.NewPCG(11, 12))
				x, y := randSlice(r, n, -1, 1), randSlice(r, n, -1, 1)
				b.SetBytes(int64(12 * n))
				for b.Loop() {
					impl.axpy(1e-3, x, y)
				}
			})
		}
	})
}

// BenchmarkReadGBps reports MeasureReadGBps for one worker and buffers
// from L1 to DRAM sizes.
func BenchmarkReadGBps(b *testing.B) {
	for _, size := range []int{16 << 10, 256 << 10, 4 << 20, 256 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			var g float64
			for b.Loop() {
				g = MeasureReadGBps(size, 1)
			}
			b.ReportMetric(g, "GB/s")
		})
	}
}

// BenchmarkWiden reports the widening rate in ns an element and GB/s of
// float32 output, from L1 (4096 values: 8 KiB in, 16 KiB out) and L2
// (32768: 64 KiB in, 128 KiB out).
func BenchmarkWidenBF16(b *testing.B) {
	benchWiden(b, func(impl implementation) func([]float32, []uint16) { return impl.widenBF16 })
}

func BenchmarkWidenF16(b *testing.B) {
	benchWiden(b, func(impl implementation) func([]float32, []uint16) { return impl.widenF16 })
}

func benchWiden(b *testing.B, kernel func(implementation) func([]float32, []uint16)) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		f := kernel(impl)
		for _, n := range []int{64, 4096, 32768} {
			b.Run(fmt.Sprint(n), func(b *testing.B) {
				r := rand.New(rand.NewPCG(13, 14))
				src := make([]uint16, n)
				for i := range src {
					src[i] = uint16(r.Uint32()) &^ 0x4000 // finite values
				}
				dst := make([]float32, n)
				call := func() { f(dst, src) }
				for b.Loop() {
					call()
				}
				b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/float64(n), "ns/elem")
				best := bestSeconds(call)
				b.ReportMetric(best*1e9/float64(n), "best-ns/elem")
				b.ReportMetric(float64(4*n)/best/1e9, "best-outGB/s")
			})
		}
	})
}

// BenchmarkDotRows runs the decode-step shape, rows query heads against
// 64 keys of d values, and reports the rate in GFLOP/s and in GB/s of
// keys read (64·d·4 bytes a call); %peak is the best rate's share of
// FMAPeak measured in the same run.
func BenchmarkDotRows(b *testing.B) {
	const n = 64
	r := rand.New(rand.NewPCG(15, 16))
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, rows := range []int{1, 2, 4, 7, 8} {
			for _, d := range []int{64, 128} {
				b.Run(fmt.Sprintf("rows%dd%d", rows, d), func(b *testing.B) {
					q := randSlice(r, rows*d, -1, 1)
					k := randSlice(r, n*d, -1, 1)
					s := make([]float32, rows*n)
					call := func() { impl.dotRows(s, n, q, d, rows, k, d, n, d) }
					for b.Loop() {
						call()
					}
					flops := 2 * float64(rows*n*d)
					bytes := float64(4 * n * d)
					sec := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(flops/sec/1e9, "GFLOP/s")
					b.ReportMetric(bytes/sec/1e9, "kGB/s")
					best := bestSeconds(call)
					b.ReportMetric(flops/best/1e9, "best-GFLOP/s")
					b.ReportMetric(bytes/best/1e9, "best-kGB/s")
					if timed(impl) {
						b.ReportMetric(100*flops/best/1e9/peakOf(impl), "%peak")
					}
				})
			}
		}
	})
}

// BenchmarkDotRows16 runs the decode-step shape of BenchmarkDotRows with
// bfloat16 keys, three ways: "widen", WidenBF16 into a float32 block then
// DotRows (what the decode step did), "fused", DotRowsBF16, and "native",
// DotRowsBF16Native. It
// reports GB/s of 16-bit keys read (64·d·2 bytes a call), from L1.
func BenchmarkDotRows16(b *testing.B) {
	const n = 64
	r := rand.New(rand.NewPCG(17, 18))
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, rows := range []int{1, 4, 8} {
			for _, d := range []int{64, 128} {
				q := randSlice(r, rows*d, -1, 1)
				k := make([]uint16, n*d)
				for i, x := range randSlice(r, n*d, -1, 1) {
					k[i] = half.F32ToBF16(x)
				}
				kw := make([]float32, n*d)
				s := make([]float32, rows*n)
				for _, way := range []string{"widen", "fused", "native"} {
					b.Run(fmt.Sprintf("%s/rows%dd%d", way, rows, d), func(b *testing.B) {
						call := func() { impl.dotRowsBF16(s, n, q, d, rows, k, d, n, d) }
						switch way {
						case "widen":
							call = func() {
								impl.widenBF16(kw, k)
								impl.dotRows(s, n, q, d, rows, kw, d, n, d)
							}
						case "native":
							call = func() { impl.dotRowsBF16Native(s, n, q, d, rows, k, d, n, d, nil) }
						}
						for b.Loop() {
							call()
						}
						bytes := float64(2 * n * d)
						b.ReportMetric(bytes/(b.Elapsed().Seconds()/float64(b.N))/1e9, "kGB/s")
						b.ReportMetric(bytes/bestSeconds(call)/1e9, "best-kGB/s")
					})
				}
			}
		}
	})
}

// BenchmarkGemmPanels runs the products of an attention tile: Sᵀ = K·Qᵀ
// (m = keys, n = queries, k = head size; A = rows of K) and Oᵀ += Vᵀ·Pᵀ
// (m = head size, n = queries, k = keys; A = Vᵀ read from rows of V),
// with tight panel strides.
func BenchmarkGemmPanels(b *testing.B) {
	sizes := []struct {
		name       string
		m, n, k    int
		transposed bool
	}{
		{"QK", 64, 64, 64, false}, {"PV", 64, 64, 64, true},
		{"QK", 96, 96, 64, false}, {"PV", 64, 96, 96, true},
		{"QK", 96, 96, 128, false}, {"PV", 128, 96, 96, true},
		{"QK", 6, 16, 64, false},
	}
	r := rand.New(rand.NewPCG(1, 2))
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, sz := range sizes {
			m, n, k := sz.m, sz.n, sz.k
			b.Run(fmt.Sprintf("%s/m%dn%dk%d", sz.name, m, n, k), func(b *testing.B) {
				ar, ac := k, 1
				if sz.transposed {
					ar, ac = 1, m
				}
				pb, pc := Panel*k, Panel*m
				a := randSlice(r, m*k, -1, 1)
				bb := randSlice(r, n/Panel*pb, -1, 1)
				c := make([]float32, n/Panel*pc)
				call := func() { impl.gemmPanels(m, n, k, a, ar, ac, bb, pb, c, pc, true) }
				for b.Loop() {
					call()
				}
				flops := 2 * float64(m*n*k)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				if timed(impl) {
					best := flops / bestSeconds(call) / 1e9
					b.ReportMetric(best, "best-GFLOP/s")
					b.ReportMetric(100*best/peakOf(impl), "%peak")
				}
			})
		}
	})
}

// BenchmarkAttendPanels runs the fused kernel on one tile: rows queries
// (rows/16 panels) against n keys of head size d, K and V as rows, and
// reports its rate, 4·rows·n·d flops a call.
func BenchmarkAttendPanels(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, sz := range [][3]int{{64, 64, 64}, {96, 96, 64}, {64, 64, 128}, {96, 96, 128}} {
			rows, n, d := sz[0], sz[1], sz[2]
			b.Run(fmt.Sprintf("rows%dn%dd%d", rows, n, d), func(b *testing.B) {
				np := rows / Panel
				r := rand.New(rand.NewPCG(3, 4))
				k, v := randSlice(r, n*d, -1, 1), randSlice(r, n*d, -1, 1)
				qt := randSlice(r, np*Panel*d, -1, 1)
				acc := make([]float32, np*Panel*d)
				st := make([]float32, 2*Panel*n) // two panels, as flash gives
				m, l := make([]float32, np*Panel), make([]float32, np*Panel)
				for i := range m {
					m[i] = 10 // above every logit: the accumulator is never rescaled
				}
				call := func() {
					impl.attendPanels(np, n, d, k, d, 1, qt, Panel*d, st, v, 1, d, m, l, acc, Panel*d, nil, nil)
				}
				for b.Loop() {
					call()
				}
				flops := 4 * float64(rows*n*d)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				if timed(impl) {
					best := flops / bestSeconds(call) / 1e9
					b.ReportMetric(best, "best-GFLOP/s")
					b.ReportMetric(100*best/peakOf(impl), "%peak")
				}
			})
		}
	})
}

// BenchmarkOnlineSoftmax runs one softmax step on the logits of a tile
// of np panels of 16 queries against n keys (the accumulator, d = 64, is
// rescaled in the first call only: later calls see no new maximum) and
// reports ns per logit.
func BenchmarkOnlineSoftmax(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, sz := range [][2]int{{64, 4}, {64, 6}, {128, 6}} {
			n, np := sz[0], sz[1]
			for _, masked := range []bool{false, true} {
				b.Run(fmt.Sprintf("n%d/np%d/masked=%v", n, np, masked), func(b *testing.B) {
					const d = 64
					r := rand.New(rand.NewPCG(3, 4))
					x := randSlice(r, np*Panel*n, -8, 8)
					s := make([]float32, len(x))
					m := make([]float32, np*Panel)
					l := make([]float32, np*Panel)
					acc := randSlice(r, np*Panel*d, -1, 1)
					var lim []float32
					if masked {
						lim = make([]float32, np*Panel)
						for i := range lim {
							lim[i] = float32(n - i%Panel)
						}
					}
					for i := range m {
						m[i] = float32(math.Inf(-1))
					}
					call := func() {
						copy(s, x) // keep the inputs the same; a copy costs little
						impl.onlineSoftmax(s, Panel*n, n, np, lim, m, l, acc, Panel*d, d)
					}
					for b.Loop() {
						call()
					}
					elems := float64(n * np * Panel)
					b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N)/elems, "ns/elem")
					b.ReportMetric(bestSeconds(call)*1e9/elems, "best-ns/elem")
				})
			}
		}
	})
}

// BenchmarkGemm16 runs the product O += P·V of a decode step (rows query
// rows, 64 keys, d values) with bfloat16 values, three ways: "widen",
// WidenBF16 into a float32 block then Gemm (what the decode step did),
// "fused", GemmBF16, and "native", GemmBF16Native. It reports GB/s of 16-bit values read (64·d·2
// bytes a call), from L1.
func BenchmarkGemm16(b *testing.B) {
	const n = 64
	r := rand.New(rand.NewPCG(19, 20))
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, rows := range []int{1, 4, 8, 32} {
			for _, d := range []int{64, 128} {
				p := randSlice(r, rows*n, 0, 1)
				v := make([]uint16, n*d)
				for i, x := range randSlice(r, n*d, -1, 1) {
					v[i] = half.F32ToBF16(x)
				}
				vw := make([]float32, n*d)
				acc := make([]float32, rows*d)
				for _, way := range []string{"widen", "fused", "native"} {
					b.Run(fmt.Sprintf("%s/rows%dd%d", way, rows, d), func(b *testing.B) {
						call := func() { impl.gemmBF16(rows, d, n, p, n, v, d, acc, d, true, nil) }
						switch way {
						case "widen":
							call = func() {
								impl.widenBF16(vw, v)
								impl.gemm(rows, d, n, p, n, vw, d, acc, d, true)
							}
						case "native":
							call = func() { impl.gemmBF16Native(rows, d, n, p, n, v, d, acc, d, true, nil) }
						}
						for b.Loop() {
							call()
						}
						bytes := float64(2 * n * d)
						b.ReportMetric(bytes/(b.Elapsed().Seconds()/float64(b.N))/1e9, "kGB/s")
						b.ReportMetric(bytes/bestSeconds(call)/1e9, "best-kGB/s")
					})
				}
			}
		}
	})
}

// BenchmarkI8 runs the two products of a decode step's block (rows query
// rows, 64 keys, d values, in L1) on int8 rows next to bfloat16 ones:
// DotRowsI8 against DotRowsBF16, GemmI8 against GemmBF16, and WidenI8
// against WidenBF16. It reports the share of FMAPeak (2·rows·64·d flops a
// product) and ns a call.
func BenchmarkI8(b *testing.B) {
	const n = 64
	r := rand.New(rand.NewPCG(21, 22))
	forEachImplB(b, func(b *testing.B, impl implementation) {
		for _, rows := range []int{1, 4, 8, 32} {
			for _, d := range []int{64, 128} {
				q := randSlice(r, rows*d, -1, 1)
				p := randSlice(r, rows*n, 0, 1)
				k16 := make([]uint16, n*d)
				k8 := randCodes(r, n*d)
				for i, x := range randSlice(r, n*d, -1, 1) {
					k16[i] = half.F32ToBF16(x)
				}
				sc := randSlice(r, n, 0, 1)
				s := make([]float32, rows*n)
				acc := make([]float32, rows*d)
				w := make([]float32, n*d)
				for _, kern := range []struct {
					name string
					call func()
				}{
					{"DotRowsBF16", func() { impl.dotRowsBF16(s, n, q, d, rows, k16, d, n, d) }},
					{"DotRowsI8", func() { impl.dotRowsI8(s, n, q, d, rows, k8, d, n, d) }},
					{"GemmBF16", func() { impl.gemmBF16(rows, d, n, p, n, k16, d, acc, d, true, nil) }},
					{"GemmI8", func() { impl.gemmI8(rows, d, n, p, n, k8, d, acc, d, true, nil) }},
					{"WidenBF16", func() { impl.widenBF16(w, k16) }},
					{"WidenI8", func() { impl.widenI8(w, k8, sc, d) }},
				} {
					if rows > 1 && kern.name[:5] == "Widen" {
						continue
					}
					b.Run(fmt.Sprintf("%s/rows%dd%d", kern.name, rows, d), func(b *testing.B) {
						for b.Loop() {
							kern.call()
						}
						b.ReportMetric(b.Elapsed().Seconds()*1e9/float64(b.N), "ns/call")
						if kern.name[:5] != "Widen" {
							flops := float64(2 * rows * n * d)
							b.ReportMetric(100*flops/bestSeconds(kern.call)/1e9/peakOf(impl), "%peak")
						}
					})
				}
			}
		}
	})
}

// BenchmarkAttendPanelsStream runs the fused kernel as the tiles of a
// long sequence meet it: 64 queries (4 panels) against key tiles of 64
// keys taken in turn from keys and values of keys·d floats each, too many
// for the L2 cache, with the next tile as the prefetch hint, and reports
// the rate of the whole pass over the tiles, 4·64·keys·d flops.
func BenchmarkAttendPanelsStream(b *testing.B) {
	forEachImplB(b, func(b *testing.B, impl implementation) {
		if !timed(impl) {
			b.Skip("assembly only")
		}
		for _, sz := range [][2]int{{8192, 64}, {8192, 128}} {
			keys, d := sz[0], sz[1]
			b.Run(fmt.Sprintf("keys%dd%d", keys, d), func(b *testing.B) {
				const rows, n = 64, 64
				np := rows / Panel
				r := rand.New(rand.NewPCG(3, 4))
				k, v := randSlice(r, keys*d, -1, 1), randSlice(r, keys*d, -1, 1)
				qt := randSlice(r, np*Panel*d, -1, 1)
				acc := make([]float32, np*Panel*d)
				st := make([]float32, 2*Panel*n) // two panels, as flash gives
				m, l := make([]float32, np*Panel), make([]float32, np*Panel)
				call := func() {
					for i := range m {
						m[i], l[i] = 10, 0
					}
					for j0 := 0; j0 < keys; j0 += n {
						var pfk, pfv []float32
						if next := (j0 + n) * d; next < keys*d {
							pfk, pfv = k[next:next+n*d], v[next:next+n*d]
						}
						impl.attendPanels(np, n, d, k[j0*d:], d, 1, qt, Panel*d, st, v[j0*d:], 1, d, m, l, acc, Panel*d, pfk, pfv)
					}
				}
				for b.Loop() {
					call()
				}
				flops := 4 * float64(rows*keys*d)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				best := flops / bestSeconds(call) / 1e9
				b.ReportMetric(best, "best-GFLOP/s")
				b.ReportMetric(100*best/peakOf(impl), "%peak")
			})
		}
	})
}

// BenchmarkDecodeStream runs the kernels of a decode step on one KV head
// of a cache too large for the caches: for each block of 64 positions,
// the scores of 4 query rows (DotRows), their exponentials (ExpSum) and
// the product with the values (Gemm), each block prefetching the next,
// with float32 ("f32": DotRowsPF, GemmPF), bfloat16 ("bf16": DotRowsBF16PF,
// GemmBF16) and bfloat16 with the CPU's bfloat16 arithmetic
// ("bf16native": DotRowsBF16Native, GemmBF16Native) keys and values. It
// reports ms a pass over the cache, on average and the best of 300 (one
// core; a decode step runs every KV head this way).
func BenchmarkDecodeStream(b *testing.B) {
	const g, d, blk = 4, 128, 64
	forEachImplB(b, func(b *testing.B, impl implementation) {
		if !timed(impl) {
			b.Skip("assembly only")
		}
		for _, T := range []int{16384, 65536} {
			r := rand.New(rand.NewPCG(5, 6))
			// On huge pages, as the KV cache is.
			kf, vf := make([]float32, T*d), make([]float32, T*d)
			kh, vh := make([]uint16, T*d), make([]uint16, T*d)
			hugepage.Advise(kf)
			hugepage.Advise(vf)
			hugepage.Advise(kh)
			hugepage.Advise(vh)
			for i := range kf {
				kf[i], vf[i] = 2*r.Float32()-1, 2*r.Float32()-1
				kh[i], vh[i] = half.F32ToBF16(kf[i]), half.F32ToBF16(vf[i])
			}
			q := randSlice(r, g*d, -0.1, 0.1)
			s := make([]float32, g*blk)
			acc := make([]float32, g*d)
			for _, dt := range []string{"f32", "bf16", "bf16native"} {
				b.Run(fmt.Sprintf("%s/T%d", dt, T), func(b *testing.B) {
					call := func() {
						clear(acc)
						for j0 := 0; j0 < T; j0 += blk {
							off, next := j0*d, min(j0+blk, T-blk)*d
							switch dt {
							case "f32":
								impl.dotRowsPF(s, blk, q, d, g, kf[off:], d, blk, d, kf[next:next+blk*d])
							case "bf16":
								impl.dotRowsBF16PF(s, blk, q, d, g, kh[off:], d, blk, d, kh[next:next+blk*d])
							default:
								impl.dotRowsBF16Native(s, blk, q, d, g, kh[off:], d, blk, d, kh[next:next+blk*d])
							}
							for i := range g {
								impl.expSum(s[i*blk:][:blk], 1)
							}
							switch dt {
							case "f32":
								impl.gemmPF(g, d, blk, s, blk, vf[off:], d, acc, d, true, vf[next:next+blk*d])
							case "bf16":
								impl.gemmBF16(g, d, blk, s, blk, vh[off:], d, acc, d, true, vh[next:next+blk*d])
							default:
								impl.gemmBF16Native(g, d, blk, s, blk, vh[off:], d, acc, d, true, vh[next:next+blk*d])
							}
						}
					}
					for b.Loop() {
						call()
					}
					b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/pass")
					b.ReportMetric(bestSeconds(call)*1e3, "best-ms/pass")
				})
			}
		}
	})
}

// BenchmarkU4Decode times the int4 decode step's two products on 65,536
// packed rows (D = 128, 4 query rows, blocks of 64 rows a call, as
// kvcache calls them; the rows fit the L2 or L3 cache, not the L1):
// "widened" is DotRowsU4 on both halves and GemmU4 on one half, float32
// queries and probabilities; "native" is DotRowsU4Q8 and GemmU4BF16 in
// the family's arithmetic (see NativeU4: the Go definitions where it is
// false). It reports millions of key rows a second.
func BenchmarkU4Decode(b *testing.B) {
	const pw, d, g, blk, rows = 64, 128, 4, 64, 1 << 16
	r := rand.New(rand.NewPCG(1, 2))
	k := u4Rows(r, rows, pw, pw)
	q := randSlice(r, g*d, -1, 1)
	scale, zero := randSlice(r, d, 0, 1), randSlice(r, d, -1, 1)
	p := randSlice(r, g*blk, 0, 1)
	s, acc := make([]float32, g*blk), make([]float32, g*d)
	run := func(b *testing.B, block func(j int)) {
		for b.Loop() {
			for j := 0; j < rows; j += blk {
				block(j)
			}
		}
		b.ReportMetric(float64(rows)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mrows/s")
	}
	forEachImplB(b, func(b *testing.B, impl implementation) {
		if impl.name == "generic" {
			b.Skip("the Go definitions are a reference, not a path")
		}
		b.Run("scores/widened", func(b *testing.B) {
			run(b, func(j int) {
				impl.dotRowsU4[0](s, blk, q, d, g, k[j*pw:], pw, blk, pw)
				impl.dotRowsU4[1](s, blk, q[pw:], d, g, k[j*pw:], pw, blk, pw)
			})
		})
		b.Run("scores/native", func(b *testing.B) {
			run(b, func(j int) { impl.dotRowsU4Q8(s, blk, q, d, g, scale, zero, k[j*pw:], pw, blk, d, pw) })
		})
		b.Run("values-half/widened", func(b *testing.B) {
			run(b, func(j int) { impl.gemmU4[0](g, pw, blk, p, blk, k[j*pw:], pw, acc, d, true, nil) })
		})
		b.Run("values-half/native", func(b *testing.B) {
			run(b, func(j int) { impl.gemmU4BF16[0](g, pw, blk, p, blk, scale, k[j*pw:], pw, acc, d) })
		})
	})
}
