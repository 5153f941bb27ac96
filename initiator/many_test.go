package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// GetSmall packs a manifest's small files, reports each, and leaves to Get
// what it should not or cannot pack.
func TestGetSmall(t *testing.T) {
	e := startTarget(t, nil) // 256 KiB windows
	src := e.dir
	os.Mkdir(filepath.Join(src, "sub"), 0o755)
	want := map[string][]byte{
		"a":       randomFile(t, filepath.Join(src, "a"), 3000),
		"empty":   randomFile(t, filepath.Join(src, "empty"), 0),
		"sub/c":   randomFile(t, filepath.Join(src, "sub", "c"), 100),
		"replace": randomFile(t, filepath.Join(src, "replace"), 10),
	}
	os.Chmod(filepath.Join(src, "a"), 0o640)
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	os.Chtimes(filepath.Join(src, "a"), mt, mt)
	randomFile(t, filepath.Join(src, "big"), 300<<10) // over the window: Get's
	os.Mkdir(filepath.Join(src, "dir"), 0o755)        // not a file: Get's
	out := t.TempDir()
	os.Mkdir(filepath.Join(out, "into"), 0o755)
	os.WriteFile(filepath.Join(out, "old"), []byte("an older, longer file"), 0o644)
	os.Symlink("elsewhere", filepath.Join(out, "link"))
	jobs := []initiator.FileJob{
		{"data/a", filepath.Join(out, "a")},            // 0
		{"data/big", filepath.Join(out, "big")},        // 1: left
		{"data/empty", filepath.Join(out, "into")},     // 2: into/empty
		{"data/missing", filepath.Join(out, "m")},      // 3: failed
		{"data/dir", filepath.Join(out, "d")},          // 4: left
		{"data/sub/c", filepath.Join(out, "into/")},    // 5: into/c
		{"data/replace", filepath.Join(out, "old")},    // 6: replaces old
		{"data/a", filepath.Join(out, "link")},         // 7: a symlink there: left
		{"data/a", filepath.Join(out, "none", "x")},    // 8: no such directory: failed
		{"data/../etc", filepath.Join(out, "outside")}, // 9: failed
	}
	s := e.dial(t, nil)
	got := map[int]initiator.FileResult{}
	left, err := s.GetSmall(context.Background(), jobs, func(i int, fr initiator.FileResult) {
		if _, twice := got[i]; twice {
			t.Errorf("job %d reported twice", i)
		}
		got[i] = fr
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, []int{1, 4, 7}) {
		t.Fatalf("left %v, want [1 4 7]", left)
	}
	for i, dst := range map[int]string{0: "a", 2: "into/empty", 5: "into/c", 6: "old"} {
		fr := got[i]
		if fr.Status != initiator.StatusOK || fr.Path != filepath.Join(out, dst) || fr.Err != nil {
			t.Errorf("job %d: %+v", i, fr)
		}
	}
	for _, i := range []int{3, 8, 9} {
		if got[i].Status != initiator.StatusFailed || got[i].Err == nil {
			t.Errorf("job %d: %+v, want a failure", i, got[i])
		}
	}
	var pe *protocol.Error
	if !errors.As(got[3].Err, &pe) || pe.Code != protocol.CodeNotFound {
		t.Errorf("missing: %v", got[3].Err)
	}
	if len(got) != 7 {
		t.Errorf("%d jobs reported, want 7", len(got))
	}
	for dst, name := range map[string]string{"a": "a", "into/empty": "empty", "into/c": "sub/c", "old": "replace"} {
		b, err := os.ReadFile(filepath.Join(out, dst))
		if err != nil || !bytes.Equal(b, want[name]) {
			t.Errorf("%s: %v, differs", dst, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(out, "a")); err != nil || fi.Mode() != 0o640 || !fi.ModTime().Equal(mt) {
		t.Errorf("a: %v %v (%v), want 0640 %v", fi.Mode(), fi.ModTime(), err, mt)
	}
	if l, _ := os.Readlink(filepath.Join(out, "link")); l != "elsewhere" {
		t.Errorf("the symlink at a destination became %q", l)
	}
	filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
		if strings.Contains(p, ".rdmacp-") {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
	if initiator.PacksOf(s) == 0 {
		t.Error("no Pack was answered")
	}

	// A target without Pack leaves every job to Get.
	old := startTarget(t, func(c *target.Config) { c.NoPack, c.NoWalk = true, true })
	randomFile(t, filepath.Join(old.dir, "a"), 10)
	left, err = old.dial(t, nil).GetSmall(context.Background(), jobs[:3], func(i int, fr initiator.FileResult) {
		t.Errorf("job %d reported by a target without Pack: %+v", i, fr)
	})
	if err != nil || !slices.Equal(left, []int{0, 1, 2}) {
		t.Errorf("without Pack: left %v, %v", left, err)
	}
}
