package experiment

import (
	"fmt"

	"github.com/attnkit/attn"
)

// LayerModel is what LayerFallbacks reads of a model (*model.Model).
type LayerModel interface {
	Fallback(l, n int) string
	Mechanism(l int) attn.Mechanism
}

// LayerFallbacks returns one line for each of the layers of m that runs
// exact attention over n positions, or over shortest where the
// approximation runs over n (a shorter last window, say; 0: none).
func LayerFallbacks(m LayerModel, layers, n, shortest int) []string {
	var lines []string
	for l := range layers {
		name := "?"
		if mech := m.Mechanism(l); mech != nil {
			name = mech.Name()
		}
		if why := m.Fallback(l, n); why != "" {
			lines = append(lines, fmt.Sprintf("layer %d (%s): ran exact attention: %s", l, name, why))
		} else if shortest > 0 && shortest != n {
			if why := m.Fallback(l, shortest); why != "" {
				lines = append(lines, fmt.Sprintf("layer %d (%s): ran exact attention over %d positions: %s", l, name, shortest, why))
			}
		}
	}
	return lines
}
