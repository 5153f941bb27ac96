package chunker

import (
	"hash/crc32"
	"testing"

	"github.com/rdmacp/rdmacp/crc32c"
)

var sink byte

// BenchmarkChunkCRC is a chunk's CRC32C as the fetch's verify sees it:
// 4 MiB just written by a copy, past L2; plain Go against crc32c.UpdateCold.
func BenchmarkChunkCRC(b *testing.B) {
	const n = 4 << 20
	src := make([]byte, 64<<20)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, 64<<20)
	for _, touched := range []bool{false, true} {
		name := "plain"
		if touched {
			name = "touched"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(n)
			off := 0
			for b.Loop() {
				b.StopTimer()
				off = (off + n) % len(dst)
				copy(dst[off:off+n], src[off:off+n])
				b.StartTimer()
				p := dst[off : off+n]
				var s uint32
				if touched {
					s = crc32c.UpdateCold(0, p)
				} else {
					s = crc32.Update(0, castagnoli, p)
				}
				sink += byte(s)
			}
		})
	}
}
