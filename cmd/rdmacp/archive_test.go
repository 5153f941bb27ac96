package main

import (
	"bytes"
	le "encoding/binary"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// archiveTree makes the tree the -a tests copy, as root: setuid,
// setgid and sticky modes, files owned by others, a hard link pair, a
// symlink with an old mtime and a user.* xattr (false if the file
// system has none).
func archiveTree(t *testing.T) (dir string, xattrs bool) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: setuid bits and owners")
	}
	dir = t.TempDir()
	root := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(root, "tmp"), 0o755)
	for name, mode := range map[string]os.FileMode{"suid": 0o4755, "sgid": 0o2755, "plain": 0o640, "a": 0o644, "owned": 0o600} {
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(p, uint32(mode)); err != nil {
			t.Fatal(err)
		}
	}
	unix.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chown(filepath.Join(root, "owned"), 12345, 12346)
	if err := os.Link(filepath.Join(root, "a"), filepath.Join(root, "tmp", "b")); err != nil {
		t.Fatal(err)
	}
	sl := filepath.Join(root, "sl")
	os.Symlink("a", sl)
	old := unix.NsecToTimespec(time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, sl, []unix.Timespec{old, old}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	xattrs = unix.Setxattr(filepath.Join(root, "plain"), "user.k", []byte("v"), 0) == nil
	return dir, xattrs
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// cp -a keeps setuid, setgid and sticky, owners, symlink mtimes; -H
// hard links; -X user.* xattrs.
func TestCpArchive(t *testing.T) {
	t.Parallel()
	dir, xattrs := archiveTree(t)
	s := serve(t, dir, nil)
	base := t.TempDir()
	dst := filepath.Join(base, "tree")
	if _, errs, code := run(t, "cp", "-a", "-H", "-X", "-q", s.addr+":data/tree/", dst); code != 0 {
		t.Fatalf("cp -a: exit %d: %s", code, errs)
	}
	for name, want := range map[string]uint32{"suid": 0o4755, "sgid": 0o2755, "tmp": 0o1777, "plain": 0o640} {
		if st := lstat(t, filepath.Join(dst, name)); st.Mode&0o7777 != want {
			t.Errorf("%s: mode %#o, want %#o", name, st.Mode&0o7777, want)
		}
	}
	src := filepath.Join(dir, "tree")
	for _, name := range []string{"owned", "suid", "tmp", "sl", "."} {
		want, got := lstat(t, filepath.Join(src, name)), lstat(t, filepath.Join(dst, name))
		if got.Uid != want.Uid || got.Gid != want.Gid {
			t.Errorf("%s: owned by %d:%d, want %d:%d", name, got.Uid, got.Gid, want.Uid, want.Gid)
		}
		if got.Mtim != want.Mtim {
			t.Errorf("%s: mtime %v, want %v", name, got.Mtim, want.Mtim)
		}
	}
	a, b := lstat(t, filepath.Join(dst, "a")), lstat(t, filepath.Join(dst, "tmp", "b"))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("a and tmp/b: inodes %d and %d, nlink %d: not one file", a.Ino, b.Ino, a.Nlink)
	}
	if xattrs {
		buf := make([]byte, 8)
		if n, err := unix.Getxattr(filepath.Join(dst, "plain"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
			t.Errorf("plain: user.k = %q, %v", buf[:n], err)
		}
	} else {
		t.Log("no user xattrs on this file system: -X not checked")
	}

	// A second run into the tree finds every file unchanged (size and
	// mtime): it reads nothing, yet puts back the owner and mode a
	// file lost in place, and keeps the hard link, as rsync -aH does.
	os.Lchown(filepath.Join(dst, "owned"), 0, 0)
	os.Chmod(filepath.Join(dst, "suid"), 0o755)
	out, errs, code := run(t, "cp", "-a", "-H", "-X", "--json", s.addr+":data/tree", base) // into base/tree

	if code != 0 {
		t.Fatalf("second cp -a: exit %d: %s", code, errs)
	}
	if sum := lastSummary(t, jsonLines(t, out)); sum["bytes_read"] != 0.0 {
		t.Errorf("second cp -a of an unchanged tree read %v bytes", sum["bytes_read"])
	}
	if st := lstat(t, filepath.Join(dst, "owned")); st.Uid != 12345 || st.Gid != 12346 {
		t.Errorf("second run: owned is %d:%d, want 12345:12346", st.Uid, st.Gid)
	}
	if st := lstat(t, filepath.Join(dst, "suid")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("second run: suid has mode %#o", st.Mode&0o7777)
	}
	if a, b := lstat(t, filepath.Join(dst, "a")), lstat(t, filepath.Join(dst, "tmp", "b")); a.Ino != b.Ino {
		t.Error("second run: a and tmp/b are no longer one file")
	}
}

// Without -a the default is as it was: mode & 0777 and mtimes kept,
// owners the copier's, hard links split, no xattrs.
func TestCpDefaultMeta(t *testing.T) {
	t.Parallel()
	dir, xattrs := archiveTree(t)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "out")
	if _, errs, code := run(t, "cp", "-r", "-q", s.addr+":data/tree/", dst); code != 0 {
		t.Fatalf("cp -r: exit %d: %s", code, errs)
	}
	for name, want := range map[string]uint32{"suid": 0o755, "sgid": 0o755, "tmp": 0o777, "plain": 0o640} {
		if st := lstat(t, filepath.Join(dst, name)); st.Mode&0o7777 != want {
			t.Errorf("%s: mode %#o, want %#o", name, st.Mode&0o7777, want)
		}
	}
	src := filepath.Join(dir, "tree")
	if got, want := lstat(t, filepath.Join(dst, "plain")), lstat(t, filepath.Join(src, "plain")); got.Mtim != want.Mtim {
		t.Errorf("plain: mtime %v, want %v", got.Mtim, want.Mtim)
	}
	if st := lstat(t, filepath.Join(dst, "owned")); st.Uid != 0 {
		t.Errorf("owned: uid %d without -o", st.Uid)
	}
	if a, b := lstat(t, filepath.Join(dst, "a")), lstat(t, filepath.Join(dst, "tmp", "b")); a.Ino == b.Ino {
		t.Error("a hard link without -H")
	}
	if _, err := unix.Getxattr(filepath.Join(dst, "plain"), "user.k", nil); xattrs && err != unix.ENODATA {
		t.Errorf("an xattr without -X: %v", err)
	}
}

