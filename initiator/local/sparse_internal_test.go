package local

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

func TestIsZero(t *testing.T) {
	buf := make([]byte, 4096+16)
	for _, start := range []int{0, 1, 3, 8} {
		for _, n := range []int{0, 1, 7, 8, 63, 64, 65, 511, 4096} {
			b := buf[start : start+n]
			if !isZero(b) {
				t.Fatalf("isZero(%d zeros at +%d) = false", n, start)
			}
			for _, at := range []int{0, n / 2, n - 1} {
				if n == 0 {
					continue
				}
				b[at] = 0x80
				if isZero(b) {
					t.Fatalf("isZero: %d bytes at +%d with byte %d set says zero", n, start, at)
				}
				b[at] = 0
			}
		}
	}
	// Outside the slice does not count.
	buf[100] = 1
	if !isZero(buf[101:200]) || !isZero(buf[:100]) {
		t.Fatal("isZero looked outside its slice")
	}
}

// BenchmarkIsZero is -S's cost per byte landed: the all-zero block is
// the worst case (every word read); the byte loop is what it replaced
// in thought, for the ratio.
func BenchmarkIsZero(b *testing.B) {
	block := make([]byte, 1<<20)
	b.Run("words", func(b *testing.B) {
		b.SetBytes(int64(len(block)))
		for b.Loop() {
			if !isZero(block) {
				b.Fatal("not zero")
			}
		}
	})
	b.Run("bytes", func(b *testing.B) {
		b.SetBytes(int64(len(block)))
		for b.Loop() {
			for _, c := range block {
				if c != 0 {
					b.Fatal("not zero")
				}
			}
		}
	})
}

