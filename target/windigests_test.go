package target_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

const winClient = "rdmacp"

// sparseFile makes a file of size bytes holding random data at each of
// islands (n bytes each), holes elsewhere.
func sparseFile(t *testing.T, path string, size int64, islands []int64, n int) map[int64][]byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Skipf("no sparse files here: %v", err)
	}
	data := map[int64][]byte{}
	r := rand.NewChaCha8([32]byte{7})
	for _, off := range islands {
		b := make([]byte, n)
		r.Read(b)
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		data[off] = b
	}
	return data
}

// digestsOf asks for count digests from chunk first, all pages.
func digestsOf(t *testing.T, p *peer, h uint32, first, count int, size int) []byte {
	t.Helper()
	var out []byte
	for i := first; i < first+count; {
		m, err := p.call(&protocol.Digests{Handle: h, First: uint32(i), Count: uint32(first + count - i)})
		if err != nil {
			t.Fatal(err)
		}
		r := m.(*protocol.DigestsReply)
		if int(r.First) != i || len(r.Digests) == 0 || len(r.Digests)%size != 0 {
			t.Fatalf("digests reply at %d: first %d, %d bytes", i, r.First, len(r.Digests))
		}
		out = append(out, r.Digests...)
		i += len(r.Digests) / size
	}
	return out
}

func TestFirstByteBeforeHashingPastFirstWindow(t *testing.T) {
	// A 64 GiB sparse file with data in each of its first four windows
	// and every 8 GiB: the first READ completes with the first window
	// alone hashed, 8 MiB of the 88 MiB of data. Before digests by
	// window, Open hashed all 64 GiB first. Then mapping window 1 starts
	// its hash while window 0 is still being read.
	dir := t.TempDir()
	const size, window, island = 64 << 30, 32 << 20, 8 << 20
	islands := []int64{0, window, 2 * window, 3 * window}
	for g := int64(8); g < 64; g += 8 {
		islands = append(islands, g<<30)
	}
	data := sparseFile(t, filepath.Join(dir, "big"), size, islands, island)
	cfg := targetConfig(dir, window, 4*window)
	srv, addr := serveSrv(t, cfg)
	p := newPeerAs(t, addr, winClient)
	m, err := p.call(&protocol.Open{Path: "data/big"})
	if err != nil {
		t.Fatal(err)
	}
	or := m.(*protocol.OpenReply)
	if len(or.FileDigest) != 0 || or.Chunks != size/chunker.DefaultChunkSize {
		t.Fatalf("open: file digest %x, %d chunks: want none yet, and %d chunks", or.FileDigest, or.Chunks, size/chunker.DefaultChunkSize)
	}
	m, err = p.call(&protocol.Map{Handle: or.Handle, Length: window})
	if err != nil {
		t.Fatal(err)
	}
	w := m.(*protocol.MapReply).Window
	sums := digestsOf(t, p, or.Handle, 0, window/chunker.DefaultChunkSize, 4)
	if st := p.read(w.Addr, w.RKeys[0], 1<<20); st != verbs.StatusSuccess {
		t.Fatalf("first READ: %v", st)
	}
	hashed := metric(t, srv, "rdmacp_digest_bytes_total")
	t.Logf("bytes hashed when the first READ completed: %d MiB of %d MiB of data", int64(hashed)>>20, len(islands)*island>>20)
	if hashed != island {
		t.Fatalf("%d bytes hashed when the first READ completed: want the first window's %d alone", int64(hashed), island)
	}
	if !bytes.Equal(p.buf[:1<<20], data[0][:1<<20]) {
		t.Fatal("first READ returned the wrong bytes")
	}
	if want := chunker.Sum(chunker.CRC32C, data[0][:chunker.DefaultChunkSize]); !bytes.Equal(sums[:4], want) {
		t.Fatalf("chunk 0 digest %x, want %x", sums[:4], want)
	}
	// Mapping window 1 hashes it, with no Digests asked yet.
	if _, err := p.call(&protocol.Map{Handle: or.Handle, Offset: window, Length: window}); err != nil {
		t.Fatal(err)
	}
	eventually(t, srv, 2*island, "rdmacp_digest_bytes_total")
	// A window far out, all hole, is hashed without reading a byte.
	before := metric(t, srv, "rdmacp_digest_bytes_total")
	far := (44 << 30) / chunker.DefaultChunkSize
	hole := digestsOf(t, p, or.Handle, far, 8, 4)
	zero := chunker.ZeroDigest(chunker.CRC32C, chunker.DefaultChunkSize)
	for i := range 8 {
		if !bytes.Equal(hole[4*i:4*i+4], zero) {
			t.Fatalf("hole chunk %d digest %x, want %x", far+i, hole[4*i:4*i+4], zero)
		}
	}
	if after := metric(t, srv, "rdmacp_digest_bytes_total"); after-before > 8*island {
		t.Fatalf("going to chunk %d hashed %d bytes: more than the islands on the way", far, int64(after-before))
	}
	// The extents are the islands.
	m, err = p.call(&protocol.Extents{Handle: or.Handle})
	if err != nil {
		t.Fatal(err)
	}
	xr := m.(*protocol.ExtentsReply)
	if xr.Next != 0 || len(xr.Extents) != len(islands) {
		t.Fatalf("extents %+v next %d, want the %d islands", xr.Extents, xr.Next, len(islands))
	}
	for i, x := range xr.Extents {
		if int64(x.Offset) != islands[i] || x.Length != island {
			t.Fatalf("extent %d: %+v, want %d+%d", i, x, islands[i], island)
		}
	}
}

