package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
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
	// cp refuses them by name, as a FIFO (a socket was an internal error:
	// its open fails, ENXIO).
	for _, name := range []string{"fifo", "sock"} {
		_, errs, code := hrun(t, "cp", "-q", "--timeout", "5s", s.addr+":data/"+name, filepath.Join(t.TempDir(), name))
		if want := "rdmacp: remote error: unsupported: data/" + name + " is not a regular file or block device"; code != exitRemote || !strings.HasPrefix(errs, want) {
			t.Errorf("cp of a %s: exit %d, %q; want exit %d, %q...", name, code, errs, exitRemote, want)
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

// TestLsErrorsLikeLs: ls of a missing path, of a path under a file, and
// of a symlink with and without a trailing slash answers as ls does,
// with an error shaped like fs.PathError that names the path as typed
// (not "remote error: not found: data/x: no such file or directory"),
// exit 5 (a remote path: the one mapping, exitCode).
func TestLsErrorsLikeLs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "f"), 10)
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	writeFile(t, filepath.Join(dir, "d", "inside"), 10)
	for link, to := range map[string]string{"link": "f", "dangling": "nowhere", "dirlink": "d"} {
		if err := os.Symlink(to, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	s := serve(t, dir, nil)
	for _, c := range []struct {
		path, out, err string
		code           int
	}{
		{"f", "f\n", "", 0},
		{"link", "link\n", "", 0},         // the link itself, as ls lists it
		{"dangling", "dangling\n", "", 0}, // so is one that leads nowhere
		{"dirlink", "inside\n", "", 0},    // a link to a directory lists the directory
		{"dirlink/", "inside\n", "", 0},
		{"nope", "", "no such file or directory", exitRemote},
		{"nope/x", "", "no such file or directory", exitRemote},
		{"f/x", "", "not a directory", exitRemote},
		{"f/", "", "not a directory", exitRemote},
		{"link/", "", "not a directory", exitRemote},               // ls: cannot access 'link/': Not a directory
		{"dangling/", "", "no such file or directory", exitRemote}, // ls: cannot access 'dangling/': No such file or directory
	} {
		arg := s.addr + ":data/" + c.path
		out, errs, code := hrun(t, "ls", "-q", arg)
		want := ""
		if c.err != "" {
			want = "rdmacp: ls " + arg + ": " + c.err + "\n"
		}
		if out != c.out || errs != want || code != c.code {
			t.Errorf("ls %s: exit %d, stdout %q, stderr %q; want exit %d, %q, %q", c.path, code, out, errs, c.code, c.out, want)
		}
	}
	// ls -l lists a symlink named without a slash itself, even one to a
	// directory, as ls -l does.
	out, errs, code := hrun(t, "ls", "-l", "-q", s.addr+":data/dirlink")
	if code != 0 || !regexp.MustCompile(`^lrwxrwxrwx +1 \S+ dirlink -> d\n$`).MatchString(out) {
		t.Errorf("ls -l of a link to a directory: exit %d, %q, %s", code, out, errs)
	}
	out, errs, code = hrun(t, "ls", "-l", "-q", s.addr+":data/dirlink/")
	if code != 0 || !regexp.MustCompile(`^-rw-r--r-- +10 \S+ inside\n$`).MatchString(out) {
		t.Errorf("ls -l of a link to a directory, with a slash: exit %d, %q, %s", code, out, errs)
	}
	arg := s.addr + ":data/nope"
	out, _, code = hrun(t, "ls", "--json", arg)
	if want := `{"message_type":"error","error":"ls ` + arg + `: no such file or directory","exit_code":5}` + "\n"; out != want || code != exitRemote {
		t.Errorf("ls --json of a missing path: exit %d, %q; want %q", code, out, want)
	}
}