// Single files honour -p, -o and -g (and -X) too.
func TestCpArchiveSingleFile(t *testing.T) {
	t.Parallel()
	dir, xattrs := archiveTree(t)
	s := serve(t, dir, nil)
	out := t.TempDir()
	if _, errs, code := run(t, "cp", "-p", "-q", s.addr+":data/tree/suid", filepath.Join(out, "suid")); code != 0 {
		t.Fatalf("cp -p: exit %d: %s", code, errs)
	}
	if st := lstat(t, filepath.Join(out, "suid")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("suid: mode %#o", st.Mode&0o7777)
	}
	if _, errs, code := run(t, "cp", "-o", "-g", "--numeric-ids", "-X", "-q", s.addr+":data/tree/owned", filepath.Join(out, "owned")); code != 0 {
		t.Fatalf("cp -og: exit %d: %s", code, errs)
	}
	if st := lstat(t, filepath.Join(out, "owned")); st.Uid != 12345 || st.Gid != 12346 {
		t.Errorf("owned: %d:%d", st.Uid, st.Gid)
	}
	if xattrs {
		if _, errs, code := run(t, "cp", "-X", "-q", s.addr+":data/tree/plain", filepath.Join(out, "plain")); code != 0 {
			t.Fatalf("cp -X: exit %d: %s", code, errs)
		}
		if _, err := unix.Getxattr(filepath.Join(out, "plain"), "user.k", nil); err != nil {
			t.Errorf("plain: user.k: %v", err)
		}
	}
}

// Owners go by name: a source file owned by nobody lands owned by this
// side's nobody.
func TestCpArchiveOwnerByName(t *testing.T) {
	t.Parallel()
	dir, _ := archiveTree(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	p := filepath.Join(dir, "tree", "plain")
	os.Lchown(p, uid, -1)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "plain")
	if _, errs, code := run(t, "cp", "-o", "-q", s.addr+":data/tree/plain", dst); code != 0 {
		t.Fatalf("cp -o: exit %d: %s", code, errs)
	}
	if st := lstat(t, dst); int(st.Uid) != uid {
		t.Errorf("uid %d, want nobody's %d", st.Uid, uid)
	}
}

// aclXattr is a POSIX ACL in the kernel's xattr form (version 2, then
// tag, perm, id per entry): user::rw- user:12345:r-- group::r-- mask::r-- other::---.
func aclXattr() []byte {
	b := le.LittleEndian.AppendUint32(nil, 2)
	for _, e := range [][3]uint32{{0x01, 6, 0xffffffff}, {0x02, 4, 12345}, {0x04, 4, 0xffffffff}, {0x10, 4, 0xffffffff}, {0x20, 0, 0xffffffff}} {
		b = le.LittleEndian.AppendUint16(b, uint16(e[0]))
		b = le.LittleEndian.AppendUint16(b, uint16(e[1]))
		b = le.LittleEndian.AppendUint32(b, e[2])
	}
	return b
}

