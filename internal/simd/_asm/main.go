// Command _asm generates the AVX2+FMA, AVX-512 and AMX assembly of package
// simd with avo.
//
// Run it through go generate in the parent directory:
//
//	go run -C _asm . -out ../simd_amd64.s -stubs ../stubs_amd64.go -pkg simd
//
// The output depends only on this program, so running it again
// reproduces simd_amd64.s and stubs_amd64.go byte for byte.
package main

import (
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"regexp"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

func main() {
	// avo type-checks the signatures for the target platform, whatever the
	// host is (https://github.com/mmcloughlin/avo/issues/450).
	os.Setenv("GOOS", "linux")
	os.Setenv("GOARCH", "amd64")

	ConstraintExpr("amd64,!purego")

	declareConsts()
	gemm()
	expSum()
	exp()
	elu1()
	maxKernel()
	scaleKernel()
	dot()
	axpy()
	readSum()
	prefetch()
	fmaPeak()
	widenBF16()
	widenF16()
	dotRows()
	gemmPanels()
	onlineSoftmax()
	attendPanels()
	panelFromRows()
	rowsFromPanel()
	expMul()
	gemm16()
	dotRowsPF()
	dotRowsI8()
	gemmI8()
	widenI8()
	dotRowsU4()
	gemmU4()
	scaleColumns()

	fmaPeak512()
	gemmPanels512()
	onlineSoftmax512()
	attendPanels512()
	decodeBF16()
	gemm512()
	dotRows512()
	exp512()
	expMul512()
	u4Native()
	attendAMX()
	attendBF16DP()

	Generate()
	out := flag.Lookup("out").Value.String()
	src, err := os.ReadFile(out)
	if err != nil {
		log.Fatal(err)
	}
	enc, err := encodeBF16(string(src))
	if err != nil {
		log.Fatalf("%s: %v", out, err)
	}
	if enc, err = encodeAMX(enc); err != nil {
		log.Fatalf("%s: %v", out, err)
	}
	if err := checkRegisters(enc); err != nil {
		log.Fatalf("%s: %v", out, err)
	}
	if err := os.WriteFile(out, []byte(enc), 0o644); err != nil {
		log.Fatal(err)
	}
}

// checkRegisters fails if a kernel for AVX2 CPUs uses X16..X31, Y16..Y31
// or a zmm register, which the register allocator may hand out when it is
// short of the 16 AVX2 registers: instructions with them assemble as
// AVX-512 and fault on AVX2-only CPUs. The AVX-512 kernels, named
// …AVX512 and …AVX512BF16, and those of the amx family (…AMX), which
// needs AVX-512 too, may use them all.
func checkRegisters(src string) error {
	avx512 := false
	re := regexp.MustCompile(`\b([XY](1[6-9]|2[0-9]|3[01])|Z([0-9]|[12][0-9]|3[01])|K[1-7])\b`)
	for i, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(l, "TEXT ") {
			name := strings.Fields(l)[1]
			avx512 = strings.Contains(name, "AVX512") || strings.Contains(name, "AMX")
			continue
		}
		if strings.HasPrefix(l, "\t") && !avx512 {
			if m := re.FindString(l); m != "" {
				return fmt.Errorf("line %d: %s in an AVX2 kernel: %q", i+1, m, l)
			}
		}
	}
	return nil
}

// Vector constants: 8 copies of a float32, 32 bytes each, so that they
// can be the memory operand of a ymm instruction.
var (
	negInf Mem // -Inf
	posInf Mem // +Inf
	one    Mem // 1
	nanBit Mem // a quiet NaN

	// tailMask holds 8 all-ones words followed by 8 zero words: the 8
	// words starting at word 8-r have ones in their first r lanes.
	tailMask Mem
)

func vecConst(name string, f float32) Mem {
	m := GLOBL(name, RODATA|NOPTR)
	for i := 0; i < 8; i++ {
		DATA(4*i, U32(math.Float32bits(f)))
	}
	return m
}

func declareConsts() {
	negInf = vecConst("negInf", float32(math.Inf(-1)))
	posInf = vecConst("posInf", float32(math.Inf(1)))
	one = vecConst("one", 1)
	nanBit = vecConst("nan", math.Float32frombits(0x7fc00000))
	tailMask = GLOBL("tailMask", RODATA|NOPTR)
	for i := 0; i < 16; i++ {
		v := uint32(0)
		if i < 8 {
			v = 0xffffffff
		}
		DATA(4*i, U32(v))
	}
	declareExpConsts()
	declareExp2Consts()
	declareAMXConsts()
	declareU4Consts()
}

// loadTailMask returns a ymm mask with ones in its first rem lanes, for
// rem in 1..7. rem is not changed.
func loadTailMask(rem Register) VecVirtual {
	tab := GP64()
	LEAQ(tailMask, tab)
	neg := GP64()
	MOVQ(rem, neg)
	NEGQ(neg)
	mask := YMM()
	VMOVDQU(Mem{Base: tab, Index: neg, Scale: 4, Disp: 32}, mask)
	return mask
}

// reduceAdd sums the 8 lanes of y into the low lane of its xmm half.
func reduceAdd(y VecVirtual) VecVirtual {
	x := y.AsX()
	hi := XMM()
	VEXTRACTF128(U8(1), y, hi)
	VADDPS(hi, x, x)
	VMOVHLPS(x, x, hi)
	VADDPS(hi, x, x)
	VMOVSHDUP(x, hi)
	VADDSS(hi, x, x)
	return x.(VecVirtual)
}

// reduceMax leaves the largest of the 8 lanes of y in its low lane.
func reduceMax(y VecVirtual) VecVirtual {
	x := y.AsX()
	hi := XMM()
	VEXTRACTF128(U8(1), y, hi)
	VMAXPS(hi, x, x)
	VMOVHLPS(x, x, hi)
	VMAXPS(hi, x, x)
	VMOVSHDUP(x, hi)
	VMAXSS(hi, x, x)
	return x.(VecVirtual)
}

func newYMMs(n int) []VecVirtual {
	v := make([]VecVirtual, n)
	for i := range v {
		v[i] = YMM()
	}
	return v
}

// loadTailMaskMem returns the memory operand of a ymm mask with ones in
// its first rem lanes, for rem in 1..7. rem is not changed.
func loadTailMaskMem(rem Register) Mem {
	tab := GP64()
	LEAQ(tailMask, tab)
	neg := GP64()
	MOVQ(rem, neg)
	NEGQ(neg)
	return Mem{Base: tab, Index: neg, Scale: 4, Disp: 32}
}
