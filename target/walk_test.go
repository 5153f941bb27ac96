package target

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/filter"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// testExport serves dir as the directory export "data".
func testExport(t testing.TB, dir string) *export {
	t.Helper()
	x, err := openExport(Export{Name: "data", Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.close)
	return x
}

// startWalk starts a walk of "data/"+rel with m's other fields.
func startWalk(t *testing.T, x *export, rel string, m protocol.Walk) *walker {
	t.Helper()
	m.Path = "data/" + rel
	w, err := newWalker(x, rel, &m, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	return w
}

// walked is an entry a walk made, with the path under the walk's root
// that its Dir number gives it, and a packed file's bytes.
type walked struct {
	rel  string
	e    protocol.WalkEntry
	data []byte
}

// walkAll runs w to its end as an initiator would follow it: each entry's
// path from its Dir number, each directory entry taking the next number.
// Packed files are read and closed as they come; after each entry, each
// is called (if set) with the walk in the state next left it.
func walkAll(t *testing.T, w *walker, each func(walked)) []walked {
	t.Helper()
	dirs := []string{""}
	var out []walked
	for {
		var we walkEntry
		if !w.next(&we) {
			break
		}
		if int(we.e.Dir) >= len(dirs) {
			t.Fatalf("%q in directory %d of %d", we.e.Entry.Name, we.e.Dir, len(dirs)-1)
		}
		g := walked{rel: path.Join(dirs[we.e.Dir], we.e.Entry.Name), e: we.e}
		if we.e.Entry.Type == protocol.FileDir {
			dirs = append(dirs, g.rel)
		}
		switch {
		case we.e.Packed:
			g.data = make([]byte, we.pk.size)
			if err := readFull(we.pk.fd, g.data); err != nil {
				t.Errorf("%s: %v", g.rel, err)
			}
			unix.Close(we.pk.fd)
		case we.pk.fd != -1:
			t.Errorf("%s: not packed, but comes with fd %d", g.rel, we.pk.fd)
		}
		out = append(out, g)
		if each != nil {
			each(g)
		}
	}
	return out
}

func mkfile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// opened watches directory dir for opens of what is in it; the returned
// function says which names were opened since.
func opened(t *testing.T, dir string) func() map[string]bool {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN); err != nil {
		t.Skipf("inotify: %v", err)
	}
	return func() map[string]bool {
		names := map[string]bool{}
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if err != nil || n <= 0 {
				return names
			}
			for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
				l := int(binary.NativeEndian.Uint32(b[12:]))
				name := b[unix.SizeofInotifyEvent : unix.SizeofInotifyEvent+l]
				if i := bytes.IndexByte(name, 0); i >= 0 {
					name = name[:i]
				}
				if len(name) > 0 {
					names[string(name)] = true
				}
				b = b[unix.SizeofInotifyEvent+l:]
			}
		}
	}
}

