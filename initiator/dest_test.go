package initiator_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"
)

// A destination that is not a regular file is never replaced: cp as
// root once turned /dev/null into a 10 MB file.
func TestGetSpecialDestinations(t *testing.T) {
	e := startTarget(t, nil)
	want := randomFile(t, filepath.Join(e.Dir, "f"), 300<<10)
	s := e.Dial(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := t.TempDir()
	get := func(dst string) error {
		_, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{})
		return err
	}

	// A node like /dev/null (char 1:3): the copy is verified and thrown
	// away, and the node stays what it was.
	null := filepath.Join(out, "null")
	if err := unix.Mknod(null, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("SKIP: mknod: %v (needs root)", err)
	}
	if err := get(null); err != nil {
		t.Fatalf("copy to a null device: %v", err)
	}
	if fi, err := os.Lstat(null); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("the null device was replaced: %v %v", fi.Mode(), err)
	}

	// Another character device, a FIFO: refused, and left alone.
	zero := filepath.Join(out, "zero")
	unix.Mknod(zero, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5)))
	fifo := filepath.Join(out, "fifo")
	unix.Mkfifo(fifo, 0o644)
	for _, dst := range []string{zero, fifo} {
		err := get(dst)
		if !errors.Is(err, local.ErrDest) {
			t.Errorf("copy to %s: %v, want ErrDest", filepath.Base(dst), err)
		}
		fi, _ := os.Lstat(dst)
		if fi == nil || fi.Mode().IsRegular() {
			t.Errorf("%s was replaced by a regular file", filepath.Base(dst))
		}
	}

	// A symlink is written through, as cp does: the link stays a link.
	real := filepath.Join(out, "real")
	os.WriteFile(real, []byte("old"), 0o644)
	link := filepath.Join(out, "link")
	os.Symlink("real", link)
	if err := get(link); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(link); fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the symlink was replaced")
	}
	if got, _ := os.ReadFile(real); string(got) != string(want) {
		t.Error("the symlink's target does not hold the copy")
	}
	// One that leads nowhere is refused.
	dangling := filepath.Join(out, "dangling")
	os.Symlink("nowhere", dangling)
	if err := get(dangling); !errors.Is(err, local.ErrDest) {
		t.Errorf("copy to a dangling symlink: %v, want ErrDest", err)
	}
	if _, err := os.Stat(filepath.Join(out, "nowhere")); err == nil {
		t.Error("a file was created through the dangling symlink")
	}
	left, _ := filepath.Glob(filepath.Join(out, ".*.part"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
