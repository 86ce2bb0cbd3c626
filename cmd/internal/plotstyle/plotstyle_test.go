package plotstyle

import (
	"image/color"
	"testing"
)

// TestPaletteDistinct: the mechanisms of a report never share a colour.
func TestPaletteDistinct(t *testing.T) {
	var names []string
	for i := range len(Distinct) {
		names = append(names, "m"+string(rune('a'+i)))
	}
	p := LocalPalette(names)
	seen := map[color.RGBA]string{}
	for _, n := range names {
		c, _, dashes := p.Style(n)
		rgba := c.(color.RGBA)
		if other, ok := seen[rgba]; ok {
			t.Errorf("%s and %s share a colour", n, other)
		}
		if dashes != nil {
			t.Errorf("%s is dashed", n)
		}
		seen[rgba] = n
	}
	// Every registered mechanism and ref have colours of their own, the
	// same in every report.
	if n := len(NewPalette(nil).names); n > len(Distinct) {
		t.Errorf("%d mechanisms and %d colours", n, len(Distinct))
	}
	a, b := NewPalette([]string{"hyper"}), NewPalette([]string{"window", "hyper"})
	if ca, _, _ := a.Style("hyper"); ca != func() color.Color { c, _, _ := b.Style("hyper"); return c }() {
		t.Error("hyper's colour depends on the other mechanisms of the report")
	}
}
