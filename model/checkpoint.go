package model

import (
	"fmt"
	"io"
	"math"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/model/tokenizer"
)

// A checkpoint is a llama GGUF file (F32, with the tokenizer) plus the
// trainer's state: its settings and step count as train.* metadata and
// Adam's moments as train.adam_m.NAME and train.adam_v.NAME tensors.
// ReadGGUF skips the train.* tensors, so a checkpoint is also a model
// every command runs.
const trainPrefix = "train."

// Save writes a checkpoint of the trainer, with tok (which may be nil),
// from which Resume continues exactly where this run is.
func (t *Trainer) Save(out io.Writer, tok *tokenizer.Tokenizer, name string) error {
	c := t.tc
	meta := []gguf.KV{
		{Key: "train.attention", Value: c.Attention},
		{Key: "train.tasks", Value: c.Tasks},
		{Key: "train.context", Value: uint64(c.Context)},
		{Key: "train.batch", Value: uint64(c.Batch)},
		{Key: "train.steps", Value: uint64(c.Steps)},
		{Key: "train.warmup", Value: uint64(c.Warmup)},
		{Key: "train.lr", Value: c.LR},
		{Key: "train.min_lr", Value: c.MinLR},
		{Key: "train.weight_decay", Value: c.WeightDecay},
		{Key: "train.beta1", Value: c.Beta1},
		{Key: "train.beta2", Value: c.Beta2},
		{Key: "train.eps", Value: c.Eps},
		{Key: "train.clip", Value: c.Clip},
		{Key: "train.seed", Value: c.Seed},
		{Key: "train.step", Value: uint64(t.step)},
	}
	var extra []gguf.Tensor
	for i, ts := range t.ts {
		dims := ggufDims(ts.Shape)
		extra = append(extra,
			gguf.Tensor{Name: trainPrefix + "adam_m." + ts.Name, Dims: dims, Type: gguf.F32, Data: t.m[i]},
			gguf.Tensor{Name: trainPrefix + "adam_v." + ts.Name, Dims: dims, Type: gguf.F32, Data: t.v[i]})
	}
	return writeGGUF(out, t.w, tok, gguf.F32, name, meta, extra)
}

// Resume reads a checkpoint written by Trainer.Save and returns a trainer
// that continues the run (its weights, moments, settings and step count),
// and the checkpoint's tokenizer (nil when it has none). workers replaces
// the saved run's (0: GOMAXPROCS); it does not change the results.
func Resume(r io.ReaderAt, size int64, workers int) (*Trainer, *tokenizer.Tokenizer, error) {
	f, err := gguf.Read(r, size)
	if err != nil {
		return nil, nil, err
	}
	w, tok, err := readModel(f)
	if err != nil {
		return nil, nil, err
	}
	var tc TrainConfig
	var errs []error
	u := func(key string) int {
		v, err := f.Uint(key)
		if err == nil && v > math.MaxInt32 {
			err = fmt.Errorf("%w: %s = %d is too large", ErrFormat, key, v)
		}
		errs = append(errs, err)
		return int(v)
	}
	fl := func(key string) float64 {
		v, err := f.Float(key)
		errs = append(errs, err)
		return v
	}
	tc.Attention, err = f.String("train.attention")
	errs = append(errs, err)
	if _, ok := f.Value("train.tasks"); ok { // absent in older checkpoints
		tc.Tasks, err = f.String("train.tasks")
		errs = append(errs, err)
	}
	tc.Context, tc.Batch, tc.Steps, tc.Warmup = u("train.context"), u("train.batch"), u("train.steps"), u("train.warmup")
	tc.LR, tc.MinLR, tc.WeightDecay = fl("train.lr"), fl("train.min_lr"), fl("train.weight_decay")
	tc.Beta1, tc.Beta2, tc.Eps, tc.Clip = fl("train.beta1"), fl("train.beta2"), fl("train.eps"), fl("train.clip")
	seed, err := f.Uint("train.seed")
	errs = append(errs, err)
	tc.Seed = seed
	step := u("train.step")
	for _, e := range errs {
		if e != nil {
			return nil, nil, fmt.Errorf("%w: not a training checkpoint: %v", ErrFormat, e)
		}
	}
	if tc.WeightDecay == 0 {
		tc.WeightDecay = -1 // saved as applied: none
	}
	if tc.Clip <= 0 {
		tc.Clip = -1
	}
	tc.Workers = workers
	t, err := NewTrainer(w, tc)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: checkpoint settings: %v", ErrFormat, err)
	}
	t.step = step
	for i, ts := range t.ts {
		for _, mv := range []struct {
			name string
			dst  []float32
		}{{"adam_m.", t.m[i]}, {"adam_v.", t.v[i]}} {
			name := trainPrefix + mv.name + ts.Name
			info, ok := f.Tensor(name)
			if !ok || info.Elems() != uint64(len(mv.dst)) {
				return nil, nil, fmt.Errorf("%w: checkpoint lacks %s or it has the wrong size", ErrFormat, name)
			}
			data, err := f.ReadTensor(name)
			if err != nil {
				return nil, nil, err
			}
			for _, x := range data {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return nil, nil, fmt.Errorf("%w: %s holds %v", ErrFormat, name, x)
				}
			}
			copy(mv.dst, data)
		}
	}
	if tok != nil && tok.Len() != w.Config.Vocab {
		return nil, nil, fmt.Errorf("%w: tokenizer of %d pieces for a vocabulary of %d", attn.ErrInput, tok.Len(), w.Config.Vocab)
	}
	return t, tok, nil
}