// The walk is depth first, each directory's entries sorted bytewise, a
// directory's contents right after its own entry; Dir numbers count the
// directory entries sent. Symlinks come with their text, special files
// as they are, never opened.
func TestWalkOrder(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "t")
	files := map[string][]byte{
		"B.txt":           []byte("upper"),
		"a/b/c.txt":       []byte("0123456789"),
		"a/big":           bytes.Repeat([]byte("x"), 200),
		"a/zero":          {},
		"naïve ✓/日本語.txt": []byte("jp!"),
		"z/y":             []byte("last"),
	}
	for rel, b := range files {
		mkfile(t, filepath.Join(root, rel), b)
	}
	os.MkdirAll(filepath.Join(root, "a", "empty"), 0o755)
	if err := syscall.Mkfifo(filepath.Join(root, "a", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink("../../../../etc/passwd", filepath.Join(root, "a", "link-out"))
	os.Symlink("a/b", filepath.Join(root, "link-in"))
	inA := opened(t, filepath.Join(root, "a"))

	x := testExport(t, dir)
	got := walkAll(t, startWalk(t, x, "t", protocol.Walk{PackMax: 100}), nil)
	type want struct {
		rel    string
		dir    uint32
		typ    protocol.FileType
		packed bool
		target string
	}
	wants := []want{
		{"B.txt", 0, protocol.FileRegular, true, ""},
		{"a", 0, protocol.FileDir, false, ""},   // 1
		{"a/b", 1, protocol.FileDir, false, ""}, // 2
		{"a/b/c.txt", 2, protocol.FileRegular, true, ""},
		{"a/big", 1, protocol.FileRegular, false, ""}, // after a/b's contents, larger than PackMax
		{"a/empty", 1, protocol.FileDir, false, ""},   // 3
		{"a/fifo", 1, protocol.FileFIFO, false, ""},
		{"a/link-out", 1, protocol.FileSymlink, false, "../../../../etc/passwd"},
		{"a/zero", 1, protocol.FileRegular, true, ""},
		{"link-in", 0, protocol.FileSymlink, false, "a/b"},
		{"naïve ✓", 0, protocol.FileDir, false, ""}, // 4
		{"naïve ✓/日本語.txt", 4, protocol.FileRegular, true, ""},
		{"z", 0, protocol.FileDir, false, ""}, // 5
		{"z/y", 5, protocol.FileRegular, true, ""},
	}
	if len(got) != len(wants) {
		var rels []string
		for _, g := range got {
			rels = append(rels, g.rel)
		}
		t.Fatalf("walked %q, want %d entries", rels, len(wants))
	}
	for i, w := range wants {
		g := got[i]
		e := g.e
		if g.rel != w.rel || e.Dir != w.dir || e.Entry.Type != w.typ || e.Packed != w.packed || e.Entry.Target != w.target || e.Code != 0 {
			t.Errorf("entry %d: %s in %d, %v packed %v target %q code %v; want %+v", i, g.rel, e.Dir, e.Entry.Type, e.Packed, e.Entry.Target, e.Code, w)
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, w.rel), &st); err != nil {
			t.Fatal(err)
		}
		if e.Entry.Mode != st.Mode&0o7777 || e.Entry.MtimeNs != st.Mtim.Nano() || (w.typ == protocol.FileRegular && e.Entry.Size != uint64(st.Size)) {
			t.Errorf("%s: mode %o mtime %d size %d, want %o %d %d", w.rel, e.Entry.Mode, e.Entry.MtimeNs, e.Entry.Size, st.Mode&0o7777, st.Mtim.Nano(), st.Size)
		}
		if w.packed && !bytes.Equal(g.data, files[w.rel]) {
			t.Errorf("%s: packed %q, want %q", w.rel, g.data, files[w.rel])
		}
	}
	names := inA()
	if names["fifo"] || names["link-out"] {
		t.Errorf("opened in a/: %v; the FIFO and the symlink must not be", names)
	}
	if !names["zero"] || !names["b"] {
		t.Errorf("opened in a/: %v; want zero and b among them (is the watch working?)", names)
	}
}

