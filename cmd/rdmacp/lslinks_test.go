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
