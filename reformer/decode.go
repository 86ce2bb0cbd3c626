package reformer

import (
	"fmt"
	"math"

	"github.com/attnkit/attn"
)

// Decoder is Reformer attention for generating one token at a time. It
// keeps a cache of one sequence's keys and values per kv head together
// with every key's bucket in every round, filed per bucket, so that a step
// costs O(H·(Hashes·2·Bucket + Window)·D) whatever the cache length:
//
//   - Append(k, v) adds tokens to the cache and files each key under its
//     bucket of every round;
//   - Step(q) attends the query of the newest token (at position Len()-1)
//     to the union of: in each round, the 2·Bucket most recent keys of its
//     bucket (as many as a chunk and the one before it hold in Forward),
//     and the Window most recent keys. Each key counts once; the self rule
//     applies as in Forward.
//
// Only keys up to the query's own position are in the cache, so a step
// never depends on later tokens. A Decoder is not safe for concurrent use.
type Decoder struct {
	cfg        Config
	h, hkv, d  int
	scale      float32
	hs         *hasher
	n          int         // tokens in the cache
	keys, vals [][]float32 // [kvh] → [n][d]
	buckets    [][]int32   // [kvh] → [n][rounds]: the bucket of every key in every round
	lists      [][][]int32 // [kvh][round·buckets + bucket] → key positions, ascending

	// Scratch.
	proj   []float32
	qb     []int32
	stamp  []uint32 // stamp[pos] == gen: pos is a candidate already
	gen    uint32
	cand   []int32
	logits []float32
}

// NewDecoder returns an empty decoder for h query heads reading hkv
// key/value heads of size d. scale multiplies the logits; 0 means
// 1/sqrt(d). The bucket count is Config.Buckets, or DefaultDecodeBuckets
// when it is 0. The rotations are drawn here, exactly as Forward draws
// them for the same bucket count and head size.
func NewDecoder(cfg Config, h, hkv, d int, scale float32) (*Decoder, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if h <= 0 || hkv <= 0 || d <= 0 || h%hkv != 0 || d > maxIndex || h > maxIndex {
		return nil, fmt.Errorf("%w: reformer: decoder with H = %d, Hkv = %d, D = %d: want positive sizes and H a multiple of Hkv",
			attn.ErrShape, h, hkv, d)
	}
	if c.SharedQK && h != hkv {
		return nil, fmt.Errorf("%w: reformer: shared QK needs H == Hkv, got %d and %d", attn.ErrUnsupported, h, hkv)
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return nil, fmt.Errorf("%w: reformer: scale %v is not finite", attn.ErrInput, scale)
	}
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(d)))
	}
	t := c.Buckets
	if t == 0 {
		t = DefaultDecodeBuckets
	}
	hs := newHasher(c.Seed, c.Hashes, d, bucketFactors(t))
	dec := &Decoder{
		cfg: c, h: h, hkv: hkv, d: d, scale: scale, hs: hs,
		keys:    make([][]float32, hkv),
		vals:    make([][]float32, hkv),
		buckets: make([][]int32, hkv),
		lists:   make([][][]int32, hkv),
		proj:    hs.scratch(),
		qb:      make([]int32, c.Hashes),
	}
	for i := range dec.lists {
		dec.lists[i] = make([][]int32, c.Hashes*hs.buckets)
	}
	return dec, nil
}

// Len returns the number of tokens in the cache.
func (dec *Decoder) Len() int { return dec.n }

// Append adds t tokens to the cache: k and v are [Hkv][t][D], the layout of
// K and V in package attn for one batch row. With Config.SharedQK, k holds
// the tokens' queries, which are normalised to unit length as keys.
func (dec *Decoder) Append(k, v []float32) error {
	row := dec.hkv * dec.d
	if len(k) != len(v) || len(k)%row != 0 {
		return fmt.Errorf("%w: reformer: Append got len(k) = %d, len(v) = %d, want equal multiples of Hkv·D = %d",
			attn.ErrShape, len(k), len(v), row)
	}
	t := len(k) / row
	if t > maxIndex-dec.n {
		return fmt.Errorf("%w: reformer: a cache of more than 2^31-1 tokens", attn.ErrUnsupported)
	}
	R, nb := dec.cfg.Hashes, dec.hs.buckets
	for kvh := range dec.hkv {
		kh := k[kvh*t*dec.d : (kvh+1)*t*dec.d]
		if dec.cfg.SharedQK {
			kh = normalizedRows(kh, dec.d)
		}
		dec.keys[kvh] = append(dec.keys[kvh], kh...)
		dec.vals[kvh] = append(dec.vals[kvh], v[kvh*t*dec.d:(kvh+1)*t*dec.d]...)
		bs := dec.buckets[kvh]
		start := len(bs)
		bs = append(bs, make([]int32, t*R)...)
		dec.hs.hash(kh, t, dec.d, dec.proj, bs[start:])
		dec.buckets[kvh] = bs
		lists := dec.lists[kvh]
		for i := range t {
			for r := range R {
				b := r*nb + int(bs[start+i*R+r])
				lists[b] = append(lists[b], int32(dec.n+i))
			}
		}
	}
	dec.n += t
	if cap(dec.stamp) < dec.n {
		dec.stamp = append(dec.stamp[:cap(dec.stamp)], make([]uint32, dec.n-cap(dec.stamp))...)
	}
	dec.stamp = dec.stamp[:dec.n]
	return nil
}

