package local

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Direct landing. A verified chunk sits in a staging slot of anonymous,
// page-aligned memory, and chunks are multiples of 4 KiB at multiples of
// their size, so every chunk but a short last one can be written with
// O_DIRECT: no copy into the page cache, no page allocation, and next to
// nothing left for the final fsync. Buffered pwrite into the page cache
// was most of the initiator's CPU in a copy.
//
// The file keeps its ordinary descriptor for everything else: the short
// tail, the fsync, chmod, and any chunk that cannot go direct. A second
// descriptor, opened with O_DIRECT on the same inode, takes the aligned
// chunks. Mixing the two is safe here because their ranges never share a
// page (chunks are page multiples, so the tail starts on a page), Linux
// writes back and drops cached pages over a range before a direct write
// to it (so a buffered read afterwards, as a resumed --partial copy's
// check or -c makes, sees what was written), and fsync is per
// inode: it covers what either descriptor wrote, including the conversion
// of fallocated extents the direct writes filled.
//
// O_DIRECT is not tried where it cannot help or is known not to work: on
// tmpfs and ramfs (the page cache is the file; recent kernels accept
// O_DIRECT there and do buffered I/O anyway) and where statx says the file
// system does no direct I/O. Where it is refused anyway (EINVAL at open,
// or at a write: some FUSE and network file systems, odd alignment
// rules), the landing falls back to buffered writes for good; a write
// that was refused wrote nothing, and is redone through the buffered
// descriptor, so nothing is lost or written twice.

// DirectFile is the O_DIRECT descriptor: an *os.File, or a fake in tests.
type DirectFile interface {
	WriteAt(p []byte, off int64) (int, error)
	Close() error
}

