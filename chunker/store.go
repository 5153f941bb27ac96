package chunker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"lukechampine.com/blake3"

	"github.com/rdmacp/rdmacp/blockdev"
)

// Store keeps chunk digests across restarts of the process, so that a file
// served again unchanged is not hashed again. Its digests are only as good
// as its keys: a caller looks them up under the Key of the file as it is
// now (KeyOf), and any change of size, mtime, ctime, inode or device makes
// a new key.
type Store interface {
	// Load returns the digests of chunks [first, first+n) of version k, concatenated, and ok=false unless the store holds all n.
	Load(k Key, first, n int) (b []byte, ok bool)
	// Save records the digests b of chunks [first, first+len(b)/k.Alg.Size()) of version k; a Save for a new version of the same file (Dev, Ino) drops the old version.
	Save(k Key, first int, b []byte) error
	// Drop forgets every stored version of file (dev, ino): after a digest mismatch.
	Drop(dev, ino uint64)
}

// Persistable reports whether the digests of version k, hashed from
// hashStart on, may be saved: not if the file changed less than its file
// system's racy window before its hash began, as the cache's rule is (a
// file system stamps mtime and ctime from a coarse clock, so a write just
// after them may leave the key unchanged). A Store checks this against the
// time of the Save itself, which is later than the hash's start; a caller
// that knows when it began hashing should check it too.
func Persistable(k Key, hashStart time.Time) bool { return k.settled(hashStart) }

// DirStore is a Store in a directory the process owns: one file per file
// version and digest layout, named by a hash of the file's (dev, ino) and
// the algorithm and chunk size (never by path, which can be renamed or
// reused), holding
//
//	header (storeHeaderSize bytes): magic, format, the full Key, and a
//	    CRC32C of all that;
//	one slot per chunk, at headerSize + i × (digest size + 4): the
//	    digest, then a CRC32C of (header CRC, i, digest).
//
// A slot's check is its presence bit: the file is created sparse, and a
// slot of zeros, a torn write or a slot from another version (another
// header CRC) fails it and reads as absent, never as a wrong digest. So
// each window's digests are saved as they are hashed (a partial file is
// useful), and Load reads only the slots asked, with one pread.
//
// Nothing is fsynced: a crash loses digests (they read as absent), which
// costs a hash pass, not a wrong answer. The directory's total size is
// bounded: past the bound, the least recently used files are removed (use
// is the file's mtime, which Save and Load move), each file counted in
// whole 4 KiB blocks; files under 64 KiB are not stored at all (see
// StoreMinFile). Several processes may
// share a directory (a daemon and rdmacp hash): slots of one version are
// the same whoever writes them, and files are created whole under a
// temporary name and linked into place, never replaced under a writer.
// The span sums of CRC32C digests live in a DirStore of their own in the
// subdirectory "spans", under a bound of their own (spanstore.go).
type DirStore struct {
	dir string
	max int64
	min int64            // smaller files are not stored: StoreMinFile
	now func() time.Time // time.Now; replaceable by tests

	mu      sync.Mutex
	total   int64                // bytes of store files, as last counted plus growth since
	touched map[string]time.Time // when this process last moved a file's mtime

	spans *DirStore // span sums, in the subdirectory spansDir (spanstore.go); nil in that one
}

// storeMagic opens every store file; the last byte is the format.
var storeMagic = [8]byte{'r', 'd', 'm', 'a', 'c', 'p', 'D', 1}

const (
	storeHeaderSize = 72
	slotCheckSize   = 4
	// touchEvery throttles Load's mtime updates: LRU order to the minute
	// is enough, and a Load per window should not cost a syscall each.
	touchEvery = time.Minute
	// StoreMinFile: a DirStore does not store the digests of a file
	// smaller than this. Hashing a 64 KiB page-cached file took 50 µs here
	// (BenchmarkHashSmall), a lookup 20 µs (BenchmarkStoreLoad), and a
	// store file takes a 4 KiB block and an inode: for a tree of small
	// files the store would cost more disk than it saves CPU.
	StoreMinFile = 64 << 10
	// storeBlock is what a store file is counted as taking, at least
	// and in multiples: a file system block.
	storeBlock = 4096
	// DefaultStoreMax is the default bound on a DirStore's size: 256 MiB
	// holds the CRC32C digests (8 bytes a chunk with the check) of 128
	// TiB of files in 4 MiB chunks, or BLAKE3's (36) of 28 TiB.
	DefaultStoreMax = 256 << 20
)

