package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/cmd/experiment"
	"github.com/attnkit/attn/registry"
	"github.com/attnkit/attn/tensorio"
)

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var mech *string
	fs := newFlags("run", stdout, stderr, helpText{
		synopsis: "attn run -mech NAME -q Q.npy -k K.npy -v V.npy -o O.npy [-lse L.npy] [-set name=value ...] [flags]",
		examples: []string{
			"attn run -mech exact -q q.npy -k k.npy -v v.npy -o o.npy -causal",
			"attn run -mech hyper -set samples=64 -q qkv.safetensors -k qkv.safetensors -v qkv.safetensors -o o.npy",
			"attn run -mech window -h                  # window's parameters",
		},
		about: `Runs one mechanism on tensors from files, so that another framework can
check it: Q is [B,H,N,D], K and V [B,Hkv,M,D], as .npy (float32 or
float64) or safetensors (FILE.safetensors[:NAME]; F32, F64, F16, BF16).
O is written as float32 [B,H,N,D], L as float32 [B,H,N]. A line on
stderr says when the mechanism ran exact attention instead of its
approximation, and why.`,
		more: func(w io.Writer) {
			e, err := lookupMech(*mech)
			if err != nil {
				return
			}
			fmt.Fprintf(w, "mechanism %s: %s\n", e.Name, e.Summary)
			if len(e.Params) == 0 {
				fmt.Fprintln(w, "  no -set parameters")
			}
			for _, p := range e.Params {
				fmt.Fprintf(w, "  -set %s=… (%s, default %s): %s\n", p.Name, p.Range(), p.DefaultText(), p.Doc)
			}
		},
	})
	mech = fs.String("mech", "exact", "mechanism: "+strings.Join(registry.Names(), ", "))
	qPath := fs.String("q", "", "queries `FILE`[:tensor], shape [B,H,N,D] (.npy or .safetensors)")
	kPath := fs.String("k", "", "keys `FILE`[:tensor], shape [B,Hkv,M,D]")
	vPath := fs.String("v", "", "values `FILE`[:tensor], shape [B,Hkv,M,D]")
	oPath := fs.String("o", "", "output `FILE`.npy, float32 [B,H,N,D]")
	lPath := fs.String("lse", "", "optional log-sum-exp output `FILE`.npy, float32 [B,H,N]")
	causal := fs.Bool("causal", false, "bottom-right aligned causal mask")
	scale := fs.Float64("scale", 0, "logit scale (0: 1/sqrt(D))")
	kvlen := fs.String("kvlen", "", "valid key `LENGTHS` per batch row, comma-separated (default: all M)")
	var workers int
	fs.workersVar(&workers)
	seed := fs.Uint64("seed", 1, "seed for randomised mechanisms")
	var set listFlag
	fs.Var(&set, "set", "mechanism parameter `name=value` (or MECH:name=value; repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"-q", *qPath}, {"-k", *kPath}, {"-v", *vPath}, {"-o", *oPath}} {
		if f.v == "" {
			return fmt.Errorf("%s is required", f.name)
		}
	}
	e, err := lookupMech(*mech)
	if err != nil {
		return err
	}
	sets, err := experiment.ParseSettings(set)
	if err != nil {
		return err
	}
	if err := sets.Check([]string{*mech}, experiment.Lookup(lookupMech)); err != nil {
		return err
	}
	p, err := registry.ParseSettings(sets.For(e, nil))
	if err != nil {
		return err
	}
	m, err := e.New(p, *seed)
	if err != nil {
		return err
	}
	q, err := loadTensor(*qPath, "q")
	if err != nil {
		return err
	}
	k, err := loadTensor(*kPath, "k")
	if err != nil {
		return err
	}
	v, err := loadTensor(*vPath, "v")
	if err != nil {
		return err
	}
	s, err := shapeOf(q, k, v)
	if err != nil {
		return err
	}
	o := attn.Options{Scale: float32(*scale), Causal: *causal, Workers: workers}
	if *scale != 0 && (float64(o.Scale) == 0 || math.IsInf(float64(o.Scale), 0)) {
		return fmt.Errorf("-scale %v does not fit in float32", *scale)
	}
	if *kvlen != "" {
		if o.KVLen, err = parseInts("kvlen", *kvlen, 0, s.M, false); err != nil {
			return err
		}
	}
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if why := attn.FallbackOf(m, s, o); why != "" {
		fmt.Fprintf(stderr, "%s: ran exact attention: %s\n", m.Name(), why)
	}
	if err := m.Forward(ctx, s, q.Data, k.Data, v.Data, o, out, lse); err != nil {
		return err
	}
	if err := tensorio.WriteNPYFile(*oPath, &tensorio.Tensor{Shape: []int{s.B, s.H, s.N, s.D}, Data: out}); err != nil {
		return err
	}
	if *lPath != "" {
		if err := tensorio.WriteNPYFile(*lPath, &tensorio.Tensor{Shape: []int{s.B, s.H, s.N}, Data: lse}); err != nil {
			return err
		}
	}
	return nil
}