// -A keeps a POSIX ACL; -X alone does not.
func TestCpACLs(t *testing.T) {
	t.Parallel()
	dir, _ := archiveTree(t)
	p := filepath.Join(dir, "tree", "plain")
	if err := unix.Setxattr(p, "system.posix_acl_access", aclXattr(), 0); err != nil {
		t.Skipf("no POSIX ACLs on this file system: %v", err)
	}
	want := make([]byte, 256)
	n, _ := unix.Getxattr(p, "system.posix_acl_access", want)
	want = want[:n]
	s := serve(t, dir, nil)
	out := t.TempDir()
	if _, errs, code := run(t, "cp", "-a", "-A", "-q", s.addr+":data/tree/", filepath.Join(out, "a")); code != 0 {
		t.Fatalf("cp -aA: exit %d: %s", code, errs)
	}
	got := make([]byte, 256)
	n, err := unix.Getxattr(filepath.Join(out, "a", "plain"), "system.posix_acl_access", got)
	if err != nil || !bytes.Equal(got[:n], want) {
		t.Errorf("ACL % x, %v; want % x", got[:max(n, 0)], err, want)
	}
	if _, errs, code := run(t, "cp", "-a", "-X", "-q", s.addr+":data/tree/", filepath.Join(out, "x")); code != 0 {
		t.Fatalf("cp -aX: exit %d: %s", code, errs)
	}
	if _, err := unix.Getxattr(filepath.Join(out, "x", "plain"), "system.posix_acl_access", got); err != unix.ENODATA {
		t.Errorf("an ACL without -A: %v", err)
	}
}

// A manifest's lines keep what -a keeps, packed (many small files in
// one round trip) or copied one by one.
func TestCpManifestArchive(t *testing.T) {
	t.Parallel()
	dir, _ := archiveTree(t)
	s := serve(t, dir, nil)
	out := t.TempDir()
	for _, pack := range []string{"", "--no-pack"} {
		dst := filepath.Join(out, "pack"+pack)
		os.Mkdir(dst, 0o755)
		manifest := filepath.Join(out, "m"+pack)
		os.WriteFile(manifest, []byte(s.addr+":data/tree/suid "+dst+"/suid\n"+s.addr+":data/tree/owned "+dst+"/owned\n"), 0o600)
		args := []string{"cp", "-a", "-q", "--from", manifest}
		if pack != "" {
			args = append(args, pack)
		}
		if _, errs, code := run(t, args...); code != 0 {
			t.Fatalf("cp -a --from %s: exit %d: %s", pack, code, errs)
		}
		if st := lstat(t, filepath.Join(dst, "suid")); st.Mode&0o7777 != 0o4755 {
			t.Errorf("%s: suid has mode %#o, want 04755", pack, st.Mode&0o7777)
		}
		if st := lstat(t, filepath.Join(dst, "owned")); st.Uid != 12345 || st.Gid != 12346 {
			t.Errorf("%s: owned is %d:%d, want 12345:12346", pack, st.Uid, st.Gid)
		}
	}
}

// -a implies -r for --delete too, and a -c rerun of a -H tree keeps its
// links: a file found the same is a link target as a copied one is.
func TestCpArchiveRerun(t *testing.T) {
	t.Parallel()
	dir, _ := archiveTree(t)
	s := serve(t, dir, nil)
	base := t.TempDir()
	if _, errs, code := run(t, "cp", "-a", "-H", "-q", s.addr+":data/tree", base); code != 0 {
		t.Fatalf("cp -a -H: exit %d: %s", code, errs)
	}
	extra := filepath.Join(base, "tree", "extra")
	os.WriteFile(extra, []byte("gone from the source"), 0o644)
	if _, errs, code := run(t, "cp", "-a", "-H", "-c", "--delete", "-q", s.addr+":data/tree", base); code != 0 {
		t.Fatalf("cp -a -H -c --delete: exit %d: %s", code, errs)
	}
	if _, err := os.Lstat(extra); err == nil {
		t.Error("cp -a --delete left a file the source does not have")
	}
	if a, b := lstat(t, filepath.Join(base, "tree", "a")), lstat(t, filepath.Join(base, "tree", "tmp", "b")); a.Ino != b.Ino {
		t.Error("after cp -a -H -c: a and tmp/b are no longer one file")
	}
}

// A single file the quick check leaves (same size and mtime) still gets
// its mode and owner back, as rsync fixes them.
func TestCpQuickCheckFixesSingleFile(t *testing.T) {
	t.Parallel()
	dir, _ := archiveTree(t)
	s := serve(t, dir, nil)
	dst := filepath.Join(t.TempDir(), "owned")
	for i := 0; i < 2; i++ {
		out, errs, code := run(t, "cp", "-a", "--json", s.addr+":data/tree/owned", dst)
		if code != 0 {
			t.Fatalf("run %d: exit %d: %s", i, code, errs)
		}
		if i == 1 && !strings.Contains(out, `"unchanged":true`) {
			t.Errorf("the second run copied the file again: %s", out)
		}
		if st := lstat(t, dst); st.Uid != 12345 || st.Gid != 12346 || st.Mode&0o7777 != 0o600 {
			t.Errorf("run %d: %d:%d mode %#o, want 12345:12346 0600", i, st.Uid, st.Gid, st.Mode&0o7777)
		}
		os.Chown(dst, 0, 0)
		os.Chmod(dst, 0o644)
	}
}
