package chunker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"lukechampine.com/blake3"
)

func TestAlgorithmNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		alg  Algorithm
		size int
	}{
		{"crc32c", CRC32C, 4},
		{"blake3", BLAKE3, 32},
		{"none", None, 0},
	} {
		alg, err := ParseAlgorithm(tc.name)
		if err != nil || alg != tc.alg {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", tc.name, alg, err, tc.alg)
		}
		if alg.String() != tc.name || alg.Size() != tc.size || !alg.Valid() {
			t.Errorf("%v: String %q Size %d Valid %v", alg, alg.String(), alg.Size(), alg.Valid())
		}
	}
	if _, err := ParseAlgorithm("md5"); err == nil {
		t.Error("ParseAlgorithm(md5) succeeded")
	}
	if Algorithm(9).Valid() || Algorithm(9).String() != "algorithm(9)" {
		t.Error("Algorithm(9) looks valid")
	}
	var zero Algorithm
	if zero != CRC32C {
		t.Error("the zero Algorithm is not the default CRC32C")
	}
}

func TestCRC32CVector(t *testing.T) {
	got := Sum(CRC32C, []byte("123456789"))
	if want := []byte{0xe3, 0x06, 0x92, 0x83}; !Equal(got, want) {
		t.Fatalf("crc32c(123456789) = %x, want %x", got, want)
	}
	if s := FormatDigest(CRC32C, got); s != "crc32c:e3069283" {
		t.Errorf("FormatDigest = %q", s)
	}
}

func TestBLAKE3Vector(t *testing.T) {
	want, _ := hex.DecodeString("af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262")
	got := Sum(BLAKE3, nil)
	if !Equal(got, want) {
		t.Fatalf("blake3(\"\") = %x, want %x", got, want)
	}
	if s := FormatDigest(BLAKE3, got); s != "blake3:"+hex.EncodeToString(want) {
		t.Errorf("FormatDigest = %q", s)
	}
}

func TestSumNone(t *testing.T) {
	if got := Sum(None, []byte("x")); len(got) != 0 {
		t.Errorf("Sum(None) = %x", got)
	}
	if s := FormatDigest(None, nil); s != "none" {
		t.Errorf("FormatDigest(None) = %q", s)
	}
}

func TestAppendSumAllocs(t *testing.T) {
	dst := make([]byte, 0, 64)
	for _, tc := range []struct {
		alg Algorithm
		n   int
	}{
		{CRC32C, 1 << 20},
		{None, 1 << 20},
		// The blake3 library hashes inputs over one 1 KiB chunk with
		// goroutines, which allocate; below that it does not.
		{BLAKE3, 1024},
	} {
		p := make([]byte, tc.n)
		n := testing.AllocsPerRun(20, func() { dst = AppendSum(dst[:0], tc.alg, p) })
		if n != 0 {
			t.Errorf("AppendSum(%v, %d bytes) allocates %v times", tc.alg, tc.n, n)
		}
	}
	// AppendSum appends rather than overwriting.
	got := AppendSum([]byte("ab"), CRC32C, []byte("123456789"))
	if !bytes.Equal(got, []byte{'a', 'b', 0xe3, 0x06, 0x92, 0x83}) {
		t.Errorf("AppendSum = %x", got)
	}
}

func TestValidateChunkSize(t *testing.T) {
	for _, n := range []int64{MinChunkSize, 3 * MinChunkSize, DefaultChunkSize, MaxChunkSize} {
		if err := ValidateChunkSize(n); err != nil {
			t.Errorf("ValidateChunkSize(%d): %v", n, err)
		}
	}
	for _, n := range []int64{-4096, 0, 1, MinChunkSize - 1, MinChunkSize + 1, MinChunkSize * 3 / 2, MaxChunkSize + MinChunkSize} {
		if err := ValidateChunkSize(n); err == nil {
			t.Errorf("ValidateChunkSize(%d) accepted", n)
		}
	}
}

func TestLayout(t *testing.T) {
	const c = 4096
	for _, tc := range []struct {
		size    int64
		chunks  int
		lastLen int64
	}{
		{0, 0, 0},
		{1, 1, 1},
		{c - 1, 1, c - 1},
		{c, 1, c},
		{c + 1, 2, 1},
		{3 * c, 3, c},
		{3*c + 7, 4, 7},
	} {
		l := Layout{Size: tc.size, ChunkSize: c}
		if err := l.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := l.Chunks(); got != tc.chunks {
			t.Errorf("size %d: %d chunks, want %d", tc.size, got, tc.chunks)
			continue
		}
		var total int64
		for i := range tc.chunks {
			off, length := l.Chunk(i)
			if off != total {
				t.Errorf("size %d: chunk %d at %d, want %d", tc.size, i, off, total)
			}
			if i < tc.chunks-1 && length != c {
				t.Errorf("size %d: chunk %d is %d bytes", tc.size, i, length)
			}
			if i == tc.chunks-1 && length != tc.lastLen {
				t.Errorf("size %d: last chunk is %d bytes, want %d", tc.size, length, tc.lastLen)
			}
			total += length
		}
		if total != tc.size {
			t.Errorf("size %d: chunks cover %d bytes", tc.size, total)
		}
	}
	// Sizes near the top of int64 must not overflow.
	big := Layout{Size: 1<<63 - 1, ChunkSize: MaxChunkSize}
	if got, want := big.Chunks(), int(((1<<63-1)-1)/MaxChunkSize+1); got != want {
		t.Errorf("huge file: %d chunks, want %d", got, want)
	}
	if _, length := big.Chunk(big.Chunks() - 1); length <= 0 || length > MaxChunkSize {
		t.Errorf("huge file: last chunk %d bytes", length)
	}
	for _, bad := range []Layout{{Size: -1, ChunkSize: c}, {Size: 1, ChunkSize: 0}, {Size: 1, ChunkSize: -4}} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
		if bad.Chunks() != 0 {
			t.Errorf("%+v has %d chunks", bad, bad.Chunks())
		}
	}
}

