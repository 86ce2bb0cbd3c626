package attn_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/attnkit/attn"
)

func TestShapeValidate(t *testing.T) {
	good := attn.Shape{B: 2, H: 8, HKV: 2, N: 5, M: 7, D: 3}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid shape: %v", err)
	}
	cases := []struct {
		s    attn.Shape
		want string
	}{
		{attn.Shape{B: 0, H: 1, HKV: 1, N: 1, M: 1, D: 1}, "B = 0"},
		{attn.Shape{B: 1, H: -1, HKV: 1, N: 1, M: 1, D: 1}, "H = -1"},
		{attn.Shape{B: 1, H: 1, HKV: 0, N: 1, M: 1, D: 1}, "Hkv = 0"},
		{attn.Shape{B: 1, H: 1, HKV: 1, N: 0, M: 1, D: 1}, "N = 0"},
		{attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 0, D: 1}, "M = 0"},
		{attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 1, D: 0}, "D = 0"},
		{attn.Shape{B: 1, H: 6, HKV: 4, N: 1, M: 1, D: 1}, "H = 6 is not a multiple of Hkv = 4"},
		{attn.Shape{B: 1, H: 1, HKV: 1, N: 1, M: 1, D: min(1<<41, math.MaxInt)}, "too large"},
		{attn.Shape{B: 1 << 20, H: 1 << 20, HKV: 1, N: 2, M: 1, D: 1}, "elements in one tensor"},
	}
	for _, c := range cases {
		err := c.s.Validate()
		if !errors.Is(err, attn.ErrShape) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want ErrShape mentioning %q", c.s, err, c.want)
		}
	}
}

func TestCheck(t *testing.T) {
	s := attn.Shape{B: 2, H: 4, HKV: 2, N: 3, M: 5, D: 2}
	q := make([]float32, s.QLen())
	kv := make([]float32, s.KVLen())
	out := make([]float32, s.QLen())
	lse := make([]float32, s.LSELen())
	if err := attn.Check(s, q, kv, kv, out, lse, attn.Options{KVLen: []int{0, 5}}); err != nil {
		t.Fatalf("valid call: %v", err)
	}
	cases := []struct {
		name              string
		s                 attn.Shape
		q, k, v, out, lse []float32
		o                 attn.Options
		err               error
		want              string
	}{
		{"shape", attn.Shape{}, q, kv, kv, out, lse, attn.Options{}, attn.ErrShape, "B = 0"},
		{"q", s, q[1:], kv, kv, out, lse, attn.Options{}, attn.ErrShape, "len(Q)"},
		{"k", s, q, kv[1:], kv, out, lse, attn.Options{}, attn.ErrShape, "len(K)"},
		{"v", s, q, kv, kv[1:], out, lse, attn.Options{}, attn.ErrShape, "len(V)"},
		{"out", s, q, kv, kv, out[1:], lse, attn.Options{}, attn.ErrShape, "len(out)"},
		{"nil out", s, q, kv, kv, nil, lse, attn.Options{}, attn.ErrShape, "out is nil"},
		{"lse", s, q, kv, kv, out, lse[1:], attn.Options{}, attn.ErrShape, "len(lse)"},
		{"scale nan", s, q, kv, kv, out, lse, attn.Options{Scale: float32(math.NaN())}, attn.ErrInput, "scale"},
		{"workers", s, q, kv, kv, out, lse, attn.Options{Workers: -1}, attn.ErrInput, "workers"},
		{"kvlen count", s, q, kv, kv, out, lse, attn.Options{KVLen: []int{1}}, attn.ErrShape, "1 key lengths"},
		{"kvlen neg", s, q, kv, kv, out, lse, attn.Options{KVLen: []int{1, -1}}, attn.ErrInput, "batch row 1"},
		{"kvlen big", s, q, kv, kv, out, lse, attn.Options{KVLen: []int{6, 1}}, attn.ErrInput, "batch row 0"},
	}
	for _, c := range cases {
		err := attn.Check(c.s, c.q, c.k, c.v, c.out, c.lse, c.o)
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %v mentioning %q", c.name, err, c.err, c.want)
		}
	}
}

func TestVisibleKeys(t *testing.T) {
	s := attn.Shape{B: 2, H: 1, HKV: 1, N: 3, M: 5, D: 1}
	o := attn.Options{Causal: true, KVLen: []int{5, 3}}
	// Query i is at position M-N+i = 2+i and sees keys [0, 3+i), cut by
	// the valid length.
	want := [2][3]int{{3, 4, 5}, {3, 3, 3}}
	for b := range 2 {
		for i := range 3 {
			if got := o.VisibleKeys(s, b, i); got != want[b][i] {
				t.Errorf("b=%d i=%d: %d keys, want %d", b, i, got, want[b][i])
			}
		}
	}
	// More queries than keys: the first N-M see nothing.
	s = attn.Shape{B: 1, H: 1, HKV: 1, N: 4, M: 2, D: 1}
	o = attn.Options{Causal: true}
	for i, w := range []int{0, 0, 1, 2} {
		if got := o.VisibleKeys(s, 0, i); got != w {
			t.Errorf("N>M i=%d: %d keys, want %d", i, got, w)
		}
	}
}

