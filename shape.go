package attn

import (
	"errors"
	"fmt"
	"math"
)

// ErrShape is wrapped by every error about tensor dimensions or slice
// lengths that do not agree.
var ErrShape = errors.New("attn: bad shape")

// ErrInput is wrapped by every error about option values or tensor
// contents (negative lengths, non-finite scale, NaN inputs).
var ErrInput = errors.New("attn: bad input")

// Shape describes one attention call.
type Shape struct {
	B   int // batch size
	H   int // query heads
	HKV int // key/value heads; H must be a multiple of HKV
	N   int // query length
	M   int // key/value length
	D   int // head size of queries, keys and values
}

// Group returns H/HKV, the number of query heads that share one key/value
// head.
func (s Shape) Group() int { return s.H / s.HKV }

// QLen is the length of Q and O: B·H·N·D.
func (s Shape) QLen() int { return s.B * s.H * s.N * s.D }

// KVLen is the length of K and of V: B·HKV·M·D.
func (s Shape) KVLen() int { return s.B * s.HKV * s.M * s.D }

// LSELen is the length of the log-sum-exp output: B·H·N.
func (s Shape) LSELen() int { return s.B * s.H * s.N }

// MaxElems bounds the elements of every tensor (Shape.Validate), and the
// packages' token counts with it, so that lengths, even in bytes of 8-byte
// elements, cannot overflow int: 2^40 where int has 64 bits, 2^28 where
// it has 32 (386, arm, mips).
const MaxElems = min(1<<40, math.MaxInt>>3)

// Validate reports whether the dimensions are usable: all positive, H a
// multiple of HKV and no tensor too large to index.
func (s Shape) Validate() error {
	dims := []struct {
		name string
		v    int
	}{{"B", s.B}, {"H", s.H}, {"Hkv", s.HKV}, {"N", s.N}, {"M", s.M}, {"D", s.D}}
	for _, d := range dims {
		if d.v <= 0 {
			return fmt.Errorf("%w: %s = %d, want > 0", ErrShape, d.name, d.v)
		}
		if d.v > MaxElems {
			return fmt.Errorf("%w: %s = %d is too large", ErrShape, d.name, d.v)
		}
	}
	if s.H%s.HKV != 0 {
		return fmt.Errorf("%w: H = %d is not a multiple of Hkv = %d", ErrShape, s.H, s.HKV)
	}
	if !fits(MaxElems, s.B, s.H, s.N, s.D) || !fits(MaxElems, s.B, s.HKV, s.M, s.D) {
		return fmt.Errorf("%w: %+v has more than %d elements in one tensor", ErrShape, s, MaxElems)
	}
	return nil
}

// fits reports whether the product of xs is at most limit, without overflow.
func fits(limit int, xs ...int) bool {
	p := 1
	for _, x := range xs {
		if x != 0 && p > limit/x {
			return false
		}
		p *= x
	}
	return p <= limit
}

// CheckTensors validates the shape and the lengths of q, k, v, and of out
// and lse where they are non-nil.
func (s Shape) CheckTensors(q, k, v, out, lse []float32) error {
	return CheckTensorsOf(s, q, k, v, out, lse)
}

