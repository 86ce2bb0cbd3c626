package main

import (
	"fmt"
	"io"
)

// printLines writes each line to w.
func printLines(w io.Writer, lines []string) {
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}
