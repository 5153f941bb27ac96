package initiator

import (
	"fmt"
	"os"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
)

// BenchmarkWriteSmall is the landing of one packed small file alone (its
// create, write, mtime and close), the per-file cost of a tree copy of
// small files once the bytes are verified, into a directory in tmpfs
// where there is one:
//
//	go test -run '^$' -bench WriteSmall ./initiator
func BenchmarkWriteSmall(b *testing.B) {
	for _, size := range []int{512, 4 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			d, err := os.MkdirTemp("/dev/shm", "rdmacp-bench-")
			if err != nil {
				d = b.TempDir()
			}
			b.Cleanup(func() { os.RemoveAll(d) })
			dir, err := os.Open(d)
			if err != nil {
				b.Fatal(err)
			}
			defer dir.Close()
			data := make([]byte, size)
			e := protocol.Entry{Type: protocol.FileRegular, Mode: 0o644, Size: uint64(size), MtimeNs: 1_600_000_000_123_456_789}
			b.SetBytes(int64(size))
			n := 0
			for b.Loop() {
				if err := writeSmall(dir, fmt.Sprintf("f%07d", n), e, data); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.StopTimer()
			fi, err := os.Stat(fmt.Sprintf("%s/f%07d", d, n-1))
			if err != nil || fi.ModTime().UnixNano() != e.MtimeNs || fi.Size() != int64(size) {
				b.Fatalf("last file: %v, %v", fi, err)
			}
		})
	}
}
