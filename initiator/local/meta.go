package local

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// Archive says what a copy keeps of each file beyond its bytes, as
// rsync's parts of -a do. With none of them set a copy keeps permission
// bits (mode & 0777) and the mtimes of files and directories, as
// rdmacp always has.
type Archive struct {
	Perms      bool // -p: setuid, setgid and sticky too
	Owner      bool // -o: the owner, when run as root
	Group      bool // -g: the group (as root; else only groups this user is in)
	NumericIDs bool // --numeric-ids: owners by number, not by name
	Times      bool // -t: symlinks' mtimes too
	HardLinks  bool // -H: files of a tree that are one inode on the target land as one inode
	Xattrs     bool // -X: user.* extended attributes; trusted.* and security.* too as root
	ACLs       bool // -A: POSIX ACLs (the system.posix_acl_* attributes)
}

// NeedsMeta reports whether a needs what only a target's Meta tells.
func (a Archive) NeedsMeta() bool { return a.Owner || a.Group || a.HardLinks || a.Xattrs || a.ACLs }

// Features are what to ask for in Hello for a.
func (a Archive) Features() []string {
	var f []string
	if a.NeedsMeta() {
		f = append(f, protocol.FeatureMeta)
	}
	if a.Xattrs || a.ACLs {
		f = append(f, protocol.FeatureXattrs)
	}
	return f
}

// FileMode is the os mode for st_mode bits mode & 07777: os keeps
// setuid, setgid and sticky in bits of its own, and drops 07000.
func FileMode(mode uint32) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	if mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// ModeMask is the part of a source's mode a copy keeps.
func (a Archive) ModeMask() uint32 {
	if a.Perms {
		return 0o7777
	}
	return 0o777
}

// Metadata gives local files what a copy keeps of them beyond their
// bytes (Archive), the same way for every file of a session: each
// warning said once, each owner's name looked up once.
type Metadata struct {
	Archive Archive
	Log     *slog.Logger

	once  sync.Map // warning text -> struct{}
	mu    sync.Mutex
	users map[string]int
	grps  map[string]int
}

func (md *Metadata) warnOnce(msg string, args ...any) {
	if _, said := md.once.LoadOrStore(msg, struct{}{}); !said {
		md.Log.Warn(msg, args...)
	}
}

// ids are the owner and group to give a file with meta m (-1: leave it),
// by name unless NumericIDs, as rsync maps them: a name this side does
// not know, and id 0, go by number.
func (md *Metadata) ids(m *protocol.Meta) (uid, gid int) {
	a := md.Archive
	uid, gid = -1, -1
	root := os.Geteuid() == 0
	if a.Owner {
		if root {
			uid = md.mapID(&md.users, m.User, m.UID, func(n string) (string, error) {
				u, err := user.Lookup(n)
				if err != nil {
					return "", err
				}
				return u.Uid, nil
			})
		} else {
			md.warnOnce("-o/--owner needs root on this side: owners are not kept")
		}
	}
	if a.Group {
		gid = md.mapID(&md.grps, m.Group, m.GID, func(n string) (string, error) {
			g, err := user.LookupGroup(n)
			if err != nil {
				return "", err
			}
			return g.Gid, nil
		})
	}
	return uid, gid
}

func (md *Metadata) mapID(cache *map[string]int, name string, id uint32, find func(string) (string, error)) int {
	if md.Archive.NumericIDs || name == "" || id == 0 {
		return int(id)
	}
	md.mu.Lock()
	defer md.mu.Unlock()
	if v, ok := (*cache)[name]; ok {
		return v
	}
	if *cache == nil {
		*cache = map[string]int{}
	}
	v := int(id)
	if str, err := find(name); err == nil {
		if n, err := strconv.Atoi(str); err == nil {
			v = n
		}
	}
	(*cache)[name] = v
	return v
}

// HasMeta reports whether e came with the Meta that the archive options
// need, warning once if the target sent none (an older target).
func (md *Metadata) HasMeta(e protocol.Entry) bool {
	if !md.Archive.NeedsMeta() {
		return false
	}
	if e.Meta == nil {
		md.warnOnce("the target does not send owners, hard links or extended attributes although asked for them: -o, -g, -H, -X and -A do nothing for its entries")
		return false
	}
	return true
}

