package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/cmd/needle"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// readTextFile reads a UTF-8 text file, gunzipping it when its name ends
// in .gz.
func readTextFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
	}
	return string(b), nil
}

func cmdTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("train", stdout, stderr, trainHelp)
	var texts listFlag
	fs.Var(&texts, "text", "training text `FILES` (comma-separated or repeated; .gz is read gunzipped)")
	val := fs.String("val", "", "validation text `FILE`: its loss is printed every -eval steps")
	valTokens := fs.Int("val-tokens", 16384, "score the first `N` tokens of -val")
	resume := fs.String("resume", "", "continue the run saved in checkpoint `FILE` (its settings win)")
	out := fs.String("o", "model.gguf", "write the trained model to `FILE`")
	outType := fs.String("type", "f32", "element type of the model's matrices: f32, f16 or bf16")
	ckpt := fs.String("checkpoint", "", "save a checkpoint (weights, Adam state, step) to `FILE` every -save steps and at the end")
	saveEvery := fs.Int("save", 200, "steps between checkpoints")
	evalEvery := fs.Int("eval", 100, "steps between validation losses")
	workers := fs.workers()
	initFrom := fs.String("init", "", "start from the weights and tokenizer of model `FILE` (GGUF, or an embedded model: austen, austen-long) instead of new ones; -ctx sets its context; size flags given (-dim, -hidden, -layers, -heads, -kv-heads) grow it into a wider model that starts computing the same function (model.Widen), the others keep its sizes")
	ropeBase := fs.Float64("rope-base", 0, "base of the rotary embedding's frequencies (0: 10000, or -init's own)")
	retrieval := fs.Float64("retrieval", 0, "share `P` of training windows with facts planted in them and asked for at the end (the needle test's task)")
	facts := fs.Int("facts", 4, "with -retrieval, at most `K` facts planted in a window")
	induction := fs.Float64("induction", 0, "share `P` of training windows of random pieces whose second half copies stretches of the first, weighted as answers (the densest signal for in-context copying)")
	repeats := fs.Float64("repeats", 0, "with -retrieval, share `P` of planted values whose six digits come from three, so that most repeat (values like 662645, which a model that copies a value by the digit before each digit gets wrong)")
	copyShare := fs.Float64("copy", 0, "share `P` of training windows that end with a copy of a stretch of themselves, weighted as answers (it teaches in-context copying)")
	asks := fs.Int("asks", 1, "with -retrieval, questions asked at the end of a window, each about another planted fact (multi-query recall)")
	spread := fs.Float64("spread", 0, "with -retrieval, share `P` of planted windows whose questions end a prefix of random length (1/8 to all of the window) with text after, so that answering does not hang on the window's end")
	answerWeight := fs.Float64("answer-weight", 1, "with -retrieval, the loss weight `W` of each answer token against 1 for the text")
	hardWeight := fs.Float64("hard-weight", 1, "with -retrieval, multiply by `F` the weight of each answer token whose preceding token occurs more than once in the answer (in 508338, the tokens after each 8 and each 3: where copying by the token before is ambiguous)")
	valNeedle := fs.Int("val-needle", 0, "with -val, also answer `N` needle cases at the training context every -eval steps")
	var c model.Config
	var tc model.TrainConfig
	vocab := fs.Int("vocab", 4096, "pieces of the vocabulary learnt from the text")
	fs.IntVar(&c.Dim, "dim", 256, "width of the residual stream")
	fs.IntVar(&c.Hidden, "hidden", 688, "width of the SwiGLU MLP")
	fs.IntVar(&c.Layers, "layers", 4, "decoder blocks")
	fs.IntVar(&c.Heads, "heads", 8, "query heads")
	fs.IntVar(&c.KVHeads, "kv-heads", 2, "key/value heads (GQA)")
	fs.BoolVar(&c.TiedOutput, "tied", false, "tie the output layer to the embedding")
	fs.IntVar(&tc.Context, "ctx", 512, "tokens per training sequence (the model's context length)")
	fs.StringVar(&tc.Attention, "attn", "exact", "attention to train with: a registry mechanism with a backward pass and its parameters, e.g. exact, linear, window:left=64")
	fs.IntVar(&tc.Batch, "batch", 1, "sequences per step")
	fs.IntVar(&tc.Steps, "steps", 1000, "steps of the cosine schedule")
	fs.IntVar(&tc.Warmup, "warmup", 0, "warm-up steps (0: steps/20)")
	fs.Float64Var(&tc.LR, "lr", 1e-3, "peak learning rate")
	fs.Float64Var(&tc.MinLR, "min-lr", 0, "final learning rate (0: lr/10)")
	fs.Float64Var(&tc.WeightDecay, "wd", 0.1, "AdamW weight decay of the matrices (negative: none)")
	fs.Float64Var(&tc.Clip, "clip", 1, "global gradient-norm bound (negative: none)")
	fs.Uint64Var(&tc.Seed, "seed", 1, "seed of the initial weights and of the training windows")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var paths []string
	for _, t := range texts {
		for p := range strings.SplitSeq(t, ",") {
			if p = strings.TrimSpace(p); p != "" {
				paths = append(paths, p)
			}
		}
	}
	if len(paths) == 0 {
		return fmt.Errorf("-text is required")
	}
	var typ gguf.TensorType
	switch *outType {
	case "f32":
		typ = gguf.F32
	case "f16":
		typ = gguf.F16
	case "bf16":
		typ = gguf.BF16
	default:
		return fmt.Errorf("-type %q: want f32, f16 or bf16", *outType)
	}
	if *saveEvery < 1 || *evalEvery < 1 || *valTokens < 2 {
		return fmt.Errorf("-save, -eval must be >= 1 and -val-tokens >= 2")
	}
	switch {
	case !(*retrieval >= 0 && *retrieval <= 1):
		return fmt.Errorf("-retrieval %v: want a share in [0, 1]", *retrieval)
	case *facts < 1 || *facts > needle.MaxFacts:
		return fmt.Errorf("-facts %d: want 1 to %d", *facts, needle.MaxFacts)
	case !(*copyShare >= 0 && *induction >= 0 && *retrieval+*copyShare+*induction <= 1):
		return fmt.Errorf("-copy %v, -induction %v: want shares in [0, 1] with -retrieval + -copy + -induction <= 1", *copyShare, *induction)
	case *asks < 1 || *asks > needle.MaxFacts:
		return fmt.Errorf("-asks %d: want 1 to %d", *asks, needle.MaxFacts)
	case !(*answerWeight >= 1 && *answerWeight <= 1000):
		return fmt.Errorf("-answer-weight %v: want 1 to 1000", *answerWeight)
	case !(*hardWeight >= 1 && *hardWeight <= 1000):
		return fmt.Errorf("-hard-weight %v: want 1 to 1000", *hardWeight)
	case *ropeBase < 0 || math.IsInf(*ropeBase, 0) || (*ropeBase > 0 && *ropeBase <= 1):
		return fmt.Errorf("-rope-base %v: want 0 or a finite value > 1", *ropeBase)
	case *valNeedle < 0 || *valNeedle > 1000:
		return fmt.Errorf("-val-needle %d: want 0 to 1000", *valNeedle)
	}
	if *retrieval > 0 || *copyShare > 0 || *induction > 0 {
		tc.Tasks = fmt.Sprintf("retrieval=%g,facts=%d", *retrieval, *facts)
		if *answerWeight != 1 {
			tc.Tasks += fmt.Sprintf(",weight=%g", *answerWeight)
		}
		if *hardWeight != 1 {
			tc.Tasks += fmt.Sprintf(",hard=%g", *hardWeight)
		}
		if *asks != 1 {
			tc.Tasks += fmt.Sprintf(",asks=%d", *asks)
		}
		if *spread > 0 {
			tc.Tasks += fmt.Sprintf(",spread=%g", *spread)
		}
		if *repeats > 0 {
			tc.Tasks += fmt.Sprintf(",repeats=%g", *repeats)
		}
		if *copyShare > 0 {
			tc.Tasks += fmt.Sprintf(",copy=%g", *copyShare)
		}
		if *induction > 0 {
			tc.Tasks += fmt.Sprintf(",induction=%g", *induction)
		}
	}
	corpus := make([]string, len(paths))
	chars := 0
	for i, p := range paths {
		s, err := readTextFile(p)
		if err != nil {
			return err
		}
		corpus[i] = s
		chars += len([]rune(s))
	}
	fmt.Fprintf(stdout, "text   %d files, %d characters\n", len(paths), chars)

	var tr *model.Trainer
	var tok *tokenizer.Tokenizer
	if *resume != "" {
		f, err := os.Open(*resume)
		if err != nil {
			return err
		}
		st, err := f.Stat()
		if err == nil {
			tr, tok, err = model.Resume(f, st.Size(), *workers)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *resume, err)
		}
		if tok == nil {
			return fmt.Errorf("%s has no tokenizer", *resume)
		}
		fmt.Fprintf(stdout, "resume %s at step %d\n", *resume, tr.Steps())
	} else if *initFrom != "" {
		var w *model.Weights
		var err error
		if embedded, _, ok := austen.Embedded(*initFrom); ok {
			w, tok, err = embedded()
		} else {
			w, tok, err = model.Open(*initFrom, "")
		}
		if err != nil {
			return fmt.Errorf("-init: %w", err)
		}
		if tok == nil {
			return fmt.Errorf("-init %s has no tokenizer", *initFrom)
		}
		// The architecture is the model's, grown where size flags say;
		// the context, the rotary base and the attention are the run's.
		if to, grow := growTo(w.Config.WithDefaults(), c, fs.given()); grow {
			from := w.Config.WithDefaults()
			if w, err = model.Widen(w, to, tc.Seed); err != nil {
				return fmt.Errorf("-init: %w", err)
			}
			fmt.Fprintf(stdout, "widen  dim %d→%d, hidden %d→%d, layers %d→%d, heads %d/%d→%d/%d (new parts start at zero effect)\n",
				from.Dim, to.Dim, from.Hidden, to.Hidden, from.Layers, to.Layers, from.Heads, from.KVHeads, to.Heads, to.KVHeads)
		}
		w.Config.SeqLen = tc.Context
		if *ropeBase > 0 {
			w.Config.RopeBase = float32(*ropeBase)
		}
		w.Config.Attention = ""
		if tc.Attention != "exact" {
			w.Config.Attention = tc.Attention
		}
		tc.Workers = *workers
		if tr, err = model.NewTrainer(w, tc); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "init   %s: %d weights, rope base %g\n", *initFrom, w.Params(), w.Config.WithDefaults().RopeBase)
	} else {
		start := time.Now()
		var err error
		tok, err = tokenizer.Train(ctx, corpus, tokenizer.TrainConfig{Size: *vocab})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "vocab  %d pieces learnt in %s\n", tok.Len(), time.Since(start).Round(time.Millisecond))
		c.Vocab = tok.Len()
		c.SeqLen = tc.Context
		c.RopeBase = float32(*ropeBase)
		if tc.Attention != "exact" {
			c.Attention = tc.Attention
		}
		w, err := model.InitWeights(c, tc.Seed)
		if err != nil {
			return err
		}
		tc.Workers = *workers
		if tr, err = model.NewTrainer(w, tc); err != nil {
			return err
		}
	}
	tc = tr.Config()
	c = tr.Weights().Config
	var tokens []int
	for _, s := range corpus {
		tokens = append(tokens, tok.Encode(s, true)...)
	}
	if err := checkTrain(tc, c, len(tokens), corpus, *val); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tokens %d (%.3f per character)\n", len(tokens), float64(len(tokens))/float64(chars))
	fmt.Fprintf(stdout, "model  %d parameters: dim %d, hidden %d, %d layers, %d/%d heads, vocab %d, context %d, attention %s\n",
		tr.Weights().Params(), c.Dim, c.Hidden, c.Layers, c.Heads, c.WithDefaults().KVHeads, c.Vocab, tc.Context, tc.Attention)
	fmt.Fprintf(stdout, "train  %d steps of %d×%d tokens (%.2f epochs), lr %.3g→%.3g, warm-up %d, wd %g, clip %g\n",
		tc.Steps, tc.Batch, tc.Context, float64(tc.Steps*tc.Batch*tc.Context)/float64(len(tokens)),
		tc.LR, tc.MinLR, tc.Warmup, tc.WeightDecay, tc.Clip)

	var valSeqs [][]int
	if *val != "" {
		s, err := readTextFile(*val)
		if err != nil {
			return err
		}
		vt := tok.Encode(s, true)
		vt = vt[:min(len(vt), *valTokens)]
		for i := 0; i+1 < len(vt); i += tc.Context {
			valSeqs = append(valSeqs, vt[i:min(i+tc.Context+1, len(vt))])
		}
		fmt.Fprintf(stdout, "val    %s: %d tokens in %d sequences\n", filepath.Base(*val), len(vt), len(valSeqs))
	}
	valLoss := func() (float64, error) {
		var sum float64
		var n int
		for _, s := range valSeqs {
			l, err := tr.Loss(ctx, s)
			if err != nil {
				return 0, err
			}
			sum += l * float64(len(s)-1)
			n += len(s) - 1
		}
		return sum / float64(n), nil
	}
	// copyLoss is the loss on a stretch of the validation text seen a
	// second time in the same window, against its first reading: a model
	// that copies in context (induction heads, the mechanism retrieval
	// needs) predicts the repeat far better. With causal attention the
	// first half of the doubled window is scored exactly as the stretch
	// alone, so the repeat's mean is 2·m2 − m1.
	copyLoss := func() (first, repeat float64, err error) {
		half := tc.Context / 2
		var n int
		for _, s := range valSeqs {
			if len(s) < half+1 || n == 4 {
				break
			}
			a := s[:half+1]
			m1, err := tr.Loss(ctx, a)
			if err != nil {
				return 0, 0, err
			}
			m2, err := tr.Loss(ctx, append(slices.Clip(a), a[1:]...))
			if err != nil {
				return 0, 0, err
			}
			first += m1
			repeat += 2*m2 - m1
			n++
		}
		return first / float64(max(n, 1)), repeat / float64(max(n, 1)), nil
	}
	save := func() error {
		if *ckpt == "" {
			return nil
		}
		return writeFileAtomic(*ckpt, func(w io.Writer) error { return tr.Save(w, tok, "attn train checkpoint") })
	}

	mix, err := newTaskMix(tok, tc)
	if err != nil {
		return err
	}
	if mix != nil {
		fmt.Fprintf(stdout, "tasks  %s: %.0f%% of the windows carry up to %d planted facts, up to %d of them asked for at the end (in %.0f%% of them, the end of a prefix of random length), %.0f%% end with a copy, %.0f%% are induction windows (answer weight %g)\n", tc.Tasks, 100*mix.share, mix.facts, mix.asks, 100*mix.spread, 100*mix.copy, 100*mix.induct, mix.weight)
	}
	needleScore := func() (string, error) {
		if *valNeedle == 0 || *val == "" {
			return "", nil
		}
		hay, err := readTextFile(*val)
		if err != nil {
			return "", err
		}
		res, err := needle.Run(ctx, needle.Config{Weights: tr.Weights(), Tokenizer: tok, Haystack: hay, Lengths: []int{tc.Context},
			Depths: []float64{0.1, 0.5, 0.9}, Trials: (*valNeedle + 2) / 3, Seed: tc.Seed, Workers: *workers}, nil)
		if err != nil {
			return "", err
		}
		right, all := 0, 0
		for _, r := range res.Rows {
			right += r.Correct
			all += r.Trials
		}
		// The share of the value's characters answered right, in place,
		// shows a copy being learnt before whole answers come out right.
		chars, of := 0, 0
		for _, c := range res.Cases {
			got := strings.TrimSpace(c.Got)
			for i := range len(c.Value) {
				if i < len(got) && got[i] == c.Value[i] {
					chars++
				}
			}
			of += len(c.Value)
		}
		return fmt.Sprintf("  needle %d/%d (%.0f%% of characters)", right, all, 100*float64(chars)/float64(max(of, 1))), nil
	}

	bar := newTrainBar(stderr, tc.Steps, tr.Steps())
	start, attn0 := time.Now(), tr.AttentionTime()
	stepsRun := 0
	var lossEMA float64
	for tr.Steps() < tc.Steps {
		batch := tr.Sample(tokens, tr.Steps())
		var weights [][]float32
		if mix != nil {
			if batch, weights, err = mix.apply(batch, tr.Steps()); err != nil {
				return err
			}
		}
		st, err := tr.StepWeighted(ctx, batch, weights)
		if err != nil {
			bar.finish()
			if ctx.Err() != nil {
				if serr := save(); serr != nil {
					return serr
				}
			}
			return err
		}
		stepsRun++
		if stepsRun == 1 {
			lossEMA = st.Loss
		}
		lossEMA = 0.95*lossEMA + 0.05*st.Loss
		elapsed := time.Since(start)
		tps := float64(stepsRun*tc.Batch*tc.Context) / elapsed.Seconds()
		left := time.Duration(float64(elapsed) / float64(stepsRun) * float64(tc.Steps-tr.Steps()))
		bar.update(tr.Steps(), fmt.Sprintf("loss %.3f  %.0f tok/s  lr %.2g  %s left", lossEMA, tps, st.LR, left.Round(time.Second)))
		i := tr.Steps()
		if len(valSeqs) > 0 && (i%*evalEvery == 0 || i == tc.Steps) {
			vl, err := valLoss()
			if err != nil {
				return err
			}
			ns, err := needleScore()
			if err != nil {
				return err
			}
			c1, c2, err := copyLoss()
			if err != nil {
				return err
			}
			bar.log(fmt.Sprintf("step %d  train loss %.4f  val loss %.4f (ppl %.2f)  copy %.2f→%.2f%s  %.0f tok/s  attention %.0f%%  %s",
				i, lossEMA, vl, math.Exp(vl), c1, c2, ns, tps, 100*(tr.AttentionTime()-attn0).Seconds()/elapsed.Seconds(), elapsed.Round(time.Second)))
		}
		if i%*saveEvery == 0 {
			if err := save(); err != nil {
				return err
			}
		}
	}
	bar.finish()
	if err := save(); err != nil {
		return err
	}
	elapsed := time.Since(start)
	if stepsRun > 0 {
		fmt.Fprintf(stdout, "trained %d steps in %s: %.0f tokens/s, %.0f%% of the time in attention (forward and backward)\n",
			stepsRun, elapsed.Round(time.Second), float64(stepsRun*tc.Batch*tc.Context)/elapsed.Seconds(),
			100*(tr.AttentionTime()-attn0).Seconds()/elapsed.Seconds())
	}
	if len(valSeqs) > 0 {
		vl, err := valLoss()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "validation loss %.4f nats/token, perplexity %.3f\n", vl, math.Exp(vl))
	}
	if err := writeFileAtomic(*out, func(w io.Writer) error {
		return model.WriteGGUF(w, tr.Weights(), tok, typ, "attn "+tc.Attention+" model")
	}); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "wrote", *out)
	return nil
}