// OpenDirect opens f's inode again with O_DIRECT, for writing. It goes
// through /proc/self/fd so that it opens the very file f is, whatever
// has become of its name (tree copies open theirs through an os.Root).
// Tests replace it.
var OpenDirect = func(f *os.File) (DirectFile, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open O_DIRECT", Path: f.Name(), Err: err}
	}
	var a, b unix.Stat_t
	if err := unix.Fstat(fd, &a); err != nil || unix.Fstat(int(f.Fd()), &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		unix.Close(fd)
		return nil, fmt.Errorf("open O_DIRECT: %s: reopened a different file", f.Name())
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// pageSize is the least alignment direct writes get: a multiple of every
// logical block size in common use, and what keeps a direct write and a
// buffered one from sharing a page.
var pageSize = int64(os.Getpagesize())

// Sink is where a fetch's verified chunks go.
type Sink struct {
	File   *os.File   // the file, buffered
	Direct DirectFile // O_DIRECT on the same file; nil if not used
	align  int64      // offset, length and memory alignment for d
	off    atomic.Bool
	bufMu  sync.Mutex // one buffered write at a time (buffered)
	log    *slog.Logger
	direct atomic.Int64 // bytes written through d
	Why    string       // why d is nil, for the log

	// What zeros become (sparse.go): set by landing.open.
	Kind   DestKind
	sparse bool     // -S: zero blocks of data become holes too
	zero   ZeroMode // on a device
	block  int64    // -S's unit
}

// NewSink lands in f: with O_DIRECT where want and the file system allow
// it, else buffered.
func NewSink(f *os.File, want bool, log *slog.Logger) *Sink {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sink{File: f, log: log}
	if !want {
		s.Why = "turned off"
		return s
	}
	s.align, s.Why = DirectAlign(f)
	if s.Why != "" {
		log.Debug("landing with buffered writes", "file", f.Name(), "why", s.Why)
		return s
	}
	d, err := OpenDirect(f)
	if err != nil {
		s.Why = err.Error()
		log.Debug("landing with buffered writes: O_DIRECT refused", "file", f.Name(), "err", err)
		return s
	}
	s.Direct = d
	log.Debug("landing with O_DIRECT", "file", f.Name(), "align", s.align)
	return s
}

// DirectAlign is the alignment direct writes to f need (at least a page),
// or why they are not worth trying.
func DirectAlign(f *os.File) (int64, string) {
	fd := int(f.Fd())
	var st0 unix.Stat_t
	if err := unix.Fstat(fd, &st0); err != nil {
		return 0, err.Error()
	}
	// (A block device's node is on devtmpfs: what counts is the device.)
	var sf unix.Statfs_t
	if st0.Mode&unix.S_IFMT == unix.S_IFREG && unix.Fstatfs(fd, &sf) == nil && (sf.Type == unix.TMPFS_MAGIC || sf.Type == unix.RAMFS_MAGIC) {
		return 0, "file system is in memory"
	}
	align := pageSize
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err == nil && st.Mask&unix.STATX_DIOALIGN != 0 {
		if st.Dio_offset_align == 0 || st.Dio_mem_align == 0 {
			return 0, "file system does no direct I/O"
		}
		align = max(align, int64(st.Dio_offset_align), int64(st.Dio_mem_align))
	}
	// Without STATX_DIOALIGN (older kernels, some file systems) a page is
	// tried; a write refused for its alignment turns direct I/O off.
	return align, ""
}

// Name is the file's name.
func (s *Sink) Name() string { return s.File.Name() }

// WriteAt writes p at off: with -S, its zero blocks as holes
// (writeSparse); the rest directly when it can, else buffered.
func (s *Sink) WriteAt(p []byte, off int64) (int, error) {
	if s.SparseOn() && s.block > 0 {
		return s.writeSparse(p, off)
	}
	return s.write(p, off)
}

// write writes p at off: directly when it can, else buffered.
func (s *Sink) write(p []byte, off int64) (int, error) {
	if s.Direct == nil || s.off.Load() || !s.aligned(p, off) {
		return s.buffered(p, off)
	}
	n, err := s.Direct.WriteAt(p, off)
	s.direct.Add(int64(n))
	if err == nil || !refused(err) {
		return n, err
	}
	// Refused: nothing of this call was written past n. Finish buffered,
	// and stay buffered.
	if s.off.CompareAndSwap(false, true) {
		s.log.Debug("O_DIRECT write refused; landing the rest with buffered writes", "file", s.File.Name(), "err", err)
	}
	m, err := s.buffered(p[n:], off+int64(n))
	return n + m, err
}

// buffered writes p at off through the page cache. The kernel lets one
// buffered write into a regular file run at a time (tmpfs, ext4 and xfs
// take the inode's lock for it), and a writer waiting there spins while
// the one holding it runs: in a cp into /dev/shm, four verifiers, one
// copying, three spinning (rwsem_spin_on_owner, 1.6-17% of the receiving
// side's profile in single runs of rdmacp and of the Go TCP copier) on a
// 2-core machine where the receive needs that core. Waiting here sleeps
// instead. A block device's buffered writes take no such lock, so they
// go on in parallel.
func (s *Sink) buffered(p []byte, off int64) (int, error) {
	if s.Kind != destDevice {
		s.bufMu.Lock()
		defer s.bufMu.Unlock()
	}
	return pwrite(s.File, p, off)
}

// pwrite is a buffered write; tests replace it.
var pwrite = (*os.File).WriteAt

func (s *Sink) aligned(p []byte, off int64) bool {
	a := s.align
	return len(p) > 0 && int64(len(p))%a == 0 && off%a == 0 && int64(uintptr(unsafe.Pointer(unsafe.SliceData(p))))%a == 0
}

// refused reports whether err is a file system saying no to direct I/O,
// as opposed to an I/O error or a full disk.
func refused(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP)
}

// DirectOn reports whether writes are going direct (so far).
func (s *Sink) DirectOn() bool { return s.Direct != nil && !s.off.Load() }

// DirectBytes is how much went through O_DIRECT.
func (s *Sink) DirectBytes() int64 { return s.direct.Load() }

// Close closes the O_DIRECT descriptor, once every write is done; the
// file itself stays open for its owner to sync and close.
func (s *Sink) Close() error {
	if s.Direct == nil {
		return nil
	}
	err := s.Direct.Close()
	s.Direct = nil
	return err
}
