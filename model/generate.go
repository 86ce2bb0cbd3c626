package model

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/attnkit/attn"
)

// Sampler picks the next token from logits.
type Sampler struct {
	temp float64
	topK int
	rng  *rand.Rand
	idx  []int
	p    []float64
}

// NewSampler returns a sampler at temperature temp (0: always the most
// likely token, ties to the lowest id, and nothing is drawn) among the topK
// most likely tokens (0: all). With temp > 0 it draws exactly one
// Float64 per token from a PCG generator seeded (seed, 0) and walks the
// candidates' probabilities, softmax(logits/temp) over the top K sorted
// by falling logit (ties by id), to the draw: the same seed and logits
// give the same tokens.
func NewSampler(temp float64, topK int, seed uint64) (*Sampler, error) {
	if math.IsNaN(temp) || temp < 0 || math.IsInf(temp, 0) {
		return nil, fmt.Errorf("%w: temperature %v, want a finite value >= 0", attn.ErrInput, temp)
	}
	if topK < 0 {
		return nil, fmt.Errorf("%w: top-k %d, want >= 0", attn.ErrInput, topK)
	}
	return &Sampler{temp: temp, topK: topK, rng: rand.New(rand.NewPCG(seed, 0))}, nil
}

// Sample returns the id of the next token.
func (s *Sampler) Sample(logits []float32) int {
	if s.temp == 0 || len(logits) < 2 {
		best := 0
		for i, x := range logits {
			if x > logits[best] {
				best = i
			}
		}
		return best
	}
	s.idx = s.idx[:0]
	for i := range logits {
		s.idx = append(s.idx, i)
	}
	slices.SortFunc(s.idx, func(a, b int) int {
		if c := cmp.Compare(logits[b], logits[a]); c != 0 {
			return c
		}
		return a - b
	})
	k := len(s.idx)
	if s.topK > 0 {
		k = min(k, s.topK)
	}
	top := float64(logits[s.idx[0]])
	s.p = s.p[:0]
	var sum float64
	for _, i := range s.idx[:k] {
		e := math.Exp((float64(logits[i]) - top) / s.temp)
		s.p = append(s.p, e)
		sum += e
	}
	r := s.rng.Float64() * sum
	for j, e := range s.p {
		if r < e {
			return s.idx[j]
		}
		r -= e
	}
	return s.idx[k-1]
}

// Stats reports what Generate did and how fast.
type Stats struct {
	Prompt    int           // prompt tokens
	Generated int           // tokens generated
	Prefill   time.Duration // feeding the prompt
	Decode    time.Duration // generating, sampling included
	// Stop says why generation stopped: "length" (n tokens), "eos" or
	// "context" (the model's SeqLen reached).
	Stop string
}

// PrefillRate and DecodeRate are tokens a second.
func (s Stats) PrefillRate() float64 { return rate(s.Prompt, s.Prefill) }

// DecodeRate returns generated tokens a second.
func (s Stats) DecodeRate() float64 { return rate(s.Generated, s.Decode) }

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Generate feeds prompt (at least one token) to a new session and then
// generates up to n tokens with smp, calling emit (when not nil) with each
// as soon as it is chosen. It stops early at the token eos (not emitted; -1 for none) or
// when the sequence reaches the model's SeqLen (when known), and returns
// what it did even when emit or ctx stop it.
func (m *Model) Generate(ctx context.Context, prompt []int, n int, smp *Sampler, eos int, emit func(tok int) error) (st Stats, err error) {
	st = Stats{Prompt: len(prompt), Stop: "length"}
	if len(prompt) == 0 {
		return st, fmt.Errorf("%w: empty prompt", attn.ErrInput)
	}
	if n < 0 || smp == nil {
		return st, fmt.Errorf("%w: n = %d and a sampler are required", attn.ErrInput, n)
	}
	if m.cfg.SeqLen > 0 && len(prompt) > m.cfg.SeqLen {
		return st, fmt.Errorf("%w: prompt of %d tokens is longer than the model's context (%d)", attn.ErrInput, len(prompt), m.cfg.SeqLen)
	}
	sess, err := m.NewSession()
	if err != nil {
		return st, err
	}
	logits := make([]float32, m.cfg.Vocab)
	t0 := time.Now()
	if err = sess.Step(ctx, prompt, logits); err != nil {
		return st, err
	}
	st.Prefill = time.Since(t0)
	t0 = time.Now()
	defer func() { st.Decode = time.Since(t0) }()
	for st.Generated < n {
		tok := smp.Sample(logits)
		if tok == eos {
			st.Stop = "eos"
			return st, nil
		}
		st.Generated++
		if emit != nil {
			if err := emit(tok); err != nil {
				return st, err
			}
		}
		if st.Generated == n {
			break
		}
		if m.cfg.SeqLen > 0 && sess.Len() >= m.cfg.SeqLen {
			st.Stop = "context"
			break
		}
		if err := sess.Step(ctx, []int{tok}, logits); err != nil {
			return st, err
		}
	}
	return st, nil
}
