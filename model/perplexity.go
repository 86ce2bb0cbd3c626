package model

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/internal/simd"
)

// PerplexityOptions set how Perplexity slides its windows.
type PerplexityOptions struct {
	// Context is the number of tokens in a window; 0 means the model's
	// SeqLen, or 512 when that is unknown.
	Context int
	// Stride is how far a window moves; 0 means Context/2 (at least 1).
	// Each token is scored once, by the first window that holds it with
	// a position to predict it from, as in Hugging Face's sliding-window
	// perplexity.
	Stride int
	// Reference, when not nil, is run on the same windows (it should be
	// the exact model of the same weights) for the KL divergence and the
	// per-layer errors of PerplexityResult.
	Reference *Model
	// Progress, when not nil, is called after each window.
	Progress func(done, total int)
	// Decode scores each window as generation would meet it: the
	// window's tokens before the first it scores go through a Session as
	// one prompt chunk, and every later token is fed alone, so that each
	// layer's incremental decoder (attn.Decoder) predicts it. Mechanisms
	// that approximate only when decoding (quest, magicpig, a quantised
	// KV cache) are measured only this way. A Reference still runs as a
	// whole window; LayerErr and AttnSeconds are left empty.
	Decode bool
}

// PerplexityResult sums the scores of Perplexity.
type PerplexityResult struct {
	Tokens  int     // tokens scored
	Windows int     // windows run
	NLL     float64 // negative log-likelihood of the scored tokens, nats, summed
	// RefNLL and KL are set with a Reference: its NLL, and the sum over
	// the scored positions of KL(reference ‖ model) of the next-token
	// distributions, in nats.
	RefNLL, KL float64
	// LayerErr, with a Reference, holds for each layer the relative error
	// ‖O − O_exact‖/‖O_exact‖ of the attention output over all windows,
	// O_exact being exact attention on the same queries, keys and values
	// (the patched model's own): the error of the mechanism alone, not
	// what earlier layers added. Exact layers have 0.
	LayerErr []float64
	// AttnSeconds is the wall time spent inside the scored model's
	// attention calls (every layer's mechanism Forward, exact layers
	// included), summed over the windows; not the reference's, nor what
	// Perplexity does with the outputs.
	AttnSeconds float64
}

// PPL returns exp(NLL/Tokens).
func (r PerplexityResult) PPL() float64 { return math.Exp(r.NLL / float64(r.Tokens)) }

// RefPPL returns the reference's perplexity.
func (r PerplexityResult) RefPPL() float64 { return math.Exp(r.RefNLL / float64(r.Tokens)) }

// MeanKL returns KL/Tokens.
func (r PerplexityResult) MeanKL() float64 { return r.KL / float64(r.Tokens) }

// BitsPerChar returns NLL in bits over chars characters, the length of the
// scored text.
func (r PerplexityResult) BitsPerChar(chars int) float64 {
	return r.NLL / math.Ln2 / float64(chars)
}

// Windows returns the windows [begin, end) Perplexity runs over n tokens,
// and for each the first position it scores.
func Windows(n, ctxLen, stride int) (begin, end, first []int) {
	prev := 0
	for b := 0; ; b += stride {
		e := min(b+ctxLen, n)
		begin, end, first = append(begin, b), append(end, e), append(first, max(prev, b+1))
		prev = e
		if e >= n {
			return begin, end, first
		}
	}
}

