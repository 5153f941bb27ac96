#include "textflag.h"

// Fold constants for CRC32C (reflected, Castagnoli): for a fold forward
// by D bits, the low qword of a 128-bit lane is multiplied by
// reverse32(x^(D+32) mod P) << 1 and the high one by
// reverse32(x^(D-32) mod P) << 1 (checked by TestCRCFoldConstants).
DATA k2048<>+0(SB)/8, $0x0dcb17aa4
DATA k2048<>+8(SB)/8, $0x0b9e02b86
GLOBL k2048<>(SB), RODATA|NOPTR, $16
DATA k512<>+0(SB)/8, $0x0740eef02
DATA k512<>+8(SB)/8, $0x09e4addf8
GLOBL k512<>(SB), RODATA|NOPTR, $16
DATA k384<>+0(SB)/8, $0x01c291d04
DATA k384<>+8(SB)/8, $0x1d82c63da
GLOBL k384<>(SB), RODATA|NOPTR, $16
DATA k256<>+0(SB)/8, $0x1384aa63a
DATA k256<>+8(SB)/8, $0x0ba4fc28e
GLOBL k256<>(SB), RODATA|NOPTR, $16
DATA k128<>+0(SB)/8, $0x0f20c0dfe
DATA k128<>+8(SB)/8, $0x14cd00bd6
GLOBL k128<>(SB), RODATA|NOPTR, $16

// func castagnoliFold(crc uint32, p []byte) uint32
// len(p) >= 256 and a multiple of 64. crc and the result are in
// hash/crc32's convention (inverted on the way in and out).
TEXT ·castagnoliFold(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	NOTL AX

	// Four 512-bit accumulators: 256 bytes, the CRC register xored
	// into the first 4.
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X5
	VPXORQ    Z5, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	VBROADCASTI32X4 k2048<>(SB), Z4

loop256:
	CMPQ CX, $256
	JB   fold4
	VPCLMULQDQ $0x00, Z4, Z0, Z6
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VMOVDQU64  0(SI), Z7
	VPTERNLOGD $0x96, Z6, Z7, Z0
	VPCLMULQDQ $0x00, Z4, Z1, Z8
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VMOVDQU64  64(SI), Z9
	VPTERNLOGD $0x96, Z8, Z9, Z1
	VPCLMULQDQ $0x00, Z4, Z2, Z10
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VMOVDQU64  128(SI), Z11
	VPTERNLOGD $0x96, Z10, Z11, Z2
	VPCLMULQDQ $0x00, Z4, Z3, Z12
	VPCLMULQDQ $0x11, Z4, Z3, Z3
	VMOVDQU64  192(SI), Z13
	VPTERNLOGD $0x96, Z12, Z13, Z3
	ADDQ       $256, SI
	SUBQ       $256, CX
	JMP        loop256

fold4:
	// Z0 into Z1 into Z2 into Z3, 512 bits apart.
	VBROADCASTI32X4 k512<>(SB), Z4
	VPCLMULQDQ $0x00, Z4, Z0, Z6
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VPTERNLOGD $0x96, Z6, Z0, Z1
	VPCLMULQDQ $0x00, Z4, Z1, Z6
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VPTERNLOGD $0x96, Z6, Z1, Z2
	VPCLMULQDQ $0x00, Z4, Z2, Z6
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VPTERNLOGD $0x96, Z6, Z2, Z3

loop64:
	CMPQ CX, $64
	JB   lanes
	VPCLMULQDQ $0x00, Z4, Z3, Z6
	VPCLMULQDQ $0x11, Z4, Z3, Z3
	VMOVDQU64  0(SI), Z7
	VPTERNLOGD $0x96, Z6, Z7, Z3
	ADDQ       $64, SI
	SUBQ       $64, CX
	JMP        loop64

lanes:
	// The four 128-bit lanes of Z3 into one, 384, 256 and 128 bits on.
	VEXTRACTI32X4 $1, Z3, X1
	VEXTRACTI32X4 $2, Z3, X2
	VEXTRACTI32X4 $3, Z3, X8
	VMOVDQU    k384<>(SB), X4
	VPCLMULQDQ $0x00, X4, X3, X6
	VPCLMULQDQ $0x11, X4, X3, X7
	VPXOR      X6, X8, X8
	VPXOR      X7, X8, X8
	VMOVDQU    k256<>(SB), X4
	VPCLMULQDQ $0x00, X4, X1, X6
	VPCLMULQDQ $0x11, X4, X1, X7
	VPXOR      X6, X8, X8
	VPXOR      X7, X8, X8
	VMOVDQU    k128<>(SB), X4
	VPCLMULQDQ $0x00, X4, X2, X6
	VPCLMULQDQ $0x11, X4, X2, X7
	VPXOR      X6, X8, X8
	VPXOR      X7, X8, X8

	// The CRC register of the whole is that of these 16 bytes from 0.
	VMOVQ  X8, AX
	VPEXTRQ $1, X8, BX
	XORL   DX, DX
	CRC32Q AX, DX
	CRC32Q BX, DX
	NOTL   DX
	MOVL   DX, ret+32(FP)
	VZEROUPPER
	RET
