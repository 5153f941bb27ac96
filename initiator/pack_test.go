package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

// smallTree makes n small files (some empty) in sub-directories of dir,
// and one too large to pack; it returns their contents.
func smallTree(t *testing.T, dir string, n int) map[string][]byte {
	files := map[string][]byte{}
	for i := range n {
		rel := filepath.Join(fmt.Sprintf("d%d", i%7), fmt.Sprintf("f%04d", i))
		os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755)
		files[rel] = randomFile(t, filepath.Join(dir, rel), (i*733)%5000)
		os.Chmod(filepath.Join(dir, rel), os.FileMode(0o600+i%3*0o40))
	}
	files["big"] = randomFile(t, filepath.Join(dir, "big"), 300<<10)
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
		e := startTarget(t, nil) // 256 KiB windows: several packs
		src := filepath.Join(e.Dir, "t")
		files := smallTree(t, src, 400)
		var total int64
		for _, b := range files {
			total += int64(len(b))
		}
		for _, noPack := range []bool{false, true} {
			s := e.Dial(t, nil)
			if noWalk {
				initiator.ListTrees(s)
			}
			out := t.TempDir()
			tr, err := s.GetTree(context.Background(), "data/t", out, initiator.TreeOptions{NoPack: noPack})
			if err != nil || tr.Failed != 0 {
				t.Fatalf("nowalk %v nopack %v: %v %+v", noWalk, noPack, err, tr)
			}
			checkTree(t, src, filepath.Join(out, "t"), files)
			packs := initiator.PacksOf(s)
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

func TestPackEdgeCases(t *testing.T) {
	e := startTarget(t, nil)
	want := randomFile(t, filepath.Join(e.Dir, "ok"), 3000)
	randomFile(t, filepath.Join(e.Dir, "empty"), 0)
	randomFile(t, filepath.Join(e.Dir, "huge"), 300<<10) // over the 256 KiB window limit
	os.Mkdir(filepath.Join(e.Dir, "dir"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(e.Dir, "escape"))
	s := e.Dial(t, nil)
	paths := []string{"data/ok", "data/missing", "data/dir", "data/huge", "data/empty", "data/../x", "data/escape", "data/ok"}
	var got []string
	err := initiator.GetPacked(s, context.Background(), paths, func(i int, en protocol.Entry, data []byte, err error) error {
		var pe *protocol.Error
		switch {
		case err == nil:
			got = append(got, fmt.Sprintf("%d:%d", i, len(data)))
			if i == 0 && !bytes.Equal(data, want) {
				t.Error("ok: content differs")
			}
		case errors.As(err, &pe):
			got = append(got, fmt.Sprintf("%d:%v", i, pe.Code))
		default:
			got = append(got, fmt.Sprintf("%d:%v", i, err))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if w := "0:3000 1:not found 2:unsupported 3:too many 4:0 5:permission denied 6:permission denied 7:3000"; strings.Join(got, " ") != w {
		t.Fatalf("got  %s\nwant %s", strings.Join(got, " "), w)
	}
	// Every pack's handle was closed: the session can open its limit again.
	if _, err := s.Get(context.Background(), "data/ok", filepath.Join(t.TempDir(), "x"), initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}
