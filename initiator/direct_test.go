package initiator_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"
	"github.com/rdmacp/rdmacp/target"
)

const testChunk = 64 << 10 // startTarget's chunk size

// directDir is a directory on a file system that takes O_DIRECT:
// $RDMACP_DIRECT_TEST_DIR, else the test's temporary directory, else one
// under /var/tmp (where /tmp is a tmpfs). It skips the test if none does.
func directDir(t *testing.T) string {
	t.Helper()
	dirs := []string{t.TempDir()}
	if d := os.Getenv("RDMACP_DIRECT_TEST_DIR"); d != "" {
		dirs = []string{d}
	}
	if d, err := os.MkdirTemp("/var/tmp", "rdmacp-direct-test-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
		dirs = append(dirs, d)
	}
	var whys []string
	for _, d := range dirs {
		why := initiator.DirectWhy(d)
		if why == "" {
			return d
		}
		whys = append(whys, d+": "+why)
	}
	t.Skipf("no directory here takes O_DIRECT (set RDMACP_DIRECT_TEST_DIR to one that does): %v", whys)
	return ""
}

// wantDirect is how many bytes of a file of n bytes in chunks of cs
// should go through O_DIRECT: every chunk whose length is a multiple of
// the alignment (all but a short last one).
func wantDirect(n, cs, align int64) int64 {
	if n == 0 || n < min(cs, 1<<20) { // small files stay buffered
		return 0
	}
	last := n - (n-1)/cs*cs
	if last%align == 0 {
		return n
	}
	return n - last
}

var directSizes = []int{0, 1, 4095, 4096, testChunk - 1, testChunk, testChunk + 1, 5*testChunk + 17}

