package registry

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Kind is the type of a parameter's value.
type Kind int

const (
	// KindInt is an integer in [Lo, Hi].
	KindInt Kind = iota
	// KindInts is a comma-separated list of integers, each in [Lo, Hi];
	// the empty string is the empty list.
	KindInts
	// KindEnum is one of Choices.
	KindEnum
	// KindString is any text.
	KindString
)

func (k Kind) String() string {
	switch k {
	case KindInt:
		return "int"
	case KindInts:
		return "ints"
	case KindEnum:
		return "enum"
	case KindString:
		return "string"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Param describes one parameter a mechanism accepts: the one place its
// name, type, default and range are written. Entry.New checks every
// setting against it before Build runs, and Build reads the values
// through it (Params.Int and the like), so a default or range written
// here is the one the command line enforces.
type Param struct {
	Name string
	Kind Kind
	// Default is the value when the parameter is not set, as the command
	// line writes it, formatted from the package's own constant where it
	// has one. Empty for KindInt means that the package derives it (see
	// Derive): Params.Int then returns 0, the package's "default".
	Default string
	// CausalDefault, when not empty, is the default under the causal
	// mask, for packages whose default depends on it.
	CausalDefault string
	// Lo and Hi bound KindInt and KindInts values.
	Lo, Hi int
	// Choices are the values of KindEnum.
	Choices []string
	Doc     string
	// Derive, when not nil, computes the value in effect when the
	// parameter is not set from the others in effect; "" when the
	// parameter then does not apply.
	Derive func(effective map[string]string) string
}

// intParam, intsParam and enumParam keep the entry table short.
func intParam(name string, def, lo, hi int, doc string) Param {
	return Param{Name: name, Kind: KindInt, Default: strconv.Itoa(def), Lo: lo, Hi: hi, Doc: doc}
}

func intsParam(name string, def []int, lo, hi int, doc string) Param {
	return Param{Name: name, Kind: KindInts, Default: formatInts(def), Lo: lo, Hi: hi, Doc: doc}
}

func enumParam(name, def string, choices []string, doc string) Param {
	return Param{Name: name, Kind: KindEnum, Default: def, Choices: choices, Doc: doc}
}

func formatInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// Range describes the values the parameter accepts, for help texts.
func (d Param) Range() string {
	switch d.Kind {
	case KindInt:
		return fmt.Sprintf("[%d, %d]", d.Lo, d.Hi)
	case KindInts:
		return fmt.Sprintf("list of [%d, %d]", d.Lo, d.Hi)
	case KindEnum:
		return strings.Join(d.Choices, "|")
	}
	return "text"
}

// DefaultText describes the default for help texts.
func (d Param) DefaultText() string {
	def := d.Default
	switch {
	case d.Kind == KindInts && def == "":
		def = "none"
	case def == "":
		def = "derived"
	}
	if d.CausalDefault != "" {
		def += ", causal " + d.CausalDefault
	}
	return def
}

// Check parses s as a value of the parameter and returns it in canonical
// form; a malformed or out-of-range value is an error naming the
// parameter.
func (d Param) Check(s string) (string, error) {
	switch d.Kind {
	case KindInt:
		v, err := d.parseInt(s)
		if err != nil {
			return "", err
		}
		return strconv.Itoa(v), nil
	case KindInts:
		v, err := ParseInts("parameter "+d.Name, s, d.Lo, d.Hi)
		if err != nil {
			return "", err
		}
		return formatInts(v), nil
	case KindEnum:
		if !slices.Contains(d.Choices, s) {
			return "", fmt.Errorf("parameter %s=%q is not one of %s", d.Name, s, strings.Join(d.Choices, ", "))
		}
	case KindString:
	default:
		return "", fmt.Errorf("parameter %s has unknown kind %v", d.Name, d.Kind)
	}
	return s, nil
}

func (d Param) parseInt(s string) (int, error) {
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("parameter %s=%q is not an integer", d.Name, s)
	}
	if v < d.Lo || v > d.Hi {
		return 0, fmt.Errorf("parameter %s=%d is outside [%d, %d]", d.Name, v, d.Lo, d.Hi)
	}
	return v, nil
}

// Params holds `name=value` settings and records which ones were read.
// Entry.New binds it to the entry's parameters before Build reads it.
type Params struct {
	values map[string]string
	used   map[string]bool
	decl   []Param
}

// ParseSettings parses `name=value` strings; a name given twice is an error.
func ParseSettings(settings []string) (*Params, error) {
	p := &Params{values: map[string]string{}, used: map[string]bool{}}
	for _, s := range settings {
		name, value, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("registry: setting %q is not name=value", s)
		}
		if _, dup := p.values[name]; dup {
			return nil, fmt.Errorf("registry: parameter %q set twice", name)
		}
		p.values[name] = strings.TrimSpace(value)
	}
	return p, nil
}