// A walk deeper than maxOpenDirs keeps no more than that many directories
// open, and opens the others again when it comes back to them.
func TestWalkDeep(t *testing.T) {
	const depth = 150
	dir := t.TempDir()
	p := filepath.Join(dir, "t")
	for l := 0; l <= depth; l++ {
		mkfile(t, filepath.Join(p, "z"), []byte{byte(l)})
		p = filepath.Join(p, "d")
	}
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skipf("no /proc/self/fd: %v", err)
		}
		return len(ents)
	}
	x := testExport(t, dir)

	t.Run("all", func(t *testing.T) {
		base := fds()
		w := startWalk(t, x, "t", protocol.Walk{PackMax: 1})
		most, closed := 0, 0
		got := walkAll(t, w, func(walked) {
			most = max(most, fds()-base)
			n := 0
			for _, d := range w.stack {
				if d.fd < 0 {
					n++
				}
			}
			closed = max(closed, n)
		})
		t.Logf("%d entries, at most %d more fds open, %d directories closed", len(got), most, closed)
		if most > maxOpenDirs+2 {
			t.Errorf("%d more fds open during the walk, want at most %d", most, maxOpenDirs+2)
		}
		if closed == 0 {
			t.Error("no directory of the walk's path was closed")
		}
		if len(got) != 2*depth+1 {
			t.Fatalf("%d entries, want %d", len(got), 2*depth+1)
		}
		for i, g := range got {
			var rel string
			var dirN int
			if i < depth { // the directories, on the way down
				rel = strings.Repeat("d/", i+1)
				rel, dirN = rel[:len(rel)-1], i
			} else { // the files, on the way up
				l := 2*depth - i
				rel, dirN = strings.Repeat("d/", l)+"z", l
			}
			if g.rel != rel || int(g.e.Dir) != dirN || g.e.Code != 0 {
				t.Fatalf("entry %d: %s in %d (code %v %s), want %s in %d", i, g.rel, g.e.Dir, g.e.Code, g.e.Message, rel, dirN)
			}
			if g.e.Entry.Type == protocol.FileRegular && (!g.e.Packed || len(g.data) != 1 || int(g.data[0]) != dirN) {
				t.Fatalf("%s: packed %v %v", rel, g.e.Packed, g.data)
			}
		}
	})

	// A closed directory that went away meanwhile, or was replaced by
	// another at its path: what was left of it, and of the closed ones
	// under it, fails (NotFound, or Changed: the walk does not read the
	// new one's files for the old one's names); the rest goes on.
	for i, tc := range []struct {
		name    string
		replace bool
		code    protocol.Code
	}{{"gone", false, protocol.CodeNotFound}, {"replaced", true, protocol.CodeChanged}} {
		const moved = 40
		t.Run(tc.name, func(t *testing.T) {
			w := startWalk(t, x, "t", protocol.Walk{})
			var closed []bool // by level, once at the bottom
			got := walkAll(t, w, func(g walked) {
				if closed == nil && len(w.stack) == depth+1 {
					for _, d := range w.stack {
						closed = append(closed, d.fd < 0)
					}
					from := filepath.Join(dir, "t", strings.Repeat("d/", moved))
					if err := os.Rename(from, filepath.Join(dir, fmt.Sprintf("moved%d", i))); err != nil {
						t.Fatal(err)
					}
					if tc.replace { // the same names, in new directories
						p := from
						for l := moved; l <= depth; l++ {
							mkfile(t, filepath.Join(p, "z"), []byte{byte(l)})
							p = filepath.Join(p, "d")
						}
					}
				}
			})
			if !closed[moved] {
				t.Fatalf("level %d still open at the bottom", moved)
			}
			failed := 0
			for _, g := range got[depth:] {
				l := int(g.e.Dir)
				if g.e.Entry.Name != "z" {
					t.Fatalf("%s after the directories", g.rel)
				}
				wantFail := l >= moved && closed[l]
				if (g.e.Code != 0) != wantFail {
					t.Errorf("%s: code %v %s, want failure %v", g.rel, g.e.Code, g.e.Message, wantFail)
				}
				if wantFail {
					failed++
					if g.e.Code != tc.code || g.e.Packed {
						t.Errorf("%s: code %v packed %v, want %v", g.rel, g.e.Code, g.e.Packed, tc.code)
					}
				}
			}
			if len(got) != 2*depth+1 || failed == 0 {
				t.Errorf("%d entries, %d failed", len(got), failed)
			}
		})
		// The next case walks the tree as it is now.
		os.RemoveAll(filepath.Join(dir, "t", strings.Repeat("d/", moved)))
		os.Rename(filepath.Join(dir, fmt.Sprintf("moved%d", i)), filepath.Join(dir, "t", strings.Repeat("d/", moved)))
	}
}

