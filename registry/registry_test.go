package registry

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
	"github.com/attnkit/attn/hyper"
	"github.com/attnkit/attn/linear"
	"github.com/attnkit/attn/linformer"
	"github.com/attnkit/attn/performer"
	"github.com/attnkit/attn/ref"
	"github.com/attnkit/attn/reformer"
	"github.com/attnkit/attn/sparse"
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
		{"exact", []string{"k=3"}, `unknown parameter "k" (known: none)`},
		{"window", []string{"k=3"}, `unknown parameter "k" (known: left, right, dilation)`},
		{"exact", []string{"noequals"}, "not name=value"},
		{"exact", []string{"=3"}, "not name=value"},
		{"exact", []string{"a=1", "a=2"}, "set twice"},
		{"window", []string{"left=x"}, `parameter left="x" is not an integer`},
		{"window", []string{"dilation=0"}, "parameter dilation=0 is outside [1, "},
		{"window", []string{"left=0", "right=0"}, "left=0 and right=0"},
		{"strided", []string{"mode=diagonal"}, `parameter mode="diagonal" is not one of strided, fixed`},
		{"strided", []string{"summary=2"}, "applies to mode=fixed only"},
		{"strided", []string{"mode=fixed", "stride=4", "summary=5"}, "more than stride=4"},
		{"longformer", []string{"globals=1,x"}, `parameter globals: "x" is not an integer`},
		{"hyper", []string{"projs=31"}, "parameter projs=31 is outside [1, 30]"},
		{"performer", []string{"kind=gauss"}, "not one of positive, trig"},
	}
	for _, c := range cases {
		_, err := New(c.name, c.settings, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%q, %q): got %v, want %q", c.name, c.settings, err, c.want)
		}
	}
}

// testEntry declares one parameter of each kind.
var testEntry = Entry{
	Name: "test",
	Params: []Param{
		intParam("n", 7, 1, 10, "an int"),
		intsParam("list", []int{1, 2}, 0, 5, "a list"),
		enumParam("mode", "strided", []string{"strided", "fixed"}, "an enum"),
		{Name: "label", Kind: KindString, Default: "x", Doc: "text"},
		{Name: "auto", Kind: KindInt, Lo: 1, Hi: 10, Doc: "derived",
			Derive: func(eff map[string]string) string { return eff["n"] }},
	},
}