// StoreDirError is a state directory that OpenDirStore refuses.
type StoreDirError struct {
	Dir    string
	Reason string
}

func (e *StoreDirError) Error() string {
	return fmt.Sprintf("state directory %s: %s", e.Dir, e.Reason)
}

// OpenDirStore opens (creating it 0700 if need be) the state directory dir
// for a Store of at most maxBytes (0 means DefaultStoreMax). It refuses a
// directory that is a symlink, is writable by group or others, or belongs
// to another user: whoever can write there can make the daemon serve
// digests of their choosing, and the initiator would reject good data.
func OpenDirStore(dir string, maxBytes int64) (*DirStore, error) {
	s, err := openDir(dir, maxBytes)
	if err != nil {
		return nil, err
	}
	if err := s.openSpans(); err != nil {
		return nil, err
	}
	return s, nil
}

// openDir is OpenDirStore without the span sums' subdirectory.
func openDir(dir string, maxBytes int64) (*DirStore, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultStoreMax
	}
	if dir == "" {
		return nil, &StoreDirError{Dir: dir, Reason: "no path given"}
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	if err := checkStoreDir(dir); err != nil {
		return nil, err
	}
	s := &DirStore{dir: dir, max: maxBytes, min: StoreMinFile, now: time.Now, touched: map[string]time.Time{}}
	total, _, err := s.scan()
	if err != nil {
		return nil, err
	}
	s.total = total
	return s, nil
}

func checkStoreDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return &StoreDirError{Dir: dir, Reason: "is a symlink; give the directory it points to"}
	case !fi.IsDir():
		return &StoreDirError{Dir: dir, Reason: "is not a directory"}
	case fi.Mode().Perm()&0o022 != 0:
		return &StoreDirError{Dir: dir, Reason: fmt.Sprintf("is writable by group or others (mode %04o); chmod 0700 it", fi.Mode().Perm())}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return &StoreDirError{Dir: dir, Reason: fmt.Sprintf("belongs to uid %d, not to this process (uid %d)", st.Uid, os.Geteuid())}
	}
	return nil
}

// Dir is the store's directory.
func (s *DirStore) Dir() string { return s.dir }

// fileID names the files of one (dev, ino): 16 hex digits of a hash.
func fileID(dev, ino uint64) string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], dev)
	binary.LittleEndian.PutUint64(b[8:], ino)
	sum := blake3.Sum256(b[:])
	return fmt.Sprintf("%x", sum[:8])
}

func (s *DirStore) name(k Key) string {
	return filepath.Join(s.dir, fmt.Sprintf("%s.%s.%d", fileID(k.Dev, k.Ino), k.Alg, k.ChunkSize))
}

// isStoreName reports whether base is a store file's name (not a
// temporary one, not a stranger's).
func isStoreName(base string) bool {
	id, rest, ok := strings.Cut(base, ".")
	if !ok || len(id) != 16 {
		return false
	}
	alg, cs, ok := strings.Cut(rest, ".")
	if !ok {
		return false
	}
	if _, err := ParseAlgorithm(alg); err != nil {
		return false
	}
	_, err := strconv.ParseInt(cs, 10, 64)
	return err == nil
}

func slotSize(alg Algorithm) int { return alg.Size() + slotCheckSize }

func storeFileSize(k Key) int64 {
	return storeHeaderSize + int64(Layout{Size: k.Size, ChunkSize: k.ChunkSize}.Chunks())*int64(slotSize(k.Alg))
}

// diskSize is what a store file of n bytes is counted as: whole blocks.
func diskSize(n int64) int64 { return (max(n, 1) + storeBlock - 1) / storeBlock * storeBlock }

func encodeHeader(k Key) []byte {
	h := make([]byte, storeHeaderSize)
	copy(h, storeMagic[:])
	h[8] = uint8(k.Alg)
	binary.LittleEndian.PutUint64(h[16:], k.Dev)
	binary.LittleEndian.PutUint64(h[24:], k.Ino)
	binary.LittleEndian.PutUint64(h[32:], uint64(k.Size))
	binary.LittleEndian.PutUint64(h[40:], uint64(k.MtimeNs))
	binary.LittleEndian.PutUint64(h[48:], uint64(k.CtimeNs))
	binary.LittleEndian.PutUint64(h[56:], uint64(k.ChunkSize))
	binary.LittleEndian.PutUint32(h[64:], crc32.Checksum(h[:64], castagnoli))
	return h
}

