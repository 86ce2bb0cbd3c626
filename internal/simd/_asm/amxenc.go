package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
)

// The AMX instructions, which the Go assembler does not know either. As
// for VDPBF16PS, the generator emits each as an instruction of its own
// name, with its memory operand's registers among the inputs so that
// avo's register allocator keeps them live, and encodeAMX replaces the
// line by the BYTEs of its VEX encoding after avo has allocated the
// registers (any general-purpose register can be a base or an index).
// The tile registers tmm0 … tmm7 are written as immediates $0 … $7.
//
// Go operand order, as for the other instructions: sources first, the
// destination last.
//
//	TILELOADD   disp(base)(index*1), $t   tmm t = 16 rows of 64 bytes from base+disp, index bytes apart
//	TILESTORED  $t, disp(base)(index*1)   the rows of tmm t to memory
//	TDPBF16PS   $b, $a, $c               tmm c += tmm a · tmm b (bfloat16 pairs, float32 sums; a, b, c distinct)
//	TILEZERO    $t                        tmm t = 0
//	LDTILECFG   disp(base)                the 64-byte tile configuration
//	TILERELEASE                           the tiles back to their initial state

// tileLoad emits TILELOADD m, $t.
func tileLoad(m Mem, t int) {
	Instruction(&ir.Instruction{
		Opcode:   "TILELOADD",
		Operands: []Op{m, Imm(uint64(t))},
		Inputs:   []Op{m},
		ISA:      []string{"AMX-TILE"},
	})
}

// tileStore emits TILESTORED $t, m.
func tileStore(t int, m Mem) {
	Instruction(&ir.Instruction{
		Opcode:   "TILESTORED",
		Operands: []Op{Imm(uint64(t)), m},
		Inputs:   []Op{m},
		ISA:      []string{"AMX-TILE"},
	})
}

// tdpbf16ps emits TDPBF16PS $b, $a, $c: tile c += tile a · tile b.
func tdpbf16ps(b, a, c int) {
	Instruction(&ir.Instruction{
		Opcode:   "TDPBF16PS",
		Operands: []Op{Imm(uint64(b)), Imm(uint64(a)), Imm(uint64(c))},
		ISA:      []string{"AMX-BF16"},
	})
}

// tileZero emits TILEZERO $t.
func tileZero(t int) {
	Instruction(&ir.Instruction{
		Opcode:   "TILEZERO",
		Operands: []Op{Imm(uint64(t))},
		ISA:      []string{"AMX-TILE"},
	})
}

// ldTileCfg emits LDTILECFG m.
func ldTileCfg(m Mem) {
	Instruction(&ir.Instruction{
		Opcode:   "LDTILECFG",
		Operands: []Op{m},
		Inputs:   []Op{m},
		ISA:      []string{"AMX-TILE"},
	})
}

// tileRelease emits TILERELEASE.
func tileRelease() {
	Instruction(&ir.Instruction{Opcode: "TILERELEASE", ISA: []string{"AMX-TILE"}})
}

// gpNum numbers the 64-bit general-purpose registers as the encodings do.
var gpNum = map[string]int{
	"AX": 0, "CX": 1, "DX": 2, "BX": 3, "SP": 4, "BP": 5, "SI": 6, "DI": 7,
	"R8": 8, "R9": 9, "R10": 10, "R11": 11, "R12": 12, "R13": 13, "R14": 14, "R15": 15,
}

// The AMX instructions encodeAMX encodes: VEX.128.W0 in map 0F38, with
// the prefix field pp and the opcode byte.
var amxOps = map[string]struct{ pp, op byte }{
	"LDTILECFG":   {0b00, 0x49}, // NP
	"STTILECFG":   {0b01, 0x49}, // 66
	"TILERELEASE": {0b00, 0x49}, // NP, ModRM C0
	"TILEZERO":    {0b11, 0x49}, // F2, ModRM 11:rrr:000
	"TILELOADD":   {0b11, 0x4b}, // F2
	"TILESTORED":  {0b10, 0x4b}, // F3
	"TDPBF16PS":   {0b10, 0x5c}, // F3
}

// vex3 returns the three-byte VEX prefix (C4) of map 0F38 with W0 and
// L0: r, x and b are the fourth bits of the ModRM.reg, SIB.index and
// ModRM.rm or SIB.base registers, vvvv the register of VEX.vvvv, which
// holds it inverted (0, all ones, for none).
func vex3(pp byte, r, x, b, vvvv int) []byte {
	inv := func(v int) byte { return byte(^(v >> 3) & 1) }
	return []byte{0xc4, inv(r)<<7 | inv(x)<<6 | inv(b)<<5 | 0b00010, byte(^vvvv&0xf)<<3 | pp}
}

