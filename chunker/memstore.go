package chunker

import (
	"container/list"
	"sync"
	"time"
)

// DefaultMemStoreMax is the default bound on a MemStore: 64 MiB holds the
// CRC32C digests of about 60 TiB of files in 4 MiB chunks, or BLAKE3's of
// about 8 TiB, as much as the in-memory Cache beside it.
const DefaultMemStoreMax = 64 << 20

// MemStore is a Store in memory, for a daemon that does not persist
// digests: it keeps an unchanged file served again from being hashed
// again for as long as the process lives. Its semantics are DirStore's
// (per-chunk presence, so a partly hashed file is kept; a new version of
// a file drops the old; the racy window is respected), and its memory is
// bounded: past the bound, the least recently used file versions go.
//
// Unlike a DirStore it stores small files too (no StoreMinFile): that
// bound is there because a store file costs a 4 KiB block and an inode
// and a lookup costs about what hashing 64 KiB does; here an entry costs
// memEntryOverhead bytes and a lookup a map access, well under the 50 µs
// that hashing 64 KiB takes (BenchmarkHashSmall).
type MemStore struct {
	max int64
	now func() time.Time // time.Now; replaceable by tests

	mu      sync.Mutex
	size    int64                     // bytes counted by memCost, of every entry
	lru     *list.List                // of *memEntry, most recently used first
	entries map[Key]*list.Element     // every entry, by version and layout
	files   map[[2]uint64][]*memEntry // the entries of each (dev, ino)
}

// memEntry is the digests of one version of a file in one layout.
type memEntry struct {
	key     Key
	digests []byte   // chunk i's at i × alg.Size(), valid where present says
	present []uint64 // a bit per chunk
}

// memEntryOverhead is what an entry costs beyond its digests and bitmap
// (the key, the list element, the map slots), so that a store of many
// small files is bounded too.
const memEntryOverhead = 256

// NewMemStore returns a MemStore holding at most maxBytes (0 means
// DefaultMemStoreMax).
func NewMemStore(maxBytes int64) *MemStore {
	if maxBytes <= 0 {
		maxBytes = DefaultMemStoreMax
	}
	return &MemStore{max: maxBytes, now: time.Now, lru: list.New(),
		entries: map[Key]*list.Element{}, files: map[[2]uint64][]*memEntry{}}
}

// memCost is what an entry for k allocates: computed from k alone, so an
// entry too large for the store is refused before anything is allocated.
func memCost(k Key) int64 {
	n := int64(Layout{Size: k.Size, ChunkSize: k.ChunkSize}.Chunks())
	return n*int64(k.Alg.Size()) + (n+63)/64*8 + memEntryOverhead
}

// Size is the bytes the store holds, as memCost counts them.
func (s *MemStore) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Load implements Store.
func (s *MemStore) Load(k Key, first, n int) ([]byte, bool) {
	if checkRange(k, first, n) != nil {
		return nil, false
	}
	size := k.Alg.Size()
	if size == 0 || n == 0 {
		return []byte{}, true // nothing to hash, so nothing to store
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.entries[k]
	if !ok {
		// An older version will never be asked for again: the file
		// changed, or its inode now names another file.
		s.dropOlderLocked(k)
		return nil, false
	}
	e := el.Value.(*memEntry)
	for i := first; i < first+n; i++ {
		if e.present[i/64]&(1<<(i%64)) == 0 {
			return nil, false
		}
	}
	s.lru.MoveToFront(el)
	// A copy: the caller may patch it (winDigests.suspect does).
	return append([]byte(nil), e.digests[first*size:(first+n)*size]...), true
}

// Save implements Store. Digests of a file that changed less than
// its racy window ago are not saved, nor those of a version larger than the
// whole store (neither is an error).
func (s *MemStore) Save(k Key, first int, b []byte) error {
	n, err := savedCount(k, first, b)
	if err != nil {
		return err
	}
	if n == 0 || !Persistable(k, s.now()) || memCost(k) > s.max {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entryLocked(k)
	if e == nil {
		return nil // a stale caller: a newer version is stored
	}
	copy(e.digests[first*k.Alg.Size():], b)
	for i := first; i < first+n; i++ {
		e.present[i/64] |= 1 << (i % 64)
	}
	return nil
}

// entryLocked returns k's entry, most recently used, creating it (and
// dropping the other versions of its file, and evicting past the bound)
// if need be; nil if the store holds a newer version of the file.
func (s *MemStore) entryLocked(k Key) *memEntry {
	if el, ok := s.entries[k]; ok {
		s.lru.MoveToFront(el)
		return el.Value.(*memEntry)
	}
	id := [2]uint64{k.Dev, k.Ino}
	for _, o := range s.files[id] {
		if newer(o.key, k) {
			return nil
		}
	}
	s.dropOlderLocked(k)
	chunks := Layout{Size: k.Size, ChunkSize: k.ChunkSize}.Chunks()
	e := &memEntry{key: k, digests: make([]byte, chunks*k.Alg.Size()), present: make([]uint64, (chunks+63)/64)}
	el := s.lru.PushFront(e)
	s.entries[k] = el
	s.files[id] = append(s.files[id], e)
	s.size += memCost(k)
	// Save refused any entry over the bound, so evicting the others
	// always brings the store under it before reaching this one.
	for s.size > s.max && s.lru.Back() != el {
		s.removeLocked(s.lru.Back().Value.(*memEntry))
	}
	return e
}

// dropOlderLocked removes the entries of k's file that hold another,
// older version of it; the same version in another layout stays, as does
// a newer one (k is a stale caller's).
func (s *MemStore) dropOlderLocked(k Key) {
	for _, o := range append([]*memEntry(nil), s.files[[2]uint64{k.Dev, k.Ino}]...) {
		if !sameVersion(o.key, k) && !newer(o.key, k) {
			s.removeLocked(o)
		}
	}
}

// Drop implements Store.
func (s *MemStore) Drop(dev, ino uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range append([]*memEntry(nil), s.files[[2]uint64{dev, ino}]...) {
		s.removeLocked(e)
	}
}

func (s *MemStore) removeLocked(e *memEntry) {
	el, ok := s.entries[e.key]
	if !ok {
		return
	}
	s.lru.Remove(el)
	delete(s.entries, e.key)
	s.size -= memCost(e.key)
	id := [2]uint64{e.key.Dev, e.key.Ino}
	es := s.files[id]
	for i, o := range es {
		if o == e {
			es = append(es[:i], es[i+1:]...)
			break
		}
	}
	if len(es) == 0 {
		delete(s.files, id)
	} else {
		s.files[id] = es
	}
}

var _ Store = (*MemStore)(nil)
