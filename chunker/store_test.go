package chunker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testKey is a version of a file changed long enough ago to be persistable.
func testKey(ino uint64, size int64, alg Algorithm) Key {
	old := time.Now().Add(-time.Hour).UnixNano()
	return Key{Dev: 7, Ino: ino, Size: size, MtimeNs: old, CtimeNs: old, ChunkSize: 4096, Alg: alg}
}

// testDigests is n distinct digests of alg, starting at chunk first.
func testDigests(alg Algorithm, first, n int) []byte {
	var b []byte
	for i := first; i < first+n; i++ {
		b = AppendSum(b, alg, []byte{byte(i), byte(i >> 8), 'x'})
	}
	return b
}

func openTestStore(t *testing.T, max int64) *DirStore {
	t.Helper()
	s, err := OpenDirStore(filepath.Join(t.TempDir(), "state"), max)
	if err != nil {
		t.Fatal(err)
	}
	s.min, s.spans.min = 0, 0 // the tests' files are small
	return s
}

func TestStoreRoundTrip(t *testing.T) {
	for _, alg := range []Algorithm{CRC32C, BLAKE3} {
		t.Run(alg.String(), func(t *testing.T) {
			s := openTestStore(t, 0)
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
			// A reopened store (a restarted daemon) has them too.
			s2, err := OpenDirStore(s.Dir(), 0)
			if err != nil {
				t.Fatal(err)
			}
			if got, ok := s2.Load(k, 0, 101); !ok || !bytes.Equal(got, want) {
				t.Fatalf("Load after reopening: ok=%v", ok)
			}
			// Another key (one more ns of mtime) has none.
			k2 := k
			k2.MtimeNs++
			if _, ok := s2.Load(k2, 0, 1); ok {
				t.Fatal("Load of another version: ok")
			}
		})
	}
}

func TestStorePartialRanges(t *testing.T) {
	s := openTestStore(t, 0)
	k := testKey(2, 64*4096, CRC32C)
	all := testDigests(CRC32C, 0, 64)
	// Windows saved out of order, with a gap at [16, 24).
	for _, w := range [][2]int{{40, 24}, {0, 16}, {24, 16}} {
		if err := s.Save(k, w[0], all[w[0]*4:(w[0]+w[1])*4]); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		first, n int
		ok       bool
	}{{0, 16, true}, {24, 40, true}, {3, 5, true}, {63, 1, true}, {0, 64, false}, {15, 2, false}, {16, 8, false}, {23, 2, false}, {0, 0, true}} {
		got, ok := s.Load(k, c.first, c.n)
		if ok != c.ok {
			t.Errorf("Load(%d, %d): ok=%v, want %v", c.first, c.n, ok, c.ok)
			continue
		}
		if ok && !bytes.Equal(got, all[c.first*4:(c.first+c.n)*4]) {
			t.Errorf("Load(%d, %d): wrong digests", c.first, c.n)
		}
	}
	// Out of range is refused, not read.
	if _, ok := s.Load(k, 60, 5); ok {
		t.Error("Load past the last chunk: ok")
	}
	if err := s.Save(k, 60, testDigests(CRC32C, 60, 5)); err == nil {
		t.Error("Save past the last chunk: no error")
	}
	if err := s.Save(k, 0, []byte{1, 2, 3}); err == nil {
		t.Error("Save of a partial digest: no error")
	}
}