// An entry whose type changed between getdents and its open is sent with
// CodeChanged, as what it is now; a directory so sent still takes a Dir
// number, and so does one that could not be opened.
func TestWalkChangedType(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "t")
	mkfile(t, filepath.Join(root, "adir", "inner"), []byte("never sent"))
	mkfile(t, filepath.Join(root, "afile"), []byte("f"))
	os.Symlink("adir", filepath.Join(root, "alink"))
	os.Symlink("afile", filepath.Join(root, "aslink"))
	mkfile(t, filepath.Join(root, "sub", "x"), []byte("x"))
	mkfile(t, filepath.Join(root, "unk", "y"), []byte("y"))
	mkfile(t, filepath.Join(root, "unkf"), []byte("u"))
	x := testExport(t, dir)
	// What getdents says (or would have, a moment before).
	ents := []dirent{
		{"adir", unix.DT_REG},
		{"afile", unix.DT_DIR},
		{"alink", unix.DT_DIR},
		{"aslink", unix.DT_REG},
		{"gone", unix.DT_REG},
		{"gonedir", unix.DT_DIR},
		{"sub", unix.DT_DIR},
		{"unk", unix.DT_UNKNOWN},
		{"unkf", unix.DT_UNKNOWN},
	}
	type want struct {
		rel  string
		dir  uint32
		typ  protocol.FileType
		code protocol.Code
	}
	for _, packMax := range []uint64{0, 100} {
		w := startWalk(t, x, "t", protocol.Walk{PackMax: packMax})
		w.stack[0].ents = slices.Clone(ents)
		got := walkAll(t, w, nil)
		// A symlink listed as a regular file is opened, and refused, only
		// to be packed; otherwise its lstat is what it is.
		aslink := want{"aslink", 0, protocol.FileSymlink, protocol.CodeChanged}
		if packMax == 0 {
			aslink.code = 0
		}
		wants := []want{
			{"adir", 0, protocol.FileDir, protocol.CodeChanged}, // 1
			{"afile", 0, protocol.FileRegular, protocol.CodeChanged},
			{"alink", 0, protocol.FileSymlink, protocol.CodeChanged},
			aslink,
			{"gone", 0, 0, protocol.CodeNotFound},
			{"gonedir", 0, protocol.FileDir, protocol.CodeNotFound}, // 2
			{"sub", 0, protocol.FileDir, 0},                         // 3
			{"sub/x", 3, protocol.FileRegular, 0},
			{"unk", 0, protocol.FileDir, 0}, // 4
			{"unk/y", 4, protocol.FileRegular, 0},
			{"unkf", 0, protocol.FileRegular, 0},
		}
		if len(got) != len(wants) {
			t.Fatalf("pack max %d: %d entries, want %d: %+v", packMax, len(got), len(wants), got)
		}
		for i, w := range wants {
			g := got[i]
			if g.rel != w.rel || g.e.Dir != w.dir || g.e.Entry.Type != w.typ || g.e.Code != w.code {
				t.Errorf("pack max %d: %s in %d, %v code %v (%s); want %+v", packMax, g.rel, g.e.Dir, g.e.Entry.Type, g.e.Code, g.e.Message, w)
			}
			if g.e.Code != 0 && (g.e.Packed || g.e.Message == "") {
				t.Errorf("pack max %d: %s failed but packed %v, message %q", packMax, g.rel, g.e.Packed, g.e.Message)
			}
			if wantPacked := packMax > 0 && w.code == 0 && w.typ == protocol.FileRegular; g.e.Packed != wantPacked {
				t.Errorf("pack max %d: %s packed %v", packMax, g.rel, g.e.Packed)
			}
		}
	}
}

// shardOf is the shard of n that an initiator gives the file at path p.
func shardOf(p string, n uint32) uint32 {
	h := fnv.New32a()
	h.Write([]byte(p))
	return h.Sum32() % n
}