func TestLayoutChunkPanics(t *testing.T) {
	l := Layout{Size: 10, ChunkSize: 4}
	for _, i := range []int{-1, 3} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Chunk(%d) did not panic", i)
				}
			}()
			l.Chunk(i)
		}()
	}
}

func TestMakeDigests(t *testing.T) {
	d, err := MakeDigests(CRC32C, 3, []byte("abcdefghijkl"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Len() != 3 || string(d.At(1)) != "efgh" || string(d.Range(1, 2)) != "efghijkl" || d.Algorithm() != CRC32C {
		t.Errorf("digests: len %d at(1) %q range %q", d.Len(), d.At(1), d.Range(1, 2))
	}
	if len(d.Range(3, 0)) != 0 {
		t.Error("empty range at end is not empty")
	}
	// At must not let an append run into the next digest.
	if a := append(d.At(0), 'X'); d.At(1)[0] != 'e' || len(a) != 5 {
		t.Error("append to At(0) overwrote digest 1")
	}
	if _, err := MakeDigests(CRC32C, 2, []byte("abc")); err == nil {
		t.Error("MakeDigests accepted 3 bytes for 2 crc32c digests")
	}
	if _, err := MakeDigests(Algorithm(7), 0, nil); err == nil {
		t.Error("MakeDigests accepted an unknown algorithm")
	}
	n, err := MakeDigests(None, 5, nil)
	if err != nil || n.Len() != 5 || len(n.At(4)) != 0 {
		t.Errorf("None digests: %v, len %d", err, n.Len())
	}
}

// tempFile writes n random bytes to a new file and returns it open.
func tempFile(t testing.TB, n int, seed uint64) (*os.File, []byte) {
	t.Helper()
	data := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, data
}

func TestHashFileMatchesSum(t *testing.T) {
	defer func(old int64) { maxRead = old }(maxRead)
	maxRead = 3000 // force chunks of 4096 and more to be hashed in pieces
	f, data := tempFile(t, 5*4096+123, 1)
	for _, alg := range []Algorithm{CRC32C, BLAKE3, None} {
		for _, cs := range []int64{1000, 4096, 8192, 1 << 20} {
			for _, workers := range []int{0, 1, 3, 64} {
				l := Layout{Size: int64(len(data)), ChunkSize: cs}
				d, err := HashFile(context.Background(), f, l, alg, workers)
				if err != nil {
					t.Fatalf("%v chunk %d workers %d: %v", alg, cs, workers, err)
				}
				if d.Len() != l.Chunks() || d.Algorithm() != alg {
					t.Fatalf("%v chunk %d: %d digests, want %d", alg, cs, d.Len(), l.Chunks())
				}
				for i := range l.Chunks() {
					off, length := l.Chunk(i)
					if want := Sum(alg, data[off:off+length]); !Equal(d.At(i), want) {
						t.Fatalf("%v chunk size %d workers %d: chunk %d = %x, want %x", alg, cs, workers, i, d.At(i), want)
					}
				}
			}
		}
	}
}

func TestHashFileEmpty(t *testing.T) {
	f, _ := tempFile(t, 0, 1)
	d, err := HashFile(context.Background(), f, Layout{Size: 0, ChunkSize: 4096}, BLAKE3, 0)
	if err != nil || d.Len() != 0 {
		t.Fatalf("empty file: %d digests, %v", d.Len(), err)
	}
}

func TestHashFileShort(t *testing.T) {
	f, data := tempFile(t, 10000, 2)
	_, err := HashFile(context.Background(), f, Layout{Size: int64(len(data)) + 1, ChunkSize: 4096}, CRC32C, 2)
	if !errors.Is(err, ErrChanged) {
		t.Fatalf("file shorter than layout: err = %v, want ErrChanged", err)
	}
}

type failingReader struct{ err error }

func (r failingReader) ReadAt(p []byte, off int64) (int, error) { return 0, r.err }

func TestHashFileReadError(t *testing.T) {
	boom := errors.New("boom")
	_, err := HashFile(context.Background(), failingReader{boom}, Layout{Size: 100, ChunkSize: 10}, CRC32C, 4)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want it to wrap boom", err)
	}
}

func TestHashFileBadArgs(t *testing.T) {
	f, _ := tempFile(t, 10, 3)
	if _, err := HashFile(context.Background(), f, Layout{Size: 10, ChunkSize: 0}, CRC32C, 1); err == nil {
		t.Error("chunk size 0 accepted")
	}
	if _, err := HashFile(context.Background(), f, Layout{Size: 10, ChunkSize: 4}, Algorithm(5), 1); err == nil {
		t.Error("unknown algorithm accepted")
	}
}

// countingReader counts reads and runs hook before the first.
type countingReader struct {
	r     io.ReaderAt
	reads atomic.Int64
	hook  func() // run by the first read, before any other is counted
	mu    sync.Mutex
}

// ReadAt counts the read; the first runs hook, and the others wait for it
// under mu: without that, a worker descheduled between counting the
// first read and running hook let the other read all 99 chunks first,
// and a cancel "on the first read" came after the last (1 run in ~3,000
// under -race).
func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.mu.Lock()
	if c.reads.Add(1) == 1 && c.hook != nil {
		c.hook()
	}
	c.mu.Unlock()
	return c.r.ReadAt(p, off)
}

