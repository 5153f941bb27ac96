package target

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// BenchmarkWalkSmallFiles is the target's per-file path of a tree copy of
// small files alone: a walk of 10,000 files of 512 B (100 directories, in
// tmpfs where there is one), each file made into an entry, opened,
// statted, read, statted again, summed and closed, as walkBatch and fill
// do, without the session and its windows:
//
//	go test -run '^$' -bench WalkSmallFiles -benchmem ./target
func BenchmarkWalkSmallFiles(b *testing.B) {
	const files, size = 10000, 512
	dir, err := os.MkdirTemp("/dev/shm", "rdmacp-bench-")
	if err != nil {
		dir = b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	data := make([]byte, size)
	for i := range files {
		d := filepath.Join(dir, "tree", fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	x := testExport(b, dir)
	buf := make([]byte, size)
	sums := make([]byte, 4*files)
	b.SetBytes(files * size)
	b.ReportAllocs()
	for b.Loop() {
		w, err := newWalker(x, "tree", &protocol.Walk{Path: "data/tree", PackMax: 4096, Algorithm: uint8(chunker.CRC32C)}, 32<<20)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		var we walkEntry
		for w.next(&we) {
			if !we.e.Packed {
				continue
			}
			err := readFull(we.pk.fd, buf[:we.pk.size])
			var st unix.Stat_t
			if err == nil {
				err = unix.Fstat(we.pk.fd, &st)
			}
			if err != nil {
				b.Fatal(err)
			}
			we.e.Digest = chunker.AppendSum(sums[4*n:4*n:4*n+4], chunker.CRC32C, buf[:we.pk.size]) // fill's one slice a batch
			unix.Close(we.pk.fd)
			n++
		}
		w.close()
		if n != files {
			b.Fatalf("%d files packed, want %d", n, files)
		}
	}
}
