package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Tests of the landing side of sparse copies: what holes and zeros
// become at the destination (initiator/sparse.go).

// blocksOf is the bytes a file's blocks take (st_blocks*512).
func blocksOf(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// dataExtents lists a file's data ranges with SEEK_DATA/SEEK_HOLE.
func dataExtents(t *testing.T, f *os.File) [][2]int64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	var xs [][2]int64
	for off := int64(0); off < fi.Size(); {
		d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		h, err := unix.Seek(int(f.Fd()), d, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, [2]int64{d, h})
		off = h
	}
	return xs
}

// sameSparse compares two sparse files byte for byte without reading
// their holes: outside the data ranges of both, both read as zeros by
// definition, so only the union of their data ranges is read.
func sameSparse(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ia, _ := fa.Stat()
	ib, _ := fb.Stat()
	if ia.Size() != ib.Size() {
		t.Logf("sizes differ: %d, %d", ia.Size(), ib.Size())
		return false
	}
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for _, x := range append(dataExtents(t, fa), dataExtents(t, fb)...) {
		for off := x[0]; off < x[1]; {
			n := min(int64(len(ba)), x[1]-off)
			if _, err := fa.ReadAt(ba[:n], off); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if _, err := fb.ReadAt(bb[:n], off); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if !bytes.Equal(ba[:n], bb[:n]) {
				t.Logf("bytes differ in %d-%d", off, off+n)
				return false
			}
			off += n
		}
	}
	return true
}

func TestSparseCopyKeepsHoles8GiB(t *testing.T) {
	t.Parallel()
	// An 8 GiB file with three 8 MiB islands, through cp end to end: the
	// destination is byte-exact and allocates about the data, not 8 GiB.
	dir := t.TempDir()
	const size, island = 8 << 30, 8 << 20
	islands := []int64{0, 3<<30 + 5<<20, size - island}
	sparseSource(t, filepath.Join(dir, "big"), size, islands, island)
	s := serve(t, dir, nil, "--chunk-size", "1M")
	dst := filepath.Join(t.TempDir(), "big")
	sum := cp1(t, s.addr+":data/big", dst)
	data := int64(len(islands) * island)
	if got := int64(sum["bytes_read"].(float64)); got != data {
		t.Errorf("READ %d bytes for %d of data", got, data)
	}
	got := blocksOf(t, dst)
	t.Logf("destination allocates %d bytes for %d of data in %d", got, data, int64(size))
	if got < data || got > data+1<<20 {
		t.Errorf("destination allocates %d bytes, want about the %d of data", got, data)
	}
	if !sameSparse(t, filepath.Join(dir, "big"), dst) {
		t.Fatal("copy differs")
	}
}