// writeFileAtomic writes path through a temporary file in its directory,
// renamed into place, so that an interrupted write never leaves half a
// checkpoint.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	bw := newBufWriter(f)
	if err := write(bw); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func newBufWriter(w io.Writer) *bufio.Writer { return bufio.NewWriterSize(w, 1<<20) }

// trainBar shows a run's steps: a bar redrawn in place on a terminal with
// the loss, tokens/s and time left, a line every 10 steps anywhere else.
type trainBar struct {
	p          *progress
	total, at0 int
	status     string
}

func newTrainBar(w io.Writer, total, at int) *trainBar {
	b := &trainBar{p: newProgress(w, total, 0), total: total, at0: at}
	b.p.done = at
	return b
}

func (b *trainBar) update(step int, status string) {
	b.p.done, b.status = step, status
	switch {
	case b.p.tty:
		b.draw()
	case step%10 == 0 || step == b.total || step == b.at0+1:
		fmt.Fprintf(b.p.w, "[%d/%d] %s\n", step, b.total, status)
	}
}

func (b *trainBar) draw() {
	const width = 24
	filled := b.p.done * width / max(1, b.total)
	fmt.Fprintf(b.p.w, "\r\x1b[K[%s%s] %d/%d  %s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), b.p.done, b.total, b.status)
}

// log prints a line above the bar.
func (b *trainBar) log(line string) {
	if b.p.tty {
		fmt.Fprintf(b.p.w, "\r\x1b[K%s\n", line)
		b.draw()
		return
	}
	fmt.Fprintln(b.p.w, line)
}

func (b *trainBar) finish() { b.p.finish() }

// taskMix plants the needle test's facts into a share of the training
// windows (TrainConfig.Tasks "retrieval=P,facts=K"): each window of step i
// draws from a generator seeded by the run's seed and its index, so a
// resumed run plants what the uninterrupted one would have.
type taskMix struct {
	b      *needle.Builder
	seed   uint64
	share  float64
	facts  int
	asks   int     // questions at the end of a planted window
	spread float64 // share of planted windows whose questions end a prefix of random length, text after
	repeat float64 // share of planted values drawn with repeating digits
	copy   float64 // share of windows ending with a copy of a stretch of themselves
	induct float64 // share of windows of random pieces whose second half copies stretches of the first
	weight float32 // of the answer's tokens in the loss
	hard   float32 // factor on the weight of an answer token whose preceding token recurs in the answer
	batch  int
	pool   []int // the pieces induction windows draw from: the vocabulary less its control pieces
}

// newTaskMix parses tc.Tasks; "" gives nil, no mix.
func newTaskMix(tok *tokenizer.Tokenizer, tc model.TrainConfig) (*taskMix, error) {
	if tc.Tasks == "" {
		return nil, nil
	}
	m := &taskMix{seed: tc.Seed, batch: tc.Batch, facts: 1, asks: 1, weight: 1, hard: 1}
	for item := range strings.SplitSeq(tc.Tasks, ",") {
		k, v, _ := strings.Cut(item, "=")
		var err error
		switch k {
		case "retrieval":
			m.share, err = strconv.ParseFloat(v, 64)
		case "facts":
			m.facts, err = strconv.Atoi(v)
		case "asks":
			m.asks, err = strconv.Atoi(v)
		case "spread":
			m.spread, err = strconv.ParseFloat(v, 64)
		case "repeats":
			m.repeat, err = strconv.ParseFloat(v, 64)
		case "copy":
			m.copy, err = strconv.ParseFloat(v, 64)
		case "induction":
			m.induct, err = strconv.ParseFloat(v, 64)
		case "weight":
			var w float64
			w, err = strconv.ParseFloat(v, 32)
			m.weight = float32(w)
		case "hard":
			var w float64
			w, err = strconv.ParseFloat(v, 32)
			m.hard = float32(w)
		default:
			err = fmt.Errorf("unknown task %q", k)
		}
		if err != nil {
			return nil, fmt.Errorf("training tasks %q: %v", tc.Tasks, err)
		}
	}
	if !(m.hard >= 1 && m.hard <= 1000) {
		return nil, fmt.Errorf("training tasks %q: want hard in [1, 1000]", tc.Tasks)
	}
	if !(m.spread >= 0 && m.spread <= 1) || !(m.repeat >= 0 && m.repeat <= 1) {
		return nil, fmt.Errorf("training tasks %q: want spread and repeats in [0, 1]", tc.Tasks)
	}
	if !(m.copy >= 0 && m.induct >= 0 && m.share+m.copy+m.induct <= 1) {
		return nil, fmt.Errorf("training tasks %q: want copy, induction >= 0 and retrieval + copy + induction <= 1", tc.Tasks)
	}
	if !(m.share >= 0 && m.share+m.copy+m.induct > 0 && m.share <= 1) || m.facts < 1 || m.facts > needle.MaxFacts || m.asks < 1 || m.asks > needle.MaxFacts || !(m.weight >= 1 && m.weight <= 1000) {
		return nil, fmt.Errorf("training tasks %q: want retrieval in [0, 1] (or a copy share), facts and asks in [1, %d] and weight in [1, 1000]", tc.Tasks, needle.MaxFacts)
	}
	b, err := needle.NewBuilder(tok, needle.DefaultTemplates())
	if err != nil {
		return nil, err
	}
	m.b = b
	if m.repeat > 0 {
		// Six digits from three: at least three of them repeat.
		m.b = b.WithValues(func(rng *rand.Rand) string {
			if rng.Float64() < m.repeat {
				return needle.DrawRepeatingValue(rng, 3)
			}
			return needle.DrawValue(rng)
		})
	}
	for id, k := range tok.Kinds() {
		if k == tokenizer.Normal || k == tokenizer.Undefined || k == tokenizer.Byte {
			m.pool = append(m.pool, id)
		}
	}
	if m.induct > 0 && len(m.pool) == 0 {
		return nil, fmt.Errorf("training tasks %q: induction windows need ordinary pieces, and the vocabulary has none", tc.Tasks)
	}
	return m, nil
}

// copyStretch returns window w with its last c tokens (c from an eighth
// to a quarter of it) replaced by a copy of c tokens from earlier in it,
// and the index of the copy's first token: the copy task that makes
// induction heads, the in-context copying that retrieval needs.
func copyStretch(rng *rand.Rand, w []int) ([]int, int) {
	n := len(w)
	c := n/8 + rng.IntN(n/8+1)
	at := n - c
	from := 1 + rng.IntN(max(at-c, 1))
	out := slices.Clone(w)
	copy(out[at:], w[from:from+c])
	return out, at
}

// inductionWindow returns a window of w's length whose first half is
// pieces drawn uniformly from pool (w's first token kept first) and whose
// second half copies stretches of 16 to 32 tokens of that half, each from
// a random offset, with the spans of predictions [from, to) that a copy
// makes certain (all but a stretch's first token). Nothing but in-context
// copying predicts them: the densest signal there is for forming
// induction heads, which small models trained on text alone do not form
// in a few million tokens. Pieces drawn from the whole vocabulary rarely
// repeat within a window, so the token before a prediction finds its
// stretch (pieces drawn from the window itself repeat "the" and ",", and
// a model trained on those formed no copying in 1,500 steps); the random
// offsets leave no fixed distance for a positional head to learn instead.
func inductionWindow(rng *rand.Rand, w, pool []int) ([]int, [][2]int) {
	n := len(w)
	out := make([]int, n)
	out[0] = w[0]
	half := max(n/2, 2)
	for i := 1; i < min(half, n); i++ {
		out[i] = pool[rng.IntN(len(pool))]
	}
	var spans [][2]int
	for at := half; at < n; {
		c := min(16+rng.IntN(17), n-at, half-1)
		from := 1 + rng.IntN(half-c)
		copy(out[at:at+c], out[from:from+c])
		if c > 1 {
			// Prediction k predicts token k+1.
			spans = append(spans, [2]int{at, at + c - 1})
		}
		at += c
	}
	return out, spans
}

// apply returns step i's batch with facts planted in its share of the
// windows, and the loss weights of its predictions: the answers' weigh
// m.weight, the rest 1 (nil when every weight is 1).
func (m *taskMix) apply(batch [][]int, i int) ([][]int, [][]float32, error) {
	out := make([][]int, len(batch))
	var weights [][]float32
	if m.weight != 1 || m.hard != 1 {
		weights = make([][]float32, len(batch))
	}
	for j, w := range batch {
		rng := rand.New(rand.NewPCG(m.seed^0x6e656564, uint64(i*m.batch+j)))
		out[j] = w
		if weights != nil {
			weights[j] = make([]float32, len(w)-1)
			for k := range weights[j] {
				weights[j][k] = 1
			}
		}
		u := rng.Float64()
		if u >= m.share+m.copy && u < m.share+m.copy+m.induct {
			var spans [][2]int
			out[j], spans = inductionWindow(rng, w, m.pool)
			if weights != nil {
				for _, sp := range spans {
					for k := sp[0]; k < sp[1]; k++ {
						weights[j][k] = m.weight
					}
				}
			}
			continue
		}
		if u >= m.share && u < m.share+m.copy {
			var at int
			out[j], at = copyStretch(rng, w)
			if weights != nil {
				// The copy's first token cannot be foreseen; the rest can.
				for k := at; k < len(weights[j]); k++ {
					weights[j][k] = m.weight
				}
			}
			continue
		}
		if u >= m.share {
			continue
		}
		// A model whose questions always end the window can learn to
		// answer only there, at one absolute position (the first token is
		// a clock): a spread window asks at the end of a prefix of 1/8 to
		// all of it, with the window's text after, as the needle test
		// asks at the end of prompts of every length.
		end := len(w)
		if m.spread > 0 && rng.Float64() < m.spread {
			end = len(w)/8 + rng.IntN(len(w)-len(w)/8+1)
			// The text after the answer starts a word, as text after an
			// answer would.
			end = max(m.b.WordStart(w, end), len(w)/8)
		}
		p, err := m.b.PlantAsking(rng, w[:end], m.facts, m.asks)
		if err != nil && end < len(w) {
			// No room for the facts in the prefix: the whole window.
			end = len(w)
			p, err = m.b.PlantAsking(rng, w, m.facts, m.asks)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("planting facts in window %d of step %d: %w", j, i, err)
		}
		out[j] = append(p.Tokens, w[end:]...)
		if weights != nil {
			// Prediction k predicts token k+1: an answer's tokens are
			// predicted from its AnswerAt-1 to the next question's At-1.
			for qi, q := range p.Questions {
				to := end - 1
				if qi+1 < len(p.Questions) {
					to = p.Questions[qi+1].At - 1
				}
				for k := max(q.AnswerAt-1, 0); k < to; k++ {
					weights[j][k] = m.weight
				}
				if m.hard != 1 {
					// The answer ends where the next question starts,
					// or the prefix ends: at to+1.
					weighHard(weights[j], out[j][q.AnswerAt:to+1], q.AnswerAt, m.hard)
				}
			}
		}
	}
	return out, weights, nil
}

// weighHard multiplies by f the weights w of the predictions made from
// an answer's tokens (ans, the window's tokens from at) that occur more
// than once in it: there the token before does not tell which comes next
// (508338's 3 is followed by 3 and by 8, its 8 by 3 and by the full
// stop), so the copy must go by the place in the value. Prediction k is
// of token k+1: these are the answer's next tokens and, from its last,
// the token after it. They are where the long model's misses were.
func weighHard(w []float32, ans []int, at int, f float32) {
	for i, t := range ans {
		n := 0
		for _, u := range ans {
			if u == t {
				n++
			}
		}
		if k := at + i; n > 1 && k < len(w) {
			w[k] *= f
		}
	}
}

// growTo returns the sizes of -init's model (from) with those given on
// the command line in place, and whether any differs.
func growTo(from, flags model.Config, given map[string]bool) (model.Config, bool) {
	to := from
	for _, f := range []struct {
		name     string
		dst, src *int
	}{{"dim", &to.Dim, &flags.Dim}, {"hidden", &to.Hidden, &flags.Hidden}, {"layers", &to.Layers, &flags.Layers},
		{"heads", &to.Heads, &flags.Heads}, {"kv-heads", &to.KVHeads, &flags.KVHeads}} {
		if given[f.name] {
			*f.dst = *f.src
		}
	}
	grow := to.Dim != from.Dim || to.Hidden != from.Hidden || to.Layers != from.Layers || to.Heads != from.Heads || to.KVHeads != from.KVHeads
	return to, grow
}
