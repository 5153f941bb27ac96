package tree_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/filter"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"

	"github.com/rdmacp/rdmacp/initiator"
)

func listTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && p != root {
			rel, _ := filepath.Rel(root, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(out)
	return out
}

// The quick check, filters and --delete, whether the target walks the
// tree or it is listed.
func TestGetTreeIncremental(t *testing.T) {
	for _, tp := range treePaths {
		t.Run(tp.name, func(t *testing.T) { testGetTreeIncremental(t, tp.noWalk) })
	}
}

func testGetTreeIncremental(t *testing.T, noWalk bool) {
	e := rig.Start(t, nil)
	src := filepath.Join(e.Dir, "t")
	for _, p := range []string{"a", "big", "skip.o", "sub/b", "cache/c", "cache/deep/d"} {
		os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755)
		n := 100
		if p == "big" {
			n = 3 << 20 // not packed
		}
		rig.RandomFile(t, filepath.Join(src, p), n)
	}
	s := e.Dial(t, nil)
	if noWalk {
		tree.ListTrees(s)
	}
	ctx := context.Background()
	out := t.TempDir()
	var f filter.Filter
	f.Add("*.o", false)
	f.Add("cache/", false)
	opt := tree.Options{QuickCheck: true, Filter: &f, Delete: true}
	if _, err := tree.Get(ctx, s, "data/t", out, opt); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(out, "t")
	want := []string{"a", "big", "sub", "sub/b"}
	if got := listTree(t, dst); !slices.Equal(got, want) {
		t.Fatalf("copied %v, want %v", got, want)
	}
	// Unchanged: nothing read. Extras go, excluded ones stay.
	os.WriteFile(filepath.Join(dst, "extra"), nil, 0o644)
	os.WriteFile(filepath.Join(dst, "sub", "local.o"), nil, 0o644)
	before := s.BytesRead()
	tr, err := tree.Get(ctx, s, "data/t", out, opt)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.BytesRead() - before; n != 0 || tr.BytesRead != 0 || tr.Unchanged != 5 || tr.Deleted != 1 {
		t.Fatalf("second run read %d bytes: %+v", n, tr)
	}
	if got := listTree(t, dst); !slices.Equal(got, []string{"a", "big", "sub", "sub/b", "sub/local.o"}) {
		t.Fatalf("after --delete: %v", got)
	}
	// A changed small file and a changed large one are read, alone.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(src, "a"), old, old)
	os.Chtimes(filepath.Join(src, "big"), old, old)
	before = s.BytesRead()
	if tr, err = tree.Get(ctx, s, "data/t", out, opt); err != nil {
		t.Fatal(err)
	}
	if n := s.BytesRead() - before; n < 3<<20+100 || n > 3<<20+100+64<<10 || tr.Unchanged != 3 {
		t.Fatalf("after two changes: read %d bytes, %+v", n, tr)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "a")); !fi.ModTime().Equal(old) {
		t.Fatalf("a's mtime %v, want %v", fi.ModTime(), old)
	}
}

// A failed entry holds --delete back: nothing is deleted. The failure
// is the source's: "blocker" goes from it while "a" is being copied
// (both too large to pack, so copied one after the other, after the walk).
func TestGetTreeDeleteHeldOnFailure(t *testing.T) {
	e := rig.Start(t, nil)
	os.Mkdir(filepath.Join(e.Dir, "t"), 0o755)
	rig.RandomFile(t, filepath.Join(e.Dir, "t", "a"), 2<<20)
	rig.RandomFile(t, filepath.Join(e.Dir, "t", "blocker"), 2<<20)
	out := t.TempDir()
	os.MkdirAll(filepath.Join(out, "t"), 0o755)
	os.WriteFile(filepath.Join(out, "t", "extra"), nil, 0o644)
	s := e.Dial(t, nil)
	var once sync.Once
	gone := func(p initiator.Progress) {
		once.Do(func() { os.Remove(filepath.Join(e.Dir, "t", "blocker")) })
	}
	tr, err := tree.Get(context.Background(), s, "data/t", out, tree.Options{QuickCheck: true, Delete: true, Progress: gone})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Failed != 1 || !tr.DeleteHeld || tr.Deleted != 0 {
		t.Fatalf("%+v", tr)
	}
	if _, err := os.Stat(filepath.Join(out, "t", "extra")); err != nil {
		t.Fatal("deleted despite a failure")
	}
}