// Perplexity scores tokens (which should start with BOS) with m over
// sliding windows: every token but the first is predicted from the tokens
// of its window before it.
func Perplexity(ctx context.Context, m *Model, tokens []int, o PerplexityOptions) (PerplexityResult, error) {
	var r PerplexityResult
	if len(tokens) < 2 {
		return r, fmt.Errorf("%w: %d tokens; perplexity needs at least 2", attn.ErrInput, len(tokens))
	}
	ctxLen := o.Context
	if ctxLen == 0 {
		ctxLen = m.cfg.SeqLen
		if ctxLen == 0 {
			ctxLen = 512
		}
	}
	if ctxLen < 2 {
		return r, fmt.Errorf("%w: context %d, want >= 2", attn.ErrInput, ctxLen)
	}
	stride := o.Stride
	if stride == 0 {
		stride = max(1, ctxLen/2)
	}
	if stride < 1 || stride > ctxLen {
		return r, fmt.Errorf("%w: stride %d, want 1 to the context %d", attn.ErrInput, stride, ctxLen)
	}
	ref := o.Reference
	if ref != nil && (ref.cfg != m.cfg) {
		return r, fmt.Errorf("%w: the reference model has another architecture", attn.ErrInput)
	}
	v := m.cfg.Vocab
	var errSq, refSq []float64
	var obs Observer
	if ref != nil {
		errSq, refSq = make([]float64, m.cfg.Layers), make([]float64, m.cfg.Layers)
		var exact []float32
		obs = func(l int, s attn.Shape, q, k, vv, out []float32) error {
			if !m.patched[l] {
				return nil
			}
			exact = grow(exact, len(out))
			if err := m.exact.Forward(ctx, s, q, k, vv, attn.Options{Causal: true, Workers: m.workers}, exact, nil); err != nil {
				return err
			}
			for i, e := range exact {
				d := float64(out[i] - e)
				errSq[l] += d * d
				refSq[l] += float64(e) * float64(e)
			}
			return nil
		}
	}
	begins, ends, firsts := Windows(len(tokens), ctxLen, stride)
	// Logits are taken a chunk of rows at a time from the window's hidden
	// states: a whole window's would take rows × Vocab floats per model.
	chunk := max(1, min(ctxLen, perplexityChunkFloats/v))
	if o.Decode {
		return decodedPerplexity(ctx, m, tokens, o, chunk, begins, ends, firsts)
	}
	logits := make([]float32, chunk*v)
	var refLogits []float32
	if ref != nil {
		refLogits = make([]float32, chunk*v)
	}
	var attnTime time.Duration
	lp, lq := make([]float64, v), make([]float64, v)
	nll := make([]float64, chunk)
	d := m.cfg.Dim
	for w := range begins {
		b, e, f := begins[w], ends[w], firsts[w]
		from := f - 1 - b // hidden states at local position from… predict tokens f…
		h, err := m.forwardHidden(ctx, tokens[b:e], from, obs, &attnTime)
		if err != nil {
			return r, err
		}
		var refH []float32
		if ref != nil {
			if refH, err = ref.forwardHidden(ctx, tokens[b:e], from, nil, nil); err != nil {
				return r, err
			}
		}
		for i0 := 0; i0 < e-f; i0 += chunk { // the last row predicts past the window
			c := min(chunk, e-f-i0)
			if err := m.logitsOf(ctx, logits[:c*v], h[i0*d:(i0+c)*d]); err != nil {
				return r, err
			}
			if ref != nil {
				if err := ref.logitsOf(ctx, refLogits[:c*v], refH[i0*d:(i0+c)*d]); err != nil {
					return r, err
				}
			}
			if ref == nil {
				// Rows apart on the workers, added in order: the same sum
				// for any worker count.
				if err := parallel(ctx, m.workers, c, func(i int) {
					nll[i] = nllOf(logits[i*v:][:v], tokens[f+i0+i])
				}); err != nil {
					return r, err
				}
				for _, x := range nll[:c] {
					r.NLL += x
				}
				continue
			}
			for i := range c {
				scoreAgainst(&r, lq, lp, logits[i*v:][:v], refLogits[i*v:][:v], tokens[f+i0+i])
			}
		}
		r.Tokens += e - f
		r.Windows++
		if o.Progress != nil {
			o.Progress(w+1, len(begins))
		}
	}
	r.AttnSeconds = attnTime.Seconds()
	if ref != nil {
		r.LayerErr = make([]float64, m.cfg.Layers)
		for l := range r.LayerErr {
			if refSq[l] > 0 {
				r.LayerErr[l] = math.Sqrt(errSq[l] / refSq[l])
			}
		}
	}
	return r, nil
}

