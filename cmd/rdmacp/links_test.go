package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ls of a symlink that leads nowhere or out of the export lists the
// link, as ls(1) and ls of the directory holding it do; it once failed
// with exit 5 ("no such file or directory", "leads outside the
// export"), while a link inside the export was listed. What it points
// at is never listed.
func TestLsDanglingAndOutsideLinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.Symlink("nowhere", filepath.Join(dir, "dangling"))
	os.Symlink("/etc", filepath.Join(dir, "out"))
	s := serve(t, dir, nil)
	for name, target := range map[string]string{"dangling": "nowhere", "out": "/etc"} {
		out, errs, code := run(t, "ls", "-l", s.addr+":data/"+name)
		if code != 0 || !strings.HasPrefix(out, "lrwxrwxrwx") || !strings.HasSuffix(out, " "+name+" -> "+target+"\n") {
			t.Errorf("ls -l %s: exit %d, stdout %q, stderr %q; want the link alone", name, code, out, errs)
		}
	}
	if _, _, code := run(t, "ls", s.addr+":data/missing"); code != exitRemote {
		t.Errorf("ls of a missing path: exit %d, want %d", code, exitRemote)
	}
}

// cp of a symlink to a directory, with -r, once answered "data/dl is a
// directory": the user had given -r. It now says it is a link and
// names the directory to copy, and that spelling works.
func TestCpLinkToDirNamesTheDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	writeFile(t, filepath.Join(dir, "sub", "f"), 1000)
	os.Symlink("sub", filepath.Join(dir, "dl"))
	s := serve(t, dir, nil)
	dst := t.TempDir()
	for _, src := range []string{"data/dl", "data/dl/"} {
		_, errs, code := run(t, "cp", "-r", s.addr+":"+src, dst+"/")
		if code != exitRemote || !strings.Contains(errs, "data/dl is a symlink to a directory (-> sub)") || !strings.Contains(errs, "with -r: data/sub") {
			t.Errorf("cp -r %s: exit %d, stderr %q; want exit %d naming data/sub", src, code, errs, exitRemote)
		}
	}
	if _, errs, code := run(t, "cp", "-r", s.addr+":data/sub", dst+"/"); code != 0 {
		t.Fatalf("the suggested cp -r data/sub: exit %d: %s", code, errs)
	}
	if fi, err := os.Stat(filepath.Join(dst, "sub", "f")); err != nil || fi.Size() != 1000 {
		t.Errorf("data/sub did not land: %v", err)
	}
}
