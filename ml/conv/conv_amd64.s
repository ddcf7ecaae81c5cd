//go:build amd64 && !purego

#include "textflag.h"

// In Go's assembler VFMADD231PS b, a, d is d = a*b + d, rounded once.

// func rowAVX2(in *float32, w int, wt, out *float32, n, c int)
// Row for the first n positions (a multiple of 4), 4 positions and 16
// channels at a time: 8 accumulators, into which each tap's two weight
// registers are multiplied by the 4 positions' input values.
TEXT ·rowAVX2(SB), NOSPLIT, $0-48
	MOVQ in+0(FP), SI
	MOVQ w+8(FP), R8
	SHLQ $2, R8             // an input row in bytes
	MOVQ wt+16(FP), DX
	MOVQ out+24(FP), DI
	MOVQ n+32(FP), CX
	MOVQ c+40(FP), R10
	SHLQ $2, R10            // a position's channels in bytes
	XORQ AX, AX             // the first of the 4 positions

rx:
	CMPQ AX, CX
	JAE  rdone
	XORQ BX, BX             // the 16 channels' offset in bytes

rg:
	CMPQ BX, R10
	JAE  rnext
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	LEAQ (SI)(AX*4), R11    // in[x] of the first input row
	LEAQ (DX)(BX*1), R12    // wt of tap 0, these channels
	MOVQ $5, R13            // input rows left

rky:
	VMOVUPS (R12), Y8        // tap (ky, 0)
	VMOVUPS 32(R12), Y9
	VBROADCASTSS 0(R11), Y10
	VFMADD231PS  Y8, Y10, Y0
	VFMADD231PS  Y9, Y10, Y1
	VBROADCASTSS 4(R11), Y11
	VFMADD231PS  Y8, Y11, Y2
	VFMADD231PS  Y9, Y11, Y3
	VBROADCASTSS 8(R11), Y12
	VFMADD231PS  Y8, Y12, Y4
	VFMADD231PS  Y9, Y12, Y5
	VBROADCASTSS 12(R11), Y13
	VFMADD231PS  Y8, Y13, Y6
	VFMADD231PS  Y9, Y13, Y7
	ADDQ R10, R12
	VMOVUPS (R12), Y8        // tap (ky, 1)
	VMOVUPS 32(R12), Y9
	VBROADCASTSS 4(R11), Y10
	VFMADD231PS  Y8, Y10, Y0
	VFMADD231PS  Y9, Y10, Y1
	VBROADCASTSS 8(R11), Y11
	VFMADD231PS  Y8, Y11, Y2
	VFMADD231PS  Y9, Y11, Y3
	VBROADCASTSS 12(R11), Y12
	VFMADD231PS  Y8, Y12, Y4
	VFMADD231PS  Y9, Y12, Y5
	VBROADCASTSS 16(R11), Y13
	VFMADD231PS  Y8, Y13, Y6
	VFMADD231PS  Y9, Y13, Y7
	ADDQ R10, R12
	VMOVUPS (R12), Y8        // tap (ky, 2)
	VMOVUPS 32(R12), Y9
	VBROADCASTSS 8(R11), Y10
	VFMADD231PS  Y8, Y10, Y0
	VFMADD231PS  Y9, Y10, Y1
	VBROADCASTSS 12(R11), Y11
	VFMADD231PS  Y8, Y11, Y2
	VFMADD231PS  Y9, Y11, Y3
	VBROADCASTSS 16(R11), Y12
	VFMADD231PS  Y8, Y12, Y4
	VFMADD231PS  Y9, Y12, Y5
	VBROADCASTSS 20(R11), Y13
	VFMADD231PS  Y8, Y13, Y6
	VFMADD231PS  Y9, Y13, Y7
	ADDQ R10, R12
	VMOVUPS (R12), Y8        // tap (ky, 3)
	VMOVUPS 32(R12), Y9
	VBROADCASTSS 12(R11), Y10
	VFMADD231PS  Y8, Y10, Y0
	VFMADD231PS  Y9, Y10, Y1
	VBROADCASTSS 16(R11), Y11
	VFMADD231PS  Y8, Y11, Y2
	VFMADD231PS  Y9, Y11, Y3
	VBROADCASTSS 20(R11), Y12
	VFMADD231PS  Y8, Y12, Y4
	VFMADD231PS  Y9, Y12, Y5
	VBROADCASTSS 24(R11), Y13
	VFMADD231PS  Y8, Y13, Y6
	VFMADD231PS  Y9, Y13, Y7
	ADDQ R10, R12
	VMOVUPS (R12), Y8        // tap (ky, 4)
	VMOVUPS 32(R12), Y9
	VBROADCASTSS 16(R11), Y10
	VFMADD231PS  Y8, Y10, Y0
	VFMADD231PS  Y9, Y10, Y1
	VBROADCASTSS 20(R11), Y11
	VFMADD231PS  Y8, Y11, Y2
	VFMADD231PS  Y9, Y11, Y3
	VBROADCASTSS 24(R11), Y12
	VFMADD231PS  Y8, Y12, Y4
	VFMADD231PS  Y9, Y12, Y5
	VBROADCASTSS 28(R11), Y13
	VFMADD231PS  Y8, Y13, Y6
	VFMADD231PS  Y9, Y13, Y7
	ADDQ R10, R12
	ADDQ R8, R11
	DECQ R13
	JNZ  rky
	MOVQ  AX, R11
	IMULQ R10, R11
	ADDQ  DI, R11
	ADDQ  BX, R11           // out[x*c + these channels]
	VMOVUPS Y0, (R11)
	VMOVUPS Y1, 32(R11)
	ADDQ    R10, R11
	VMOVUPS Y2, (R11)
	VMOVUPS Y3, 32(R11)
	ADDQ    R10, R11
	VMOVUPS Y4, (R11)
	VMOVUPS Y5, 32(R11)
	ADDQ    R10, R11
	VMOVUPS Y6, (R11)
	VMOVUPS Y7, 32(R11)
	ADDQ $64, BX
	JMP  rg

