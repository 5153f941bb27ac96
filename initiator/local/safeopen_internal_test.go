package local

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOpenRegularRefuses plants, at the name openRegular opens, each
// thing a neighbour could: it must be refused at once, with a message
// naming the path and what is there, and left as it was.
func TestOpenRegularRefuses(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	wr := OpenMode{Flag: os.O_WRONLY | os.O_CREATE | os.O_TRUNC, Perm: 0o600, exclusive: true}
	rd := OpenMode{Flag: os.O_RDONLY}
	cases := []struct {
		name  string
		plant func(p string) error
		m     OpenMode
		want  string
	}{
		{"symlink", func(p string) error { return os.Symlink(victim, p) }, wr, "is a symlink"},
		{"symlink read", func(p string) error { return os.Symlink(victim, p) }, rd, "is a symlink"},
		{"fifo write", func(p string) error { return unix.Mkfifo(p, 0o666) }, wr, "is a FIFO, not a regular file"},
		{"fifo read", func(p string) error { return unix.Mkfifo(p, 0o666) }, rd, "is a FIFO, not a regular file"},
		{"socket", func(p string) error {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
			if err == nil {
				l.SetUnlinkOnClose(false)
				t.Cleanup(func() { l.Close() })
			}
			return err
		}, rd, "is a socket, not a regular file"},
		{"device", nil, rd, "is a character device, not a regular file"},
		{"dir", func(p string) error { return os.Mkdir(p, 0o700) }, rd, "is a directory, not a regular file"},
		{"hardlink", func(p string) error { return os.Link(victim, p) }, wr, "has 2 links"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			if c.plant == nil {
				// A device node of our own needs root; /dev/null is one
				// already, opened through its own directory.
				p = "/dev/null"
			} else if err := c.plant(p); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				f, err := OpenRegular(p, c.m)
				if f != nil {
					f.Close()
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("openRegular blocked")
			}
			var pe *fs.PathError
			if !errors.As(err, &pe) || pe.Path != p {
				t.Fatalf("error %v: want an fs.PathError naming %s", err, p)
			}
			if !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrNotRegular) {
				t.Errorf("error %q: want it to say %q", err, c.want)
			}
			if b, _ := os.ReadFile(victim); string(b) != "keep me" {
				t.Errorf("the victim now holds %q", b)
			}
		})
	}
}

// TestOpenRegularUses: a regular file of one link is opened, blocking
// again (O_NONBLOCK cleared), and O_TRUNC applies to it.
func TestOpenRegularUses(t *testing.T) {
	p := filepath.Join(t.TempDir(), "j")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenRegular(p, OpenMode{Flag: os.O_RDWR | os.O_TRUNC, exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_NONBLOCK != 0 {
		t.Errorf("flags %#x, %v: O_NONBLOCK still set", fl, err)
	}
	if fi, _ := f.Stat(); fi.Size() != 0 {
		t.Errorf("size %d after O_TRUNC", fi.Size())
	}
	// A new one, exclusively.
	g, err := OpenRegular(p+"2", OpenMode{Flag: os.O_RDWR | os.O_CREATE | os.O_EXCL, Perm: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	if _, err := OpenRegular(p+"2", OpenMode{Flag: os.O_RDWR | os.O_CREATE | os.O_EXCL, Perm: 0o600}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("O_EXCL on an existing file: %v", err)
	}
}

// TestOpenRegularOwner: a file another user owns is not written into.
func TestOpenRegularOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	p := filepath.Join(t.TempDir(), "j")
	if err := os.WriteFile(p, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, err := OpenRegular(p, OpenMode{Flag: os.O_WRONLY, exclusive: true})
	if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("got %v", err)
	}
}

// TestOpenDirNoFollow: a symlink where a tree's directory goes is
// refused, a directory is opened.
func TestOpenDirNoFollow(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "real"), 0o700)
	os.Symlink("real", filepath.Join(dir, "link"))
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o600)
	parent, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	r, err := OpenDirNoFollow(parent, dir, "real")
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	for name, want := range map[string]string{"link": "is a symlink", "file": "is a regular file, not a directory"} {
		_, err := OpenDirNoFollow(parent, dir, name)
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), filepath.Join(dir, name)) {
			t.Errorf("%s: got %v, want %q", name, err, want)
		}
	}
}

// TestOpenRegularFollow: a name the user gave is followed to a regular
// file, and still never blocks on a FIFO it leads to.
func TestOpenRegularFollow(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600)
	os.Symlink("f", filepath.Join(dir, "link"))
	unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600)
	os.Symlink("fifo", filepath.Join(dir, "tofifo"))
	f, err := OpenRegular(filepath.Join(dir, "link"), OpenMode{Flag: os.O_RDONLY, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	done := make(chan error, 1)
	go func() {
		_, err := OpenRegular(filepath.Join(dir, "tofifo"), OpenMode{Flag: os.O_RDONLY, Follow: true})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "is a FIFO") {
			t.Errorf("got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked on a FIFO behind a symlink")
	}
}
