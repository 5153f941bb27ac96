package local

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
)

// smallTmpfs mounts a tmpfs of size (a mount option such as "8m") with
// the extra options, for the test's life.
func smallTmpfs(t *testing.T, opts string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Skipf("cannot mount a tmpfs (%s): %v", opts, err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

func newSized(t *testing.T, name string, size int64) *os.File {
	t.Helper()
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := Allocate(f, size); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestReserveTmpfsChecksRoom(t *testing.T) {
	// In a tmpfs with 4 KiB pages Reserve allocates nothing (the writes
	// do, as they land), yet a file that can't fit still fails before
	// its first byte; what the file already holds counts as room.
	dir := smallTmpfs(t, "size=8m,huge=never")
	l := chunker.Layout{Size: 6 << 20, ChunkSize: 1 << 20}
	f := newSized(t, filepath.Join(dir, "a"), l.Size)
	if err := Reserve(f, nil, l); err != nil {
		t.Fatal(err)
	}
	if n := allocated(t, f.Name()); n != 0 {
		t.Errorf("Reserve allocated %d bytes up front in a 4 KiB-page tmpfs", n)
	}
	big := chunker.Layout{Size: 12 << 20, ChunkSize: 1 << 20}
	f2 := newSized(t, filepath.Join(dir, "b"), big.Size)
	if err := Reserve(f2, nil, big); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("12 MiB into an 8 MiB tmpfs: %v, want ENOSPC", err)
	}
	// 5 MiB of the 6 already written: 1 MiB more is needed, and 3 free.
	f3 := newSized(t, filepath.Join(dir, "c"), l.Size)
	if _, err := f3.WriteAt(bytes.Repeat([]byte{1}, 5<<20), 0); err != nil {
		t.Fatal(err)
	}
	if err := Reserve(f3, nil, l); err != nil {
		t.Errorf("resuming a file that holds 5 of its 6 MiB in an 8 MiB tmpfs: %v", err)
	}
}

func TestReserveHugeTmpfsFallocates(t *testing.T) {
	// With huge pages the mapped landing may write through a mapping,
	// where a page the tmpfs can't give is a SIGBUS: there Reserve
	// allocates up front.
	dir := smallTmpfs(t, "size=16m,huge=always")
	l := chunker.Layout{Size: 4 << 20, ChunkSize: 1 << 20}
	f := newSized(t, filepath.Join(dir, "a"), l.Size)
	if err := Reserve(f, nil, l); err != nil {
		t.Fatal(err)
	}
	if n := allocated(t, f.Name()); n < l.Size {
		t.Errorf("Reserve allocated %d bytes of %d in a huge-page tmpfs", n, l.Size)
	}
}

func TestHugeTmpfsFromMountinfo(t *testing.T) {
	const mi = `21 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
45 27 0:40 / /mnt/huge rw,relatime - tmpfs tmpfs rw,size=3145728k,huge=always
46 27 0:41 / /mnt/small rw,relatime - tmpfs tmpfs rw,size=1024k
47 27 0:42 / /mnt/within rw,relatime shared:5 - tmpfs tmpfs rw,huge=within_size
48 27 0:43 / /mnt/never rw - tmpfs tmpfs rw,huge=never
49 27 0:44 / /mnt/odd\040huge=always rw - ext4 /dev/x rw
`
	for _, c := range []struct {
		minor uint32
		want  bool
	}{{40, true}, {41, false}, {42, true}, {43, false}, {44, false}, {99, false}} {
		if got := hugeIn(mi, 0, c.minor); got != c.want {
			t.Errorf("0:%d: huge %v, want %v", c.minor, got, c.want)
		}
	}
	if hugeIn(mi, 252, 0) {
		t.Error("ext4 taken for a huge tmpfs")
	}
}

func TestHugeTmpfsReadsMountinfoOnce(t *testing.T) {
	// Asked for every file of a tree: mountinfo is read once per mount,
	// and a new mount (which may reuse the device number) is asked anew.
	small := smallTmpfs(t, "size=8m,huge=never")
	f := newSized(t, filepath.Join(small, "a"), 4096)
	var st unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID_UNIQUE, &st); err != nil || st.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		t.Skip("no unique mount ids here (Linux 6.8): mountinfo is read every time")
	}
	old := readMountinfo
	defer func() { readMountinfo = old }()
	reads := 0
	readMountinfo = func() ([]byte, error) { reads++; return old() }
	for range 3 {
		if HugeTmpfs(f) {
			t.Fatal("a huge=never tmpfs taken for a huge one")
		}
	}
	if reads != 1 {
		t.Errorf("mountinfo read %d times for one mount, want 1", reads)
	}
	f.Close()
	syscall.Unmount(small, syscall.MNT_DETACH) // its device number is free for the next
	huge := smallTmpfs(t, "size=8m,huge=always")
	g := newSized(t, filepath.Join(huge, "a"), 4096)
	if !HugeTmpfs(g) {
		t.Error("a huge=always tmpfs mounted next taken for a huge=never one")
	}
}