// With ShardN above 1, every directory is sent, and each other entry in
// the one shard its path hashes to.
func TestWalkShards(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "top", "t")
	var all []string
	for i := range 90 {
		rel := []string{"f%02d", "d0/f%02d", "d1/sub/f%02d", "d2/ü/f%02d"}[i%4]
		rel = strings.Replace(rel, "%02d", string(rune('a'+i/26))+string(rune('a'+i%26)), 1)
		mkfile(t, filepath.Join(root, rel), []byte(rel))
		all = append(all, rel)
	}
	os.Symlink("f00", filepath.Join(root, "d0", "link"))
	syscall.Mkfifo(filepath.Join(root, "d1", "fifo"), 0o644)
	all = append(all, "d0/link", "d1/fifo")
	slices.Sort(all)
	x := testExport(t, dir)

	const n = 3
	var union, dirs0 []string
	for i := range uint32(n) {
		got := walkAll(t, startWalk(t, x, "top/t", protocol.Walk{ShardI: i, ShardN: n, PackMax: 1 << 10}), nil)
		var dirs []string
		k := 0
		for _, g := range got {
			if g.e.Code != 0 {
				t.Errorf("shard %d: %s: %v %s", i, g.rel, g.e.Code, g.e.Message)
			}
			if g.e.Entry.Type == protocol.FileDir {
				dirs = append(dirs, g.rel)
				continue
			}
			if s := shardOf("data/top/t/"+g.rel, n); s != i {
				t.Errorf("shard %d has %s, which hashes to shard %d", i, g.rel, s)
			}
			if g.e.Entry.Type == protocol.FileRegular && !bytes.Equal(g.data, []byte(g.rel)) {
				t.Errorf("shard %d: %s holds %q", i, g.rel, g.data)
			}
			union = append(union, g.rel)
			k++
		}
		if k == 0 || k == len(all) {
			t.Errorf("shard %d of %d has %d of %d entries", i, n, k, len(all))
		}
		if i == 0 {
			dirs0 = dirs
		} else if !slices.Equal(dirs, dirs0) {
			t.Errorf("shard %d has directories %q, shard 0 %q", i, dirs, dirs0)
		}
	}
	slices.Sort(union)
	if !slices.Equal(union, all) {
		t.Errorf("the shards have\n%q\nwant each of\n%q\nonce", union, all)
	}
	if want := []string{"d0", "d1", "d1/sub", "d2", "d2/ü"}; !slices.Equal(dirs0, want) {
		t.Errorf("directories %q, want %q", dirs0, want)
	}
}

// A walk of a file, or of nothing, does not start; PackMax is capped by
// the window limit.
func TestNewWalkerErrors(t *testing.T) {
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "f"), []byte("file"))
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	x := testExport(t, dir)
	for rel, code := range map[string]protocol.Code{"f": protocol.CodeNotDir, "nope": protocol.CodeNotFound, "fifo": protocol.CodeNotDir} {
		// A FIFO is not opened for reading, which would wait for a writer.
		var w *walker
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			w, err = newWalker(x, rel, &protocol.Walk{Path: "data/" + rel}, 1<<20)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: newWalker blocked", rel)
		}
		if err == nil {
			w.close()
			t.Errorf("%s: walk started", rel)
			continue
		}
		if c, _ := fsCode(rel, err); c != code {
			t.Errorf("%s: %v (%v), want %v", rel, c, err, code)
		}
	}
	w, err := newWalker(x, ".", &protocol.Walk{Path: "data", PackMax: 1 << 40}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if w.packMax != 1<<20 {
		t.Errorf("pack max %d, want the window limit", w.packMax)
	}
}

