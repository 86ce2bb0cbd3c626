package experiment

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/registry"
)

func TestParseSettings(t *testing.T) {
	got, err := ParseSettings([]string{"left=8", "window:right=3,dilation=2", "longformer:globals=0,5,9;hyper:samples=64", " min = 0 "})
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{{"", "left", "8"}, {"window", "right", "3"}, {"window", "dilation", "2"},
		{"longformer", "globals", "0,5,9"}, {"hyper", "samples", "64"}, {"", "min", "0"}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"left", "=3", "window:", ":left=3", "window:=3"} {
		if _, err := ParseSettings([]string{bad}); !errors.Is(err, attn.ErrInput) {
			t.Errorf("%q: err %v, want ErrInput", bad, err)
		}
	}
}

func TestSettingsForAndCheck(t *testing.T) {
	ss, err := ParseSettings([]string{"left=8", "min=0", "window:left=16", "hyper:samples=32"})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"window", "hyper", "exact"}
	if err := ss.Check(names, nil); err != nil {
		t.Fatal(err)
	}
	win, _ := registry.Lookup("window")
	hyp, _ := registry.Lookup("hyper")
	// The budget's, then -set for all, then -set for the mechanism.
	if got := ss.For(win, []string{"left=4", "right=2"}); !slices.Equal(got, []string{"left=16", "right=2"}) {
		t.Errorf("window: %v", got)
	}
	if got := ss.For(hyp, []string{"samples=8", "block=16"}); !slices.Equal(got, []string{"samples=32", "block=16", "min=0"}) {
		t.Errorf("hyper: %v", got)
	}
	for _, c := range []struct {
		set  string
		want string
	}{
		{"nosuch=1", "no selected mechanism"},
		{"performer:features=8", "not among the selected"},
		{"window:samples=8", "has no parameter"},
	} {
		ss, err := ParseSettings([]string{c.set})
		if err != nil {
			t.Fatal(err)
		}
		if err := ss.Check(names, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.set, err, c.want)
		}
	}
}

func TestMerge(t *testing.T) {
	got := Merge([]string{"a=1", "b=2"}, []string{"b=3", "c=4", "a = 5"})
	if want := []string{"a = 5", "b=3", "c=4"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
