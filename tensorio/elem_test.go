package tensorio

import (
	"math"
	"testing"

	"github.com/attnkit/attn/internal/half"
)

// refHalf decodes a float with the given exponent and mantissa widths from
// first principles: (-1)^s · 2^(e-bias) · 1.m, or 2^(1-bias) · 0.m for
// subnormals, computed with math.Ldexp in float64 (exact for these widths).
func refHalf(bits uint16, expBits, mantBits uint) float64 {
	sign := 1.0
	if bits>>(expBits+mantBits)&1 == 1 {
		sign = -1
	}
	e := int(bits>>mantBits) & (1<<expBits - 1)
	m := int(bits) & (1<<mantBits - 1)
	bias := 1<<(expBits-1) - 1
	switch {
	case e == 1<<expBits-1 && m == 0:
		return math.Inf(int(sign))
	case e == 1<<expBits-1:
		return math.NaN()
	case e == 0:
		return sign * math.Ldexp(float64(m), 1-bias-int(mantBits))
	default:
		return sign * math.Ldexp(float64(1<<mantBits+m), e-bias-int(mantBits))
	}
}

// checkWiden compares got with the reference for one bit pattern: the same
// float32 bits for numbers (so -0 differs from +0), and for NaNs the sign
// and the payload moved to the top of the float32 mantissa.
func checkWiden(t *testing.T, name string, bits uint16, got float32, want float64, mantBits uint) {
	t.Helper()
	gb := math.Float32bits(got)
	if math.IsNaN(want) {
		wantBits := uint32(bits>>15)<<31 | 0x7f800000 | uint32(bits)&(1<<mantBits-1)<<(23-mantBits)
		if !math.IsNaN(float64(got)) || gb != wantBits {
			t.Fatalf("%s(%#04x) = %#08x, want NaN %#08x", name, bits, gb, wantBits)
		}
		return
	}
	if wb := math.Float32bits(float32(want)); gb != wb || float64(got) != want {
		t.Fatalf("%s(%#04x) = %v (%#08x), want %v (%#08x)", name, bits, got, gb, want, wb)
	}
}

func TestF16ToF32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		b := uint16(i)
		checkWiden(t, "f16ToF32", b, half.F16ToF32(b), refHalf(b, 5, 10), 10)
	}
}

func TestBF16ToF32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		b := uint16(i)
		checkWiden(t, "bf16ToF32", b, half.BF16ToF32(b), refHalf(b, 8, 7), 7)
	}
}

// A few values by hand, so a shared mistake in refHalf and the converters
// cannot hide.
func TestHalfKnownValues(t *testing.T) {
	for _, c := range []struct {
		bits uint16
		f16  float32
		bf16 float32
	}{
		{0x0000, 0, 0},
		{0x3c00, 1, 0.0078125},
		{0xc000, -2, -2},
		{0x7bff, 65504, 0x1.fep+120},
		{0x0001, 0x1p-24, 0x1p-133},
		{0x0400, 0x1p-14, 0x1p-119},
		{0x3f80, 1.875, 1},
	} {
		if got := half.F16ToF32(c.bits); got != c.f16 {
			t.Errorf("half.F16ToF32(%#04x) = %v, want %v", c.bits, got, c.f16)
		}
		if got := half.BF16ToF32(c.bits); got != c.bf16 {
			t.Errorf("half.BF16ToF32(%#04x) = %v, want %v", c.bits, got, c.bf16)
		}
	}
	if v := half.F16ToF32(0x8000); v != 0 || !math.Signbit(float64(v)) {
		t.Errorf("half.F16ToF32(0x8000) = %v, want -0", v)
	}
	if v := half.F16ToF32(0xfc00); !math.IsInf(float64(v), -1) {
		t.Errorf("half.F16ToF32(0xfc00) = %v, want -Inf", v)
	}
}
