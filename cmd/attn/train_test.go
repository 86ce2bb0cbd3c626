package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/tokenizer"
)

// trainText writes a small gzip'd corpus of random sentences from a
// small lexicon, and a plain validation text.
func trainText(t *testing.T) (train, val string) {
	t.Helper()
	dir := t.TempDir()
	words := strings.Fields("the cat sat on a mat and she said that it was very good to see him again in the house of her father")
	rng := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(words[rng.IntN(len(words))])
			if i%12 == 11 {
				b.WriteString(".\n")
			} else {
				b.WriteByte(' ')
			}
		}
		return b.String()
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(text(3000)))
	zw.Close()
	train, val = filepath.Join(dir, "train.txt.gz"), filepath.Join(dir, "val.txt")
	if err := os.WriteFile(train, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(val, []byte(text(300)), 0o644); err != nil {
		t.Fatal(err)
	}
	return train, val
}

func TestTrainCommand(t *testing.T) {
	train, val := trainText(t)
	dir := t.TempDir()
	out, ckpt := filepath.Join(dir, "m.gguf"), filepath.Join(dir, "c.gguf")
	args := []string{"train", "-text", train, "-val", val, "-vocab", "320", "-dim", "32", "-hidden", "48",
		"-layers", "2", "-heads", "4", "-kv-heads", "2", "-ctx", "32", "-batch", "2", "-steps", "6",
		"-eval", "3", "-save", "3", "-checkpoint", ckpt, "-o", out, "-workers", "1"}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("attn train: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"vocab  320 pieces", "validation loss", "wrote " + out, "% of the time in attention"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	if !strings.Contains(stderr.String(), "step 6  train loss") {
		t.Errorf("progress lacks the validation line:\n%s", stderr.String())
	}
	w, tok, err := model.Open(out, "")
	if err != nil {
		t.Fatal(err)
	}
	if tok == nil || tok.Len() != 320 || w.Config.SeqLen != 32 || w.Config.KVHeads != 2 {
		t.Fatalf("model: tokenizer %v, config %+v", tok != nil, w.Config)
	}
	// The model runs in the other commands.
	stdout.Reset()
	if code := run(context.Background(), []string{"ppl", "-model", out, "-text", val}, &stdout, &stderr); code != 0 {
		t.Fatalf("attn ppl on the trained model: exit %d\n%s", code, stderr.String())
	}
	// Resuming the finished checkpoint with more steps is the same run:
	// its settings win, so it has nothing left to do and writes the same
	// weights.
	out2 := filepath.Join(dir, "m2.gguf")
	stdout.Reset()
	if code := run(context.Background(), []string{"train", "-text", train, "-resume", ckpt, "-o", out2, "-type", "f32", "-steps", "100"}, &stdout, &stderr); code != 0 {
		t.Fatalf("attn train -resume: exit %d\n%s", code, stderr.String())
	}
	w2, _, err := model.Open(out2, "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.Layers[1].W2, w2.Layers[1].W2) {
		t.Errorf("the resumed run's weights differ from the checkpoint's")
	}
	// Continued training from the model at a longer context, with a new
	// rotary base and the retrieval task mixed in; the checkpoint keeps
	// the task, so resuming it mixes the same.
	out3, ckpt3 := filepath.Join(dir, "m3.gguf"), filepath.Join(dir, "c3.gguf")
	stdout.Reset()
	args = []string{"train", "-text", train, "-init", out, "-ctx", "200", "-rope-base", "40000", "-retrieval", "1", "-facts", "2", "-answer-weight", "5",
		"-steps", "2", "-batch", "1", "-checkpoint", ckpt3, "-o", out3, "-workers", "1"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("attn train -init: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"init   " + out, "rope base 40000", "retrieval=1,facts=2,weight=5"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	w3, _, err := model.Open(out3, "")
	if err != nil {
		t.Fatal(err)
	}
	if w3.Config.SeqLen != 200 || w3.Config.RopeBase != 40000 || w3.Config.Dim != 32 {
		t.Errorf("continued model: %+v", w3.Config)
	}
	// Size flags with -init grow the model; those not given keep its own.
	out4 := filepath.Join(dir, "m4.gguf")
	stdout.Reset()
	args = []string{"train", "-text", train, "-init", out, "-ctx", "32", "-dim", "48", "-heads", "6", "-kv-heads", "3",
		"-steps", "1", "-batch", "1", "-o", out4, "-workers", "1"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("attn train -init -dim: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "widen  dim 32→48, hidden 48→48, layers 2→2, heads 4/2→6/3") {
		t.Errorf("output lacks the widening:\n%s", stdout.String())
	}
	if w4, _, err := model.Open(out4, ""); err != nil {
		t.Fatal(err)
	} else if c := w4.Config; c.Dim != 48 || c.Hidden != 48 || c.Layers != 2 || c.Heads != 6 || c.KVHeads != 3 {
		t.Errorf("widened model: %+v", c)
	}
	args = []string{"train", "-text", train, "-init", out, "-ctx", "32", "-dim", "16", "-heads", "2", "-steps", "1", "-o", out4}
	if code := run(context.Background(), args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "shrinks") {
		t.Errorf("attn train -init -dim 16 (narrower): exit %d\n%s", code, stderr.String())
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"train", "-text", train, "-resume", ckpt3, "-o", out3}, &stdout, &stderr); code != 0 {
		t.Fatalf("attn train -resume of the retrieval run: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "retrieval=1,facts=2,weight=5") {
		t.Errorf("the resumed run lost its task mix:\n%s", stdout.String())
	}
}

func TestTrainCommandErrors(t *testing.T) {
	train, _ := trainText(t)
	for _, args := range [][]string{
		{"train"},
		{"train", "-text", "/nonexistent.txt"},
		{"train", "-text", train, "-type", "q4"},
		{"train", "-text", train, "-attn", "linformer", "-vocab", "320", "-dim", "32", "-hidden", "48", "-heads", "4"},
		{"train", "-text", train, "-retrieval", "2"},
		{"train", "-text", train, "-rope-base", "0.5"},
		{"train", "-text", train, "-init", "/nonexistent.gguf"},
		{"train", "-text", train, "-vocab", "320", "-dim", "36", "-hidden", "48", "-heads", "4"},
		{"train", "-text", train, "-resume", train},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code == 0 {
			t.Errorf("attn %v succeeded", args)
		}
	}
}

// taskMixBatch returns the embedded tokenizer and windows windows of L+1
// tokens of held-out Persuasion, one after another.
func taskMixBatch(t *testing.T, windows, L int) (*tokenizer.Tokenizer, [][]int) {
	t.Helper()
	_, tok, err := austen.Load()
	if err != nil {
		t.Fatal(err)
	}
	hold, err := austen.HeldOut()
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(hold[:60000], false)
	batch := make([][]int, windows)
	for j := range batch {
		batch[j] = ids[j*L : (j+1)*L+1]
	}
	return tok, batch
}

// applyMix builds the training mix of tasks with seed for batches of
// len(batch) windows, and returns it with what it makes of batch as step
// i.
func applyMix(t *testing.T, tok *tokenizer.Tokenizer, batch [][]int, tasks string, seed uint64, i int) (*taskMix, [][]int, [][]float32) {
	t.Helper()
	m, err := newTaskMix(tok, model.TrainConfig{Tasks: tasks, Seed: seed, Batch: len(batch)})
	if err != nil {
		t.Fatal(err)
	}
	out, weights, err := m.apply(batch, i)
	if err != nil {
		t.Fatal(err)
	}
	return m, out, weights
}

// TestTaskMix checks the planted, copied and induction windows of a training mix:
// lengths kept, answers and copies weighted and nothing else, copies equal
// to an earlier stretch, and the same batch for the same step.
func TestTaskMix(t *testing.T) {
	const L, weight = 400, 4
	tok, batch := taskMixBatch(t, 24, L)
	m, out, weights := applyMix(t, tok, batch, "retrieval=0.4,facts=3,asks=2,copy=0.2,induction=0.2,weight=4", 3, 5)
	kinds := map[string]int{}
	for j, w := range out {
		if len(w) != L+1 || len(weights[j]) != L {
			t.Fatalf("window %d: %d tokens and %d weights, want %d and %d", j, len(w), len(weights[j]), L+1, L)
		}
		first := slices.Index(weights[j], weight)
		for _, x := range weights[j] {
			if x != 1 && x != weight {
				t.Fatalf("window %d: weight %v", j, x)
			}
		}
		switch {
		case first < 0:
			kinds["plain"]++
			if !slices.Equal(w, batch[j]) {
				t.Fatalf("window %d: unweighted but changed", j)
			}
		case strings.Contains(tok.Decode(w), "magic number"):
			kinds["planted"]++
			if !strings.Contains(tok.Decode(w[first+1:]), "What is the special magic number") && weights[j][L-1] != weight {
				t.Fatalf("window %d: planted window without its last answer weighted", j)
			}
		case slices.Equal(w[:first], batch[j][:first]):
			kinds["copy"]++
			c := len(w) - first
			if !slices.Equal(w[:first], batch[j][:first]) || slices.Contains(weights[j][first:], 1) {
				t.Fatalf("window %d: a copy that changes its start or is weighted in part", j)
			}
			found := false
			for from := 1; from+c <= first; from++ {
				if slices.Equal(w[from:from+c], w[first:]) {
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("window %d: its weighted end is not a copy of an earlier stretch", j)
			}
		default:
			kinds["induction"]++
			half := len(w) / 2
			if w[0] != batch[j][0] || first < half {
				t.Fatalf("window %d: induction window with first token %d, first weight at %d", j, w[0], first)
			}
			for _, x := range w[1:half] {
				if k := tok.Kind(x); k != tokenizer.Normal && k != tokenizer.Byte {
					t.Fatalf("window %d: token %d is of kind %v, not an ordinary piece", j, x, k)
				}
			}
			// A weighted prediction k predicts w[k+1], which follows w[k]
			// somewhere in the first half too.
			for k := half; k < L; k++ {
				if weights[j][k] != weight {
					continue
				}
				ok := false
				for i := 1; i+1 < half; i++ {
					ok = ok || (w[i] == w[k] && w[i+1] == w[k+1])
				}
				if !ok {
					t.Fatalf("window %d: weighted prediction %d is no copy", j, k)
				}
			}
		}
	}
	again, weights2, err := m.apply(batch, 5)
	if err != nil {
		t.Fatal(err)
	}
	for j := range again {
		if !slices.Equal(again[j], out[j]) || !slices.Equal(weights2[j], weights[j]) {
			t.Fatal("same step, another batch")
		}
	}
	t.Logf("windows: %v", kinds)
	if len(kinds) != 4 {
		t.Errorf("24 windows of four kinds: %v", kinds)
	}
	if _, err := newTaskMix(tok, model.TrainConfig{Tasks: "retrieval=0.8,copy=0.3"}); err == nil {
		t.Error("retrieval + copy > 1 accepted")
	}
}

// With repeats=1 every planted value has at most three distinct digits;
// without, most have more.
func TestTaskMixRepeats(t *testing.T) {
	const L, windows = 400, 16
	tok, batch := taskMixBatch(t, windows, L)
	value := regexp.MustCompile(`is #([0-9]{6})\.`)
	few := func(tasks string) (int, int) {
		_, out, _ := applyMix(t, tok, batch, tasks, 9, 3)
		n, k := 0, 0
		for _, w := range out {
			for _, v := range value.FindAllStringSubmatch(tok.Decode(w), -1) {
				n++
				distinct := map[rune]bool{}
				for _, c := range v[1] {
					distinct[c] = true
				}
				if len(distinct) <= 3 {
					k++
				}
			}
		}
		return k, n
	}
	if k, n := few("retrieval=1,facts=4,repeats=1"); n < windows || k != n {
		t.Errorf("repeats=1: %d of %d values with at most three digits, want all (and >= %d)", k, n, windows)
	}
	if k, n := few("retrieval=1,facts=4"); n < windows || k > n/2 {
		t.Errorf("no repeats: %d of %d values with at most three digits, want few", k, n)
	}
	if _, err := newTaskMix(tok, model.TrainConfig{Tasks: "retrieval=1,repeats=2"}); err == nil {
		t.Error("repeats=2 accepted")
	}
}

// With hard=3 a prediction of an answer's digit made from a digit that
// occurs more than once in the value weighs three times the answers'
// weight, and the prediction of the token after the value (text, weight
// 1) three times 1; the other predictions of the answer keep the answers'
// weight, and the needles' digits (text) weigh 1.
func TestTaskMixHard(t *testing.T) {
	const L, windows, weight, hard = 400, 16, 2, 3
	tok, batch := taskMixBatch(t, windows, L)
	_, out, weights := applyMix(t, tok, batch, "retrieval=1,facts=2,asks=2,weight=2,hard=3,repeats=1", 4, 1)
	isDigit := func(id int) bool {
		s := tok.Decode([]int{id})
		return len(s) == 1 && s[0] >= '0' && s[0] <= '9'
	}
	answers, hardOnes, needles := 0, 0, 0
	for j, w := range out {
		for i := 0; i+6 < len(w); i++ {
			if tok.Decode([]int{w[i]}) != "#" || !isDigit(w[i+1]) {
				continue
			}
			digits := w[i+1 : i+7]
			if weights[j][i] == 1 {
				needles++ // a needle: text
				continue
			}
			answers++
			if weights[j][i] != weight {
				t.Errorf("window %d: the first digit after # at %d weighs %v, want %v", j, i, weights[j][i], weight)
			}
			for r, d := range digits {
				count := 0
				for _, e := range digits {
					if e == d {
						count++
					}
				}
				want := float32(weight)
				if r == len(digits)-1 {
					want = 1
				}
				if count > 1 {
					want *= hard
					hardOnes++
				}
				if k := i + 1 + r; k < len(weights[j]) && weights[j][k] != want {
					t.Errorf("window %d: the prediction after digit %d of %s weighs %v, want %v", j, r, tok.Decode(digits), weights[j][k], want)
				}
			}
		}
	}
	if answers < windows || needles < windows || hardOnes < answers {
		t.Errorf("%d answers, %d needles, %d predictions from recurring digits: want at least %d, %d and one an answer", answers, needles, hardOnes, windows, windows)
	}
	if _, err := newTaskMix(tok, model.TrainConfig{Tasks: "retrieval=1,hard=0.5"}); err == nil {
		t.Error("hard=0.5 accepted")
	}
}

// A spread planted window asks at the end of a prefix of random length:
// the answer's last token ends the prefix, the window's own text follows
// unweighted, and the prefixes' ends vary over the window.
func TestTaskMixSpread(t *testing.T) {
	const L, weight, windows = 400, 4, 24
	tok, batch := taskMixBatch(t, windows, L)
	m, out, weights := applyMix(t, tok, batch, "retrieval=1,facts=2,spread=1,weight=4", 5, 2)
	short := 0
	for j, w := range out {
		last := len(weights[j]) - 1
		for last >= 0 && weights[j][last] != weight {
			last--
		}
		if len(w) != L+1 || last < 0 {
			t.Fatalf("window %d: %d tokens, last weighted prediction %d", j, len(w), last)
		}
		end := last + 2 // prediction k predicts token k+1
		if !slices.Equal(w[end:], batch[j][end:]) {
			t.Fatalf("window %d: the text after the answer (from %d) is not the window's own", j, end)
		}
		if !strings.Contains(tok.Decode(w[:end]), "What is the special magic number") {
			t.Fatalf("window %d: no question before the prefix's end %d", j, end)
		}
		// The text after the answer starts a word: no answer runs on
		// into the middle of one.
		if end < len(w) && m.b.WordStart(batch[j], end) != end {
			t.Fatalf("window %d: the text after the answer starts mid-word (%q)", j, tok.Decode(batch[j][end-1:end+1]))
		}
		if end < L/2 {
			short++
		}
	}
	if short == 0 || short == windows {
		t.Errorf("%d of %d prefixes end in the window's first half: want some, not all", short, windows)
	}
	if _, err := newTaskMix(tok, model.TrainConfig{Tasks: "retrieval=1,spread=2"}); err == nil {
		t.Error("spread 2 accepted")
	}
}