func TestWindowDigestsMatchTheWholeFile(t *testing.T) {
	// Digests by window, with holes computed and a tail of holes never
	// asked for, are the file's chunk digests (hashed here, whole), and
	// Close's file digest is the file's.
	for _, alg := range []chunker.Algorithm{chunker.CRC32C, chunker.BLAKE3} {
		dir := t.TempDir()
		const size, window = 200<<20 + 12345, 8 << 20
		sparseFile(t, filepath.Join(dir, "f"), size, []int64{0, 5 << 20, 40 << 20, 100<<20 + 4096}, 3<<20+17)
		cfg := targetConfig(dir, window, 64<<20)
		cfg.ChunkSize = 1 << 20
		_, addr := serveSrv(t, cfg)

		layout := chunker.Layout{Size: size, ChunkSize: cfg.ChunkSize}
		f, err := os.Open(filepath.Join(dir, "f"))
		if err != nil {
			t.Fatal(err)
		}
		whole, err := chunker.HashFile(context.Background(), f, layout, alg, 2)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		var all []byte
		for i := range whole.Len() {
			all = append(all, whole.At(i)...)
		}
		fd, err := chunker.FileDigest(alg, layout, whole)
		if err != nil {
			t.Fatal(err)
		}

		p := newPeerAs(t, addr, winClient)
		m, err := p.call(&protocol.Open{Path: "data/f", Algorithm: uint8(alg)})
		if err != nil {
			t.Fatal(err)
		}
		or := m.(*protocol.OpenReply)
		// Up to the last data (chunk 103), then nothing: the rest is holes.
		got := digestsOf(t, p, or.Handle, 0, 104, alg.Size())
		if !bytes.Equal(got, all[:len(got)]) {
			t.Fatalf("%v: window digests differ from the whole file's", alg)
		}
		m, err = p.call(&protocol.Close{Handle: or.Handle})
		if err != nil {
			t.Fatal(err)
		}
		c, ok := m.(*protocol.Closed)
		if !ok || c.Changed || !bytes.Equal(c.FileDigest, fd) {
			t.Fatalf("%v: Close answered %+v, want Closed with file digest %x", alg, m, fd)
		}
	}
}