func TestStoreTornAndCorruptIgnored(t *testing.T) {
	s := openTestStore(t, 0)
	k := testKey(3, 8*4096, BLAKE3)
	want := testDigests(BLAKE3, 0, 8)
	if err := s.Save(k, 0, want); err != nil {
		t.Fatal(err)
	}
	p := s.name(k)
	ss := int64(slotSize(BLAKE3))
	// Flip one byte of chunk 5's digest: chunk 5 reads as absent, the
	// others are still there.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	off := storeHeaderSize + 5*ss + 3
	f.ReadAt(b, off)
	b[0] ^= 0x40
	f.WriteAt(b, off)
	// A torn write of chunk 2: its first half new, its second half zeros.
	f.WriteAt(make([]byte, ss/2), storeHeaderSize+2*ss+ss/2)
	f.Close()
	if _, ok := s.Load(k, 5, 1); ok {
		t.Error("corrupt slot 5 loaded")
	}
	if _, ok := s.Load(k, 2, 1); ok {
		t.Error("torn slot 2 loaded")
	}
	if _, ok := s.Load(k, 0, 8); ok {
		t.Error("range over corrupt slots loaded")
	}
	if got, ok := s.Load(k, 6, 2); !ok || !bytes.Equal(got, want[6*32:8*32]) {
		t.Errorf("intact slots 6, 7: ok=%v", ok)
	}
	// Saving again repairs.
	if err := s.Save(k, 0, want); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.Load(k, 0, 8); !ok || !bytes.Equal(got, want) {
		t.Errorf("after resave: ok=%v", ok)
	}
	// A corrupt header: the whole file is absent (and removed).
	f, _ = os.OpenFile(p, os.O_RDWR, 0)
	f.WriteAt([]byte{0xff}, 20)
	f.Close()
	if _, ok := s.Load(k, 0, 1); ok {
		t.Error("file with a corrupt header loaded")
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file with a corrupt header still there: %v", err)
	}
	// A file truncated after its header: absent.
	if err := s.Save(k, 0, want); err != nil {
		t.Fatal(err)
	}
	os.Truncate(p, storeHeaderSize+3*ss)
	if _, ok := s.Load(k, 2, 2); ok {
		t.Error("slots past a truncation loaded")
	}
}

func TestStoreNewVersionDropsOld(t *testing.T) {
	s := openTestStore(t, 0)
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
	ps, _ := filepath.Glob(filepath.Join(s.Dir(), fileID(k.Dev, k.Ino)+".*"))
	if len(ps) != 1 {
		t.Errorf("files of the inode: %v, want one", ps)
	}
}

func TestStoreDrop(t *testing.T) {
	s := openTestStore(t, 0)
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
}

func TestStoreSizeBoundEvicts(t *testing.T) {
	// Each file: 72 + 128 × 8 = 1096 bytes, counted as a 4 KiB block;
	// room for 4.
	const bound = 4*4096 + 100
	s := openTestStore(t, bound)
	now := time.Now()
	s.now = func() time.Time { return now }
	keys := make([]Key, 6)
	for i := range keys {
		keys[i] = testKey(uint64(100+i), 128*4096, CRC32C)
		now = now.Add(2 * touchEvery)
		if err := s.Save(keys[i], 0, testDigests(CRC32C, 0, 128)); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(s.name(keys[i]), now, now)
		if i == 2 {
			// Using key 0 makes key 1 the least recently used.
			now = now.Add(2 * touchEvery)
			if _, ok := s.Load(keys[0], 0, 1); !ok {
				t.Fatal("key 0 gone early")
			}
		}
	}
	total, files, _ := s.scan()
	if total > bound {
		t.Errorf("store holds %d bytes in %d files, over its bound of %d", total, len(files), bound)
	}
	if _, ok := s.Load(keys[1], 0, 1); ok {
		t.Error("least recently used key 1 not evicted")
	}
	for _, i := range []int{0, 5} {
		if _, ok := s.Load(keys[i], 0, 128); !ok {
			t.Errorf("key %d evicted", i)
		}
	}
	// A version larger than the whole store is not kept at all.
	big := testKey(200, 4096*4096, CRC32C) // 32 KiB of slots
	if err := s.Save(big, 0, testDigests(CRC32C, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Load(big, 0, 1); ok {
		t.Error("a version larger than the store was kept")
	}
	if _, ok := s.Load(keys[5], 0, 1); !ok {
		t.Error("saving an oversized version evicted others")
	}
}

func TestStoreInodeReusedByAnotherFile(t *testing.T) {
	s := openTestStore(t, 0)
	k := testKey(9, 4*4096, CRC32C)
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 4)); err != nil {
		t.Fatal(err)
	}
	// The file is deleted and its inode number reused by a new file of the
	// same size and (copied, touch -r) mtime: only its ctime differs.
	reused := k
	reused.CtimeNs += 1
	if _, ok := s.Load(reused, 0, 4); ok {
		t.Fatal("digests of the old file loaded for the new one")
	}
	// Asking under the new key dropped the stale version.
	if _, err := os.Stat(s.name(k)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale version still stored: %v", err)
	}
}

