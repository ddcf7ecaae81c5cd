//go:build amd64 && !purego

#include "textflag.h"

// Each loop takes 16 values an iteration, two registers of 8, except
// the pooling loops, which take 8 channels: n is a multiple of 16
// (bulk), c of 8 in the loops over rows of windows. The operations are Go's, one rounding each, in Go's
// order (vec.go); in Go's assembly VSUBPS b, a, d is d = a - b.

// func momentumSumAVX2(p, v, acc, grad *float32, n int, mu, lr, scale float32)
TEXT ·momentumSumAVX2(SB), NOSPLIT, $0-52
	MOVQ         p+0(FP), DI
	MOVQ         v+8(FP), SI
	MOVQ         acc+16(FP), DX
	MOVQ         grad+24(FP), BX
	MOVQ         n+32(FP), CX
	VBROADCASTSS mu+40(FP), Y0
	VBROADCASTSS lr+44(FP), Y1
	VBROADCASTSS scale+48(FP), Y2
	VXORPS       Y3, Y3, Y3
	XORQ         AX, AX

msloop:
	CMPQ    AX, CX
	JAE     msdone
	VMOVUPS (DX)(AX*4), Y4      // acc
	VMOVUPS 32(DX)(AX*4), Y5
	VADDPS  (BX)(AX*4), Y4, Y4  // acc + g
	VADDPS  32(BX)(AX*4), Y5, Y5
	VMULPS  Y2, Y4, Y4          // scale*(acc + g)
	VMULPS  Y2, Y5, Y5
	VMOVUPS (SI)(AX*4), Y6      // v
	VMOVUPS 32(SI)(AX*4), Y7
	VMULPS  Y0, Y6, Y6          // mu*v
	VMULPS  Y0, Y7, Y7
	VADDPS  Y4, Y6, Y6          // mu*v + scale*(acc + g)
	VADDPS  Y5, Y7, Y7
	VMOVUPS Y6, (SI)(AX*4)
	VMOVUPS Y7, 32(SI)(AX*4)
	VMULPS  Y1, Y6, Y6          // lr*v
	VMULPS  Y1, Y7, Y7
	VMOVUPS (DI)(AX*4), Y8      // p
	VMOVUPS 32(DI)(AX*4), Y9
	VSUBPS  Y6, Y8, Y8          // p - lr*v
	VSUBPS  Y7, Y9, Y9
	VMOVUPS Y8, (DI)(AX*4)
	VMOVUPS Y9, 32(DI)(AX*4)
	VMOVUPS Y3, (DX)(AX*4)      // acc = 0
	VMOVUPS Y3, 32(DX)(AX*4)
	ADDQ    $16, AX
	JMP     msloop

msdone:
	VZEROUPPER
	RET

// func momentumAVX2(p, v, grad *float32, n int, mu, lr, scale float32)
TEXT ·momentumAVX2(SB), NOSPLIT, $0-44
	MOVQ         p+0(FP), DI
	MOVQ         v+8(FP), SI
	MOVQ         grad+16(FP), BX
	MOVQ         n+24(FP), CX
	VBROADCASTSS mu+32(FP), Y0
	VBROADCASTSS lr+36(FP), Y1
	VBROADCASTSS scale+40(FP), Y2
	XORQ         AX, AX

mloop:
	CMPQ    AX, CX
	JAE     mdone
	VMOVUPS (BX)(AX*4), Y4      // g
	VMOVUPS 32(BX)(AX*4), Y5
	VMULPS  Y2, Y4, Y4          // scale*g
	VMULPS  Y2, Y5, Y5
	VMOVUPS (SI)(AX*4), Y6      // v
	VMOVUPS 32(SI)(AX*4), Y7
	VMULPS  Y0, Y6, Y6          // mu*v
	VMULPS  Y0, Y7, Y7
	VADDPS  Y4, Y6, Y6          // mu*v + scale*g
	VADDPS  Y5, Y7, Y7
	VMOVUPS Y6, (SI)(AX*4)
	VMOVUPS Y7, 32(SI)(AX*4)
	VMULPS  Y1, Y6, Y6          // lr*v
	VMULPS  Y1, Y7, Y7
	VMOVUPS (DI)(AX*4), Y8      // p
	VMOVUPS 32(DI)(AX*4), Y9
	VSUBPS  Y6, Y8, Y8          // p - lr*v
	VSUBPS  Y7, Y9, Y9
	VMOVUPS Y8, (DI)(AX*4)
	VMOVUPS Y9, 32(DI)(AX*4)
	ADDQ    $16, AX
	JMP     mloop

