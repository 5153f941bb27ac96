package tree_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
	"github.com/rdmacp/rdmacp/protocol"
)

// makeTree fills dir with a tree exercising what -r must keep; it returns
// the regular files' contents by relative path.
func makeTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	mk := func(rel string, n int, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		files[rel] = rig.RandomFile(t, p, n)
		os.Chmod(p, mode)
	}
	mk("top.bin", 200<<10+3, 0o640)
	mk("a/b/c/d/e/f/g/h/deep.txt", 1000, 0o600)
	mk("naïve ✓/日本語.txt", 5, 0o755)
	mk("a/empty-file", 0, 0o644)
	os.MkdirAll(filepath.Join(dir, "empty/nested-empty"), 0o755)
	os.Symlink("a/b", filepath.Join(dir, "rel-link"))
	os.Symlink("../../../../etc/passwd", filepath.Join(dir, "a", "outside-link"))
	if err := syscall.Mkfifo(filepath.Join(dir, "a", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "a/b"), 0o750)
	mt := time.Date(2019, 5, 6, 7, 8, 9, 0, time.UTC)
	for rel := range files {
		os.Chtimes(filepath.Join(dir, rel), mt, mt)
	}
	for _, d := range []string{".", "a/b/c", "a/b", "empty", "naïve ✓"} {
		os.Chtimes(filepath.Join(dir, d), mt.Add(time.Hour), mt.Add(time.Hour))
	}
	return files
}

// Both ways a tree is copied: with Walk, and with List and Pack from a
// target that does not walk.
func TestGetTree(t *testing.T) {
	for _, tp := range treePaths {
		t.Run(tp.name, func(t *testing.T) { testGetTree(t, tp.noWalk) })
	}
}

func testGetTree(t *testing.T, noWalk bool) {
	e := rig.Start(t, nil)
	src := filepath.Join(e.Dir, "tree")
	files := makeTree(t, src)
	s, log := dialLogged(t, e)
	if noWalk {
		tree.ListTrees(s)
	}
	out := t.TempDir()
	var seen []tree.FileResult
	before := s.BytesRead()
	tr, err := tree.Get(context.Background(), s, "data/tree", out+"/", tree.Options{File: func(fr tree.FileResult) { seen = append(seen, fr) }})
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(out, "tree")
	if tr.Dest != dst || tr.Failed != 0 || tr.Skipped != 1 || len(tr.Files) != 0 || len(seen) != tr.OK+tr.Skipped {
		t.Fatalf("result %+v", tr)
	}
	var total int64
	for rel, want := range files {
		p := filepath.Join(dst, rel)
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: differs (%v)", rel, err)
			continue
		}
		total += int64(len(want))
		sfi, _ := os.Stat(filepath.Join(src, rel))
		fi, _ := os.Stat(p)
		if fi.Mode() != sfi.Mode() || !fi.ModTime().Equal(sfi.ModTime()) {
			t.Errorf("%s: %v %v, want %v %v", rel, fi.Mode(), fi.ModTime(), sfi.Mode(), sfi.ModTime())
		}
	}
	if got := s.BytesRead() - before; got != total || tr.BytesRead != total {
		t.Errorf("read %d (result says %d), want %d", got, tr.BytesRead, total)
	}
	for _, d := range []string{".", "a/b/c", "a/b", "empty", "empty/nested-empty", "naïve ✓"} {
		sfi, _ := os.Stat(filepath.Join(src, d))
		fi, err := os.Stat(filepath.Join(dst, d))
		if err != nil || !fi.IsDir() || fi.Mode() != sfi.Mode() || !fi.ModTime().Equal(sfi.ModTime()) {
			t.Errorf("dir %s: %v %v (%v), want %v %v", d, fi.Mode(), fi.ModTime(), err, sfi.Mode(), sfi.ModTime())
		}
	}
	for link, want := range map[string]string{"rel-link": "a/b", "a/outside-link": "../../../../etc/passwd"} {
		fi, err := os.Lstat(filepath.Join(dst, link))
		got, _ := os.Readlink(filepath.Join(dst, link))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 || got != want {
			t.Errorf("%s: %v %q, want a link to %q", link, err, got, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "a", "fifo")); err == nil {
		t.Error("the FIFO was copied")
	}
	filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
		if strings.Contains(p, ".rdmacp-") {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})

	// Again into the same place: everything is replaced, nothing fails.
	tr, err = tree.Get(context.Background(), s, "data/tree", out+"/", tree.Options{})
	if err != nil || tr.Failed != 0 {
		t.Fatalf("second copy: %v %+v", err, tr)
	}
	// With SkipSame nothing is read.
	before = s.BytesRead()
	tr, err = tree.Get(context.Background(), s, "data/tree", out+"/", tree.Options{SkipSame: true})
	if err != nil || tr.Failed != 0 || s.BytesRead() != before || tr.BytesRead != 0 {
		t.Fatalf("skip-same copy read %d: %v %+v", s.BytesRead()-before, err, tr)
	}
	log.walked(t, !noWalk)
}

