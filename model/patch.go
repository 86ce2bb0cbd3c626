package model

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/attnkit/attn"
)

// Patch replaces the attention of some layers with a mechanism built by
// package registry, as HyperAttention's authors "monkey patch" a
// pretrained model.
type Patch struct {
	// Mechanism is a registry name: "hyper", "performer", "exact", ….
	Mechanism string
	// Layers are the layers it replaces, counted from 0; nil means all.
	Layers []int
	// Settings are the mechanism's name=value parameters (DESIGN §7).
	Settings []string
}

// String returns the patch in the syntax ParsePatch reads.
func (p Patch) String() string {
	var parts []string
	if p.Layers != nil {
		ls := make([]string, len(p.Layers))
		for i, l := range p.Layers {
			ls[i] = strconv.Itoa(l)
		}
		parts = append(parts, "layers="+strings.Join(ls, ","))
	}
	parts = append(parts, p.Settings...)
	if len(parts) == 0 {
		return p.Mechanism
	}
	return p.Mechanism + ":" + strings.Join(parts, ",")
}

// ParsePatch parses patch specs separated by ';', each
//
//	NAME[:name=value,name=value,...]
//
// for example "hyper:layers=2-3,block=32,samples=32". The parameter layers
// lists layers and ranges ("0,2,4-5", or "all", the default); the others
// go to the mechanism. A comma-separated item without '=' continues the
// previous value, so lists need no quoting: "layers=0,2,block=32" and
// "longformer:globals=0,5,left=8" mean what they say. Names, parameters
// and layer numbers are checked when the model is built (New).
func ParsePatch(spec string) ([]Patch, error) {
	var out []Patch
	for one := range strings.SplitSeq(spec, ";") {
		one = strings.TrimSpace(one)
		if one == "" {
			continue
		}
		name, rest, _ := strings.Cut(one, ":")
		p := Patch{Mechanism: strings.TrimSpace(name)}
		if p.Mechanism == "" {
			return nil, fmt.Errorf("%w: patch %q has no mechanism name", attn.ErrInput, one)
		}
		var items []string
		if strings.TrimSpace(rest) != "" {
			for it := range strings.SplitSeq(rest, ",") {
				it = strings.TrimSpace(it)
				switch {
				case strings.Contains(it, "="):
					items = append(items, it)
				case len(items) == 0:
					return nil, fmt.Errorf("%w: patch %q: %q is not name=value", attn.ErrInput, one, it)
				default:
					items[len(items)-1] += "," + it
				}
			}
		}
		for _, it := range items {
			k, v, _ := strings.Cut(it, "=")
			if strings.TrimSpace(k) != "layers" {
				p.Settings = append(p.Settings, it)
				continue
			}
			if p.Layers != nil {
				return nil, fmt.Errorf("%w: patch %q sets layers twice", attn.ErrInput, one)
			}
			ls, err := parseLayers(strings.TrimSpace(v))
			if err != nil {
				return nil, fmt.Errorf("%w: patch %q: %v", attn.ErrInput, one, err)
			}
			p.Layers = ls
		}
		out = append(out, p)
	}
	return out, nil
}

// parseLayers parses "all" (nil) or a comma-separated list of layers and
// ranges lo-hi (inclusive).
func parseLayers(s string) ([]int, error) {
	if s == "all" {
		return nil, nil
	}
	ls := []int{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(strings.TrimSpace(lo))
		if err != nil || a < 0 {
			return nil, fmt.Errorf("layers: %q is not a layer number or range", f)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil || b < a {
				return nil, fmt.Errorf("layers: %q is not a range lo-hi with lo <= hi", f)
			}
		}
		if b-a > maxLayers {
			return nil, fmt.Errorf("layers: range %q is longer than any model", f)
		}
		for l := a; l <= b; l++ {
			ls = append(ls, l)
		}
	}
	if len(ls) == 0 {
		return nil, fmt.Errorf("layers: empty list")
	}
	slices.Sort(ls)
	return slices.Compact(ls), nil
}
