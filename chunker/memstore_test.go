package chunker

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestMemStoreRoundTrip(t *testing.T) {
	for _, alg := range []Algorithm{CRC32C, BLAKE3} {
		t.Run(alg.String(), func(t *testing.T) {
			s := NewMemStore(0)
			k := testKey(1, 100*4096+17, alg) // 101 chunks, the last short
			want := testDigests(alg, 0, 101)
			if _, ok := s.Load(k, 0, 101); ok {
				t.Fatal("Load before any Save: ok")
			}
			if err := s.Save(k, 0, want); err != nil {
				t.Fatal(err)
			}
			got, ok := s.Load(k, 0, 101)
			if !ok || !bytes.Equal(got, want) {
				t.Fatalf("Load after Save: ok=%v, equal=%v", ok, bytes.Equal(got, want))
			}
			// What Load returns is the caller's: patching it changes
			// nothing stored.
			got[0] ^= 0xff
			if again, _ := s.Load(k, 0, 1); !bytes.Equal(again, want[:alg.Size()]) {
				t.Fatal("patching what Load returned changed the store")
			}
			k2 := k
			k2.MtimeNs++
			if _, ok := s.Load(k2, 0, 1); ok {
				t.Fatal("Load of another version: ok")
			}
		})
	}
}

func TestMemStorePartialRanges(t *testing.T) {
	s := NewMemStore(0)
	k := testKey(2, 64*4096, CRC32C)
	all := testDigests(CRC32C, 0, 64)
	// Windows saved out of order, with a gap at [16, 24).
	for _, w := range [][2]int{{40, 24}, {0, 16}, {24, 16}} {
		if err := s.Save(k, w[0], all[w[0]*4:(w[0]+w[1])*4]); err != nil {
			t.Fatal(err)
		}
	}
	s.Drop(99, 99) // another file's: changes nothing here
	for _, c := range []struct {
		first, n int
		ok       bool
	}{{0, 16, true}, {40, 24, true}, {24, 16, true}, {30, 10, true}, {16, 8, false}, {10, 10, false}, {0, 64, false}, {23, 1, false}, {24, 0, true}} {
		got, ok := s.Load(k, c.first, c.n)
		if ok != c.ok || (ok && !bytes.Equal(got, all[c.first*4:(c.first+c.n)*4])) {
			t.Errorf("Load [%d, +%d): ok=%v, want %v", c.first, c.n, ok, c.ok)
		}
	}
	// Out of range and ragged input are errors, not panics.
	if err := s.Save(k, 60, all[:8*4]); err == nil {
		t.Error("Save past the last chunk: no error")
	}
	if err := s.Save(k, 0, all[:5]); err == nil {
		t.Error("Save of a partial digest: no error")
	}
	if _, ok := s.Load(k, 60, 8); ok {
		t.Error("Load past the last chunk: ok")
	}
}

func TestMemStoreNewVersionDropsOld(t *testing.T) {
	s := NewMemStore(0)
	k := testKey(4, 4*4096, CRC32C)
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 4)); err != nil {
		t.Fatal(err)
	}
	// The same version in BLAKE3 lives beside it.
	kb := k
	kb.Alg = BLAKE3
	if err := s.Save(kb, 0, testDigests(BLAKE3, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Load(k, 0, 4); !ok {
		t.Fatal("crc32c digests gone after saving blake3 ones of the same version")
	}
	// A new version (the file was written: new ctime) drops both.
	k2 := k
	k2.CtimeNs += int64(time.Second)
	if err := s.Save(k2, 0, testDigests(CRC32C, 1, 4)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Load(k, 0, 4); ok {
		t.Error("old crc32c version still loads")
	}
	if _, ok := s.Load(kb, 0, 4); ok {
		t.Error("old blake3 version still loads")
	}
	if got, ok := s.Load(k2, 0, 4); !ok || !bytes.Equal(got, testDigests(CRC32C, 1, 4)) {
		t.Errorf("new version: ok=%v", ok)
	}
	if got, want := s.Size(), memCost(k2); got != want {
		t.Errorf("store holds %d bytes, want the new version's %d alone", got, want)
	}
	// A stale caller (the older key) neither loads nor displaces it.
	if err := s.Save(k, 0, testDigests(CRC32C, 9, 4)); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.Load(k2, 0, 4); !ok || !bytes.Equal(got, testDigests(CRC32C, 1, 4)) {
		t.Errorf("new version after a stale Save: ok=%v", ok)
	}
}

func TestMemStoreLoadDropsOlderVersion(t *testing.T) {
	// An inode reused by a new file of the same size and mtime: only its
	// ctime differs. Asking under the new key forgets the old digests.
	s := NewMemStore(0)
	k := testKey(9, 4*4096, CRC32C)
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 4)); err != nil {
		t.Fatal(err)
	}
	reused := k
	reused.CtimeNs++
	if _, ok := s.Load(reused, 0, 4); ok {
		t.Fatal("digests of the old file loaded for the new one")
	}
	if s.Size() != 0 {
		t.Errorf("stale version still held: %d bytes", s.Size())
	}
}

