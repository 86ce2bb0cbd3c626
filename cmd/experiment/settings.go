package experiment

import (
	"fmt"
	"slices"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/registry"
)

// Setting is one mechanism parameter given on the command line (-set):
// Name=Value for mechanism Mech, or for every selected mechanism that
// has a parameter Name when Mech is empty.
type Setting struct {
	Mech, Name, Value string
}

func (s Setting) String() string {
	if s.Mech == "" {
		return s.Name + "=" + s.Value
	}
	return s.Mech + ":" + s.Name + "=" + s.Value
}

// Settings are the -set values of one run, in the order given: a later
// one replaces an earlier one of the same name for the same mechanism,
// and one for a named mechanism replaces one for all.
type Settings []Setting

// ParseSettings parses -set values, each one of
//
//	name=value                  for every selected mechanism that knows name
//	MECH:name=value[,name=value] for mechanism MECH only
//
// A value may hold commas (globals=0,5,9); in the MECH: form an item
// without '=' continues the value before it, as in -patch. MECH: specs
// may be joined with ';'.
func ParseSettings(specs []string) (Settings, error) {
	var out Settings
	for _, spec := range specs {
		for one := range strings.SplitSeq(spec, ";") {
			one = strings.TrimSpace(one)
			if one == "" {
				continue
			}
			colon, eq := strings.Index(one, ":"), strings.Index(one, "=")
			if colon < 0 || (eq >= 0 && eq < colon) {
				name, value, ok := strings.Cut(one, "=")
				name = strings.TrimSpace(name)
				if !ok || name == "" {
					return nil, fmt.Errorf("%w: -set %q is not name=value or MECH:name=value", attn.ErrInput, one)
				}
				out = append(out, Setting{Name: name, Value: strings.TrimSpace(value)})
				continue
			}
			mech := strings.TrimSpace(one[:colon])
			var items []string
			for it := range strings.SplitSeq(one[colon+1:], ",") {
				it = strings.TrimSpace(it)
				switch {
				case strings.Contains(it, "="):
					items = append(items, it)
				case len(items) > 0:
					items[len(items)-1] += "," + it
				}
			}
			if mech == "" || len(items) == 0 {
				return nil, fmt.Errorf("%w: -set %q is not name=value or MECH:name=value", attn.ErrInput, one)
			}
			for _, it := range items {
				name, value, _ := strings.Cut(it, "=")
				if name = strings.TrimSpace(name); name == "" {
					return nil, fmt.Errorf("%w: -set %q: %q is not name=value", attn.ErrInput, one, it)
				}
				out = append(out, Setting{Mech: mech, Name: name, Value: strings.TrimSpace(value)})
			}
		}
	}
	return out, nil
}

// Lookup finds a registry entry by name; nil means registry.Lookup.
type Lookup func(name string) (registry.Entry, error)

func (l Lookup) get(name string) (registry.Entry, error) {
	if l == nil {
		return registry.Lookup(name)
	}
	return l(name)
}

// Check fails on a setting that cannot apply to the selected mechanisms
// names (a typo, most likely): one for a mechanism not selected, one
// that its mechanism has no parameter for, and one for all that none of
// them has. Values are checked when the mechanisms are built.
func (ss Settings) Check(names []string, lookup Lookup) error {
	for _, s := range ss {
		if s.Mech != "" {
			if !slices.Contains(names, s.Mech) {
				return fmt.Errorf("%w: -set %s: %s is not among the selected mechanisms (%s)", attn.ErrInput, s, s.Mech, strings.Join(names, ","))
			}
			e, err := lookup.get(s.Mech)
			if err != nil {
				return err
			}
			if _, ok := e.Param(s.Name); !ok {
				return fmt.Errorf("%w: -set %s: %s has no parameter %q (see attn run -mech %s -h)", attn.ErrInput, s, s.Mech, s.Name, s.Mech)
			}
			continue
		}
		known := false
		for _, m := range names {
			if e, err := lookup.get(m); err == nil {
				_, ok := e.Param(s.Name)
				known = known || ok
			}
		}
		if !known {
			return fmt.Errorf("%w: -set %s: no selected mechanism has a parameter %q (see attn run -mech NAME -h)", attn.ErrInput, s, s.Name)
		}
	}
	return nil
}

// For returns the name=value settings of entry e: base, then the
// settings for all that e has a parameter for, then e's own, each
// replacing an earlier one of the same name.
func (ss Settings) For(e registry.Entry, base []string) []string {
	var mine []string
	for _, s := range ss {
		if s.Mech == "" {
			if _, ok := e.Param(s.Name); ok {
				mine = append(mine, s.Name+"="+s.Value)
			}
		}
	}
	for _, s := range ss {
		if s.Mech == e.Name {
			mine = append(mine, s.Name+"="+s.Value)
		}
	}
	return Merge(base, mine)
}

// Own reports whether any setting names mechanism name.
func (ss Settings) Own(name string) bool {
	return slices.ContainsFunc(ss, func(s Setting) bool { return s.Mech == name })
}

// Merge returns base with each name=value of over replacing the setting
// of the same name, or added after them when base has none: the one way
// the commands layer settings (a budget rule's, -set's, a swept value).
func Merge(base, over []string) []string {
	out := slices.Clone(base)
	for _, o := range over {
		name := settingName(o)
		if i := slices.IndexFunc(out, func(s string) bool { return settingName(s) == name }); i >= 0 {
			out[i] = o
		} else {
			out = append(out, o)
		}
	}
	return out
}

func settingName(kv string) string {
	name, _, _ := strings.Cut(kv, "=")
	return strings.TrimSpace(name)
}
