package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestEVEX512 checks the encodings of the instructions the Go assembler
// lacks against those of the GNU assembler (as, then objdump -d), whose
// operand order is Go's: the generator checked them all, 32³ register
// triples an instruction, once; these are a few.
func TestEVEX512(t *testing.T) {
	for _, c := range []struct {
		op         string
		rm, v, reg int
		want       []byte
	}{
		{"VDPBF16PS", 3, 17, 29, []byte{0x62, 0x62, 0x76, 0x40, 0x52, 0xeb}},
		{"VDPBF16PS", 31, 0, 8, []byte{0x62, 0x12, 0x7e, 0x48, 0x52, 0xc7}},
		{"VCVTNE2PS2BF16", 20, 9, 1, []byte{0x62, 0xb2, 0x37, 0x48, 0x72, 0xcc}},
		{"VCVTNE2PS2BF16", 0, 1, 0, []byte{0x62, 0xf2, 0x77, 0x48, 0x72, 0xc0}},
	} {
		e := bf16Ops[c.op]
		if got := evex512(e.pp, e.op, c.reg, c.v, c.rm); !bytes.Equal(got, c.want) {
			t.Errorf("%s Z%d, Z%d, Z%d: % x, want % x", c.op, c.rm, c.v, c.reg, got, c.want)
		}
	}
}

func TestEncodeBF16(t *testing.T) {
	src := "TEXT ·f(SB), $0-8\n\tVDPBF16PS      Z3, Z17, Z29\n\tVADDPS Z1, Z2, Z3\n"
	got, err := encodeBF16(src)
	if err != nil {
		t.Fatal(err)
	}
	want := "\tBYTE $0x62; BYTE $0x62; BYTE $0x76; BYTE $0x40; BYTE $0x52; BYTE $0xeb // VDPBF16PS Z3, Z17, Z29"
	if lines := strings.Split(got, "\n"); lines[1] != want || lines[2] != "\tVADDPS Z1, Z2, Z3" {
		t.Errorf("encoded:\n%s", got)
	}
	if _, err := encodeBF16("\tVDPBF16PS (AX), Z17, Z29\n"); err == nil {
		t.Error("a memory operand was encoded")
	}
}