// parseDirents skips ".", "..", deleted entries (inode 0) and stops at a
// record that does not fit.
func TestParseDirents(t *testing.T) {
	rec := func(ino uint64, typ uint8, name string) []byte {
		n := (19 + len(name) + 1 + 7) &^ 7
		b := make([]byte, n)
		binary.NativeEndian.PutUint64(b, ino)
		binary.NativeEndian.PutUint16(b[16:], uint16(n))
		b[18] = typ
		copy(b[19:], name)
		return b
	}
	var b []byte
	for _, r := range [][]byte{rec(1, unix.DT_DIR, "."), rec(2, unix.DT_DIR, ".."), rec(3, unix.DT_REG, "a"),
		rec(0, unix.DT_REG, "deleted"), rec(4, unix.DT_LNK, "a much longer name, with spaces"), rec(5, unix.DT_DIR, "")} {
		b = append(b, r...)
	}
	bad := rec(6, unix.DT_REG, "truncated")
	b = append(b, bad[:len(bad)-1]...)
	got := parseDirents(b, nil)
	want := []dirent{{"a", unix.DT_REG}, {"a much longer name, with spaces", unix.DT_LNK}}
	if !slices.Equal(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// What the target may not read fails entry by entry, and the walk goes
// on: a directory that cannot be opened still takes its Dir number, and
// one that can be listed but not searched sends each entry, failed.
func TestWalkUnreadable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads everything")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "t")
	for _, rel := range []string{"a/x", "locked/secret", "noexec/f", "noexec/sub/g", "noread", "z/y"} {
		mkfile(t, filepath.Join(root, rel), []byte(rel))
	}
	for p, mode := range map[string]os.FileMode{"locked": 0, "noexec": 0o600, "noread": 0} {
		os.Chmod(filepath.Join(root, p), mode)
		t.Cleanup(func() { os.Chmod(filepath.Join(root, p), 0o755) })
	}
	x := testExport(t, dir)
	type want struct {
		rel  string
		dir  uint32
		typ  protocol.FileType
		code protocol.Code
	}
	wants := []want{
		{"a", 0, protocol.FileDir, 0}, // 1
		{"a/x", 1, protocol.FileRegular, 0},
		{"locked", 0, protocol.FileDir, protocol.CodePermission}, // 2
		{"noexec", 0, protocol.FileDir, 0},                       // 3
		{"noexec/f", 3, 0, protocol.CodePermission},
		{"noexec/sub", 3, protocol.FileDir, protocol.CodePermission}, // 4
		{"noread", 0, protocol.FileRegular, protocol.CodePermission},
		{"z", 0, protocol.FileDir, 0}, // 5
		{"z/y", 5, protocol.FileRegular, 0},
	}
	got := walkAll(t, startWalk(t, x, "t", protocol.Walk{PackMax: 100}), nil)
	if len(got) != len(wants) {
		t.Fatalf("%d entries, want %d: %+v", len(got), len(wants), got)
	}
	for i, w := range wants {
		g := got[i]
		if g.rel != w.rel || g.e.Dir != w.dir || g.e.Entry.Type != w.typ || g.e.Code != w.code || g.e.Packed != (w.code == 0 && w.typ == protocol.FileRegular) {
			t.Errorf("%s in %d: %v code %v (%s) packed %v; want %+v", g.rel, g.e.Dir, g.e.Entry.Type, g.e.Code, g.e.Message, g.e.Packed, w)
		}
	}
}

// dtype gives a stat's mode the type getdents would have given it.
func TestDtype(t *testing.T) {
	for mode, want := range map[uint32]uint8{
		unix.S_IFREG | 0o644: unix.DT_REG, unix.S_IFDIR | 0o755: unix.DT_DIR, unix.S_IFLNK | 0o777: unix.DT_LNK,
		unix.S_IFBLK: unix.DT_BLK, unix.S_IFCHR: unix.DT_CHR, unix.S_IFIFO: unix.DT_FIFO, unix.S_IFSOCK: unix.DT_SOCK,
	} {
		if got := dtype(mode); got != want {
			t.Errorf("dtype(%#o) = %d, want %d", mode, got, want)
		}
	}
}

// A /proc file in a walked tree (bind-mounted there) is refused, never
// packed as the empty file its size claims.
func TestWalkRefusesPseudoFiles(t *testing.T) {
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "t", "hostname"), nil)
	mkfile(t, filepath.Join(dir, "t", "plain"), []byte("x"))
	if err := unix.Mount("/proc/sys/kernel/hostname", filepath.Join(dir, "t", "hostname"), "", unix.MS_BIND, ""); err != nil {
		t.Skipf("SKIP: bind mount of a /proc file: %v (needs root)", err)
	}
	defer unix.Unmount(filepath.Join(dir, "t", "hostname"), unix.MNT_DETACH)
	x := testExport(t, dir)
	got := map[string]walked{}
	for _, g := range walkAll(t, startWalk(t, x, "t", protocol.Walk{PackMax: 1 << 20, MaxEntries: 100}), nil) {
		got[g.rel] = g
	}
	h := got["hostname"]
	if h.e.Packed || h.e.Code != protocol.CodeUnsupported || !strings.Contains(h.e.Message, "pseudo file system") {
		t.Errorf("hostname: packed %v, code %v, %q; want refused as a pseudo-file", h.e.Packed, h.e.Code, h.e.Message)
	}
	if p := got["plain"]; !p.e.Packed || string(p.data) != "x" {
		t.Errorf("plain: packed %v, %q", p.e.Packed, p.data)
	}
}