mdone:
	VZEROUPPER
	RET

// func addAVX2(dst, src *float32, n int)
TEXT ·addAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX

aloop:
	CMPQ    AX, CX
	JAE     adone
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VADDPS  (SI)(AX*4), Y0, Y0
	VADDPS  32(SI)(AX*4), Y1, Y1
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	ADDQ    $16, AX
	JMP     aloop

adone:
	VZEROUPPER
	RET

// func sumSquaresAVX2(x *float32, n int, l *[16]float64)
// Y0..Y3 are the partial sums of lanes 0-3, 4-7, 8-11 and 12-15, going
// on from l's: lane k adds the squares of values k, k+16, k+32, ... in
// that order, each widened to float64 first, as sumSquaresGo does.
TEXT ·sumSquaresAVX2(SB), NOSPLIT, $0-24
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	MOVQ    l+16(FP), DI
	VMOVUPD (DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	XORQ    AX, AX

sloop:
	CMPQ      AX, CX
	JAE       sdone
	VCVTPS2PD (SI)(AX*4), Y4
	VCVTPS2PD 16(SI)(AX*4), Y5
	VCVTPS2PD 32(SI)(AX*4), Y6
	VCVTPS2PD 48(SI)(AX*4), Y7
	VMULPD    Y4, Y4, Y4
	VMULPD    Y5, Y5, Y5
	VMULPD    Y6, Y6, Y6
	VMULPD    Y7, Y7, Y7
	VADDPD    Y4, Y0, Y0
	VADDPD    Y5, Y1, Y1
	VADDPD    Y6, Y2, Y2
	VADDPD    Y7, Y3, Y3
	ADDQ      $16, AX
	JMP       sloop

sdone:
	VMOVUPD Y0, (DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VZEROUPPER
	RET

// func addReLUAVX2(x, bias *float32, n int)
// v = x + bias; x = v with its bits cleared where v < 0 (ordered: a NaN
// stays).
TEXT ·addReLUAVX2(SB), NOSPLIT, $0-24
	MOVQ   x+0(FP), DI
	MOVQ   bias+8(FP), SI
	MOVQ   n+16(FP), CX
	VXORPS Y15, Y15, Y15
	XORQ   AX, AX

rloop:
	CMPQ    AX, CX
	JAE     rdone
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VADDPS  (SI)(AX*4), Y0, Y0
	VADDPS  32(SI)(AX*4), Y1, Y1
	VCMPPS  $1, Y15, Y0, Y2     // v < 0 (LT_OS)
	VCMPPS  $1, Y15, Y1, Y3
	VANDNPS Y0, Y2, Y0          // v &^ mask
	VANDNPS Y1, Y3, Y1
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	ADDQ    $16, AX
	JMP     rloop

rdone:
	VZEROUPPER
	RET

// func maskAVX2(d, act *float32, n int)
// d's bits cleared where act <= 0 (ordered: a NaN keeps d).
TEXT ·maskAVX2(SB), NOSPLIT, $0-24
	MOVQ   d+0(FP), DI
	MOVQ   act+8(FP), SI
	MOVQ   n+16(FP), CX
	VXORPS Y15, Y15, Y15
	XORQ   AX, AX

kloop:
	CMPQ    AX, CX
	JAE     kdone
	VMOVUPS (SI)(AX*4), Y0
	VMOVUPS 32(SI)(AX*4), Y1
	VCMPPS  $2, Y15, Y0, Y2     // act <= 0 (LE_OS)
	VCMPPS  $2, Y15, Y1, Y3
	VANDNPS (DI)(AX*4), Y2, Y0  // d &^ mask
	VANDNPS 32(DI)(AX*4), Y3, Y1
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	ADDQ    $16, AX
	JMP     kloop

kdone:
	VZEROUPPER
	RET

// func pixelsAVX2(dst *float32, src *uint8, n int, div float32)
// dst = float32(src) / div: bytes widened to int32, converted exactly,
// then one correctly rounded division, as Go's float32(b) / 255.
TEXT ·pixelsAVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS div+24(FP), Y15
	XORQ         AX, AX

ploop:
	CMPQ      AX, CX
	JAE       pdone
	VPMOVZXBD (SI)(AX*1), Y0
	VPMOVZXBD 8(SI)(AX*1), Y1
	VCVTDQ2PS Y0, Y0
	VCVTDQ2PS Y1, Y1
	VDIVPS    Y15, Y0, Y0
	VDIVPS    Y15, Y1, Y1
	VMOVUPS   Y0, (DI)(AX*4)
	VMOVUPS   Y1, 32(DI)(AX*4)
	ADDQ      $16, AX
	JMP       ploop

pdone:
	VZEROUPPER
	RET

// func momentumStepAVX2(p, v, grad, sum, out *float32, n int, mu, lr, scale float32, stream int)
// momentumAVX2's update with, in the same pass, sum += g (before g is
// scaled) and out = the updated p.
TEXT ·momentumStepAVX2(SB), NOSPLIT, $0-72
	MOVQ         p+0(FP), DI
	MOVQ         v+8(FP), SI
	MOVQ         grad+16(FP), BX
	MOVQ         sum+24(FP), R8
	MOVQ         out+32(FP), R9
	MOVQ         n+40(FP), CX
	MOVQ         stream+64(FP), R10
	VBROADCASTSS mu+48(FP), Y0
	VBROADCASTSS lr+52(FP), Y1
	VBROADCASTSS scale+56(FP), Y2
	XORQ         AX, AX

tloop:
	CMPQ    AX, CX
	JAE     tdone
	VMOVUPS (BX)(AX*4), Y4      // g
	VMOVUPS 32(BX)(AX*4), Y5
	VMOVUPS (R8)(AX*4), Y10     // sum
	VMOVUPS 32(R8)(AX*4), Y11
	VADDPS  Y4, Y10, Y10        // sum + g
	VADDPS  Y5, Y11, Y11
	VMOVUPS Y10, (R8)(AX*4)
	VMOVUPS Y11, 32(R8)(AX*4)
	VMULPS  Y2, Y4, Y4          // scale*g
	VMULPS  Y2, Y5, Y5
	VMOVUPS (SI)(AX*4), Y6      // v
	VMOVUPS 32(SI)(AX*4), Y7
	VMULPS  Y0, Y6, Y6          // mu*v
	VMULPS  Y0, Y7, Y7
	VADDPS  Y4, Y6, Y6          // mu*v + scale*g
	VADDPS  Y5, Y7, Y7
	VMOVUPS Y6, (SI)(AX*4)
	VMOVUPS Y7, 32(SI)(AX*4)
	VMULPS  Y1, Y6, Y6          // lr*v
	VMULPS  Y1, Y7, Y7
	VMOVUPS (DI)(AX*4), Y8      // p
	VMOVUPS 32(DI)(AX*4), Y9
	VSUBPS  Y6, Y8, Y8          // p - lr*v
	VSUBPS  Y7, Y9, Y9
	VMOVUPS Y8, (DI)(AX*4)
	VMOVUPS Y9, 32(DI)(AX*4)
	TESTQ   R10, R10
	JNZ     tstream
	VMOVUPS Y8, (R9)(AX*4)      // out = p
	VMOVUPS Y9, 32(R9)(AX*4)
	ADDQ    $16, AX
	JMP     tloop

tstream:
	VMOVNTPS Y8, (R9)(AX*4)     // out = p, past the caches
	VMOVNTPS Y9, 32(R9)(AX*4)
	ADDQ    $16, AX
	JMP     tloop

tdone:
	SFENCE
	VZEROUPPER
	RET

// func momentumSumStepAVX2(p, v, acc, grad, sum, out *float32, n int, mu, lr, scale float32, stream int)
// momentumSumAVX2's update with, in the same pass, sum += g and out =
// the updated p.
TEXT ·momentumSumStepAVX2(SB), NOSPLIT, $0-80
	MOVQ         p+0(FP), DI
	MOVQ         v+8(FP), SI
	MOVQ         acc+16(FP), DX
	MOVQ         grad+24(FP), BX
	MOVQ         sum+32(FP), R8
	MOVQ         out+40(FP), R9
	MOVQ         n+48(FP), CX
	MOVQ         stream+72(FP), R10
	VBROADCASTSS mu+56(FP), Y0
	VBROADCASTSS lr+60(FP), Y1
	VBROADCASTSS scale+64(FP), Y2
	VXORPS       Y3, Y3, Y3
	XORQ         AX, AX

uloop:
	CMPQ    AX, CX
	JAE     udone
	VMOVUPS (BX)(AX*4), Y12     // g
	VMOVUPS 32(BX)(AX*4), Y13
	VMOVUPS (R8)(AX*4), Y10     // sum
	VMOVUPS 32(R8)(AX*4), Y11
	VADDPS  Y12, Y10, Y10       // sum + g
	VADDPS  Y13, Y11, Y11
	VMOVUPS Y10, (R8)(AX*4)
	VMOVUPS Y11, 32(R8)(AX*4)
	VMOVUPS (DX)(AX*4), Y4      // acc
	VMOVUPS 32(DX)(AX*4), Y5
	VADDPS  Y12, Y4, Y4         // acc + g
	VADDPS  Y13, Y5, Y5
	VMULPS  Y2, Y4, Y4          // scale*(acc + g)
	VMULPS  Y2, Y5, Y5
	VMOVUPS (SI)(AX*4), Y6      // v
	VMOVUPS 32(SI)(AX*4), Y7
	VMULPS  Y0, Y6, Y6          // mu*v
	VMULPS  Y0, Y7, Y7
	VADDPS  Y4, Y6, Y6          // mu*v + scale*(acc + g)
	VADDPS  Y5, Y7, Y7
	VMOVUPS Y6, (SI)(AX*4)
	VMOVUPS Y7, 32(SI)(AX*4)
	VMULPS  Y1, Y6, Y6          // lr*v
	VMULPS  Y1, Y7, Y7
	VMOVUPS (DI)(AX*4), Y8      // p
	VMOVUPS 32(DI)(AX*4), Y9
	VSUBPS  Y6, Y8, Y8          // p - lr*v
	VSUBPS  Y7, Y9, Y9
	VMOVUPS Y8, (DI)(AX*4)
	VMOVUPS Y9, 32(DI)(AX*4)
	TESTQ   R10, R10
	JNZ     ustream
	VMOVUPS Y8, (R9)(AX*4)      // out = p
	VMOVUPS Y9, 32(R9)(AX*4)
	VMOVUPS Y3, (DX)(AX*4)      // acc = 0
	VMOVUPS Y3, 32(DX)(AX*4)
	ADDQ    $16, AX
	JMP     uloop

ustream:
	VMOVNTPS Y8, (R9)(AX*4)     // out = p, past the caches
	VMOVNTPS Y9, 32(R9)(AX*4)
	VMOVUPS Y3, (DX)(AX*4)      // acc = 0
	VMOVUPS Y3, 32(DX)(AX*4)
	ADDQ    $16, AX
	JMP     uloop

udone:
	SFENCE
	VZEROUPPER
	RET

// func addBothAVX2(a, b, src *float32, n int)
// a += src and b += src in one pass over src.
TEXT ·addBothAVX2(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), DI
	MOVQ b+8(FP), DX
	MOVQ src+16(FP), SI
	MOVQ n+24(FP), CX
	XORQ AX, AX

bloop:
	CMPQ    AX, CX
	JAE     bdone
	VMOVUPS (SI)(AX*4), Y4      // src
	VMOVUPS 32(SI)(AX*4), Y5
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VADDPS  Y4, Y0, Y0          // a + src
	VADDPS  Y5, Y1, Y1
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS (DX)(AX*4), Y2
	VMOVUPS 32(DX)(AX*4), Y3
	VADDPS  Y4, Y2, Y2          // b + src
	VADDPS  Y5, Y3, Y3
	VMOVUPS Y2, (DX)(AX*4)
	VMOVUPS Y3, 32(DX)(AX*4)
	ADDQ    $16, AX
	JMP     bloop

bdone:
	VZEROUPPER
	RET

// iota<> is 0, 1, ..., 7 as int32s: the channel offsets of 8 lanes.
DATA iota<>+0(SB)/4, $0
DATA iota<>+4(SB)/4, $1
DATA iota<>+8(SB)/4, $2
DATA iota<>+12(SB)/4, $3
DATA iota<>+16(SB)/4, $4
DATA iota<>+20(SB)/4, $5
DATA iota<>+24(SB)/4, $6
DATA iota<>+28(SB)/4, $7
GLOBL iota<>(SB), RODATA|NOPTR, $32

DATA eight<>+0(SB)/4, $8
GLOBL eight<>(SB), RODATA|NOPTR, $4

// func maxPoolRowAVX2(out, bias, pool *float32, arg *int32, w int, base, c, row int32)
// MaxPoolRow, 8 channels an iteration of each of w windows (the next
// window's positions 2c values on, its pooled values c on, its base 2c
// more): each later position's values replace the best so far where
// greater (VCMPPS GT_OQ: false for a NaN on either side), the offsets
// alike; then max(best+bias, 0) as Go's max computes it (a NaN stays,
// -0 becomes +0).
TEXT ·maxPoolRowAVX2(SB), NOSPLIT, $0-52
	MOVQ         out+0(FP), DI        // the window's top left
	MOVQ         bias+8(FP), R9
	MOVQ         pool+16(FP), R10
	MOVQ         arg+24(FP), R11
	MOVQ         w+32(FP), BX
	MOVLQSX      c+44(FP), CX
	MOVLQSX      row+48(FP), R13
	VBROADCASTSS c+44(FP), Y14        // offset of the top right (the int32's bits)
	VBROADCASTSS row+48(FP), Y13      // of the bottom left
	VPADDD       Y14, Y13, Y12        // of the bottom right
	VBROADCASTSS base+40(FP), Y9      // the window's base
	VPADDD       Y14, Y14, Y8         // 2c: from a window's base to the next's
	VBROADCASTSS eight<>(SB), Y10
	VXORPS       Y0, Y0, Y0

mrwin:
	TESTQ  BX, BX
	JZ     mrdone
	LEAQ   (DI)(CX*4), SI         // top right
	LEAQ   (DI)(R13*4), DX        // bottom left
	LEAQ   (DX)(CX*4), R8         // bottom right
	VPADDD iota<>(SB), Y9, Y11    // base+j for the first 8 lanes
	XORQ   AX, AX

mrloop:
	CMPQ      AX, CX
	JAE       mrnext
	VMOVUPS   (DI)(AX*4), Y1        // best: top left
	VPXOR     Y2, Y2, Y2            // its offset: 0
	VMOVUPS   (SI)(AX*4), Y3
	VCMPPS    $0x1e, Y1, Y3, Y4     // top right > best
	VBLENDVPS Y4, Y3, Y1, Y1
	VBLENDVPS Y4, Y14, Y2, Y2
	VMOVUPS   (DX)(AX*4), Y3
	VCMPPS    $0x1e, Y1, Y3, Y4     // bottom left > best
	VBLENDVPS Y4, Y3, Y1, Y1
	VBLENDVPS Y4, Y13, Y2, Y2
	VMOVUPS   (R8)(AX*4), Y3
	VCMPPS    $0x1e, Y1, Y3, Y4     // bottom right > best
	VBLENDVPS Y4, Y3, Y1, Y1
	VBLENDVPS Y4, Y12, Y2, Y2
	VADDPS    (R9)(AX*4), Y1, Y1    // + bias
	VMAXPS    Y1, Y0, Y1            // max(0, x): x where x is a NaN or a zero
	VADDPS    Y0, Y1, Y1            // -0 + 0 = +0
	VMOVUPS   Y1, (R10)(AX*4)
	VPADDD    Y11, Y2, Y2           // base + j + offset
	VMOVDQU   Y2, (R11)(AX*4)
	VPADDD    Y10, Y11, Y11
	ADDQ      $8, AX
	JMP       mrloop

mrnext:
	LEAQ   (DI)(CX*8), DI         // 2c values on
	LEAQ   (R10)(CX*4), R10
	LEAQ   (R11)(CX*4), R11
	VPADDD Y8, Y9, Y9
	DECQ   BX
	JMP    mrwin

mrdone:
	VZEROUPPER
	RET

// func unpoolRowAVX2(dPool, pool *float32, arg *int32, dOut, dBias *float32, w int, base, c, row int32)
// UnpoolRow, 8 channels an iteration of each of w windows: the gradient
// masked by pool > 0 (VCMPPS GT_OQ: false for a NaN), added into dBias,
// and stored masked by offset == 0, c, row, row+c (VPCMPEQD) into each
// of the window's four positions.
TEXT ·unpoolRowAVX2(SB), NOSPLIT, $0-60
	MOVQ         dPool+0(FP), DI
	MOVQ         pool+8(FP), SI
	MOVQ         arg+16(FP), DX
	MOVQ         dOut+24(FP), R8      // the window's top left
	MOVQ         dBias+32(FP), R12
	MOVQ         w+40(FP), BX
	MOVLQSX      c+52(FP), CX
	MOVLQSX      row+56(FP), R13
	VBROADCASTSS c+52(FP), Y14        // offset of the top right (the int32's bits)
	VBROADCASTSS row+56(FP), Y13      // of the bottom left
	VPADDD       Y14, Y13, Y12        // of the bottom right
	VBROADCASTSS base+48(FP), Y9      // the window's base
	VPADDD       Y14, Y14, Y8         // 2c
	VBROADCASTSS eight<>(SB), Y10
	VXORPS       Y0, Y0, Y0

urwin:
	TESTQ  BX, BX
	JZ     urdone
	LEAQ   (R8)(CX*4), R9         // top right
	LEAQ   (R8)(R13*4), R10       // bottom left
	LEAQ   (R10)(CX*4), R11       // bottom right
	VPADDD iota<>(SB), Y9, Y11    // base+j for the first 8 lanes
	XORQ   AX, AX

urloop:
	CMPQ     AX, CX
	JAE      urnext
	VMOVUPS  (SI)(AX*4), Y1
	VCMPPS   $0x1e, Y0, Y1, Y2    // pool > 0
	VANDPS   (DI)(AX*4), Y2, Y3   // the gradient where it passed, else +0
	VMOVUPS  (R12)(AX*4), Y4
	VADDPS   Y3, Y4, Y4           // dBias + g
	VMOVUPS  Y4, (R12)(AX*4)
	VMOVDQU  (DX)(AX*4), Y5
	VPSUBD   Y11, Y5, Y5          // arg - base - j: the offset
	VPCMPEQD Y0, Y5, Y6           // == 0
	VPAND    Y3, Y6, Y6
	VMOVUPS  Y6, (R8)(AX*4)
	VPCMPEQD Y14, Y5, Y6          // == c
	VPAND    Y3, Y6, Y6
	VMOVUPS  Y6, (R9)(AX*4)
	VPCMPEQD Y13, Y5, Y6          // == row
	VPAND    Y3, Y6, Y6
	VMOVUPS  Y6, (R10)(AX*4)
	VPCMPEQD Y12, Y5, Y6          // == row + c
	VPAND    Y3, Y6, Y6
	VMOVUPS  Y6, (R11)(AX*4)
	VPADDD   Y10, Y11, Y11
	ADDQ     $8, AX
	JMP      urloop

urnext:
	LEAQ   (DI)(CX*4), DI
	LEAQ   (SI)(CX*4), SI
	LEAQ   (DX)(CX*4), DX
	LEAQ   (R8)(CX*8), R8         // 2c values on
	VPADDD Y8, Y9, Y9
	DECQ   BX
	JMP    urwin

urdone:
	VZEROUPPER
	RET
