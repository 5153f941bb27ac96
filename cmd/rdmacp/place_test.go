package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestPlacementLikeRsync runs the same cases through rsync -a and
// rdmacp cp -r (trees) or cp (files), once and then again, and compares
// the trees they leave: where a copy lands (trailing slashes, DEST
// missing, a directory, ending in /, with and without --mkpath) and that
// the second run of the same command leaves what the first left.
func TestPlacementLikeRsync(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("rsync"); err != nil {
		t.Skip("SKIP: no rsync to compare with (apt-get install rsync)")
	}
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d", "sub"), 0o755)
	writeFile(t, filepath.Join(src, "d", "a"), 100)
	writeFile(t, filepath.Join(src, "d", "sub", "b"), 200)
	writeFile(t, filepath.Join(src, "f"), 300)
	s := serve(t, src, nil)
	for _, tc := range []struct {
		name  string
		setup string // made in DEST's base first: "dir P", "file P" (parents made too)
		src   string // relative to the export
		dst   string // relative to the base; a trailing / is kept
		flags []string
	}{
		{"tree into missing DEST", "", "d", "dst", nil},
		{"tree/ into missing DEST", "", "d/", "dst", nil},
		{"tree into existing DEST", "dir dst", "d", "dst", nil},
		{"tree/ into existing DEST", "dir dst", "d/", "dst", nil},
		{"tree into DEST/", "", "d", "dst/", nil},
		{"tree, DEST's parent missing", "", "d", "dst/x/y", nil},
		{"tree, DEST's parent missing, --mkpath", "", "d", "dst/x/y", []string{"--mkpath"}},
		{"tree onto a file", "file dst", "d", "dst", nil},
		{"tree/ onto a file", "file dst", "d/", "dst", nil},
		{"tree into missing DEST, dry run", "", "d", "dst", []string{"-n"}},
		{"file to missing DEST/, dry run", "", "f", "dst/", []string{"-n"}},
		// Type changes: rsync replaces a file with the source's directory
		// and an empty directory with its file; a non-empty directory in
		// a file's way stays (exit 23) unless --delete.
		{"a file where the tree has a directory", "file dst/d/sub", "d", "dst", nil},
		{"an empty directory where the tree has a file", "dir dst/d/a", "d", "dst", nil},
		{"a full directory where the tree has a file", "file dst/d/a/z", "d", "dst", nil},
		{"a full directory where the tree has a file, --delete", "file dst/d/a/z", "d", "dst", []string{"--delete"}},
		{"file to missing DEST", "", "f", "dst", nil},
		{"an empty directory where the file goes", "dir dst/f", "f", "dst", nil},
		{"a full directory where the file goes", "file dst/f/z", "f", "dst", nil},
		{"file to DEST/", "", "f", "dst/", nil},
		{"file into existing DEST", "dir dst", "f", "dst", nil},
		{"file, DEST's parent missing", "", "f", "dst/x/y", nil},
		{"file, DEST's parent missing, --mkpath", "", "f", "dst/x/y", []string{"--mkpath"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rsBase, rdBase := t.TempDir(), t.TempDir()
			for _, base := range []string{rsBase, rdBase} {
				kind, name, _ := strings.Cut(tc.setup, " ")
				switch kind {
				case "dir":
					os.MkdirAll(filepath.Join(base, name), 0o755)
				case "file":
					os.MkdirAll(filepath.Dir(filepath.Join(base, name)), 0o755)
					os.WriteFile(filepath.Join(base, name), []byte("x"), 0o644)
				}
			}
			recursive := strings.HasPrefix(tc.src, "d")
			for run := 1; run <= 2; run++ {
				args := append([]string{"-a"}, tc.flags...)
				rs := exec.Command("rsync", append(args, filepath.Join(src, tc.src)+slash(tc.src), filepath.Join(rsBase, tc.dst)+slash(tc.dst))...)
				rsOut, rsErr := rs.CombinedOutput()
				cp := []string{"cp", "-q"}
				if recursive {
					cp = append(cp, "-r")
				}
				_, errs, code := hrun(t, append(append(cp, tc.flags...), s.addr+":data/"+tc.src, filepath.Join(rdBase, tc.dst)+slash(tc.dst))...)
				if (rsErr == nil) != (code == 0) {
					t.Fatalf("run %d: rsync: %v %s; rdmacp: exit %d %s", run, rsErr, rsOut, code, errs)
				}
				if rsErr != nil && code != exitLocalIO && code != exitPartial {
					t.Errorf("run %d: rsync refused (%s); rdmacp exit %d, want %d (DEST): %s", run, rsOut, code, exitLocalIO, errs)
				}
				if got, want := listing(t, rdBase), listing(t, rsBase); got != want {
					t.Errorf("run %d: rdmacp left\n%s\nrsync left\n%s", run, got, want)
				}
			}
		})
	}
}

