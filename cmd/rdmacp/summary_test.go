package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A single file's summary line says how much was READ when that is not
// the whole file, as the tree summary and --json's bytes_read do: a
// sparse source's holes are not read, and the line once showed only
// "16.78 MB in 0.01s (2000 MB/s)", a rate the link never carried.
// A dense file's line stays as it was.
func TestSummarySaysBytesRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(16 << 20)
	f.WriteAt([]byte("abc"), 16<<20) // one data block at the end: the rest is a hole
	f.Close()
	writeFile(t, filepath.Join(dir, "dense"), 100000)
	s := serve(t, dir, nil)
	dst := t.TempDir()

	out, errs, code := run(t, "cp", s.addr+":data/sparse", dst+"/")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "16.78 MB in ") || !strings.Contains(out, "MB/s), 3 B read, ") {
		t.Errorf("sparse file's summary %q: want its 16.78 MB and \", 3 B read, \"", out)
	}
	out, errs, code = run(t, "cp", s.addr+":data/dense", dst+"/")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "100.00 kB in ") || strings.Contains(out, " read") {
		t.Errorf("dense file's summary %q: want its size and no \"read\"", out)
	}
}
