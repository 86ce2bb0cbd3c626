package eval_test

import (
	"math"
	"slices"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/eval"
	"github.com/attnkit/attn/registry"
)

func TestGenerateDeterministic(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 33, M: 33, D: 8}
	for _, kind := range []string{eval.Gaussian, eval.Planted} {
		a, err := eval.Generate(kind, s, false, 7)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := eval.Generate(kind, s, false, 7)
		c, _ := eval.Generate(kind, s, false, 8)
		if !slices.Equal(a.Q, b.Q) || !slices.Equal(a.K, b.K) || !slices.Equal(a.V, b.V) {
			t.Errorf("%s: same seed, different inputs", kind)
		}
		if slices.Equal(a.K, c.K) {
			t.Errorf("%s: different seeds, same inputs", kind)
		}
		if len(a.Q) != s.QLen() || len(a.K) != s.KVLen() || len(a.V) != s.KVLen() {
			t.Errorf("%s: lengths %d %d %d", kind, len(a.Q), len(a.K), len(a.V))
		}
	}
	if _, err := eval.Generate("uniform", s, false, 1); err == nil {
		t.Error("unknown kind: no error")
	}
}

func TestPlantedHasHeavyHitters(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 2, N: 512, M: 512, D: 32}
	target := math.Log(float64(s.M)) + 6
	scale := 1 / math.Sqrt(float64(s.D))
	g, _ := eval.Generate(eval.Gaussian, s, true, 3)
	p, err := eval.Generate(eval.Planted, s, true, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(g.Q, p.Q) || !slices.Equal(g.V, p.V) {
		t.Fatal("planting changed Q or V")
	}
	dot := func(a, b []float32) float64 {
		d := 0.0
		for i := range a {
			d += float64(a[i]) * float64(b[i])
		}
		return d
	}
	planted := 0
	for h := range s.H {
		for j := range s.M {
			kg, kp := g.K[(h*s.M+j)*s.D:][:s.D], p.K[(h*s.M+j)*s.D:][:s.D]
			if slices.Equal(kg, kp) {
				continue
			}
			planted++
			// The new key is a multiple of one query that can see it
			// (causal: i >= j, since N = M) with logit log M + 6.
			found := false
			for i := range s.N {
				q := p.Q[(h*s.N+i)*s.D:][:s.D]
				cos := dot(q, kp) / math.Sqrt(dot(q, q)*dot(kp, kp))
				if cos < 1-1e-6 {
					continue
				}
				found = true
				if i < j {
					t.Errorf("head %d: key %d is planted for query %d, which cannot see it", h, j, i)
				}
				if l := scale * dot(q, kp); math.Abs(l-target) > 1e-3*target {
					t.Errorf("head %d: planted logit %g, want %g", h, l, target)
				}
			}
			if !found {
				t.Errorf("head %d: key %d changed but matches no query", h, j)
			}
		}
	}
	// One query in 16 plants a key; two can pick the same one.
	total := s.H * s.N
	if planted < total/32 || planted > total/8 {
		t.Errorf("%d of %d keys planted, want about 1 in 16", planted, total)
	}
}

// TestSweepsUseRegisteredNames checks the budget sweeps against the
// registry: every parameter a sweep sets must be one the mechanism
// documents (docs/DESIGN.md §7), so that no sweep silently does nothing.
func TestSweepsUseRegisteredNames(t *testing.T) {
	for _, sw := range eval.BudgetSweeps() {
		e, err := registry.Lookup(sw.Mech)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for _, p := range e.Params {
			names = append(names, p.Name)
		}
		for _, kv := range sw.Settings(1) {
			name, _, _ := splitSetting(kv)
			if !slices.Contains(names, name) {
				t.Errorf("sweep %q sets %q, which %s does not know (knows %v)", sw.Name(), name, sw.Mech, names)
			}
		}
		if len(sw.Params) > 0 && len(sw.Values) < 2 {
			t.Errorf("sweep %q has %d values", sw.Name(), len(sw.Values))
		}
		if !slices.IsSorted(sw.Values) {
			t.Errorf("sweep %q values %v not increasing", sw.Name(), sw.Values)
		}
	}
	for _, name := range registry.Names() {
		e, _ := registry.Lookup(name)
		if sw := eval.SweepsFor(e); len(sw) == 0 || sw[0].Mech != name {
			t.Errorf("sweeps for %s: %+v", name, sw)
		}
	}
}

func splitSetting(kv string) (string, string, bool) {
	for i := range kv {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}