// loadTensor reads PATH or PATH:NAME. A .safetensors file with one tensor
// needs no NAME; with several, NAME defaults to def ("q", "k" or "v").
func loadTensor(arg, def string) (*tensorio.Tensor, error) {
	path, name := arg, ""
	if i := strings.LastIndex(arg, ":"); i > 0 && strings.HasSuffix(arg[:i], ".safetensors") {
		path, name = arg[:i], arg[i+1:]
	}
	var t *tensorio.Tensor
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npy":
		var err error
		if t, err = tensorio.ReadNPYFile(path); err != nil {
			return nil, err
		}
	case ".safetensors":
		ts, _, err := tensorio.ReadSafetensorsFile(path)
		if err != nil {
			return nil, err
		}
		if t, err = pickTensor(ts, name, def, path); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%s: unknown file type (want .npy or .safetensors)", path)
	}
	for i, x := range t.Data {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("%s: element %d is %v; inputs must be finite", arg, i, x)
		}
	}
	return t, nil
}

func pickTensor(ts map[string]*tensorio.Tensor, name, def, path string) (*tensorio.Tensor, error) {
	if name == "" && len(ts) == 1 {
		for _, t := range ts {
			return t, nil
		}
	}
	if name == "" {
		name = def
	}
	t, ok := ts[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor named %q (name one as %s:NAME)", path, name, path)
	}
	return t, nil
}

// shapeOf checks that q is [B,H,N,D] and k, v are [B,Hkv,M,D] and returns
// the shape.
func shapeOf(q, k, v *tensorio.Tensor) (attn.Shape, error) {
	for _, t := range []struct {
		name string
		t    *tensorio.Tensor
	}{{"Q", q}, {"K", k}, {"V", v}} {
		if len(t.t.Shape) != 4 {
			return attn.Shape{}, fmt.Errorf("%s has shape %v, want 4 dimensions [B,heads,length,D]", t.name, t.t.Shape)
		}
	}
	if fmt.Sprint(k.Shape) != fmt.Sprint(v.Shape) {
		return attn.Shape{}, fmt.Errorf("K has shape %v but V has %v; they must match", k.Shape, v.Shape)
	}
	if q.Shape[0] != k.Shape[0] {
		return attn.Shape{}, fmt.Errorf("Q has batch %d but K has %d", q.Shape[0], k.Shape[0])
	}
	if q.Shape[3] != k.Shape[3] {
		return attn.Shape{}, fmt.Errorf("Q has head size %d but K has %d", q.Shape[3], k.Shape[3])
	}
	s := attn.Shape{B: q.Shape[0], H: q.Shape[1], HKV: k.Shape[1], N: q.Shape[2], M: k.Shape[2], D: q.Shape[3]}
	return s, s.Validate()
}