func TestSuspectDropsStoredDigests(t *testing.T) {
	// A stored digest that is wrong (the store lied, or the file was
	// changed behind its key) fails every read; Suspect drops the store's
	// digests and answers the chunk's digest hashed from the file.
	dir := t.TempDir()
	data := sparseFile(t, filepath.Join(dir, "f"), 8<<20, []int64{0}, 8<<20)[0]
	st := &lyingStore{}
	cfg := targetConfig(dir, 8<<20, 64<<20)
	cfg.ChunkSize = 1 << 20
	cfg.Digests = st
	_, addr := serveSrv(t, cfg)
	p := newPeerAs(t, addr, winClient)
	m, err := p.call(&protocol.Open{Path: "data/f"})
	if err != nil {
		t.Fatal(err)
	}
	h := m.(*protocol.OpenReply).Handle
	if got := digestsOf(t, p, h, 0, 8, 4); !bytes.Equal(got[:4], []byte{1, 2, 3, 4}) {
		t.Fatalf("digest %x: the store's was not used", got[:4])
	}
	m, err = p.call(&protocol.Suspect{Handle: h, Chunk: 3})
	if err != nil {
		t.Fatal(err)
	}
	r := m.(*protocol.DigestsReply)
	if want := chunker.Sum(chunker.CRC32C, data[3<<20:4<<20]); r.First != 3 || !bytes.Equal(r.Digests, want) {
		t.Fatalf("Suspect answered %d %x, want 3 %x", r.First, r.Digests, want)
	}
	if n := st.dropped.Load(); n != 1 {
		t.Fatalf("store dropped %d times, want 1", n)
	}
	// A later Digests for the chunk (a reconnect's, a second pass) gets
	// the file's digest, not the store's held in the window.
	if got := digestsOf(t, p, h, 3, 1, 4); !bytes.Equal(got, r.Digests) {
		t.Fatalf("Digests after Suspect: %x, want %x", got, r.Digests)
	}
}

// lyingStore holds a wrong digest for every chunk until dropped.
type lyingStore struct{ dropped atomic.Int32 }

func (s *lyingStore) Load(k chunker.Key, first, n int) ([]byte, bool) {
	if s.dropped.Load() > 0 {
		return nil, false
	}
	return bytes.Repeat([]byte{1, 2, 3, 4}, n), true
}
func (s *lyingStore) Save(chunker.Key, int, []byte) error { return nil }
func (s *lyingStore) Drop(uint64, uint64)                 { s.dropped.Add(1) }

var _ chunker.Store = (*lyingStore)(nil)

