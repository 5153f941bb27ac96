package initiator

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/rdmacp/rdmacp/initiator/local"

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

// needsMeta reports whether a needs what only a target's Meta tells.
func (a Archive) needsMeta() bool { return a.Owner || a.Group || a.HardLinks || a.Xattrs || a.ACLs }

// features are what to ask for in Hello for a.
func (a Archive) features() []string {
	var f []string
	if a.needsMeta() {
		f = append(f, protocol.FeatureMeta)
	}
	if a.Xattrs || a.ACLs {
		f = append(f, protocol.FeatureXattrs)
	}
	return f
}

// fileMode is the os mode for st_mode bits mode & 07777: os keeps
// setuid, setgid and sticky in bits of its own, and drops 07000.
func fileMode(mode uint32) fs.FileMode {
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

// modeMask is the part of a source's mode a copy keeps.
func (a Archive) modeMask() uint32 {
	if a.Perms {
		return 0o7777
	}
	return 0o777
}

// metaState is what a session needs to apply metadata: the warnings it
// gives once, and the owners it has mapped by name.
type metaState struct {
	once  sync.Map // warning text -> struct{}: each said once a session
	mu    sync.Mutex
	users map[string]int
	grps  map[string]int
}

func (s *Session) warnOnce(msg string, args ...any) {
	if _, said := s.meta.once.LoadOrStore(msg, struct{}{}); !said {
		s.cfg.Logger.Warn(msg, args...)
	}
}

// ids are the owner and group to give a file with meta m (-1: leave it),
// by name unless NumericIDs, as rsync maps them: a name this side does
// not know, and id 0, go by number.
func (s *Session) ids(m *protocol.Meta) (uid, gid int) {
	a := s.cfg.Archive
	uid, gid = -1, -1
	root := os.Geteuid() == 0
	if a.Owner {
		if root {
			uid = s.mapID(&s.meta.users, m.User, m.UID, func(n string) (string, error) {
				u, err := user.Lookup(n)
				if err != nil {
					return "", err
				}
				return u.Uid, nil
			})
		} else {
			s.warnOnce("-o/--owner needs root on this side: owners are not kept")
		}
	}
	if a.Group {
		gid = s.mapID(&s.meta.grps, m.Group, m.GID, func(n string) (string, error) {
			g, err := user.LookupGroup(n)
			if err != nil {
				return "", err
			}
			return g.Gid, nil
		})
	}
	return uid, gid
}

func (s *Session) mapID(cache *map[string]int, name string, id uint32, find func(string) (string, error)) int {
	if s.cfg.Archive.NumericIDs || name == "" || id == 0 {
		return int(id)
	}
	s.meta.mu.Lock()
	defer s.meta.mu.Unlock()
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

// hasMeta reports whether e came with the Meta that the archive options
// need, warning once if the target sent none (an older target).
func (s *Session) hasMeta(e protocol.Entry) bool {
	if !s.cfg.Archive.needsMeta() {
		return false
	}
	if e.Meta == nil {
		s.warnOnce("the target does not send owners, hard links or extended attributes (an older rdmacp?): -o, -g, -H, -X and -A do nothing")
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

// setMeta gives name in directory dir what the options keep of entry e
// beyond its bytes, mode & 0777 and mtime (which landing gave it): owner
// and group first (chown clears setuid and setgid), then the full mode
// with -p, then xattrs and ACLs, then a symlink's mtime. Everything goes
// through dir's descriptor and name, never following name if it is a
// symlink: nothing reaches outside the destination. Xattrs that cannot
// be set are warned about once; the rest is an error.
func (s *Session) setMeta(dir *os.File, name string, e protocol.Entry) error {
	a := s.cfg.Archive
	fd := int(dir.Fd())
	full := path.Join(dir.Name(), name)
	// A Meta with no links is the target's zero: it could not stat the
	// file (a race with a delete). Its ids are not root's.
	if s.hasMeta(e) && e.Meta.Nlink > 0 {
		if uid, gid := s.ids(e.Meta); uid >= 0 || gid >= 0 {
			if err := unix.Fchownat(fd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if !(errors.Is(err, unix.EPERM) && uid < 0) { // a group this user is not in: as rsync, not an error
					return &fs.PathError{Op: "chown", Path: full, Err: err}
				}
			}
		}
		if a.Xattrs || a.ACLs {
			s.setXattrs(fd, name, full, e.Meta)
		}
	}
	if e.Type != protocol.FileSymlink && (a.Perms || a.needsMeta()) {
		// chown cleared setuid and setgid, and ACLs may have changed the
		// group bits: the mode, once more and in full. fchmodat follows
		// symlinks, but name is not one: the landing made it.
		if err := unix.Fchmodat(fd, name, e.Mode&a.modeMask(), 0); err != nil {
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
func (s *Session) setXattrs(fd int, name, full string, m *protocol.Meta) {
	if m.Flags&protocol.MetaXattrsOmitted != 0 {
		s.warnOnce("some files' extended attributes were not sent: unreadable on the target, or over the bound", "bound", protocol.MaxXattrBytes, "first", full)
	}
	p := "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name
	for _, x := range m.Xattrs {
		if !s.cfg.Archive.keepXattr(x.Name) {
			continue
		}
		if err := unix.Lsetxattr(p, x.Name, x.Value, 0); err != nil {
			s.warnOnce("extended attributes could not be set", "first", full, "attr", x.Name, "err", err)
		}
	}
}

// dirOf opens rel's directory in root for setMeta.
func dirOf(root *os.Root, rel string) (*os.File, string, error) {
	d, err := root.Open(path.Dir(rel))
	if err != nil {
		return nil, "", err
	}
	return d, path.Base(rel), nil
}

// treeMeta is a tree copy's metadata work: the entries whose metadata
// is set once they are in place, and the hard links to make.
type treeMeta struct {
	s       *Session
	mu      sync.Mutex                // the packer reports files found the same (inPlace) too
	entries map[string]protocol.Entry // by rel: files and symlinks
	first   map[[2]uint64]string      // the rel copied of each linked inode
	links   []hardLink
	kept    map[string]bool // link targets in place (landed, or found by the quick check)
	targets map[string]bool // the files links point at: the first of each linked inode
}

type hardLink struct {
	rel, to string
	e       protocol.Entry
}

func newTreeMeta(s *Session) *treeMeta {
	return &treeMeta{s: s, entries: map[string]protocol.Entry{}, first: map[[2]uint64]string{}, kept: map[string]bool{}, targets: map[string]bool{}}
}

// inPlace sets the metadata of a file the quick check left in place, at
// once (it is not waiting to be renamed), and lets links point at it.
func (m *treeMeta) inPlace(root *os.Root, rel string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, has := m.entries[rel]; has {
		delete(m.entries, rel)
		if err := m.set(root, rel, e); err != nil {
			return err
		}
	}
	if m.targets[rel] {
		m.kept[rel] = true
	}
	return nil
}

// take notes an entry the tree copies (a file or symlink), and reports
// whether it is a hard link to a file copied already: that one is not
// copied but linked, by links.
func (m *treeMeta) take(it item) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.s.cfg.Archive
	e := it.entry
	if e.Type != protocol.FileRegular && e.Type != protocol.FileSymlink {
		return false
	}
	if a.HardLinks && e.Type == protocol.FileRegular && m.s.hasMeta(e) && e.Meta.Nlink > 1 {
		k := [2]uint64{e.Meta.Dev, e.Meta.Ino}
		if to, ok := m.first[k]; ok {
			m.links = append(m.links, hardLink{rel: it.rel, to: to, e: e})
			return true
		}
		m.first[k] = it.rel
		m.targets[it.rel] = true
	}
	if a.Perms && e.Mode&0o7000 != 0 || a.needsMeta() || a.Times && e.Type == protocol.FileSymlink {
		m.entries[it.rel] = e
	}
	return false
}

// placed sets the metadata of the files and symlinks now in place (those
// waiting that did not fail), and forgets them; with final, it then makes
// the hard links to those that landed and returns the links' results.
// What it keeps from batch to batch is one path per hard-linked file that
// landed (for the links made at the end), not one per file.
func (m *treeMeta) placed(root *os.Root, waiting []pending, final bool) []FileResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range waiting {
		p := &waiting[i]
		e, has := m.entries[p.rel]
		delete(m.entries, p.rel)
		if p.res.Status != StatusOK {
			continue
		}
		if has {
			if err := m.set(root, p.rel, e); err != nil {
				p.res.Status, p.res.Err = StatusFailed, err
				continue
			}
		}
		if m.targets[p.rel] {
			m.kept[p.rel] = true
		}
	}
	if !final || len(m.links) == 0 {
		return nil
	}
	out := make([]FileResult, 0, len(m.links))
	for _, l := range m.links {
		fr := FileResult{Path: l.rel, Type: protocol.FileRegular, Status: StatusOK}
		if !m.kept[l.to] {
			fr.Status, fr.Err = StatusFailed, fmt.Errorf("%s: not linked: %s, the file it is a hard link of, failed", l.rel, l.to)
		} else if err := link(root, l.to, l.rel); err != nil {
			fr.Status, fr.Err = StatusFailed, err
		}
		out = append(out, fr)
	}
	m.links = nil
	return out
}

func (m *treeMeta) set(root *os.Root, rel string, e protocol.Entry) error {
	d, name, err := dirOf(root, rel)
	if err != nil {
		return err
	}
	defer d.Close()
	return m.s.setMeta(d, name, e)
}

// dir sets a directory's owner, mode and xattrs (its mtime is the
// caller's, last).
func (m *treeMeta) dir(root *os.Root, rel string, e protocol.Entry) error {
	if a := m.s.cfg.Archive; !a.Perms && !a.needsMeta() {
		return nil // the caller's chmod was all
	}
	if rel == "." {
		d, err := root.Open(".")
		if err != nil {
			return err
		}
		defer d.Close()
		return m.s.setMeta(d, ".", e)
	}
	return m.set(root, rel, e)
}

// link makes rel a hard link of to, replacing whatever rel was.
func link(root *os.Root, to, rel string) error {
	err := root.Link(to, rel)
	if errors.Is(err, fs.ErrExist) {
		tmp := path.Join(path.Dir(rel), local.TempName(path.Base(rel)))
		if err = root.Link(to, tmp); err == nil {
			if err = root.Rename(tmp, rel); err != nil {
				root.Remove(tmp)
			}
		}
	}
	return err
}

// fileMeta gives a single file just landed at dst what the options keep
// beyond its bytes, mode & 0777 and mtime.
func (s *Session) fileMeta(dst string, e protocol.Entry) error {
	a := s.cfg.Archive
	if !a.Perms && !a.needsMeta() {
		return nil
	}
	d, err := os.Open(path.Dir(dst))
	if err != nil {
		return err
	}
	defer d.Close()
	return s.setMeta(d, path.Base(dst), e)
}