// A file that fails leaves nothing at its destination, and the rest of
// the tree is copied.
func TestGetTreeOneFileFails(t *testing.T) {
	e := rig.Start(t, nil)
	os.Mkdir(filepath.Join(e.Dir, "t"), 0o755)
	rig.RandomFile(t, filepath.Join(e.Dir, "t", "a"), 1000)
	rig.RandomFile(t, filepath.Join(e.Dir, "t", "blocker"), 1000)
	rig.RandomFile(t, filepath.Join(e.Dir, "t", "z"), 1000)
	out := t.TempDir()
	// A non-empty directory where the file "blocker" must go.
	os.MkdirAll(filepath.Join(out, "t", "blocker", "x"), 0o755)
	s := e.Dial(t, nil)
	tr, err := tree.Get(context.Background(), s, "data/t", out, tree.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Failed != 1 || tr.OK != 3 { // a, z and the directory itself
		t.Fatalf("%+v", tr)
	}
	for _, n := range []string{"a", "z"} {
		if fi, err := os.Stat(filepath.Join(out, "t", n)); err != nil || fi.Size() != 1000 {
			t.Errorf("%s: %v", n, err)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(out, "t"))
	if len(ents) != 3 {
		t.Errorf("left: %v", ents)
	}
}

// Shards 0..N-1 of a tree copy every file exactly once between them, and
// each shard the same files whether the target walks the tree or it is
// listed.
func TestGetTreeShards(t *testing.T) {
	const n = 3
	shards := map[bool][][]string{} // by noWalk, then shard
	for _, tp := range treePaths {
		t.Run(tp.name, func(t *testing.T) { shards[tp.noWalk] = testGetTreeShards(t, tp.noWalk, n) })
	}
	if t.Failed() {
		return
	}
	for i := range n {
		if w, l := shards[false][i], shards[true][i]; strings.Join(w, ",") != strings.Join(l, ",") {
			t.Errorf("shard %d/%d: walked\n%v\nlisted\n%v", i, n, w, l)
		}
	}
}

// testGetTreeShards copies shards 0..n-1 of a tree and returns the files
// each one copied, sorted.
func testGetTreeShards(t *testing.T, noWalk bool, n int) [][]string {
	e := rig.Start(t, nil)
	var all []string
	for i := range 40 {
		rel := filepath.Join("d"+string(rune('0'+i%3)), "f"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		os.MkdirAll(filepath.Join(e.Dir, "t", filepath.Dir(rel)), 0o755)
		rig.RandomFile(t, filepath.Join(e.Dir, "t", rel), 10+i)
		all = append(all, rel)
	}
	rig.RandomFile(t, filepath.Join(e.Dir, "t", "top"), 100<<10) // too large to pack
	all = append(all, "top")
	sort.Strings(all)
	s, log := dialLogged(t, e)
	if noWalk {
		tree.ListTrees(s)
	}
	out := t.TempDir()
	var got []string
	shards := make([][]string, n)
	for i := range n {
		tr, err := tree.Get(context.Background(), s, "data/t", out, tree.Options{Shard: initiator.Shard{I: i, N: n}})
		if err != nil || tr.Failed != 0 {
			t.Fatalf("shard %d: %v %+v", i, err, tr)
		}
		for _, fr := range tr.Files {
			if fr.Type.String() == "file" {
				shards[i] = append(shards[i], fr.Path)
				if !(initiator.Shard{I: i, N: n}).Has("data/t/" + fr.Path) {
					t.Errorf("shard %d/%d copied %s, which is not its", i, n, fr.Path)
				}
			}
		}
		sort.Strings(shards[i])
		got = append(got, shards[i]...)
		if k := len(shards[i]); k == 0 || k == len(all) {
			t.Errorf("shard %d/%d took %d of %d files", i, n, k, len(all))
		}
	}
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(all, ",") {
		t.Fatalf("shards copied\n%v\nwant\n%v", got, all)
	}
	for _, rel := range all {
		if _, err := os.Stat(filepath.Join(out, "t", rel)); err != nil {
			t.Error(err)
		}
	}
	log.walked(t, !noWalk)
	return shards
}

// A tree copied to a new destination is staged beside it and appears
// whole at the end; interrupted, it leaves nothing.
func TestGetTreeStaged(t *testing.T) {
	e := rig.Start(t, nil)
	src := filepath.Join(e.Dir, "t")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	want := rig.RandomFile(t, filepath.Join(src, "sub", "big"), 1<<20) // read with Open, with progress
	rig.RandomFile(t, filepath.Join(src, "small"), 100)                // packed
	out := t.TempDir()
	dst := filepath.Join(out, "t")
	s := e.Dial(t, nil)
	staged := func() []string {
		m, _ := filepath.Glob(filepath.Join(out, ".t.rdmacp-*.part"))
		return m
	}
	var during []string
	check := func(initiator.Progress) {
		if _, err := os.Lstat(dst); err == nil {
			during = append(during, "destination exists")
		}
		if len(staged()) != 1 {
			during = append(during, "no staging directory")
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	_, err := tree.Get(ctx, s, "data/t", out, tree.Options{Progress: func(p initiator.Progress) { check(p); cancel() }})
	if err == nil {
		t.Fatal("an interrupted copy succeeded")
	}
	if _, err := os.Lstat(dst); err == nil || len(staged()) != 0 {
		t.Fatalf("interrupted copy left %v (destination: %v)", staged(), err)
	}

	s = e.Dial(t, nil)
	tr, err := tree.Get(context.Background(), s, "data/t", out, tree.Options{Progress: check})
	if err != nil || tr.Failed != 0 {
		t.Fatalf("%v %+v", err, tr)
	}
	if len(during) != 0 {
		t.Errorf("while copying: %v", during)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "sub", "big")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("sub/big differs (%v)", err)
	}
	if len(staged()) != 0 {
		t.Errorf("left %v", staged())
	}

	// A destination made while the tree was being copied is not replaced;
	// the staged copy goes, read-only directories and all.
	os.RemoveAll(dst)
	os.Chmod(filepath.Join(src, "sub"), 0o555)
	defer os.Chmod(filepath.Join(src, "sub"), 0o755)
	_, err = tree.Get(context.Background(), s, "data/t", out, tree.Options{Progress: func(initiator.Progress) { os.Mkdir(dst, 0o755) }})
	if err == nil {
		t.Fatal("the copy replaced a destination made meanwhile")
	}
	if ents, _ := os.ReadDir(dst); len(ents) != 0 {
		t.Errorf("the destination made meanwhile has %v", ents)
	}
	if len(staged()) != 0 {
		t.Errorf("left %v", staged())
	}
}

// A tree with more directories than a copy keeps open is copied whole,
// into a new destination and over an existing one, both ways of walking
// it: directories closed to stay within the bound are opened again.
func TestGetTreeManyDirectories(t *testing.T) {
	defer tree.SetDirCacheMax(2)()
	for _, tp := range treePaths {
		t.Run(tp.name, func(t *testing.T) {
			e := rig.Start(t, nil)
			src := filepath.Join(e.Dir, "t")
			files := map[string][]byte{}
			for i := range 30 {
				for j := range 3 {
					rel := filepath.Join(fmt.Sprintf("d%02d", i), fmt.Sprintf("s%d", i%4), fmt.Sprintf("f%d", j))
					os.MkdirAll(filepath.Join(src, filepath.Dir(rel)), 0o755)
					files[rel] = rig.RandomFile(t, filepath.Join(src, rel), 100+i*j)
				}
			}
			for _, rel := range []string{"d03/big", "d17/s1/big", "d29/big"} { // copied with Open
				files[rel] = rig.RandomFile(t, filepath.Join(src, rel), 300<<10)
			}
			s := e.Dial(t, nil)
			if tp.noWalk {
				tree.ListTrees(s)
			}
			out := t.TempDir()
			for _, what := range []string{"new", "existing"} {
				tr, err := tree.Get(context.Background(), s, "data/t", out, tree.Options{})
				if err != nil || tr.Failed != 0 {
					t.Fatalf("%s destination: %v %+v", what, err, tr)
				}
				checkTree(t, src, filepath.Join(out, "t"), files)
			}
		})
	}
}

// Each directory is reported once, however the walk leaves it: an empty
// directory inside one whose only entries are directories was finished
// twice, and its parent's count of what it waits for went wrong with it
// (cp -rv listed a/b/ twice, and counted 6 directories of 4).
func TestGetTreeReportsEachDirectoryOnce(t *testing.T) {
	for _, tp := range treePaths {
		t.Run(tp.name, func(t *testing.T) {
			e := rig.Start(t, nil)
			src := filepath.Join(e.Dir, "nest")
			for _, d := range []string{"a/b/c", "x"} {
				if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			files := map[string][]byte{"a/f": rig.RandomFile(t, filepath.Join(src, "a/f"), 10)}
			s := e.Dial(t, nil)
			if tp.noWalk {
				tree.ListTrees(s)
			}
			seen := map[string]int{}
			var mu sync.Mutex
			out := t.TempDir()
			tr, err := tree.Get(context.Background(), s, "data/nest", out, tree.Options{File: func(r tree.FileResult) {
				if r.Type == protocol.FileDir {
					mu.Lock()
					seen[r.Path]++
					mu.Unlock()
				}
			}})
			if err != nil || tr.Failed != 0 {
				t.Fatalf("%v %+v", err, tr)
			}
			checkTree(t, src, filepath.Join(out, "nest"), files)
			mu.Lock()
			defer mu.Unlock()
			for _, d := range []string{".", "a", "a/b", "a/b/c", "x"} {
				if seen[d] != 1 {
					t.Errorf("directory %q reported %d times, want once (all: %v)", d, seen[d], seen)
				}
			}
		})
	}
}
