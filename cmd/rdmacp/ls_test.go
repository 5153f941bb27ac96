package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// TestLsSpecialFiles: ls -l shows a FIFO, a socket and a character device
// with ls's letters (p, s, c), not '?', and listing a FIFO's own path
// answers at once instead of waiting for a writer until --timeout.
func TestLsSpecialFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	want := map[string]string{"fifo": "prw-r-----", "sock": "s"}
	// A character device like /dev/null (1, 3), where we may make one.
	if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err == nil {
		os.Chmod(filepath.Join(dir, "null"), 0o666)
		want["null"] = "crw-rw-rw-"
	} else if !errors.Is(err, unix.EPERM) {
		t.Fatal(err)
	}
	s := serve(t, dir, nil)
	out, errs, code := hrun(t, "ls", "-l", "-q", s.addr+":data")
	if code != 0 {
		t.Fatalf("ls -l: exit %d: %s", code, errs)
	}
	for name, mode := range want {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(mode) + `\S* .* ` + name + `$`).MatchString(out) {
			t.Errorf("ls -l: no line %s... %s in:\n%s", mode, name, out)
		}
	}
	out, errs, code = hrun(t, "ls", "--json", "-q", s.addr+":data/fifo", "--timeout", "5s")
	if code != 0 || !regexp.MustCompile(`^\{"type":"fifo","name":"fifo",.*"message_type":"entry"\}\n$`).MatchString(out) {
		t.Errorf("ls of a FIFO: exit %d, %q, %s", code, out, errs)
	}
}

func TestModeStringTypeLetters(t *testing.T) {
	for typ, want := range map[uint8]string{1: "-rw-r--r--", 2: "drw-r--r--", 3: "lrw-r--r--", 4: "brw-r--r--", 5: "?rw-r--r--", 6: "prw-r--r--", 7: "srw-r--r--", 8: "crw-r--r--", 200: "?rw-r--r--"} {
		if got := modeString(protocol.FileType(typ), 0o644); got != want {
			t.Errorf("type %d: %s, want %s", typ, got, want)
		}
	}
}