// bind checks every setting against decl: an unknown name or a bad
// value is an error.
func (p *Params) bind(decl []Param) error {
	p.decl = decl
	for _, name := range slices.Sorted(maps.Keys(p.values)) {
		d, ok := p.param(name)
		if !ok {
			known := make([]string, len(decl))
			for i, q := range decl {
				known[i] = q.Name
			}
			k := "none"
			if len(known) > 0 {
				k = strings.Join(known, ", ")
			}
			return fmt.Errorf("unknown parameter %q (known: %s)", name, k)
		}
		if _, err := d.Check(p.values[name]); err != nil {
			return err
		}
	}
	return nil
}

func (p *Params) param(name string) (Param, bool) {
	i := slices.IndexFunc(p.decl, func(d Param) bool { return d.Name == name })
	if i < 0 {
		return Param{}, false
	}
	return p.decl[i], true
}

// Has reports whether name was set.
func (p *Params) Has(name string) bool {
	_, ok := p.values[name]
	return ok
}

// value returns the setting of name, or its default, after checking that
// the entry declares name with kind k.
func (p *Params) value(name string, k Kind) (Param, string, error) {
	d, ok := p.param(name)
	if !ok {
		return d, "", fmt.Errorf("parameter %q is read but not declared", name)
	}
	if d.Kind != k && !(k == KindString && d.Kind == KindEnum) {
		return d, "", fmt.Errorf("parameter %q is a %v, read as %v", name, d.Kind, k)
	}
	s, ok := p.values[name]
	if ok {
		p.used[name] = true
		return d, s, nil
	}
	return d, d.Default, nil
}

// Int returns integer parameter name, or its default when unset.
func (p *Params) Int(name string) (int, error) {
	d, s, err := p.value(name, KindInt)
	if err != nil || s == "" {
		return 0, err
	}
	return d.parseInt(s)
}

// Ints returns list parameter name, or its default when unset; nil when
// the list is empty.
func (p *Params) Ints(name string) ([]int, error) {
	d, s, err := p.value(name, KindInts)
	if err != nil {
		return nil, err
	}
	return ParseInts("parameter "+d.Name, s, d.Lo, d.Hi)
}

// String returns enum or text parameter name, or its default when unset.
func (p *Params) String(name string) (string, error) {
	d, s, err := p.value(name, KindString)
	if err != nil {
		return "", err
	}
	return d.Check(s)
}

func (p *Params) unused() []string {
	var left []string
	for _, name := range slices.Sorted(maps.Keys(p.values)) {
		if !p.used[name] {
			left = append(left, name)
		}
	}
	return left
}

// ParseInts parses a comma-separated list of integers in [lo, hi]; what
// names the list in errors. An empty string is an empty list.
func ParseInts(what, s string, lo, hi int) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an integer", what, f)
		}
		if v < lo || v > hi {
			return nil, fmt.Errorf("%s: %d is outside [%d, %d]", what, v, lo, hi)
		}
		out = append(out, v)
	}
	return out, nil
}