rnext:
	ADDQ $4, AX
	JMP  rx

rdone:
	VZEROUPPER
	RET

// func gradAVX2(in *float32, w int, dOut, dwt *float32, n, c int)
// GradRow, for each input row ky and 16 channels at a time: the 5 taps
// (ky, 0..4) of those channels in 10 accumulators, loaded from dwt, into
// which each position's gradient is multiplied by its 5 input values,
// the positions in order; then stored back.
TEXT ·gradAVX2(SB), NOSPLIT, $0-48
	MOVQ in+0(FP), SI
	MOVQ w+8(FP), R8
	SHLQ $2, R8             // an input row in bytes
	MOVQ dOut+16(FP), DX
	MOVQ dwt+24(FP), DI
	MOVQ n+32(FP), CX
	MOVQ c+40(FP), R10
	SHLQ $2, R10            // a position's (or a tap's) channels in bytes
	XORQ R13, R13           // ky

gky:
	CMPQ R13, $5
	JAE  gdone
	XORQ BX, BX             // the 16 channels' offset in bytes

gg:
	CMPQ  BX, R10
	JAE   gkynext
	MOVQ  R13, R12
	IMULQ $5, R12
	IMULQ R10, R12
	ADDQ  DI, R12
	ADDQ  BX, R12           // dwt of tap (ky, 0), these channels
	MOVQ  R12, R9
	VMOVUPS (R9), Y0
	VMOVUPS 32(R9), Y1
	ADDQ    R10, R9
	VMOVUPS (R9), Y2
	VMOVUPS 32(R9), Y3
	ADDQ    R10, R9
	VMOVUPS (R9), Y4
	VMOVUPS 32(R9), Y5
	ADDQ    R10, R9
	VMOVUPS (R9), Y6
	VMOVUPS 32(R9), Y7
	ADDQ    R10, R9
	VMOVUPS (R9), Y8
	VMOVUPS 32(R9), Y9
	MOVQ  R13, R11
	IMULQ R8, R11
	ADDQ  SI, R11           // in[0] of input row ky
	LEAQ  (DX)(BX*1), AX    // dOut of position 0, these channels
	MOVQ  CX, R9            // positions left

gx:
	TESTQ R9, R9
	JZ    gstore
	VMOVUPS (AX), Y10
	VMOVUPS 32(AX), Y11
	VBROADCASTSS 0(R11), Y12
	VFMADD231PS  Y10, Y12, Y0
	VFMADD231PS  Y11, Y12, Y1
	VBROADCASTSS 4(R11), Y12
	VFMADD231PS  Y10, Y12, Y2
	VFMADD231PS  Y11, Y12, Y3
	VBROADCASTSS 8(R11), Y12
	VFMADD231PS  Y10, Y12, Y4
	VFMADD231PS  Y11, Y12, Y5
	VBROADCASTSS 12(R11), Y12
	VFMADD231PS  Y10, Y12, Y6
	VFMADD231PS  Y11, Y12, Y7
	VBROADCASTSS 16(R11), Y12
	VFMADD231PS  Y10, Y12, Y8
	VFMADD231PS  Y11, Y12, Y9
	ADDQ $4, R11
	ADDQ R10, AX
	DECQ R9
	JMP  gx

gstore:
	MOVQ R12, R9
	VMOVUPS Y0, (R9)
	VMOVUPS Y1, 32(R9)
	ADDQ    R10, R9
	VMOVUPS Y2, (R9)
	VMOVUPS Y3, 32(R9)
	ADDQ    R10, R9
	VMOVUPS Y4, (R9)
	VMOVUPS Y5, 32(R9)
	ADDQ    R10, R9
	VMOVUPS Y6, (R9)
	VMOVUPS Y7, 32(R9)
	ADDQ    R10, R9
	VMOVUPS Y8, (R9)
	VMOVUPS Y9, 32(R9)
	ADDQ $64, BX
	JMP  gg

gkynext:
	INCQ R13
	JMP  gky

gdone:
	VZEROUPPER
	RET
