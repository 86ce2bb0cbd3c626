package linear

import (
	"fmt"
	"math"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/simd"
)

// State is the recurrent form of causal linear attention, for decoding one
// token at a time: per (batch row, kv head) it holds the prefix sums
// Σ_j φ(k_j)·v_jᵀ and Σ_j φ(k_j) over the keys appended so far, F·(D+1)
// numbers whatever the length. Appending a key and attending with a query
// each cost O(F·D) per head, and the result equals the causal Forward pass
// over the same keys up to float32 rounding.
//
// A State is not safe for concurrent use.
type State struct {
	b, h, hkv, d int
	scale        float32
	w            *work
	pre          []prefix // [b][hkv]
}

// NewState returns an empty decoding state for b batch rows, h query heads
// reading hkv key/value heads of size d, with logit scale scale (0 means
// 1/sqrt(d); only feature maps that approximate softmax use it). Sizes
// are checked before anything is allocated: a state past MaxStateBytes is
// an error wrapping attn.ErrShape.
func (a *Attention) NewState(b, h, hkv, d int, scale float32) (*State, error) {
	s := attn.Shape{B: b, H: h, HKV: hkv, N: 1, M: 1, D: d}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	o := attn.Options{Scale: scale}
	if err := o.Check(s); err != nil {
		return nil, err
	}
	f := a.fm.Features(d)
	if f < 1 {
		return nil, fmt.Errorf("%w: linear: feature map gives %d features for head size %d", attn.ErrInput, f, d)
	}
	if err := a.checkSize(d, f, s.Group(), b*hkv); err != nil {
		return nil, err
	}
	st := &State{b: b, h: h, hkv: hkv, d: d, scale: o.ScaleFor(d)}
	st.w = a.newWork(d, f, s.Group(), false)
	st.pre = make([]prefix, b*hkv)
	for i := range st.pre {
		st.pre[i] = newPrefix(f, st.w.dp, st.w.logScaled)
	}
	return st, nil
}

// Len returns the number of keys appended to batch row b.
func (st *State) Len(b int) int { return st.pre[b*st.hkv].n }

// Reset empties the state.
func (st *State) Reset() {
	for i := range st.pre {
		st.pre[i].reset(st.w.logScaled)
	}
}

// Append adds n keys and values per batch row and kv head; k and v are laid
// out [B][Hkv][n][D]. When valid is non-nil it holds one count per batch
// row: only the first valid[b] of row b's n tokens are appended, the rest
// are padding and contribute nothing.
func (st *State) Append(k, v []float32, n int, valid []int) error {
	want := st.b * st.hkv * n * st.d
	switch {
	case n < 0:
		return fmt.Errorf("%w: linear: append of %d tokens", attn.ErrInput, n)
	case len(k) != want || len(v) != want:
		return fmt.Errorf("%w: linear: append of %d tokens: len(k) = %d, len(v) = %d, want B·Hkv·n·D = %d",
			attn.ErrShape, n, len(k), len(v), want)
	case valid != nil && len(valid) != st.b:
		return fmt.Errorf("%w: linear: %d valid counts for batch size %d", attn.ErrShape, len(valid), st.b)
	}
	for b, c := range valid {
		if c < 0 || c > n {
			return fmt.Errorf("%w: linear: valid count %d of batch row %d is outside [0, %d]", attn.ErrInput, c, b, n)
		}
	}
	d := st.d
	for b := range st.b {
		cnt := n
		if valid != nil {
			cnt = valid[b]
		}
		for kvh := range st.hkv {
			pre := &st.pre[b*st.hkv+kvh]
			base := (b*st.hkv + kvh) * n * d
			st.w.advance(pre, k[base:], v[base:], pre.n, pre.n+cnt, st.scale)
		}
	}
	return nil
}

// Attend computes, for one query token per batch row and head (q laid out
// [B][H][D]), attention over every key appended so far, writing out
// [B][H][D] and, when lse is non-nil, lse [B][H] with the same meaning as
// in Forward: a NaN or an infinity in q or in an appended key or value
// makes the rows that see it NaN.
func (st *State) Attend(q, out, lse []float32) error {
	want := st.b * st.h * st.d
	switch {
	case len(q) != want || len(out) != want:
		return fmt.Errorf("%w: linear: attend: len(q) = %d, len(out) = %d, want B·H·D = %d",
			attn.ErrShape, len(q), len(out), want)
	case lse != nil && len(lse) != st.b*st.h:
		return fmt.Errorf("%w: linear: attend: len(lse) = %d, want B·H = %d", attn.ErrShape, len(lse), st.b*st.h)
	}
	w, d, g := st.w, st.d, st.h/st.hkv
	for b := range st.b {
		for kvh := range st.hkv {
			pre := &st.pre[b*st.hkv+kvh]
			h0 := kvh * g
			// The group's heads are consecutive in q: g rows of one chunk
			// position each.
			rows := q[(b*st.h+h0)*d:][:g*d]
			var ls []float32
			if w.logScaled {
				ls = w.ql[:g]
			}
			w.fm.Map(w.qf, w.ld, ls, rows, g, d, st.scale, false)
			acc := w.acc[:g*w.dp]
			if pre.n > 0 {
				simd.Gemm(g, w.dp, w.f, w.qf, w.ld, pre.s, w.dp, acc, w.dp, false)
				for r := range g {
					w.den[r] = simd.Dot(w.qf[r*w.ld:][:w.f], pre.z)
				}
			}
			w.mi[0] = pre.m
			for r := range g {
				row := b*st.h + h0 + r
				o := out[row*d:][:d]
				l := float32(math.Inf(-1))
				if pre.n > 0 {
					l = w.finish(r, 0, o, pre.bad < pre.n || !w.finite(rows[r*d:][:d]))
				} else {
					clear(o)
				}
				if lse != nil {
					lse[row] = l
				}
			}
		}
	}
	return nil
}
