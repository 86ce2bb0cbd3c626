package eval

import (
	"fmt"
	"strings"
)

// BudgetSweep is one curve of `attn accuracy`: mechanism Mech run with each
// parameter of Params set to each of Values in turn, and Fixed held. The
// names are those of DESIGN.md §7.
type BudgetSweep struct {
	Mech string
	// Params move together: a window's left and right.
	Params []string
	Values []int
	// Fixed settings hold for every point; "min=0" stops the mechanisms
	// that fall back to exact attention on short inputs from doing so, so
	// that the curve shows the approximation at every length.
	Fixed []string
	// Unit says what Values count.
	Unit string
}

// Name is "mech param" ("window left,right"), or the mechanism's name for a
// sweep with no parameter.
func (b BudgetSweep) Name() string {
	if len(b.Params) == 0 {
		return b.Mech
	}
	return b.Mech + " " + strings.Join(b.Params, ",")
}

// Settings returns the `name=value` settings of the point with value v.
func (b BudgetSweep) Settings(v int) []string {
	out := append([]string(nil), b.Fixed...)
	for _, p := range b.Params {
		out = append(out, fmt.Sprintf("%s=%d", p, v))
	}
	return out
}

func pow2(lo, hi int) []int {
	var v []int
	for x := lo; x <= hi; x *= 2 {
		v = append(v, x)
	}
	return v
}

// BudgetSweeps is the one table of budget sweeps, keyed by mechanism and
// parameter name. A mechanism that is registered but has no entry here is
// measured once at its defaults; an entry whose mechanism is not
// registered is left out.
var BudgetSweeps = []BudgetSweep{
	{Mech: "window", Params: []string{"left", "right"}, Values: pow2(16, 512), Unit: "keys each side"},
	{Mech: "strided", Params: []string{"stride"}, Values: pow2(16, 256), Unit: "tokens"},
	{Mech: "longformer", Params: []string{"left", "right"}, Values: pow2(16, 512), Unit: "keys each side"},
	{Mech: "bigbird", Params: []string{"window"}, Values: []int{1, 3, 5, 9, 17}, Unit: "blocks"},
	{Mech: "bigbird", Params: []string{"block"}, Values: pow2(16, 256), Unit: "tokens"},
	{Mech: "linformer", Params: []string{"k"}, Values: pow2(16, 1024), Unit: "projected rows"},
	{Mech: "reformer", Params: []string{"hashes"}, Values: pow2(1, 8), Fixed: []string{"min=0"}, Unit: "hash rounds"},
	{Mech: "reformer", Params: []string{"bucket"}, Values: pow2(16, 256), Fixed: []string{"min=0"}, Unit: "tokens"},
	{Mech: "performer", Params: []string{"features"}, Values: pow2(16, 1024), Fixed: []string{"min=0"}, Unit: "random features"},
	{Mech: "hyper", Params: []string{"samples"}, Values: pow2(16, 1024), Fixed: []string{"min=0"}, Unit: "sampled columns"},
	{Mech: "hyper", Params: []string{"block"}, Values: pow2(16, 512), Fixed: []string{"min=0"}, Unit: "tokens"},
	{Mech: "linear"},
}

// SweepsFor returns the sweeps of mechanism mech, or one sweep with no
// parameter when the table has none.
func SweepsFor(mech string) []BudgetSweep {
	var out []BudgetSweep
	for _, b := range BudgetSweeps {
		if b.Mech == mech {
			out = append(out, b)
		}
	}
	if out == nil {
		out = []BudgetSweep{{Mech: mech}}
	}
	return out
}