// decodedPerplexity is Perplexity with o.Decode set, over the windows
// given; the reference's logits are taken chunk rows at a time.
func decodedPerplexity(ctx context.Context, m *Model, tokens []int, o PerplexityOptions, chunk int, begins, ends, firsts []int) (PerplexityResult, error) {
	var r PerplexityResult
	sess, err := m.NewSession()
	if err != nil {
		return r, err
	}
	v, d, ref := m.cfg.Vocab, m.cfg.Dim, o.Reference
	logits := make([]float32, v)
	var refLogits []float32
	var lp, lq []float64
	if ref != nil {
		refLogits, lp, lq = make([]float32, chunk*v), make([]float64, v), make([]float64, v)
	}
	for w := range begins {
		b, e, f := begins[w], ends[w], firsts[w]
		sess.Reset()
		var refH []float32
		if ref != nil {
			if refH, err = ref.forwardHidden(ctx, tokens[b:e], f-1-b, nil, nil); err != nil {
				return r, err
			}
		}
		for i0 := 0; i0 < e-f; i0 += chunk {
			c := min(chunk, e-f-i0)
			if ref != nil {
				if err := ref.logitsOf(ctx, refLogits[:c*v], refH[i0*d:(i0+c)*d]); err != nil {
					return r, err
				}
			}
			for i := range c {
				t := f + i0 + i // the token predicted
				feed := tokens[t-1 : t]
				if t == f {
					feed = tokens[b:f] // the prompt
				}
				if err := sess.Step(ctx, feed, logits); err != nil {
					return r, err
				}
				if ref == nil {
					r.NLL += nllOf(logits, tokens[t])
					continue
				}
				scoreAgainst(&r, lq, lp, logits, refLogits[i*v:][:v], tokens[t])
			}
		}
		r.Tokens += e - f
		r.Windows++
		if o.Progress != nil {
			o.Progress(w+1, len(begins))
		}
	}
	return r, nil
}

// scoreAgainst adds to r one position's scores against the reference:
// the model's and the reference's NLL of target, from their logits (the
// log-softmaxes go to lq and lp), and KL(reference ‖ model).
func scoreAgainst(r *PerplexityResult, lq, lp []float64, logits, refLogits []float32, target int) {
	logSoftmax(lq, logits)
	logSoftmax(lp, refLogits)
	r.NLL -= lq[target]
	r.RefNLL -= lp[target]
	var kl float64
	for j, a := range lp {
		kl += math.Exp(a) * (a - lq[j])
	}
	r.KL += max(kl, 0)
}

// perplexityChunkFloats bounds the logits Perplexity holds at once, per
// model: 64 rows of a 128k vocabulary.
const perplexityChunkFloats = 64 << 17

// nllBlock is the number of exponentials nllOf sums in float32 before
// adding them in float64.
const nllBlock = 1024

// nllOf returns −log softmax(x)[target] = log Σ exp(x) − x[target]: the
// exponentials in float32 (simd.ExpSum, shifted by the maximum, within
// an ulp or two of float64's), summed a block of nllBlock in float32
// lanes and the blocks in float64, so that a vocabulary of 150k pieces
// costs little beside the output layer and loses no more than about
// 1e-6 nats. x is overwritten. A NaN or an infinity in x gives NaN, as
// logSoftmax does.
func nllOf(x []float32, target int) float64 {
	xt := float64(x[target])
	mx := simd.Max(x)
	if math.IsInf(float64(mx), 0) || mx != mx {
		return math.NaN() // as in float64: Inf − Inf, or a NaN
	}
	var s float64
	for i := 0; i < len(x); i += nllBlock {
		s += float64(simd.ExpSum(x[i:min(i+nllBlock, len(x))], mx))
	}
	return float64(mx) + math.Log(s) - xt
}

// logSoftmax sets dst[i] = x[i] − log Σ exp(x), in float64.
func logSoftmax(dst []float64, x []float32) {
	mx := math.Inf(-1)
	for _, a := range x {
		mx = math.Max(mx, float64(a))
	}
	var s float64
	for _, a := range x {
		s += math.Exp(float64(a) - mx)
	}
	lse := mx + math.Log(s)
	for i, a := range x {
		dst[i] = float64(a) - lse
	}
}