// A tree onto a file is refused naming DEST as a destination that is not
// a directory, with or without the source's trailing slash (SRC/ said
// "mkdir DEST: not a directory"), in a dry run too, and the file stays.
func TestTreeOntoFileMessage(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d"), 0o755)
	writeFile(t, filepath.Join(src, "d", "a"), 10)
	s := serve(t, src, nil)
	for _, from := range []string{"d", "d/"} {
		for _, dry := range []bool{false, true} {
			dst := filepath.Join(t.TempDir(), "file")
			os.WriteFile(dst, []byte("x"), 0o644)
			args := []string{"cp", "-q", "-r"}
			if dry {
				args = append(args, "-n")
			}
			_, errs, code := hrun(t, append(args, s.addr+":data/"+from, dst)...)
			want := dst + " exists and is not a directory"
			if code != exitLocalIO || !strings.Contains(errs, want) || strings.Contains(errs, "mkdir") {
				t.Errorf("cp -r %s (dry %v) onto a file: exit %d %q, want exit %d saying %q", from, dry, code, errs, exitLocalIO, want)
			}
			if b, err := os.ReadFile(dst); err != nil || string(b) != "x" {
				t.Errorf("cp -r %s (dry %v): the file became %q, %v", from, dry, b, err)
			}
		}
	}
}

// slash is "/" when p ends in one (filepath.Join drops it).
func slash(p string) string {
	if strings.HasSuffix(p, "/") {
		return "/"
	}
	return ""
}

// listing is every name under base with its type and, for files, size.
func listing(t *testing.T, base string) string {
	t.Helper()
	var lines []string
	filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == base {
			return err
		}
		rel, _ := filepath.Rel(base, p)
		if d.IsDir() {
			lines = append(lines, rel+"/")
			return nil
		}
		fi, _ := d.Info()
		lines = append(lines, fmt.Sprintf("%s %d", rel, fi.Size()))
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// --modify-window: a DEST whose mtimes are a second off (a file system
// with coarse times) is unchanged within a 2 s window, and copied again
// without one; a file copied alone too.
func TestModifyWindow(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d"), 0o755)
	writeFile(t, filepath.Join(src, "d", "a"), 5000)
	writeFile(t, filepath.Join(src, "d", "b"), 7000)
	s := serve(t, src, nil)
	out := t.TempDir()
	if _, errs, code := hrun(t, "cp", "-r", "-q", s.addr+":data/d", out); code != 0 {
		t.Fatalf("first copy: exit %d: %s", code, errs)
	}
	for _, n := range []string{"a", "b"} {
		p := filepath.Join(out, "d", n)
		fi, _ := os.Stat(p)
		os.Chtimes(p, fi.ModTime(), fi.ModTime().Add(time.Second))
	}
	for _, tc := range []struct {
		window    string
		unchanged float64
	}{{"2", 3}, {"0", 1}} { // the directory d is unchanged either way
		stdout, errs, code := hrun(t, "cp", "-r", "--json", "--modify-window", tc.window, s.addr+":data/d", out)
		if code != 0 {
			t.Fatalf("--modify-window %s: exit %d: %s", tc.window, code, errs)
		}
		if sum := summaryOf(t, stdout); sum["files_unchanged"] != tc.unchanged {
			t.Errorf("--modify-window %s: %v files unchanged, want %v", tc.window, sum["files_unchanged"], tc.unchanged)
		}
		if tc.window == "2" {
			continue
		}
		for _, n := range []string{"a", "b"} { // the copy put the source's mtimes back
			p := filepath.Join(out, "d", n)
			fi, _ := os.Stat(p)
			os.Chtimes(p, fi.ModTime(), fi.ModTime().Add(time.Second))
		}
	}
	f := filepath.Join(out, "d", "a")
	stdout, errs, code := hrun(t, "cp", "--json", "--modify-window", "1.5", s.addr+":data/d/a", f)
	if sum := summaryOf(t, stdout); code != 0 || sum["unchanged"] != true {
		t.Errorf("one file, --modify-window 1.5: exit %d, %v: %s", code, sum, errs)
	}
	if _, errs, code := hrun(t, "cp", "--modify-window", "-1", s.addr+":data/d/a", f); code != exitUsage {
		t.Errorf("--modify-window -1: exit %d, %s; want a usage error", code, errs)
	}
}
