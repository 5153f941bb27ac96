package chunker

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// oldFile writes data to a new file with an mtime an hour ago, so that the
// cache does not consider it racy, and returns it open.
func oldFile(t *testing.T, name string, data []byte) *os.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// settled makes c judge files as if hashed long after they last changed:
// oldFile can set an mtime back, but not the ctime, which is always now.
func settled(c *Cache) {
	c.now = func() time.Time { return time.Now().Add(racyWindow + time.Minute) }
}

// countHashes makes c count its hash calls.
func countHashes(c *Cache) *atomic.Int64 {
	var n atomic.Int64
	c.hash = func(ctx context.Context, r io.ReaderAt, l Layout, alg Algorithm, workers int) (Digests, error) {
		n.Add(1)
		return HashFile(ctx, r, l, alg, workers)
	}
	return &n
}

func layoutOf(t *testing.T, f *os.File, cs int64) Layout {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return Layout{Size: fi.Size(), ChunkSize: cs}
}

func TestCacheHitMiss(t *testing.T) {
	c := NewCache(1<<20, 2)
	settled(c)
	calls := countHashes(c)
	f := oldFile(t, "a", make([]byte, 10000))
	l := layoutOf(t, f, 4096)
	ctx := context.Background()

	d1, cached, err := c.Digests(ctx, f, l, CRC32C)
	if err != nil || cached {
		t.Fatalf("first call: cached %v, err %v", cached, err)
	}
	d2, cached, err := c.Digests(ctx, f, l, CRC32C)
	if err != nil || !cached {
		t.Fatalf("second call: cached %v, err %v", cached, err)
	}
	if string(d1.Bytes()) != string(d2.Bytes()) || d2.Len() != 3 {
		t.Fatal("cached digests differ")
	}
	if calls.Load() != 1 {
		t.Fatalf("%d hashes, want 1", calls.Load())
	}
	// Another algorithm or chunk size is another key.
	if _, cached, _ := c.Digests(ctx, f, l, BLAKE3); cached {
		t.Error("blake3 served from crc32c entry")
	}
	if _, cached, _ := c.Digests(ctx, f, layoutOf(t, f, 8192), CRC32C); cached {
		t.Error("8 KiB chunks served from 4 KiB entry")
	}
	if calls.Load() != 3 {
		t.Errorf("%d hashes, want 3", calls.Load())
	}

	// Get and Put work on keys directly.
	fi, _ := f.Stat()
	k, err := KeyFor(fi, 4096, CRC32C)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := c.Get(k); !ok || string(got.Bytes()) != string(d1.Bytes()) {
		t.Error("Get missed an entry Digests stored")
	}
}

func TestCacheModifiedFile(t *testing.T) {
	c := NewCache(1<<20, 1)
	settled(c)
	calls := countHashes(c)
	f := oldFile(t, "a", make([]byte, 5000))
	l := layoutOf(t, f, 4096)
	ctx := context.Background()
	if _, _, err := c.Digests(ctx, f, l, CRC32C); err != nil {
		t.Fatal(err)
	}
	// Same size, new mtime: a new key, hashed again.
	newer := time.Now().Add(-30 * time.Minute)
	if err := os.Chtimes(f.Name(), newer, newer); err != nil {
		t.Fatal(err)
	}
	if _, cached, err := c.Digests(ctx, f, l, CRC32C); err != nil || cached {
		t.Fatalf("after touch: cached %v, err %v", cached, err)
	}
	if calls.Load() != 2 {
		t.Errorf("%d hashes, want 2", calls.Load())
	}
	// A layout that disagrees with the file's size is refused.
	if _, _, err := c.Digests(ctx, f, Layout{Size: 4999, ChunkSize: 4096}, CRC32C); !errors.Is(err, ErrChanged) {
		t.Errorf("wrong size: err = %v, want ErrChanged", err)
	}
}

