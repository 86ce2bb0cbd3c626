package eval

import (
	"strings"

	"github.com/attnkit/attn/registry"
)

// BudgetSweep is one curve of `attn accuracy`: a sweep of the registry
// entry of mechanism Mech (registry.Entry.Sweeps).
type BudgetSweep struct {
	Mech string
	registry.Sweep
}

// Name is "mech param" ("window left,right"), or the mechanism's name for a
// sweep with no parameter.
func (b BudgetSweep) Name() string {
	if len(b.Params) == 0 {
		return b.Mech
	}
	return b.Mech + " " + strings.Join(b.Params, ",")
}

// SweepsFor returns the sweeps of entry e, or one sweep with no parameter
// (the mechanism at its defaults) when it has none.
func SweepsFor(e registry.Entry) []BudgetSweep {
	var out []BudgetSweep
	for _, s := range e.Sweeps {
		out = append(out, BudgetSweep{Mech: e.Name, Sweep: s})
	}
	if out == nil {
		out = []BudgetSweep{{Mech: e.Name}}
	}
	return out
}

// BudgetSweeps returns the sweeps of every registered mechanism, in
// registration order.
func BudgetSweeps() []BudgetSweep {
	var out []BudgetSweep
	for _, name := range registry.Names() {
		e, err := registry.Lookup(name)
		if err != nil {
			continue
		}
		out = append(out, SweepsFor(e)...)
	}
	return out
}
