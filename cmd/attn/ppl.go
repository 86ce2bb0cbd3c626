package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/attnkit/attn/cmd/austen"
	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/kvcache"
	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/tokenizer"
)

// modelFlags are the flags every model command shares.
type modelFlags struct {
	model, tokenizer string
	patches          listFlag
	seed             uint64
	workers          int
	cache            string // -cache, for the commands that decode
}

// registerCache adds -cache, for the commands whose models decode token
// by token (generate, needle, ppl -decode).
func (f *modelFlags) registerCache(fs *flagSet) {
	fs.StringVar(&f.cache, "cache", "f32", "`STORAGE` of the KV caches of decoding: f32, bf16, f16, i8 or i4, +rot for a Hadamard rotation (i4+rot); not f32, it makes a patched model of its own")
}

// storage parses -cache.
func (f *modelFlags) storage() (kvcache.DType, bool, error) {
	if f.cache == "" {
		return kvcache.F32, false, nil
	}
	dt, rot, err := kvcache.ParseStorage(f.cache)
	if err != nil {
		return 0, false, fmt.Errorf("-cache: %w", err)
	}
	return dt, rot, nil
}

func (f *modelFlags) register(fs *flagSet, patch bool) {
	fs.StringVar(&f.model, "model", "", "model `FILE`: GGUF (llama architecture) or a llama2.c checkpoint, or an embedded model: austen (the default) or austen-long (context 8192, trained to retrieve)")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "tokenizer `FILE`: a GGUF (its tokenizer metadata) or llama2.c tokenizer.bin (default: the GGUF's own, or tokenizer.bin beside -model)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the patched mechanisms (layer l gets seed+l)")
	fs.workersVar(&f.workers)
	if patch {
		fs.Var(&f.patches, "patch", "replace the attention of some layers: `SPEC` NAME[:layers=2-3,param=value,...] (repeatable, or ';'-separated)")
	}
}

// load reads the model and builds the exact model and, with -patch, the
// patched one (nil without).
func (f *modelFlags) load() (exact, patched *model.Model, tok *tokenizer.Tokenizer, err error) {
	var w *model.Weights
	if f.model == "" {
		// The default: the model attn trained on Austen, embedded.
		f.model = "austen"
	}
	if embedded, name, ok := austen.Embedded(f.model); ok {
		if f.tokenizer != "" {
			return nil, nil, nil, fmt.Errorf("-tokenizer needs a model file, not the embedded %s", f.model)
		}
		f.model = name
		w, tok, err = embedded()
	} else {
		w, tok, err = model.Open(f.model, f.tokenizer)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	if tok == nil {
		return nil, nil, nil, fmt.Errorf("%s has no tokenizer; give one with -tokenizer", f.model)
	}
	exact, err = model.New(w, model.Options{Workers: f.workers})
	if err != nil {
		return nil, nil, nil, err
	}
	var ps []model.Patch
	for _, spec := range f.patches {
		p, err := model.ParsePatch(spec)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("-patch: %w", err)
		}
		ps = append(ps, p...)
	}
	dt, rot, err := f.storage()
	if err != nil {
		return nil, nil, nil, err
	}
	if len(ps) > 0 || dt != kvcache.F32 || rot {
		if patched, err = model.New(w, model.Options{Workers: f.workers, Patches: ps, Seed: f.seed, Cache: dt, CacheRotate: rot}); err != nil {
			return nil, nil, nil, fmt.Errorf("-patch: %w", err)
		}
	}
	return exact, patched, tok, nil
}

func describeModel(path string, m *model.Model) string {
	c := m.Config()
	tied := "separate output"
	if c.TiedOutput {
		tied = "tied output"
	}
	n := float64(m.Weights().Params())
	size := fmt.Sprintf("%.1fM", n/1e6)
	if n < 1e6 {
		size = fmt.Sprintf("%.1fK", n/1e3)
	}
	return fmt.Sprintf("%s: dim %d, hidden %d, %d layers, %d heads (%d kv), head size %d, vocab %d, context %d, %s, %s weights",
		filepath.Base(path), c.Dim, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.HeadDim(), c.Vocab, c.SeqLen, tied, size)
}

