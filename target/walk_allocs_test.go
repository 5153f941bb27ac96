//go:build !race

package target

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// A walk allocates about one object a packed file (openat's copy of its
// name): not an entry each (which escaped when handed to the metadata
// hook by its address), nor a string for each name read from the
// directory. On a tree of 300,000 files every object a file is GC and
// page faults on the target (docs/performance.md, small files round 3).
func TestWalkAllocsPerFile(t *testing.T) {
	const files = 1000
	dir := t.TempDir()
	sub := filepath.Join(dir, "d")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range files {
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("file-with-a-longish-name-%05d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	x := testExport(t, dir)
	w := startWalk(t, x, ".", protocol.Walk{PackMax: 4096})
	var we walkEntry
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := 0
	for w.next(&we) {
		if we.e.Packed {
			unix.Close(we.pk.fd)
			n++
		}
	}
	runtime.ReadMemStats(&after)
	if n != files {
		t.Fatalf("%d files packed, want %d", n, files)
	}
	if per := float64(after.Mallocs-before.Mallocs) / files; per > 1.5 {
		t.Errorf("%.2f allocations a file, want at most 1.5", per)
	}
}