// denseWithZeros writes size bytes, zeros but for random islands, all of
// them written (the file has no holes), and returns the data's length.
func denseWithZeros(t *testing.T, p string, size int, islands []int, n int) int64 {
	t.Helper()
	b := make([]byte, size)
	for i, off := range islands {
		copy(b[off:off+n], bytes.Repeat([]byte{byte(i + 1), 0x5a}, n/2))
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := blocksOf(t, p); got < int64(size) {
		t.Fatalf("source allocates %d of %d bytes: not dense", got, size)
	}
	return int64(len(islands) * n)
}

func TestSparseFlagDenseZeros(t *testing.T) {
	t.Parallel()
	// A dense 32 MiB file of zeros with three islands (one not on a chunk
	// boundary, one a single block): with -S the destination allocates
	// about the islands; without, all 32 MiB, as the source does.
	dir := t.TempDir()
	const size = 32 << 20
	data := denseWithZeros(t, filepath.Join(dir, "img"), size, []int{0, 5<<20 + 12<<10, 30 << 20}, 64<<10)
	s := serve(t, dir, nil)
	out := t.TempDir()
	cp1(t, "-S", s.addr+":data/img", filepath.Join(out, "sparse"))
	cp1(t, s.addr+":data/img", filepath.Join(out, "dense"))
	src := mustRead(t, filepath.Join(dir, "img"))
	for _, name := range []string{"sparse", "dense"} {
		if !bytes.Equal(mustRead(t, filepath.Join(out, name)), src) {
			t.Fatalf("%s copy differs", name)
		}
	}
	sp, dn := blocksOf(t, filepath.Join(out, "sparse")), blocksOf(t, filepath.Join(out, "dense"))
	t.Logf("-S: %d bytes allocated for %d of data; without: %d", sp, data, dn)
	if sp < data || sp > data+64<<10 {
		t.Errorf("-S destination allocates %d bytes for %d of data", sp, data)
	}
	if dn < size {
		t.Errorf("without -S the destination allocates %d of %d bytes: zeros of a dense source are data", dn, size)
	}
}

// loopOn attaches a loop device to a new image of size bytes filled with
// 0xff; detach detaches it, once (it is also called when the test ends:
// a device detached early may be another test's by then).
func loopOn(t *testing.T, size int) (dev, img string, detach func()) {
	t.Helper()
	return loopIn(t, t.TempDir(), size)
}

// loopIn is loopOn with the image in dir.
func loopIn(t *testing.T, dir string, size int) (dev, img string, detach func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	img = filepath.Join(dir, "img")
	if err := os.WriteFile(img, bytes.Repeat([]byte{0xff}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop devices here (losetup: %v: %s)", err, out)
	}
	dev = strings.TrimSpace(string(out))
	var once sync.Once
	detach = func() { once.Do(func() { exec.Command("losetup", "-d", dev).Run() }) }
	t.Cleanup(detach)
	return dev, img, detach
}

func readN(t *testing.T, p string, n int) []byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// unwrittenBytes is how much of a file FIEMAP reports as allocated but
// unwritten (fallocated, or zeroed by ZERO_RANGE): what a loop device's
// backing file shows for a BLKZEROOUT, where written zeros are written
// extents. (x/sys/unix has no FIEMAP; the layout is linux/fiemap.h.)
func unwrittenBytes(t *testing.T, p string) int64 {
	t.Helper()
	const (
		iocFiemap      = 0xc020660b // FS_IOC_FIEMAP
		flagSync       = 0x1        // FIEMAP_FLAG_SYNC
		extentLast     = 0x1        // FIEMAP_EXTENT_LAST
		extentUnwriten = 0x800      // FIEMAP_EXTENT_UNWRITTEN
		batch          = 64
	)
	type extent struct {
		Logical, Physical, Length uint64
		_                         [2]uint64
		Flags                     uint32
		_                         [3]uint32
	}
	type fiemap struct {
		Start, Length           uint64
		Flags, Mapped, Count, _ uint32
		Extents                 [batch]extent
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	for start := uint64(0); ; {
		m := fiemap{Start: start, Length: ^uint64(0) - start, Flags: flagSync, Count: batch}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), iocFiemap, uintptr(unsafe.Pointer(&m))); e != 0 {
			t.Skipf("FIEMAP on %s: %v", p, e)
		}
		if m.Mapped == 0 {
			return n
		}
		for _, x := range m.Extents[:m.Mapped] {
			if x.Flags&extentUnwriten != 0 {
				n += int64(x.Length)
			}
			if x.Flags&extentLast != 0 {
				return n
			}
			start = x.Logical + x.Length
		}
	}
}

func TestSparseOntoBlockDevice(t *testing.T) {
	t.Parallel()
	// A device full of 0xff gets the source's holes as zeros with each
	// --zero mode; discard gives the blocks back (the loop device's
	// backing file loses them), write and zeroout keep them. The loop
	// driver does a WRITE ZEROES with ZERO_RANGE on its backing file, so
	// zeroout shows there as unwritten extents, where written zeros
	// (--zero write) are written ones.
	dir := t.TempDir()
	const size, island = 16 << 20, 1 << 20
	sparseSource(t, filepath.Join(dir, "src"), size, []int64{0, 9 << 20}, island)
	want := mustRead(t, filepath.Join(dir, "src"))
	s := serve(t, dir, nil)
	for _, mode := range []string{"write", "zeroout", "discard"} {
		dev, img, detach := loopOn(t, size)
		out, errs, code := run(t, "cp", "--force", "--zero", mode, s.addr+":data/src", dev)
		if code != 0 {
			t.Fatalf("--zero %s: exit %d: %s %s", mode, code, out, errs)
		}
		if !bytes.Equal(readN(t, dev, size), want) {
			t.Fatalf("--zero %s: the device does not hold the source (holes not zeroed?)", mode)
		}
		detach()
		got, unw := blocksOf(t, img), unwrittenBytes(t, img)
		t.Logf("--zero %s: backing file allocates %d bytes (%d unwritten) for %d of data in %d", mode, got, unw, 2*island, size)
		if mode == "zeroout" && unw < size-2*island {
			t.Errorf("--zero zeroout: %d bytes of the backing file are unwritten extents, want the %d of holes: BLKZEROOUT not used?", unw, size-2*island)
		}
		if mode == "write" && unw != 0 {
			t.Errorf("--zero write: %d bytes of the backing file are unwritten extents: zeros were not written", unw)
		}
		if mode == "discard" && got > 4*island {
			t.Errorf("--zero discard: the backing file still allocates %d bytes", got)
		}
		if mode == "write" && got < size {
			t.Errorf("--zero write: the backing file allocates %d of %d bytes", got, size)
		}
	}
	// -S --zero discard: a dense source's zero blocks are unmapped too.
	data := denseWithZeros(t, filepath.Join(dir, "dense"), size, []int{4 << 20}, 64<<10)
	dev, img, detach := loopOn(t, size)
	if out, errs, code := run(t, "cp", "--force", "-S", "--zero", "discard", s.addr+":data/dense", dev); code != 0 {
		t.Fatalf("-S --zero discard: exit %d: %s %s", code, out, errs)
	}
	if !bytes.Equal(readN(t, dev, size), mustRead(t, filepath.Join(dir, "dense"))) {
		t.Fatal("-S --zero discard: the device does not hold the source")
	}
	detach()
	if got := blocksOf(t, img); got > data+1<<20 {
		t.Errorf("-S --zero discard: the backing file allocates %d bytes for %d of data", got, data)
	}
	// A mode rdmacp does not know is a usage error.
	if _, errs, code := run(t, "cp", "--force", "--zero", "trim", s.addr+":data/src", filepath.Join(t.TempDir(), "x")); code != exitUsage || !strings.Contains(errs, "write, zeroout or discard") {
		t.Errorf("--zero trim: exit %d: %s", code, errs)
	}
}

func TestSparseDiscardRefusedWithoutWriteZeroes(t *testing.T) {
	t.Parallel()
	// A loop device over a ramfs file has no write-zeroes support
	// (ramfs has no fallocate): --zero discard is refused before the
	// first byte, the device untouched; zeroout works there (the kernel
	// writes the zeros itself).
	if os.Geteuid() != 0 {
		t.Skip("mounting a ramfs needs root")
	}
	rd := t.TempDir()
	if err := syscall.Mount("ramfs", rd, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount a ramfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(rd, syscall.MNT_DETACH) })
	dir := t.TempDir()
	const size = 4 << 20
	sparseSource(t, filepath.Join(dir, "src"), size, []int64{1 << 20}, 64<<10)
	s := serve(t, dir, nil)
	dev, _, _ := loopIn(t, rd, size)
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/queue/write_zeroes_max_bytes")
	if err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Skipf("%s has write zeroes here (%q, %v)", dev, b, err)
	}
	_, errs, code := run(t, "cp", "--force", "--zero", "discard", s.addr+":data/src", dev)
	if code != exitLocalIO || !strings.Contains(errs, "does not guarantee zeros") {
		t.Errorf("--zero discard onto a device without write zeroes: exit %d: %s", code, errs)
	}
	if !bytes.Equal(readN(t, dev, size), bytes.Repeat([]byte{0xff}, size)) {
		t.Error("the refused copy wrote to the device")
	}
	if out, errs, code := run(t, "cp", "--force", "--zero", "zeroout", s.addr+":data/src", dev); code != 0 {
		t.Fatalf("--zero zeroout: exit %d: %s %s", code, out, errs)
	}
	if !bytes.Equal(readN(t, dev, size), mustRead(t, filepath.Join(dir, "src"))) {
		t.Error("--zero zeroout: the device does not hold the source")
	}
}

