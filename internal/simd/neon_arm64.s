//go:build !purego

#include "textflag.h"

// The Go assembler has the integer and bitwise NEON instructions and
// FMLA/FMLS, but none of the other floating-point vector ones: these
// macros emit them as WORDs. Operands are register numbers, in the Go
// order (sources first, destination last; for FSUB4 and FCMGT4 the
// second operand is the minuend or the left-hand side), all on 4 float32
// lanes (.4S).

// FADD Vd.4S, Vn.4S, Vm.4S
#define FADD4(m, n, d) WORD $(0x4E20D400 | ((m)<<16) | ((n)<<5) | (d))
// FSUB Vd.4S, Vn.4S, Vm.4S: d = n - m
#define FSUB4(m, n, d) WORD $(0x4EA0D400 | ((m)<<16) | ((n)<<5) | (d))
// FMUL Vd.4S, Vn.4S, Vm.4S
#define FMUL4(m, n, d) WORD $(0x6E20DC00 | ((m)<<16) | ((n)<<5) | (d))
// FMAX Vd.4S, Vn.4S, Vm.4S (a NaN operand gives NaN)
#define FMAX4(m, n, d) WORD $(0x4E20F400 | ((m)<<16) | ((n)<<5) | (d))
// FMIN Vd.4S, Vn.4S, Vm.4S (a NaN operand gives NaN)
#define FMIN4(m, n, d) WORD $(0x4EA0F400 | ((m)<<16) | ((n)<<5) | (d))
// FCMGT Vd.4S, Vn.4S, Vm.4S: d = n > m, all ones or zeros
#define FCMGT4(m, n, d) WORD $(0x6EA0E400 | ((m)<<16) | ((n)<<5) | (d))
// FADDP Vd.4S, Vn.4S, Vm.4S: d = n0+n1, n2+n3, m0+m1, m2+m3
#define FADDP4(m, n, d) WORD $(0x6E20D400 | ((m)<<16) | ((n)<<5) | (d))
// FMAXP Vd.4S, Vn.4S, Vm.4S
#define FMAXP4(m, n, d) WORD $(0x6E20F400 | ((m)<<16) | ((n)<<5) | (d))
// FRINTN Vd.4S, Vn.4S: round to nearest, ties to even
#define FRINTN4(n, d) WORD $(0x4E218800 | ((n)<<5) | (d))
// FCVTZS Vd.4S, Vn.4S
#define FCVTZS4(n, d) WORD $(0x4EA1B800 | ((n)<<5) | (d))

// Broadcast a 32-bit constant into all four lanes of a vector register.
#define CONST4(c, r, v) MOVW $(c), r; VDUP r, v.S4

// The constants of expf and exp2Tile (generic.go), as float32 bits.
#define EXP_LO 0xc2aeac4f
#define EXP_HI 0x42b17217
#define LOG2E 0x3fb8aa3b
#define LN2HI 0x3f317200
#define LN2LO 0x35bfbe8e
#define EXP_C0 0x3f000000
#define EXP_C1 0x3e2aaaab
#define EXP_C2 0x3d2aaa7a
#define EXP_C3 0x3c0888a6
#define EXP_C4 0x3ab696c9
#define EXP_C5 0x39502bda
#define ONE 0x3f800000
#define POS_INF 0x7f800000
#define NEG_INF 0xff800000
#define EXP2_MAGIC 0x4b40007f
#define MINUS127 0xc2fe0000
#define EXP2_C1 0x3f317215
#define EXP2_C2 0x3e75fcde
#define EXP2_C3 0x3d635ba9
#define EXP2_C4 0x3c1e7544
#define EXP2_C5 0x3aaddd0c

// EXP_CONSTS loads the constants of EXPV into V16 … V29.
#define EXP_CONSTS \
	CONST4(EXP_LO, R9, V16); \
	CONST4(EXP_HI, R9, V17); \
	CONST4(LOG2E, R9, V18); \
	CONST4(LN2HI, R9, V19); \
	CONST4(LN2LO, R9, V20); \
	CONST4(EXP_C0, R9, V21); \
	CONST4(EXP_C1, R9, V22); \
	CONST4(EXP_C2, R9, V23); \
	CONST4(EXP_C3, R9, V24); \
	CONST4(EXP_C4, R9, V25); \
	CONST4(EXP_C5, R9, V26); \
	CONST4(ONE, R9, V27); \
	CONST4(POS_INF, R9, V28); \
	VEOR V29.B16, V29.B16, V29.B16

// EXPV sets V0 to exp(V0) by the steps of expf: the argument clamped to
// [EXP_LO, EXP_HI] so that the integer n stays in the exponent's range,
// n = round(x·log2 e), r = x - n·ln 2 in two parts, the polynomial, n
// added to the exponent field; then 0 below EXP_LO and +Inf above
// EXP_HI. A NaN passes through the clamps and the polynomial as NaN.
// Temporaries V1 … V5.
#define EXPV \
	FMAX4(16, 0, 1); \
	FMIN4(17, 1, 1); \
	FMUL4(18, 1, 2); \
	FRINTN4(2, 2); \
	VFMLS V2.S4, V19.S4, V1.S4; \
	VFMLS V2.S4, V20.S4, V1.S4; \
	VMOV V25.B16, V3.B16; \
	VFMLA V26.S4, V1.S4, V3.S4; \
	VMOV V24.B16, V4.B16; \
	VFMLA V3.S4, V1.S4, V4.S4; \
	VMOV V23.B16, V3.B16; \
	VFMLA V4.S4, V1.S4, V3.S4; \
	VMOV V22.B16, V4.B16; \
	VFMLA V3.S4, V1.S4, V4.S4; \
	VMOV V21.B16, V3.B16; \
	VFMLA V4.S4, V1.S4, V3.S4; \
	FMUL4(1, 1, 4); \
	VMOV V1.B16, V5.B16; \
	VFMLA V3.S4, V4.S4, V5.S4; \
	FADD4(27, 5, 5); \
	FCVTZS4(2, 2); \
	VSHL $23, V2.S4, V2.S4; \
	VADD V2.S4, V5.S4, V5.S4; \
	FCMGT4(0, 16, 3); \
	VBIT V3.B16, V29.B16, V5.B16; \
	FCMGT4(17, 0, 3); \
	VBIT V3.B16, V28.B16, V5.B16; \
	VMOV V5.B16, V0.B16

// func expNEON(dst, x []float32)
TEXT ·expNEON(SB), NOSPLIT, $0-48
	MOVD dst_base+0(FP), R0
	MOVD x_base+24(FP), R1
	MOVD x_len+32(FP), R2
	EXP_CONSTS

exp4:
	CMP  $4, R2
	BLT  exp1
	VLD1.P 16(R1), [V0.S4]
	EXPV
	VST1.P [V0.S4], 16(R0)
	SUB  $4, R2
	B    exp4