// An edit in place whose mtime is put back (touch -r) leaves size and
// mtime as they were; the ctime moves, and the cache must miss.
func TestCacheEditMtimeRestored(t *testing.T) {
	c := NewCache(1<<20, 1)
	settled(c)
	calls := countHashes(c)
	f := oldFile(t, "a", make([]byte, 5000))
	l := layoutOf(t, f, 4096)
	ctx := context.Background()
	before, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	d1, _, err := c.Digests(ctx, f, l, BLAKE3)
	if err != nil {
		t.Fatal(err)
	}
	if _, cached, err := c.Digests(ctx, f, l, BLAKE3); err != nil || !cached {
		t.Fatalf("before the edit: cached %v, err %v", cached, err)
	}
	time.Sleep(20 * time.Millisecond) // past the file system's clock tick
	w, err := os.OpenFile(f.Name(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("edited"), 100); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := os.Chtimes(f.Name(), before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	after, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("size/mtime %d/%v, want %d/%v as before", after.Size(), after.ModTime(), before.Size(), before.ModTime())
	}
	d2, cached, err := c.Digests(ctx, f, l, BLAKE3)
	if err != nil || cached {
		t.Fatalf("after the edit: cached %v, err %v; want a miss", cached, err)
	}
	if string(d1.Bytes()) == string(d2.Bytes()) {
		t.Error("digests unchanged by the edit")
	}
	if calls.Load() != 2 {
		t.Errorf("%d hashes, want 2", calls.Load())
	}
	// The new version is cached in its turn.
	if d3, cached, err := c.Digests(ctx, f, l, BLAKE3); err != nil || !cached || string(d3.Bytes()) != string(d2.Bytes()) {
		t.Errorf("third call: cached %v, err %v", cached, err)
	}
}

// A file whose ctime is recent (chmod, touch -r, tar or rsync -t restoring
// an mtime) is racy too, however old its mtime.
func TestCacheRecentCtimeNotCached(t *testing.T) {
	c := NewCache(1<<20, 1)
	f := oldFile(t, "a", make([]byte, 5000)) // old mtime, ctime now
	l := layoutOf(t, f, 4096)
	c.now = justAfterChange(t, f)
	if _, _, err := c.Digests(context.Background(), f, l, CRC32C); err != nil {
		t.Fatal(err)
	}
	if c.Len() != 0 {
		t.Error("digests of a file changed just now (ctime) were cached")
	}
}

// justAfterChange is a clock stopped 1 ms after f's ctime: inside the racy
// window of any file system, however long a loaded machine takes to get
// from the write to the hash.
func justAfterChange(t *testing.T, f *os.File) func() time.Time {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	ct := fi.Sys().(*syscall.Stat_t).Ctim
	at := time.Unix(ct.Sec, ct.Nsec).Add(time.Millisecond)
	return func() time.Time { return at }
}

func TestCacheRacyNotCached(t *testing.T) {
	c := NewCache(1<<20, 1)
	calls := countHashes(c)
	path := filepath.Join(t.TempDir(), "fresh")
	if err := os.WriteFile(path, []byte("just written"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := layoutOf(t, f, 4096)
	c.now = justAfterChange(t, f)
	for range 2 {
		if _, cached, err := c.Digests(context.Background(), f, l, CRC32C); err != nil || cached {
			t.Fatalf("fresh file: cached %v, err %v", cached, err)
		}
	}
	if calls.Load() != 2 || c.Len() != 0 {
		t.Errorf("fresh file: %d hashes, %d entries; want 2 hashes, nothing cached", calls.Load(), c.Len())
	}
}

func TestCacheChangedWhileHashing(t *testing.T) {
	c := NewCache(1<<20, 1)
	f := oldFile(t, "a", make([]byte, 5000))
	l := layoutOf(t, f, 4096)
	c.hash = func(ctx context.Context, r io.ReaderAt, l Layout, alg Algorithm, workers int) (Digests, error) {
		d, err := HashFile(ctx, r, l, alg, workers)
		touched := time.Now().Add(-10 * time.Minute)
		os.Chtimes(f.Name(), touched, touched)
		return d, err
	}
	if _, _, err := c.Digests(context.Background(), f, l, CRC32C); !errors.Is(err, ErrChanged) {
		t.Fatalf("err = %v, want ErrChanged", err)
	}
	if c.Len() != 0 {
		t.Error("digests of a changing file were cached")
	}
}

func TestCacheEviction(t *testing.T) {
	d := func(n int) Digests {
		dd, err := MakeDigests(BLAKE3, n, make([]byte, n*32))
		if err != nil {
			t.Fatal(err)
		}
		return dd
	}
	// Room for three entries of 10 digests (3 × (320+128) = 1344).
	c := NewCache(1400, 1)
	k := func(i uint64) Key { return Key{Ino: i, ChunkSize: 4096, Alg: BLAKE3} }
	c.Put(k(1), d(10))
	c.Put(k(2), d(10))
	c.Put(k(3), d(10))
	if c.Len() != 3 {
		t.Fatalf("%d entries, want 3", c.Len())
	}
	c.Get(k(1)) // 1 is now the most recently used; 2 the least
	c.Put(k(4), d(10))
	if _, ok := c.Get(k(2)); ok {
		t.Error("least recently used entry survived")
	}
	for _, i := range []uint64{1, 3, 4} {
		if _, ok := c.Get(k(i)); !ok {
			t.Errorf("entry %d evicted", i)
		}
	}
	// Replacing an entry does not count it twice.
	c.Put(k(4), d(10))
	c.Put(k(4), d(10))
	if c.Len() != 3 || c.size != 3*(320+entryOverhead) {
		t.Errorf("after replacing: %d entries, %d bytes", c.Len(), c.size)
	}
	// An entry bigger than the cache is not kept, and evicts nothing.
	c.Put(k(5), d(100))
	if _, ok := c.Get(k(5)); ok || c.Len() != 3 {
		t.Errorf("oversized entry kept (%d entries)", c.Len())
	}
	// One large entry pushes out several small ones.
	c.Put(k(6), d(30))
	if c.Len() != 1 {
		t.Errorf("%d entries after a large put, want 1", c.Len())
	}
}

// gate is a hash function that blocks until released, counting calls.
type gate struct {
	calls   atomic.Int64
	started chan struct{}
	release chan struct{}
}

func newGate() *gate {
	return &gate{started: make(chan struct{}, 100), release: make(chan struct{})}
}

func (g *gate) hash(ctx context.Context, r io.ReaderAt, l Layout, alg Algorithm, workers int) (Digests, error) {
	g.calls.Add(1)
	g.started <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return Digests{}, ctx.Err()
	}
	return HashFile(ctx, r, l, alg, workers)
}

func TestCacheSingleflight(t *testing.T) {
	c := NewCache(1<<20, 1)
	g := newGate()
	c.hash = g.hash
	f := oldFile(t, "a", make([]byte, 9000))
	l := layoutOf(t, f, 4096)

	const callers = 8
	var wg sync.WaitGroup
	var hashed atomic.Int64
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, cached, err := c.Digests(context.Background(), f, l, CRC32C)
			if err == nil && d.Len() != 3 {
				err = errors.New("wrong digest count")
			}
			if !cached {
				hashed.Add(1)
			}
			errs <- err
		}()
	}
	<-g.started
	// Let the others pile up behind the leader before releasing it.
	waitFor(t, func() bool { return c.waiters() == callers-1 })
	close(g.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("%d concurrent callers hashed %d times, want 1", callers, n)
	}
	if hashed.Load() != 1 {
		t.Errorf("%d callers report hashing, want 1", hashed.Load())
	}
}

