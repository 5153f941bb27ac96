package tree

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"

	"github.com/rdmacp/rdmacp/protocol"
	"golang.org/x/sys/unix"
)

// A tree's owners, modes, symlink mtimes and xattrs land; and nothing
// is set through a symlink, so a symlink to outside the destination
// leaves that outside alone.
func TestTreeMeta(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o755)
	mt := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC).UnixNano()
	tree := metaLister{
		top: protocol.Entry{Type: protocol.FileDir, Mode: 0o2775, MtimeNs: mt, Meta: &protocol.Meta{Nlink: 1, UID: 12345, GID: 12346}},
		fakeLister: fakeLister{"x/d": {
			{Type: protocol.FileSymlink, Name: "esc", Target: outside, MtimeNs: mt,
				Meta: &protocol.Meta{Nlink: 1, UID: 12345, GID: 12346, Xattrs: []protocol.Xattr{{Name: "user.k", Value: []byte("v")}}}},
			{Type: protocol.FileDir, Name: "tmp", Mode: 0o1777, MtimeNs: mt, Meta: &protocol.Meta{Nlink: 1, UID: 12347,
				Xattrs: []protocol.Xattr{{Name: "user.k", Value: []byte("dir")}, {Name: "trusted.t", Value: []byte("t")}}}},
		}},
	}
	var logs bytes.Buffer
	s := &session{Session: new(initiator.Session), lister: tree, cfg: initiator.Config{Logger: logTo(&logs),
		Archive: local.Archive{Perms: true, Owner: true, Group: true, Times: true, Xattrs: true, NumericIDs: true}}}
	s.meta = &local.Metadata{Archive: s.cfg.Archive, Log: s.cfg.Logger}
	dst := filepath.Join(base, "dest")
	tr, err := s.getTree(context.Background(), "x/d", dst, Options{Contents: true})
	if err != nil || tr.Failed != 0 {
		t.Fatalf("%v %+v", err, tr)
	}
	check := func(p string, uid, gid uint32, mode uint32, lstat bool) {
		t.Helper()
		var st unix.Stat_t
		stat := unix.Stat
		if lstat {
			stat = unix.Lstat
		}
		if err := stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != uid || st.Gid != gid || (mode != 0 && st.Mode&0o7777 != mode) {
			t.Errorf("%s: %d:%d %#o, want %d:%d %#o", p, st.Uid, st.Gid, st.Mode&0o7777, uid, gid, mode)
		}
		if st.Mtim.Nano() != mt {
			t.Errorf("%s: mtime %v, want %v", p, time.Unix(0, st.Mtim.Nano()), time.Unix(0, mt))
		}
	}
	check(dst, 12345, 12346, 0o2775, false)
	check(filepath.Join(dst, "tmp"), 12347, 0, 0o1777, false)
	check(filepath.Join(dst, "esc"), 12345, 12346, 0, true)
	var st unix.Stat_t // the symlink's target: untouched
	if unix.Stat(outside, &st); st.Uid != 0 || st.Gid != 0 || st.Mtim.Nano() == mt {
		t.Errorf("outside: %d:%d, mtime %v: set through the symlink", st.Uid, st.Gid, st.Mtim)
	}
	if v, err := unix.Getxattr(filepath.Join(dst, "tmp"), "user.k", make([]byte, 16)); err == unix.ENOTSUP {
		t.Log("no xattrs on this file system")
	} else if err != nil || v != 3 {
		t.Errorf("tmp: user.k: %d %v", v, err)
	}
	if _, err := unix.Getxattr(outside, "user.k", make([]byte, 16)); err != unix.ENODATA && err != unix.ENOTSUP {
		t.Errorf("an xattr was set through the symlink: %v", err)
	}
}

