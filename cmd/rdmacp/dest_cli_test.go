package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// cp as root once replaced /dev/null with a file. Against the binary: a
// null device takes a verified copy and stays a device, any other
// character device and a FIFO are refused (exit 8) and stay what they
// are, and a symlink is written through and stays a link.
func TestCpSpecialDestinations(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	want := writeFile(t, filepath.Join(src, "f"), 200<<10)
	s := serve(t, src, nil)
	out := t.TempDir()
	null, zero, fifo := filepath.Join(out, "null"), filepath.Join(out, "zero"), filepath.Join(out, "fifo")
	if err := unix.Mknod(null, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("SKIP: mknod: %v (needs root)", err)
	}
	if err := unix.Mknod(zero, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	real, link := filepath.Join(out, "real"), filepath.Join(out, "link")
	os.WriteFile(real, []byte("old"), 0o644)
	os.Symlink("real", link)

	for _, tc := range []struct {
		dst  string
		code int
		mode os.FileMode // the type DEST must still have
	}{
		{null, 0, os.ModeCharDevice | os.ModeDevice},
		{zero, 8, os.ModeCharDevice | os.ModeDevice},
		{fifo, 8, os.ModeNamedPipe},
		{link, 0, os.ModeSymlink},
	} {
		_, errs, code := run(t, "cp", "-q", s.addr+":data/f", tc.dst)
		if code != tc.code {
			t.Errorf("cp to %s: exit %d, want %d: %s", filepath.Base(tc.dst), code, tc.code, errs)
		}
		if fi, err := os.Lstat(tc.dst); err != nil || fi.Mode().Type() != tc.mode {
			t.Errorf("%s is now %v (%v), want type %v", filepath.Base(tc.dst), fi.Mode(), err, tc.mode)
		}
	}
	if got, _ := os.ReadFile(real); !bytes.Equal(got, want) {
		t.Errorf("the symlink's target holds %d bytes, not the copy", len(got))
	}
}
