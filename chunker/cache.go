package chunker

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/blockdev"
)

// Key identifies one version of a file's chunk digests. A file whose size,
// modification time or change time changes gets a new key; so does one
// replaced by another file (a new inode). The change time is what catches
// an edit whose mtime was put back (touch -r, os.Chtimes): no one but the
// kernel can set it.
type Key struct {
	Dev, Ino  uint64
	Size      int64
	MtimeNs   int64
	CtimeNs   int64
	ChunkSize int64
	Alg       Algorithm
}

// changedNs is when the version k names last changed, as far as the file
// system's clock says: the later of its mtime and ctime.
func (k Key) changedNs() int64 { return max(k.MtimeNs, k.CtimeNs) }

// entryOverhead is what an entry costs on top of its digests, so that a
// cache of None digests (0 bytes each) is bounded too.
const entryOverhead = 128

// racyWindow: a file modified less than this long before it is hashed may
// still change without its mtime or ctime moving, because file systems
// stamp them from a coarse clock. Such digests are returned but not cached
// or persisted. It is the bound for file systems whose stamps keep whole
// seconds (FAT keeps two); fineRacyWindow is the one for those that keep
// nanoseconds (ext4, xfs, btrfs, tmpfs), which stamp from the kernel's
// coarse clock: one tick, 10 ms at HZ=100, so 50 ms leaves a margin of 5.
const (
	racyWindow     = 2 * time.Second
	fineRacyWindow = 50 * time.Millisecond
)

// racy is the racy window of version k's file system. A ctime with a
// nanosecond part shows a file system that keeps them (ctime, unlike
// mtime, is only ever set by the kernel's clock); on one that does, a
// ctime on a whole second happens once in 10^9 and costs only the wider
// window. With a 2 s window for every file, a 1 GiB file copied in and
// served at once had its first 700 MiB hashed again after a restart: those
// windows were hashed within 2 s of its ctime and never saved.
func (k Key) racy() time.Duration {
	if k.CtimeNs%int64(time.Second) != 0 {
		return fineRacyWindow
	}
	return racyWindow
}

// settled reports whether version k had stopped changing, by its file
// system's clock, when something that began at t (a hash) began.
func (k Key) settled(t time.Time) bool {
	return time.Unix(0, k.changedNs()).Before(t.Add(-k.racy()))
}

// Cache keeps the chunk digests of recently hashed files, evicting the
// least recently used when their total size passes a bound. It is safe for
// concurrent use. Digests it returns are shared and must not be modified.
type Cache struct {
	max     int64
	workers int

	// hash is HashFile and now is time.Now, replaceable by tests.
	hash func(ctx context.Context, r io.ReaderAt, l Layout, alg Algorithm, workers int) (Digests, error)
	now  func() time.Time

	mu      sync.Mutex
	size    int64
	lru     *list.List // of *cacheEntry, most recently used first
	entries map[Key]*list.Element
	flights map[Key]*flight
}

type cacheEntry struct {
	key Key
	d   Digests
}

// flight is one hash in progress that other callers can wait for.
type flight struct {
	done    chan struct{}
	waiters int // callers waiting on done, for tests
	d       Digests
	err     error
}

// NewCache returns a cache holding up to maxBytes of digests, hashing with
// up to workers goroutines per file (0 means GOMAXPROCS).
func NewCache(maxBytes int64, workers int) *Cache {
	return &Cache{
		max:     maxBytes,
		workers: workers,
		hash:    HashFile,
		now:     time.Now,
		lru:     list.New(),
		entries: make(map[Key]*list.Element),
		flights: make(map[Key]*flight),
	}
}

// Workers is how many goroutines hash one file.
func (c *Cache) Workers() int { return c.workers }

func cost(d Digests) int64 { return int64(len(d.Bytes())) + entryOverhead }

// Get returns the digests cached under k, if any.
func (c *Cache) Get(k Key) (Digests, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.getLocked(k)
}

func (c *Cache) getLocked(k Key) (Digests, bool) {
	e, ok := c.entries[k]
	if !ok {
		return Digests{}, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*cacheEntry).d, true
}

// Put caches d under k, evicting older entries as needed. Digests larger
// than the whole cache are not kept.
func (c *Cache) Put(k Key, d Digests) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(k, d)
}