exp1:
	// The last len%4 values one at a time, each in lane 0, so that no
	// load or store passes the end and each lane gets the same result as
	// it would in a full vector.
	CBZ  R2, expDone
	FMOVS.P 4(R1), F0
	EXPV
	FMOVS.P F0, 4(R0)
	SUB  $1, R2
	B    exp1

expDone:
	RET

// func expSumNEON(x []float32, shift float32) float32
TEXT ·expSumNEON(SB), NOSPLIT, $0-36
	MOVD  x_base+0(FP), R0
	MOVD  x_len+8(FP), R2
	FMOVS shift+24(FP), F30
	VDUP  V30.S[0], V30.S4
	EXP_CONSTS
	VEOR  V31.B16, V31.B16, V31.B16

expSum4:
	CMP  $4, R2
	BLT  expSumReduce
	VLD1 (R0), [V0.S4]
	FSUB4(30, 0, 0)
	EXPV
	VST1.P [V0.S4], 16(R0)
	FADD4(0, 31, 31)
	SUB  $4, R2
	B    expSum4

expSumReduce:
	FADDP4(31, 31, 31)
	FADDP4(31, 31, 31)

expSum1:
	// Lanes 1 … 3 of a single value's vector hold exp(-shift), not
	// values of x: only lane 0 is stored and added.
	CBZ   R2, expSumDone
	FMOVS (R0), F0
	FSUB4(30, 0, 0)
	EXPV
	FMOVS.P F0, 4(R0)
	FADDS F0, F31, F31
	SUB   $1, R2
	B     expSum1

expSumDone:
	FMOVS F31, ret+32(FP)
	RET

// EXP2V sets register VX (number X) to exp2Tile of it, t ≤ 128: t at
// least -127, k = t + 1.5·2^23 + 127 holding round(t)+127 in its low
// bits, r = t - round(t), the polynomial p(r), and p times 2^round(t)
// made by shifting k's low bits into the exponent field (0 for t =
// -127). Constants: V9 one, V25 … V29 the coefficients c1 … c5, V30
// -127, V31 the magic; temporaries V16 … V18.
#define EXP2V(X, VX) \
	FMAX4(30, X, X); \
	FADD4(31, X, 16); \
	FSUB4(31, 16, 17); \
	FSUB4(17, X, X); \
	VMOV V28.B16, V17.B16; \
	VFMLA V29.S4, VX.S4, V17.S4; \
	VMOV V27.B16, V18.B16; \
	VFMLA V17.S4, VX.S4, V18.S4; \
	VMOV V26.B16, V17.B16; \
	VFMLA V18.S4, VX.S4, V17.S4; \
	VMOV V25.B16, V18.B16; \
	VFMLA V17.S4, VX.S4, V18.S4; \
	VMOV V9.B16, V17.B16; \
	VFMLA V18.S4, VX.S4, V17.S4; \
	VSHL $23, V16.S4, V16.S4; \
	FMUL4(16, 17, X)

#define EXP2_CONSTS \
	CONST4(ONE, R9, V9); \
	CONST4(LOG2E, R9, V24); \
	CONST4(EXP2_C1, R9, V25); \
	CONST4(EXP2_C2, R9, V26); \
	CONST4(EXP2_C3, R9, V27); \
	CONST4(EXP2_C4, R9, V28); \
	CONST4(EXP2_C5, R9, V29); \
	CONST4(MINUS127, R9, V30); \
	CONST4(EXP2_MAGIC, R9, V31)

// func expMulNEON(p, g []float32)
TEXT ·expMulNEON(SB), NOSPLIT, $0-48
	MOVD p_base+0(FP), R0
	MOVD p_len+8(FP), R2
	MOVD g_base+24(FP), R1
	EXP2_CONSTS
	CONST4(0x43000000, R9, V23) // 128

expMul4:
	CMP  $4, R2
	BLT  expMul1
	VLD1 (R0), [V0.S4]
	VLD1 (R1), [V1.S4]
	FMUL4(24, 0, 0)
	FMIN4(23, 0, 0)
	EXP2V(0, V0)
	FMUL4(0, 1, 1)
	VST1.P [V0.S4], 16(R0)
	VST1.P [V1.S4], 16(R1)
	SUB  $4, R2
	B    expMul4

expMul1:
	CBZ   R2, expMulDone
	FMOVS (R0), F0
	FMOVS (R1), F1
	FMUL4(24, 0, 0)
	FMIN4(23, 0, 0)
	EXP2V(0, V0)
	FMULS F0, F1, F1
	FMOVS.P F0, 4(R0)
	FMOVS.P F1, 4(R1)
	SUB   $1, R2
	B     expMul1

expMulDone:
	RET

// func softmaxPanelNEON(s []float32, n int, lim, m, l, acc []float32, dacc int)
//
// One panel of OnlineSoftmax, its 16 queries in V0 … V3 (and the like):
// a first pass takes the maximum (masking the invisible logits to -Inf
// in place where lim is given), a second the exponentials and their sum.
TEXT ·softmaxPanelNEON(SB), NOSPLIT, $0-136
	MOVD s_base+0(FP), R0
	MOVD n+24(FP), R1
	MOVD lim_base+32(FP), R2
	MOVD lim_len+40(FP), R3
	MOVD m_base+56(FP), R4
	MOVD l_base+80(FP), R5
	MOVD acc_base+104(FP), R6
	MOVD dacc+128(FP), R7
	EXP2_CONSTS
	CONST4(NEG_INF, R9, V10)
	VEOR V11.B16, V11.B16, V11.B16

	VLD1 (R4), [V0.S4, V1.S4, V2.S4, V3.S4]
	MOVD R0, R8
	MOVD R1, R10
	CBZ  R3, smMax

	// Masked: key j is visible to the queries whose lim exceeds j.
	VLD1 (R2), [V4.S4, V5.S4, V6.S4, V7.S4]
	VEOR V8.B16, V8.B16, V8.B16 // j, in every lane

smMaskLoop:
	CBZ  R10, smScale
	VLD1 (R8), [V12.S4, V13.S4, V14.S4, V15.S4]
	FCMGT4(8, 4, 16)
	FCMGT4(8, 5, 17)
	FCMGT4(8, 6, 18)
	FCMGT4(8, 7, 19)
	VBIF V16.B16, V10.B16, V12.B16
	VBIF V17.B16, V10.B16, V13.B16
	VBIF V18.B16, V10.B16, V14.B16
	VBIF V19.B16, V10.B16, V15.B16
	VST1.P [V12.S4, V13.S4, V14.S4, V15.S4], 64(R8)
	FMAX4(12, 0, 0)
	FMAX4(13, 1, 1)
	FMAX4(14, 2, 2)
	FMAX4(15, 3, 3)
	FADD4(9, 8, 8)
	SUB  $1, R10
	B    smMaskLoop

smMax:
	CBZ  R10, smScale
	VLD1.P 64(R8), [V12.S4, V13.S4, V14.S4, V15.S4]
	FMAX4(12, 0, 0)
	FMAX4(13, 1, 1)
	FMAX4(14, 2, 2)
	FMAX4(15, 3, 3)
	SUB  $1, R10
	B    smMax