// A sysfs file (4096 bytes by its size, whatever it holds) bind-mounted
// among plain files is refused, though the walk has checked and
// remembered the plain files' file system just before it: what the walk
// remembers is per file system, not per directory.
func TestWalkRefusesPseudoFileAfterPlain(t *testing.T) {
	const sys = "/sys/kernel/mm/transparent_hugepage/enabled"
	var st unix.Stat_t
	if err := unix.Stat(sys, &st); err != nil || st.Size == 0 {
		t.Skipf("SKIP: %s: %v, size %d", sys, err, st.Size)
	}
	dir := t.TempDir()
	for _, n := range []string{"a", "b-sys", "c"} {
		mkfile(t, filepath.Join(dir, "t", n), []byte(n))
	}
	if err := unix.Mount(sys, filepath.Join(dir, "t", "b-sys"), "", unix.MS_BIND, ""); err != nil {
		t.Skipf("SKIP: bind mount of a sysfs file: %v (needs root)", err)
	}
	defer unix.Unmount(filepath.Join(dir, "t", "b-sys"), unix.MNT_DETACH)
	x := testExport(t, dir)
	got := map[string]walked{}
	for _, g := range walkAll(t, startWalk(t, x, "t", protocol.Walk{PackMax: 1 << 20, MaxEntries: 100}), nil) {
		got[g.rel] = g
	}
	if h := got["b-sys"]; h.e.Packed || h.e.Code != protocol.CodeUnsupported || !strings.Contains(h.e.Message, "is on sysfs") {
		t.Errorf("b-sys: packed %v, code %v, %q; want refused as a pseudo-file", h.e.Packed, h.e.Code, h.e.Message)
	}
	for _, n := range []string{"a", "c"} {
		if p := got[n]; !p.e.Packed || string(p.data) != n {
			t.Errorf("%s: packed %v, %q", n, p.e.Packed, p.data)
		}
	}
}

// An excluded directory is not entered: its entries are never read (the
// walk's work counter counts every entry read).
func TestWalkerSkipsExcluded(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "t")
	os.MkdirAll(filepath.Join(root, "node_modules"), 0o755)
	for i := range 300 {
		os.WriteFile(filepath.Join(root, "node_modules", fmt.Sprintf("m%03d", i)), nil, 0o644)
	}
	os.WriteFile(filepath.Join(root, "keep"), nil, 0o644)
	x := testExport(t, dir)
	w := startWalk(t, x, "t", protocol.Walk{})
	var work atomic.Uint64
	w.work = &work
	var f filter.Filter
	f.Add("node_modules/", false)
	w.rules = &f
	got := walkAll(t, w, nil)
	if len(got) != 1 || got[0].rel != "keep" {
		t.Errorf("walked %d entries, want only keep", len(got))
	}
	if work.Load() > 50 {
		t.Errorf("read %d entries: the excluded directory was entered", work.Load())
	}
}
