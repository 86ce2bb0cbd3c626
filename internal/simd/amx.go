package simd

// The bfloat16 exact-attention tile: bfloat16 queries, keys and values
// multiplied with float32 sums, the softmax in float32 with AVX-512, and
// the probabilities rounded to bfloat16 for their product with the
// values, as FlashAttention does on GPUs. The amx family multiplies on
// the AMX tiles of Intel CPUs (TDPBF16PS: a 16×16 float32 tile += a
// 16×32 bfloat16 tile times a 32×16 one, 16384 flops an instruction);
// the avx512bf16 family with VDPBF16PS in zmm registers (two bfloat16
// products a lane, twice an FMA's), on the same packed operands, which
// are named for the tiles' layout.
//
// A caller packs the queries of a tile (PackQAMX), the keys and the
// values of each block of AMXKeys keys (PackKAMX, PackVAMX) and calls
// AttendAMX once for a query tile and all the key blocks it sees: the
// tiles' state is per thread, and a goroutine may change threads between
// calls, so each call of the amx kernel configures the tiles and
// releases them, and should do much work.

// The sizes of the AMX tile.
const (
	// AMXKeys is the number of keys in a block of PackKAMX and PackVAMX.
	AMXKeys = 128
	// AMXRows is the largest number of query rows of one AttendAMX call:
	// four panels of Panel queries.
	AMXRows = 64
	// AMXCols is the multiple of columns (of the head size D) the packed
	// operands are padded to with zeros: a tile row of 32 bfloat16.
	AMXCols = 32
)

// AMXThreshold is how far, in units of log2, AttendAMX lets the block
// maximum of a query's scaled logits exceed its running maximum before it
// raises the maximum and rescales what it has summed: the probabilities
// of a block lie in [0, 2^AMXThreshold].
const AMXThreshold = 8

// HasBF16Tile reports whether the kernels in use have AttendAMX: the amx
// and avx512bf16 families (see Kernels).
func HasBF16Tile() bool { return active.attendAMX != nil }

// AMXPad returns d rounded up to a multiple of AMXCols.
func AMXPad(d int) int { return (d + AMXCols - 1) / AMXCols * AMXCols }

// AMXQLen is the length of the packed queries of a tile (PackQAMX) for
// head size d.
func AMXQLen(d int) int { return AMXRows * AMXPad(d) }

// AMXBlockLen is the length of a packed block of keys or of values
// (PackKAMX, PackVAMX) for head size d.
func AMXBlockLen(d int) int { return AMXKeys * AMXPad(d) }

// AMXAccLen is the length of AttendAMX's accumulator for head size d.
func AMXAccLen(d int) int { return AMXRows * AMXPad(d) }

// The lengths of AttendAMX's scratch buffers, which hold two blocks
// each: the kernel computes the logits of one block and multiplies the
// probabilities of another with the values while it runs the softmax of
// a third.
const (
	AMXStLen = 2 * AMXRows * AMXKeys // the logits of two blocks, float32
	AMXPLen  = 2 * AMXRows * AMXKeys // the probabilities of two blocks, bfloat16
)

// PackQAMX writes the query rows q[off[r]:off[r]+d], r < len(off) <=
// AMXRows, as AttendAMX reads them (dst: AMXQLen(d) values): Qᵀ in the
// pair layout of the tiles, for each chunk of AMXCols columns and each
// panel of 16 rows, 16 lines of 16 pairs (Q[r][2i], Q[r][2i+1]). The
// rows past len(off) and the columns past d are 0. With neg set every
// value changes sign, exactly (AttendAMX takes a positive scale: a
// negative one is its opposite on negated queries).
func PackQAMX(dst []uint16, q []uint16, off []int, d int, neg bool) {
	dp := AMXPad(d)
	if len(off) > AMXRows || d < 0 || len(dst) < AMXRows*dp {
		panic("simd: PackQAMX with more than AMXRows rows, d < 0 or dst too short")
	}
	dst = dst[:AMXRows*dp]
	clear(dst)
	var sign uint16
	if neg {
		sign = 0x8000
	}
	full := d / AMXCols // chunks of 32 columns with no padding
	for r, o := range off {
		row := q[o : o+d]
		// Column c goes to chunk c/32, panel r/16, line (c%32)/2, pair
		// r%16, half c%2.
		base := r/Panel*Panel*AMXCols + 2*(r%Panel)
		for ch := range full {
			src := (*[AMXCols]uint16)(row[ch*AMXCols:])
			out := (*[Panel*AMXCols - 2*Panel + 2]uint16)(dst[ch*AMXRows*AMXCols+base:])
			for i := range Panel {
				out[i*AMXCols] = src[2*i] ^ sign
				out[i*AMXCols+1] = src[2*i+1] ^ sign
			}
		}
		if full*AMXCols < d {
			out := dst[full*AMXRows*AMXCols+base:]
			for c, v := range row[full*AMXCols:] {
				out[c/2*AMXCols+c%2] = v ^ sign
			}
		}
	}
}