smScale:
	// ms (V20 … V23) is the maximum, or 0 where it is -Inf, so that a
	// query that has seen nothing gets exp(-Inf - 0) = 0, not NaN.
	VMOV   V0.B16, V20.B16
	VMOV   V1.B16, V21.B16
	VMOV   V2.B16, V22.B16
	VMOV   V3.B16, V23.B16
	VCMEQ  V10.S4, V0.S4, V16.S4
	VBIT   V16.B16, V11.B16, V20.B16
	VCMEQ  V10.S4, V1.S4, V16.S4
	VBIT   V16.B16, V11.B16, V21.B16
	VCMEQ  V10.S4, V2.S4, V16.S4
	VBIT   V16.B16, V11.B16, V22.B16
	VCMEQ  V10.S4, V3.S4, V16.S4
	VBIT   V16.B16, V11.B16, V23.B16

	// c (V4 … V7) = exp2((m - ms)·log2 e), the factor of the old sums.
	VLD1 (R4), [V4.S4, V5.S4, V6.S4, V7.S4]
	FSUB4(20, 4, 4)
	FSUB4(21, 5, 5)
	FSUB4(22, 6, 6)
	FSUB4(23, 7, 7)
	FMUL4(24, 4, 4)
	FMUL4(24, 5, 5)
	FMUL4(24, 6, 6)
	FMUL4(24, 7, 7)
	EXP2V(4, V4)
	EXP2V(5, V5)
	EXP2V(6, V6)
	EXP2V(7, V7)
	VST1 [V0.S4, V1.S4, V2.S4, V3.S4], (R4)

	// Second pass: the exponentials, summed in V0 … V3.
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	MOVD R0, R8
	MOVD R1, R10

smExp:
	CBZ  R10, smSum
	VLD1 (R8), [V12.S4, V13.S4, V14.S4, V15.S4]
	FSUB4(20, 12, 12)
	FSUB4(21, 13, 13)
	FSUB4(22, 14, 14)
	FSUB4(23, 15, 15)
	FMUL4(24, 12, 12)
	FMUL4(24, 13, 13)
	FMUL4(24, 14, 14)
	FMUL4(24, 15, 15)
	EXP2V(12, V12)
	EXP2V(13, V13)
	EXP2V(14, V14)
	EXP2V(15, V15)
	VST1.P [V12.S4, V13.S4, V14.S4, V15.S4], 64(R8)
	FADD4(12, 0, 0)
	FADD4(13, 1, 1)
	FADD4(14, 2, 2)
	FADD4(15, 3, 3)
	SUB  $1, R10
	B    smExp

smSum:
	// l = l·c + sum.
	VLD1  (R5), [V12.S4, V13.S4, V14.S4, V15.S4]
	VFMLA V12.S4, V4.S4, V0.S4
	VFMLA V13.S4, V5.S4, V1.S4
	VFMLA V14.S4, V6.S4, V2.S4
	VFMLA V15.S4, V7.S4, V3.S4
	VST1  [V0.S4, V1.S4, V2.S4, V3.S4], (R5)

	// The accumulator rows are left alone when every factor is exactly 1.
	CBZ   R7, smDone
	VCMEQ V9.S4, V4.S4, V16.S4
	VCMEQ V9.S4, V5.S4, V17.S4
	VCMEQ V9.S4, V6.S4, V18.S4
	VCMEQ V9.S4, V7.S4, V19.S4
	VAND  V17.B16, V16.B16, V16.B16
	VAND  V19.B16, V18.B16, V18.B16
	VAND  V18.B16, V16.B16, V16.B16
	VMOV  V16.D[0], R8
	VMOV  V16.D[1], R10
	AND   R10, R8, R8
	CMN   $1, R8
	BEQ   smDone

smRescale:
	VLD1 (R6), [V12.S4, V13.S4, V14.S4, V15.S4]
	FMUL4(4, 12, 12)
	FMUL4(5, 13, 13)
	FMUL4(6, 14, 14)
	FMUL4(7, 15, 15)
	VST1.P [V12.S4, V13.S4, V14.S4, V15.S4], 64(R6)
	SUB  $1, R7
	CBNZ R7, smRescale

smDone:
	RET

// func gemm6x16NEON(k int, a []float32, ar, ac int, b []float32, ldb int, c []float32, ldc int, accumulate bool)
//
// C[0:6][0:16] (=|+=) A[0:6][0:k]·B[0:k][0:16], A[i][p] at a[i·ar + p·ac],
// B's rows ldb apart, C's ldc apart: 24 accumulators, and per p one
// load of a row of B (4 registers) and 6 broadcasts of A, each feeding 4
// FMLAs.
TEXT ·gemm6x16NEON(SB), NOSPLIT, $0-113
	MOVD  k+0(FP), R0
	MOVD  a_base+8(FP), R1
	MOVD  ar+32(FP), R2
	MOVD  ac+40(FP), R3
	MOVD  b_base+48(FP), R4
	MOVD  ldb+72(FP), R5
	MOVD  c_base+80(FP), R6
	MOVD  ldc+104(FP), R7
	MOVBU accumulate+112(FP), R8
	LSL   $2, R2
	LSL   $2, R3
	LSL   $2, R5
	LSL   $2, R7
	MOVD  R1, R10
	ADD   R2, R10, R11
	ADD   R2, R11, R12
	ADD   R2, R12, R13
	ADD   R2, R13, R14
	ADD   R2, R14, R15
	CBZ   R8, g6zero
	MOVD  R6, R16
	VLD1  (R16), [V0.S4, V1.S4, V2.S4, V3.S4]
	ADD   R7, R16
	VLD1  (R16), [V4.S4, V5.S4, V6.S4, V7.S4]
	ADD   R7, R16
	VLD1  (R16), [V8.S4, V9.S4, V10.S4, V11.S4]
	ADD   R7, R16
	VLD1  (R16), [V12.S4, V13.S4, V14.S4, V15.S4]
	ADD   R7, R16
	VLD1  (R16), [V16.S4, V17.S4, V18.S4, V19.S4]
	ADD   R7, R16
	VLD1  (R16), [V20.S4, V21.S4, V22.S4, V23.S4]
	B     g6loop

g6zero:
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	VEOR V4.B16, V4.B16, V4.B16
	VEOR V5.B16, V5.B16, V5.B16
	VEOR V6.B16, V6.B16, V6.B16
	VEOR V7.B16, V7.B16, V7.B16
	VEOR V8.B16, V8.B16, V8.B16
	VEOR V9.B16, V9.B16, V9.B16
	VEOR V10.B16, V10.B16, V10.B16
	VEOR V11.B16, V11.B16, V11.B16
	VEOR V12.B16, V12.B16, V12.B16
	VEOR V13.B16, V13.B16, V13.B16
	VEOR V14.B16, V14.B16, V14.B16
	VEOR V15.B16, V15.B16, V15.B16
	VEOR V16.B16, V16.B16, V16.B16
	VEOR V17.B16, V17.B16, V17.B16
	VEOR V18.B16, V18.B16, V18.B16
	VEOR V19.B16, V19.B16, V19.B16
	VEOR V20.B16, V20.B16, V20.B16
	VEOR V21.B16, V21.B16, V21.B16
	VEOR V22.B16, V22.B16, V22.B16
	VEOR V23.B16, V23.B16, V23.B16