func (c *Cache) putLocked(k Key, d Digests) {
	if e, ok := c.entries[k]; ok {
		c.size -= cost(e.Value.(*cacheEntry).d)
		c.lru.Remove(e)
		delete(c.entries, k)
	}
	if cost(d) > c.max {
		return
	}
	c.entries[k] = c.lru.PushFront(&cacheEntry{key: k, d: d})
	c.size += cost(d)
	for c.size > c.max {
		e := c.lru.Back()
		old := e.Value.(*cacheEntry)
		c.lru.Remove(e)
		delete(c.entries, old.key)
		c.size -= cost(old.d)
	}
}

// Drop forgets the digests cached under k (a digest of them was found
// wrong).
func (c *Cache) Drop(k Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[k]; ok {
		c.size -= cost(e.Value.(*cacheEntry).d)
		c.lru.Remove(e)
		delete(c.entries, k)
	}
}

// Len is the number of cached entries.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Digests returns the chunk digests of f laid out as l, from the cache or
// by hashing it. Concurrent calls for the same file version hash it once
// and share the result. cached reports that this call did not hash: the
// digests came from the cache or from another caller's hash.
//
// l.Size must be f's current size. If f changes while it is hashed, the
// error wraps ErrChanged and nothing is cached. Files that are not regular
// files, such as block devices, are hashed every time: their size and
// mtime say nothing about their contents.
func (c *Cache) Digests(ctx context.Context, f *os.File, l Layout, alg Algorithm) (d Digests, cached bool, err error) {
	fi, err := f.Stat()
	if err != nil {
		return Digests{}, false, fmt.Errorf("chunker: %w", err)
	}
	if !fi.Mode().IsRegular() {
		d, err := c.hash(ctx, f, l, alg, c.workers)
		if err != nil {
			return Digests{}, false, fmt.Errorf("hashing %s: %w", f.Name(), err)
		}
		return d, false, nil
	}
	k, err := KeyOf(fi, l, alg)
	if err != nil {
		return Digests{}, false, err
	}
	for {
		c.mu.Lock()
		if d, ok := c.getLocked(k); ok {
			c.mu.Unlock()
			return d, true, nil
		}
		fl, waiting := c.flights[k]
		if waiting {
			fl.waiters++
		} else {
			fl = &flight{done: make(chan struct{})}
			c.flights[k] = fl
		}
		c.mu.Unlock()

		if !waiting {
			d, err := c.lead(ctx, f, l, alg, k, fl)
			return d, false, err
		}
		select {
		case <-fl.done:
		case <-ctx.Done():
			return Digests{}, false, context.Cause(ctx)
		}
		if fl.err == nil {
			return fl.d, true, nil
		}
		// The leader's own cancellation is no reason to fail this caller:
		// try again, perhaps leading the next flight.
		if !errors.Is(fl.err, context.Canceled) && !errors.Is(fl.err, context.DeadlineExceeded) {
			return Digests{}, false, fl.err
		}
	}
}

// lead hashes f for flight fl and publishes the result.
func (c *Cache) lead(ctx context.Context, f *os.File, l Layout, alg Algorithm, k Key, fl *flight) (d Digests, err error) {
	start := c.now()
	defer func() {
		fl.d, fl.err = d, err
		c.mu.Lock()
		delete(c.flights, k)
		if err == nil && k.settled(start) {
			c.putLocked(k, d)
		}
		c.mu.Unlock()
		close(fl.done)
	}()
	d, err = c.hash(ctx, f, l, alg, c.workers)
	if err != nil {
		return Digests{}, fmt.Errorf("hashing %s: %w", f.Name(), err)
	}
	fi, err := f.Stat()
	if err != nil {
		return Digests{}, fmt.Errorf("chunker: %w", err)
	}
	after, err := KeyOf(fi, l, alg)
	if err != nil {
		return Digests{}, err
	}
	if after != k {
		return Digests{}, fmt.Errorf("chunker: hashing %s: %w", f.Name(), ErrChanged)
	}
	return d, nil
}

// KeyOf is the key of the digests of the file fi describes, laid out as l.
// For a block device, whose stat says nothing of its contents, see
// deviceKey.
func KeyOf(fi os.FileInfo, l Layout, alg Algorithm) (Key, error) {
	if blockdev.Is(fi) {
		return deviceKey(fi, l, alg)
	}
	if fi.Size() != l.Size {
		return Key{}, fmt.Errorf("chunker: %s is %d bytes, layout says %d: %w", fi.Name(), fi.Size(), l.Size, ErrChanged)
	}
	return KeyFor(fi, l.ChunkSize, alg)
}
