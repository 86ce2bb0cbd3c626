package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// amxCase is one AMX instruction: the operands as avo prints them, the
// same instruction in GNU as syntax, and its encoding by GNU as 2.40.
type amxCase struct {
	op, operands, gas string
	want              []byte
}

// amxKnown are encodings by GNU as (as, then objdump -d), the extended
// registers and the displacements of each form among them.
var amxKnown = []amxCase{
	{"TDPBF16PS", "$0x02, $0x01, $0x00", "tdpbf16ps %tmm2, %tmm1, %tmm0", []byte{0xc4, 0xe2, 0x6a, 0x5c, 0xc1}},
	{"TDPBF16PS", "$0x06, $0x04, $0x03", "tdpbf16ps %tmm6, %tmm4, %tmm3", []byte{0xc4, 0xe2, 0x4a, 0x5c, 0xdc}},
	{"TILELOADD", "(AX)(CX*1), $0x04", "tileloadd (%rax,%rcx,1), %tmm4", []byte{0xc4, 0xe2, 0x7b, 0x4b, 0x24, 0x08}},
	{"TILELOADD", "1024(R13)(R9*1), $0x07", "tileloadd 1024(%r13,%r9,1), %tmm7", []byte{0xc4, 0x82, 0x7b, 0x4b, 0xbc, 0x0d, 0x00, 0x04, 0x00, 0x00}},
	{"TILELOADD", "(BP)(DX*1), $0x00", "tileloadd (%rbp,%rdx,1), %tmm0", []byte{0xc4, 0xe2, 0x7b, 0x4b, 0x44, 0x15, 0x00}},
	{"TILESTORED", "$0x01, -64(R12)(SI*1)", "tilestored %tmm1, -64(%r12,%rsi,1)", []byte{0xc4, 0xc2, 0x7a, 0x4b, 0x4c, 0x34, 0xc0}},
	{"TILEZERO", "$0x05", "tilezero %tmm5", []byte{0xc4, 0xe2, 0x7b, 0x49, 0xe8}},
	{"LDTILECFG", "(AX)", "ldtilecfg (%rax)", []byte{0xc4, 0xe2, 0x78, 0x49, 0x00}},
	{"LDTILECFG", "(R12)", "ldtilecfg (%r12)", []byte{0xc4, 0xc2, 0x78, 0x49, 0x04, 0x24}},
	{"STTILECFG", "8(R8)", "sttilecfg 8(%r8)", []byte{0xc4, 0xc2, 0x79, 0x49, 0x40, 0x08}},
	{"TILERELEASE", "", "tilerelease", []byte{0xc4, 0xe2, 0x78, 0x49, 0xc0}},
}

func TestAMXKnown(t *testing.T) {
	for _, c := range amxKnown {
		got, err := encodeAMXLine(c.op, c.operands)
		if err != nil || !bytes.Equal(got, c.want) {
			t.Errorf("%s %s: % x %v, want % x (%s)", c.op, c.operands, got, err, c.want, c.gas)
		}
	}
}

func TestEncodeAMX(t *testing.T) {
	src := "TEXT ·f(SB), $0-8\n\tTILELOADD  (AX)(CX*1), $0x04\n\tVADDPS Z1, Z2, Z3\n\tTILERELEASE\n"
	got, err := encodeAMX(src)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(got, "\n")
	want := "\tBYTE $0xc4; BYTE $0xe2; BYTE $0x7b; BYTE $0x4b; BYTE $0x24; BYTE $0x08 // TILELOADD (AX)(CX*1), $0x04"
	if lines[1] != want || lines[2] != "\tVADDPS Z1, Z2, Z3" || !strings.HasPrefix(lines[3], "\tBYTE $0xc4") {
		t.Errorf("encoded:\n%s", got)
	}
	for _, bad := range []string{
		"\tTILELOADD (AX), $0x04\n",           // no stride
		"\tTILELOADD (AX)(CX*2), $0x04\n",     // scaled stride
		"\tTILELOADD (AX)(SP*1), $0x04\n",     // SP is no index
		"\tTILEZERO $0x08\n",                  // no tmm8
		"\tTDPBF16PS $0x01, $0x02\n",          // an operand short
		"\tTDPBF16PS $0x01, $0x02, $0x01\n",   // a tile twice
		"\tLDTILECFG (AX)(CX*1)\n",            // no index
		"\tTILESTORED (AX)(CX*1), $0x04\n",    // operands swapped
		"\tTILELOADD foo<>(SB)(CX*1), $0x1\n", // a symbol
	} {
		if _, err := encodeAMX(bad); err == nil {
			t.Errorf("%q was encoded", bad)
		}
	}
}