// keepXattr reports whether attribute name is one the options carry: ACLs
// with -A, user.* with -X, and trusted.* and security.* with -X as root
// (only root may set them).
func (a Archive) keepXattr(name string) bool {
	switch {
	case name == "system.posix_acl_access" || name == "system.posix_acl_default":
		return a.ACLs
	case name == "security.capability":
		// File capabilities grant privilege as setuid does: kept only
		// when -p keeps setuid too.
		return a.Xattrs && a.Perms && os.Geteuid() == 0
	case strings.HasPrefix(name, "user."):
		return a.Xattrs
	case strings.HasPrefix(name, "trusted."), strings.HasPrefix(name, "security."):
		return a.Xattrs && os.Geteuid() == 0
	}
	return false
}

// Set gives name in directory dir what the options keep of entry e
// beyond its bytes, mode & 0777 and mtime (which landing gave it): owner
// and group first (chown clears setuid and setgid), then the full mode
// with -p, then xattrs and ACLs, then a symlink's mtime. Everything goes
// through dir's descriptor and name, never following name if it is a
// symlink: nothing reaches outside the destination. Xattrs that cannot
// be set are warned about once; the rest is an error.
func (md *Metadata) Set(dir *os.File, name string, e protocol.Entry) error {
	a := md.Archive
	fd := int(dir.Fd())
	full := path.Join(dir.Name(), name)
	// A Meta with no links is the target's zero: it could not stat the
	// file (a race with a delete). Its ids are not root's.
	if md.HasMeta(e) && e.Meta.Nlink > 0 {
		if uid, gid := md.ids(e.Meta); uid >= 0 || gid >= 0 {
			if err := unix.Fchownat(fd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if !(errors.Is(err, unix.EPERM) && uid < 0) { // a group this user is not in: as rsync, not an error
					return &fs.PathError{Op: "chown", Path: full, Err: err}
				}
			}
		}
		if a.Xattrs || a.ACLs {
			md.setXattrs(fd, name, full, e.Meta)
		}
	}
	if e.Type != protocol.FileSymlink && (a.Perms || a.NeedsMeta()) {
		// chown cleared setuid and setgid, and ACLs may have changed the
		// group bits: the mode, once more and in full. fchmodat follows
		// symlinks, but name is not one: the landing made it.
		if err := unix.Fchmodat(fd, name, e.Mode&a.ModeMask(), 0); err != nil {
			return &fs.PathError{Op: "chmod", Path: full, Err: err}
		}
	}
	if e.Type == protocol.FileSymlink && a.Times {
		ts := unix.NsecToTimespec(e.MtimeNs)
		if err := unix.UtimesNanoAt(fd, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &fs.PathError{Op: "lchtimes", Path: full, Err: err}
		}
	}
	return nil
}

// setXattrs sets the attributes of m the options keep on name in
// directory fd. No *at call sets xattrs (before Linux 6.13): the
// directory's descriptor in /proc stands for its path, and lsetxattr
// does not follow name.
func (md *Metadata) setXattrs(fd int, name, full string, m *protocol.Meta) {
	if m.Flags&protocol.MetaXattrsOmitted != 0 {
		md.warnOnce("some files' extended attributes were not sent: unreadable on the target, or over the bound", "bound", protocol.MaxXattrBytes, "first", full)
	}
	p := "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name
	for _, x := range m.Xattrs {
		if !md.Archive.keepXattr(x.Name) {
			continue
		}
		if err := unix.Lsetxattr(p, x.Name, x.Value, 0); err != nil {
			md.warnOnce("extended attributes could not be set", "first", full, "attr", x.Name, "err", err)
		}
	}
}

// SetFile gives a single file just landed at dst what the options keep
// beyond its bytes, mode & 0777 and mtime.
func (md *Metadata) SetFile(dst string, e protocol.Entry) error {
	a := md.Archive
	if !a.Perms && !a.NeedsMeta() {
		return nil
	}
	d, err := os.Open(path.Dir(dst))
	if err != nil {
		return err
	}
	defer d.Close()
	return md.Set(d, path.Base(dst), e)
}
