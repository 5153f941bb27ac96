package main

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cached is the fraction of path's pages in the page cache.
func cached(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return float64(n) / float64(len(vec))
}

// cp lands with O_DIRECT where the file system takes it, so the copy is
// not left in the page cache; --no-direct writes through it.
func TestCpDirectAndNoDirect(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	var sf unix.Statfs_t
	if err := unix.Statfs(out, &sf); err != nil || sf.Type == unix.TMPFS_MAGIC || sf.Type == unix.RAMFS_MAGIC {
		t.Skipf("%s is in memory: cp lands buffered there", out)
	}
	probe, err := os.OpenFile(filepath.Join(out, "probe"), os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Skipf("%s does not take O_DIRECT: %v", out, err)
	}
	probe.Close()
	dir := t.TempDir()
	want := writeFile(t, filepath.Join(dir, "f"), 8<<20+5)
	s := serve(t, dir, nil)
	for _, c := range []struct {
		flags  []string
		direct bool
	}{{nil, true}, {[]string{"--no-direct"}, false}, {[]string{"-r"}, true}, {[]string{"-r", "--no-direct"}, false}} {
		dst := filepath.Join(out, "copy")
		os.RemoveAll(dst)
		src := s.addr + ":data/f"
		if len(c.flags) > 0 && c.flags[0] == "-r" {
			os.Mkdir(dst, 0o755)
			src = s.addr + ":data"
		}
		args := append(append([]string{"cp", "-q"}, c.flags...), src, dst)
		if _, errs, code := run(t, args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", c.flags, code, errs)
		}
		got := dst
		if len(c.flags) > 0 && c.flags[0] == "-r" {
			got = filepath.Join(dst, "data", "f")
		}
		// Before reading it back, which would cache it.
		frac := cached(t, got)
		t.Logf("%v: %.0f%% of the copy in the page cache", c.flags, 100*frac)
		if c.direct && frac > 0.1 {
			t.Errorf("%v: %.0f%% of the copy is in the page cache; O_DIRECT was not used", c.flags, 100*frac)
		}
		if !c.direct && frac < 0.5 {
			t.Errorf("%v: only %.0f%% of the copy is in the page cache; buffered writes leave it there", c.flags, 100*frac)
		}
		b, err := os.ReadFile(got)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(b) != sha256.Sum256(want) {
			t.Fatalf("%v: copy differs", c.flags)
		}
	}
}
