package tree_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// GetMany copies a manifest in order: runs of small files packed, and
// what Pack will not take (or whose destination is not a file) handed
// back one by one in its place.
func TestGetMany(t *testing.T) {
	other := t.TempDir()
	e := rig.Start(t, func(c *target.Config) { // 256 KiB windows
		c.Exports = append(c.Exports, target.Export{Name: "logs", Path: other})
	})
	src := e.Dir
	os.Mkdir(filepath.Join(src, "sub"), 0o755)
	want := map[string][]byte{
		"a":       rig.RandomFile(t, filepath.Join(src, "a"), 3000),
		"empty":   rig.RandomFile(t, filepath.Join(src, "empty"), 0),
		"sub/c":   rig.RandomFile(t, filepath.Join(src, "sub", "c"), 100),
		"replace": rig.RandomFile(t, filepath.Join(src, "replace"), 10),
		"small":   rig.RandomFile(t, filepath.Join(src, "small"), 20),
		"log":     rig.RandomFile(t, filepath.Join(other, "log"), 30),
	}
	os.Chmod(filepath.Join(src, "a"), 0o640)
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	os.Chtimes(filepath.Join(src, "a"), mt, mt)
	rig.RandomFile(t, filepath.Join(src, "big"), 300<<10) // over the window
	os.Mkdir(filepath.Join(src, "dir"), 0o755)
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	os.Mkdir(filepath.Join(out, "into"), 0o755)
	os.WriteFile(filepath.Join(out, "old"), []byte("an older, longer file"), 0o644)
	os.Symlink("elsewhere", filepath.Join(out, "link"))
	o := func(p string) string { return filepath.Join(out, p) }
	jobs := []tree.FileJob{
		{"data/a", o("a")},            // 0 packed
		{"data/big", o("twice")},      // 1 one by one (too large)
		{"data/small", o("twice")},    // 2 packed, after 1: it wins
		{"data/empty", o("into")},     // 3 packed, into/empty
		{"data/missing", o("m")},      // 4 failed
		{"data/dir", o("d")},          // 5 one by one (not a file)
		{"data/sub/c", o("into/")},    // 6 packed, into/c
		{"data/fifo", o("f")},         // 7 one by one (not a file), at once
		{"data/replace", o("old")},    // 8 packed, replaces old
		{"data/a", o("link")},         // 9 one by one (a symlink there)
		{"logs/log", o("log")},        // 10 packed, another export
		{"data/a", o("none/x")},       // 11 failed: no such directory
		{"data/../etc", o("outside")}, // 12 failed
		{"logs/nope", o("nope")},      // 13 failed
	}
	s := e.Dial(t, nil)
	var seq []string
	got := map[int]tree.FileResult{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := tree.GetMany(ctx, s, jobs, func(i int, fr tree.FileResult) {
		seq = append(seq, fmt.Sprintf("p%d", i))
		got[i] = fr
	}, func(i int) error {
		seq = append(seq, fmt.Sprintf("o%d", i))
		if i == 1 { // as Get would: the large file at its place in the order
			os.WriteFile(o("twice"), []byte("the big one"), 0o644)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if w := "p0 o1 p2 p3 p4 o5 p6 o7 p8 o9 p10 p11 p12 p13"; strings.Join(seq, " ") != w {
		t.Fatalf("order %s\nwant  %s", strings.Join(seq, " "), w)
	}
	for i, dst := range map[int]string{0: "a", 2: "twice", 3: "into/empty", 6: "into/c", 8: "old", 10: "log"} {
		if fr := got[i]; fr.Status != tree.StatusOK || fr.Path != o(dst) || fr.Err != nil {
			t.Errorf("job %d: %+v", i, fr)
		}
	}
	for _, i := range []int{4, 11, 12, 13} {
		if got[i].Status != tree.StatusFailed || got[i].Err == nil {
			t.Errorf("job %d: %+v, want a failure", i, got[i])
		}
	}
	var pe *protocol.Error
	if !errors.As(got[4].Err, &pe) || pe.Code != protocol.CodeNotFound {
		t.Errorf("missing: %v", got[4].Err)
	}
	for dst, name := range map[string]string{"a": "a", "twice": "small", "into/empty": "empty", "into/c": "sub/c", "old": "replace", "log": "log"} {
		if b, err := os.ReadFile(o(dst)); err != nil || !bytes.Equal(b, want[name]) {
			t.Errorf("%s: %v, differs from %s", dst, err, name)
		}
	}
	if fi, err := os.Stat(o("a")); err != nil || fi.Mode() != 0o640 || !fi.ModTime().Equal(mt) {
		t.Errorf("a: %v %v (%v), want 0640 %v", fi.Mode(), fi.ModTime(), err, mt)
	}
	if l, _ := os.Readlink(o("link")); l != "elsewhere" {
		t.Errorf("the symlink at a destination became %q", l)
	}
	filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
		if strings.Contains(p, ".rdmacp-") {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
	if s.Packs() == 0 {
		t.Error("no Pack was answered")
	}

	// An error from one stops the manifest.
	stop := errors.New("stop")
	if err := tree.GetMany(ctx, s, jobs[:3], func(int, tree.FileResult) {}, func(int) error { return stop }); err != stop {
		t.Errorf("one's error: %v", err)
	}
}
