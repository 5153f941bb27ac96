package target

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// staleAtime makes file p with an access time older than its mtime, which
// a read updates even under relatime.
func staleAtime(t *testing.T, p string) time.Time {
	t.Helper()
	if err := os.WriteFile(p, []byte("some bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(p, old, time.Now()); err != nil {
		t.Fatal(err)
	}
	return old
}

func atimeOf(t *testing.T, p string) time.Time {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return time.Unix(st.Atim.Unix())
}

// A walk and a pack read their files without changing their access
// times, where the file system would change them for a plain read.
func TestServingLeavesAtime(t *testing.T) {
	dir := t.TempDir()
	ctl := filepath.Join(dir, "control")
	old := staleAtime(t, ctl)
	if _, err := os.ReadFile(ctl); err != nil {
		t.Fatal(err)
	}
	if atimeOf(t, ctl).Equal(old) {
		t.Skip("this file system does not update access times on read")
	}
	if err := os.Mkdir(filepath.Join(dir, "tree"), 0o755); err != nil {
		t.Fatal(err)
	}
	walked, packed := filepath.Join(dir, "tree", "walked"), filepath.Join(dir, "packed")
	staleAtime(t, walked)
	staleAtime(t, packed)
	x := testExport(t, dir)

	w := startWalk(t, x, "tree", protocol.Walk{PackMax: 4096, Algorithm: uint8(chunker.CRC32C)})
	defer w.close()
	var we walkEntry
	buf := make([]byte, 64)
	n := 0
	for w.next(&we) {
		if we.e.Packed {
			if err := readFull(we.pk.fd, buf[:we.pk.size]); err != nil {
				t.Fatal(err)
			}
			unix.Close(we.pk.fd)
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d files packed, want 1", n)
	}

	dirs := packDirs{}
	defer dirs.close()
	fd, err := dirs.open(x, "packed")
	if err != nil {
		t.Fatal(err)
	}
	err = readFull(fd, buf[:10])
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{walked, packed} {
		if got := atimeOf(t, p); !got.Equal(old) {
			t.Errorf("%s: atime %v after it was served, want %v as it was", filepath.Base(p), got, old)
		}
	}
	if x.atime.off.Load() {
		t.Error("O_NOATIME turned off for files the daemon owns")
	}
}

// A daemon that may not open a file with O_NOATIME (not its owner, no
// CAP_FOWNER) still opens it, and stops asking for O_NOATIME on that
// export after the first refusal. The refusal is real: one thread of the
// test, as another user, opens a file root owns.
func TestNoAtimeRefusedOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to open a file as another user")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	var n noAtime
	type result struct {
		off  []bool
		errs []error
	}
	done := make(chan result, 1)
	go func() {
		// This thread alone takes another effective user (a raw
		// setresuid changes only the calling thread's credentials); it is
		// never unlocked, so it ends with this goroutine.
		runtime.LockOSThread()
		var r result
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 65534, ^uintptr(0)); e != 0 {
			r.errs = append(r.errs, e)
			done <- r
			return
		}
		for _, name := range []string{"a", "b"} {
			fd, err := n.openat(dfd, name, unix.O_RDONLY|unix.O_CLOEXEC)
			if err == nil {
				unix.Close(fd)
			}
			r.errs = append(r.errs, err)
			r.off = append(r.off, n.off.Load())
		}
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the other user's opens did not return")
	}
	if len(r.off) != 2 {
		t.Fatalf("could not take another user: %v", r.errs)
	}
	for i, err := range r.errs {
		if err != nil {
			t.Errorf("open %d as another user: %v", i, err)
		}
	}
	if !r.off[0] || !r.off[1] {
		t.Errorf("O_NOATIME still asked for after its refusal: off %v", r.off)
	}

	// Root (CAP_FOWNER) may: O_NOATIME stays on.
	var root noAtime
	fd, err := root.openat(dfd, "a", unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fl&unix.O_NOATIME == 0 || root.off.Load() {
		t.Errorf("opened by root: flags %#o, off %v; want O_NOATIME on", fl, root.off.Load())
	}
}
