package registry

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/ref"
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

// TestEveryMechanism builds each registered mechanism with its defaults and
// runs it on a small odd-sized input: it must give finite output or say
// clearly that it does not support the request.
func TestEveryMechanism(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 37, M: 53, D: 24}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	for _, name := range Names() {
		m, err := New(name, nil, 7)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if m.Name() != name {
			t.Errorf("%s builds a mechanism named %q", name, m.Name())
		}
		for _, causal := range []bool{false, true} {
			out := make([]float32, s.QLen())
			lse := make([]float32, s.LSELen())
			o := attn.Options{Causal: causal, KVLen: []int{53, 20}}
			err := m.Forward(context.Background(), s, q, k, v, o, out, lse)
			if errors.Is(err, attn.ErrUnsupported) {
				continue
			}
			if err != nil {
				t.Errorf("%s causal=%v: %v", name, causal, err)
				continue
			}
			for i, x := range out {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("%s causal=%v: out[%d] = %v", name, causal, i, x)
				}
			}
		}
		e, _ := Lookup(name)
		for _, p := range e.Params {
			if p.Name == "" || p.Doc == "" {
				t.Errorf("%s: undocumented parameter %+v", name, p)
			}
		}
	}
}
