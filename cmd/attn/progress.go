package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/attnkit/attn/cmd/experiment"
)

// progress reports a run's progress on stderr (experiment.Progress): on
// a terminal a bar redrawn in place at each step and at least once a
// second during a long one, advancing by the forecast work done, with the
// time left and the finish time; anywhere else (a log file, a test) a
// line a step. A note repeated word for word is printed once.
//
// The redraws during a step happen while the step's calls are measured:
// they allocate nothing, so that the allocation counted for a call is the
// call's own (see redraw).
type progress struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	total  int
	done   int
	start  time.Time
	budget time.Duration
	label  string
	step   experiment.Step
	// stepStart is when the current step began.
	stepStart time.Time
	// shown is the largest share of the work drawn so far: forecasts
	// grow as rows are measured, and a bar going back would read as an
	// error.
	shown   float64
	said    map[string]bool
	repeats int
	buf     []byte
	stop    chan struct{}
	stopped chan struct{}
}

// redrawEvery is the longest a terminal's bar goes without a redraw (a
// variable for tests).
var redrawEvery = time.Second

func newProgress(w io.Writer, total int, budget time.Duration) *progress {
	p := &progress{w: w, total: total, start: time.Now(), budget: budget, said: map[string]bool{}, buf: make([]byte, 0, 512)}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// Begin shows that step s is running; a step may begin again, with the
// same Index, as it advances (a perplexity run's windows).
func (p *progress) Begin(s experiment.Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.Index != p.step.Index || p.stepStart.IsZero() {
		p.stepStart = time.Now()
	}
	p.step, p.label = s, s.Label
	if s.Total > 0 {
		p.total = s.Total
	}
	if p.tty {
		p.redraw()
		if p.stop == nil {
			p.stop, p.stopped = make(chan struct{}), make(chan struct{})
			go p.tick()
		}
	}
}

// tick redraws the bar until finish.
func (p *progress) tick() {
	defer close(p.stopped)
	t := time.NewTicker(redrawEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.redraw()
			p.mu.Unlock()
		}
	}
}

// End counts the step as done; note, when not empty, says how it ended
// (a skip and its reason), once for each distinct note.
func (p *progress) End(note string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.stepStart = time.Time{}
	repeated := note != "" && p.said[note]
	if note != "" {
		p.said[note] = true
	}
	if repeated {
		p.repeats++
	}
	switch {
	case p.tty && note != "" && !repeated:
		fmt.Fprintf(p.w, "\r\x1b[K%s: %s\n", p.label, note)
		p.redraw()
	case p.tty:
		p.redraw()
	case repeated:
		fmt.Fprintf(p.w, "[%d/%d] %s: as above\n", p.done, p.total, p.label)
	case note != "":
		fmt.Fprintf(p.w, "[%d/%d] %s: %s\n", p.done, p.total, p.label, note)
	default:
		fmt.Fprintf(p.w, "[%d/%d] %s (%s)\n", p.done, p.total, p.label, time.Since(p.start).Round(time.Second))
	}
}

// Note writes line on a line of its own (above the bar on a terminal),
// once.
func (p *progress) Note(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.said[line] {
		return
	}
	p.said[line] = true
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s\n", line)
		p.redraw()
		return
	}
	fmt.Fprintln(p.w, line)
}

// begin and end are Begin and End for steps without forecasts: a count.
func (p *progress) begin(label string) {
	p.Begin(experiment.Step{Label: label, Index: p.done + 1, Total: p.total, Forecast: -1, Rest: -1})
}

func (p *progress) end(note string) { p.End(note) }

func (p *progress) note(line string) { p.Note(line) }

// count shows done of total steps of a run that reports only counts
// (needle.Run): a bar on a terminal, nothing elsewhere.
func (p *progress) count(done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done, p.total = done, total
	if p.tty {
		p.redraw()
	}
}

// finish stops the redraws and clears the bar.
func (p *progress) finish() {
	if p.stop != nil {
		close(p.stop)
		<-p.stopped
		p.stop = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
	if p.repeats > 0 && p.tty {
		fmt.Fprintf(p.w, "(%d more steps ended as one above did; the tables list them all)\n", p.repeats)
	}
}

// fraction returns the share of the work done and the seconds left: by
// the forecasts where the step has them (the time spent against the time
// spent and forecast), by the count of steps where it does not.
func (p *progress) fraction(now time.Time) (done float64, left float64, known bool) {
	s := p.step
	if s.Forecast >= 0 && s.Rest >= 0 {
		in := 0.0
		if !p.stepStart.IsZero() {
			in = now.Sub(p.stepStart).Seconds()
		}
		left = max(0, s.Forecast-in) + s.Rest
		spent := now.Sub(p.start).Seconds()
		if spent+left > 0 {
			return spent / (spent + left), left, true
		}
		return 1, 0, true
	}
	if p.total > 0 {
		return float64(p.done) / float64(p.total), 0, false
	}
	return 0, 0, false
}

// redraw draws the bar: [#####.....] 12/40 label  3m20s, ~2m10s left
// (done 14:05:31). It allocates nothing (the bar is appended to a buffer
// made once), since it runs during the calls being measured; p.mu is
// held.
func (p *progress) redraw() {
	const width = 24
	now := time.Now()
	frac, left, known := p.fraction(now)
	frac = max(frac, p.shown)
	p.shown = frac
	filled := min(width, max(0, int(frac*width)))
	b := append(p.buf[:0], "\r\x1b[K["...)
	for i := range width {
		if i < filled {
			b = append(b, '#')
		} else {
			b = append(b, '.')
		}
	}
	b = append(b, "] "...)
	b = strconv.AppendInt(b, int64(p.done), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(p.total), 10)
	b = append(b, ' ')
	label := p.label
	if len(label) > 60 {
		label = label[:60]
	}
	b = append(b, label...)
	b = append(b, "  "...)
	b = appendDuration(b, now.Sub(p.start))
	if p.budget > 0 {
		b = append(b, " of "...)
		b = appendDuration(b, p.budget)
	}
	if known {
		b = append(b, ", ~"...)
		b = appendDuration(b, time.Duration(left*float64(time.Second)))
		b = append(b, " left (done "...)
		b = now.Add(time.Duration(left*float64(time.Second))).AppendFormat(b, "15:04:05")
		b = append(b, ')')
	}
	p.buf = b
	p.w.Write(b)
}

// appendDuration appends d rounded to the second as 1h2m3s, 4m5s or 6s.
func appendDuration(b []byte, d time.Duration) []byte {
	s := int64(d.Round(time.Second) / time.Second)
	if s < 0 {
		s = 0
	}
	if h := s / 3600; h > 0 {
		b = strconv.AppendInt(b, h, 10)
		b = append(b, 'h')
	}
	if m := s % 3600 / 60; m > 0 || s >= 3600 {
		b = strconv.AppendInt(b, m, 10)
		b = append(b, 'm')
	}
	b = strconv.AppendInt(b, s%60, 10)
	return append(b, 's')
}
