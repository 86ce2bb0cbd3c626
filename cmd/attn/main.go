// Command attn runs, checks and benchmarks the attention mechanisms of
// github.com/attnkit/attn.
//
// Usage:
//
//	attn bench [flags]     time, memory and error of every mechanism over a sweep of lengths
//	attn accuracy [flags]  error against exact as each mechanism's budget grows
//	attn run [flags]       one mechanism on tensors read from .npy or safetensors
//	attn ppl [flags]       perplexity and bits/char of a model, exact or with patched attention
//	attn patching [flags]  perplexity and attention time as the last ℓ layers are patched, per mechanism
//	attn generate [flags]  stream text from a model and report prefill and decode tokens/s
//	attn train [flags]     train a model and its tokenizer on plain text, in pure Go
//	attn dump [flags]      write one layer's Q, K, V (after RoPE) and output as .npy
//
// Run `attn <command> -h` for the flags of each command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

var commands = []struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}{
	{"bench", "time, memory and error of every mechanism over a sweep of lengths", cmdBench},
	{"run", "run one mechanism on tensors from .npy or safetensors files", cmdRun},
	{"accuracy", "error against exact attention as each mechanism's budget grows", cmdAccuracy},
	{"ppl", "perplexity over sliding windows; with -patch also KL from exact and per-layer error", cmdPPL},
	{"patching", "perplexity and attention time as the last ℓ layers get each approximation (HyperAttention Fig. 3)", cmdPatching},
	{"needle", "needle in a haystack: retrieval accuracy per mechanism, context length and depth", cmdNeedle},
	{"generate", "generate text from a GGUF or llama2.c model, with any attention per layer", cmdGenerate},
	{"train", "train a model and its tokenizer on text: AdamW, cosine schedule, checkpoints", cmdTrain},
	{"dump", "write a layer's attention inputs (Q, K, V after RoPE) as .npy for attn accuracy", cmdDump},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: attn <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'attn <command> -h' for a command's flags.")
}

// run is main without the process: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		}
		fmt.Fprintf(stderr, "attn %s: %v\n", c.name, err)
		return 1
	}
	fmt.Fprintf(stderr, "attn: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// errUsage marks an error the flag package has already printed.
var errUsage = errors.New("usage")

// parseFlags parses args with fs, which prints its own errors to stderr.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return errUsage
	}
	return nil
}

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }
