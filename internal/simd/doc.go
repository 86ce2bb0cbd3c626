// Package simd holds the vector kernels of the attention code: a
// register-blocked matrix-multiply micro-kernel (Gemm), a fused
// exp-and-sum for softmax rows (ExpSum, Exp), the element-wise step of
// the attention backward pass (ExpMul), linear attention's feature map
// (ELU1), Max, Scale, Dot and Axpy,
// the kernels of the KV-cache decode step (WidenBF16, WidenF16,
// DotRows, DotRowsBF16, DotRowsF16, GemmBF16, GemmF16, DotRowsBF16Native,
// GemmBF16Native, and DotRowsPF,
// DotRowsBF16PF, DotRowsF16PF and GemmPF with a prefetch hint; for an
// int8 cache DotRowsI8, DotRowsI8PF, GemmI8, WidenI8 and ScaleColumns;
// for an int4 one DotRowsU4 and GemmU4, and DotRowsU4Q8 and GemmU4BF16
// in the integer and bfloat16 arithmetic of the CPU, see NativeU4),
// those of the fused attention tile (GemmPanels, OnlineSoftmax,
// AttendPanels, PanelFromRows, RowsFromPanel), the bfloat16 attention
// tile (AttendAMX, with PackQAMX, PackKAMX and PackVAMX, in the layout
// of Intel's AMX tiles),
// and two probes of the machine (MeasurePeakGFlops, MeasureReadGBps) that
// reports divide by.
//
// Each kernel has a plain Go version (generic.go) and assembly versions
// generated with avo (the generator is in _asm, a module of its own),
// grouped in families, each a complete set of kernels: "generic" (Go),
// "neon" (arm64 Advanced SIMD, written by hand), "avx2" (AVX2 and FMA), "avx512" (AVX-512 F, BW, VL and DQ),
// "avx512bf16" (AVX512-BF16 too) and "amx" (AMX-TILE and AMX-BF16 too, on
// Linux, which must grant the process the tile state: the package asks
// once at start-up, and without it there is no amx family and
// KernelsNote says why). A family keeps the kernels of the one before it
// that it does not replace, and may add some: AttendAMX exists in the
// avx512bf16 family (VDPBF16PS) and the amx family (the AMX tiles) only
// (HasBF16Tile). At start-up the most capable family
// the CPU and the OS support (golang.org/x/sys/cpu) is put in use; the
// environment variable ATTN_KERNELS names a less capable one instead
// ("generic", also "go" or "purego", "avx2", "avx512", "avx512bf16"; on
// arm64 "generic" or "neon"), so that every
// path can run on a machine that has the most capable, and the purego
// build tag leaves only the Go kernels. Kernels names the family in use,
// Families those this machine can run, KernelsNote why ATTN_KERNELS was
// not followed, and UseKernels switches families (for tests: package
// simdtest runs a test under each). All families give the same results up
// to floating-point rounding and the order of additions, but for the
// bfloat16 products below.
//
// The avx512 family has the fused tile (GemmPanels, OnlineSoftmax,
// AttendPanels), Gemm, GemmPF, GemmF16 and GemmI8, the DotRows kernels (float32, bfloat16,
// binary16 and int8 keys, with and without a prefetch hint), Exp,
// ExpSum, ExpMul and ELU1 (the avx2 arithmetic lane for lane, so the same bits)
// and FMAPeak in zmm registers. A panel of 16 queries is one register, so a panel's
// maxima, sums and rescale factors are single registers and the products'
// register blocks are 8 rows high (8 FMA chains, as many as two 512-bit
// FMA pipes keep busy), with A broadcast from memory by the FMAs
// themselves; Gemm's blocks are 8 rows × 32 columns (16 accumulators, 10
// loads for 16 FMAs). The DotRows kernels keep 16 accumulators, R query
// rows × 16/R keys, each load of 16 key values serving R FMAs, the last
// d%16 values of a row read under a mask, and sum the 16 accumulators'
// lanes into one register by shuffles and adds (4 of each a sum). Masks
// also take the last 8 columns of GemmPF, GemmF16 and GemmI8. FMAPeak's zmm FMAs double its
// flops an instruction (see PeakFlopsPerIter): MeasurePeakGFlops is the
// peak of the family in use.
//
// The avx512bf16 family multiplies bfloat16 by bfloat16 with VDPBF16PS,
// which adds the products of pairs of bfloat16 (two neighbouring columns
// of a row of keys, or two rows of values interleaved by VPUNPCKLWD and
// VPUNPCKHWD) into float32 lanes, 32 products an instruction where an FMA
// does 16, with no widening. Its float32 operand must first be bfloat16:
// DotRowsBF16, DotRowsBF16PF and GemmBF16 split each value into two
// bfloat16 halves (the second rounding what the first left), two
// VDPBF16PS a pair, within 2^-18 of the float32 product; DotRowsBF16Native
// and GemmBF16Native round it to one, twice as fast, the queries or
// probabilities then carrying the error of a bfloat16 (up to 2^-9 of
// each term) as the keys and values of a bfloat16 cache already do. The
// operands are rounded (VCVTNE2PS2BF16, to nearest even, subnormals to
// zero) once a call into the frame: the queries of a group of rows, in
// parts of 512 values, and the probabilities of a block of 6 rows, 256
// keys at a time. The Go assembler lacks both instructions: the generator
// emits their EVEX encodings as BYTEs. Where the CPU also has
// AVX512-VNNI, the family runs DotRowsU4Q8 (int8 queries against int4
// codes centred on 8 by VPDPBUSD, 16 packed rows transposed as dwords so
// that lanes are keys) and GemmU4BF16 (bfloat16 probabilities against the codes
// looked up as bfloat16, by VDPBF16PS) in assembly; the other families
// run their Go definitions, which the assembly matches bit for bit.
//
// The amx family adds AttendAMX, a whole query tile of exact attention
// (up to 64 rows: the query heads of a group times positions) against
// all its key blocks in one call, since the state of the tiles belongs
// to the thread and a goroutine may change threads between calls: each
// call loads the tile configuration (tmm0 … tmm7 of 16 rows × 64 bytes)
// and releases the tiles before it returns. For each block of 128 keys,
// Sᵀ = K·Qᵀ is 16-key × 16-query tiles, 32 columns a TDPBF16PS (the keys
// read as packed rows, the queries packed as pairs of columns), stored
// to a buffer; the softmax runs on it in zmm registers, a panel of 16
// queries a register as in AttendPanels, with the probabilities stored
// as pairs of keys in bfloat16 (VCVTNE2PS2BF16, then VPERMW to
// interleave); and Oᵀ += Vᵀ·Pᵀ on the accumulator's tiles, loaded and
// stored once a block, four TDPBF16PS a load. Every tile step keeps four
// accumulator tiles and loads four operands: two of one side, two of the
// other. The kernel is software-pipelined: the loop of a block's
// exponentials issues, every few iterations, a step of the products of
// the next block's logits and of the block before's values, so that the
// tiles and the vector units work at once (the logits and the
// probabilities are double-buffered). The running maximum is raised only
// where a block's maximum exceeds it by more than AMXThreshold
// (FlashAttention-4's conditional rescaling), so the accumulator is
// rescaled a few times a row instead of at every block. The Go assembler lacks the AMX instructions too: the
// generator emits their VEX encodings as BYTEs (checked against GNU as).
//
// The avx512bf16 family has AttendAMX too, on the same packed operands,
// with VDPBF16PS in zmm registers for the products: a line of the packed
// queries (or probabilities) is one register of 16 pairs, and a pair of
// a key's columns (or of a column's keys in Vᵀ) one 32-bit broadcast.
// The softmax is the amx kernel's code; with the vector units doing
// everything there is nothing to overlap, so each block runs its logits,
// its softmax and its values in turn.
//
// Gemm works on a 6-row × 16-column block of C held in 12 ymm
// accumulators: each step of k loads 16 values of B, broadcasts 6 of A
// and does 12 FMAs, 2·6·16 flops for 8 loads. The assembly loops over
// row blocks and, inside each, over 16-column panels, so one call does a
// whole tile; the m%6 last rows get a block of their own height.
// BenchmarkGemm gives its share of the FMA peak of a core (FMAPeak) on
// the tile shapes; the figures of the machines it has run on are in
// results/2026-12-07, "Figures moved out of code comments".
//
// Exp is the Cody–Waite scheme: n = round(x·log2 e), r = x − n·ln 2
// with ln 2 split in two parts, a degree-5 polynomial in r for
// (exp(r) − 1 − r)/r², and 2^n added into the exponent field. It is
// within 1 ulp of the exact result on the tests' sweep of the float32
// range (they allow 4) wherever that result is a normal float32; where
// it would be subnormal the result is exactly 0 (x < -87.33654), above
// 88.72283 it is +Inf, exp(0) is exactly 1 and NaN stays NaN. The Go
// version computes the same steps in float32, so both builds agree on
// every special case.
//
// ExpMul is the element-wise step of the attention backward pass: it
// turns a tile of logits less their log-sum-exp into probabilities P and
// multiplies the tile of dP − D by them, dS = P ∘ (dP − D), in one pass
// over both. Its exponential is OnlineSoftmax's (below), 2^(x·log2 e),
// about half the vector instructions of Exp's, four vectors at a time
// with each constant loaded once for the four: less time than Exp alone,
// and no separate pass to multiply by the result. The Go version takes the same steps (without
// fused multiply-adds); both give g the exact float32 product of its old
// value and the new p.
//
// WidenBF16 and WidenF16 turn rows of a 16-bit cache into float32, 8
// values an instruction (VPMOVZXWD and a shift, VCVTPH2PS); both are
// exact, and the Go versions give the same bits, NaNs included. The F16C
// instruction VCVTPH2PS is taken to come with AVX2, as on every such CPU
// made; without it (cpu.X86.HasF16C false) WidenF16 uses the Go version.
//
// DotRows computes the scores of a few query rows (the heads of a
// grouped-query-attention group) against a tile of cached keys, reading
// each key row once for all of them: blocks of 4 rows × 3 keys (3 × 4,
// 2 × 6, 1 × 8 for fewer rows) keep 12 accumulators for the whole row
// length, each 8 columns of a key loaded once and multiplied into the 4
// query rows, and their lanes are summed once at the end of the block,
// which weighs more at d = 64 than at 128. DotRowsBF16 and DotRowsF16 are the same code (one
// avo generator, parameterised by the load of 8 keys) with 16-bit keys
// widened in registers as WidenBF16 and WidenF16 do, so that a 16-bit
// cache is read once, at half the bytes, with no float32 copy; their Go
// versions widen a key row into a stack array, then use the Go Dot.
//
// GemmBF16 and GemmF16 are the other product of a decode step, O += P·V,
// with the values of a 16-bit cache read in place: the register blocks of
// Gemm (6 rows × 16 columns, an 8-column block for n%16 = 8), each step
// of k widening the 16 values of B it loads instead of reading a float32
// copy that a WidenBF16 pass would have written and the Gemm read back.
// GemmF16 widens with VCVTPH2PS. GemmBF16 widens 16 values from one load
// with a shift (the even columns) and a mask (the odd ones), one
// instruction on the shuffle ports where VPMOVZXWD and a shift per 8
// values take four, and keeps the even and the odd columns of each row of
// C in its two accumulators, splitting C as it loads a panel and
// interleaving it back as it stores it, faster than WidenBF16 then Gemm
// (BenchmarkGemm16).
//
// DotRowsI8, DotRowsI8PF and GemmI8 are the same generators again with
// int8 keys and values, 8 codes widened by VPMOVSXBD from memory and
// VCVTDQ2PS, exactly; an int8 row's float32 scale is the caller's to
// apply, once a key with ScaleColumns (to the scores after DotRowsI8, to
// the probabilities before GemmI8) rather than once a value. In L1 they
// run at about the speed of the bfloat16 kernels (BenchmarkI8). WidenI8
// widens whole rows times their scales, for the fused tile kernel.
//
// The decode kernels with a prefetch hint (DotRowsPF, DotRowsBF16PF,
// DotRowsF16PF, DotRowsI8PF, GemmBF16, GemmF16, GemmI8 and GemmPF, which
// is Gemm with n a multiple of 8) issue PREFETCHT0 for lines of the hint
// as they compute, a line per pass of DotRows over 16 columns of a block
// of keys and two per 4 steps of k of a Gemm block (one for GemmI8), so that a decode step fetches the
// next block of keys and values from memory while it computes on this
// one, where memory would otherwise sit idle. Faster, the prefetches
// stall the kernels once the core's misses in flight are at their limit.
// The hint changes no result.
//
// GemmPanels, OnlineSoftmax and AttendPanels are the kernels of the fused
// attention tile of package flash, which runs the queries of a tile along
// the vector lanes. GemmPanels is the 6 × 16 register block of Gemm with
// B and C stored in panels of 16 columns, every load of B sequential and
// the panel of B kept in L1 while A streams past; A is read in place, by
// rows or by columns, so the rows of K serve as A of Sᵀ = K·Qᵀ and the
// rows of V as Vᵀ of Oᵀ += Vᵀ·Pᵀ. The blocks advance their pointers once
// every four steps of k (displacements, or an index register for a
// stride only known at run time). BenchmarkGemmPanels gives its share of
// FMAPeak on the attention shapes.
//
// OnlineSoftmax does one step of the online softmax on such panels: the
// maximum, the factor that brings the old sum and accumulator to it, and
// the exponentials, all lane by lane, with no reduction across lanes.
// Its exponential is base 2, 2^((x - m)·log2 e): the difference x - m is
// taken first, exactly for the large logits of nearby keys, then n =
// round(t) and n + 127 come from one add of 1.5·2^23 + 127, r = t - n is
// exact in [-1/2, 1/2], a
// degree-5 minimax polynomial gives 2^r within 1.7e-7 relative, and a
// shift of n + 127 into the exponent field a multiplier 2^n, or exactly
// 0 once t is clamped to -127, so -Inf and every t below -127 give 0
// without a compare (about 15 vector instructions for 8 values, four
// exponentials interleaved stage by stage). Seven of them run on the two
// FMA ports, which bound the loop where a core has two. AttendPanels fuses both
// products and the softmax of an unmasked tile panel by panel, taking
// the maximum of the logits as the first product stores them and
// prefetching the next tile into L2; its exponentials add n << 23 to the
// bits of 2^r instead of multiplying, one fewer instruction on those
// ports (t clamped to -126 then, giving a value below 2^-126 rather than
// 0: its logits are finite). BenchmarkAttendPanels gives its share of
// FMAPeak. PanelFromRows and RowsFromPanel move up to 16
// rows into and out of a panel, 8×8 blocks at a time through
// VUNPCKLPS/VSHUFPS/VPERM2F128 transposes.
//
// The neon family (arm64 with Advanced SIMD, which every arm64 Linux
// has) is the generic family with its float32 kernels replaced by
// hand-written assembly, neon_arm64.s, since avo does not target arm64:
// GemmPanels, OnlineSoftmax, AttendPanels, Gemm, GemmPF, DotRows,
// DotRowsPF, Dot, Axpy, Scale, Max, Exp, ExpSum, ExpMul, ReadSum and
// FMAPeak; the 16-bit, int8 and 4-bit kernels widen a block of keys or
// of B into an array on the stack (ZIP1/ZIP2 with zeros, FCVTL, SXTL or
// UXTL then SCVTF or UCVTF) and run the float32 kernels on it, and the
// panel moves stay in Go. With 4 float32 lanes a register and 32 registers, Gemm and
// GemmPanels keep a 6-row × 16-column block of C in 24 accumulators, each
// step of k loading a row of B into 4 registers and broadcasting 6
// values of A (LD1R), and DotRows takes 4 query rows × 2 keys in 8. The
// loops over panels and row blocks are Go, slicing the operands so that
// each assembly call is bounded by its slices. OnlineSoftmax takes one
// panel (4 registers of queries) a call with exp2Tile's steps;
// AttendPanels is its definition on these kernels, without the fused
// maximum, and ignores the prefetch hints; ELU1 is its Exp and a
// selection in Go, as in the generic family. Exp, ExpSum and ExpMul take
// the steps of the Go versions (FRINTN rounds n); the last len%4 values
// go through lane 0 one at a time, so that nothing past a slice is read
// or written and each value gets the bits a full vector would give it.
// The Go assembler lacks most floating-point vector instructions (FADD,
// FMUL, FMAX, FCMGT, FRINTN …): macros at the top of the file emit them
// as WORDs. CI runs the tests of this family on amd64 under qemu-user,
// which checks results only.
//
// The kernels do not allocate. Gemm, Exp, ExpMul, ELU1, Dot, Axpy, WidenBF16,
// WidenF16, WidenI8, ScaleColumns, the DotRows kernels, the 16-bit, int8
// and prefetching Gemm kernels and the tile kernels check their arguments
// and panic
// on a programming error (a length or stride that does not fit), before
// any assembly runs.
//
// To regenerate the assembly after editing _asm, run go generate in this
// directory; it rewrites simd_amd64.s and stubs_amd64.go, byte for byte
// the same if _asm did not change. The AVX2 kernels must not use the
// registers only AVX-512 has, which the generator checks.
package simd
