package registry

import (
	"strings"
	"testing"
)

func TestNewExact(t *testing.T) {
	m, err := New("exact", nil, 1)
	if err != nil || m.Name() != "exact" {
		t.Fatalf("New(exact) = %v, %v", m, err)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		name     string
		settings []string
		want     string
	}{
		{"nope", nil, `unknown mechanism "nope"`},
		{"exact", []string{"k=3"}, `unknown parameter "k"`},
		{"exact", []string{"noequals"}, "not name=value"},
		{"exact", []string{"=3"}, "not name=value"},
		{"exact", []string{"a=1", "a=2"}, "set twice"},
	}
	for _, c := range cases {
		_, err := New(c.name, c.settings, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%q, %q): got %v, want %q", c.name, c.settings, err, c.want)
		}
	}
}

func TestParams(t *testing.T) {
	p, err := ParseSettings([]string{"n=5", "bad=x", "list=1, 2,3", "mode=fixed", "big=99"})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := p.Int("n", 0, 1, 10); v != 5 || err != nil {
		t.Errorf("Int(n) = %d, %v", v, err)
	}
	if v, err := p.Int("unset", 7, 1, 10); v != 7 || err != nil {
		t.Errorf("Int(unset) = %d, %v", v, err)
	}
	if _, err := p.Int("bad", 0, 0, 1); err == nil {
		t.Error("Int(bad) accepted x")
	}
	if _, err := p.Int("big", 0, 0, 10); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("Int(big): %v", err)
	}
	if v, err := p.Ints("list", nil, 0, 5); err != nil || len(v) != 3 || v[2] != 3 {
		t.Errorf("Ints(list) = %v, %v", v, err)
	}
	if _, err := ParseInts("x", "1,a", 0, 5); err == nil {
		t.Error("ParseInts accepted a")
	}
	if _, err := ParseInts("x", "1,9", 0, 5); err == nil {
		t.Error("ParseInts accepted 9 > 5")
	}
	if v, err := p.String("mode", "strided", "strided", "fixed"); v != "fixed" || err != nil {
		t.Errorf("String(mode) = %q, %v", v, err)
	}
	if _, err := p.String("n", "", "a", "b"); err == nil {
		t.Error("String accepted a value outside its choices")
	}
	if !p.Has("n") || p.Has("zzz") {
		t.Error("Has")
	}
	if left := p.unused(); len(left) != 0 {
		t.Errorf("unused after reading all: %v", left)
	}
}