// waitFor polls cond until it holds, failing after five seconds. On
// failure it releases nothing: the test's goroutines stay blocked.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

// waiters counts the callers waiting on flights in progress.
func (c *Cache) waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, fl := range c.flights {
		n += fl.waiters
	}
	return n
}

func TestCacheLeaderCancelled(t *testing.T) {
	c := NewCache(1<<20, 1)
	g := newGate()
	c.hash = g.hash
	f := oldFile(t, "a", make([]byte, 9000))
	l := layoutOf(t, f, 4096)

	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	leaderErr := make(chan error, 1)
	go func() {
		_, _, err := c.Digests(leaderCtx, f, l, CRC32C)
		leaderErr <- err
	}()
	<-g.started

	waiterDone := make(chan error, 1)
	go func() {
		d, _, err := c.Digests(context.Background(), f, l, CRC32C)
		if err == nil && d.Len() != 3 {
			err = errors.New("wrong digest count")
		}
		waiterDone <- err
	}()
	waitFor(t, func() bool { return c.waiters() == 1 })
	cancelLeader()
	if err := <-leaderErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("leader: err = %v, want context.Canceled", err)
	}
	// The waiter must take over rather than fail with the leader's error.
	<-g.started
	close(g.release)
	if err := <-waiterDone; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if n := g.calls.Load(); n != 2 {
		t.Errorf("%d hashes, want 2", n)
	}
}