// decodeHeader returns the key in h, and ok=false for a header that is
// short, torn or of another format.
func decodeHeader(h []byte) (Key, bool) {
	if len(h) < storeHeaderSize || [8]byte(h[:8]) != storeMagic ||
		binary.LittleEndian.Uint32(h[64:]) != crc32.Checksum(h[:64], castagnoli) {
		return Key{}, false
	}
	return Key{
		Alg:       Algorithm(h[8]),
		Dev:       binary.LittleEndian.Uint64(h[16:]),
		Ino:       binary.LittleEndian.Uint64(h[24:]),
		Size:      int64(binary.LittleEndian.Uint64(h[32:])),
		MtimeNs:   int64(binary.LittleEndian.Uint64(h[40:])),
		CtimeNs:   int64(binary.LittleEndian.Uint64(h[48:])),
		ChunkSize: int64(binary.LittleEndian.Uint64(h[56:])),
	}, true
}

// slotCheck binds a digest to its version (through the header's CRC) and
// to its chunk. A check of 0 is never valid, so a hole reads as absent;
// the rare digest whose check is 0 is simply not stored.
func slotCheck(hdrCRC uint32, i int, d []byte) uint32 {
	var b [12]byte
	binary.LittleEndian.PutUint32(b[:4], hdrCRC)
	binary.LittleEndian.PutUint64(b[4:], uint64(i))
	return crc32.Update(crc32.Checksum(b[:], castagnoli), castagnoli, d)
}

// savedCount checks a Save's arguments and says how many digests b
// holds: 0 for an algorithm without digests.
func savedCount(k Key, first int, b []byte) (int, error) {
	size := k.Alg.Size()
	if size == 0 {
		if !k.Alg.Valid() {
			return 0, fmt.Errorf("chunker: unknown algorithm %d", uint8(k.Alg))
		}
		return 0, nil
	}
	if len(b)%size != 0 {
		return 0, fmt.Errorf("chunker: %d bytes is not a whole number of %s digests", len(b), k.Alg)
	}
	n := len(b) / size
	return n, checkRange(k, first, n)
}

// checkRange validates [first, first+n) against k's layout.
func checkRange(k Key, first, n int) error {
	if !k.Alg.Valid() {
		return fmt.Errorf("chunker: unknown algorithm %d", uint8(k.Alg))
	}
	l := Layout{Size: k.Size, ChunkSize: k.ChunkSize}
	if err := l.Validate(); err != nil {
		return err
	}
	if c := l.Chunks(); first < 0 || n < 0 || first > c || n > c-first {
		return fmt.Errorf("chunker: chunks [%d, %d+%d) out of range [0, %d)", first, first, n, c)
	}
	return nil
}

// Load implements Store.
func (s *DirStore) Load(k Key, first, n int) ([]byte, bool) {
	if checkRange(k, first, n) != nil {
		return nil, false
	}
	size := k.Alg.Size()
	if size == 0 || n == 0 {
		return []byte{}, true // nothing to hash, so nothing to store
	}
	p := s.name(k)
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	hdr := make([]byte, storeHeaderSize)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil, false
	}
	got, ok := decodeHeader(hdr)
	if !ok || got != k {
		// A torn header, or an older version of this (dev, ino): the file
		// changed or the inode now names another file. Either way these
		// digests will never be asked for again. A newer version stays:
		// this caller holds a stale key.
		if !ok || !newer(got, k) {
			s.remove(p)
		}
		return nil, false
	}
	ss, size := slotSize(k.Alg), k.Alg.Size()
	slots := make([]byte, n*ss)
	if _, err := f.ReadAt(slots, storeHeaderSize+int64(first)*int64(ss)); err != nil {
		return nil, false
	}
	hdrCRC := binary.LittleEndian.Uint32(hdr[64:])
	out := make([]byte, 0, n*size)
	for i := range n {
		slot := slots[i*ss : (i+1)*ss]
		d, check := slot[:size], binary.LittleEndian.Uint32(slot[size:])
		if check == 0 || check != slotCheck(hdrCRC, first+i, d) {
			return nil, false
		}
		out = append(out, d...)
	}
	s.touch(p)
	return out, true
}