// A target that sends no Meta although asked still copies the tree,
// and the options that need Meta are warned about once.
func TestTreeMetaTargetSendsNone(t *testing.T) {
	tree := metaLister{top: protocol.Entry{Type: protocol.FileDir, Mode: 0o755},
		fakeLister: fakeLister{"x/d": {
			{Type: protocol.FileSymlink, Name: "a", Target: "x"},
			{Type: protocol.FileDir, Name: "sub", Mode: 0o750},
		}, "x/d/sub": {{Type: protocol.FileSymlink, Name: "b", Target: "y"}}},
	}
	var logs bytes.Buffer
	s := &session{Session: new(initiator.Session), lister: tree, cfg: initiator.Config{Logger: logTo(&logs), Archive: local.Archive{Owner: true, Group: true, HardLinks: true, Xattrs: true}}}
	s.meta = &local.Metadata{Archive: s.cfg.Archive, Log: s.cfg.Logger}
	dst := filepath.Join(t.TempDir(), "dest")
	tr, err := s.getTree(context.Background(), "x/d", dst, Options{Contents: true})
	if err != nil || tr.Failed != 0 || tr.OK != 4 {
		t.Fatalf("%v %+v", err, tr)
	}
	if l, err := os.Readlink(filepath.Join(dst, "sub", "b")); err != nil || l != "y" {
		t.Errorf("sub/b: %q %v", l, err)
	}
	if n := strings.Count(logs.String(), "does not send owners"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, logs.String())
	}
}

// Files of one inode on the target: the first is copied, the rest are
// noted as links to it; a different inode, or nlink 1, is not.
func TestTreeMetaTakeLinks(t *testing.T) {
	s := &session{Session: new(initiator.Session), cfg: initiator.Config{Archive: local.Archive{HardLinks: true}, Logger: slog.New(slog.DiscardHandler)}}
	s.meta = &local.Metadata{Archive: s.cfg.Archive, Log: s.cfg.Logger}
	m := newTreeMeta(s)
	file := func(rel string, ino uint64, nlink uint32) initiator.Item {
		return initiator.Item{Rel: rel, Entry: protocol.Entry{Type: protocol.FileRegular, Name: filepath.Base(rel), Meta: &protocol.Meta{Dev: 1, Ino: ino, Nlink: nlink}}}
	}
	for _, c := range []struct {
		it   initiator.Item
		link bool
	}{
		{file("a", 10, 3), false},
		{file("d/b", 10, 3), true},
		{file("c", 11, 2), false},
		{file("d/e", 10, 3), true},
		{file("f", 12, 1), false},
		{file("g", 12, 1), false}, // nlink 1: the same inode twice is not a link
	} {
		if got := m.take(c.it); got != c.link {
			t.Errorf("%s: linked %v, want %v", c.it.Rel, got, c.link)
		}
	}
	if len(m.links) != 2 || m.links[0].to != "a" || m.links[1].rel != "d/e" {
		t.Errorf("links %+v", m.links)
	}
	s.cfg.Archive.HardLinks = false
	if newTreeMeta(s).take(file("x", 10, 3)) || newTreeMeta(s).take(file("y", 10, 3)) {
		t.Error("linked without -H")
	}
}

// placed links each link to its file once that file is in place, and
// fails a link whose file failed.
func TestTreeMetaPlacedLinks(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "old"), []byte("replaced"), 0o644)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	s := &session{Session: new(initiator.Session), cfg: initiator.Config{Archive: local.Archive{HardLinks: true}, Logger: slog.New(slog.DiscardHandler)}}
	s.meta = &local.Metadata{Archive: s.cfg.Archive, Log: s.cfg.Logger}
	m := newTreeMeta(s)
	m.links = []hardLink{{rel: "b", to: "a"}, {rel: "old", to: "a"}, {rel: "c", to: "gone"}}
	m.targets["a"], m.targets["gone"] = true, true
	res := m.placed(root, []pending{{res: FileResult{Status: StatusOK}, rel: "a"}, {res: FileResult{Status: StatusFailed}, rel: "gone"}}, true)
	if len(res) != 3 || res[0].Status != StatusOK || res[1].Status != StatusOK || res[2].Status != StatusFailed {
		t.Fatalf("%+v", res)
	}
	var a, b, old syscall.Stat_t
	syscall.Stat(filepath.Join(dir, "a"), &a)
	syscall.Stat(filepath.Join(dir, "b"), &b)
	syscall.Stat(filepath.Join(dir, "old"), &old)
	if a.Ino != b.Ino || a.Ino != old.Ino || a.Nlink != 3 {
		t.Errorf("inodes %d %d %d, nlink %d", a.Ino, b.Ino, old.Ino, a.Nlink)
	}
}

// metaLister is a fake target whose tree's root has an entry of its own.
type metaLister struct {
	fakeLister
	top protocol.Entry
}

func (m metaLister) Stat(context.Context, string) (protocol.Entry, error) { return m.top, nil }

func logTo(b *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