// TestStoreRacyNotSaved: digests of a file that changed within its file
// system's racy window before they were hashed are not saved. The window
// is 2 s where ctime keeps whole seconds, 50 ms where it keeps nanoseconds.
func TestStoreRacyNotSaved(t *testing.T) {
	now := time.Now()
	coarse := now.Add(-time.Second).Truncate(time.Second)
	for i, c := range []struct {
		name            string
		changed, ctime  time.Time
		wantPersistable bool
	}{
		{"whole-second stamps, changed 1 s ago", coarse, coarse, false},
		{"whole-second stamps, changed 3 s ago", now.Add(-3 * time.Second).Truncate(time.Second), now.Add(-time.Hour).Truncate(time.Second), true},
		{"nanosecond stamps, changed 1 s ago", now.Add(-time.Second), now.Add(-time.Hour), true},
		{"nanosecond stamps, changed 10 ms ago", now.Add(-10 * time.Millisecond), now.Add(-10 * time.Millisecond), false},
		{"nanosecond ctime, mtime 10 ms ago", now.Add(-10 * time.Millisecond), now.Add(-time.Hour), false},
	} {
		s := openTestStore(t, 0)
		s.now = func() time.Time { return now } // the Save's clock: load can't move a case across a window
		k := testKey(uint64(10+i), 4*4096, CRC32C)
		k.MtimeNs, k.CtimeNs = c.changed.UnixNano(), c.ctime.UnixNano()
		if c.ctime.Nanosecond() != 0 && c.ctime.Nanosecond()%int(time.Millisecond) == 0 {
			k.CtimeNs++ // a nanosecond part, whatever the clock's resolution
		}
		if got := Persistable(k, now); got != c.wantPersistable {
			t.Errorf("%s: Persistable %v, want %v", c.name, got, c.wantPersistable)
		}
		if err := s.Save(k, 0, testDigests(CRC32C, 0, 4)); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Load(k, 0, 4); ok != c.wantPersistable {
			t.Errorf("%s: saved %v, want %v", c.name, ok, c.wantPersistable)
		}
	}
}