// touch moves p's mtime, its LRU position, at most once a touchEvery.
func (s *DirStore) touch(p string) {
	now := s.now()
	s.mu.Lock()
	last, ok := s.touched[p]
	if ok && now.Sub(last) < touchEvery {
		s.mu.Unlock()
		return
	}
	s.touched[p] = now
	s.mu.Unlock()
	os.Chtimes(p, now, now)
}

// Save implements Store. Digests of a file that changed less than
// their racy window ago are not saved (and that is not an error).
func (s *DirStore) Save(k Key, first int, b []byte) error {
	n, err := savedCount(k, first, b)
	if err != nil {
		return err
	}
	if n == 0 || k.Size < s.min || !Persistable(k, s.now()) || diskSize(storeFileSize(k)) > s.max {
		return nil
	}
	f, hdrCRC, err := s.openVersion(k)
	if err != nil || f == nil {
		return err
	}
	defer f.Close()
	ss, size := slotSize(k.Alg), k.Alg.Size()
	slots := make([]byte, n*ss)
	for i := range n {
		slot, d := slots[i*ss:(i+1)*ss], b[i*size:(i+1)*size]
		copy(slot, d)
		binary.LittleEndian.PutUint32(slot[size:], slotCheck(hdrCRC, first+i, d))
	}
	if _, err := f.WriteAt(slots, storeHeaderSize+int64(first)*int64(ss)); err != nil {
		return err
	}
	return nil
}