// PackKAMX writes keys k[j*d:(j+1)*d], j < n <= AMXKeys, as a block of
// AttendAMX (dst: AMXBlockLen(d) values): AMXKeys rows of AMXPad(d)
// values, the keys past n and the columns past d 0.
func PackKAMX(dst []uint16, k []uint16, n, d int) {
	dp := AMXPad(d)
	if n < 0 || n > AMXKeys || d < 0 || len(dst) < AMXKeys*dp || len(k) < n*d {
		panic("simd: PackKAMX with n outside [0, AMXKeys], d < 0 or a slice too short")
	}
	dst = dst[:AMXKeys*dp]
	for j := range n {
		copy(dst[j*dp:][:d], k[j*d:][:d])
		clear(dst[j*dp+d : (j+1)*dp])
	}
	clear(dst[n*dp:])
}

// PackVAMX writes values v[j*d:(j+1)*d], j < n <= AMXKeys, as a block
// of AttendAMX (dst: AMXBlockLen(d) values): Vᵀ, AMXPad(d) rows of
// AMXKeys values, the keys past n and the columns past d 0.
func PackVAMX(dst []uint16, v []uint16, n, d int) {
	dp := AMXPad(d)
	if n < 0 || n > AMXKeys || d < 0 || len(dst) < AMXKeys*dp || len(v) < n*d {
		panic("simd: PackVAMX with n outside [0, AMXKeys], d < 0 or a slice too short")
	}
	dst = dst[:AMXKeys*dp]
	if n < AMXKeys || d < dp {
		clear(dst)
	}
	// 16 keys at a time, so that the writes of a row of Vᵀ are runs of
	// 16 values.
	for j0 := 0; j0 < n; j0 += 16 {
		j1 := min(j0+16, n)
		for c := range d {
			line := dst[c*AMXKeys+j0 : c*AMXKeys+j1]
			for j := range line {
				line[j] = v[(j0+j)*d+c]
			}
		}
	}
}

// AttendAMX folds key blocks 0 … nblk-1 (kb, vb: nblk blocks of
// PackKAMX and PackVAMX, AMXBlockLen(d) values a block, one after the
// other) into the first rows (<= AMXRows) query rows of a tile: qb from
// PackQAMX, m, l and lim AMXRows values and acc AMXAccLen(d) values, for
// each panel of 16 rows AMXPad(d) lines of 16 (a line one column of the
// output, in the lanes of the panel's rows: see RowsFromPanel). st and
// pb (AMXStLen and AMXPLen values) are scratch. c is the scale of the
// logits times log2 e, positive (see PackQAMX for a negative scale).
//
// For each block and each row it computes the logits s = Q·Kᵀ with
// float32 sums of exact bfloat16 products, and from block nfull on it
// hides the keys at or past the row's limit lim (a key index counted from
// the first block; the blocks before nfull must be visible in full to
// every row). Then, in units of log2 (t = s·c), the online softmax: m is
// raised to the block maximum where that exceeds m by more than
// AMXThreshold, with acc and l rescaled by 2^(m-m'); p = 2^(t-m) (within
// 2e-7 relative, exactly 0 for a hidden key); l += Σ p in float32; and
// acc += p·V with p rounded to bfloat16 (to nearest even) and float32
// sums. A caller starts a tile with m = -Inf, l = 0 and acc = 0 and ends
// it with out = acc/l and the log-sum-exp (m + log2 l)·ln 2, 0 and -Inf
// for a row with l = 0 (no key seen).
//
// The rows of a panel past rows must hold zero queries; they are computed
// along with the others (for rows > 32 the call does four panels, else
// two). A row's results depend on its own inputs alone, never on the
// other rows of the tile.
//
// AttendAMX panics if the kernels in use lack it (see HasBF16Tile), a
// size is out of range, c is not positive or finite, or a slice is too
// short.
func AttendAMX(rows, nfull, nblk, d int, qb, kb, vb []uint16, st []float32, pb []uint16, lim []int32, m, l, acc []float32, c float32) {
	if active.attendAMX == nil {
		panic("simd: AttendAMX without the avx512bf16 or amx kernels")
	}
	if rows < 1 || rows > AMXRows || nfull < 0 || nblk < 0 || d < 1 {
		panic("simd: AttendAMX with a size out of range")
	}
	if !(c > 0) || c > 3.4e38 {
		panic("simd: AttendAMX with c not positive and finite")
	}
	blk := AMXBlockLen(d)
	if len(qb) < AMXQLen(d) || len(kb) < nblk*blk || len(vb) < nblk*blk || len(st) < AMXStLen || len(pb) < AMXPLen ||
		len(lim) < AMXRows || len(m) < AMXRows || len(l) < AMXRows || len(acc) < AMXAccLen(d) {
		panic("simd: AttendAMX with a slice too short")
	}
	if nblk == 0 {
		return
	}
	npp := 2
	if rows <= 2*Panel {
		npp = 1
	}
	active.attendAMX(npp, nfull, nblk, AMXPad(d), qb, kb, vb, st, pb, lim, m, l, acc, c)
}