func TestOptionsDefaults(t *testing.T) {
	var o attn.Options
	if got := o.ScaleFor(16); got != 0.25 {
		t.Errorf("default scale for D=16: %v", got)
	}
	o.Scale = 2
	if got := o.ScaleFor(16); got != 2 {
		t.Errorf("explicit scale: %v", got)
	}
	if got := o.WorkerCount(4, 100); got != 4 {
		t.Errorf("workers default: %d", got)
	}
	o.Workers = 8
	if got := o.WorkerCount(4, 3); got != 3 {
		t.Errorf("workers capped by tasks: %d", got)
	}
	if got := o.WorkerCount(4, 0); got != 1 {
		t.Errorf("workers at least 1: %d", got)
	}
}

func TestMerge(t *testing.T) {
	inf := float32(math.Inf(-1))
	// Row 0: equal lse, outputs average. Row 1: one side empty. Row 2: both
	// empty. Row 3: very different magnitudes, no overflow.
	dst := []float32{1, 3, 5, 7, 9, 9, 2, 2}
	dstL := []float32{0, inf, inf, 80}
	src := []float32{3, 1, 1, 1, 9, 9, 4, 4}
	srcL := []float32{0, 2, inf, 80 + float32(math.Log(3))}
	if err := attn.Merge(dst, dstL, src, srcL, 2); err != nil {
		t.Fatal(err)
	}
	want := []float32{2, 2, 1, 1, 0, 0, 3.5, 3.5}
	wantL := []float32{float32(math.Log(2)), 2, inf, 80 + float32(math.Log(4))}
	for i := range want {
		if math.Abs(float64(dst[i]-want[i])) > 1e-6 {
			t.Errorf("out[%d] = %v, want %v", i, dst[i], want[i])
		}
	}
	for i := range wantL {
		if dstL[i] != wantL[i] && math.Abs(float64(dstL[i]-wantL[i])) > 1e-5 {
			t.Errorf("lse[%d] = %v, want %v", i, dstL[i], wantL[i])
		}
	}
	for _, err := range []error{
		attn.Merge(dst, dstL, src, srcL, 0),
		attn.Merge(dst, dstL, src[1:], srcL, 2),
		attn.Merge(dst, dstL, src, srcL[1:], 2),
	} {
		if !errors.Is(err, attn.ErrShape) {
			t.Errorf("bad Merge arguments: got %v", err)
		}
	}
}

func TestLogAddExp(t *testing.T) {
	inf := math.Inf(-1)
	cases := [][3]float64{
		{0, 0, math.Log(2)},
		{inf, 3, 3},
		{inf, inf, inf},
		{1000, 1000, 1000 + math.Log(2)},
	}
	for _, c := range cases {
		if got := attn.LogAddExp(c[0], c[1]); got != c[2] && math.Abs(got-c[2]) > 1e-12 {
			t.Errorf("LogAddExp(%v, %v) = %v, want %v", c[0], c[1], got, c[2])
		}
	}
}

func ExampleMerge() {
	// Two partial results for one row of size 2, over disjoint key sets
	// with equal normalisers: the merged row is their average and the
	// normaliser doubles.
	out, lse := []float32{1, 0}, []float32{0}
	if err := attn.Merge(out, lse, []float32{0, 1}, []float32{0}, 2); err != nil {
		panic(err)
	}
	fmt.Printf("%v %.4f\n", out, lse[0])
	// Output: [0.5 0.5] 0.6931
}

func TestCheckBackward(t *testing.T) {
	s := attn.Shape{B: 1, H: 2, HKV: 1, N: 3, M: 4, D: 2}
	qo := make([]float32, s.QLen())
	kv := make([]float32, s.KVLen())
	lse := make([]float32, s.LSELen())
	if err := attn.CheckBackward(s, qo, kv, kv, qo, lse, qo, qo, kv, kv, attn.Options{}); err != nil {
		t.Fatalf("valid call: %v", err)
	}
	cases := []struct {
		name                           string
		lse, dout, dq, dk, dv, forward []float32
		want                           string
	}{
		{"forward", lse, qo, qo, kv, kv, qo[1:], "len(Q)"},
		{"no lse", nil, qo, qo, kv, kv, qo, "needs lse"},
		{"dout", lse, qo[1:], qo, kv, kv, qo, "len(dout)"},
		{"dq", lse, qo, qo[1:], kv, kv, qo, "len(dq)"},
		{"dk", lse, qo, qo, kv[1:], kv, qo, "len(dk)"},
		{"dv", lse, qo, qo, kv, kv[1:], qo, "len(dv)"},
	}
	for _, c := range cases {
		err := attn.CheckBackward(s, c.forward, kv, kv, qo, c.lse, c.dout, c.dq, c.dk, c.dv, attn.Options{})
		if !errors.Is(err, attn.ErrShape) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want ErrShape mentioning %q", c.name, err, c.want)
		}
	}
}
