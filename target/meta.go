package target

import (
	"os/user"
	"path"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// metaWant is the metadata an initiator announced it wants in Hello.
type metaWant uint8

const (
	wantMeta   metaWant = 1 << iota // owner, inode, link count
	wantXattrs                      // and extended attributes
)

func wantOf(client string) metaWant {
	var w metaWant
	if protocol.HasFeature(client, protocol.FeatureMeta) {
		w |= wantMeta
	}
	if protocol.HasFeature(client, protocol.FeatureXattrs) {
		w |= wantMeta | wantXattrs
	}
	return w
}

// idNames caches the names of user and group ids: a tree has few owners
// and many files, and a lookup may read /etc/passwd or ask NSS.
type idNames struct {
	mu     sync.Mutex
	users  map[uint32]string
	groups map[uint32]string
}

func (n *idNames) user(id uint32) string {
	return n.lookup(&n.users, id, func(s string) (string, error) {
		u, err := user.LookupId(s)
		if err != nil {
			return "", err
		}
		return u.Username, nil
	})
}

func (n *idNames) group(id uint32) string {
	return n.lookup(&n.groups, id, func(s string) (string, error) {
		g, err := user.LookupGroupId(s)
		if err != nil {
			return "", err
		}
		return g.Name, nil
	})
}

func (n *idNames) lookup(m *map[uint32]string, id uint32, find func(string) (string, error)) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if name, ok := (*m)[id]; ok {
		return name
	}
	if *m == nil {
		*m = map[uint32]string{}
	}
	name, err := find(strconv.FormatUint(uint64(id), 10))
	if err != nil {
		name = "" // unknown here: the initiator uses the number
	}
	(*m)[id] = name
	return name
}

// statMeta is the Meta of a file as stat saw it, without xattrs.
func (n *idNames) statMeta(st *unix.Stat_t) *protocol.Meta {
	return &protocol.Meta{UID: st.Uid, GID: st.Gid, User: n.user(st.Uid), Group: n.group(st.Gid),
		Dev: st.Dev, Ino: st.Ino, Nlink: uint32(min(st.Nlink, 1<<32-1))}
}

// metaAt is the Meta of name in directory dirfd, not following a
// symlink; nil if it cannot be stat'ed (the entry then says why not
// otherwise, and gets a zero Meta).
func (ss *session) metaAt(dirfd int, name string) *protocol.Meta {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &protocol.Meta{}
	}
	m := ss.names.statMeta(&st)
	if ss.want&wantXattrs != 0 {
		// No *at call reads xattrs (before Linux 6.13): the directory's
		// descriptor in /proc stands for its path, so nothing is
		// resolved again from the export's root, and l* does not
		// follow name if it is a symlink.
		p := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
		m.Xattrs, m.Flags = readXattrs(
			func(b []byte) (int, error) { return unix.Llistxattr(p, b) },
			func(a string, b []byte) (int, error) { return unix.Lgetxattr(p, a, b) })
	}
	return m
}

// fdMeta is the Meta of open file fd (nil if it cannot be stat'ed).
func (ss *session) fdMeta(fd int) *protocol.Meta {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return nil
	}
	m := ss.names.statMeta(&st)
	if ss.want&wantXattrs != 0 {
		m.Xattrs, m.Flags = readXattrs(
			func(b []byte) (int, error) { return unix.Flistxattr(fd, b) },
			func(a string, b []byte) (int, error) { return unix.Fgetxattr(fd, a, b) })
	}
	return m
}

// withMeta sets e.Meta as the session wants it: nil for an initiator
// that did not ask, the Meta of meta() otherwise, or a zero one where
// that fails, so that every entry of a reply has one and sizes add up.
func (ss *session) withMeta(e *protocol.Entry, meta func() *protocol.Meta) {
	if ss.want == 0 {
		e.Meta = nil
		return
	}
	if e.Meta == nil {
		e.Meta = meta()
	}
	if e.Meta == nil {
		e.Meta = &protocol.Meta{}
	}
}

// readXattrs reads a file's extended attributes with list and get, at
// most protocol.MaxXattrBytes of them: a file with more, or whose
// attributes cannot be read, gets none and MetaXattrsOmitted. A file
// system without xattrs has none.
func readXattrs(list func([]byte) (int, error), get func(string, []byte) (int, error)) ([]protocol.Xattr, uint8) {
	names, err := grow(list)
	switch {
	case err == unix.ENOTSUP || err == unix.EOPNOTSUPP:
		return nil, 0
	case err != nil:
		return nil, protocol.MetaXattrsOmitted
	}
	var xs []protocol.Xattr
	total := 0
	for _, a := range strings.Split(strings.TrimRight(string(names), "\x00"), "\x00") {
		if a == "" {
			continue
		}
		v, err := grow(func(b []byte) (int, error) { return get(a, b) })
		if err == unix.ENODATA {
			continue // removed since it was listed
		}
		total += len(a) + len(v)
		if err != nil || total > protocol.MaxXattrBytes {
			return nil, protocol.MetaXattrsOmitted
		}
		xs = append(xs, protocol.Xattr{Name: a, Value: v})
	}
	return xs, 0
}

// grow calls f with a buffer large enough for what it returns: the size
// first (f with nil), then the bytes, again if they grew in between.
func grow(f func([]byte) (int, error)) ([]byte, error) {
	for range 4 {
		n, err := f(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		if n > protocol.MaxXattrBytes {
			return nil, unix.E2BIG
		}
		b := make([]byte, n)
		n, err = f(b)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return nil, err
		}
		return b[:n], nil
	}
	return nil, unix.ERANGE
}

// listMeta sets the Meta of entries listed from directory rel of x.
func (ss *session) listMeta(x *export, rel string, ents []protocol.Entry) {
	if ss.want == 0 {
		return
	}
	dirfd := -1
	if x.root != nil {
		d, err := x.root.Open(rel)
		if err != nil {
			// A zero Meta for each (the initiator sets nothing from it),
			// rather than the directory's own.
			for i := range ents {
				ss.withMeta(&ents[i], func() *protocol.Meta { return nil })
			}
			return
		}
		defer d.Close()
		dirfd = int(d.Fd())
	}
	for i := range ents {
		e := &ents[i]
		ss.withMeta(e, func() *protocol.Meta {
			if dirfd < 0 {
				return ss.pathMeta(x, rel) // a single-file export lists itself
			}
			return ss.metaAt(dirfd, e.Name)
		})
	}
}

// pathMeta is the Meta of rel in x, reached through x's root (or its
// pinned file) as every other request reaches it.
func (ss *session) pathMeta(x *export, rel string) *protocol.Meta {
	if x.root == nil || rel == "." {
		var f interface {
			Fd() uintptr
			Close() error
		}
		var err error
		if x.root == nil {
			f, err = x.openPinned()
		} else {
			f, err = x.root.Open(".")
		}
		if err != nil {
			return nil
		}
		defer f.Close()
		return ss.fdMeta(int(f.Fd()))
	}
	d, err := x.root.Open(path.Dir(rel))
	if err != nil {
		return nil
	}
	defer d.Close()
	return ss.metaAt(int(d.Fd()), path.Base(rel))
}
