//go:build amd64 && !purego

#include "textflag.h"

// Register use of the bulk (sealBulk, openBulk, ghashData):
//   Z0-Z3    counter blocks, then keystream, then text, four blocks each
//   Z4-Z7    the other side's text (openBulk: the ciphertext read)
//   Z8-Z18   the 11 round keys, each in all four lanes
//   Z19      the byte-reversing shuffle, in all four lanes
//   Z20      the next four counters, byte-reversed (the counter in dword 0)
//   Z21      4 in dword 0 of each lane: the counters' step
//   Z22-Z25  key powers H^16..H^13, H^12..H^9, H^8..H^5, H^4..H^1
//   Z26      the hash, in lane 0 (other lanes zero)
//   Z27-Z30  a product's low, high and middle parts, and a temporary
//   Z31      the reduction's constant in every lane
// Go's operand order is Intel's reversed: VPCLMULQDQ $i, b, a, d is
// d = clmul(a's qword i&1, b's qword i>>4&1).

// bswapMask reverses a lane's 16 bytes.
DATA bswapMask<>+0x00(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+0x08(SB)/8, $0x0001020304050607
GLOBL bswapMask<>(SB), RODATA|NOPTR, $16

// polyConst holds the reduction's constant in its high qword (ghash.go).
DATA polyConst<>+0x00(SB)/8, $0x0000000000000001
DATA polyConst<>+0x08(SB)/8, $0xc200000000000000
GLOBL polyConst<>(SB), RODATA|NOPTR, $16

// laneInc is 0, 1, 2, 3 in dword 0 of the four lanes.
DATA laneInc<>+0x00(SB)/8, $0
DATA laneInc<>+0x08(SB)/8, $0
DATA laneInc<>+0x10(SB)/8, $1
DATA laneInc<>+0x18(SB)/8, $0
DATA laneInc<>+0x20(SB)/8, $2
DATA laneInc<>+0x28(SB)/8, $0
DATA laneInc<>+0x30(SB)/8, $3
DATA laneInc<>+0x38(SB)/8, $0
GLOBL laneInc<>(SB), RODATA|NOPTR, $64

// four is 4 in dword 0.
DATA four<>+0x00(SB)/8, $4
DATA four<>+0x08(SB)/8, $0
GLOBL four<>(SB), RODATA|NOPTR, $16

// BULKARGS loads the arguments of sealBulk and openBulk (one signature),
// then the constants, the key powers, the hash, the round keys and the
// counters (SETUP, KEYS below). It stands before every TEXT, where vet
// does not take its arguments for another function's.
#define BULKARGS \
	MOVQ rk+0(FP), AX; \
	MOVQ htab+8(FP), BX; \
	MOVQ ctr+16(FP), R8; \
	MOVQ acc+24(FP), DX; \
	MOVQ dst_base+32(FP), DI; \
	MOVQ src_base+56(FP), SI; \
	MOVQ src_len+64(FP), CX; \
	SETUP; \
	KEYS

// EXPAND is one step of AES-128's key schedule: X0 (the last round key)
// becomes the next, stored at off(DI).
#define EXPAND(rcon, off) \
	VAESKEYGENASSIST $rcon, X0, X1; \
	VPSHUFD          $0xff, X1, X1; \
	VPSLLDQ          $4, X0, X2; \
	VPXOR            X2, X0, X0; \
	VPSLLDQ          $4, X2, X2; \
	VPXOR            X2, X0, X0; \
	VPSLLDQ          $4, X2, X2; \
	VPXOR            X2, X0, X0; \
	VPXOR            X1, X0, X0; \
	VMOVDQU          X0, off(DI)

// func expandKey128(rk *[176]byte, key *[16]byte)
TEXT ·expandKey128(SB), NOSPLIT, $0-16
	MOVQ    rk+0(FP), DI
	MOVQ    key+8(FP), AX
	VMOVDQU (AX), X0
	VMOVDQU X0, (DI)
	EXPAND(0x01, 16)
	EXPAND(0x02, 32)
	EXPAND(0x04, 48)
	EXPAND(0x08, 64)
	EXPAND(0x10, 80)
	EXPAND(0x20, 96)
	EXPAND(0x40, 112)
	EXPAND(0x80, 128)
	EXPAND(0x1b, 144)
	EXPAND(0x36, 160)
	VPXOR   X0, X0, X0
	VPXOR   X1, X1, X1
	VPXOR   X2, X2, X2
	VZEROUPPER
	RET

// SETUP loads the constants, the key powers (htab in BX) and the hash
// (acc in DX).
#define SETUP \
	VBROADCASTI32X4 bswapMask<>(SB), Z19; \
	VBROADCASTI32X4 polyConst<>(SB), Z31; \
	VMOVDQU64       0(BX), Z22; \
	VMOVDQU64       64(BX), Z23; \
	VMOVDQU64       128(BX), Z24; \
	VMOVDQU64       192(BX), Z25; \
	VMOVDQU64       (DX), X26

// KEYS broadcasts the round keys (rk in AX) and sets the counters from
// the counter block at (R8).
#define KEYS \
	VBROADCASTI32X4 0(AX), Z8; \
	VBROADCASTI32X4 16(AX), Z9; \
	VBROADCASTI32X4 32(AX), Z10; \
	VBROADCASTI32X4 48(AX), Z11; \
	VBROADCASTI32X4 64(AX), Z12; \
	VBROADCASTI32X4 80(AX), Z13; \
	VBROADCASTI32X4 96(AX), Z14; \
	VBROADCASTI32X4 112(AX), Z15; \
	VBROADCASTI32X4 128(AX), Z16; \
	VBROADCASTI32X4 144(AX), Z17; \
	VBROADCASTI32X4 160(AX), Z18; \
	VBROADCASTI32X4 (R8), Z20; \
	VPSHUFB         Z19, Z20, Z20; \
	VPADDD          laneInc<>(SB), Z20, Z20; \
	VBROADCASTI32X4 four<>(SB), Z21

// CTR puts the next four counter blocks in r.
#define CTR(r) \
	VPSHUFB Z19, Z20, r; \
	VPADDD  Z21, Z20, Z20

// ROUND is one AES round (key k) on the four registers.
#define ROUND(k) \
	VAESENC k, Z0, Z0; \
	VAESENC k, Z1, Z1; \
	VAESENC k, Z2, Z2; \
	VAESENC k, Z3, Z3

// ENCRYPT4 encrypts Z0-Z3 in place.
#define ENCRYPT4 \
	VPXORQ      Z8, Z0, Z0; \
	VPXORQ      Z8, Z1, Z1; \
	VPXORQ      Z8, Z2, Z2; \
	VPXORQ      Z8, Z3, Z3; \
	ROUND(Z9); \
	ROUND(Z10); \
	ROUND(Z11); \
	ROUND(Z12); \
	ROUND(Z13); \
	ROUND(Z14); \
	ROUND(Z15); \
	ROUND(Z16); \
	ROUND(Z17); \
	VAESENCLAST Z18, Z0, Z0; \
	VAESENCLAST Z18, Z1, Z1; \
	VAESENCLAST Z18, Z2, Z2; \
	VAESENCLAST Z18, Z3, Z3

// ENCRYPT1 encrypts Z0 in place.
#define ENCRYPT1 \
	VPXORQ      Z8, Z0, Z0; \
	VAESENC     Z9, Z0, Z0; \
	VAESENC     Z10, Z0, Z0; \
	VAESENC     Z11, Z0, Z0; \
	VAESENC     Z12, Z0, Z0; \
	VAESENC     Z13, Z0, Z0; \
	VAESENC     Z14, Z0, Z0; \
	VAESENC     Z15, Z0, Z0; \
	VAESENC     Z16, Z0, Z0; \
	VAESENC     Z17, Z0, Z0; \
	VAESENCLAST Z18, Z0, Z0

// MUL sets Z27, Z28, Z29 to the low, high and middle parts of the
// lanewise carry-less products of x and p.
#define MUL(x, p) \
	VPCLMULQDQ $0x00, p, x, Z27; \
	VPCLMULQDQ $0x11, p, x, Z28; \
	VPCLMULQDQ $0x01, p, x, Z29; \
	VPCLMULQDQ $0x10, p, x, Z30; \
	VPXORQ     Z30, Z29, Z29

// MULADD adds the products of x and p to Z27, Z28, Z29.
#define MULADD(x, p) \
	VPCLMULQDQ $0x00, p, x, Z30; \
	VPXORQ     Z30, Z27, Z27; \
	VPCLMULQDQ $0x11, p, x, Z30; \
	VPXORQ     Z30, Z28, Z28; \
	VPCLMULQDQ $0x01, p, x, Z30; \
	VPXORQ     Z30, Z29, Z29; \
	VPCLMULQDQ $0x10, p, x, Z30; \
	VPXORQ     Z30, Z29, Z29

// REDUCE reduces each lane's product (Z27, Z28, Z29) and sets the hash
// Z26 to the four lanes' sum.
#define REDUCE \
	VPSLLDQ       $8, Z29, Z30; \
	VPXORQ        Z30, Z27, Z27; \
	VPSRLDQ       $8, Z29, Z30; \
	VPXORQ        Z30, Z28, Z28; \
	VPCLMULQDQ    $0x01, Z27, Z31, Z30; \
	VPSHUFD       $0x4e, Z27, Z27; \
	VPXORQ        Z30, Z27, Z27; \
	VPCLMULQDQ    $0x01, Z27, Z31, Z30; \
	VPSHUFD       $0x4e, Z27, Z27; \
	VPXORQ        Z30, Z27, Z27; \
	VPXORQ        Z28, Z27, Z27; \
	VEXTRACTI64X4 $1, Z27, Y30; \
	VPXORQ        Y30, Y27, Y27; \
	VEXTRACTI32X4 $1, Y27, X30; \
	VPXORQ        X30, X27, X26

// HASH4 hashes the 16 blocks of Z0-Z3 (in order) into Z26; it changes
// Z0-Z3.
#define HASH4(a, b, c, d) \
	VPSHUFB Z19, a, a; \
	VPSHUFB Z19, b, b; \
	VPSHUFB Z19, c, c; \
	VPSHUFB Z19, d, d; \
	VPXORQ  Z26, a, a; \
	MUL(a, Z22); \
	MULADD(b, Z23); \
	MULADD(c, Z24); \
	MULADD(d, Z25); \
	REDUCE

// TAILMASK sets R10 to min(CX, 64), the bytes of the register-sized
// piece at hand, K1 to its low R10 bits (by way of R12), and R11 to the
// offset in htab of the powers it multiplies by: H^m for its m blocks
// down to H^1, then whatever follows (the lanes past m are zero).
#define TAILMASK \
	MOVQ   CX, R10; \
	MOVQ   $64, R11; \
	CMPQ   R10, R11; \
	CMOVQHI R11, R10; \
	MOVQ   $-1, R11; \
	BZHIQ  R10, R11, R12; \
	KMOVQ  R12, K1; \
	LEAQ   15(R10), R11; \
	ANDQ   $-16, R11; \
	NEGQ   R11; \
	ADDQ   $256, R11

// HASH1 hashes the blocks of x (its bytes past K1's zeroed) into Z26
// with the powers at R11(BX); it changes x and Z4.
#define HASH1(x) \
	VMOVDQU8.Z x, K1, x; \
	VPSHUFB    Z19, x, x; \
	VPXORQ     Z26, x, x; \
	VMOVDQU64  (BX)(R11*1), Z4; \
	MUL(x, Z4); \
	REDUCE

// XORSTORE xors the 16 blocks at SI into Z0-Z3, stores them at DI and
// moves both on.
#define XORSTORE \
	VPXORQ    0(SI), Z0, Z0; \
	VPXORQ    64(SI), Z1, Z1; \
	VPXORQ    128(SI), Z2, Z2; \
	VPXORQ    192(SI), Z3, Z3; \
	VMOVDQU64 Z0, 0(DI); \
	VMOVDQU64 Z1, 64(DI); \
	VMOVDQU64 Z2, 128(DI); \
	VMOVDQU64 Z3, 192(DI); \
	ADDQ      $256, SI; \
	ADDQ      $256, DI

// CLEAR zeroes Z16-Z31 whole (VZEROUPPER leaves them): no dirty upper
// state and no round keys or key powers are left behind in them.
#define CLEAR \
	VPXORD X16, X16, X16; \
	VPXORD X17, X17, X17; \
	VPXORD X18, X18, X18; \
	VPXORD X19, X19, X19; \
	VPXORD X20, X20, X20; \
	VPXORD X21, X21, X21; \
	VPXORD X22, X22, X22; \
	VPXORD X23, X23, X23; \
	VPXORD X24, X24, X24; \
	VPXORD X25, X25, X25; \
	VPXORD X26, X26, X26; \
	VPXORD X27, X27, X27; \
	VPXORD X28, X28, X28; \
	VPXORD X29, X29, X29; \
	VPXORD X30, X30, X30; \
	VPXORD X31, X31, X31; \
	VZEROUPPER

// func ghashData(htab *[20][16]byte, acc *[16]byte, data []byte)
TEXT ·ghashData(SB), NOSPLIT, $0-40
	MOVQ htab+0(FP), BX
	MOVQ acc+8(FP), DX
	MOVQ data_base+16(FP), SI
	MOVQ data_len+24(FP), CX
	SETUP

ghloop:
	CMPQ      CX, $256
	JB        ghtail
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	HASH4(Z0, Z1, Z2, Z3)
	ADDQ      $256, SI
	SUBQ      $256, CX
	JMP       ghloop

ghtail:
	TESTQ      CX, CX
	JZ         ghdone
	TAILMASK
	VMOVDQU8.Z (SI), K1, Z0
	HASH1(Z0)
	ADDQ       R10, SI
	SUBQ       R10, CX
	JMP        ghtail

ghdone:
	VMOVDQU64 X26, (DX)
	CLEAR
	RET

// func sealBulk(rk *[176]byte, htab *[20][16]byte, ctr, acc *[16]byte, dst, src []byte)
TEXT ·sealBulk(SB), NOSPLIT, $0-80
	BULKARGS

	// The loop hashes the ciphertext of the iteration before while it
	// encrypts its own: the two are independent, so the hash's chain of
	// products does not wait for the encryption.
	CMPQ      CX, $256
	JB        sealtail
	CTR(Z0)
	CTR(Z1)
	CTR(Z2)
	CTR(Z3)
	ENCRYPT4
	XORSTORE
	SUBQ      $256, CX

sealloop:
	CMPQ      CX, $256
	JB        sealflush
	VMOVDQA64 Z0, Z4
	VMOVDQA64 Z1, Z5
	VMOVDQA64 Z2, Z6
	VMOVDQA64 Z3, Z7
	CTR(Z0)
	CTR(Z1)
	CTR(Z2)
	CTR(Z3)
	ENCRYPT4
	HASH4(Z4, Z5, Z6, Z7)
	XORSTORE
	SUBQ      $256, CX
	JMP       sealloop

sealflush:
	HASH4(Z0, Z1, Z2, Z3)

sealtail:
	TESTQ      CX, CX
	JZ         sealdone
	TAILMASK
	CTR(Z0)
	ENCRYPT1
	VMOVDQU8.Z (SI), K1, Z4
	VPXORQ     Z4, Z0, Z0
	VMOVDQU8   Z0, K1, (DI)
	HASH1(Z0)
	ADDQ       R10, SI
	ADDQ       R10, DI
	SUBQ       R10, CX
	JMP        sealtail

sealdone:
	VMOVDQU64 X26, (DX)
	CLEAR
	RET

// func openBulk(rk *[176]byte, htab *[20][16]byte, ctr, acc *[16]byte, dst, src []byte)
TEXT ·openBulk(SB), NOSPLIT, $0-80
	BULKARGS

openloop:
	CMPQ      CX, $256
	JB        opentail
	VMOVDQU64 0(SI), Z4
	VMOVDQU64 64(SI), Z5
	VMOVDQU64 128(SI), Z6
	VMOVDQU64 192(SI), Z7
	CTR(Z0)
	CTR(Z1)
	CTR(Z2)
	CTR(Z3)
	ENCRYPT4
	VPXORQ    Z4, Z0, Z0
	VPXORQ    Z5, Z1, Z1
	VPXORQ    Z6, Z2, Z2
	VPXORQ    Z7, Z3, Z3
	VMOVDQU64 Z0, 0(DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	HASH4(Z4, Z5, Z6, Z7)
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	JMP       openloop

opentail:
	TESTQ      CX, CX
	JZ         opendone
	TAILMASK
	VMOVDQU8.Z (SI), K1, Z5
	CTR(Z0)
	ENCRYPT1
	VPXORQ     Z5, Z0, Z0
	VMOVDQU8   Z0, K1, (DI)
	HASH1(Z5)
	ADDQ       R10, SI
	ADDQ       R10, DI
	SUBQ       R10, CX
	JMP        opentail

opendone:
	VMOVDQU64 X26, (DX)
	CLEAR
	RET