func TestParams(t *testing.T) {
	p, err := ParseSettings([]string{"n=5", "list=1, 2,3", "mode=fixed", "label=hello world"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.bind(testEntry.Params); err != nil {
		t.Fatal(err)
	}
	if v, err := p.Int("n"); v != 5 || err != nil {
		t.Errorf("Int(n) = %d, %v", v, err)
	}
	if v, err := p.Int("auto"); v != 0 || err != nil {
		t.Errorf("Int(auto) unset, derived default = %d, %v; want 0 (the package's default)", v, err)
	}
	if v, err := p.Ints("list"); err != nil || !slices.Equal(v, []int{1, 2, 3}) {
		t.Errorf("Ints(list) = %v, %v", v, err)
	}
	if v, err := p.String("mode"); v != "fixed" || err != nil {
		t.Errorf("String(mode) = %q, %v", v, err)
	}
	if v, err := p.String("label"); v != "hello world" || err != nil {
		t.Errorf("String(label) = %q, %v", v, err)
	}
	if _, err := p.Int("mode"); err == nil {
		t.Error("Int read an enum")
	}
	if _, err := p.Int("undeclared"); err == nil || !strings.Contains(err.Error(), "not declared") {
		t.Errorf("Int(undeclared): %v", err)
	}
	if !p.Has("n") || p.Has("zzz") {
		t.Error("Has")
	}
	if left := p.unused(); len(left) != 0 {
		t.Errorf("unused after reading all: %v", left)
	}
	// Unset, each returns its default.
	p, _ = ParseSettings(nil)
	if err := p.bind(testEntry.Params); err != nil {
		t.Fatal(err)
	}
	n, _ := p.Int("n")
	l, _ := p.Ints("list")
	m, _ := p.String("mode")
	if n != 7 || !slices.Equal(l, []int{1, 2}) || m != "strided" {
		t.Errorf("defaults: %d %v %q", n, l, m)
	}
	for _, bad := range [][]string{{"n=11"}, {"n=x"}, {"list=1,6"}, {"mode=other"}, {"nope=1"}} {
		p, _ := ParseSettings(bad)
		if err := p.bind(testEntry.Params); err == nil {
			t.Errorf("bind accepted %q", bad)
		}
	}
	if _, err := ParseInts("x", "1,a", 0, 5); err == nil {
		t.Error("ParseInts accepted a")
	}
	if _, err := ParseInts("x", "1,9", 0, 5); err == nil {
		t.Error("ParseInts accepted 9 > 5")
	}
}

// A declared parameter that Build never reads would be silently ignored:
// New refuses.
func TestUnreadParameter(t *testing.T) {
	e := testEntry
	e.Build = func(p *Params, seed uint64) (attn.Mechanism, error) { return flash.New(flash.Config{}), nil }
	p, _ := ParseSettings([]string{"n=3"})
	if _, err := e.New(p, 0); err == nil || !strings.Contains(err.Error(), `"n" is declared but not read`) {
		t.Errorf("unread parameter: %v", err)
	}
}

func TestEffective(t *testing.T) {
	got, err := testEntry.Effective([]string{"list=3, 4", "n=2"}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"n": "2", "list": "3,4", "mode": "strided", "label": "x", "auto": "2"}
	if !mapsEqual(got, want) {
		t.Errorf("Effective = %v, want %v", got, want)
	}
	for _, c := range []struct {
		name     string
		settings []string
		causal   bool
		want     map[string]string
	}{
		{"exact", nil, false, map[string]string{}},
		{"window", []string{"left=16"}, true, map[string]string{"left": "16", "right": "64", "dilation": "1"}},
		{"strided", nil, false, map[string]string{"mode": "strided", "stride": "128"}},
		{"strided", []string{"mode=fixed", "stride=64"}, false, map[string]string{"mode": "fixed", "stride": "64", "summary": "4"}},
		{"strided", []string{"mode=fixed", "summary=9"}, false, map[string]string{"mode": "fixed", "stride": "128", "summary": "9"}},
		{"longformer", []string{"globals="}, false, map[string]string{"left": "64", "right": "64", "globals": ""}},
		{"performer", nil, false, map[string]string{"features": "256", "min": "2048", "kind": "positive", "chunk": "64"}},
		{"performer", nil, true, map[string]string{"features": "256", "min": "4096", "kind": "positive", "chunk": "64"}},
		{"performer", []string{"min=0"}, true, map[string]string{"features": "256", "min": "0", "kind": "positive", "chunk": "64"}},
		{"hyper", []string{"block=32"}, true, map[string]string{"projs": "7", "block": "32", "samples": "256", "min": "4096", "sampling": "uniform"}},
	} {
		got, err := Effective(c.name, c.settings, c.causal)
		if err != nil || !mapsEqual(got, c.want) {
			t.Errorf("Effective(%s, %q, causal=%v) = %v, %v; want %v", c.name, c.settings, c.causal, got, err, c.want)
		}
	}
	if _, err := Effective("window", []string{"left=-1"}, false); err == nil {
		t.Error("Effective accepted left=-1")
	}
	if _, err := Effective("window", []string{"nope=1"}, false); err == nil {
		t.Error("Effective accepted an unknown parameter")
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestDescriptors checks every entry's parameters against themselves:
// documented, defaults inside their own range, every parameter listed
// by Effective, and each one, set to its default, accepted and read.
func TestDescriptors(t *testing.T) {
	for _, e := range entries {
		if e.Build == nil || e.Summary == "" {
			t.Errorf("%s: no Build or Summary", e.Name)
		}
		eff, err := e.Effective(nil, false)
		if err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		for _, d := range e.Params {
			if d.Name == "" || d.Doc == "" {
				t.Errorf("%s: undocumented parameter %+v", e.Name, d)
			}
			if d.Default == "" && d.Derive == nil && d.Kind != KindInts {
				t.Errorf("%s %s: neither a default nor a rule for one", e.Name, d.Name)
			}
			for _, def := range []string{d.Default, d.CausalDefault} {
				if def == "" {
					continue
				}
				if c, err := d.Check(def); err != nil || c != def {
					t.Errorf("%s %s: default %q: %q, %v", e.Name, d.Name, def, c, err)
				}
				if _, err := New(e.Name, []string{d.Name + "=" + def}, 1); err != nil {
					t.Errorf("%s %s=%s (its default): %v", e.Name, d.Name, def, err)
				}
			}
			if _, ok := eff[d.Name]; !ok && d.Derive == nil {
				t.Errorf("%s: Effective lacks %s", e.Name, d.Name)
			}
		}
	}
}

// TestDefaultsMatchPackages: what the registry says its defaults are is
// what the packages do with a zero Config, read back from the built
// mechanisms.
func TestDefaultsMatchPackages(t *testing.T) {
	def := func(name, param string, causal bool) string {
		t.Helper()
		eff, err := Effective(name, nil, causal)
		if err != nil {
			t.Fatal(err)
		}
		return eff[param]
	}
	defInt := func(name, param string) int {
		t.Helper()
		v, err := strconv.Atoi(def(name, param, false))
		if err != nil {
			t.Fatalf("%s %s: %v", name, param, err)
		}
		return v
	}
	build := func(name string, settings ...string) attn.Mechanism {
		t.Helper()
		m, err := New(name, settings, 3)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	s := attn.Shape{B: 1, H: 1, HKV: 1, N: 300, M: 300, D: 8}
	pattern := func(m attn.Mechanism) flash.Pattern {
		t.Helper()
		p, err := m.(*sparse.Attention).Pattern(s, false)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	zeroPattern := func(m *sparse.Attention, err error) flash.Pattern {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return pattern(m)
	}

	w := pattern(build("window")).(sparse.Window)
	zw := zeroPattern(sparse.NewWindow(sparse.WindowConfig{})).(sparse.Window)
	if w.Left != defInt("window", "left") || w.Right != defInt("window", "right") || max(w.Dilation, 1) != defInt("window", "dilation") {
		t.Errorf("window: built %+v from the registry's defaults", w)
	}
	if zw.Left != w.Left || zw.Right != w.Right || max(zw.Dilation, 1) != max(w.Dilation, 1) {
		t.Errorf("window: zero config %+v, registry defaults %+v", zw, w)
	}

	st := pattern(build("strided")).(sparse.Strided)
	if zst := zeroPattern(sparse.NewStrided(sparse.StridedConfig{})).(sparse.Strided); st != zst ||
		string(st.Mode) != def("strided", "mode", false) || st.Stride != defInt("strided", "stride") {
		t.Errorf("strided: registry %+v, zero config %+v", st, zst)
	}
	fixed := pattern(build("strided", "mode=fixed", "stride=100")).(sparse.Strided)
	eff, _ := Effective("strided", []string{"mode=fixed", "stride=100"}, false)
	if strconv.Itoa(fixed.Summary) != eff["summary"] {
		t.Errorf("strided fixed, stride 100: summary %d built, %s in effect", fixed.Summary, eff["summary"])
	}

	lf := pattern(build("longformer")).(*sparse.Longformer)
	zlf := zeroPattern(sparse.NewLongformer(sparse.LongformerConfig{})).(*sparse.Longformer)
	l, r := lf.Window()
	zl, zr := zlf.Window()
	if l != defInt("longformer", "left") || r != defInt("longformer", "right") || formatInts(lf.Globals()) != def("longformer", "globals", false) ||
		l != zl || r != zr || !slices.Equal(lf.Globals(), zlf.Globals()) {
		t.Errorf("longformer: registry %d, %d, %v; zero config %d, %d, %v", l, r, lf.Globals(), zl, zr, zlf.Globals())
	}

	// BigBird exposes its block only: the rest is compared by what the
	// patterns see, with the same seed.
	bb := pattern(build("bigbird"))
	zbb := zeroPattern(sparse.NewBigBird(sparse.BigBirdConfig{Seed: 3}))
	if bb.(*sparse.BigBird).Block() != defInt("bigbird", "block") {
		t.Errorf("bigbird block %d", bb.(*sparse.BigBird).Block())
	}
	for p := range s.N {
		for j := range s.M {
			if bb.Visible(p, j) != zbb.Visible(p, j) {
				t.Fatalf("bigbird: (%d, %d) visible %v with the registry's defaults, %v with a zero config", p, j, bb.Visible(p, j), zbb.Visible(p, j))
			}
		}
	}

	if c := build("linear").(*linear.Attention).Chunk(); c != defInt("linear", "chunk") || c != linear.New(linear.Config{}).Chunk() {
		t.Errorf("linear chunk %d", c)
	}

	pf := build("performer").(*performer.Performer)
	if pf.Features().Features(0) != defInt("performer", "features") || pf.Min() != defInt("performer", "min") ||
		pf.Features().Kind().String() != def("performer", "kind", false) {
		t.Errorf("performer: %d features, min %d, kind %v", pf.Features().Features(0), pf.Min(), pf.Features().Kind())
	}
	zpf, err := performer.New(performer.Config{Seed: 3})
	if err != nil || zpf.Min() != pf.Min() || zpf.Features().Features(0) != pf.Features().Features(0) {
		t.Errorf("performer zero config: %v, %v", zpf, err)
	}
	if c := def("performer", "min", true); strconv.Itoa(pf.MinFor(true)) != c || strconv.Itoa(pf.MinFor(false)) != def("performer", "min", false) {
		t.Errorf("performer: fallback lengths %d, causal %d; registry %s, causal %s",
			pf.MinFor(false), pf.MinFor(true), def("performer", "min", false), c)
	}

	lin := build("linformer").(*linformer.Linformer)
	if lin.K() != defInt("linformer", "k") || lin.Length() != defInt("linformer", "length") {
		t.Errorf("linformer: k %d, length %d", lin.K(), lin.Length())
	}

	rc := build("reformer").(*reformer.LSH).Config()
	zr2, err := reformer.New(reformer.Config{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if rc != zr2.Config() || rc.Hashes != defInt("reformer", "hashes") || rc.Bucket != defInt("reformer", "bucket") ||
		rc.Buckets != defInt("reformer", "buckets") || rc.Min != 0 || rc.SharedQK || rc.ExcludeSelf ||
		def("reformer", "min", false) != strconv.Itoa(reformer.DefaultMin) {
		t.Errorf("reformer: registry %+v, zero config %+v", rc, zr2.Config())
	}

	hc := build("hyper").(*hyper.Attention).Config()
	zh, err := hyper.New(hyper.Config{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if hc != zh.Config() || hc.Projs != defInt("hyper", "projs") || hc.Block != defInt("hyper", "block") ||
		hc.Samples != defInt("hyper", "samples") || hc.Min != defInt("hyper", "min") || hc.Sampling.String() != def("hyper", "sampling", false) {
		t.Errorf("hyper: registry %+v, zero config %+v", hc, zh.Config())
	}
}

// TestFallbackMatchesMin: where a mechanism says when it falls back, the
// registry's min (its default, causal or not, and a setting) is where
// that happens.
func TestFallbackMatchesMin(t *testing.T) {
	for _, e := range entries {
		if _, ok := e.Param("min"); !ok {
			continue
		}
		// Under the causal mask a length of min may still run exactly
		// (hyper's recursion splits it into exact leaves): a length well
		// past min and the block sizes must not.
		for _, c := range []struct {
			settings []string
			causal   bool
		}{{nil, false}, {nil, true}, {[]string{"min=100"}, false}} {
			if _, ok := e.Param("samples"); ok && c.settings != nil {
				// hyper is exact, whatever min, where one block or the
				// samples cover every key.
				c.settings = append(c.settings, "block=16", "samples=16")
			}
			m, err := New(e.Name, c.settings, 1)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := m.(attn.Fallbacker); !ok {
				t.Logf("%s does not say when it falls back yet", e.Name)
				break
			}
			eff, _ := e.Effective(c.settings, c.causal)
			min, _ := strconv.Atoi(eff["min"])
			o := attn.Options{Causal: c.causal}
			below := attn.Shape{B: 1, H: 2, HKV: 1, N: min - 1, M: min - 1, D: 16}
			at := attn.Shape{B: 1, H: 2, HKV: 1, N: min, M: min, D: 16}
			if c.causal {
				at.N, at.M = 4*min, 4*min
			}
			if attn.FallbackOf(m, below, o) == "" || attn.FallbackOf(m, at, o) != "" {
				t.Errorf("%s %q causal=%v: min %d in effect, but fallback at %d: %q, at %d: %q", e.Name, c.settings, c.causal,
					min, min-1, attn.FallbackOf(m, below, o), at.N, attn.FallbackOf(m, at, o))
			}
		}
	}
}

// TestCapabilities checks each entry's Causal, Decode and Backward flags
// against what a mechanism built with its defaults does, and runs every
// mechanism on a small odd-sized input: finite output, or for a mask it
// does not support, ErrUnsupported.
func TestCapabilities(t *testing.T) {
	seed := uint64(7)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 37, M: 53, D: 24}
	q, k, v := ref.Normal(rng, s.QLen()), ref.Normal(rng, s.KVLen()), ref.Normal(rng, s.KVLen())
	ctx := context.Background()
	for _, e := range entries {
		m, err := New(e.Name, nil, seed)
		if err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		if m.Name() != e.Name {
			t.Errorf("%s builds a mechanism named %q", e.Name, m.Name())
		}
		for _, causal := range []bool{false, true} {
			out := make([]float32, s.QLen())
			lse := make([]float32, s.LSELen())
			o := attn.Options{Causal: causal, KVLen: []int{53, 20}}
			err := m.Forward(ctx, s, q, k, v, o, out, lse)
			switch {
			case causal && !e.Causal:
				if !errors.Is(err, attn.ErrUnsupported) {
					t.Errorf("%s: Causal is false, but a causal Forward gives %v, not ErrUnsupported", e.Name, err)
				}
				continue
			case err != nil && causal:
				t.Errorf("%s: Causal is true, but a causal Forward gives %v", e.Name, err)
				continue
			case err != nil:
				t.Errorf("%s: %v", e.Name, err)
				continue
			}
			for i, x := range out {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("%s causal=%v: out[%d] = %v", e.Name, causal, i, x)
				}
			}
		}

		cfg := attn.DecodeConfig{B: 2, H: 4, HKV: 2, D: 24}
		d, err := NewDecoder(m, cfg)
		switch {
		case e.Decode && err != nil:
			t.Errorf("%s: Decode is true, but NewDecoder: %v", e.Name, err)
		case !e.Decode && err == nil:
			t.Errorf("%s: Decode is false, but NewDecoder gives a decoder: set Decode", e.Name)
		case !e.Decode && !errors.Is(err, attn.ErrUnsupported):
			t.Errorf("%s: NewDecoder error %v does not wrap ErrUnsupported", e.Name, err)
		case e.Decode:
			n := 3
			ds := attn.Shape{B: 2, H: 4, HKV: 2, N: n, M: n, D: 24}
			out := make([]float32, ds.QLen())
			if err := d.Step(ctx, q[:ds.QLen()], k[:ds.KVLen()], v[:ds.KVLen()], n, nil, out, nil); err != nil || d.Len(1) != n {
				t.Errorf("%s: Step: %v, Len %d", e.Name, err, d.Len(1))
			}
		}

		_, err = Differentiable(m)
		switch {
		case e.Backward && err != nil:
			t.Errorf("%s: Backward is true, but Differentiable: %v", e.Name, err)
		case !e.Backward && err == nil:
			t.Errorf("%s: Backward is false, but the mechanism has a backward pass: set Backward", e.Name)
		case !e.Backward && !errors.Is(err, attn.ErrUnsupported):
			t.Errorf("%s: Differentiable error %v does not wrap ErrUnsupported", e.Name, err)
		}
	}
}

// TestSweepsAndBudgets: every sweep and patching budget names parameters
// its mechanism declares, and builds at each point.
func TestSweepsAndBudgets(t *testing.T) {
	for _, e := range entries {
		for _, sw := range e.Sweeps {
			if len(sw.Params) == 0 || len(sw.Values) == 0 || sw.Unit == "" {
				t.Errorf("%s: sweep %+v", e.Name, sw)
			}
			for _, v := range sw.Values {
				if _, err := New(e.Name, sw.Settings(v), 1); err != nil {
					t.Errorf("%s sweep %v=%d: %v", e.Name, sw.Params, v, err)
				}
			}
		}
		for _, n := range []int{2, 24, 511, 4096} {
			b := e.Budget(n, n)
			if b.Rule == "" {
				t.Errorf("%s: budget without a rule", e.Name)
			}
			if _, err := New(e.Name, b.Settings, 1); err != nil {
				t.Errorf("%s budget at n=%d %v: %v", e.Name, n, b.Settings, err)
			}
		}
	}
	// The budgets follow n: about n/8 keys per query, but for strided,
	// whose stride √n is the Sparse Transformer's and sees fewer.
	for _, e := range entries {
		if e.Scaled == nil || e.Name == "strided" {
			continue
		}
		if b := e.Budget(4096, 4096); b.Keys < 4096/8/2 || b.Keys > 4096/8*2 {
			t.Errorf("%s at n=4096: %v keys per query, want about 512 (%v)", e.Name, b.Keys, b.Settings)
		}
	}
	h, _ := Lookup("hyper")
	if b := h.Budget(4096, 4096); !slices.Equal(b.Settings, []string{"block=128", "samples=128", "min=0"}) {
		t.Errorf("hyper: %v", b.Settings)
	}
	lf, _ := Lookup("longformer")
	if b := lf.Budget(100, 2); !slices.Contains(b.Settings, "globals=0,1") {
		t.Errorf("longformer with a window of 2 tokens: %v", b.Settings)
	}
	ex, _ := Lookup("exact")
	if b := ex.Budget(100, 100); b.Settings != nil || !strings.Contains(b.Rule, "defaults") {
		t.Errorf("exact: %+v", b)
	}
}
