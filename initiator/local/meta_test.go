package local

import (
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

func TestFileMode(t *testing.T) {
	for mode, want := range map[uint32]fs.FileMode{
		0o755:  0o755,
		0o4755: 0o755 | fs.ModeSetuid,
		0o2750: 0o750 | fs.ModeSetgid,
		0o1777: 0o777 | fs.ModeSticky,
		0o7000: fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky,
	} {
		if got := FileMode(mode); got != want {
			t.Errorf("fileMode(%#o) = %v, want %v", mode, got, want)
		}
	}
	if (Archive{}).ModeMask() != 0o777 || (Archive{Perms: true}).ModeMask() != 0o7777 {
		t.Error("mode masks")
	}
}

func TestArchiveFeatures(t *testing.T) {
	if f := (Archive{Perms: true, Times: true}).Features(); len(f) != 0 {
		t.Errorf("-pt asks for %v: it needs nothing new of the target", f)
	}
	if f := (Archive{Owner: true}).Features(); !slices.Contains(f, protocol.FeatureMeta) || slices.Contains(f, protocol.FeatureXattrs) {
		t.Errorf("-o asks for %v", f)
	}
	if f := (Archive{ACLs: true}).Features(); !slices.Contains(f, protocol.FeatureXattrs) {
		t.Errorf("-A asks for %v", f)
	}
}

func TestKeepXattr(t *testing.T) {
	x := Archive{Xattrs: true}
	acl := Archive{ACLs: true}
	root := os.Geteuid() == 0
	for _, c := range []struct {
		a    Archive
		name string
		want bool
	}{
		{x, "user.mime_type", true},
		{x, "trusted.overlay", root},
		{x, "security.selinux", root},
		{x, "system.posix_acl_access", false},
		{x, "system.other", false},
		{acl, "system.posix_acl_access", true},
		{acl, "system.posix_acl_default", true},
		{acl, "user.mime_type", false},
		// File capabilities grant privilege as setuid does: only with -p.
		{x, "security.capability", false},
		{Archive{Xattrs: true, Perms: true}, "security.capability", root},
	} {
		if got := c.a.keepXattr(c.name); got != c.want {
			t.Errorf("%+v keeps %s: %v, want %v", c.a, c.name, got, c.want)
		}
	}
}

func TestIDsByName(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("owners are kept as root only")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody here")
	}
	want, _ := strconv.Atoi(nobody.Uid)
	s := &Metadata{Archive: Archive{Owner: true, Group: true}, Log: slog.New(slog.DiscardHandler)}
	m := &protocol.Meta{Nlink: 1, UID: 4242, GID: 4343, User: "nobody", Group: "no-such-group-here"}
	if uid, gid := s.ids(m); uid != want || gid != 4343 {
		t.Errorf("by name: uid %d gid %d, want %d (nobody's) and 4343 (an unknown name goes by number)", uid, gid, want)
	}
	s.Archive.NumericIDs = true
	if uid, gid := s.ids(m); uid != 4242 || gid != 4343 {
		t.Errorf("--numeric-ids: uid %d gid %d", uid, gid)
	}
	s.Archive = Archive{}
	if uid, gid := s.ids(m); uid != -1 || gid != -1 {
		t.Errorf("without -o -g: uid %d gid %d, want both left", uid, gid)
	}
}

// A zero Meta (the target could not stat the entry) sets no owner: its
// ids are not root's.
func TestZeroMetaSetsNoOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, nil, 0o644)
	os.Chown(p, 12345, 12346)
	s := &Metadata{Archive: Archive{Owner: true, Group: true, NumericIDs: true}, Log: slog.New(slog.DiscardHandler)}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := s.Set(d, "f", protocol.Entry{Type: protocol.FileRegular, Mode: 0o644, Meta: &protocol.Meta{}}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Lstat(p, &st)
	if st.Uid != 12345 || st.Gid != 12346 {
		t.Errorf("a zero Meta chowned the file to %d:%d", st.Uid, st.Gid)
	}
}
