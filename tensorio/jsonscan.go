package tensorio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The safetensors header is read by walking the JSON in place, after
// json.Valid has checked it: members come out as slices of the header, so
// that reading costs no copy of it, and arrays are counted before any of
// their elements is decoded, so that a shape of millions of dimensions
// costs a scan, not millions of values. encoding/json's decoder would copy
// the header twice and decode the whole array to learn its length.

// maxSafetensorsDims bounds a shape's dimensions. The format sets no
// limit; numpy's is 64.
const maxSafetensorsDims = 64

// clipText shortens a name or value from a file for an error message:
// a header may hold a name of megabytes.
func clipText(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// valueEnd returns the end of the JSON value at b[i] (valid JSON).
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i < len(b) && !isSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
		i++
	}
	return i
}

// stringEnd returns the end of the JSON string starting at b[i].
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

var errNotObject = errors.New("not a JSON object")

// unquote decodes the JSON string q (valid JSON): as it is when it has no
// escapes, the usual case, else through encoding/json.
func unquote(q []byte) (string, error) {
	if len(q) < 2 || q[0] != '"' {
		return "", errors.New("not a string")
	}
	if bytes.IndexByte(q, '\\') < 0 {
		return string(q[1 : len(q)-1]), nil
	}
	var s string
	err := json.Unmarshal(q, &s)
	return s, err
}

// members calls fn for each member of the JSON object b (valid JSON, with
// nothing but whitespace around it), in order, with its key decoded and
// its value as a slice of b.
func members(b []byte, fn func(key string, raw []byte) error) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errNotObject
	}
	for i = skipSpace(b, i+1); i < len(b) && b[i] != '}'; {
		end := stringEnd(b, i)
		key, err := unquote(b[i:end])
		if err != nil {
			return err
		}
		i = skipSpace(b, end)
		i = skipSpace(b, i+1) // the ':'
		end = valueEnd(b, i)
		if err := fn(key, b[i:end]); err != nil {
			return err
		}
		i = skipSpace(b, end)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return nil
}

// uintArray decodes a JSON array (valid JSON) of at most limit
// non-negative integers each at most max, counting the elements first.
func uintArray(b []byte, limit int, max uint64) ([]uint64, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, errors.New("not an array")
	}
	n := 0
	for j := i + 1; j < len(b); {
		j = skipSpace(b, j)
		if b[j] == ']' {
			break
		}
		if n++; n > limit {
			return nil, fmt.Errorf("more than %d elements", limit)
		}
		j = skipSpace(b, valueEnd(b, j))
		if j < len(b) && b[j] == ',' {
			j++
		}
	}
	out := make([]uint64, 0, n)
	for j := i + 1; len(out) < n; {
		j = skipSpace(b, j)
		end := valueEnd(b, j)
		num := b[j:end]
		var v uint64
		err := errors.New("too long")
		if len(num) <= 20 { // 2^64 has 20 digits
			v, err = strconv.ParseUint(string(num), 10, 64)
		}
		if err != nil || v > max {
			return nil, fmt.Errorf("element %q is not an integer from 0 to %d", clipText(string(num[:min(len(num), 65)])), max)
		}
		out = append(out, v)
		j = skipSpace(b, end)
		if j < len(b) && b[j] == ',' {
			j++
		}
	}
	return out, nil
}
