package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress reports a sweep's progress on stderr: a bar redrawn in place on
// a terminal, one line per step anywhere else (a log file, a test). It
// draws only when called, from the sweep's goroutine, so that it adds no
// allocation of its own to the calls being measured.
type progress struct {
	w      io.Writer
	tty    bool
	total  int
	done   int
	start  time.Time
	budget time.Duration
	label  string
}

func newProgress(w io.Writer, total int, budget time.Duration) *progress {
	p := &progress{w: w, total: total, start: time.Now(), budget: budget}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// begin shows that step label is running.
func (p *progress) begin(label string) {
	p.label = label
	if p.tty {
		p.draw()
	}
}

// end counts the step as done; note, when not empty, says how it ended
// (a skip and its reason).
func (p *progress) end(note string) {
	p.done++
	switch {
	case p.tty && note != "":
		fmt.Fprintf(p.w, "\r\x1b[K%s: %s\n", p.label, note)
		p.draw()
	case p.tty:
		p.draw()
	case note != "":
		fmt.Fprintf(p.w, "[%d/%d] %s: %s\n", p.done, p.total, p.label, note)
	default:
		fmt.Fprintf(p.w, "[%d/%d] %s (%s)\n", p.done, p.total, p.label, p.elapsed())
	}
}

// finish clears the bar.
func (p *progress) finish() {
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}

func (p *progress) elapsed() string {
	return time.Since(p.start).Round(time.Second).String()
}

func (p *progress) draw() {
	const width = 24
	filled := 0
	if p.total > 0 {
		filled = p.done * width / p.total
	}
	bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
	budget := ""
	if p.budget > 0 {
		budget = " of " + p.budget.String()
	}
	fmt.Fprintf(p.w, "\r\x1b[K[%s] %d/%d %s  %s%s", bar, p.done, p.total, p.label, p.elapsed(), budget)
}

// note writes line on a line of its own: above the bar on a terminal.
func (p *progress) note(line string) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s\n", line)
		p.draw()
		return
	}
	fmt.Fprintln(p.w, line)
}
