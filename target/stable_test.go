package target

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// stableOf runs stableFile on path, opened as the target opens files.
func stableOf(t *testing.T, path string) *protocol.Error {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return stableFile("data/x", f)
}

func TestStableRefusesProc(t *testing.T) {
	for _, p := range []string{"/proc/sys/kernel/hostname", "/proc/self/status"} {
		perr := stableOf(t, p)
		if perr == nil {
			t.Errorf("%s: served", p)
			continue
		}
		if perr.Code != protocol.CodeUnsupported || !strings.Contains(perr.Message, "data/x is on procfs, a pseudo file system") {
			t.Errorf("%s: %v (code %v)", p, perr, perr.Code)
		}
	}
}

func TestStableSysfs(t *testing.T) {
	const p = "/sys/kernel/mm/transparent_hugepage/enabled"
	if _, err := os.Stat(p); err != nil {
		t.Skip(err)
	}
	if perr := stableOf(t, p); perr == nil || !strings.Contains(perr.Message, "is on sysfs") {
		t.Errorf("%s: %v", p, perr)
	}
}

// The size check on its own: a procfs file is 0 bytes and reads data.
func TestStableEmptyButReads(t *testing.T) {
	fd, err := unix.Open("/proc/sys/kernel/hostname", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 0 || !readsData(fd) {
		t.Fatalf("/proc/sys/kernel/hostname: size %d, reads data %v; want 0 and true", st.Size, readsData(fd))
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o644)
	efd, err := unix.Open(empty, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if readsData(efd) {
		t.Error("an empty file reads data")
	}
}

func TestStableServes(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"empty": "", "f": "hello"} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(data), 0o644)
		if perr := stableOf(t, p); perr != nil {
			t.Errorf("%s: %v", name, perr)
		}
	}
}

func TestStableRefusesOthers(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/dev/null", fifo} {
		perr := stableOf(t, p)
		if perr == nil || perr.Code != protocol.CodeUnsupported || !strings.Contains(perr.Message, "data/x is not a regular file or block device") {
			t.Errorf("%s: %v", p, perr)
		}
	}
}

func TestFsErrorReplaced(t *testing.T) {
	x := &export{Export: Export{Name: "single", Path: "/srv/x/real"}}
	perr := fsError("single", x.replaced())
	const want = "export single: /srv/x/real is no longer the file exported at start (replaced by a symlink or another file); reload the daemon to export it"
	if perr.Code != protocol.CodePermission || perr.Message != want {
		t.Errorf("got %v %q\nwant %q", perr.Code, perr.Message, want)
	}
}

// openExport pins a single file; stillPinned (for a reload that keeps the
// export) and open notice a swap.
func TestExportPin(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.WriteFile(real, []byte("exported"), 0o644)
	x, err := openExport(Export{Name: "single", Path: real})
	if err != nil {
		t.Fatal(err)
	}
	if !x.stillPinned() {
		t.Fatal("not pinned at first")
	}
	f, err := x.open(".")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Rename(real, real+".orig")
	os.WriteFile(real, []byte("another"), 0o644)
	if x.stillPinned() {
		t.Error("another file counts as pinned")
	}
	var re *replacedError
	if _, err := x.open("."); !errors.As(err, &re) {
		t.Errorf("open of another file: %v", err)
	}
	// A reload re-pins what is there now.
	y, err := openExport(Export{Name: "single", Path: real})
	if err != nil || !y.stillPinned() {
		t.Fatalf("re-pin: %v", err)
	}
}
