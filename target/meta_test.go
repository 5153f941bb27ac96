package target_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// metaTree makes t/ with a file a, its hard link b, a symlink and a
// directory, a's user.k xattr (if the file system takes it), and a
// owned by 12345:12346 (as root).
func metaTree(t *testing.T) (dir string, xattrs bool) {
	dir = t.TempDir()
	root := filepath.Join(dir, "t")
	os.MkdirAll(filepath.Join(root, "sub"), 0o755)
	a := filepath.Join(root, "a")
	os.WriteFile(a, []byte("hello"), 0o644)
	if err := os.Link(a, filepath.Join(root, "b")); err != nil {
		t.Fatal(err)
	}
	os.Symlink("a", filepath.Join(root, "sl"))
	xattrs = unix.Setxattr(a, "user.k", []byte("v"), 0) == nil
	if os.Geteuid() == 0 {
		os.Chown(a, 12345, 12346)
	}
	return dir, xattrs
}

// walkAll is every entry of a walk of data/t, by name.
func walkAll(t *testing.T, p *peer) map[string]protocol.Entry {
	t.Helper()
	m, err := p.call(&protocol.Walk{Algorithm: uint8(chunker.CRC32C), PackMax: 4096, Path: "data/t"})
	if err != nil {
		t.Fatal(err)
	}
	b := m.(*protocol.WalkBatch)
	if !b.Done {
		t.Fatal("a walk of 5 entries took more than one batch")
	}
	got := map[string]protocol.Entry{}
	for _, e := range b.Entries {
		got[e.Entry.Name] = e.Entry
	}
	p.call(&protocol.Close{Handle: b.Handle})
	return got
}

// An initiator that announces +meta +xattrs gets every entry's owner,
// inode, link count and xattrs, from Walk, List and Stat alike.
func TestMetaSent(t *testing.T) {
	dir, xattrs := metaTree(t)
	p := newPeerAs(t, serve(t, walkConfig(dir)), protocol.ClientString("test", protocol.FeatureMeta, protocol.FeatureXattrs))
	got := walkAll(t, p)
	var st syscall.Stat_t
	syscall.Lstat(filepath.Join(dir, "t", "a"), &st)
	for _, n := range []string{"a", "b", "sl", "sub"} {
		if got[n].Meta == nil {
			t.Fatalf("%s: no Meta", n)
		}
	}
	a, b := got["a"].Meta, got["b"].Meta
	if a.Dev != st.Dev || a.Ino != st.Ino || a.Nlink != 2 || b.Ino != a.Ino || b.Dev != a.Dev {
		t.Errorf("a %+v, b %+v: want one inode %d, nlink 2", a, b, st.Ino)
	}
	if a.UID != st.Uid || a.GID != st.Gid {
		t.Errorf("a owned by %d:%d, want %d:%d", a.UID, a.GID, st.Uid, st.Gid)
	}
	if sub := got["sub"].Meta; os.Geteuid() == 0 && (sub.User != "root" || a.User != "") {
		t.Errorf("names: sub's owner %q (want root), a's %q (want none: 12345 has no name)", sub.User, a.User)
	}
	if xattrs && (len(a.Xattrs) != 1 || a.Xattrs[0].Name != "user.k" || string(a.Xattrs[0].Value) != "v") {
		t.Errorf("a's xattrs %+v", a.Xattrs)
	}
	m, err := p.call(&protocol.Stat{Path: "data/t/a"})
	if err != nil {
		t.Fatal(err)
	}
	if e := m.(*protocol.StatReply).Entry; e.Meta == nil || e.Meta.Ino != st.Ino || (xattrs && len(e.Meta.Xattrs) != 1) {
		t.Errorf("Stat: %+v", e.Meta)
	}
	m, err = p.call(&protocol.Stat{Path: "data/t"})
	if err != nil || m.(*protocol.StatReply).Entry.Meta == nil {
		t.Errorf("Stat of the tree's root: %v %v", m, err)
	}
	m, err = p.call(&protocol.List{Path: "data/t"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range m.(*protocol.ListReply).Entries {
		if e.Meta == nil || (e.Name == "b" && e.Meta.Ino != st.Ino) {
			t.Errorf("List: %s: %+v", e.Name, e.Meta)
		}
	}
}

// An initiator that announces nothing (an older one) gets entries
// without Meta, in messages without FlagMeta, which it can decode; one
// that announces +meta alone gets no xattrs.
func TestMetaNotAsked(t *testing.T) {
	dir, _ := metaTree(t)
	addr := serve(t, walkConfig(dir))
	for n, e := range walkAll(t, newPeer(t, addr)) {
		if e.Meta != nil {
			t.Errorf("%s: Meta %+v to an initiator that did not ask", n, e.Meta)
		}
	}
	got := walkAll(t, newPeerAs(t, addr, protocol.ClientString("test", protocol.FeatureMeta)))
	if a := got["a"].Meta; a == nil || a.Nlink != 2 || len(a.Xattrs) != 0 {
		t.Errorf("+meta alone: %+v", a)
	}
}

// A Walk's rules leave excluded entries out at the target (that it does
// not enter an excluded directory: TestWalkerSkipsExcluded).
func TestWalkRulesExclude(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "t")
	os.MkdirAll(filepath.Join(root, "node_modules", "deep"), 0o755)
	for i := range 300 {
		os.WriteFile(filepath.Join(root, "node_modules", fmt.Sprintf("m%03d", i)), []byte("x"), 0o644)
	}
	os.WriteFile(filepath.Join(root, "keep.c"), []byte("c"), 0o644)
	os.WriteFile(filepath.Join(root, "drop.o"), []byte("o"), 0o644)
	p := newPeerAs(t, serve(t, walkConfig(dir)), "test")
	m, err := p.call(&protocol.Walk{Algorithm: uint8(chunker.CRC32C), PackMax: 4096, Path: "data/t",
		Rules: []protocol.WalkRule{{Pattern: "node_modules/"}, {Pattern: "*.o"}}})
	if err != nil {
		t.Fatal(err)
	}
	b := m.(*protocol.WalkBatch)
	var names []string
	for _, e := range b.Entries {
		names = append(names, e.Entry.Name)
	}
	if !b.Done || len(names) != 1 || names[0] != "keep.c" {
		t.Errorf("walk with excludes sent %q (done %v), want only keep.c", names, b.Done)
	}
	if _, err := p.call(&protocol.Walk{Path: "data/t", Rules: []protocol.WalkRule{{Pattern: ""}}}); err == nil {
		t.Error("a walk with an empty rule was taken")
	}
}