g6loop:
	CBZ     R0, g6store
	VLD1    (R4), [V24.S4, V25.S4, V26.S4, V27.S4]
	ADD     R5, R4
	VLD1R.P (R10)(R3), [V28.S4]
	VLD1R.P (R11)(R3), [V29.S4]
	VFMLA   V24.S4, V28.S4, V0.S4
	VFMLA   V25.S4, V28.S4, V1.S4
	VFMLA   V26.S4, V28.S4, V2.S4
	VFMLA   V27.S4, V28.S4, V3.S4
	VLD1R.P (R12)(R3), [V30.S4]
	VFMLA   V24.S4, V29.S4, V4.S4
	VFMLA   V25.S4, V29.S4, V5.S4
	VFMLA   V26.S4, V29.S4, V6.S4
	VFMLA   V27.S4, V29.S4, V7.S4
	VLD1R.P (R13)(R3), [V31.S4]
	VFMLA   V24.S4, V30.S4, V8.S4
	VFMLA   V25.S4, V30.S4, V9.S4
	VFMLA   V26.S4, V30.S4, V10.S4
	VFMLA   V27.S4, V30.S4, V11.S4
	VLD1R.P (R14)(R3), [V28.S4]
	VFMLA   V24.S4, V31.S4, V12.S4
	VFMLA   V25.S4, V31.S4, V13.S4
	VFMLA   V26.S4, V31.S4, V14.S4
	VFMLA   V27.S4, V31.S4, V15.S4
	VLD1R.P (R15)(R3), [V29.S4]
	VFMLA   V24.S4, V28.S4, V16.S4
	VFMLA   V25.S4, V28.S4, V17.S4
	VFMLA   V26.S4, V28.S4, V18.S4
	VFMLA   V27.S4, V28.S4, V19.S4
	VFMLA   V24.S4, V29.S4, V20.S4
	VFMLA   V25.S4, V29.S4, V21.S4
	VFMLA   V26.S4, V29.S4, V22.S4
	VFMLA   V27.S4, V29.S4, V23.S4
	SUB     $1, R0
	B       g6loop

g6store:
	VST1 [V0.S4, V1.S4, V2.S4, V3.S4], (R6)
	ADD  R7, R6
	VST1 [V4.S4, V5.S4, V6.S4, V7.S4], (R6)
	ADD  R7, R6
	VST1 [V8.S4, V9.S4, V10.S4, V11.S4], (R6)
	ADD  R7, R6
	VST1 [V12.S4, V13.S4, V14.S4, V15.S4], (R6)
	ADD  R7, R6
	VST1 [V16.S4, V17.S4, V18.S4, V19.S4], (R6)
	ADD  R7, R6
	VST1 [V20.S4, V21.S4, V22.S4, V23.S4], (R6)
	RET

// func gemm1x16NEON(k int, a []float32, ar, ac int, b []float32, ldb int, c []float32, ldc int, accumulate bool)
//
// One row of gemm6x16NEON, for the rows below a multiple of 6; two sets
// of accumulators (even and odd p) halve the chains' length.
TEXT ·gemm1x16NEON(SB), NOSPLIT, $0-113
	MOVD  k+0(FP), R0
	MOVD  a_base+8(FP), R1
	MOVD  ac+40(FP), R3
	MOVD  b_base+48(FP), R4
	MOVD  ldb+72(FP), R5
	MOVD  c_base+80(FP), R6
	MOVBU accumulate+112(FP), R8
	LSL   $2, R3
	LSL   $2, R5
	VEOR  V4.B16, V4.B16, V4.B16
	VEOR  V5.B16, V5.B16, V5.B16
	VEOR  V6.B16, V6.B16, V6.B16
	VEOR  V7.B16, V7.B16, V7.B16
	CBZ   R8, g1zero
	VLD1  (R6), [V0.S4, V1.S4, V2.S4, V3.S4]
	B     g1loop2

g1zero:
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16

g1loop2:
	CMP     $2, R0
	BLT     g1last
	VLD1    (R4), [V24.S4, V25.S4, V26.S4, V27.S4]
	ADD     R5, R4
	VLD1    (R4), [V16.S4, V17.S4, V18.S4, V19.S4]
	ADD     R5, R4
	VLD1R.P (R1)(R3), [V28.S4]
	VLD1R.P (R1)(R3), [V29.S4]
	VFMLA   V24.S4, V28.S4, V0.S4
	VFMLA   V25.S4, V28.S4, V1.S4
	VFMLA   V26.S4, V28.S4, V2.S4
	VFMLA   V27.S4, V28.S4, V3.S4
	VFMLA   V16.S4, V29.S4, V4.S4
	VFMLA   V17.S4, V29.S4, V5.S4
	VFMLA   V18.S4, V29.S4, V6.S4
	VFMLA   V19.S4, V29.S4, V7.S4
	SUB     $2, R0
	B       g1loop2

g1last:
	CBZ     R0, g1store
	VLD1    (R4), [V24.S4, V25.S4, V26.S4, V27.S4]
	VLD1R   (R1), [V28.S4]
	VFMLA   V24.S4, V28.S4, V0.S4
	VFMLA   V25.S4, V28.S4, V1.S4
	VFMLA   V26.S4, V28.S4, V2.S4
	VFMLA   V27.S4, V28.S4, V3.S4

g1store:
	FADD4(4, 0, 0)
	FADD4(5, 1, 1)
	FADD4(6, 2, 2)
	FADD4(7, 3, 3)
	VST1 [V0.S4, V1.S4, V2.S4, V3.S4], (R6)
	RET

// func dotRows4NEON(s []float32, lds int, q []float32, ldq int, k []float32, ldk, n, d int)
//
// DotRows for 4 query rows: each key is loaded once for the 4 rows, and
// keys go two at a time (8 accumulators) while two remain. The last d%4
// values of the rows are loaded lane by lane into zeroed registers, so
// that nothing past a row is read and the zero lanes add nothing.
TEXT ·dotRows4NEON(SB), NOSPLIT, $0-112
	MOVD s_base+0(FP), R0
	MOVD lds+24(FP), R1
	MOVD q_base+32(FP), R2
	MOVD ldq+56(FP), R3
	MOVD k_base+64(FP), R4
	MOVD ldk+88(FP), R5
	MOVD n+96(FP), R6
	MOVD d+104(FP), R7
	LSL  $2, R1
	LSL  $2, R3
	LSL  $2, R5
	// Row pointers of s: R19 … R22.
	MOVD R0, R19
	ADD  R1, R19, R20
	ADD  R1, R20, R21
	ADD  R1, R21, R22