// amxMem returns the encoding of an instruction of amxOps with tile reg
// in ModRM.reg and the memory operand disp(base)(index*1), index -1 for
// none. With an index (TILELOADD, TILESTORED) the address is always in a
// SIB byte; without one a SIB byte comes only where the base needs it
// (SP, R12), as GNU as encodes it. A zero displacement takes no byte but
// with base BP or R13, whose ModRM.mod 00 means something else.
func amxMem(op string, reg, base, index, disp int) ([]byte, error) {
	e, ok := amxOps[op]
	if !ok {
		return nil, fmt.Errorf("%s is not an AMX instruction", op)
	}
	if index == 4 {
		return nil, fmt.Errorf("%s: SP cannot be an index", op)
	}
	if reg < 0 || reg > 7 || base < 0 || base > 15 || index < -1 || index > 15 {
		return nil, fmt.Errorf("%s: register out of range", op)
	}
	x := 0
	if index >= 0 {
		x = index
	}
	code := vex3(e.pp, reg, x, base, 0)
	code = append(code, e.op)
	var mod byte
	switch {
	case disp == 0 && base&7 != 5:
		mod = 0b00
	case disp >= -128 && disp <= 127:
		mod = 0b01
	default:
		mod = 0b10
	}
	sib := index >= 0 || base&7 == 4
	rm := byte(base & 7)
	if sib {
		rm = 0b100
	}
	code = append(code, mod<<6|byte(reg&7)<<3|rm)
	if sib {
		idx := byte(0b100) // none
		if index >= 0 {
			idx = byte(index & 7)
		}
		code = append(code, idx<<3|byte(base&7)) // scale 1
	}
	switch mod {
	case 0b01:
		code = append(code, byte(int8(disp)))
	case 0b10:
		code = append(code, byte(disp), byte(disp>>8), byte(disp>>16), byte(disp>>24))
	}
	return code, nil
}

// amxReg returns the encoding of an instruction of amxOps on tile
// registers: reg in ModRM.reg, rm in ModRM.rm, vvvv (0 for none) in
// VEX.vvvv.
func amxReg(op string, reg, rm, vvvv int) []byte {
	e := amxOps[op]
	code := vex3(e.pp, reg, 0, rm, vvvv)
	return append(code, e.op, 0b11<<6|byte(reg&7)<<3|byte(rm&7))
}

var (
	amxMemLine = regexp.MustCompile(`^(-?\d+)?\((\w+)\)(?:\((\w+)\*1\))?$`)
	amxTile    = regexp.MustCompile(`^\$0x0([0-7])$`)
)

// encodeAMX replaces the lines of the AMX instructions in the assembly
// src by their encodings, the instruction kept as a comment. It fails on
// an operand it cannot encode.
func encodeAMX(src string) (string, error) {
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if _, ok := amxOps[f[0]]; !ok {
			continue
		}
		code, err := encodeAMXLine(f[0], strings.Join(f[1:], " "))
		if err != nil {
			return "", fmt.Errorf("line %d: %q: %v", i+1, l, err)
		}
		bs := make([]string, len(code))
		for j, b := range code {
			bs[j] = fmt.Sprintf("BYTE $0x%02x", b)
		}
		lines[i] = fmt.Sprintf("\t%s // %s", strings.Join(bs, "; "), strings.TrimSpace(strings.Join(f, " ")))
	}
	return strings.Join(lines, "\n"), nil
}

// encodeAMXLine encodes one instruction from its opcode and its operands
// as avo prints them.
func encodeAMXLine(op, operands string) ([]byte, error) {
	var args []string
	if operands != "" {
		args = strings.Split(operands, ", ")
	}
	tile := func(s string) (int, error) {
		m := amxTile.FindStringSubmatch(s)
		if m == nil {
			return 0, fmt.Errorf("%q is not a tile register $0x00 … $0x07", s)
		}
		return int(m[1][0] - '0'), nil
	}
	mem := func(s string) (base, index, disp int, err error) {
		m := amxMemLine.FindStringSubmatch(s)
		if m == nil {
			return 0, 0, 0, fmt.Errorf("%q is not a memory operand disp(base)(index*1)", s)
		}
		if m[1] != "" {
			disp, _ = strconv.Atoi(m[1])
		}
		var ok bool
		if base, ok = gpNum[m[2]]; !ok {
			return 0, 0, 0, fmt.Errorf("%q: unknown base register", s)
		}
		index = -1
		if m[3] != "" {
			if index, ok = gpNum[m[3]]; !ok {
				return 0, 0, 0, fmt.Errorf("%q: unknown index register", s)
			}
		}
		return base, index, disp, nil
	}
	want := map[string]int{"LDTILECFG": 1, "STTILECFG": 1, "TILERELEASE": 0, "TILEZERO": 1, "TILELOADD": 2, "TILESTORED": 2, "TDPBF16PS": 3}[op]
	if len(args) != want {
		return nil, fmt.Errorf("%s takes %d operands, got %d", op, want, len(args))
	}
	switch op {
	case "TILERELEASE":
		return amxReg(op, 0, 0, 0), nil
	case "TILEZERO":
		t, err := tile(args[0])
		if err != nil {
			return nil, err
		}
		return amxReg(op, t, 0, 0), nil
	case "TDPBF16PS":
		var r [3]int
		for j := range r {
			var err error
			if r[j], err = tile(args[j]); err != nil {
				return nil, err
			}
		}
		if r[0] == r[1] || r[1] == r[2] || r[0] == r[2] {
			// The CPU raises #UD for that.
			return nil, fmt.Errorf("%s needs three different tiles", op)
		}
		// Go order b, a, c: c in ModRM.reg, a in ModRM.rm, b in vvvv.
		return amxReg(op, r[2], r[1], r[0]), nil
	case "LDTILECFG", "STTILECFG":
		base, index, disp, err := mem(args[0])
		if err != nil {
			return nil, err
		}
		if index >= 0 {
			return nil, fmt.Errorf("%s takes no index register", op)
		}
		return amxMem(op, 0, base, -1, disp)
	}
	tArg, mArg := args[1], args[0]
	if op == "TILESTORED" {
		tArg, mArg = args[0], args[1]
	}
	t, err := tile(tArg)
	if err != nil {
		return nil, err
	}
	base, index, disp, err := mem(mArg)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		return nil, fmt.Errorf("%s needs an index register (the row stride)", op)
	}
	return amxMem(op, t, base, index, disp)
}
