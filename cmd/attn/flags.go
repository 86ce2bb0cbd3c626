package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// helpText is what `attn CMD -h` prints above the flags: the synopsis and
// examples first, as a reader skims for them, then what the command does.
type helpText struct {
	synopsis string   // after "usage: ", e.g. "attn bench [flags]"
	examples []string // command lines that run as shown
	about    string   // paragraphs, already wrapped
	// more, when set, prints sections after about that depend on the
	// flags parsed so far (attn run -mech NAME -h lists NAME's
	// parameters).
	more func(w io.Writer)
}

// flagSet is a subcommand's flags and help. Help (-h, -help, --help, or
// `attn help CMD`) goes to stdout and exits 0; a bad flag prints the
// error and the synopsis on stderr and exits 2.
type flagSet struct {
	*flag.FlagSet
	name           string
	help           helpText
	stdout, stderr io.Writer
	// aliases maps a deprecated spelling to its flag's name: it still
	// parses, and help mentions it once at the end.
	aliases map[string]string
}

// newFlags returns the flag set of subcommand name (as in `attn name`).
func newFlags(name string, stdout, stderr io.Writer, h helpText) *flagSet {
	fs := flag.NewFlagSet("attn "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, name: name, help: h, stdout: stdout, stderr: stderr, aliases: map[string]string{}}
}

// alias makes old a deprecated spelling of the defined flag name.
func (fs *flagSet) alias(old, name string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("alias of undefined flag -" + name)
	}
	fs.Var(f.Value, old, "deprecated spelling of -"+name)
	fs.aliases[old] = name
}

// given returns the flags set on the command line, by their current
// names (a deprecated spelling counts as its flag).
func (fs *flagSet) given() map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		name := f.Name
		if n, ok := fs.aliases[name]; ok {
			name = n
		}
		set[name] = true
	})
	return set
}

// errUsage marks an error already printed with the synopsis: exit 2.
var errUsage = errors.New("usage")

// inspectFlags, when set (by tests), receives every flag set at parse
// time instead of its arguments being parsed: parseFlags then returns
// errInspected, so that a test can list every command's flags without
// running any.
var inspectFlags func(fs *flagSet)

var errInspected = errors.New("flags inspected")

// parseFlags parses args. Help requested is printed on stdout and
// returned as flag.ErrHelp; a flag error is printed with the synopsis on
// stderr and returned as errUsage.
func parseFlags(fs *flagSet, args []string) error {
	if inspectFlags != nil {
		inspectFlags(fs)
		return errInspected
	}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.writeHelp(fs.stdout)
		return flag.ErrHelp
	case err != nil:
		fs.shortUsage()
		return errUsage
	case fs.NArg() > 0:
		fmt.Fprintf(fs.stderr, "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		fs.shortUsage()
		return errUsage
	}
	return nil
}

func (fs *flagSet) shortUsage() {
	fmt.Fprintf(fs.stderr, "usage: %s\nRun 'attn help %s' for its flags.\n", fs.help.synopsis, fs.name)
}

// writeHelp prints the synopsis, the examples, what the command does and
// its flags with their defaults.
func (fs *flagSet) writeHelp(w io.Writer) {
	h := fs.help
	fmt.Fprintf(w, "usage: %s\n", h.synopsis)
	if len(h.examples) > 0 {
		fmt.Fprintln(w, "\nexamples:")
		for _, e := range h.examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	if h.about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(h.about))
	}
	if h.more != nil {
		fmt.Fprintln(w)
		h.more(w)
	}
	fmt.Fprintln(w, "\nflags:")
	fs.printDefaults(w)
	if len(fs.aliases) > 0 {
		var old []string
		for _, o := range slices.Sorted(mapsKeys(fs.aliases)) {
			old = append(old, fmt.Sprintf("-%s (-%s)", o, fs.aliases[o]))
		}
		fmt.Fprintf(w, "\ndeprecated spellings, still accepted: %s\n", strings.Join(old, ", "))
	}
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// printDefaults is flag.PrintDefaults without the deprecated spellings,
// and with each default as its flag's String prints it (see gibFlag).
func (fs *flagSet) printDefaults(w io.Writer) {
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := fs.aliases[f.Name]; ok {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		if _, ok := f.Value.(*intFlag); ok && name == "value" {
			name = "int"
		}
		var b strings.Builder
		fmt.Fprintf(&b, "  -%s", f.Name)
		if name != "" {
			b.WriteString(" " + name)
		}
		if b.Len() <= 4 {
			b.WriteString("\t")
		} else {
			b.WriteString("\n    \t")
		}
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := f.DefValue; !isZeroDefault(d) {
			if isStringFlag(f) {
				fmt.Fprintf(&b, " (default %q)", d)
			} else {
				fmt.Fprintf(&b, " (default %s)", d)
			}
		}
		fmt.Fprintln(w, b.String())
	})
}

func isZeroDefault(d string) bool {
	switch d {
	case "", "0", "false", "0s", "[]":
		return true
	}
	return false
}

func isStringFlag(f *flag.Flag) bool {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return false
	}
	_, s := g.Get().(string)
	return s
}

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// intFlag is an integer flag checked against [lo, hi] as it is parsed,
// so that a bad value stops the command before it starts any work.
type intFlag struct {
	p      *int
	lo, hi int
	want   string // what a bad value is told, e.g. "0 (GOMAXPROCS) or more"
}

func (f *intFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.Itoa(*f.p)
}

func (f *intFlag) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%q is not an integer", s)
	}
	if v < f.lo || v > f.hi {
		return fmt.Errorf("%d: want %s", v, f.want)
	}
	*f.p = v
	return nil
}

func (f *intFlag) Get() any { return *f.p }

// intVar defines an integer flag in [lo, hi]; want says so in errors.
func (fs *flagSet) intVar(p *int, name string, def, lo, hi int, want, usage string) {
	*p = def
	fs.Var(&intFlag{p: p, lo: lo, hi: hi, want: want}, name, usage)
}

// workersVar defines -workers, the goroutines of a command: 0 means
// GOMAXPROCS, a negative count is an error before any work starts.
func (fs *flagSet) workersVar(p *int) {
	fs.intVar(p, "workers", 0, 0, 1<<16, "0 (GOMAXPROCS) or more", "goroutines (0: GOMAXPROCS)")
}

// workers defines -workers and returns it, as fs.Int would.
func (fs *flagSet) workers() *int {
	p := new(int)
	fs.workersVar(p)
	return p
}

// gibFlag is a size in GiB printed with three significant digits, so
// that a default computed from the machine reads "11.4", not
// "11.374073028564453".
type gibFlag struct{ p *float64 }

func (f gibFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*f.p, 'g', 3, 64)
}

func (f gibFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return fmt.Errorf("%q: want a size in GiB, 0 or more", s)
	}
	*f.p = v
	return nil
}

func (f gibFlag) Get() any { return *f.p }
