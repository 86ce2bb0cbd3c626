package main

import (
	"fmt"
	"strconv"
	"strings"
)

// parseInts parses a flag's comma-separated integers in [lo, hi]; with
// ranges, an item lo-hi stands for every integer from lo to hi. An empty
// string is an empty list. It is the one list parser of the commands
// (-n, -kvlen, patching's -layers, needle's -n).
func parseInts(flagName, s string, lo, hi int, ranges bool) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		a, b, isRange := f, f, false
		if ranges {
			if i := strings.Index(f[1:], "-"); i >= 0 {
				a, b, isRange = f[:i+1], f[i+2:], true
			}
		}
		x, err := strconv.Atoi(strings.TrimSpace(a))
		y := x
		if err == nil && isRange {
			y, err = strconv.Atoi(strings.TrimSpace(b))
		}
		switch {
		case err != nil && ranges:
			return nil, fmt.Errorf("-%s: %q is not an integer or a range lo-hi", flagName, f)
		case err != nil:
			return nil, fmt.Errorf("-%s: %q is not an integer", flagName, f)
		case x < lo || y > hi || y < x:
			return nil, fmt.Errorf("-%s: %s is outside [%d, %d]", flagName, f, lo, hi)
		}
		for v := x; v <= y; v++ {
			out = append(out, v)
		}
	}
	return out, nil
}

// parseFloats parses a flag's comma-separated numbers in [lo, hi].
func parseFloats(flagName, s string, lo, hi float64) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v >= lo && v <= hi) {
			return nil, fmt.Errorf("-%s: %q is not a number in [%g, %g]", flagName, f, lo, hi)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseNames parses a comma-separated list of names, each kept once, in
// order.
func parseNames(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