// smallFS mounts a tmpfs of size bytes, unmounted when the test ends.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

func TestSparseSmallFileSystem(t *testing.T) {
	t.Parallel()
	// A 64 MiB file system takes a 1 GiB sparse file holding 16 MiB; a
	// source with 96 MiB of data fails before its first byte is read,
	// saying why, and leaves nothing behind.
	fs := smallFS(t, "64m")
	dir := t.TempDir()
	sparseSource(t, filepath.Join(dir, "fits"), 1<<30, []int64{0, 500 << 20}, 8<<20)
	sparseSource(t, filepath.Join(dir, "big"), 1<<30, []int64{0, 200 << 20, 900 << 20}, 32<<20)
	s := serveJSON(t, dir, "--metrics-listen", "127.0.0.1:0")
	cp1(t, s.addr+":data/fits", filepath.Join(fs, "fits"))
	if !sameSparse(t, filepath.Join(dir, "fits"), filepath.Join(fs, "fits")) {
		t.Fatal("copy differs")
	}
	before := value(scrape(t, s.metrics), "rdmacp_read_response_bytes_total", map[string]string{"identity": "default"})
	_, errs, code := run(t, "cp", s.addr+":data/big", filepath.Join(fs, "big"))
	if code != exitLocalIO || !strings.Contains(errs, "no space left") || !strings.Contains(errs, "reserving space") {
		t.Errorf("cp of 96 MiB of data onto 64 MiB: exit %d: %s", code, errs)
	}
	after := value(scrape(t, s.metrics), "rdmacp_read_response_bytes_total", map[string]string{"identity": "default"})
	if after != before {
		t.Errorf("the target sent %.0f bytes for a copy that had no room: it should fail before the first byte", after-before)
	}
	ents, _ := os.ReadDir(fs)
	if len(ents) != 1 {
		t.Errorf("left in the full file system: %v", ents)
	}
}