dr4Key2:
	CMP  $2, R6
	BLT  dr4Key1
	MOVD R2, R10
	ADD  R3, R10, R11
	ADD  R3, R11, R12
	ADD  R3, R12, R13
	MOVD R4, R14
	ADD  R5, R14, R15
	MOVD R7, R8
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	VEOR V4.B16, V4.B16, V4.B16
	VEOR V5.B16, V5.B16, V5.B16
	VEOR V6.B16, V6.B16, V6.B16
	VEOR V7.B16, V7.B16, V7.B16

dr4K2Loop:
	CMP    $4, R8
	BLT    dr4K2Tail
	VLD1.P 16(R14), [V16.S4]
	VLD1.P 16(R15), [V17.S4]
	VLD1.P 16(R10), [V20.S4]
	VLD1.P 16(R11), [V21.S4]
	VLD1.P 16(R12), [V22.S4]
	VLD1.P 16(R13), [V23.S4]
	VFMLA  V16.S4, V20.S4, V0.S4
	VFMLA  V16.S4, V21.S4, V1.S4
	VFMLA  V16.S4, V22.S4, V2.S4
	VFMLA  V16.S4, V23.S4, V3.S4
	VFMLA  V17.S4, V20.S4, V4.S4
	VFMLA  V17.S4, V21.S4, V5.S4
	VFMLA  V17.S4, V22.S4, V6.S4
	VFMLA  V17.S4, V23.S4, V7.S4
	SUB    $4, R8
	B      dr4K2Loop

dr4K2Tail:
	CBZ    R8, dr4K2Sum
	VEOR   V16.B16, V16.B16, V16.B16
	VEOR   V17.B16, V17.B16, V17.B16
	VEOR   V20.B16, V20.B16, V20.B16
	VEOR   V21.B16, V21.B16, V21.B16
	VEOR   V22.B16, V22.B16, V22.B16
	VEOR   V23.B16, V23.B16, V23.B16
	VLD1.P 4(R14), V16.S[0]
	VLD1.P 4(R15), V17.S[0]
	VLD1.P 4(R10), V20.S[0]
	VLD1.P 4(R11), V21.S[0]
	VLD1.P 4(R12), V22.S[0]
	VLD1.P 4(R13), V23.S[0]
	CMP    $2, R8
	BLT    dr4K2TailFMA
	VLD1.P 4(R14), V16.S[1]
	VLD1.P 4(R15), V17.S[1]
	VLD1.P 4(R10), V20.S[1]
	VLD1.P 4(R11), V21.S[1]
	VLD1.P 4(R12), V22.S[1]
	VLD1.P 4(R13), V23.S[1]
	CMP    $3, R8
	BLT    dr4K2TailFMA
	VLD1   (R14), V16.S[2]
	VLD1   (R15), V17.S[2]
	VLD1   (R10), V20.S[2]
	VLD1   (R11), V21.S[2]
	VLD1   (R12), V22.S[2]
	VLD1   (R13), V23.S[2]

dr4K2TailFMA:
	VFMLA V16.S4, V20.S4, V0.S4
	VFMLA V16.S4, V21.S4, V1.S4
	VFMLA V16.S4, V22.S4, V2.S4
	VFMLA V16.S4, V23.S4, V3.S4
	VFMLA V17.S4, V20.S4, V4.S4
	VFMLA V17.S4, V21.S4, V5.S4
	VFMLA V17.S4, V22.S4, V6.S4
	VFMLA V17.S4, V23.S4, V7.S4

dr4K2Sum:
	// V24 = the 4 rows' sums for the first key, V25 for the second.
	FADDP4(1, 0, 24)
	FADDP4(3, 2, 26)
	FADDP4(26, 24, 24)
	FADDP4(5, 4, 25)
	FADDP4(7, 6, 27)
	FADDP4(27, 25, 25)
	VZIP1  V25.S4, V24.S4, V26.S4 // row 0: key 0, key 1; row 1: key 0, key 1
	VZIP2  V25.S4, V24.S4, V27.S4 // rows 2 and 3
	VST1.P V26.D[0], 8(R19)
	VST1.P V26.D[1], 8(R20)
	VST1.P V27.D[0], 8(R21)
	VST1.P V27.D[1], 8(R22)
	ADD    R5, R4
	ADD    R5, R4
	SUB    $2, R6
	B      dr4Key2

dr4Key1:
	CBZ  R6, dr4Done
	MOVD R2, R10
	ADD  R3, R10, R11
	ADD  R3, R11, R12
	ADD  R3, R12, R13
	MOVD R4, R14
	MOVD R7, R8
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16

dr4K1Loop:
	CMP    $4, R8
	BLT    dr4K1Tail
	VLD1.P 16(R14), [V16.S4]
	VLD1.P 16(R10), [V20.S4]
	VLD1.P 16(R11), [V21.S4]
	VLD1.P 16(R12), [V22.S4]
	VLD1.P 16(R13), [V23.S4]
	VFMLA  V16.S4, V20.S4, V0.S4
	VFMLA  V16.S4, V21.S4, V1.S4
	VFMLA  V16.S4, V22.S4, V2.S4
	VFMLA  V16.S4, V23.S4, V3.S4
	SUB    $4, R8
	B      dr4K1Loop

dr4K1Tail:
	CBZ    R8, dr4K1Sum
	VEOR   V16.B16, V16.B16, V16.B16
	VEOR   V20.B16, V20.B16, V20.B16
	VEOR   V21.B16, V21.B16, V21.B16
	VEOR   V22.B16, V22.B16, V22.B16
	VEOR   V23.B16, V23.B16, V23.B16
	VLD1.P 4(R14), V16.S[0]
	VLD1.P 4(R10), V20.S[0]
	VLD1.P 4(R11), V21.S[0]
	VLD1.P 4(R12), V22.S[0]
	VLD1.P 4(R13), V23.S[0]
	CMP    $2, R8
	BLT    dr4K1TailFMA
	VLD1.P 4(R14), V16.S[1]
	VLD1.P 4(R10), V20.S[1]
	VLD1.P 4(R11), V21.S[1]
	VLD1.P 4(R12), V22.S[1]
	VLD1.P 4(R13), V23.S[1]
	CMP    $3, R8
	BLT    dr4K1TailFMA
	VLD1   (R14), V16.S[2]
	VLD1   (R10), V20.S[2]
	VLD1   (R11), V21.S[2]
	VLD1   (R12), V22.S[2]
	VLD1   (R13), V23.S[2]

dr4K1TailFMA:
	VFMLA V16.S4, V20.S4, V0.S4
	VFMLA V16.S4, V21.S4, V1.S4
	VFMLA V16.S4, V22.S4, V2.S4
	VFMLA V16.S4, V23.S4, V3.S4

