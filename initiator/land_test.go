package initiator

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator/local"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// landRig is a fetch with only its landing stage: a fresh, reserved file
// of size bytes in dir, its chunks' digests in one window, and a software
// PD to register with. It stands in for the engine: land copies a chunk's
// bytes into the memory place gave it, as the transport's receive copy
// does, then runs the verify, land and release stages as the fetch does.
type landRig struct {
	f    *fetch
	file *os.File
	src  []byte
	sum  []byte
}

func newLandRig(tb testing.TB, dir string, src []byte, chunk int64, slots int, mapped bool) *landRig {
	return newLandRigOn(tb, dir, src, chunk, slots, false, mapped)
}

// newLandRigOn is newLandRig for a device that pins (or not) what it registers.
func newLandRigOn(tb testing.TB, dir string, src []byte, chunk int64, slots int, pins, mapped bool) *landRig {
	tb.Helper()
	mapAnywhere(tb)
	dev, err := iwarp.New(iwarp.Config{}).Open(context.Background(), verbs.DeviceConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	if err != nil {
		tb.Fatal(err)
	}
	size := int64(len(src))
	layout := chunker.Layout{Size: size, ChunkSize: chunk}
	file, err := os.OpenFile(filepath.Join(dir, "land"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	if err := local.Allocate(file, size); err != nil {
		tb.Fatal(err)
	}
	if err := local.Reserve(file, nil, layout); err != nil {
		tb.Fatal(err)
	}
	out := local.NewSink(file, false, nil)
	out.Kind = local.DestFresh
	f := &fetch{out: out, layout: layout, alg: chunker.CRC32C}
	reg := func(b []byte) (verbs.MR, error) { return pd.RegMR(b, verbs.AccessLocalWrite) }
	if !mapped && !pins {
		reg = refuseFileMappings(reg)
	}
	if err := f.setupLanding(slots, pins, reg, slog.New(slog.DiscardHandler)); err != nil {
		tb.Fatal(err)
	}
	if mapped != (f.fmap != nil) {
		tb.Fatalf("mapped landing %v, want %v", f.fmap != nil, mapped)
	}
	r := &landRig{f: f, file: file, src: src}
	tb.Cleanup(func() { f.teardown(false); file.Close() })
	return r
}

// refuseFileMappings registers staging only, as an RDMA device that
// won't pin a file's pages: the first registration (the mapping's) fails.
func refuseFileMappings(reg func([]byte) (verbs.MR, error)) func([]byte) (verbs.MR, error) {
	first := true
	return func(b []byte) (verbs.MR, error) {
		if first {
			first = false
			return nil, errors.New("reg_mr: file-backed memory refused")
		}
		return reg(b)
	}
}

// chunkOf makes chunk i of the rig's one window.
func (r *landRig) chunkOf(w *win, i int) *chunk {
	off, n := r.f.layout.Chunk(i)
	return &chunk{idx: i, off: off, n: int(n), win: w}
}

// land lands chunks [0, n) with corrupt(i) bytes flipped in chunk i's
// first landing, landing a failed chunk again as a retry does.
func (r *landRig) land(tb testing.TB, w *win, corrupt func(i int) bool) {
	f := r.f
	var inflight []*chunk
	finish := func(c *chunk) {
		for try := 0; ; try++ {
			var v verdict
			v, r.sum = f.verify(c, r.sum)
			if v.err != nil {
				tb.Fatal(v.err)
			}
			if v.ok {
				break
			}
			if try > 0 {
				tb.Fatalf("chunk %d failed its digest twice", c.idx)
			}
			copy(c.mem, r.src[c.off:c.off+int64(c.n)]) // the READ again
		}
		if c.reg == nil {
			if _, err := f.out.WriteAt(c.mem, c.off); err != nil {
				tb.Fatal(err)
			}
		}
		f.release(c)
	}
	for i := range f.layout.Chunks() {
		c := r.chunkOf(w, i)
		for {
			if len(f.free) > 0 {
				ok, err := f.place(c)
				if err != nil {
					tb.Fatal(err)
				}
				if ok {
					break
				}
			}
			if len(inflight) == 0 {
				tb.Fatalf("chunk %d can't be placed with nothing in flight", i)
			}
			finish(inflight[0]) // the oldest completes: a slot or region frees
			inflight = inflight[1:]
		}
		f.slots[c.slot] = c
		copy(c.mem, r.src[c.off:c.off+int64(c.n)]) // the READ's receive copy
		if corrupt != nil && corrupt(i) {
			c.mem[c.n/2] ^= 0xff
		}
		inflight = append(inflight, c)
	}
	for _, c := range inflight {
		finish(c)
	}
}

// A mapped landing puts every chunk's bytes in the file, chunks that
// failed their digest landed again over the same pages, through more
// regions than are ever mapped at once; and no region outlives the
// fetch's need of it.
func TestMappedLandingLandsInTheFile(t *testing.T) {
	const chunk = 64 << 10
	src, w := pattern(40*chunk+1000, chunk) // a short last chunk
	r := newLandRig(t, t.TempDir(), src, chunk, 6, true)
	r.land(t, w, func(i int) bool { return i%7 == 3 })
	if n := len(r.f.fmap.regions); n > 1 {
		t.Errorf("%d regions still mapped with nothing in flight", n)
	}
	got, err := os.ReadFile(r.file.Name())
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(r.src) {
		t.Fatal("the file differs from what landed")
	}
}

// pattern is n bytes to land, and the window over them with their digests.
func pattern(n, chunk int64) ([]byte, *win) {
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	l := chunker.Layout{Size: n, ChunkSize: chunk}
	w := &win{end: l.Chunks(), left: l.Chunks()}
	for i := range l.Chunks() {
		off, n := l.Chunk(i)
		w.digests = chunker.AppendSum(w.digests, chunker.CRC32C, src[off:off+n])
	}
	return src, w
}

// A destination cut short under a mapped landing (another process
// truncating the temporary file) is an error on the chunk, not a crash.
func TestMappedLandingTruncatedFileIsAnError(t *testing.T) {
	const chunk = 64 << 10
	src, w := pattern(8*chunk, chunk)
	r := newLandRig(t, t.TempDir(), src, chunk, 6, true)
	f := r.f
	c := r.chunkOf(w, 5)
	if ok, err := f.place(c); !ok || err != nil {
		t.Fatalf("place: %v %v", ok, err)
	}
	if err := r.file.Truncate(0); err != nil {
		t.Fatal(err)
	}
	v, _ := f.verify(c, nil)
	if !errors.Is(v.err, errLandFault) || !errors.Is(v.err, local.ErrDest) {
		t.Fatalf("verify over a truncated mapping: %+v, want ErrDest and errLandFault", v)
	}
}

// BenchmarkLandingPath is the landing stage alone, from a chunk's READs
// completing to its bytes in the file, as one number: the receive copy
// (a memcpy here, the transport's own in a copy), the digest, the write
// and the region or slot going back, then fsync. staging lands as a
// pull did before: in registered staging, then pwrite; mapped lands in
// the file's own pages. Into $RDMACP_BENCH_DIR (default /var/tmp; set it
// to /dev/shm for tmpfs):
//
//	RDMACP_BENCH_DIR=/dev/shm go test -run - -bench LandingPath -benchtime 5x ./initiator
func BenchmarkLandingPath(b *testing.B) {
	const size = 256 << 20
	const chunk = 4 << 20
	slots := PullSlots(4, 4, 1<<20, chunk, size/chunk, false) // the defaults: 4 QPs x 4 READs of 1 MiB
	dir := benchDir(b)
	src, w0 := pattern(size, chunk)
	for _, mapped := range []bool{false, true} {
		name := "staging"
		if mapped {
			name = "mapped"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(size)
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				os.Remove(filepath.Join(dir, "land"))
				w := *w0
				b.StartTimer()
				c0 := procCPU()
				r := newLandRig(b, dir, src, chunk, slots, mapped)
				r.land(b, &w, nil)
				r.f.teardown(false)
				if err := r.file.Sync(); err != nil {
					b.Fatal(err)
				}
				cpu += procCPU() - c0
			}
			b.ReportMetric(cpu.Seconds()/(float64(size)*float64(b.N)/1e9), "cpu-s/GB")
		})
	}
}

// A device that DMAs into pinned pages gets a mapped landing in tmpfs
// and staging on a disk file system.
func TestMappedLandingWithAPinningDevice(t *testing.T) {
	const chunk = 64 << 10
	src, w := pattern(8*chunk, chunk)
	shm, err := os.MkdirTemp("/dev/shm", "rdmacp-land-")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	defer os.RemoveAll(shm)
	r := newLandRigOn(t, shm, src, chunk, 6, true, true)
	r.land(t, w, nil)
	if got, _ := os.ReadFile(r.file.Name()); string(got) != string(src) {
		t.Fatal("the file differs from what landed")
	}
	disk := "/var/tmp"
	var sf unix.Statfs_t
	if unix.Statfs(disk, &sf) != nil || sf.Type == unix.TMPFS_MAGIC {
		t.Skip("/var/tmp is not on a disk file system here")
	}
	dir, err := os.MkdirTemp(disk, "rdmacp-land-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	newLandRigOn(t, dir, src, chunk, 6, true, false) // fails unless staging
}

// mapAnywhere lets a mapped landing be chosen on any file system for the
// rest of the test (the tests' temporary directories are not on a tmpfs
// with huge pages); a pinning device's rule still holds.
func mapAnywhere(tb testing.TB) {
	old := mapsCheaper
	mapsCheaper = func(bool, *os.File) string { return "" }
	tb.Cleanup(func() { mapsCheaper = old })
}

// chunkSum combines a chunk's digest from its READs' sums, the last READ
// shorter, exactly as the digest of the whole chunk.
func TestChunkSum(t *testing.T) {
	b := make([]byte, 10000)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	for _, tc := range []struct{ n, readSize int }{{10000, 1000}, {9500, 1000}, {999, 1000}, {1000, 1000}, {10000, 4096}} {
		f := &fetch{readSize: tc.readSize, readShift: crc32c.ShiftOf(int64(tc.readSize))}
		c := &chunk{n: tc.n}
		for off := 0; off < tc.n; off += tc.readSize {
			c.sums = append(c.sums, crc32c.Checksum(b[off:min(off+tc.readSize, tc.n)]))
		}
		if got, want := f.chunkSum(c), crc32c.Checksum(b[:tc.n]); got != want {
			t.Errorf("%d bytes in READs of %d: chunkSum %08x, want %08x", tc.n, tc.readSize, got, want)
		}
	}
}