func TestSparsePartialKeptFile(t *testing.T) {
	t.Parallel()
	// A --partial resume onto a kept file of a sparse source, the kept
	// file dense with garbage: the good chunk stays, the islands are
	// read, and the holes are punched (not written with zeros), so the
	// result is byte-exact and sparse.
	dir := t.TempDir()
	const size, island, chunk = 64 << 20, 1 << 20, 64 << 10
	sparseSource(t, filepath.Join(dir, "sparse"), size, []int64{0, 40 << 20}, island)
	s := serve(t, dir, nil)
	out := t.TempDir()
	dst := filepath.Join(out, "sparse")
	src := mustRead(t, filepath.Join(dir, "sparse"))
	part := bytes.Repeat([]byte{0xee}, size)
	copy(part, src[:chunk])
	if err := os.WriteFile(filepath.Join(out, ".sparse.rdmacp-partial.part"), part, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "sparse"))
	bitmap := make([]byte, size/chunk/8)
	bitmap[0] = 1 | 1<<3 // chunk 0 good; chunk 3, in the island, garbage
	bitmap[100] = 0xff   // hole chunks, garbage
	sc, _ := json.Marshal(map[string]any{"source": "data/sparse", "size": size, "mtime_ns": fi.ModTime().UnixNano(),
		"chunk_size": chunk, "algorithm": "crc32c", "temp": ".sparse.rdmacp-partial.part", "bitmap": bitmap})
	if err := os.WriteFile(filepath.Join(out, ".sparse.rdmacp-partial"), sc, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := cp1(t, "--partial", s.addr+":data/sparse", dst)
	if got, want := int64(sum["bytes_read"].(float64)), int64(2*island-chunk); got != want {
		t.Errorf("resumed copy READ %d bytes, want %d", got, want)
	}
	if !bytes.Equal(mustRead(t, dst), src) {
		t.Fatal("resumed copy differs")
	}
	if got := blocksOf(t, dst); got > 2*island+1<<20 {
		t.Errorf("resumed copy allocates %d bytes for %d of data: the kept file's holes were filled, not punched", got, 2*island)
	}
}