// Step attends q, the queries [H][D] of the newest token (position
// Len()-1), to its keys in the cache and writes out [H][D] and, when lse
// is not nil, lse [H]: the log-sum-exp over the keys used. With an empty
// cache every row gets out 0 and lse -Inf. With Config.SharedQK the
// query's buckets are those of its own key, filed by Append.
func (dec *Decoder) Step(q, out, lse []float32) error {
	n := dec.h * dec.d
	if len(q) != n || len(out) != n || (lse != nil && len(lse) != dec.h) {
		return fmt.Errorf("%w: reformer: Step got len(q) = %d, len(out) = %d, len(lse) = %d, want H·D = %d and H = %d",
			attn.ErrShape, len(q), len(out), len(lse), n, dec.h)
	}
	g := dec.h / dec.hkv
	for hh := range dec.h {
		qh := q[hh*dec.d : (hh+1)*dec.d]
		l := dec.attend(hh/g, qh, out[hh*dec.d:(hh+1)*dec.d])
		if lse != nil {
			lse[hh] = l
		}
	}
	return nil
}

// candidates returns the cache positions the newest token's query qh
// attends to in kv head kvh, each once, in no particular order.
func (dec *Decoder) candidates(kvh int, qh []float32) []int32 {
	dec.cand = dec.cand[:0]
	t := dec.n - 1
	if t < 0 {
		return dec.cand
	}
	R, nb := dec.cfg.Hashes, dec.hs.buckets
	if dec.cfg.SharedQK {
		copy(dec.qb, dec.buckets[kvh][t*R:(t+1)*R])
	} else {
		dec.hs.hash(qh, 1, dec.d, dec.proj, dec.qb)
	}
	dec.gen++
	if dec.gen == 0 { // wrapped: old stamps could collide
		clear(dec.stamp)
		dec.gen = 1
	}
	excl := dec.cfg.ExcludeSelf
	add := func(pos int32) {
		if excl && int(pos) == t {
			return
		}
		if dec.stamp[pos] != dec.gen {
			dec.stamp[pos] = dec.gen
			dec.cand = append(dec.cand, pos)
		}
	}
	per := 2 * dec.cfg.Bucket
	for r := range R {
		list := dec.lists[kvh][r*nb+int(dec.qb[r])]
		for _, pos := range list[max(0, len(list)-per):] {
			add(pos)
		}
	}
	for pos := max(0, t-dec.cfg.Window+1); pos <= t; pos++ {
		add(int32(pos))
	}
	if len(dec.cand) == 0 && excl {
		dec.cand = append(dec.cand, int32(t)) // the self rule's fallback
	}
	return dec.cand
}

// attend writes the attention of qh over its candidates in kv head kvh to
// out and returns the lse.
func (dec *Decoder) attend(kvh int, qh, out []float32) float32 {
	cand := dec.candidates(kvh, qh)
	clear(out)
	if len(cand) == 0 {
		return negInf
	}
	d := dec.d
	keys, vals := dec.keys[kvh], dec.vals[kvh]
	if cap(dec.logits) < len(cand) {
		dec.logits = make([]float32, len(cand))
	}
	logits := dec.logits[:len(cand)]
	// Four keys at a time: independent rows keep several cache misses in
	// flight, which is what a step over a long cache waits on.
	i := 0
	for ; i+4 <= len(cand); i += 4 {
		c := cand[i : i+4]
		s0, s1, s2, s3 := dot4(qh, keys[int(c[0])*d:][:d], keys[int(c[1])*d:][:d], keys[int(c[2])*d:][:d], keys[int(c[3])*d:][:d])
		logits[i], logits[i+1], logits[i+2], logits[i+3] = s0*dec.scale, s1*dec.scale, s2*dec.scale, s3*dec.scale
	}
	for ; i < len(cand); i++ {
		s0, _, _, _ := dot4(qh, keys[int(cand[i])*d:][:d], nil, nil, nil)
		logits[i] = s0 * dec.scale
	}
	mx := negInf
	for _, x := range logits {
		mx = max(mx, x)
	}
	if math.IsInf(float64(mx), 0) || math.IsNaN(float64(mx)) {
		// Inf or NaN inputs: let IEEE arithmetic say so, as the exact
		// kernel does, rather than dividing 0 by 0 silently.
		mx = 0
	}
	var sum float32
	for i, x := range logits {
		p := float32(math.Exp(float64(x - mx)))
		logits[i] = p
		sum += p
	}
	i = 0
	for ; i+4 <= len(cand); i += 4 {
		c, p := cand[i:i+4], logits[i:i+4]
		v0, v1, v2, v3 := vals[int(c[0])*d:][:d], vals[int(c[1])*d:][:d], vals[int(c[2])*d:][:d], vals[int(c[3])*d:][:d]
		for j := range out {
			out[j] += p[0]*v0[j] + p[1]*v1[j] + p[2]*v2[j] + p[3]*v3[j]
		}
	}
	for ; i < len(cand); i++ {
		p, v0 := logits[i], vals[int(cand[i])*d:][:d]
		for j := range out {
			out[j] += p * v0[j]
		}
	}
	inv := 1 / sum
	for c := range out {
		out[c] *= inv
	}
	return mx + float32(math.Log(float64(sum)))
}

// dot4 returns the dot products of q with up to four rows (nil rows give
// 0), in one pass so that their loads overlap.
func dot4(q, r0, r1, r2, r3 []float32) (s0, s1, s2, s3 float32) {
	if r1 == nil {
		for j, x := range q {
			s0 += x * r0[j]
		}
		return s0, 0, 0, 0
	}
	r0, r1, r2, r3 = r0[:len(q)], r1[:len(q)], r2[:len(q)], r3[:len(q)]
	for j, x := range q {
		s0 += x * r0[j]
		s1 += x * r1[j]
		s2 += x * r2[j]
		s3 += x * r3[j]
	}
	return s0, s1, s2, s3
}