func TestCacheWaiterCancelled(t *testing.T) {
	c := NewCache(1<<20, 1)
	g := newGate()
	c.hash = g.hash
	f := oldFile(t, "a", make([]byte, 9000))
	l := layoutOf(t, f, 4096)
	leader := make(chan error, 1)
	go func() {
		_, _, err := c.Digests(context.Background(), f, l, CRC32C)
		leader <- err
	}()
	<-g.started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := c.Digests(ctx, f, l, CRC32C); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiter: err = %v, want DeadlineExceeded", err)
	}
	close(g.release)
	if err := <-leader; err != nil {
		t.Errorf("leader: %v", err)
	}
}

func TestKeyFor(t *testing.T) {
	f := oldFile(t, "a", []byte("hello"))
	fi, _ := f.Stat()
	k, err := KeyFor(fi, 4096, BLAKE3)
	if err != nil {
		t.Fatal(err)
	}
	ctime := fi.Sys().(*syscall.Stat_t).Ctim.Nano()
	if k.Ino == 0 || k.Size != 5 || k.MtimeNs != fi.ModTime().UnixNano() || k.CtimeNs != ctime || k.CtimeNs == 0 || k.ChunkSize != 4096 || k.Alg != BLAKE3 {
		t.Errorf("key %+v", k)
	}
	g := oldFile(t, "b", []byte("hello"))
	gi, _ := g.Stat()
	k2, _ := KeyFor(gi, 4096, BLAKE3)
	if k2 == k {
		t.Error("two files share a key")
	}
	if _, err := KeyFor(fakeInfo{fi}, 4096, BLAKE3); err == nil {
		t.Error("KeyFor accepted a FileInfo without stat data")
	}
}

type fakeInfo struct{ os.FileInfo }

func (fakeInfo) Sys() any { return nil }

func TestCacheDrop(t *testing.T) {
	c := NewCache(1<<20, 1)
	d, err := MakeDigests(CRC32C, 2, make([]byte, 8))
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := Key{Ino: 1, Alg: CRC32C}, Key{Ino: 2, Alg: CRC32C}
	c.Put(k1, d)
	c.Put(k2, d)
	c.Drop(k1)
	c.Drop(Key{Ino: 3}) // not there: nothing happens
	if _, ok := c.Get(k1); ok {
		t.Fatal("dropped digests still cached")
	}
	if _, ok := c.Get(k2); !ok || c.Len() != 1 {
		t.Fatalf("Drop took other digests too: %d left", c.Len())
	}
	if c.size != cost(d) {
		t.Fatalf("size %d after Drop, want %d", c.size, cost(d))
	}
}