func TestDataRanges(t *testing.T) {
	l := chunker.Layout{Size: 100 << 10, ChunkSize: 16 << 10}
	type r struct{ off, n int64 }
	get := func(em *ExtentMap) []r {
		var out []r
		dataRanges(em, l, func(off, n int64) bool { out = append(out, r{off, n}); return true })
		return out
	}
	ext := func(upTo int64, xs ...int64) *ExtentMap {
		em := &ExtentMap{Size: l.Size, UpTo: upTo}
		for i := 0; i < len(xs); i += 2 {
			em.Extents = append(em.Extents, protocol.Extent{Offset: uint64(xs[i]), Length: uint64(xs[i+1])})
		}
		return em
	}
	for _, c := range []struct {
		name string
		em   *ExtentMap
		want []r
	}{
		{"no extents listed: all data", nil, []r{{0, 100 << 10}}},
		{"all hole", ext(0), nil},
		{"rounded out to chunks", ext(0, 20<<10, 1), []r{{16 << 10, 16 << 10}}},
		{"merged when they share or touch chunks", ext(0, 0, 4096, 10<<10, 4096, 40<<10, 4096), []r{{0, 16 << 10}, {32 << 10, 16 << 10}}},
		{"touching chunks merge", ext(0, 0, 16<<10, 16<<10, 1), []r{{0, 32 << 10}}},
		{"short last chunk", ext(0, 99<<10, 1<<10), []r{{96 << 10, 4 << 10}}},
		{"past a cut-short list, all data", ext(50<<10, 0, 1), []r{{0, 16 << 10}, {48 << 10, 52 << 10}}},
	} {
		if got := get(c.em); !equalRanges(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if n := dataBytes(ext(0, 20<<10, 1), l); n != 16<<10 {
		t.Errorf("dataBytes = %d", n)
	}
}

func equalRanges[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// allocated is the bytes f's blocks take.
func allocated(t *testing.T, name string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(name, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// diskFile is a new file on a disk file system (not tmpfs, where
// punching and O_DIRECT behave otherwise), holding data.
func diskFile(t *testing.T, data []byte) *os.File {
	t.Helper()
	dir := "/var/tmp"
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = t.TempDir()
	}
	f, err := os.CreateTemp(dir, "rdmacp-sparse-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(); os.Remove(f.Name()) })
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return f
}

func randomBytes(n int, seed byte) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

func TestHoleInPlacePunches(t *testing.T) {
	// A kept --partial file holds old bytes where the source has a hole:
	// Hole must leave zeros there, and give the blocks back.
	old := randomBytes(8<<20, 1)
	f := diskFile(t, old)
	before := allocated(t, f.Name())
	s := NewSink(f, false, nil)
	s.Kind = DestInPlace
	if err := s.Hole(1<<20, 4<<20); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(old))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), old...)
	clear(want[1<<20 : 5<<20])
	if !bytes.Equal(got, want) {
		t.Fatal("after Hole the kept file does not hold zeros there and its old bytes elsewhere")
	}
	if after := allocated(t, f.Name()); before-after < 4<<20-64<<10 {
		t.Errorf("allocated %d bytes before Hole, %d after: no hole punched", before, after)
	}
	// A fresh file: Hole writes nothing (and allocates nothing).
	g := diskFile(t, nil)
	if err := g.Truncate(8 << 20); err != nil {
		t.Fatal(err)
	}
	fresh := NewSink(g, false, nil)
	if err := fresh.Hole(0, 8<<20); err != nil {
		t.Fatal(err)
	}
	if n := allocated(t, g.Name()); n != 0 {
		t.Errorf("Hole on a fresh file allocated %d bytes", n)
	}
}

func TestWriteSparse(t *testing.T) {
	// -S: a chunk of data with zero blocks lands with holes there, into a
	// reserved (fallocated) fresh file, through O_DIRECT and buffered
	// writes alike; a zero block that is not whole stays data.
	for _, direct := range []bool{false, true} {
		f := diskFile(t, nil)
		const size = 4 << 20
		l := chunker.Layout{Size: size, ChunkSize: 1 << 20}
		if err := Allocate(f, size); err != nil {
			t.Fatal(err)
		}
		if err := Reserve(f, nil, l); err != nil {
			t.Fatal(err)
		}
		land := &Landing{File: f, Dst: f.Name(), Sparse: true, ready: true}
		s, err := land.Open(nil, l, direct, nil)
		if err != nil {
			t.Fatal(err)
		}
		if direct && !s.DirectOn() {
			t.Log("no O_DIRECT here: buffered only")
		}
		src := make([]byte, size)
		copy(src[0:], randomBytes(4096, 2))           // block 0 data
		copy(src[3<<20+100:], randomBytes(10, 3))     // one block of data in chunk 3
		copy(src[2<<20-8:], []byte{1, 2, 3, 4, 5, 6}) // last block of chunk 1
		// The chunks from page-aligned memory, as staging slots are.
		buf := alignedBytes(t, 1<<20)
		for i := range int64(4) {
			copy(buf, src[i<<20:(i+1)<<20])
			if n, err := s.WriteAt(buf, i<<20); err != nil || n != len(buf) {
				t.Fatalf("WriteAt chunk %d: %d, %v", i, n, err)
			}
		}
		s.Close()
		got := make([]byte, size)
		if _, err := f.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src) {
			t.Fatalf("direct=%v: -S landed different bytes", direct)
		}
		if n := allocated(t, f.Name()); n > 3*s.block+64<<10 {
			t.Errorf("direct=%v: %d bytes allocated for 3 blocks of data: zero runs were not holed (block %d)", direct, n, s.block)
		}
	}
}

// alignedBytes is page-aligned memory off the heap, as staging slots are.
func alignedBytes(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func TestReserveDataOnly(t *testing.T) {
	// A 1 GiB file whose data is two chunks: only they are fallocated.
	f := diskFile(t, nil)
	l := chunker.Layout{Size: 1 << 30, ChunkSize: 1 << 20}
	em := &ExtentMap{Size: l.Size, Extents: []protocol.Extent{{Offset: 5 << 20, Length: 4096}, {Offset: 700 << 20, Length: 1 << 20}}}
	if err := Allocate(f, l.Size); err != nil {
		t.Fatal(err)
	}
	if err := Reserve(f, em, l); err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	if fi.Size() != l.Size {
		t.Fatalf("size %d, want %d", fi.Size(), l.Size)
	}
	if n := allocated(t, f.Name()); n < 2<<20 || n > 2<<20+64<<10 {
		t.Errorf("reserved %d bytes for two 1 MiB data chunks", n)
	}
}

func TestHoleOnDeviceWritesDirect(t *testing.T) {
	// --zero write on a device: the zeros go out through O_DIRECT, from
	// page-aligned memory, as chunks do (not through the page cache),
	// and the range reads as zeros.
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	img := filepath.Join(t.TempDir(), "img")
	const size = 8 << 20
	if err := os.WriteFile(img, bytes.Repeat([]byte{0xff}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop devices here (losetup: %v: %s)", err, out)
	}
	dev := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", dev).Run()
	f, err := os.OpenFile(dev, os.O_RDWR|os.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := NewSink(f, true, nil)
	s.Kind = destDevice
	if !s.DirectOn() {
		t.Skipf("no O_DIRECT on %s: %s", dev, s.Why)
	}
	if err := s.Hole(1<<20, 3<<20+512); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if got := s.DirectBytes(); got < 3<<20 {
		t.Errorf("%d bytes of zeros went through O_DIRECT, want the 3 MiB of whole pages", got)
	}
	got := make([]byte, size)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xff}, size)
	clear(want[1<<20 : 4<<20+512])
	if !bytes.Equal(got, want) {
		t.Fatal("the device does not read zeros where Hole was, and its old bytes elsewhere")
	}
}