// TestStoreSmallFilesNotStored: a file under 64 KiB costs a lookup no
// less than a hash; its digests are not stored.
func TestStoreSmallFilesNotStored(t *testing.T) {
	s, err := OpenDirStore(filepath.Join(t.TempDir(), "state"), 0)
	if err != nil {
		t.Fatal(err)
	}
	small, big := testKey(14, 64<<10-1, CRC32C), testKey(15, 64<<10, CRC32C)
	for _, k := range []Key{small, big} {
		if err := s.Save(k, 0, testDigests(CRC32C, 0, 16)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.Load(small, 0, 16); ok {
		t.Error("digests of a file under 64 KiB stored")
	}
	if _, ok := s.Load(big, 0, 16); !ok {
		t.Error("digests of a 64 KiB file not stored")
	}
}

func TestStoreNone(t *testing.T) {
	s := openTestStore(t, 0)
	k := testKey(11, 4*4096, None)
	if err := s.Save(k, 0, nil); err != nil {
		t.Fatal(err)
	}
	if b, ok := s.Load(k, 0, 4); !ok || len(b) != 0 {
		t.Errorf("None: ok=%v len=%d", ok, len(b))
	}
}

func TestStoreRefusesBadDir(t *testing.T) {
	base := t.TempDir()
	open := func(dir string) error { _, err := OpenDirStore(dir, 0); return err }

	// Created 0700.
	good := filepath.Join(base, "a", "state")
	if err := open(good); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(good); fi.Mode().Perm() != 0o700 {
		t.Errorf("created with mode %04o, want 0700", fi.Mode().Perm())
	}
	var de *StoreDirError
	for _, mode := range []os.FileMode{0o770, 0o707, 0o777} {
		os.Chmod(good, mode)
		if err := open(good); !errors.As(err, &de) {
			t.Errorf("mode %04o: err %v, want a StoreDirError", mode, err)
		}
	}
	os.Chmod(good, 0o750) // readable by the group is fine
	if err := open(good); err != nil {
		t.Errorf("mode 0750: %v", err)
	}
	link := filepath.Join(base, "link")
	os.Symlink(good, link)
	if err := open(link); !errors.As(err, &de) {
		t.Errorf("symlink: err %v, want a StoreDirError", err)
	}
	file := filepath.Join(base, "file")
	os.WriteFile(file, nil, 0o600)
	if err := open(file); !errors.As(err, &de) {
		t.Errorf("regular file: err %v, want a StoreDirError", err)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		os.Mkdir(other, 0o700)
		os.Chown(other, 12345, 12345)
		if err := open(other); !errors.As(err, &de) {
			t.Errorf("dir of another user: err %v, want a StoreDirError", err)
		}
	}
}

// TestStoreKeyOfFile: a key from a real file, saved and loaded; a touch -r
// edit (content changed, mtime put back) gets another key, so the stored
// digests are not used.
func TestStoreKeyOfTouchR(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, bytes.Repeat([]byte("a"), 3*4096), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p, old, old)
	l := Layout{Size: 3 * 4096, ChunkSize: 4096}
	fi, _ := os.Stat(p)
	k, err := KeyOf(fi, l, CRC32C)
	if err != nil {
		t.Fatal(err)
	}
	s := openTestStore(t, 0)
	s.now = func() time.Time { return time.Now().Add(time.Hour) } // ctime is now: pretend it is later
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 3)); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(p)
	if k2, _ := KeyOf(fi, l, CRC32C); k2 != k {
		t.Fatal("key changed without an edit")
	}
	if _, ok := s.Load(k, 0, 3); !ok {
		t.Fatal("saved digests not loaded")
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(p, bytes.Repeat([]byte("b"), 3*4096), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(p, old, old) // touch -r
	fi, _ = os.Stat(p)
	k2, err := KeyOf(fi, l, CRC32C)
	if err != nil {
		t.Fatal(err)
	}
	if k2.MtimeNs != k.MtimeNs || k2.Size != k.Size {
		t.Fatalf("touch -r did not put size and mtime back")
	}
	if _, ok := s.Load(k2, 0, 3); ok {
		t.Error("digests of the old contents loaded after a touch -r edit")
	}
}

// TestPersist: Persist stores what HashFile computes, under the file's
// KeyOf; a second Persist reads nothing; a file with some windows stored
// hashes only the others.
func TestPersist(t *testing.T) {
	old := persistWindow
	persistWindow = 4 * 4096
	defer func() { persistWindow = old }()
	p := filepath.Join(t.TempDir(), "f")
	data := make([]byte, 10*4096+100)
	for i := range data {
		data[i] = byte(i * 7 / 5)
	}
	os.WriteFile(p, data, 0o644)
	then := time.Now().Add(-time.Hour)
	os.Chtimes(p, then, then)
	s := openTestStore(t, 0)
	s.now = func() time.Time { return time.Now().Add(time.Hour) } // the ctime is now
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := Layout{Size: int64(len(data)), ChunkSize: 4096}
	want, err := HashFile(context.Background(), f, l, BLAKE3, 2)
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	hashed, err := Persist(context.Background(), f, l, BLAKE3, s, 2, func(done int64) { last = done })
	if err != nil {
		t.Fatal(err) // (the file's ctime is now: Persist waited 2 s for it)
	}
	if hashed != int64(len(data)) || last != int64(len(data)) {
		t.Errorf("first Persist: hashed %d, progress %d, want %d", hashed, last, len(data))
	}
	fi, _ := f.Stat()
	k, _ := KeyOf(fi, l, BLAKE3)
	got, ok := s.Load(k, 0, l.Chunks())
	if !ok || !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("stored digests: ok=%v, equal to HashFile's: %v", ok, bytes.Equal(got, want.Bytes()))
	}
	if hashed, err := Persist(context.Background(), f, l, BLAKE3, s, 2, nil); err != nil || hashed != 0 {
		t.Errorf("second Persist: hashed %d, %v; want 0", hashed, err)
	}
	// Lose chunk 5 (window [4, 8)): only that window is hashed again.
	fh, _ := os.OpenFile(s.name(k), os.O_RDWR, 0)
	fh.WriteAt(make([]byte, slotSize(BLAKE3)), storeHeaderSize+5*int64(slotSize(BLAKE3)))
	fh.Close()
	if hashed, err := Persist(context.Background(), f, l, BLAKE3, s, 2, nil); err != nil || hashed != 4*4096 {
		t.Errorf("Persist with one chunk lost: hashed %d, %v; want %d", hashed, err, 4*4096)
	}
	if got, ok := s.Load(k, 0, l.Chunks()); !ok || !bytes.Equal(got, want.Bytes()) {
		t.Error("digests after repair differ from HashFile's")
	}
}

