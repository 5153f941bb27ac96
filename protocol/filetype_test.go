package protocol_test

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
)

// TestFileTypeOf names real files of every kind by their lstat mode and
// by their directory entry, as cp's --delete and rdmacp hash report them.
func TestFileTypeOf(t *testing.T) {
	dir := t.TempDir()
	mk := map[string]func(p string) error{
		"file":    func(p string) error { return os.WriteFile(p, nil, 0o644) },
		"dir":     func(p string) error { return os.Mkdir(p, 0o755) },
		"symlink": func(p string) error { return os.Symlink("file", p) },
		"fifo":    func(p string) error { return syscall.Mkfifo(p, 0o644) },
		"socket": func(p string) error {
			l, err := net.Listen("unix", p)
			if err == nil {
				l.(*net.UnixListener).SetUnlinkOnClose(false)
				l.Close()
			}
			return err
		},
	}
	for name, mkf := range mk {
		if err := mkf(filepath.Join(dir, name)); err != nil {
			t.Fatalf("making a %s: %v", name, err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := os.Lstat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got := protocol.FileTypeOf(fi.Mode()).String(); got != e.Name() {
			t.Errorf("%s by its mode: %s", e.Name(), got)
		}
		if got := protocol.FileTypeOf(e.Type()).String(); got != e.Name() {
			t.Errorf("%s by its directory entry: %s", e.Name(), got)
		}
	}
	if fi, err := os.Stat("/dev/null"); err == nil {
		if got := protocol.FileTypeOf(fi.Mode()); got != protocol.FileCharDev {
			t.Errorf("/dev/null: %s, want chardev", got)
		}
	}
	if got := protocol.FileTypeOf(os.ModeDevice); got != protocol.FileBlockDev {
		t.Errorf("a block device's mode: %s", got)
	}
	if got := protocol.FileTypeOf(os.ModeIrregular); got != protocol.FileOther {
		t.Errorf("an irregular file's mode: %s", got)
	}
}
