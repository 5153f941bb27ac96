package tree_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
)

// smallTree makes n small files (some empty) in sub-directories of dir,
// and one too large to pack; it returns their contents.
func smallTree(t *testing.T, dir string, n int) map[string][]byte {
	files := map[string][]byte{}
	for i := range n {
		rel := filepath.Join(fmt.Sprintf("d%d", i%7), fmt.Sprintf("f%04d", i))
		os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755)
		files[rel] = rig.RandomFile(t, filepath.Join(dir, rel), (i*733)%5000)
		os.Chmod(filepath.Join(dir, rel), os.FileMode(0o600+i%3*0o40))
	}
	files["big"] = rig.RandomFile(t, filepath.Join(dir, "big"), 300<<10)
	return files
}

func checkTree(t *testing.T, src, dst string, files map[string][]byte) {
	t.Helper()
	for rel, want := range files {
		got, err := os.ReadFile(filepath.Join(dst, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs (%v)", rel, err)
		}
		sfi, _ := os.Stat(filepath.Join(src, rel))
		fi, _ := os.Stat(filepath.Join(dst, rel))
		if fi.Mode() != sfi.Mode() || !fi.ModTime().Equal(sfi.ModTime()) {
			t.Fatalf("%s: %v %v, want %v %v", rel, fi.Mode(), fi.ModTime(), sfi.Mode(), sfi.ModTime())
		}
	}
}

// Small files come many at a time, with Walk, or with Pack when the tree
// is listed.
func TestGetTreePacksSmallFiles(t *testing.T) {
	for _, noWalk := range []bool{false, true} {
		e := rig.Start(t, nil) // 256 KiB windows: several packs
		src := filepath.Join(e.Dir, "t")
		files := smallTree(t, src, 400)
		var total int64
		for _, b := range files {
			total += int64(len(b))
		}
		for _, noPack := range []bool{false, true} {
			s := e.Dial(t, nil)
			if noWalk {
				tree.ListTrees(s)
			}
			out := t.TempDir()
			tr, err := tree.Get(context.Background(), s, "data/t", out, tree.Options{NoPack: noPack})
			if err != nil || tr.Failed != 0 {
				t.Fatalf("nowalk %v nopack %v: %v %+v", noWalk, noPack, err, tr)
			}
			checkTree(t, src, filepath.Join(out, "t"), files)
			packs := s.Packs()
			t.Logf("nowalk %v nopack %v: %d packs for %d files", noWalk, noPack, packs, len(files))
			if noPack && packs != 0 || !noPack && (packs < 2 || packs > 40) {
				t.Errorf("nowalk %v nopack %v: %d packs for %d files", noWalk, noPack, packs, len(files))
			}
			if s.BytesRead() != total || tr.BytesRead != total {
				t.Errorf("nowalk %v nopack %v: read %d (says %d), want %d", noWalk, noPack, s.BytesRead(), tr.BytesRead, total)
			}
		}
	}
}