// getExact copies data/f of n random bytes to out/copy and checks it
// byte for byte (sha256), its mode, and that no temporary is left. It
// returns the result.
func getExact(t *testing.T, e *env, s *initiator.Session, out string, n int, opt initiator.GetOptions) *initiator.Result {
	t.Helper()
	want := randomFile(t, filepath.Join(e.Dir, "f"), n)
	dst := filepath.Join(out, "copy")
	res, err := s.Get(context.Background(), "data/f", dst, opt)
	if err != nil {
		t.Fatalf("size %d: %v", n, err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatalf("size %d: sha256 differs (got %d bytes)", n, len(got))
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o640 {
		t.Errorf("size %d: mode %v", n, fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(out, ".*")); len(left) > 0 {
		t.Errorf("size %d: temporary files left: %v", n, left)
	}
	return res
}

// On a file system that takes O_DIRECT, whole chunks land with it and
// the short tail buffered, and the file is exact.
func TestDirectLandingExact(t *testing.T) {
	out := directDir(t)
	align := initiator.DirectAlign(out)
	e := startTarget(t, nil)
	s := e.Dial(t, nil)
	for _, n := range directSizes {
		res := getExact(t, e, s, out, n, initiator.GetOptions{})
		if got, want := initiator.DirectBytes(res), wantDirect(int64(n), testChunk, align); got != want {
			t.Errorf("size %d: %d bytes landed with O_DIRECT, want %d", n, got, want)
		}
	}
	// The default chunk size, and a tail that is a whole number of
	// blocks but not of chunks.
	e4 := startTarget(t, func(c *target.Config) { c.ChunkSize, c.MaxWindow = 4<<20, 32<<20 })
	s4 := e4.Dial(t, func(c *initiator.Config) { c.ReadSize = 1 << 20 })
	for _, n := range []int{3<<20 + 8192, 4<<20 - 1, 4<<20 + 1, 3*4<<20 + 4097} {
		res := getExact(t, e4, s4, out, n, initiator.GetOptions{})
		if got, want := initiator.DirectBytes(res), wantDirect(int64(n), 4<<20, align); got != want {
			t.Errorf("size %d, 4 MiB chunks: %d bytes landed with O_DIRECT, want %d", n, got, want)
		}
	}
	// NoDirect lands everything buffered.
	res := getExact(t, e, s, out, 5*testChunk+17, initiator.GetOptions{NoDirect: true})
	if got := initiator.DirectBytes(res); got != 0 {
		t.Errorf("NoDirect: %d bytes landed with O_DIRECT", got)
	}
}

// On tmpfs, which recent kernels let open with O_DIRECT but serve from
// the page cache anyway, the landing stays buffered, and the file is
// exact.
func TestDirectLandingTmpfs(t *testing.T) {
	var sf unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &sf); err != nil || sf.Type != unix.TMPFS_MAGIC {
		t.Skip("/dev/shm is not a tmpfs here")
	}
	out, err := os.MkdirTemp("/dev/shm", "rdmacp-direct-test-")
	if err != nil {
		t.Skipf("cannot write /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	if why := initiator.DirectWhy(out); why == "" {
		t.Fatal("a tmpfs destination would be landed with O_DIRECT")
	} else {
		t.Logf("tmpfs: %s", why)
	}
	e := startTarget(t, nil)
	s := e.Dial(t, nil)
	for _, n := range directSizes {
		res := getExact(t, e, s, out, n, initiator.GetOptions{})
		if got := initiator.DirectBytes(res); got != 0 {
			t.Errorf("size %d: %d bytes landed with O_DIRECT on tmpfs", n, got)
		}
	}
}

// refusing is an O_DIRECT descriptor that writes the first ok calls
// through the real one (or, with half, half of the first refused call
// through the plain file) and then refuses with EINVAL, as a file system
// that turns O_DIRECT down only at write time does.
type refusing struct {
	d     local.DirectFile
	f     *os.File
	ok    int32
	half  bool
	calls atomic.Int32
}

func (r *refusing) WriteAt(p []byte, off int64) (int, error) {
	i := r.calls.Add(1)
	if i <= r.ok {
		return r.d.WriteAt(p, off)
	}
	if r.half && i == r.ok+1 {
		n, err := r.f.WriteAt(p[:len(p)/2], off)
		if err != nil {
			return n, err
		}
		return n, &os.PathError{Op: "write", Path: r.f.Name(), Err: syscall.EINVAL}
	}
	return 0, &os.PathError{Op: "write", Path: r.f.Name(), Err: syscall.EINVAL}
}

func (r *refusing) Close() error { return r.d.Close() }

// Where O_DIRECT is refused, at open or at a write (after some direct
// writes, or halfway through one), the copy falls back to buffered
// writes and the file is still exact.
func TestDirectFallback(t *testing.T) {
	out := directDir(t)
	e := startTarget(t, nil)
	s := e.Dial(t, nil)
	cases := []struct {
		name string
		open func(*os.File) (local.DirectFile, error)
	}{
		{"open EINVAL", func(f *os.File) (local.DirectFile, error) {
			return nil, &os.PathError{Op: "open", Path: f.Name(), Err: syscall.EINVAL}
		}},
		{"first write EINVAL", func(f *os.File) (local.DirectFile, error) {
			d, err := initiator.OpenDirect(f)
			if err != nil {
				return nil, err
			}
			return &refusing{d: d, f: f}, nil
		}},
		{"third write EINVAL", func(f *os.File) (local.DirectFile, error) {
			d, err := initiator.OpenDirect(f)
			if err != nil {
				return nil, err
			}
			return &refusing{d: d, f: f, ok: 2}, nil
		}},
		{"EINVAL after a short write", func(f *os.File) (local.DirectFile, error) {
			d, err := initiator.OpenDirect(f)
			if err != nil {
				return nil, err
			}
			return &refusing{d: d, f: f, ok: 1, half: true}, nil
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer initiator.SetOpenDirect(c.open)()
			for _, n := range directSizes {
				getExact(t, e, s, out, n, initiator.GetOptions{})
			}
			res := getExact(t, e, s, out, 40*testChunk+5, initiator.GetOptions{})
			t.Logf("%d of %d bytes through O_DIRECT", initiator.DirectBytes(res), res.Bytes)
		})
	}
}

// ioError is an O_DIRECT descriptor whose writes fail with EIO after
// ok real ones: not a refusal, so the copy fails.
type ioError struct {
	d     local.DirectFile
	ok    int32
	calls atomic.Int32
}

func (w *ioError) WriteAt(p []byte, off int64) (int, error) {
	if w.calls.Add(1) <= w.ok {
		return w.d.WriteAt(p, off)
	}
	return 0, syscall.EIO
}

func (w *ioError) Close() error { return w.d.Close() }

// A --partial copy whose chunks landed with O_DIRECT, interrupted by a
// write error, resumes: the chunks it wrote are read back through the
// buffered descriptor, match, and are not read again; the result is
// exact, and -c then finds it the same.
func TestDirectPartialResume(t *testing.T) {
	out := directDir(t)
	e := startTarget(t, nil)
	s := e.Dial(t, func(c *initiator.Config) { c.QPs, c.Depth = 1, 1 })
	const n = 32*testChunk + 100
	want := randomFile(t, filepath.Join(e.Dir, "f"), n)
	dst := filepath.Join(out, "copy")
	func() {
		defer initiator.SetOpenDirect(func(f *os.File) (local.DirectFile, error) {
			d, err := initiator.OpenDirect(f)
			if err != nil {
				return nil, err
			}
			return &ioError{d: d, ok: 10}, nil
		})()
		_, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{Partial: true})
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("first run: %v, want EIO", err)
		}
	}()
	if _, err := os.Stat(local.SidecarPath(dst)); err != nil {
		t.Fatalf("no sidecar: %v", err)
	}
	// A rerun, as of the command: a new session.
	s = e.Dial(t, nil)
	res, err := s.Get(context.Background(), "data/f", dst, initiator.GetOptions{Partial: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.BytesRead > n-8*testChunk { // at most 2 more chunks were in the verifiers when the 11th write failed
		t.Errorf("resumed copy read %d bytes; the first run had landed 10 chunks of %d", res.BytesRead, testChunk)
	}
	if initiator.DirectBytes(res) == 0 {
		t.Error("resumed copy landed nothing with O_DIRECT")
	}
	got, _ := os.ReadFile(dst)
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatal("resumed copy differs")
	}
	if _, err := os.Stat(local.SidecarPath(dst)); !os.IsNotExist(err) {
		t.Errorf("sidecar left: %v", err)
	}
	res, err = s.Get(context.Background(), "data/f", dst, initiator.GetOptions{SkipSame: true})
	if err != nil || !res.Skipped {
		t.Fatalf("-c after the copy: skipped=%v, %v", res != nil && res.Skipped, err)
	}
}