// pplJSON is what ppl writes to -out DIR/ppl.json.
type pplJSON struct {
	Model       string  `json:"model"`
	Text        string  `json:"text"`
	Context     int     `json:"context"`
	Stride      int     `json:"stride"`
	Windows     int     `json:"windows"`
	Tokens      int     `json:"tokens"`
	Chars       int     `json:"chars"`
	Perplexity  float64 `json:"perplexity"`
	BitsPerChar float64 `json:"bits_per_char"`
	// Decode and Cache are -decode and -cache (absent: whole windows,
	// float32 caches).
	Decode       bool          `json:"decode,omitempty"`
	Cache        string        `json:"cache,omitempty"`
	Patch        []string      `json:"patch,omitempty"`
	PatchedPPL   float64       `json:"patched_perplexity,omitempty"`
	PatchedBPC   float64       `json:"patched_bits_per_char,omitempty"`
	MeanKL       float64       `json:"mean_kl,omitempty"`
	LayerRelErrs []layerRelErr `json:"layers,omitempty"`
	// Fallbacks has a line for each patched layer that ran exact
	// attention instead of its approximation, saying why.
	Fallbacks []string `json:"fallbacks,omitempty"`
}

type layerRelErr struct {
	Layer     int     `json:"layer"`
	Attention string  `json:"attention"`
	RelErr    float64 `json:"rel_err"`
}

