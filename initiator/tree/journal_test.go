package tree_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/local"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/protocol"
)

// journalTree makes n files of size bytes in directories of 10, plus one
// file too large to pack, and returns the total bytes.
func journalTree(t *testing.T, dir string, n, size int) int64 {
	t.Helper()
	var total int64
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i/10), fmt.Sprintf("f%03d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b := []byte(strings.Repeat(fmt.Sprintf("%05d", i), size/5+1)[:size])
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		total += int64(size)
	}
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i * 13)
	}
	if err := os.WriteFile(filepath.Join(dir, "d00", "big"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	return total + int64(len(big))
}

// A tree copy with Partial, interrupted after some batches of files have
// settled, leaves a journal beside DEST, which DEST did not exist before;
// the same call again resumes into DEST (not DEST/tree), skips the files
// the journal names without reading them, copies the rest, leaves no
// temporary file, and removes the journal.
func TestTreeResumeFromJournal(t *testing.T) {
	defer tree.SetSettleEvery(10)()
	e := rig.Start(t, nil)
	src := filepath.Join(e.Dir, "tree")
	const n, size = 200, 700
	total := journalTree(t, src, n, size)
	out := t.TempDir()
	dst := filepath.Join(out, "D")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reported := 0
	s := e.Dial(t, nil)
	_, err := tree.Get(ctx, s, "data/tree", dst, tree.Options{Contents: true, Partial: true, QuickCheck: true,
		File: func(fr tree.FileResult) {
			if fr.Type == protocol.FileRegular && fr.Status == tree.StatusOK {
				if reported++; reported == 60 {
					cancel()
				}
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v, want canceled", err)
	}
	jp := local.JournalPath(dst)
	if _, err := os.Stat(jp); err != nil {
		t.Fatalf("no journal after the interrupt: %v", err)
	}

	s = e.Dial(t, nil) // as a new command would
	inPlace := 0       // regular files found in place
	tr, err := tree.Get(context.Background(), s, "data/tree", dst, tree.Options{Contents: true, Partial: true, QuickCheck: true,
		File: func(fr tree.FileResult) {
			if fr.Type == protocol.FileRegular && fr.Status == tree.StatusUnchanged {
				inPlace++
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Dest != dst {
		t.Fatalf("resumed into %s, want %s", tr.Dest, dst)
	}
	if tr.Resumed < 60 || tr.Failed != 0 {
		t.Errorf("resumed %d files (want at least the 60 reported), %d failed", tr.Resumed, tr.Failed)
	}
	// Only what was not done is read: every file's bytes, less those of
	// the files found in place.
	if want := total - int64(inPlace)*size; tr.BytesRead != want || inPlace < tr.Resumed {
		t.Errorf("read %d bytes, want %d (%d files in place, %d resumed)", tr.BytesRead, want, inPlace, tr.Resumed)
	}
	if _, err := os.Stat(jp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("journal still there after the tree completed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "tree")); err == nil {
		t.Error("the second run copied into DEST/tree")
	}
	compareTrees(t, src, dst)
}

// compareTrees fails unless b has what a has: names, types, contents,
// modes and mtimes, and nothing else (no temporary files either).
func compareTrees(t *testing.T, a, b string) {
	t.Helper()
	seen := 0
	filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(a, p)
		seen++
		fa, _ := os.Lstat(p)
		fb, err := os.Lstat(filepath.Join(b, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		if fa.Mode() != fb.Mode() || !fa.ModTime().Equal(fb.ModTime()) || fa.Size() != fb.Size() && !fa.IsDir() {
			t.Errorf("%s: %v %v %d, want %v %v %d", rel, fb.Mode(), fb.ModTime(), fb.Size(), fa.Mode(), fa.ModTime(), fa.Size())
		}
		if fa.Mode().IsRegular() {
			x, _ := os.ReadFile(p)
			y, _ := os.ReadFile(filepath.Join(b, rel))
			if string(x) != string(y) {
				t.Errorf("%s: contents differ", rel)
			}
		}
		return nil
	})
	n := 0
	filepath.WalkDir(b, func(p string, d fs.DirEntry, err error) error {
		n++
		return nil
	})
	if n != seen {
		t.Errorf("destination has %d entries, source %d", n, seen)
	}
}

// A journal's torn last line, and anything after a line that is not
// one, are ignored; the lines before are kept.
func TestJournalTornTail(t *testing.T) {
	defer tree.SetSettleEvery(5)()
	e := rig.Start(t, nil)
	src := filepath.Join(e.Dir, "tree")
	journalTree(t, src, 30, 100)
	dst := filepath.Join(t.TempDir(), "D")
	s := e.Dial(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	k := 0
	tree.Get(ctx, s, "data/tree", dst, tree.Options{Contents: true, Partial: true, File: func(fr tree.FileResult) {
		if fr.Type == protocol.FileRegular {
			if k++; k == 20 {
				cancel()
			}
		}
	}})
	cancel()
	jp := local.JournalPath(dst)
	b, err := os.ReadFile(jp)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(string(b), "\n") - 1
	if lines < 10 {
		t.Fatalf("journal has %d files, want at least 10", lines)
	}
	// Tear it: half a line, then a good-looking line after it.
	f, _ := os.OpenFile(jp, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString("0123456789\n0123456789abcdef\n")
	f.Close()
	os.Chtimes(jp, time.Now(), time.Now())
	s = e.Dial(t, nil)
	tr, err := tree.Get(context.Background(), s, "data/tree", dst, tree.Options{Contents: true, Partial: true, File: func(tree.FileResult) {}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Resumed != lines || tr.Failed != 0 {
		t.Errorf("resumed %d, want the %d whole lines; %d failed", tr.Resumed, lines, tr.Failed)
	}
	compareTrees(t, src, dst)
}
