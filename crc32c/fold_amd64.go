package crc32c

import "golang.org/x/sys/cpu"

// castagnoliFold is CRC32C by carry-less multiplication, 256 bytes a
// step in four AVX-512 accumulators (crcfold_amd64.s): several times
// the speed of hash/crc32's, which uses only the crc32 instruction on
// amd64. len(p) must be at least 256 and a multiple of 64.
//
//go:noescape
func castagnoliFold(crc uint32, p []byte) uint32

var hasFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42