func cmdPPL(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ppl", stdout, stderr, helpText{
		synopsis: "attn ppl [-model FILE] [-text FILE] [-ctx N] [-stride S] [-patch SPEC] [-out DIR] [flags]",
		examples: []string{
			"attn ppl -ctx 2048 -stride 1024        # the embedded model on embedded Persuasion",
			`attn ppl -text book.txt -patch "hyper:layers=2-3,block=32,samples=32,min=0" -out ppl-out`,
		},
		about: `Perplexity and bits per character over sliding windows; with -patch, also
the patched model's, its mean KL divergence from the exact model and each
patched layer's attention error. Without -model, the embedded model.`,
	})
	var mf modelFlags
	mf.register(fs, true)
	textPath := fs.String("text", "", "text `FILE` to score (UTF-8; .gz is read gunzipped; default: Persuasion, embedded)")
	ctxLen := fs.Int("ctx", 0, "tokens per window (0: the model's context, or 512)")
	stride := fs.Int("stride", 0, "tokens a window moves (0: half the window)")
	limit := fs.Int("tokens", 0, "score only the first `N` tokens of the text (0: all)")
	decode := fs.Bool("decode", false, "score as generation runs: each window's earlier tokens as one prompt, then every scored token decoded alone through each layer's decoder (quest, magicpig and -cache approximate only so)")
	mf.registerCache(fs)
	out := fs.String("out", "", "write `DIR`/ppl.json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if mf.cache != "f32" && !*decode {
		return fmt.Errorf("-cache %s: the KV cache is used only in decoding; add -decode", mf.cache)
	}
	tcfg := experiment.TextConfig{Path: *textPath, Limit: *limit, Context: *ctxLen, Stride: *stride}
	if err := tcfg.Check(); err != nil {
		return err
	}
	exact, patched, tok, err := mf.load()
	if err != nil {
		return err
	}
	tcfg.SeqLen = exact.Config().SeqLen
	text, err := experiment.LoadText(tcfg, tok)
	if err != nil {
		return err
	}
	printLines(stderr, text.Notes)
	tokens, chars, opts := text.Tokens, text.Chars, text.Options()
	opts.Decode = *decode
	res := pplJSON{Model: mf.model, Text: text.Name, Context: opts.Context, Stride: opts.Stride, Chars: chars, Decode: *decode}
	if mf.cache != "f32" {
		res.Cache = mf.cache
	}
	fmt.Fprintln(stdout, "model ", describeModel(mf.model, exact))
	fmt.Fprintf(stdout, "text   %s: %d characters, %d tokens; windows of %d tokens, stride %d: %d windows\n",
		text.Name, chars, len(tokens), opts.Context, opts.Stride, text.Windows)
	m := exact
	if patched != nil {
		m, opts.Reference = patched, exact
		var lm experiment.LayerModel = patched
		if *decode {
			lm = decodeFallbacks{patched}
		}
		res.Fallbacks = experiment.LayerFallbacks(lm, patched.Config().Layers, text.Longest, text.Shortest)
		printLines(stderr, res.Fallbacks)
	}
	prog := newProgress(stderr, text.Windows, 0)
	prog.begin("window 1")
	opts.Progress = func(done, total int) {
		prog.end("")
		if done < total {
			prog.begin(fmt.Sprintf("window %d", done+1))
		}
	}
	r, err := model.Perplexity(ctx, m, tokens, opts)
	prog.finish()
	if err != nil {
		return err
	}
	res.Windows, res.Tokens = r.Windows, r.Tokens
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	how := ""
	if *decode {
		how = ", each decoded alone after its window's earlier tokens"
	}
	fmt.Fprintf(stdout, "scored %d tokens%s\n\n", r.Tokens, how)
	fmt.Fprintln(tw, "model\tperplexity\tbits/char\tnats/token\tKL(exact‖patched) nats/token")
	if patched == nil {
		res.Perplexity, res.BitsPerChar = r.PPL(), r.BitsPerChar(chars)
		fmt.Fprintf(tw, "exact\t%.6g\t%.4f\t%.4f\t\n", r.PPL(), r.BitsPerChar(chars), r.NLL/float64(r.Tokens))
	} else {
		refBPC := r.RefNLL / math.Ln2 / float64(chars)
		res.Perplexity, res.BitsPerChar = r.RefPPL(), refBPC
		res.Patch = mf.patches
		if len(res.Patch) == 0 {
			res.Patch = nil
		}
		res.PatchedPPL, res.PatchedBPC, res.MeanKL = r.PPL(), r.BitsPerChar(chars), r.MeanKL()
		fmt.Fprintf(tw, "exact\t%.6g\t%.4f\t%.4f\t\n", r.RefPPL(), refBPC, r.RefNLL/float64(r.Tokens))
		fmt.Fprintf(tw, "patched\t%.6g\t%.4f\t%.4f\t%.5g\n", r.PPL(), r.BitsPerChar(chars), r.NLL/float64(r.Tokens), r.MeanKL())
	}
	tw.Flush()
	if patched != nil && r.LayerErr != nil {
		fmt.Fprintln(stdout, "\nattention output error of each layer against exact attention on the same inputs:")
		tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "layer\tattention\trel. error")
		for l, e := range r.LayerErr {
			res.LayerRelErrs = append(res.LayerRelErrs, layerRelErr{l, patched.Attention(l), e})
			fmt.Fprintf(tw, "%d\t%s\t%.4g\n", l, patched.Attention(l), e)
		}
		tw.Flush()
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		path := filepath.Join(*out, "ppl.json")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "\nwrote", path)
	}
	return nil
}

// patchSummary joins -patch values for messages.
func patchSummary(ps []string) string { return strings.Join(ps, "; ") }

// decodeFallbacks reads a model's fallbacks as its decoders report them
// (model.DecodeFallback), for ppl -decode: quest and magicpig run exact
// attention on whole windows and approximate only in decoding.
type decodeFallbacks struct{ *model.Model }

func (d decodeFallbacks) Fallback(l, n int) string { return d.DecodeFallback(l, n) }
