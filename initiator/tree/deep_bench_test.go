package tree_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
)

// BenchmarkDeepChain copies a chain of directories, each holding a
// one-byte file and the next, with Get in one process: what a target
// sending a deep tree costs the initiator. Names are 3 bytes, so the
// deepest chain is at protocol.MaxPath; compare ns/op across depths
// (twice the depth should cost about twice, plus what os.Root's
// resolution of each directory's path from the top adds):
//
//	go test -run '^$' -bench DeepChain -benchtime 3x ./initiator
func BenchmarkDeepChain(b *testing.B) {
	for _, depth := range []int{256, 512, 1023} {
		b.Run(fmt.Sprint(depth), func(b *testing.B) {
			src := b.TempDir()
			// Made relative to each level, as a path this long is near
			// what one system call takes.
			p := filepath.Join(src, "t")
			if err := os.MkdirAll(p, 0o755); err != nil {
				b.Fatal(err)
			}
			wd, _ := os.Getwd()
			defer os.Chdir(wd)
			if err := os.Chdir(p); err != nil {
				b.Fatal(err)
			}
			for range depth {
				if err := os.Mkdir("ddd", 0o755); err != nil {
					b.Fatal(err)
				}
				if err := os.Chdir("ddd"); err != nil {
					b.Fatal(err)
				}
				if err := os.WriteFile("f", []byte("x"), 0o644); err != nil {
					b.Fatal(err)
				}
			}
			os.Chdir(wd)
			s := rig.Serve(b, src, initiator.Config{}, nil)
			out := memDir(b)
			n := 0
			for b.Loop() {
				n++
				dst := filepath.Join(out, fmt.Sprint(n))
				res, err := tree.Get(context.Background(), s, "data/t", dst, tree.Options{})
				if err != nil {
					b.Fatal(err)
				}
				if res.OK != 2*depth+1 || res.Failed != 0 {
					b.Fatalf("%d ok, %d failed", res.OK, res.Failed)
				}
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
	}
}
