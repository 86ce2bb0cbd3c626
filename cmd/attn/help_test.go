package main

import (
	"context"
	"flag"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/attnkit/attn"
)

// TestHelp: every way of asking for a command's help prints its synopsis
// and an example on stdout, nothing on stderr, and exits 0.
func TestHelp(t *testing.T) {
	for _, c := range commands {
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "-help"}, {c.name, "--help"}, {"help", c.name}} {
			code, stdout, stderr := attnCmd(t, args...)
			if code != 0 || stderr != "" {
				t.Errorf("attn %s: exit %d, stderr %q", strings.Join(args, " "), code, stderr)
			}
			if !strings.HasPrefix(stdout, "usage: attn "+c.name) {
				t.Errorf("attn %s: help does not start with the synopsis:\n%s", strings.Join(args, " "), stdout)
			}
			if !strings.Contains(stdout, "\nexamples:\n  attn "+c.name) {
				t.Errorf("attn %s: no example:\n%s", strings.Join(args, " "), stdout)
			}
			if c.name != "version" && !strings.Contains(stdout, "\nflags:\n  -") {
				t.Errorf("attn %s: no flags:\n%s", strings.Join(args, " "), stdout)
			}
			// Defaults print as a person would write them.
			if m := regexp.MustCompile(`\(default [0-9.e+-]{9,}\)`).FindString(stdout); m != "" {
				t.Errorf("attn %s: unreadable default %s", strings.Join(args, " "), m)
			}
		}
	}
	// run's help lists the parameters of the mechanism named before -h.
	_, stdout, _ := attnCmd(t, "run", "-mech", "window", "-h")
	if !strings.Contains(stdout, "-set left=") {
		t.Errorf("attn run -mech window -h does not list window's parameters:\n%s", stdout)
	}
	// Deprecated spellings are mentioned once, not listed as flags.
	_, stdout, _ = attnCmd(t, "bench", "-h")
	if strings.Contains(stdout, "\n  -hkv") || !strings.Contains(stdout, "-hkv (-kv-heads)") {
		t.Errorf("attn bench -h lists -hkv as a flag, or does not name it as deprecated:\n%s", stdout)
	}
}

func TestTopLevelHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"-help"}, {"--help"}, {"help"}} {
		code, stdout, stderr := attnCmd(t, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "commands:") || !strings.Contains(stdout, "  bench ") {
			t.Errorf("attn %v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{}, {"frobnicate"}, {"help", "frobnicate"}} {
		if code, _, stderr := attnCmd(t, args...); code != 2 || !strings.Contains(stderr, "commands:") {
			t.Errorf("attn %v: exit %d, stderr %q; want 2 and the command list", args, code, stderr)
		}
	}
	// A bad flag: the error and the synopsis on stderr, exit 2.
	code, stdout, stderr := attnCmd(t, "bench", "-bogus")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "-bogus") || !strings.Contains(stderr, "usage: attn bench") {
		t.Errorf("attn bench -bogus: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"-version"}, {"--version"}} {
		code, stdout, stderr := attnCmd(t, args...)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "attn "+attn.Version+" go") {
			t.Errorf("attn %v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// commandFlags returns every command's flag set, by command name, without
// running any command.
func commandFlags(t *testing.T) map[string]*flagSet {
	t.Helper()
	sets := map[string]*flagSet{}
	var current string
	inspectFlags = func(fs *flagSet) { sets[current] = fs }
	defer func() { inspectFlags = nil }()
	for _, c := range commands {
		current = c.name
		if err := c.run(context.Background(), nil, io.Discard, io.Discard); err != errInspected {
			t.Fatalf("attn %s: %v before parsing its flags", c.name, err)
		}
	}
	return sets
}

// flagKinds allows a flag name to mean different kinds of value in
// different commands, each for the reason given. Every other name has one
// type and one placeholder everywhere.
var flagKinds = map[string]string{
	"n":      "lengths: a list where the command sweeps them (bench, needle), one where it does not (accuracy); generate's tokens to write, as llama.cpp's -n",
	"causal": "bench's has a third state, unset, that runs both masks",
	"text":   "train reads several files, the others one",
	"layers": "train's is the model's depth, patching's the values of ℓ, counts of layers both",
}

// TestFlagNames: one name per idea across the commands. Help works (no
// command defines -h), the deprecated spellings are aliases only, a name
// has one kind of value everywhere (but flagKinds), -o names a file and
// -out a folder.
func TestFlagNames(t *testing.T) {
	sets := commandFlags(t)
	if len(sets) != len(commands) {
		t.Fatalf("inspected %d commands of %d", len(sets), len(commands))
	}
	// deprecated spelling → the name to use.
	renamed := map[string]string{"h": "heads", "hkv": "kv-heads", "b": "batch", "mechs": "mech", "help": ""}
	type use struct {
		cmd, typ, placeholder string
	}
	uses := map[string][]use{}
	for cmd, fs := range sets {
		fs.VisitAll(func(f *flag.Flag) {
			if to, ok := renamed[f.Name]; ok {
				if fs.aliases[f.Name] != to || to == "" {
					t.Errorf("attn %s defines -%s; the name is -%s (an alias at most)", cmd, f.Name, to)
				}
				return
			}
			if f.Usage == "" {
				t.Errorf("attn %s -%s has no usage", cmd, f.Name)
			}
			placeholder, _ := flag.UnquoteUsage(f)
			// The kind of value: what Get returns where the flag has it.
			typ := reflect.TypeOf(f.Value).String()
			if g, ok := f.Value.(flag.Getter); ok {
				typ = reflect.TypeOf(g.Get()).String()
			}
			uses[f.Name] = append(uses[f.Name], use{cmd, typ, placeholder})
		})
	}
	for name, us := range uses {
		if _, ok := flagKinds[name]; ok {
			continue
		}
		for _, u := range us[1:] {
			if u.typ != us[0].typ {
				t.Errorf("-%s is a %s in attn %s but a %s in attn %s", name, us[0].typ, us[0].cmd, u.typ, u.cmd)
			}
		}
		for _, u := range us {
			switch {
			case name == "out" && u.placeholder != "DIR":
				t.Errorf("attn %s -out takes %s; -out is a folder (DIR), -o a file", u.cmd, u.placeholder)
			case name == "o" && u.placeholder != "FILE":
				t.Errorf("attn %s -o takes %s; -o is a file (FILE), -out a folder", u.cmd, u.placeholder)
			}
		}
	}
	// The mechanisms are chosen with -mech wherever they are chosen.
	for _, cmd := range []string{"bench", "accuracy", "run", "patching", "needle"} {
		if sets[cmd].Lookup("mech") == nil || sets[cmd].Lookup("set") == nil {
			t.Errorf("attn %s has no -mech or no -set", cmd)
		}
	}
	for _, cmd := range []string{"bench", "accuracy"} {
		for _, name := range []string{"batch", "heads", "kv-heads"} {
			if sets[cmd].Lookup(name) == nil {
				t.Errorf("attn %s has no -%s", cmd, name)
			}
		}
	}
}

// TestDeprecatedSpellings: the old names still parse, as the new ones.
func TestDeprecatedSpellings(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := attnCmd(t, "bench", "-input", "gaussian", "-mechs", "exact", "-n", "16", "-b", "2", "-heads", "4", "-hkv", "2", "-d", "8",
		"-reps", "1", "-probe=false", "-accuracy-n", "0", "-out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	res, _ := readResults(t, dir)
	if len(res.Rows) != 2 || res.Rows[0].Mech != "exact" || res.Rows[0].B != 2 || res.Rows[0].HKV != 2 {
		t.Errorf("rows %+v", res.Rows)
	}
}

// TestBadValuesBeforeWork: values that can only fail are refused at
// parse time, before inputs are drawn or a model is loaded.
func TestBadValuesBeforeWork(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "-workers", "-1"},
		{"accuracy", "-workers", "-1"},
		{"run", "-workers", "-1"},
		{"ppl", "-workers", "-1"},
		{"patching", "-workers", "-1"},
		{"needle", "-workers", "-1"},
		{"generate", "-workers", "-1"},
		{"dump", "-workers", "-1"},
		{"train", "-workers", "-1"},
		{"bench", "-heads", "0"},
		{"bench", "-mem-budget", "-2"},
		{"needle", "-trials", "0"},
	} {
		code, stdout, stderr := attnCmd(t, args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, "invalid value") {
			t.Errorf("attn %v: exit %d, stdout %q, stderr %q; want a usage error", args, code, stdout, stderr)
		}
	}
}