// openVersion opens k's file for writing, creating it (and dropping the
// other versions of its file) if it holds another version or none.
func (s *DirStore) openVersion(k Key) (*os.File, uint32, error) {
	p := s.name(k)
	want := encodeHeader(k)
	hdrCRC := binary.LittleEndian.Uint32(want[64:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, err := os.OpenFile(p, os.O_RDWR|syscall.O_NOFOLLOW, 0); err == nil {
		hdr := make([]byte, storeHeaderSize)
		if _, err := f.ReadAt(hdr, 0); err == nil {
			if string(hdr) == string(want) {
				return f, hdrCRC, nil
			}
			if got, ok := decodeHeader(hdr); ok && newer(got, k) {
				f.Close()
				return nil, 0, nil // a stale caller: keep the newer version
			}
		}
		f.Close()
	}
	s.dropOthers(k)
	if err := s.create(p, want, storeFileSize(k)); err != nil {
		return nil, 0, err
	}
	s.total += diskSize(storeFileSize(k))
	s.touched[p] = s.now()
	if s.total > s.max {
		s.evictLocked(p)
	}
	f, err := os.OpenFile(p, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, err
	}
	return f, hdrCRC, nil
}

// create writes a new store file whole under a temporary name, then links
// it into place: another process's file, if it won the race, stays.
func (s *DirStore) create(p string, hdr []byte, size int64) error {
	tmp, err := os.CreateTemp(s.dir, ".new-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(hdr)
	if err == nil {
		err = tmp.Truncate(size) // sparse: every slot absent
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	os.Remove(p) // another version, or a torn file
	if err := os.Link(tmp.Name(), p); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// dropOthers removes the files of k's (dev, ino) that hold another
// version of it (any algorithm or chunk size), or no valid one.
func (s *DirStore) dropOthers(k Key) {
	s.forEachOf(k.Dev, k.Ino, func(p string) {
		got, ok := readHeader(p)
		if ok && (sameVersion(got, k) || newer(got, k)) {
			return // the same version with another algorithm or chunk size, or a later one
		}
		s.removeLocked(p)
	})
}

// sameVersion reports whether a and b are keys of the same contents of
// the same file, perhaps with another algorithm or chunk size.
func sameVersion(a, b Key) bool {
	return a.Dev == b.Dev && a.Ino == b.Ino && a.Size == b.Size && a.MtimeNs == b.MtimeNs && a.CtimeNs == b.CtimeNs
}

// newer reports whether version a of a file is later than b: changed
// after it. Only a caller with a stale key asks for an older version than
// the store holds, and it must not drop the newer one.
func newer(a, b Key) bool { return a.changedNs() > b.changedNs() }

func readHeader(p string) (Key, bool) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return Key{}, false
	}
	defer f.Close()
	hdr := make([]byte, storeHeaderSize)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return Key{}, false
	}
	return decodeHeader(hdr)
}

func (s *DirStore) forEachOf(dev, ino uint64, fn func(p string)) {
	ps, _ := filepath.Glob(filepath.Join(s.dir, fileID(dev, ino)+".*"))
	for _, p := range ps {
		if isStoreName(filepath.Base(p)) {
			fn(p)
		}
	}
}

// Drop implements Store.
func (s *DirStore) Drop(dev, ino uint64) {
	if s.spans != nil {
		s.spans.Drop(dev, ino)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forEachOf(dev, ino, s.removeLocked)
}

func (s *DirStore) remove(p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(p)
}

func (s *DirStore) removeLocked(p string) {
	if fi, err := os.Lstat(p); err == nil {
		if os.Remove(p) == nil {
			s.total -= diskSize(fi.Size())
		}
	}
	delete(s.touched, p)
}

type storeFile struct {
	path string
	size int64
	used time.Time
}

// scan counts the store's files (every process's) and their bytes, and
// removes temporary files left by a crash.
func (s *DirStore) scan() (int64, []storeFile, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, nil, err
	}
	var total int64
	var files []storeFile
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		p := filepath.Join(s.dir, e.Name())
		if strings.HasPrefix(e.Name(), ".new-") && s.now().Sub(fi.ModTime()) > time.Hour {
			os.Remove(p)
			continue
		}
		if !isStoreName(e.Name()) {
			continue
		}
		total += diskSize(fi.Size())
		files = append(files, storeFile{path: p, size: diskSize(fi.Size()), used: fi.ModTime()})
	}
	return total, files, nil
}

// evictLocked removes the least recently used files until the store is
// under 90% of its bound (so that it does not scan at every Save), keeping
// keep, the file just created.
func (s *DirStore) evictLocked(keep string) {
	total, files, err := s.scan()
	if err != nil {
		return
	}
	s.total = total
	sort.Slice(files, func(i, j int) bool { return files[i].used.Before(files[j].used) })
	for _, f := range files {
		if s.total <= s.max/10*9 {
			break
		}
		if f.path != keep {
			s.removeLocked(f.path)
		}
	}
}

// deviceKey is a block device's key: its size is l's (the caller's
// BLKGETSIZE64), its mtime the write counters the kernel keeps for it
// (blockdev.Generation), as the target's own change checks use. The
// counters restart at boot, but the device node's ctime changes then too
// (devtmpfs creates the node at boot), so a key never outlives a boot.
func deviceKey(fi os.FileInfo, l Layout, alg Algorithm) (Key, error) {
	k, err := KeyFor(fi, l.ChunkSize, alg)
	if err != nil {
		return Key{}, err
	}
	k.Size = l.Size
	k.MtimeNs = blockdev.Generation(fi)
	return k, nil
}

// persistWindow is the bytes Persist hashes between Saves: twice the
// target's default window, so Saves are few and the digests held at once
// few (16 of 4 MiB chunks). A variable so tests can shrink it.
var persistWindow int64 = 64 << 20

// ErrTooRecent reports a file whose digests may not be persisted yet: it
// changed less than its racy window ago, or its times are in the future.
var ErrTooRecent = errors.New("chunker: file changed too recently for its digests to be stored")

// Persist makes s hold every chunk digest of f laid out as l: the windows
// of chunks it lacks are hashed with HashRange, as the target hashes a
// window, and saved as each is hashed.
// These are the digests the target computes (the same KeyOf, the same
// Layout), so a daemon sharing s serves f without hashing it. For a block
// device, l.Size is its BLKGETSIZE64.
//
// It returns the bytes it read to hash (0 when s held every digest).
// progress, if not nil, is called after each window with the bytes of f
// done so far, hashed or found stored. A file changed within the last
// racy window is waited for, up to that window (then ErrTooRecent). A file
// that changes while it is hashed is an error wrapping ErrChanged, and
// what was saved of it is dropped.
func Persist(ctx context.Context, f *os.File, l Layout, alg Algorithm, s Store, workers int, progress func(done int64)) (int64, error) {
	if err := l.Validate(); err != nil {
		return 0, err
	}
	k, err := statKey(f, l, alg)
	if err != nil {
		return 0, err
	}
	if err := waitPersistable(ctx, k); err != nil {
		return 0, fmt.Errorf("%s: %w", f.Name(), err)
	}
	per := max(1, int(persistWindow/l.ChunkSize))
	var hashed, done int64
	n := l.Chunks()
	for first := 0; first < n; first += per {
		count := min(per, n-first)
		off := int64(first) * l.ChunkSize
		length := min(int64(count)*l.ChunkSize, l.Size-off)
		if _, ok := s.Load(k, first, count); !ok {
			// HashRangeSpans is what the target hashes a window with; holes
			// are read here (zeros, no disk I/O), their digests the same.
			ss, spans := persistSpans(s, alg, length)
			d, err := HashRangeSpans(ctx, f, l, first, first+count, alg, workers, nil, spans)
			if err != nil {
				return hashed, fmt.Errorf("hashing %s: %w", f.Name(), err)
			}
			hashed += length
			if err := s.Save(k, first, d); err != nil {
				return hashed, fmt.Errorf("storing the digests of %s: %w", f.Name(), err)
			}
			if spans != nil {
				if err := ss.SaveSpans(k, Spans(off), spans); err != nil {
					return hashed, fmt.Errorf("storing the span sums of %s: %w", f.Name(), err)
				}
			}
		}
		done += length
		if progress != nil {
			progress(done)
		}
	}
	after, err := statKey(f, l, alg)
	if err != nil {
		return hashed, err
	}
	if after != k {
		s.Drop(k.Dev, k.Ino)
		return hashed, fmt.Errorf("chunker: hashing %s: %w", f.Name(), ErrChanged)
	}
	return hashed, nil
}

// spanStore is a Store that keeps span sums too (DirStore).
type spanStore interface {
	SaveSpans(k Key, first int, sums []uint32) error
}

// persistSpans is s as a spanStore and room for the span sums of length
// bytes, if s keeps them and alg has them (CRC32C); else nil, nil.
func persistSpans(s Store, alg Algorithm, length int64) (spanStore, []uint32) {
	ss, ok := s.(spanStore)
	if !ok || alg != CRC32C {
		return nil, nil
	}
	return ss, make([]uint32, Spans(length))
}

func statKey(f *os.File, l Layout, alg Algorithm) (Key, error) {
	fi, err := f.Stat()
	if err != nil {
		return Key{}, fmt.Errorf("chunker: %w", err)
	}
	return KeyOf(fi, l, alg)
}

// waitPersistable waits, up to k's racy window, for version k to be old enough
// to persist: a file just copied into place gets its digests stored
// rather than refused.
func waitPersistable(ctx context.Context, k Key) error {
	now := time.Now()
	if Persistable(k, now) {
		return nil
	}
	wait := time.Unix(0, k.changedNs()).Add(k.racy() + 10*time.Millisecond).Sub(now)
	if wait > k.racy()+100*time.Millisecond {
		return ErrTooRecent // changed in the future, by its times
	}
	return sleep(ctx, wait)
}

// Settle waits SettleDelay(k, now), if waiting is worth it, or until ctx
// ends: the target calls it before hashing a window.
func Settle(ctx context.Context, k Key) error {
	if d, ok := SettleDelay(k, time.Now()); ok && d > 0 {
		return sleep(ctx, d)
	}
	return nil
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// SettleDelay is how long a hash of version k should wait, from now, so
// that what it hashes may be cached and persisted: the rest of k's racy
// window on a file system whose stamps keep nanoseconds (at most 50 ms).
// ok is false where waiting is not worth it: a file system that keeps
// whole seconds (up to 2 s more on every fresh file) or times in the
// future. A daemon that hashed a file served the moment it was written
// without this wait saved none of what it hashed in those first 50 ms,
// and the whole first window with them (#27).
func SettleDelay(k Key, now time.Time) (d time.Duration, ok bool) {
	if Persistable(k, now) {
		return 0, true
	}
	if k.racy() != fineRacyWindow {
		return 0, false
	}
	d = time.Unix(0, k.changedNs()).Add(k.racy() + time.Millisecond).Sub(now)
	return d, d <= k.racy()+10*time.Millisecond
}
