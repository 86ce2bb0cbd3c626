package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/attnkit/attn/model"
	"github.com/attnkit/attn/model/gguf"
	"github.com/attnkit/attn/tensorio"
)

func cmdInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", stdout, stderr, helpText{
		synopsis: "attn inspect FILE.gguf [-tensor NAME -o OUT.npy]",
		examples: []string{
			"attn inspect model.gguf                                      # metadata and the tensor table",
			"attn inspect model.gguf -tensor blk.0.attn_q.weight -o q.npy # one tensor, dequantised",
		},
		about: `Prints a GGUF file's metadata (long strings and arrays abbreviated) and a
table of its tensors (name, type, dimensions in ggml's ne order, bytes).
With -tensor, writes that tensor dequantised to float32 as .npy instead:
its numpy shape is the GGUF dimensions reversed (ne[0], the fastest
axis, last).`,
	})
	tensor := fs.String("tensor", "", "write the tensor `NAME` as .npy (with -o)")
	out := fs.String("o", "", "the .npy `FILE` of -tensor")
	path, rest := splitFirstArg(args)
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if path == "" {
		if path = fs.Arg(0); path == "" {
			return fmt.Errorf("give a GGUF file: attn inspect FILE.gguf")
		}
	}
	if (*tensor == "") != (*out == "") {
		return fmt.Errorf("-tensor and -o go together")
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	g, err := gguf.Read(f, st.Size())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if *tensor == "" {
		return g.Summary(stdout)
	}
	t, err := g.TensorNPY(*tensor)
	if err != nil {
		return err
	}
	if err := tensorio.WriteNPYFile(*out, t); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s: %s %v\n", *out, *tensor, t.Shape)
	return nil
}

func cmdTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("tokenize", stdout, stderr, helpText{
		synopsis: "attn tokenize -model FILE.gguf (-prompt TEXT | -text FILE) [-json]",
		examples: []string{
			`attn tokenize -model llama3.gguf -prompt "Hello, world" -json`,
		},
		about: `Prints the token ids of a text under a GGUF file's tokenizer, read from its
metadata alone (a vocabulary-only GGUF works, as llama.cpp's vocab files
do): SentencePiece ("llama") or byte-level BPE ("gpt2", with the
pre-tokenizer tokenizer.ggml.pre names). Special tokens in the text are
parsed, and BOS/EOS added as the metadata says, as llama-tokenize does.`,
	})
	modelPath := fs.String("model", "", "GGUF `FILE` whose tokenizer is used (or a llama2.c tokenizer.bin)")
	prompt := fs.String("prompt", "", "the `TEXT` to tokenize")
	textPath := fs.String("text", "", "or a UTF-8 text `FILE` (.gz is read gunzipped)")
	asJSON := fs.Bool("json", false, "print a JSON array of ids")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *modelPath == "" {
		return fmt.Errorf("-model is required")
	}
	if (*prompt == "") == (*textPath == "") {
		return fmt.Errorf("give one of -prompt and -text")
	}
	text := *prompt
	if *textPath != "" {
		var err error
		if text, err = readTextFile(*textPath); err != nil {
			return err
		}
	}
	tok, err := model.OpenTokenizer(*modelPath)
	if err != nil {
		return fmt.Errorf("%s: %w", *modelPath, err)
	}
	ids := tok.Tokenize(text, true, true)
	if *asJSON {
		b, err := json.Marshal(ids)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, string(b))
		return err
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	_, err = fmt.Fprintln(stdout, strings.Join(parts, " "))
	return err
}

// splitFirstArg takes a leading argument that is not a flag (the file of
// attn inspect FILE -tensor ...), so that flags may follow it.
func splitFirstArg(args []string) (string, []string) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], args[1:]
	}
	return "", args
}
