package half

import (
	"math"
	"math/rand/v2"
	"testing"
)

// f16Ref computes a binary16 value from its definition.
func f16Ref(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	case 0:
		return sign * math.Ldexp(mant, -24)
	}
	return sign * math.Ldexp(1024+mant, exp-25)
}

func TestF16Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		want := f16Ref(h)
		got := F16ToF32(h)
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("%#04x: got %v, want NaN", h, got)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("%#04x: got %v, want %v", h, got, want)
		}
		// Every binary16 value survives a round trip.
		if back := F32ToF16(got); back != h {
			t.Fatalf("%#04x -> %v -> %#04x", h, got, back)
		}
	}
}

// nearestF16 finds the nearest binary16 value by search, ties to even.
func nearestF16(x float64) uint16 {
	if math.IsNaN(x) {
		return 0x7e00
	}
	best, bestErr := uint16(0), math.Inf(1)
	for i := range 0x7c01 { // non-negative finite values and +Inf
		v := f16Ref(uint16(i))
		e := math.Abs(v - math.Abs(x))
		if math.IsInf(v, 1) {
			// Values from 65520 up round to Inf.
			if math.Abs(x) >= 65520 {
				e = 0
			} else {
				continue
			}
		}
		if e < bestErr || (e == bestErr && i%2 == 0) {
			best, bestErr = uint16(i), e
		}
	}
	if math.Signbit(x) {
		best |= 0x8000
	}
	return best
}

func TestF32ToF16Rounding(t *testing.T) {
	xs := []float32{0, 1, -1, 65504, 65519.99, 65520, 1e6, 6e-8, 2.98e-8, 2.99e-8, 5.96e-8,
		1.0 / 3, 0.1, 1 + 1.0/2048, 1 + 3.0/2048, 6.1035e-5, 6.1e-5, -0.0, 3.14159}
	for i := range 300 {
		// Midpoints and neighbours across the whole binary16 range.
		v := float32(f16Ref(uint16(i * 103)))
		w := float32(f16Ref(uint16(i*103 + 1)))
		xs = append(xs, (v+w)/2, math.Nextafter32((v+w)/2, 0), math.Nextafter32((v+w)/2, 1e9))
	}
	for _, x := range xs {
		if got, want := F32ToF16(x), nearestF16(float64(x)); got != want {
			t.Errorf("F32ToF16(%v) = %#04x, want %#04x", x, got, want)
		}
	}
	if h := F32ToF16(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("NaN -> %#04x", h)
	}
	if F32ToF16(float32(math.Inf(-1))) != 0xfc00 {
		t.Error("-Inf")
	}
}

func TestBF16(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		x := BF16ToF32(h)
		if math.IsNaN(float64(x)) {
			continue
		}
		if back := F32ToBF16(x); back != h {
			t.Fatalf("%#04x -> %v -> %#04x", h, x, back)
		}
	}
	cases := []struct {
		bits uint32
		want uint16
	}{
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81}, // above the tie
		{0x7f7fffff, 0x7f80}, // largest float32 rounds to Inf
	}
	for _, c := range cases {
		if got := F32ToBF16(math.Float32frombits(c.bits)); got != c.want {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", c.bits, got, c.want)
		}
	}
	if !math.IsNaN(float64(BF16ToF32(F32ToBF16(float32(math.NaN()))))) {
		t.Error("NaN lost")
	}
}

// TestBF16Directed checks the directed roundings against the float64
// neighbours: Up is the least bfloat16 not below x, Down the greatest not
// above, both x itself where x is a bfloat16, over random bit patterns
// and the edges (zeros, subnormals, the largest finite values, Inf,
// NaN).
func TestBF16Directed(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	xs := []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32,
		math.MaxFloat32, -math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), 1, -1, 1.00001, -1.00001}
	for range 100000 {
		xs = append(xs, math.Float32frombits(rng.Uint32()))
	}
	for _, x := range xs {
		up, down := F32ToBF16Up(x), F32ToBF16Down(x)
		fu, fd := BF16ToF32(up), BF16ToF32(down)
		if x != x {
			if fu == fu || fd == fd {
				t.Fatalf("%v: up %v down %v, want NaN", x, fu, fd)
			}
			continue
		}
		if fu < x || fd > x {
			t.Fatalf("%v (%#x): up %v down %v do not bound it", x, math.Float32bits(x), fu, fd)
		}
		if fu == x != (fd == x) {
			t.Fatalf("%v: exact one way only: up %v down %v", x, fu, fd)
		}
		if fu != x {
			// Adjacent: no bfloat16 strictly between them.
			if next := BF16ToF32(F32ToBF16Up(math.Nextafter32(fd, float32(math.Inf(1))))); next != fu {
				t.Fatalf("%v: up %v down %v are not neighbours (%v between)", x, fu, fd, next)
			}
		}
	}
}