// CheckTensorsOf is Shape.CheckTensors for q, k, v of any element type
// (bfloat16 bits as uint16, say), with float32 out and lse.
func CheckTensorsOf[E any](s Shape, q, k, v []E, out, lse []float32) error {
	if err := s.Validate(); err != nil {
		return err
	}
	check := func(name string, got, want int, dims string) error {
		if got != want {
			return fmt.Errorf("%w: len(%s) = %d, want %s = %d", ErrShape, name, got, dims, want)
		}
		return nil
	}
	errs := []error{
		check("Q", len(q), s.QLen(), "B·H·N·D"),
		check("K", len(k), s.KVLen(), "B·Hkv·M·D"),
		check("V", len(v), s.KVLen(), "B·Hkv·M·D"),
	}
	if out != nil {
		errs = append(errs, check("out", len(out), s.QLen(), "B·H·N·D"))
	}
	if lse != nil {
		errs = append(errs, check("lse", len(lse), s.LSELen(), "B·H·N"))
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Options are the settings every mechanism understands. The zero value is
// non-causal attention over all keys with scale 1/sqrt(D) on all CPUs.
type Options struct {
	// Scale multiplies the logits; 0 means 1/sqrt(D).
	Scale float32
	// Causal applies the bottom-right aligned causal mask.
	Causal bool
	// KVLen, when non-nil, holds one valid key length per batch row, each
	// in [0, M]; keys at or past it are padding.
	KVLen []int
	// Workers bounds the goroutines used; 0 means runtime.GOMAXPROCS(0).
	Workers int
}

// ScaleFor returns the scale in effect for head size d.
func (o Options) ScaleFor(d int) float32 {
	if o.Scale != 0 {
		return o.Scale
	}
	return float32(1 / math.Sqrt(float64(d)))
}

// Check validates the options against s.
func (o Options) Check(s Shape) error {
	if math.IsNaN(float64(o.Scale)) || math.IsInf(float64(o.Scale), 0) {
		return fmt.Errorf("%w: scale %v is not finite", ErrInput, o.Scale)
	}
	if o.Workers < 0 {
		return fmt.Errorf("%w: workers = %d, want >= 0", ErrInput, o.Workers)
	}
	if o.KVLen != nil {
		if len(o.KVLen) != s.B {
			return fmt.Errorf("%w: %d key lengths for batch size B = %d", ErrShape, len(o.KVLen), s.B)
		}
		for b, n := range o.KVLen {
			if n < 0 || n > s.M {
				return fmt.Errorf("%w: key length %d of batch row %d is outside [0, M = %d]", ErrInput, n, b, s.M)
			}
		}
	}
	return nil
}

// Check validates a whole call: shape, slice lengths and options. Mechanisms
// call it first so that every one rejects bad input the same way.
func Check(s Shape, q, k, v, out, lse []float32, o Options) error {
	if err := s.CheckTensors(q, k, v, out, lse); err != nil {
		return err
	}
	if out == nil {
		return fmt.Errorf("%w: out is nil", ErrShape)
	}
	return o.Check(s)
}

// KeyEnd returns how many keys are valid in batch row b: Options.KVLen[b],
// or M without padding.
func (o Options) KeyEnd(s Shape, b int) int {
	if o.KVLen == nil {
		return s.M
	}
	return o.KVLen[b]
}

// VisibleKeys returns the keys [0, end) that query i of batch row b may see
// under the causal and padding masks. end may be 0: the row sees nothing.
// Every mask in this package is a prefix of the keys, which is why one
// number describes it.
func (o Options) VisibleKeys(s Shape, b, i int) (end int) {
	end = o.KeyEnd(s, b)
	if o.Causal {
		// Bottom-right alignment: query i is at absolute position M-N+i.
		if c := s.M - s.N + i + 1; c < end {
			end = c
		}
	}
	if end < 0 {
		end = 0
	}
	return end
}

// WorkerCount returns the goroutine count in effect: o.Workers, or procs when it
// is 0, and never more than tasks nor less than 1.
func (o Options) WorkerCount(procs, tasks int) int {
	w := o.Workers
	if w == 0 {
		w = procs
	}
	if w > tasks {
		w = tasks
	}
	if w < 1 {
		w = 1
	}
	return w
}

// CheckBackward validates the arguments of a backward pass: everything
// Check asks of the forward call (with out required), the forward's lse,
// which every backward recomputes its probabilities from, and the lengths
// of the output gradient dout and of the gradients dq, dk and dv.
func CheckBackward(s Shape, q, k, v, out, lse, dout, dq, dk, dv []float32, o Options) error {
	if err := Check(s, q, k, v, out, lse, o); err != nil {
		return err
	}
	if lse == nil {
		return fmt.Errorf("%w: a backward pass needs lse, the log-sum-exp of the forward pass", ErrShape)
	}
	for _, t := range []struct {
		name      string
		got, want int
		dims      string
	}{
		{"dout", len(dout), s.QLen(), "B·H·N·D"},
		{"dq", len(dq), s.QLen(), "B·H·N·D"},
		{"dk", len(dk), s.KVLen(), "B·Hkv·M·D"},
		{"dv", len(dv), s.KVLen(), "B·Hkv·M·D"},
	} {
		if t.got != t.want {
			return fmt.Errorf("%w: len(%s) = %d, want %s = %d", ErrShape, t.name, t.got, t.dims, t.want)
		}
	}
	return nil
}
