package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// smallTree makes dirs x per files of a few bytes under root.
func smallTree(t *testing.T, root string, dirs, per int) {
	t.Helper()
	for d := range dirs {
		sub := filepath.Join(root, fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := range per {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", f)), []byte(fmt.Sprintf("%d.%d\n", d, f)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func cpJSON(t *testing.T, args ...string) (map[string]any, []map[string]any) {
	t.Helper()
	out, errs, code := run(t, append([]string{"cp", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("cp %v: exit %d: %s\n%s", args, code, errs, out)
	}
	ls := jsonLines(t, out)
	return lastSummary(t, ls), ls
}

// The second run of an unchanged 10,000-file tree reads nothing: every
// file is unchanged by size and mtime. A file whose mtime changed is
// copied again; -I copies them all.
func TestCpQuickCheckTree(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	smallTree(t, filepath.Join(src, "tree"), 100, 100)
	s := serve(t, src, nil)
	dst := t.TempDir()
	sum, _ := cpJSON(t, "-r", s.addr+":data/tree", dst)
	if sum["regular_files"] != 10000.0 || sum["bytes_read"] == 0.0 {
		t.Fatalf("first run: %v", sum)
	}
	t0 := time.Now()
	sum, ls := cpJSON(t, "-r", s.addr+":data/tree", dst)
	t.Logf("second run: %v", time.Since(t0))
	if sum["bytes_read"] != 0.0 || sum["files_unchanged"] != sum["files"] || sum["regular_files"] != 10000.0 || sum["dirs"] != 101.0 {
		t.Fatalf("second run: %v", sum)
	}
	for _, l := range ls {
		if l["message_type"] == "file" && l["status"] != "unchanged" {
			t.Fatalf("second run: %v", l)
		}
	}
	// One file with another mtime (same size) is copied, alone.
	f := filepath.Join(src, "tree", "d007", "f042")
	os.WriteFile(f, []byte("7.XX\n"), 0o644)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(f, old, old)
	sum, ls = cpJSON(t, "-r", s.addr+":data/tree", dst)
	if sum["bytes_read"] != 5.0 || sum["files_unchanged"] != sum["files"].(float64)-1 {
		t.Fatalf("after one change: %v", sum)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "tree", "d007", "f042")); string(b) != "7.XX\n" {
		t.Fatalf("changed file not copied: %q", b)
	}
	_ = ls
	sum, _ = cpJSON(t, "-r", "-I", s.addr+":data/tree", dst)
	if sum["files_unchanged"] != 101.0 || sum["bytes_read"] == 0.0 {
		t.Fatalf("-I: %v", sum)
	}
}

// A single file: the quick check skips it unread; -c compares digests.
func TestCpQuickCheckFile(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "f"), 100<<10)
	s := serve(t, src, nil)
	dst := filepath.Join(t.TempDir(), "f")
	cpJSON(t, s.addr+":data/f", dst)
	sum, _ := cpJSON(t, s.addr+":data/f", dst)
	if sum["unchanged"] != true || sum["bytes_read"] != 0.0 {
		t.Fatalf("second copy: %v", sum)
	}
	sum, _ = cpJSON(t, "-c", s.addr+":data/f", dst)
	if sum["unchanged"] == true || sum["skipped"] != true || sum["digest"] == "" {
		t.Fatalf("-c: %v", sum)
	}
	// Same size, another mtime: copied.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(dst, old, old)
	sum, _ = cpJSON(t, s.addr+":data/f", dst)
	if sum["skipped"] == true || sum["bytes_read"] != float64(100<<10) {
		t.Fatalf("after touch: %v", sum)
	}
}

// treeNames lists root's tree, '/'-separated, directories with a '/'.
func treeNames(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if fi.IsDir() {
			rel += "/"
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	slices.Sort(out)
	return out
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// --delete removes what the source does not have, but what an exclude
// protects; with -n it lists the same and touches nothing.
func TestCpDelete(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	tree := filepath.Join(src, "tree")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "a"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(tree, "sub", "b"), []byte("b"), 0o644)
	s := serve(t, src, nil)
	dst := t.TempDir()
	cpJSON(t, "-r", s.addr+":data/tree", dst)
	top := filepath.Join(dst, "tree")
	os.WriteFile(filepath.Join(top, "gone"), []byte("x"), 0o644)
	os.MkdirAll(filepath.Join(top, "olddir", "deep"), 0o755)
	os.WriteFile(filepath.Join(top, "olddir", "deep", "f"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(top, "sub", "keep.o"), []byte("x"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(top, "link"))
	before := treeNames(t, top)

	out, errs, code := run(t, "cp", "-r", "-n", "--delete", "--exclude", "*.o", s.addr+":data/tree", dst)
	if code != 0 {
		t.Fatalf("-n --delete: exit %d: %s", code, errs)
	}
	l := lines(out)
	for _, want := range []string{"deleting gone", "deleting olddir/", "deleting link"} {
		if !slices.Contains(l, want) {
			t.Errorf("-n --delete: no %q in %q", want, l)
		}
	}
	if slices.Contains(l, "deleting sub/keep.o") {
		t.Errorf("-n --delete would delete an excluded file: %q", l)
	}
	if after := treeNames(t, top); !slices.Equal(after, before) {
		t.Fatalf("-n changed the tree: %v, was %v", after, before)
	}

	sum, ls := cpJSON(t, "-r", "--delete", "--exclude", "*.o", s.addr+":data/tree", dst)
	want := []string{"a", "sub/", "sub/b", "sub/keep.o"}
	if got := treeNames(t, top); !slices.Equal(got, want) {
		t.Fatalf("after --delete: %v, want %v", got, want)
	}
	if sum["deleted"] != 3.0 {
		t.Errorf("summary %v", sum)
	}
	var deleted []string
	for _, l := range ls {
		if l["status"] == "deleted" {
			deleted = append(deleted, l["path"].(string))
		}
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{"gone", "link", "olddir"}) {
		t.Errorf("deleted lines %v", deleted)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal("a symlink's target went with it")
	}
	if _, _, code := run(t, "cp", "--delete", s.addr+":data/tree/a", dst); code != exitUsage {
		t.Errorf("--delete without -r: exit %d, want %d", code, exitUsage)
	}
}

// --exclude, --include and --exclude-from, in the order given; an
// excluded directory is left out whole.
func TestCpExclude(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	tree := filepath.Join(src, "tree")
	for _, p := range []string{"main.c", "main.o", "notes.txt", "cache/x.c", "src/lib.c", "src/lib.o", "src/keep.o", "log.tmp"} {
		os.MkdirAll(filepath.Dir(filepath.Join(tree, p)), 0o755)
		os.WriteFile(filepath.Join(tree, p), []byte(p), 0o644)
	}
	from := filepath.Join(t.TempDir(), "rules")
	os.WriteFile(from, []byte("# temporary files\n*.tmp\n"), 0o644)
	s := serve(t, src, nil)
	dst := t.TempDir()
	_, errs, code := run(t, "cp", "-r", "--include", "keep.o", "--exclude", "*.o", "--exclude", "cache/", "--exclude-from", from, s.addr+":data/tree", dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := []string{"main.c", "notes.txt", "src/", "src/keep.o", "src/lib.c"}
	if got := treeNames(t, filepath.Join(dst, "tree")); !slices.Equal(got, want) {
		t.Fatalf("copied %v, want %v", got, want)
	}
	if _, _, code := run(t, "cp", "-r", "--exclude-from", "/nonexistent/rules", s.addr+":data/tree", dst); code != exitUsage {
		t.Errorf("a missing --exclude-from: exit %d, want %d", code, exitUsage)
	}
}

// -n lists what would be copied and makes nothing: not DEST, not a
// temporary file, into an existing tree neither.
func TestCpDryRunTouchesNothing(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	smallTree(t, filepath.Join(src, "tree"), 2, 3)
	s := serve(t, src, nil)
	dst := t.TempDir()
	out, errs, code := run(t, "cp", "-r", "-n", s.addr+":data/tree", dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if got := treeNames(t, dst); len(got) != 0 {
		t.Fatalf("-n made %v", got)
	}
	l := lines(out)
	for _, want := range []string{"d000/", "d000/f000", "d001/f002"} {
		if !slices.Contains(l, want) {
			t.Errorf("-n: no %q in %q", want, l)
		}
	}
	cpJSON(t, "-r", s.addr+":data/tree", dst)
	os.WriteFile(filepath.Join(src, "tree", "d001", "f002"), []byte("changed, longer\n"), 0o644)
	before := treeNames(t, dst)
	fi, _ := os.Stat(filepath.Join(dst, "tree", "d001"))
	sum, ls := cpJSON(t, "-r", "-n", s.addr+":data/tree", dst)
	if sum["dry_run"] != true || sum["bytes_read"] != 0.0 {
		t.Errorf("summary %v", sum)
	}
	var would []string
	for _, l := range ls {
		if l["status"] == "would-copy" {
			would = append(would, l["path"].(string))
		}
	}
	if !slices.Equal(would, []string{"d001/f002"}) {
		t.Errorf("would copy %v, want just d001/f002", would)
	}
	if after := treeNames(t, dst); !slices.Equal(after, before) {
		t.Fatalf("-n changed the tree: %v, was %v", after, before)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "tree", "d001", "f002")); string(b) != "1.2\n" {
		t.Fatalf("-n wrote the file: %q", b)
	}
	if fi2, _ := os.Stat(filepath.Join(dst, "tree", "d001")); !fi2.ModTime().Equal(fi.ModTime()) {
		t.Fatal("-n touched a directory")
	}
	// A single file too.
	out, _, code = run(t, "cp", "-n", s.addr+":data/tree/d000/f000", filepath.Join(dst, "one"))
	if _, err := os.Stat(filepath.Join(dst, "one")); code != 0 || err == nil || !strings.Contains(out, "dry run") {
		t.Fatalf("-n of a file: exit %d, %v, %q", code, err, out)
	}
}

// -v lists each entry as it lands, one line a path, rsync's way; the
// summary counts files, directories and links apart.
func TestCpVerboseAndCounts(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	tree := filepath.Join(src, "tree")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "a"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(tree, "sub", "b"), []byte("b"), 0o644)
	os.Symlink("a", filepath.Join(tree, "l"))
	s := serve(t, src, nil)
	dst := t.TempDir()
	out, errs, code := run(t, "cp", "-r", "-v", s.addr+":data/tree", dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	l := lines(out)
	got := slices.Clone(l[:len(l)-1])
	slices.Sort(got)
	if want := []string{"a", "l", "sub/", "sub/b"}; !slices.Equal(got, want) {
		t.Errorf("-v listed %q, want %q", got, want)
	}
	if sum := l[len(l)-1]; !strings.HasPrefix(sum, "2 files, 2 dirs, 1 link: ") || !strings.Contains(sum, " MB/s") && !strings.Contains(sum, "B in ") {
		t.Errorf("summary %q", sum)
	}
	// Nothing changed: -v lists nothing.
	out, _, _ = run(t, "cp", "-r", "-v", s.addr+":data/tree", dst)
	if l := lines(out); len(l) != 1 || !strings.Contains(l[0], "0 copied, 5 unchanged") {
		t.Errorf("second -v run: %q", l)
	}
}

// -q prints nothing at all when all goes well.
func TestCpQuietSilence(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	smallTree(t, filepath.Join(src, "tree"), 2, 2)
	writeFile(t, filepath.Join(src, "f"), 70<<10)
	s := serve(t, src, nil)
	dst := t.TempDir()
	for _, args := range [][]string{
		{"cp", "-q", "-r", s.addr + ":data/tree", dst},
		{"cp", "-q", "-r", s.addr + ":data/tree", dst}, // unchanged
		{"cp", "-q", s.addr + ":data/f", dst},
		{"cp", "-q", s.addr + ":data/f", dst},
	} {
		out, errs, code := run(t, args...)
		if code != 0 || out != "" || errs != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	// Errors still show.
	if _, errs, code := run(t, "cp", "-q", s.addr+":data/missing", dst); code == 0 || errs == "" {
		t.Errorf("-q of a missing file: exit %d, stderr %q", code, errs)
	}
}

// Like cp and rsync, DEST's directory must exist, for a file and for -r
// alike, and the message names it, not a temporary file.
func TestCpMissingDestDir(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	smallTree(t, filepath.Join(src, "tree"), 1, 1)
	s := serve(t, src, nil)
	missing := filepath.Join(t.TempDir(), "no", "such")
	for _, args := range [][]string{
		{"cp", s.addr + ":data/tree/d000/f000", filepath.Join(missing, "f")},
		{"cp", "-r", s.addr + ":data/tree", filepath.Join(missing, "t")},
	} {
		_, errs, code := run(t, args...)
		if code != exitLocalIO || !strings.Contains(errs, missing+": no such directory") || strings.Contains(errs, ".part") {
			t.Errorf("%v: exit %d, %q", args, code, errs)
		}
	}
	if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
		t.Error("a directory was made")
	}
}

// tempFor is the temporary name a run with pid would give to base.
func tempFor(base string, pid int, host string) string {
	return fmt.Sprintf(".%s.rdmacp-%d-%s-0badf00d.part", base, pid, host)
}

// hostOf is the HOST part of a temporary name rdmacp made here (a hash
// of the host, its boot and its pid namespace).
func hostOf(t *testing.T, name string) string {
	m := regexp.MustCompile(`\.rdmacp-[0-9]+-([0-9a-f]{8})-[0-9a-f]{8}\.part$`).FindStringSubmatch(name)
	if m == nil {
		t.Fatalf("%s is not a temporary name of rdmacp's", name)
	}
	return m[1]
}

// A copy SIGKILLed halfway leaves its temporary file; the next run into
// the same destination removes it and says so. A temporary file of a run
// still alive is left alone.
func TestCpCleansKilledRunsLeftovers(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "big"), 48<<20)
	s := serve(t, src, nil)
	dir := t.TempDir()
	dst := filepath.Join(dir, "big")
	cp := rdmacp("cp", "--json", "--qps", "1", "--depth", "1", "--read-size", "64K", s.addr+":data/big", dst)
	killed, _ := runUntil(t, cp, func(line []byte) bool {
		var st map[string]any
		json.Unmarshal(line, &st)
		left, _ := filepath.Glob(filepath.Join(dir, ".big.rdmacp-*.part"))
		return st["message_type"] == "status" && len(left) == 1
	}, func() { cp.Process.Kill() })
	if !killed {
		t.Skip("the copy finished before it could be killed")
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".big.rdmacp-*.part"))
	if len(left) != 1 {
		t.Fatalf("the killed run left %v", left)
	}
	host := hostOf(t, left[0])
	// A live run's file, for big and for another name.
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer live.Process.Kill()
	liveTemps := []string{filepath.Join(dir, tempFor("big", live.Process.Pid, host)), filepath.Join(dir, tempFor("other", live.Process.Pid, host))}
	for _, p := range liveTemps {
		os.WriteFile(p, []byte("live"), 0o600)
	}
	_, errs, code := run(t, "cp", s.addr+":data/big", dst)
	if code != 0 {
		t.Fatalf("rerun: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "removed "+left[0]+", left by a run that was killed") {
		t.Errorf("rerun did not say it removed %s: %q", left[0], errs)
	}
	if _, err := os.Stat(left[0]); !os.IsNotExist(err) {
		t.Errorf("leftover still there: %v", err)
	}
	for _, p := range liveTemps {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a live run's temporary file went: %v", err)
		}
	}

	// A tree: a dead run's temporary file in one of its directories.
	smallTree(t, filepath.Join(src, "tree"), 2, 2)
	tdst := t.TempDir()
	cpJSON(t, "-r", s.addr+":data/tree", tdst)
	dead := exec.Command("true")
	dead.Run()
	stale := filepath.Join(tdst, "tree", "d001", tempFor("f001", dead.Process.Pid, host))
	os.WriteFile(stale, []byte("stale"), 0o600)
	liveTree := filepath.Join(tdst, "tree", "d001", tempFor("f000", live.Process.Pid, host))
	os.WriteFile(liveTree, []byte("live"), 0o600)
	_, errs, code = run(t, "cp", "-r", "--delete", s.addr+":data/tree", tdst)
	if code != 0 || !strings.Contains(errs, "removed "+stale) {
		t.Errorf("tree rerun: exit %d: %q", code, errs)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("tree leftover still there: %v", err)
	}
	if _, err := os.Stat(liveTree); err != nil {
		t.Errorf("a live run's temporary file in the tree went (even with --delete): %v", err)
	}
}

// A fresh tree copy SIGKILLed halfway leaves its staged tree (a
// temporary directory beside DEST); the next run removes it and says so.
func TestCpCleansKilledTreeStage(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "tree"), 0o755)
	writeFile(t, filepath.Join(src, "tree", "big"), 48<<20)
	s := serve(t, src, nil)
	dir := t.TempDir()
	stages := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, ".tree.rdmacp-*.part"))
		return m
	}
	cp := rdmacp("cp", "-r", "--json", "--qps", "1", "--depth", "1", "--read-size", "64K", s.addr+":data/tree", dir)
	killed, _ := runUntil(t, cp, func(line []byte) bool { return isStatus(line) && len(stages()) == 1 }, func() { cp.Process.Kill() })
	if !killed {
		t.Skip("the copy finished before it could be killed")
	}
	left := stages()
	if len(left) != 1 {
		t.Fatalf("the killed run left %v", left)
	}
	_, errs, code := run(t, "cp", "-r", s.addr+":data/tree", dir)
	if code != 0 || !strings.Contains(errs, "removed "+left[0]+", left by a run that was killed") {
		t.Fatalf("rerun: exit %d: %q", code, errs)
	}
	if got := stages(); len(got) != 0 {
		t.Fatalf("still there: %v", got)
	}
	if fi, err := os.Stat(filepath.Join(dir, "tree", "big")); err != nil || fi.Size() != 48<<20 {
		t.Fatalf("rerun's copy: %v", err)
	}
}
