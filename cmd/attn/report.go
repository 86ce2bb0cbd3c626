package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/attnkit/attn/cmd/eval"
)

func cmdReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("report", stdout, stderr, helpText{
		synopsis: "attn report -out DIR",
		examples: []string{"attn report -out report      # after attn bench -out report, attn patching -out report, ..."},
		about: `Writes DIR/report.html and its figures in DIR/plots (PNG and SVG) again
from the results in DIR: results.json (attn bench, attn accuracy),
patching.json (attn patching) and needle.json (attn needle). Each of those
commands does so itself; this one redraws a report after an upgrade, or
after results were copied together.`,
	})
	out := fs.String("out", "", "the report `DIR`, holding the results")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("-out is required")
	}
	if err := eval.SaveReport(*out); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "wrote", filepath.Join(*out, eval.ReportFile))
	return nil
}
