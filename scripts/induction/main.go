// Command induction runs the synthetic copying checks of
// results/long/README.md: a small model trained from scratch on windows of
// random pieces, printing the weighted loss every 25 steps, to see how
// fast in-context copying forms and what helps it.
//
//	go run ./scripts/induction -task copy -init plain -steps 300
//	go run ./scripts/induction -task copy -init prev -amp 4 -steps 300
//	go run ./scripts/induction -task unigram -dim 256 -steps 100
//
// Tasks: copy (the first half of a window is pieces drawn uniformly from
// the vocabulary, the second copies stretches of 16–32 of them from random
// offsets; the loss counts the copied pieces after each stretch's first)
// and unigram (each window draws its pieces from 8 of the vocabulary's,
// chosen per window; the loss counts all but the first 16). Inits: plain
// (InitWeights) and prev, which rebuilds layer 0 as previous-token heads
// by hand (see prevTokenInit).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"

	"github.com/attnkit/attn/model"
)

func main() {
	task := flag.String("task", "copy", "copy or unigram")
	init := flag.String("init", "plain", "plain or prev")
	dim := flag.Int("dim", 64, "model width (heads of 32 at 256, of 16 at 64)")
	vocab := flag.Int("vocab", 512, "vocabulary")
	steps := flag.Int("steps", 300, "steps")
	lr := flag.Float64("lr", 3e-3, "peak learning rate")
	amp := flag.Float64("amp", 4, "with -init prev, the size of the positional queries and keys")
	flag.Parse()
	if *task != "copy" && *task != "unigram" || *init != "plain" && *init != "prev" {
		log.Fatal("-task copy|unigram, -init plain|prev")
	}
	heads := 4
	if *dim >= 256 {
		heads = *dim / 32
	}
	cfg := model.Config{Dim: *dim, Hidden: *dim * 8 / 3, Layers: 2, Heads: heads, KVHeads: 2, Vocab: *vocab, SeqLen: 128, TiedOutput: true}
	w, err := model.InitWeights(cfg, 1)
	if err != nil {
		log.Fatal(err)
	}
	if *init == "prev" {
		prevTokenInit(w, *amp)
	}
	const n, batch = 128, 32
	tr, err := model.NewTrainer(w, model.TrainConfig{Context: n, Batch: batch, Steps: *steps, LR: *lr, Seed: 1, Warmup: 20})
	if err != nil {
		log.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for s := range *steps {
		seqs, wts := make([][]int, batch), make([][]float32, batch)
		for j := range seqs {
			seqs[j], wts[j] = window(rng, *task, n, *vocab)
		}
		st, err := tr.StepWeighted(context.Background(), seqs, wts)
		if err != nil {
			log.Fatal(err)
		}
		if s%25 == 0 || s == *steps-1 {
			fmt.Printf("step %d loss %.3f\n", s, st.Loss)
		}
	}
}

// window returns n+1 pieces of the task and the weights of the n
// predictions.
func window(rng *rand.Rand, task string, n, vocab int) ([]int, []float32) {
	seq, wt := make([]int, n+1), make([]float32, n)
	if task == "unigram" {
		var set [8]int
		for i := range set {
			set[i] = rng.IntN(vocab)
		}
		for i := range seq {
			seq[i] = set[rng.IntN(len(set))]
			if i >= 16 {
				wt[i-1] = 1
			}
		}
		return seq, wt
	}
	h := n / 2
	for i := range h {
		seq[i] = rng.IntN(vocab)
	}
	for i := h; i <= n; {
		l := 16 + rng.IntN(17)
		off := rng.IntN(h - l)
		for k := 0; k < l && i <= n; k++ {
			seq[i] = seq[off+k]
			if k > 0 {
				wt[i-1] = 1
			}
			i++
		}
	}
	return seq, wt
}

// prevTokenInit rebuilds layer 0 as previous-token heads, the first half
// of an induction circuit, so that training has only the second to find.
// Embedding channel 0 becomes a constant, the token's identity stays in
// channels [1, Dim/2) and channels [Dim/2, Dim) are cleared for the
// previous token. Every head's query and key read only the constant, with
// the query of each rotary pair of frequency f ≥ 0.05 turned back by one
// position's angle, so that the score cos((i−j−1)·f) peaks at j = i−1;
// each key/value head carries its share of the token channels and one
// query head of its group writes them to the cleared channels.
func prevTokenInit(w *model.Weights, amp float64) {
	c := w.Config.WithDefaults()
	d, hd := c.Dim, c.HeadDim()
	half := d / 2
	var ss float64
	for t := range c.Vocab {
		e := w.Embed[t*d:][:d]
		clear(e[half:])
		for _, x := range e[1:half] {
			ss += float64(x * x)
		}
	}
	tokNorm := math.Sqrt(ss / float64(c.Vocab))
	for t := range c.Vocab {
		w.Embed[t*d] = float32(tokNorm)
	}
	// After the RMSNorm the constant is about sqrt(Dim/2): the token's
	// channels hold as much energy again.
	x0 := math.Sqrt(float64(d) / 2)
	L := &w.Layers[0]
	clear(L.Wq)
	clear(L.Wk)
	clear(L.Wv)
	clear(L.Wo)
	base := float64(c.RopeBase)
	for i := range hd / 2 {
		f := math.Pow(base, -float64(2*i)/float64(hd))
		if f < 0.05 {
			continue
		}
		for h := range c.Heads {
			L.Wq[(h*hd+2*i)*d] = float32(amp * math.Cos(f) / x0)
			L.Wq[(h*hd+2*i+1)*d] = float32(-amp * math.Sin(f) / x0)
		}
		for g := range c.KVHeads {
			L.Wk[(g*hd+2*i)*d] = float32(amp / x0)
		}
	}
	group := c.Heads / c.KVHeads
	for g := range c.KVHeads {
		for j := range hd {
			src := 1 + g*hd + j
			if src >= half {
				break
			}
			L.Wv[(g*hd+j)*d+src] = 1
			L.Wo[(half+src-1)*d+g*group*hd+j] = 1
		}
	}
}