// TestStoreStaleKeyKeepsNewer: a caller still holding an older version's
// key (a session opened before the file changed) neither loads nor
// drops the newer version, and its Save does not replace it.
func TestStoreStaleKeyKeepsNewer(t *testing.T) {
	s := openTestStore(t, 0)
	older := testKey(12, 4*4096, CRC32C)
	newer := older
	newer.CtimeNs += int64(time.Second)
	if err := s.Save(newer, 0, testDigests(CRC32C, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Load(older, 0, 4); ok {
		t.Fatal("older key loads the newer version's digests")
	}
	if err := s.Save(older, 0, testDigests(CRC32C, 9, 4)); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.Load(newer, 0, 4); !ok || !bytes.Equal(got, testDigests(CRC32C, 0, 4)) {
		t.Errorf("newer version after a stale Load and Save: ok=%v", ok)
	}
}

// TestStoreConcurrent: goroutines saving and loading windows of the same
// versions at once (sessions serving one file, and a new version
// arriving) never load a wrong digest. Run with -race.
func TestStoreConcurrent(t *testing.T) {
	s := openTestStore(t, 0)
	const chunks = 64
	keys := []Key{testKey(13, chunks*4096, CRC32C), testKey(13, chunks*4096, CRC32C)}
	keys[1].CtimeNs += 5
	digests := [][]byte{testDigests(CRC32C, 0, chunks), testDigests(CRC32C, 1000, chunks)}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			v := g % 2
			k, all := keys[v], digests[v]
			for i := range 200 {
				first := (i * 8) % chunks
				if err := s.Save(k, first, all[first*4:(first+8)*4]); err != nil {
					errs <- err
					return
				}
				if got, ok := s.Load(k, first, 8); ok && !bytes.Equal(got, all[first*4:(first+8)*4]) {
					errs <- fmt.Errorf("version %d chunks [%d, +8): wrong digests loaded", v, first)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkStoreLoad: one window's lookup (open, two preads, close), to
// set against hashing that window (BenchmarkHashSmall).
func BenchmarkStoreLoad(b *testing.B) {
	s, err := OpenDirStore(filepath.Join(b.TempDir(), "state"), 0)
	if err != nil {
		b.Fatal(err)
	}
	k := testKey(1, 64*4096, CRC32C)
	if err := s.Save(k, 0, testDigests(CRC32C, 0, 64)); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, ok := s.Load(k, 0, 64); !ok {
			b.Fatal("not loaded")
		}
	}
}

// BenchmarkHashSmall: hashing a 64 KiB page-cached file in one chunk.
func BenchmarkHashSmall(b *testing.B) {
	p := filepath.Join(b.TempDir(), "f")
	os.WriteFile(p, make([]byte, 64<<10), 0o644)
	f, _ := os.Open(p)
	defer f.Close()
	l := Layout{Size: 64 << 10, ChunkSize: 4 << 20}
	b.SetBytes(l.Size)
	for b.Loop() {
		if _, err := HashFile(context.Background(), f, l, CRC32C, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSettleDelay: a hash of a file changed a moment ago waits out the rest
// of a nanosecond file system's racy window (so what it hashes is saved),
// and does not wait on a whole-second one or for times in the future.
func TestSettleDelay(t *testing.T) {
	now := time.Unix(1_700_000_000, 500_000_000)
	fine := func(ago time.Duration) Key { return Key{CtimeNs: now.Add(-ago).UnixNano() | 1} }
	coarse := Key{CtimeNs: now.Add(-500 * time.Millisecond).Truncate(time.Second).UnixNano()}
	for _, c := range []struct {
		name     string
		k        Key
		min, max time.Duration
		ok       bool
	}{
		{"fine, settled", fine(time.Second), 0, 0, true},
		{"fine, 20 ms ago", fine(20 * time.Millisecond), 30 * time.Millisecond, 32 * time.Millisecond, true},
		{"fine, just now", fine(0), 50 * time.Millisecond, 52 * time.Millisecond, true},
		{"fine, in the future", fine(-time.Second), 0, 0, false},
		{"whole seconds, 500 ms ago", coarse, 0, 0, false},
	} {
		d, ok := SettleDelay(c.k, now)
		if ok != c.ok || (ok && (d < c.min || d > c.max)) {
			t.Errorf("%s: SettleDelay = %v, %v; want %v in [%v, %v]", c.name, d, ok, c.ok, c.min, c.max)
		}
	}
}
