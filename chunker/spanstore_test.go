package chunker

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func testSums(first, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(first+i)*2654435761 | 1
	}
	return s
}

// TestStoreSpans: span sums round-trip; a range not all saved is absent;
// Drop and a new version drop them with the digests.
func TestStoreSpans(t *testing.T) {
	s := openTestStore(t, 0)
	k := testKey(1, 64<<20+100, CRC32C) // 16384 whole spans and a short one
	k.ChunkSize = 4 << 20
	sums := testSums(0, 16384)
	if err := s.SaveSpans(k, 0, sums[:8192]); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.LoadSpans(k, 100, 50); !ok || !slices.Equal(got, sums[100:150]) {
		t.Fatalf("LoadSpans(100, 50) = %v, %v", ok, got)
	}
	if _, ok := s.LoadSpans(k, 8000, 500); ok {
		t.Fatal("spans 8000-8499 loaded, but only 0-8191 were saved")
	}
	if err := s.SaveSpans(k, 8192, sums[8192:]); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.LoadSpans(k, 0, 16384); !ok || !slices.Equal(got, sums) {
		t.Fatal("all spans saved, not all loaded")
	}
	if _, ok := s.LoadSpans(k, 0, 16385); ok {
		t.Fatal("loaded a span past the file's whole spans")
	}
	newer := k
	newer.MtimeNs++
	if err := s.SaveSpans(newer, 0, sums[:10]); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.LoadSpans(k, 0, 10); ok {
		t.Error("the old version's spans survived a new version's save")
	}
	s.Drop(k.Dev, k.Ino)
	if _, ok := s.LoadSpans(newer, 0, 10); ok {
		t.Error("spans survived Drop")
	}
}

// TestStoreSpansOwnBound: span sums are bounded apart from the digests,
// so that many files' spans do not push out digests (which save a read
// of the whole file) by the least-recently-used rule; their own store
// stays within the bound.
func TestStoreSpansOwnBound(t *testing.T) {
	const max = 1 << 20
	s := openTestStore(t, max)
	dk := testKey(1, 64<<20, CRC32C)
	dk.ChunkSize = 4 << 20
	d := testDigests(CRC32C, 0, 16)
	if err := s.Save(dk, 0, d); err != nil {
		t.Fatal(err)
	}
	for ino := uint64(2); ino < 20; ino++ { // 18 files' spans, 132 KiB each
		k := testKey(ino, 64<<20, CRC32C)
		if err := s.SaveSpans(k, 0, testSums(0, 16384)); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok := s.Load(dk, 0, 16); !ok || !bytes.Equal(got, d) {
		t.Error("the digests were evicted by other files' span sums")
	}
	var total int64
	fis, _ := os.ReadDir(filepath.Join(s.Dir(), spansDir))
	for _, fi := range fis {
		if info, err := fi.Info(); err == nil {
			total += diskSize(info.Size())
		}
	}
	if total > max || len(fis) == 0 {
		t.Errorf("the spans' store holds %d files, %d bytes; want some, at most %d", len(fis), total, max)
	}
}

// TestPersistSavesSpans: rdmacp hash (Persist) keeps the span sums of
// CRC32C digests, the same a target's hash pass finds.
func TestPersistSavesSpans(t *testing.T) {
	s := openTestStore(t, 0)
	p := filepath.Join(t.TempDir(), "f")
	b := bytes.Repeat([]byte("0123456789abcdef"), (3<<20+5000)/16)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := Layout{Size: int64(len(b)), ChunkSize: 1 << 20}
	if _, err := Persist(context.Background(), f, l, CRC32C, s, 2, nil); err != nil {
		t.Fatal(err)
	}
	want := make([]uint32, Spans(l.Size))
	if _, err := HashRangeSpans(context.Background(), f, l, 0, l.Chunks(), CRC32C, 1, nil, want); err != nil {
		t.Fatal(err)
	}
	k, err := statKey(f, l, CRC32C)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := s.LoadSpans(k, 0, len(want)); !ok || !slices.Equal(got, want) {
		t.Errorf("Persist saved no span sums, or other ones (%v)", ok)
	}
}
