package crc32c

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func pattern(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

// Update and UpdateCold are hash/crc32's CRC32C at every length,
// alignment and starting value (castagnoliFold where the CPU has it).
func TestUpdateIsCRC32C(t *testing.T) {
	if !hasFold {
		t.Log("no AVX-512 VPCLMULQDQ here: Update is hash/crc32's")
	}
	data := pattern(3*coldBlock+70000, 5)
	rng := rand.New(rand.NewPCG(7, 8))
	lens := []int{0, 1, 63, 64, 65, 255, 256, 257, 319, 320, 511, 512, 513, 767, 768, 1024,
		coldBlock - 1, coldBlock, coldBlock + 1, 3*coldBlock + 200, 65536, 70000}
	for range 300 {
		lens = append(lens, rng.IntN(len(data)-8))
	}
	for _, n := range lens {
		off := rng.IntN(8)
		p := data[off : off+n]
		for _, init := range []uint32{0, 0xffffffff, rng.Uint32()} {
			want := crc32.Update(init, table, p)
			if got := Update(init, p); got != want {
				t.Fatalf("Update(%#x, %d bytes at %d) = %#08x, want %#08x", init, n, off, got, want)
			}
			if got := UpdateCold(init, p); got != want {
				t.Fatalf("UpdateCold(%#x, %d bytes at %d) = %#08x, want %#08x", init, n, off, got, want)
			}
		}
	}
	// Chained over pieces, as the MPA receiver does (header, then payload).
	sum := Update(crc32.Update(0, table, data[:16]), data[16:70000])
	if want := crc32.Checksum(data[:70000], table); sum != want || Checksum(data[:70000]) != want {
		t.Fatalf("chained: %#08x, want %#08x", sum, want)
	}
}

// readAll loads every byte of p, 32 bytes a step in four independent
// sums, and nothing else: over memory not in cache, the floor for any
// pass over p, against which BenchmarkCold puts the CRC.
func readAll(s uint32, p []byte) uint32 {
	var a0, a1, a2, a3 uint64
	for ; len(p) >= 32; p = p[32:] {
		a0 += binary.LittleEndian.Uint64(p)
		a1 += binary.LittleEndian.Uint64(p[8:])
		a2 += binary.LittleEndian.Uint64(p[16:])
		a3 += binary.LittleEndian.Uint64(p[24:])
	}
	return s + uint32(a0^a1^a2^a3)
}

// BenchmarkCold: CRC32C of memory that is not in cache (a Read
// Response's source, a chunk past L2), in 64 KiB pieces; "read" is a
// plain pass over the same memory, the most a CRC can approach. On the
// 2-core VM (AMD EPYC, 2.6 GHz), two runs: read 25.0 and 24.7 GB/s,
// update 24.9 and 23.1, cold 24.1 and 21.7, hash/crc32 7.3 and 6.8: the
// fold over cold memory runs at 90-100% of the speed of reading it, so
// what the send side's CRC costs (0.04-0.05 s/GB) is one pass over
// memory, not the CRC's arithmetic.
func BenchmarkCold(b *testing.B) {
	const total, piece = 256 << 20, 64 << 10
	buf := pattern(total, 3)
	for _, tc := range []struct {
		name string
		fn   func(uint32, []byte) uint32
	}{
		{"hash-crc32", func(s uint32, p []byte) uint32 { return crc32.Update(s, table, p) }},
		{"update", Update},
		{"cold", UpdateCold},
		{"read", readAll},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(total)
			for b.Loop() {
				var s uint32
				for off := 0; off+piece <= total; off += piece {
					s = tc.fn(s, buf[off:off+piece])
				}
			}
		})
	}
}

// BenchmarkHot: one FPDU's payload in cache. On the 2-core VM: update
// 50-57 GB/s (about 20 bytes a cycle at 2.6 GHz), hash/crc32 26 GB/s;
// the receiver's CRC of payloads just placed, 7.5-9% of the initiator's
// CPU in a profile of rdmacp bench, is this.
func BenchmarkHot(b *testing.B) {
	p := pattern(64<<10, 3)
	for _, tc := range []struct {
		name string
		fn   func(uint32, []byte) uint32
	}{
		{"hash-crc32", func(s uint32, p []byte) uint32 { return crc32.Update(s, table, p) }},
		{"update", Update},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				tc.fn(0, p)
			}
		})
	}
}
