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
//	attn needle [flags]    needle in a haystack: retrieval accuracy per mechanism, length and depth
//	attn generate [flags]  stream text from a model and report prefill and decode tokens/s
//	attn train [flags]     train a model and its tokenizer on plain text, in pure Go
//	attn dump [flags]      write one layer's Q, K, V (after RoPE) and output as .npy
//	attn report -out DIR   write DIR/report.html again from the results in DIR
//	attn version           the version of attn and of Go
//
// Run `attn help <command>` (or `attn <command> -h`) for a command's
// synopsis, examples and flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"

	"github.com/attnkit/attn"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"bench", "time, memory and error of every mechanism over a sweep of lengths", cmdBench},
	{"run", "run one mechanism on tensors from .npy or safetensors files", cmdRun},
	{"accuracy", "error against exact attention as each mechanism's budget grows", cmdAccuracy},
	{"ppl", "perplexity over sliding windows; with -patch also KL from exact and per-layer error", cmdPPL},
	{"patching", "perplexity and attention time as the last ℓ layers get each approximation (HyperAttention Fig. 3)", cmdPatching},
	{"needle", "needle in a haystack: retrieval accuracy per mechanism, context length and depth", cmdNeedle},
	{"generate", "generate text from a GGUF or llama2.c model, with any attention per layer", cmdGenerate},
	{"train", "train a model and its tokenizer on text: AdamW, cosine schedule, checkpoints", cmdTrain},
	{"dump", "write a layer's attention inputs (Q, K, V after RoPE) as .npy for attn accuracy", cmdDump},
	{"inspect", "print a GGUF file's metadata and tensors, or write one tensor as .npy", cmdInspect},
	{"tokenize", "print the token ids of a text under a GGUF file's tokenizer", cmdTokenize},
	{"report", "write report.html again from the results in a folder", cmdReport},
	{"version", "print the version of attn, of Go and the build", cmdVersion},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: attn <command> [flags]\n\nexamples:\n  attn bench -out report     # time and error of every mechanism, report.html in report/\n  attn help bench            # a command's synopsis, examples and flags\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'attn help <command>' or 'attn <command> -h' for a command's flags.")
}

func lookupCommand(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// run is main without the process: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout)
		return 0
	case "-version", "--version":
		args = []string{"version"}
	case "help":
		if len(args) == 1 {
			usage(stdout)
			return 0
		}
		if c := lookupCommand(args[1]); c != nil {
			return finish(c, c.run(ctx, []string{"-h"}, stdout, stderr), stderr)
		}
		fmt.Fprintf(stderr, "attn help: unknown command %q\n\n", args[1])
		usage(stderr)
		return 2
	}
	c := lookupCommand(args[0])
	if c == nil {
		fmt.Fprintf(stderr, "attn: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return finish(c, c.run(ctx, args[1:], stdout, stderr), stderr)
}

// finish turns a command's error into the exit status: 0 for help, 2 for
// a usage error (already printed), 1 otherwise, printed.
func finish(c *command, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "attn %s: %v\n", c.name, err)
	return 1
}

func cmdVersion(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", stdout, stderr, helpText{
		synopsis: "attn version",
		examples: []string{"attn version"},
		about:    "Prints the version of attn, the Go toolchain it was built with, and the\nsource revision where the build recorded one.",
	})
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "attn %s %s %s/%s\n", attn.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			if modified == "true" {
				rev += " (modified)"
			}
			fmt.Fprintf(stdout, "revision %s\n", rev)
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			fmt.Fprintf(stdout, "module %s %s\n", bi.Main.Path, bi.Main.Version)
		}
	}
	return nil
}