dr4K1Sum:
	FADDP4(1, 0, 24)
	FADDP4(3, 2, 26)
	FADDP4(26, 24, 24)
	VST1 V24.S[0], (R19)
	VST1 V24.S[1], (R20)
	VST1 V24.S[2], (R21)
	VST1 V24.S[3], (R22)

dr4Done:
	RET

// func dotNEON(x, y []float32) float32
TEXT ·dotNEON(SB), NOSPLIT, $0-52
	MOVD x_base+0(FP), R0
	MOVD x_len+8(FP), R2
	MOVD y_base+24(FP), R1
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16

dot16:
	CMP    $16, R2
	BLT    dot4
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	VFMLA  V4.S4, V16.S4, V0.S4
	VFMLA  V5.S4, V17.S4, V1.S4
	VFMLA  V6.S4, V18.S4, V2.S4
	VFMLA  V7.S4, V19.S4, V3.S4
	SUB    $16, R2
	B      dot16

dot4:
	CMP    $4, R2
	BLT    dotReduce
	VLD1.P 16(R0), [V4.S4]
	VLD1.P 16(R1), [V16.S4]
	VFMLA  V4.S4, V16.S4, V0.S4
	SUB    $4, R2
	B      dot4

dotReduce:
	FADD4(1, 0, 0)
	FADD4(3, 2, 2)
	FADD4(2, 0, 0)
	FADDP4(0, 0, 0)
	FADDP4(0, 0, 0)

dot1:
	CBZ     R2, dotDone
	FMOVS.P 4(R0), F4
	FMOVS.P 4(R1), F5
	FMADDS  F4, F0, F5, F0
	SUB     $1, R2
	B       dot1

dotDone:
	FMOVS F0, ret+48(FP)
	RET

// func readSumNEON(x []float32) float32
TEXT ·readSumNEON(SB), NOSPLIT, $0-28
	MOVD x_base+0(FP), R0
	MOVD x_len+8(FP), R2
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16

rs16:
	CMP    $16, R2
	BLT    rs4
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	FADD4(4, 0, 0)
	FADD4(5, 1, 1)
	FADD4(6, 2, 2)
	FADD4(7, 3, 3)
	SUB    $16, R2
	B      rs16

rs4:
	CMP    $4, R2
	BLT    rsReduce
	VLD1.P 16(R0), [V4.S4]
	FADD4(4, 0, 0)
	SUB    $4, R2
	B      rs4

rsReduce:
	FADD4(1, 0, 0)
	FADD4(3, 2, 2)
	FADD4(2, 0, 0)
	FADDP4(0, 0, 0)
	FADDP4(0, 0, 0)

rs1:
	CBZ     R2, rsDone
	FMOVS.P 4(R0), F4
	FADDS   F4, F0, F0
	SUB     $1, R2
	B       rs1

rsDone:
	FMOVS F0, ret+24(FP)
	RET

// func maxNEON(x []float32) float32
TEXT ·maxNEON(SB), NOSPLIT, $0-28
	MOVD x_base+0(FP), R0
	MOVD x_len+8(FP), R2
	CONST4(NEG_INF, R9, V0)
	VMOV V0.B16, V1.B16
	VMOV V0.B16, V2.B16
	VMOV V0.B16, V3.B16

max16:
	CMP    $16, R2
	BLT    max4
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	FMAX4(4, 0, 0)
	FMAX4(5, 1, 1)
	FMAX4(6, 2, 2)
	FMAX4(7, 3, 3)
	SUB    $16, R2
	B      max16

max4:
	CMP    $4, R2
	BLT    maxReduce
	VLD1.P 16(R0), [V4.S4]
	FMAX4(4, 0, 0)
	SUB    $4, R2
	B      max4

maxReduce:
	FMAX4(1, 0, 0)
	FMAX4(3, 2, 2)
	FMAX4(2, 0, 0)
	FMAXP4(0, 0, 0)
	FMAXP4(0, 0, 0)

max1:
	CBZ     R2, maxDone
	FMOVS.P 4(R0), F4
	FMAXS   F4, F0, F0
	SUB     $1, R2
	B       max1

maxDone:
	FMOVS F0, ret+24(FP)
	RET

// func scaleNEON(x []float32, c float32)
TEXT ·scaleNEON(SB), NOSPLIT, $0-28
	MOVD  x_base+0(FP), R0
	MOVD  x_len+8(FP), R2
	FMOVS c+24(FP), F31
	VDUP  V31.S[0], V31.S4