func TestHashFileCancel(t *testing.T) {
	f, _ := tempFile(t, 100*4096, 4)
	l := Layout{Size: 100 * 4096, ChunkSize: 4096}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cr := &countingReader{r: f}
	if _, err := HashFile(ctx, cr, l, CRC32C, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled before start: err = %v", err)
	}
	if cr.reads.Load() != 0 {
		t.Errorf("cancelled before start: %d reads", cr.reads.Load())
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	cr = &countingReader{r: f, hook: cancel}
	if _, err := HashFile(ctx, cr, l, CRC32C, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while hashing: err = %v", err)
	}
	if n := cr.reads.Load(); n > 2 {
		t.Errorf("cancelled on the first read, yet %d reads happened", n)
	}
}

// split cuts n into random lengths, with zero-length pieces mixed in.
func split(r *rand.Rand, n int) []int {
	var pieces []int
	for n > 0 {
		var k int
		switch r.IntN(4) {
		case 0:
			k = 0
		case 1:
			k = 1 + r.IntN(min(n, 8))
		default:
			k = 1 + r.IntN(n)
		}
		pieces = append(pieces, k)
		n -= k
	}
	return append(pieces, 0)
}

func TestFileDigestCRC32C(t *testing.T) {
	f, data := tempFile(t, 9*4096+17, 7)
	for _, size := range []int{0, 1, 4095, 4096, 4097, 8192, len(data)} {
		for _, cs := range []int64{4096, 8192, 3 * 4096, 1 << 20} {
			l := Layout{Size: int64(size), ChunkSize: cs}
			d, err := HashFile(context.Background(), f, l, CRC32C, 2)
			if err != nil {
				t.Fatal(err)
			}
			got, err := FileDigest(CRC32C, l, d)
			if err != nil {
				t.Fatal(err)
			}
			want := binary.BigEndian.AppendUint32(nil, crc32.Checksum(data[:size], castagnoli))
			if !Equal(got, want) {
				t.Errorf("size %d chunk %d: file digest %x, want %x", size, cs, got, want)
			}
		}
	}
}

func TestFileDigestBLAKE3(t *testing.T) {
	f, data := tempFile(t, 3*4096+5, 8)
	l := Layout{Size: int64(len(data)), ChunkSize: 4096}
	d, err := HashFile(context.Background(), f, l, BLAKE3, 2)
	if err != nil {
		t.Fatal(err)
	}
	got, err := FileDigest(BLAKE3, l, d)
	if err != nil {
		t.Fatal(err)
	}
	in := []byte("rdmacp-blake3-list-v1")
	in = binary.BigEndian.AppendUint64(in, 4096)
	in = binary.BigEndian.AppendUint64(in, uint64(len(data)))
	for i := range l.Chunks() {
		off, length := l.Chunk(i)
		s := blake3.Sum256(data[off : off+length])
		in = append(in, s[:]...)
	}
	want := blake3.Sum256(in)
	if !Equal(got, want[:]) {
		t.Errorf("file digest %x, want %x", got, want)
	}
	// The same digests under another chunk size give another file digest.
	other, _ := FileDigest(BLAKE3, Layout{Size: l.Size, ChunkSize: 4100}, d)
	if Equal(other, got) {
		t.Error("file digest ignores the chunk size")
	}
}

func TestFileDigestMismatch(t *testing.T) {
	d, _ := MakeDigests(CRC32C, 2, make([]byte, 8))
	if _, err := FileDigest(CRC32C, Layout{Size: 3 * 4096, ChunkSize: 4096}, d); err == nil {
		t.Error("2 digests for 3 chunks accepted")
	}
	if _, err := FileDigest(BLAKE3, Layout{Size: 2 * 4096, ChunkSize: 4096}, d); err == nil {
		t.Error("crc32c digests accepted as blake3")
	}
	n, _ := MakeDigests(None, 2, nil)
	if got, err := FileDigest(None, Layout{Size: 2 * 4096, ChunkSize: 4096}, n); err != nil || len(got) != 0 {
		t.Errorf("None file digest %x, %v", got, err)
	}
}
