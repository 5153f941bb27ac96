package tree_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
)

// BenchmarkTreeSmallFiles copies a tree of 10,000 files of 4 KiB (100
// directories) with Get in one process, target and initiator
// together, into a fresh directory each time (in tmpfs where there is
// one), walked and listed, for profiling the many-small-files path:
//
//	go test -run '^$' -bench TreeSmallFiles -cpuprofile cpu.out ./initiator
func BenchmarkTreeSmallFiles(b *testing.B) {
	const files, size = 10000, 4 << 10
	src := b.TempDir()
	r := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, size)
	for i := range files {
		d := filepath.Join(src, "tree", fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		r.Read(buf)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, tp := range treePaths {
		b.Run(tp.name, func(b *testing.B) {
			s := rig.Serve(b, src, initiator.Config{}, nil)
			if tp.noWalk {
				tree.ListTrees(s)
			}
			out := memDir(b)
			b.SetBytes(files * size)
			n := 0
			for b.Loop() {
				n++
				dst := filepath.Join(out, fmt.Sprint(n))
				res, err := tree.Get(ctx, s, "data/tree", dst, tree.Options{})
				if err != nil {
					b.Fatal(err)
				}
				if res.OK != files+101 || res.Failed != 0 {
					b.Fatalf("%d ok, %d failed", res.OK, res.Failed)
				}
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
	}
}

// memDir is a temporary directory in tmpfs where there is one. On ext4,
// creating files just after many were deleted is slow for minutes (the
// allocator skips recently freed inodes), which would time the file
// system's state rather than the copy.
func memDir(b *testing.B) string {
	d, err := os.MkdirTemp("/dev/shm", "rdmacp-bench-")
	if err != nil {
		b.Logf("no /dev/shm (%v): the copies go to disk", err)
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}