sc16:
	CMP  $16, R2
	BLT  sc4
	VLD1 (R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	FMUL4(31, 0, 0)
	FMUL4(31, 1, 1)
	FMUL4(31, 2, 2)
	FMUL4(31, 3, 3)
	VST1.P [V0.S4, V1.S4, V2.S4, V3.S4], 64(R0)
	SUB  $16, R2
	B    sc16

sc4:
	CMP  $4, R2
	BLT  sc1
	VLD1 (R0), [V0.S4]
	FMUL4(31, 0, 0)
	VST1.P [V0.S4], 16(R0)
	SUB  $4, R2
	B    sc4

sc1:
	CBZ     R2, scDone
	FMOVS   (R0), F0
	FMULS   F31, F0, F0
	FMOVS.P F0, 4(R0)
	SUB     $1, R2
	B       sc1

scDone:
	RET

// func axpyNEON(a float32, x, y []float32)
TEXT ·axpyNEON(SB), NOSPLIT, $0-56
	FMOVS a+0(FP), F31
	VDUP  V31.S[0], V31.S4
	MOVD  x_base+8(FP), R0
	MOVD  x_len+16(FP), R2
	MOVD  y_base+32(FP), R1

ax16:
	CMP    $16, R2
	BLT    ax4
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1   (R1), [V0.S4, V1.S4, V2.S4, V3.S4]
	VFMLA  V31.S4, V4.S4, V0.S4
	VFMLA  V31.S4, V5.S4, V1.S4
	VFMLA  V31.S4, V6.S4, V2.S4
	VFMLA  V31.S4, V7.S4, V3.S4
	VST1.P [V0.S4, V1.S4, V2.S4, V3.S4], 64(R1)
	SUB    $16, R2
	B      ax16

ax4:
	CMP    $4, R2
	BLT    ax1
	VLD1.P 16(R0), [V4.S4]
	VLD1   (R1), [V0.S4]
	VFMLA  V31.S4, V4.S4, V0.S4
	VST1.P [V0.S4], 16(R1)
	SUB    $4, R2
	B      ax4

ax1:
	CBZ     R2, axDone
	FMOVS.P 4(R0), F4
	FMOVS   (R1), F0
	FMADDS  F31, F0, F4, F0
	FMOVS.P F0, 4(R1)
	SUB     $1, R2
	B       ax1

axDone:
	RET

// func fmaPeakNEON(iters int) float32
//
// 24 independent chains of 4-lane FMAs, PeakFlopsPerIter flops an
// iteration as in the other families. Each chain alternately adds and
// subtracts 0.5·1, which is exact, so the values stay at their start.
TEXT ·fmaPeakNEON(SB), NOSPLIT, $0-12
	MOVD iters+0(FP), R0
	CONST4(0x3f000000, R9, V30) // 0.5
	CONST4(ONE, R9, V31)
	VMOV V31.B16, V0.B16
	VMOV V31.B16, V1.B16
	VMOV V31.B16, V2.B16
	VMOV V31.B16, V3.B16
	VMOV V31.B16, V4.B16
	VMOV V31.B16, V5.B16
	VMOV V31.B16, V6.B16
	VMOV V31.B16, V7.B16
	VMOV V31.B16, V8.B16
	VMOV V31.B16, V9.B16
	VMOV V31.B16, V10.B16
	VMOV V31.B16, V11.B16
	VMOV V31.B16, V12.B16
	VMOV V31.B16, V13.B16
	VMOV V31.B16, V14.B16
	VMOV V31.B16, V15.B16
	VMOV V31.B16, V16.B16
	VMOV V31.B16, V17.B16
	VMOV V31.B16, V18.B16
	VMOV V31.B16, V19.B16
	VMOV V31.B16, V20.B16
	VMOV V31.B16, V21.B16
	VMOV V31.B16, V22.B16
	VMOV V31.B16, V23.B16

fpLoop:
	CBZ   R0, fpDone
	VFMLA V30.S4, V31.S4, V0.S4
	VFMLA V30.S4, V31.S4, V1.S4
	VFMLA V30.S4, V31.S4, V2.S4
	VFMLA V30.S4, V31.S4, V3.S4
	VFMLA V30.S4, V31.S4, V4.S4
	VFMLA V30.S4, V31.S4, V5.S4
	VFMLA V30.S4, V31.S4, V6.S4
	VFMLA V30.S4, V31.S4, V7.S4
	VFMLA V30.S4, V31.S4, V8.S4
	VFMLA V30.S4, V31.S4, V9.S4
	VFMLA V30.S4, V31.S4, V10.S4
	VFMLA V30.S4, V31.S4, V11.S4
	VFMLA V30.S4, V31.S4, V12.S4
	VFMLA V30.S4, V31.S4, V13.S4
	VFMLA V30.S4, V31.S4, V14.S4
	VFMLA V30.S4, V31.S4, V15.S4
	VFMLA V30.S4, V31.S4, V16.S4
	VFMLA V30.S4, V31.S4, V17.S4
	VFMLA V30.S4, V31.S4, V18.S4
	VFMLA V30.S4, V31.S4, V19.S4
	VFMLA V30.S4, V31.S4, V20.S4
	VFMLA V30.S4, V31.S4, V21.S4
	VFMLA V30.S4, V31.S4, V22.S4
	VFMLA V30.S4, V31.S4, V23.S4
	SUB   $1, R0
	CBZ   R0, fpDone
	VFMLS V30.S4, V31.S4, V0.S4
	VFMLS V30.S4, V31.S4, V1.S4
	VFMLS V30.S4, V31.S4, V2.S4
	VFMLS V30.S4, V31.S4, V3.S4
	VFMLS V30.S4, V31.S4, V4.S4
	VFMLS V30.S4, V31.S4, V5.S4
	VFMLS V30.S4, V31.S4, V6.S4
	VFMLS V30.S4, V31.S4, V7.S4
	VFMLS V30.S4, V31.S4, V8.S4
	VFMLS V30.S4, V31.S4, V9.S4
	VFMLS V30.S4, V31.S4, V10.S4
	VFMLS V30.S4, V31.S4, V11.S4
	VFMLS V30.S4, V31.S4, V12.S4
	VFMLS V30.S4, V31.S4, V13.S4
	VFMLS V30.S4, V31.S4, V14.S4
	VFMLS V30.S4, V31.S4, V15.S4
	VFMLS V30.S4, V31.S4, V16.S4
	VFMLS V30.S4, V31.S4, V17.S4
	VFMLS V30.S4, V31.S4, V18.S4
	VFMLS V30.S4, V31.S4, V19.S4
	VFMLS V30.S4, V31.S4, V20.S4
	VFMLS V30.S4, V31.S4, V21.S4
	VFMLS V30.S4, V31.S4, V22.S4
	VFMLS V30.S4, V31.S4, V23.S4
	SUB   $1, R0
	B     fpLoop

fpDone:
	FADD4(1, 0, 0)
	FADD4(2, 0, 0)
	FADD4(3, 0, 0)
	FADD4(4, 0, 0)
	FADD4(5, 0, 0)
	FADD4(6, 0, 0)
	FADD4(7, 0, 0)
	FADD4(8, 0, 0)
	FADD4(9, 0, 0)
	FADD4(10, 0, 0)
	FADD4(11, 0, 0)
	FADD4(12, 0, 0)
	FADD4(13, 0, 0)
	FADD4(14, 0, 0)
	FADD4(15, 0, 0)
	FADD4(16, 0, 0)
	FADD4(17, 0, 0)
	FADD4(18, 0, 0)
	FADD4(19, 0, 0)
	FADD4(20, 0, 0)
	FADD4(21, 0, 0)
	FADD4(22, 0, 0)
	FADD4(23, 0, 0)
	FADDP4(0, 0, 0)
	FADDP4(0, 0, 0)
	FMOVS F0, ret+8(FP)
	RET

// The widenings of the 16-bit, int8 and 4-bit kernels: each sets
// dst[r*ldd+c] to the float32 value of src[r*lds+c] for r < rows and
// c < cols (R0 and R1 the rows of dst and src, R2 and R3 their strides
// in bytes), 8 values a step and the last cols%8 one at a time, so that
// nothing past a row's cols values is read or written. The Go assembler
// lacks the widening conversions: these macros emit them as WORDs.

// FCVTL Vd.4S, Vn.4H (binary16 to float32, exact; a NaN made quiet)
#define FCVTL4(n, d) WORD $(0x0E217800 | ((n)<<5) | (d))
// FCVTL2 Vd.4S, Vn.8H
#define FCVTL24(n, d) WORD $(0x4E217800 | ((n)<<5) | (d))
// SXTL Vd.8H, Vn.8B (SSHLL #0)
#define SXTL8(n, d) WORD $(0x0F08A400 | ((n)<<5) | (d))
// SXTL Vd.4S, Vn.4H
#define SXTL4(n, d) WORD $(0x0F10A400 | ((n)<<5) | (d))
// SXTL2 Vd.4S, Vn.8H
#define SXTL24(n, d) WORD $(0x4F10A400 | ((n)<<5) | (d))
// SCVTF Vd.4S, Vn.4S
#define SCVTF4(n, d) WORD $(0x4E21D800 | ((n)<<5) | (d))
// UCVTF Vd.4S, Vn.4S
#define UCVTF4(n, d) WORD $(0x6E21D800 | ((n)<<5) | (d))

// func widenRowsBF16NEON(dst []float32, ldd int, src []uint16, lds, rows, cols int)
TEXT ·widenRowsBF16NEON(SB), NOSPLIT, $0-80
	MOVD dst_base+0(FP), R0
	MOVD ldd+24(FP), R2
	MOVD src_base+32(FP), R1
	MOVD lds+56(FP), R3
	MOVD rows+64(FP), R4
	MOVD cols+72(FP), R5
	LSL  $2, R2
	LSL  $1, R3
	VEOR V31.B16, V31.B16, V31.B16
	CBZ  R4, wbDone

wbRow:
	MOVD R0, R6
	MOVD R1, R7
	MOVD R5, R8

wb8:
	CMP    $8, R8
	BLT    wb1
	VLD1.P 16(R7), [V0.H8]
	// A bfloat16 is the high half of its float32: zeros go below it.
	VZIP1  V0.H8, V31.H8, V1.H8
	VZIP2  V0.H8, V31.H8, V2.H8
	VST1.P [V1.S4, V2.S4], 32(R6)
	SUB    $8, R8
	B      wb8

wb1:
	CBZ     R8, wbNext
	MOVHU.P 2(R7), R9
	LSLW    $16, R9
	MOVW.P  R9, 4(R6)
	SUB     $1, R8
	B       wb1

wbNext:
	ADD  R2, R0
	ADD  R3, R1
	SUBS $1, R4
	BNE  wbRow

wbDone:
	RET

// func widenRowsF16NEON(dst []float32, ldd int, src []uint16, lds, rows, cols int)
TEXT ·widenRowsF16NEON(SB), NOSPLIT, $0-80
	MOVD dst_base+0(FP), R0
	MOVD ldd+24(FP), R2
	MOVD src_base+32(FP), R1
	MOVD lds+56(FP), R3
	MOVD rows+64(FP), R4
	MOVD cols+72(FP), R5
	LSL  $2, R2
	LSL  $1, R3
	CBZ R4, whDone

whRow:
	MOVD R0, R6
	MOVD R1, R7
	MOVD R5, R8

wh8:
	CMP    $8, R8
	BLT    wh1
	VLD1.P 16(R7), [V0.H8]
	FCVTL4(0, 1)
	FCVTL24(0, 2)
	VST1.P [V1.S4, V2.S4], 32(R6)
	SUB    $8, R8
	B      wh8

wh1:
	CBZ     R8, whNext
	MOVHU.P 2(R7), R9
	FMOVS   R9, F0
	FCVTHS  F0, F1
	FMOVS.P F1, 4(R6)
	SUB     $1, R8
	B       wh1

whNext:
	ADD  R2, R0
	ADD  R3, R1
	SUBS $1, R4
	BNE  whRow

whDone:
	RET

// func widenRowsI8NEON(dst []float32, ldd int, src []int8, lds, rows, cols int)
TEXT ·widenRowsI8NEON(SB), NOSPLIT, $0-80
	MOVD dst_base+0(FP), R0
	MOVD ldd+24(FP), R2
	MOVD src_base+32(FP), R1
	MOVD lds+56(FP), R3
	MOVD rows+64(FP), R4
	MOVD cols+72(FP), R5
	LSL  $2, R2
	CBZ R4, wiDone

wiRow:
	MOVD R0, R6
	MOVD R1, R7
	MOVD R5, R8

wi8:
	CMP    $8, R8
	BLT    wi1
	VLD1.P 8(R7), [V0.B8]
	SXTL8(0, 0)
	SXTL4(0, 1)
	SXTL24(0, 2)
	SCVTF4(1, 1)
	SCVTF4(2, 2)
	VST1.P [V1.S4, V2.S4], 32(R6)
	SUB    $8, R8
	B      wi8

wi1:
	CBZ     R8, wiNext
	MOVB.P  1(R7), R9
	SCVTFWS R9, F0
	FMOVS.P F0, 4(R6)
	SUB     $1, R8
	B       wi1

wiNext:
	ADD  R2, R0
	ADD  R3, R1
	SUBS $1, R4
	BNE  wiRow

wiDone:
	RET

// func widenRowsU4LoNEON(dst []float32, ldd int, src []uint8, lds, rows, cols int)
TEXT ·widenRowsU4LoNEON(SB), NOSPLIT, $0-80
	MOVD dst_base+0(FP), R0
	MOVD ldd+24(FP), R2
	MOVD src_base+32(FP), R1
	MOVD lds+56(FP), R3
	MOVD rows+64(FP), R4
	MOVD cols+72(FP), R5
	LSL  $2, R2
	VMOVI $15, V30.B16
	CBZ   R4, wlDone

wlRow:
	MOVD R0, R6
	MOVD R1, R7
	MOVD R5, R8

wl8:
	CMP    $8, R8
	BLT    wl1
	VLD1.P 8(R7), [V0.B8]
	VAND   V30.B8, V0.B8, V0.B8
	VUXTL  V0.B8, V0.H8
	VUXTL  V0.H4, V1.S4
	VUXTL2 V0.H8, V2.S4
	UCVTF4(1, 1)
	UCVTF4(2, 2)
	VST1.P [V1.S4, V2.S4], 32(R6)
	SUB    $8, R8
	B      wl8

wl1:
	CBZ     R8, wlNext
	MOVBU.P 1(R7), R9
	ANDW    $15, R9
	UCVTFWS R9, F0
	FMOVS.P F0, 4(R6)
	SUB     $1, R8
	B       wl1

wlNext:
	ADD  R2, R0
	ADD  R3, R1
	SUBS $1, R4
	BNE  wlRow

wlDone:
	RET

// func widenRowsU4HiNEON(dst []float32, ldd int, src []uint8, lds, rows, cols int)
TEXT ·widenRowsU4HiNEON(SB), NOSPLIT, $0-80
	MOVD dst_base+0(FP), R0
	MOVD ldd+24(FP), R2
	MOVD src_base+32(FP), R1
	MOVD lds+56(FP), R3
	MOVD rows+64(FP), R4
	MOVD cols+72(FP), R5
	LSL  $2, R2
	CBZ R4, wuDone

wuRow:
	MOVD R0, R6
	MOVD R1, R7
	MOVD R5, R8

wu8:
	CMP    $8, R8
	BLT    wu1
	VLD1.P 8(R7), [V0.B8]
	VUSHR  $4, V0.B8, V0.B8
	VUXTL  V0.B8, V0.H8
	VUXTL  V0.H4, V1.S4
	VUXTL2 V0.H8, V2.S4
	UCVTF4(1, 1)
	UCVTF4(2, 2)
	VST1.P [V1.S4, V2.S4], 32(R6)
	SUB    $8, R8
	B      wu8

wu1:
	CBZ     R8, wuNext
	MOVBU.P 1(R7), R9
	LSRW    $4, R9
	UCVTFWS R9, F0
	FMOVS.P F0, 4(R6)
	SUB     $1, R8
	B       wu1

wuNext:
	ADD  R2, R0
	ADD  R3, R1
	SUBS $1, R4
	BNE  wuRow

wuDone:
	RET