// TestAMXAgainstGNUAs encodes every form the kernels can emit (every
// tile, base and index register, displacements of 0, 1 and 4 bytes) and
// compares with the GNU assembler where it is installed and knows AMX
// (binutils 2.36 and later); elsewhere amxKnown stands in.
func TestAMXAgainstGNUAs(t *testing.T) {
	as, err := exec.LookPath("as")
	if err != nil {
		t.Skip("no GNU as")
	}
	objcopy, err := exec.LookPath("objcopy")
	if err != nil {
		t.Skip("no objcopy")
	}
	regs := []string{"AX", "CX", "DX", "BX", "SP", "BP", "SI", "DI", "R8", "R9", "R10", "R11", "R12", "R13", "R14", "R15"}
	gasReg := func(r string) string {
		if r[0] == 'R' {
			return "%" + strings.ToLower(r)
		}
		return "%r" + strings.ToLower(r)
	}
	var cases []amxCase
	for tile := range 8 {
		cases = append(cases, amxCase{"TILEZERO", fmt.Sprintf("$0x0%d", tile), fmt.Sprintf("tilezero %%tmm%d", tile), nil})
		for b := range 8 {
			for a := range 8 {
				if a == b || a == tile || b == tile {
					continue
				}
				cases = append(cases, amxCase{"TDPBF16PS", fmt.Sprintf("$0x0%d, $0x0%d, $0x0%d", b, a, tile),
					fmt.Sprintf("tdpbf16ps %%tmm%d, %%tmm%d, %%tmm%d", b, a, tile), nil})
			}
		}
	}
	disps := []int{0, 64, -128, 127, 128, 4096, -70000}
	for _, base := range regs {
		for _, disp := range disps {
			ds := ""
			if disp != 0 {
				ds = fmt.Sprint(disp)
			}
			for _, op := range []string{"LDTILECFG", "STTILECFG"} {
				cases = append(cases, amxCase{op, fmt.Sprintf("%s(%s)", ds, base), fmt.Sprintf("%s %s(%s)", strings.ToLower(op), ds, gasReg(base)), nil})
			}
			for _, index := range regs {
				if index == "SP" {
					continue
				}
				tile := (len(cases) * 5) % 8
				m := fmt.Sprintf("%s(%s)(%s*1)", ds, base, index)
				gm := fmt.Sprintf("%s(%s,%s,1)", ds, gasReg(base), gasReg(index))
				cases = append(cases,
					amxCase{"TILELOADD", fmt.Sprintf("%s, $0x0%d", m, tile), fmt.Sprintf("tileloadd %s, %%tmm%d", gm, tile), nil},
					amxCase{"TILESTORED", fmt.Sprintf("$0x0%d, %s", tile, m), fmt.Sprintf("tilestored %%tmm%d, %s", tile, gm), nil})
			}
		}
	}
	cases = append(cases, amxCase{"TILERELEASE", "", "tilerelease", nil})

	dir := t.TempDir()
	var src strings.Builder
	var mine []byte
	offs := make([]int, len(cases))
	for i, c := range cases {
		code, err := encodeAMXLine(c.op, c.operands)
		if err != nil {
			t.Fatalf("%s %s: %v", c.op, c.operands, err)
		}
		offs[i] = len(mine)
		mine = append(mine, code...)
		src.WriteString(c.gas + "\n")
	}
	s, o, bin := filepath.Join(dir, "amx.s"), filepath.Join(dir, "amx.o"), filepath.Join(dir, "amx.bin")
	if err := os.WriteFile(s, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(as, "-o", o, s).CombinedOutput(); err != nil {
		t.Skipf("as does not assemble AMX: %v\n%s", err, out)
	}
	if out, err := exec.Command(objcopy, "-O", "binary", "-j", ".text", o, bin).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
	theirs, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(mine, theirs) {
		t.Logf("%d instructions encoded as GNU as does", len(cases))
		return
	}
	for i, c := range cases {
		end := len(mine)
		if i+1 < len(cases) {
			end = offs[i+1]
		}
		if end > len(theirs) || !bytes.Equal(mine[offs[i]:end], theirs[offs[i]:end]) {
			t.Fatalf("%s %s (%s): % x, GNU as % x", c.op, c.operands, c.gas, mine[offs[i]:end], theirs[offs[i]:min(end, len(theirs))])
		}
	}
	t.Fatalf("%d bytes, GNU as %d", len(mine), len(theirs))
}