func TestStoredDigestsNoHashAfterRestart(t *testing.T) {
	// Digests hashed by window go to the store; a new target (a restart)
	// with the same store serves them with no hash pass at all; a touch
	// -r edit (same mtime, new ctime) is a new version and is hashed.
	dir, state := t.TempDir(), t.TempDir()
	os.Chmod(state, 0o700)
	const size = 24 << 20
	path := filepath.Join(dir, "f")
	sparseFile(t, path, size, []int64{0, 16 << 20}, 4<<20)
	// Digests of a file changed within the last 2 s are not stored.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(path, old, old)
	time.Sleep(2100 * time.Millisecond)
	serveOnce := func() (hashed float64, digest []byte) {
		st, err := chunker.OpenDirStore(state, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		cfg := targetConfig(dir, 8<<20, 64<<20)
		cfg.Digests = st
		srv, addr := serveSrv(t, cfg)
		p := newPeerAs(t, addr, winClient)
		m, err := p.call(&protocol.Open{Path: "data/f"})
		if err != nil {
			t.Fatal(err)
		}
		or := m.(*protocol.OpenReply)
		digestsOf(t, p, or.Handle, 0, int(or.Chunks), 4)
		m, err = p.call(&protocol.Close{Handle: or.Handle})
		if err != nil {
			t.Fatal(err)
		}
		return metric(t, srv, "rdmacp_digest_bytes_total"), m.(*protocol.Closed).FileDigest
	}
	first, d1 := serveOnce()
	if first != 8<<20 {
		t.Fatalf("first serve hashed %v bytes, want the 8 MiB of data", first)
	}
	second, d2 := serveOnce()
	if second != 0 || !bytes.Equal(d1, d2) {
		t.Fatalf("second serve hashed %v bytes (want 0), file digest %x then %x", second, d1, d2)
	}
	// An edit that puts the mtime back: the ctime moves, the key changes.
	f, _ := os.OpenFile(path, os.O_WRONLY, 0)
	f.WriteAt([]byte("edit"), 100)
	f.Close()
	os.Chtimes(path, old, old)
	time.Sleep(2100 * time.Millisecond)
	third, d3 := serveOnce()
	if third != 8<<20 || bytes.Equal(d3, d1) {
		t.Fatalf("after an edit hidden by touch -r: hashed %v bytes (want 8 MiB again), digest %x (was %x)", third, d3, d1)
	}
}

// rightStore holds the file's true digests and counts its drops.
type rightStore struct {
	d       []byte // every chunk's digest, in order
	size    int
	dropped atomic.Int32
}

func (s *rightStore) Load(k chunker.Key, first, n int) ([]byte, bool) {
	if s.dropped.Load() > 0 || (first+n)*s.size > len(s.d) {
		return nil, false
	}
	return append([]byte(nil), s.d[first*s.size:(first+n)*s.size]...), true
}
func (s *rightStore) Save(chunker.Key, int, []byte) error { return nil }
func (s *rightStore) Drop(uint64, uint64)                 { s.dropped.Add(1) }

func TestSuspectKeepsSoundDigests(t *testing.T) {
	// A client that suspects a chunk whose stored digest the file bears
	// out (a lying or broken client, a read-only one) drops nothing: the
	// target hashes the chunk again, finds the same digest and keeps the
	// store's digests for everyone; Close still vouches for the file.
	dir := t.TempDir()
	data := sparseFile(t, filepath.Join(dir, "f"), 8<<20, []int64{0}, 8<<20)[0]
	st := &rightStore{size: 4}
	for i := range 8 {
		st.d = append(st.d, chunker.Sum(chunker.CRC32C, data[i<<20:(i+1)<<20])...)
	}
	cfg := targetConfig(dir, 8<<20, 64<<20)
	cfg.ChunkSize = 1 << 20
	cfg.Digests = st
	srv, addr := serveSrv(t, cfg)
	p := newPeerAs(t, addr, winClient)
	m, err := p.call(&protocol.Open{Path: "data/f"})
	if err != nil {
		t.Fatal(err)
	}
	h := m.(*protocol.OpenReply).Handle
	digestsOf(t, p, h, 0, 8, 4)
	m, err = p.call(&protocol.Suspect{Handle: h, Chunk: 3})
	if err != nil {
		t.Fatal(err)
	}
	if r := m.(*protocol.DigestsReply); !bytes.Equal(r.Digests, st.d[12:16]) {
		t.Fatalf("Suspect answered %x, want the stored %x", r.Digests, st.d[12:16])
	}
	if n := st.dropped.Load(); n != 0 {
		t.Fatalf("store dropped %d times for a digest the file bears out", n)
	}
	eventually(t, srv, 1, "rdmacp_suspects_total", "result", "sound")
	m, err = p.call(&protocol.Close{Handle: h})
	if err != nil {
		t.Fatal(err)
	}
	if c := m.(*protocol.Closed); len(c.FileDigest) != 4 {
		t.Fatalf("Close after a sound Suspect has file digest %x: want one", c.FileDigest)
	}
}

func TestSuspectBudget(t *testing.T) {
	// A flood of Suspect is answered TooMany past the session's budget
	// (1 MiB a second, a 2 MiB burst, here: two 1 MiB chunks and, the
	// bucket going below zero, a third), counted, and logged once.
	dir := t.TempDir()
	sparseFile(t, filepath.Join(dir, "f"), 8<<20, []int64{0}, 8<<20)
	var logs logBuffer
	cfg := targetConfig(dir, 8<<20, 64<<20)
	cfg.ChunkSize = 1 << 20
	cfg.SuspectRate = 1 << 20
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	srv, addr := serveSrv(t, cfg)
	p := newPeerAs(t, addr, winClient)
	m, err := p.call(&protocol.Open{Path: "data/f"})
	if err != nil {
		t.Fatal(err)
	}
	h := m.(*protocol.OpenReply).Handle
	digestsOf(t, p, h, 0, 8, 4)
	const n = 20
	start := time.Now()
	granted := 0
	for i := range n {
		_, err := p.call(&protocol.Suspect{Handle: h, Chunk: uint32(i % 8)})
		var pe *protocol.Error
		switch {
		case err == nil:
			granted++
		case errors.As(err, &pe) && pe.Code == protocol.CodeTooMany:
		default:
			t.Fatalf("Suspect %d: %v", i, err)
		}
	}
	took := time.Since(start).Seconds()
	if most := 3 + int(took); granted < 2 || granted > most {
		t.Fatalf("%d of %d Suspects in %.2fs hashed again: want 2 to %d", granted, n, took, most)
	}
	eventually(t, srv, float64(n-granted), "rdmacp_suspects_total", "result", "refused")
	eventually(t, srv, float64(granted), "rdmacp_suspects_total", "result", "sound")
	if l := logs.find(t, "suspect chunk"); len(l) != 1 {
		t.Fatalf("%d log lines for %d Suspects in one window, want 1: %v", len(l), granted, l)
	}
}
