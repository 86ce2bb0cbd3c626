package tensorio

import (
	"fmt"
	"strconv"
)

// A .npy header is a Python dict literal. This file parses the subset of
// Python literal syntax such a header can hold — strings, integers, True,
// False, None, tuples and lists — into Go values:
//
//	str -> string, int -> int64, bool -> bool, None -> pyNone{},
//	tuple -> pyTuple, list -> pyList
//
// It is deliberately small: no floats, no nested dicts, no string prefixes,
// escapes taken literally. Anything else is a syntax error, which is fine
// because numpy only ever writes strings, a bool and a tuple of ints.

type (
	pyTuple []any
	pyList  []any
	pyNone  struct{}
)

// maxPyDepth bounds nesting so a header of a million '(' cannot exhaust the
// stack; real headers nest at most two deep.
const maxPyDepth = 16

type pyParser struct {
	s string
	i int
	// longInts accepts Python 2 long literals such as 3L, which old numpy
	// wrote into format 1.0 and 2.0 headers (numpy strips the L on reading).
	longInts bool
	depth    int
}

// parsePyDict parses s as one dict literal with string keys, optionally
// surrounded by whitespace. Duplicate keys are an error: numpy never writes
// them and Python would silently keep the last.
func parsePyDict(s string, longInts bool) (map[string]any, error) {
	p := &pyParser{s: s, longInts: longInts}
	p.space()
	if !p.eat('{') {
		return nil, p.errorf("header does not start with '{'")
	}
	d := map[string]any{}
	for {
		p.space()
		if p.eat('}') {
			break
		}
		k, err := p.value()
		if err != nil {
			return nil, err
		}
		key, ok := k.(string)
		if !ok {
			return nil, p.errorf("dict key %v is not a string", k)
		}
		if _, dup := d[key]; dup {
			return nil, p.errorf("duplicate key %q", key)
		}
		p.space()
		if !p.eat(':') {
			return nil, p.errorf("expected ':' after key %q", key)
		}
		if d[key], err = p.value(); err != nil {
			return nil, err
		}
		p.space()
		if p.eat('}') {
			break
		}
		if !p.eat(',') {
			return nil, p.errorf("expected ',' or '}' after value of %q", key)
		}
	}
	p.space()
	if p.i != len(p.s) {
		return nil, p.errorf("unexpected text after the header dict")
	}
	return d, nil
}

func (p *pyParser) errorf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > 200 { // a value quoted from a header of a megabyte
		msg = msg[:200] + "…"
	}
	return fmt.Errorf("%w: npy header at byte %d: %s", ErrFormat, p.i, msg)
}

// space skips the whitespace Python allows between tokens inside brackets.
func (p *pyParser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			p.i++
		default:
			return
		}
	}
}

func (p *pyParser) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *pyParser) value() (any, error) {
	p.space()
	if p.i == len(p.s) {
		return nil, p.errorf("unexpected end of header")
	}
	switch c := p.s[p.i]; {
	case c == '\'' || c == '"':
		return p.str()
	case c == '(' || c == '[':
		return p.sequence()
	case c == '-' || c == '+' || isDigit(c):
		return p.integer()
	case isNameStart(c):
		return p.name()
	default:
		return nil, p.errorf("unexpected character %q", c)
	}
}

// str parses a quoted string. A backslash takes the next byte literally,
// which is wrong for escapes like \n but right for \' and \\, and no header
// numpy can read uses anything else in a string it accepts.
func (p *pyParser) str() (string, error) {
	quote := p.s[p.i]
	p.i++
	var b []byte
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == quote:
			return string(b), nil
		case c == '\n':
			return "", p.errorf("newline in string")
		case c == '\\' && p.i < len(p.s):
			b = append(b, p.s[p.i])
			p.i++
		default:
			b = append(b, c)
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *pyParser) integer() (int64, error) {
	start := p.i
	if p.s[p.i] == '-' || p.s[p.i] == '+' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
	}
	if p.i == digits {
		return 0, p.errorf("sign without digits")
	}
	text := p.s[start:p.i]
	if p.longInts && p.i < len(p.s) && (p.s[p.i] == 'L' || p.s[p.i] == 'l') {
		p.i++ // a Python 2 long literal; the suffix carries no meaning
	}
	if p.i < len(p.s) && (isNameStart(p.s[p.i]) || p.s[p.i] == '.') {
		return 0, p.errorf("malformed number")
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, p.errorf("integer %s out of range", text)
	}
	return v, nil
}

func (p *pyParser) name() (any, error) {
	start := p.i
	for p.i < len(p.s) && (isNameStart(p.s[p.i]) || isDigit(p.s[p.i])) {
		p.i++
	}
	switch n := p.s[start:p.i]; n {
	case "True":
		return true, nil
	case "False":
		return false, nil
	case "None":
		return pyNone{}, nil
	default:
		return nil, p.errorf("unexpected name %q", n)
	}
}

// sequence parses a tuple or a list. As in Python, a parenthesised single
// value without a trailing comma is that value, not a 1-tuple: (5) is 5.
func (p *pyParser) sequence() (any, error) {
	open := p.s[p.i]
	closer := byte(')')
	if open == '[' {
		closer = ']'
	}
	p.i++
	if p.depth++; p.depth > maxPyDepth {
		return nil, p.errorf("nested too deeply")
	}
	defer func() { p.depth-- }()
	var elems []any
	comma := false
	for {
		p.space()
		if p.eat(closer) {
			break
		}
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		elems = append(elems, v)
		p.space()
		if p.eat(closer) {
			comma = false
			break
		}
		if !p.eat(',') {
			return nil, p.errorf("expected ',' or %q", closer)
		}
		comma = true
	}
	switch {
	case open == '[':
		return pyList(elems), nil
	case len(elems) == 1 && !comma:
		return elems[0], nil
	default:
		return pyTuple(elems), nil
	}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isNameStart(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_'
}