func TestMemStoreDrop(t *testing.T) {
	s := NewMemStore(0)
	k, other := testKey(5, 4*4096, CRC32C), testKey(6, 4*4096, CRC32C)
	kb := k
	kb.Alg, kb.ChunkSize = BLAKE3, 8192
	for _, key := range []Key{k, kb, other} {
		n := Layout{Size: key.Size, ChunkSize: key.ChunkSize}.Chunks()
		if err := s.Save(key, 0, testDigests(key.Alg, 0, n)); err != nil {
			t.Fatal(err)
		}
	}
	s.Drop(k.Dev, k.Ino)
	if _, ok := s.Load(k, 0, 4); ok {
		t.Error("dropped crc32c digests load")
	}
	if _, ok := s.Load(kb, 0, 2); ok {
		t.Error("dropped blake3 digests load")
	}
	if _, ok := s.Load(other, 0, 4); !ok {
		t.Error("another file's digests went with the drop")
	}
	if got, want := s.Size(), memCost(other); got != want {
		t.Errorf("store holds %d bytes after the drop, want %d", got, want)
	}
}

func TestMemStoreEvictsByBytes(t *testing.T) {
	// Each version: 128 chunks × 4 + a 16-byte bitmap + the overhead;
	// room for 4.
	per := memCost(testKey(0, 128*4096, CRC32C))
	bound := 4*per + per/2
	s := NewMemStore(bound)
	keys := make([]Key, 6)
	for i := range keys {
		keys[i] = testKey(uint64(100+i), 128*4096, CRC32C)
		if err := s.Save(keys[i], 0, testDigests(CRC32C, 0, 128)); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			// Using key 0 makes key 1 the least recently used.
			if _, ok := s.Load(keys[0], 0, 1); !ok {
				t.Fatal("key 0 gone early")
			}
		}
	}
	if s.Size() > bound {
		t.Errorf("store holds %d bytes, over its bound of %d", s.Size(), bound)
	}
	for i, want := range []bool{true, false, false, true, true, true} {
		if _, ok := s.Load(keys[i], 0, 128); ok != want {
			t.Errorf("key %d held: %v, want %v", i, ok, want)
		}
	}
	// A version larger than the whole store is not kept, and evicts
	// nothing: the digests of a 1 PiB file (2^38 chunks) are never allocated.
	big := testKey(200, 4096*4096, CRC32C) // 4096 chunks, 16 KiB of digests
	huge := testKey(201, 1<<50, CRC32C)
	for _, k := range []Key{big, huge} {
		if err := s.Save(k, 0, testDigests(CRC32C, 0, 1)); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Load(k, 0, 1); ok {
			t.Errorf("a version of %d bytes, larger than the store, was kept", k.Size)
		}
	}
	if _, ok := s.Load(keys[5], 0, 1); !ok {
		t.Error("saving an oversized version evicted others")
	}
}

func TestMemStoreRacyNotSaved(t *testing.T) {
	s := NewMemStore(0)
	k := testKey(10, 4*4096, CRC32C)
	k.CtimeNs = time.Now().Add(-time.Second).Truncate(time.Second).UnixNano() // whole seconds: a 2 s window
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Load(k, 0, 4); ok {
		t.Error("digests of a file changed 1 s ago were kept")
	}
	// Once past the racy window (by the store's clock) they are.
	s.now = func() time.Time { return time.Now().Add(3 * time.Second) }
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Load(k, 0, 4); !ok {
		t.Error("digests of a file changed 3 s before the Save were not kept")
	}
}

// TestMemStoreSmallFilesStored: unlike a DirStore's, a MemStore's small
// files cost no disk block: their digests are kept.
func TestMemStoreSmallFilesStored(t *testing.T) {
	s := NewMemStore(0)
	k := testKey(14, 100, CRC32C)
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Load(k, 0, 1); !ok {
		t.Error("digests of a 100-byte file not kept")
	}
}

func TestMemStoreNone(t *testing.T) {
	s := NewMemStore(0)
	k := testKey(11, 4*4096, None)
	if err := s.Save(k, 0, nil); err != nil {
		t.Fatal(err)
	}
	if b, ok := s.Load(k, 0, 4); !ok || len(b) != 0 {
		t.Errorf("None: ok=%v len=%d", ok, len(b))
	}
	if s.Size() != 0 {
		t.Errorf("None digests took %d bytes", s.Size())
	}
}

// TestMemStoreConcurrent: goroutines saving, loading and dropping windows
// of two versions of one file and of files that push each other out
// never load a wrong digest, and the store stays in its bound. Run with
// -race.
func TestMemStoreConcurrent(t *testing.T) {
	const chunks = 64
	per := memCost(testKey(0, chunks*4096, CRC32C))
	s := NewMemStore(3 * per)
	keys := make([]Key, 6)
	for i := range keys {
		keys[i] = testKey(uint64(13+i/2), chunks*4096, CRC32C)
		keys[i].CtimeNs += int64(i % 2) // two versions of each file
	}
	digests := func(v int) []byte { return testDigests(CRC32C, 1000*v, chunks) }
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for g := range 12 {
		wg.Go(func() {
			v := g % len(keys)
			k, all := keys[v], digests(v)
			for i := range 300 {
				first := (i * 8) % chunks
				if err := s.Save(k, first, all[first*4:(first+8)*4]); err != nil {
					errs <- err
					return
				}
				if got, ok := s.Load(k, first, 8); ok && !bytes.Equal(got, all[first*4:(first+8)*4]) {
					errs <- fmt.Errorf("version %d chunks [%d, +8): wrong digests loaded", v, first)
					return
				}
				if i%50 == 49 {
					s.Drop(k.Dev, k.Ino)
				}
				if n := s.Size(); n > 3*per {
					errs <- fmt.Errorf("store holds %d bytes, over its bound of %d", n, 3*per)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
