package initiator

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/rdmacp/rdmacp/initiator/local"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/verbs"
)

// Mapped landing. A regular-file destination in a tmpfs that uses huge
// pages (not O_DIRECT, not -S) is mapped MAP_SHARED, a bounded sliding
// region at a time, and the region is registered as the memory region the
// chunk's READs target: the transport's receive copy (iwarp-soft: socket
// → memory) puts the bytes straight into the file's pages, and nothing
// copies them again. The fetch only hashes the landed bytes. Staging
// plus pwrite copies every byte twice on the initiator (socket → staging
// → page cache).
//
// Chosen by measurement (docs/performance.md, 2-core VM, 1 GiB into
// tmpfs): with 4 KiB pages, a page mapped into the process costs a fault
// and a clear_page where pwrite's copy needed neither, and the mapped
// landing took 10-20% more initiator CPU per GB than staging in three
// interleaved runs; in a tmpfs mounted huge=always one fault maps 2 MiB,
// and it took about 5-10% less. On disk file systems O_DIRECT from
// staging has no copy either and costs less still (0.6 s/GB). So a
// mapped landing is used in tmpfs with huge pages (local.HugeTmpfs), staging
// elsewhere.
//
// What stays as it was: the temporary file, its fsync and rename (fsync
// writes back pages dirtied through a mapping like any others); holes
// (a hole chunk is never READ, so its pages are never touched); --partial
// (only verified chunks are journalled; a chunk that failed its digest has
// its bytes in the file, but is not marked, and is READ again over the
// same pages before its region can go).
//
// A device that DMAs into pinned pages (ibverbs: verbs.Caps.CPUPlaces
// false) gets a mapped landing only in memory without dirty tracking
// (tmpfs, ramfs): a disk file system's page cache pinned long-term for a
// device to write into is unsafe (writeback can't see the writes; Linux
// 6.5 and later refuse such pins), so there it lands through staging and
// O_DIRECT. Whether rxe or mlx5 take a tmpfs mapping is untested here;
// where mapping or registering fails (that, a file opened without write
// access, a file system without shared writable mappings), the fetch
// lands through staging too. Either way the debug log says which and
// why; the choice is made once per fetch, before any READ.

// maxLandRegions is how many regions a fetch keeps mapped at once: the
// one chunks are being started in, the one before (chunks still in
// flight or being read again), and one spare for a chunk stuck in an
// older one. A fetch that would need more waits for a region to empty.
// Together they register no more than staging would (landSpan).
const maxLandRegions = 3

// region is one mapped, registered stretch of the destination file.
type region struct {
	off  int64  // file offset of buf[0]
	buf  []byte // MAP_SHARED over [off, off+len(buf))
	mr   verbs.MR
	live int // chunks started in it and not yet verified
}

// fileMap is a fetch's mapped landing: the file's regions, at most
// maxLandRegions mapped at a time.
type fileMap struct {
	f        *os.File
	name     string
	size     int64 // the file's size
	span     int64 // bytes of a region: a multiple of the chunk size
	reg      func([]byte) (verbs.MR, error)
	regions  []*region
	cur      *region // the region chunks are being started in
	populate bool    // MADV_POPULATE_WRITE works here
	log      *slog.Logger
}

// mapLanding returns the mapped landing for out, or nil and why not;
// slots is the staging it replaces, in chunks.
// pins says the device DMAs into pinned pages.
func mapLanding(out *local.Sink, layout chunker.Layout, slots int, pins bool, reg func([]byte) (verbs.MR, error), log *slog.Logger) (*fileMap, string) {
	switch {
	case out.Kind != local.DestFresh && out.Kind != local.DestInPlace:
		return nil, "not a regular file"
	case out.DirectOn():
		return nil, "O_DIRECT lands from staging with no copy"
	case out.SparseOn():
		return nil, "-S looks for zero blocks before writing"
	case layout.Size <= 0 || layout.ChunkSize <= 0:
		return nil, "empty"
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(out.File.Fd()), &st); err != nil {
		return nil, err.Error()
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < layout.Size {
		return nil, "file is not a regular file of the source's size"
	}
	var sf unix.Statfs_t
	tmpfs := unix.Fstatfs(int(out.File.Fd()), &sf) == nil && sf.Type == unix.TMPFS_MAGIC
	if pins && !tmpfs {
		return nil, "the device would pin the page cache of a file system that tracks dirty pages"
	}
	if why := mapsCheaper(tmpfs, out.File); why != "" {
		return nil, why
	}
	m := &fileMap{f: out.File, name: out.File.Name(), size: layout.Size, span: landSpan(slots, layout.ChunkSize), reg: reg, populate: true, log: log}
	// Try the first region now, so that a file or device that can't be
	// mapped or registered sends the whole fetch through staging.
	r, err := m.mapRegion(0)
	if err != nil {
		return nil, err.Error()
	}
	m.regions = append(m.regions, r)
	m.cur = r
	return m, ""
}

// mapsCheaper says why a mapped landing would cost more than staging on
// f's file system ("" if it would not). Tests replace it.
var mapsCheaper = func(tmpfs bool, f *os.File) string {
	switch {
	case !tmpfs:
		return "not a tmpfs: staging costs less here"
	case !local.HugeTmpfs(f):
		return "tmpfs without huge pages: staging costs less here"
	}
	return ""
}

// mapRegion maps and registers the region starting at off.
func (m *fileMap) mapRegion(off int64) (*region, error) {
	n := min(m.span, m.size-off)
	buf, err := unix.Mmap(int(m.f.Fd()), off, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, &fs.PathError{Op: "mmap", Path: m.name, Err: err}
	}
	mr, err := m.reg(buf)
	if err != nil {
		unix.Munmap(buf)
		return nil, fmt.Errorf("registering a mapping of %s: %w", m.name, err)
	}
	return &region{off: off, buf: buf, mr: mr}, nil
}

// take returns the region chunk [off, off+n) lands in, mapping it if
// need be, and counts the chunk in it. It returns nil, nil when the
// region would be one too many: the caller starts the chunk later.
func (m *fileMap) take(off int64, n int) (*region, error) {
	base := off / m.span * m.span
	if m.cur == nil || m.cur.off != base {
		r := m.find(base)
		if r == nil {
			if len(m.regions) >= maxLandRegions {
				return nil, nil
			}
			var err error
			if r, err = m.mapRegion(base); err != nil {
				return nil, err
			}
			m.regions = append(m.regions, r)
		}
		old := m.cur
		m.cur = r
		if old != nil && old.live == 0 {
			m.drop(old)
		}
	}
	r := m.cur
	r.live++
	m.prefault(r.buf[off-r.off:][:n])
	return r, nil
}

// prefault faults the chunk's pages in, writable, in one call before its
// READs are posted: faulting them one by one inside the receive copy
// cost a page fault per 4 KiB (exc_page_fault under _copy_to_iter in the
// profile). Where the kernel lacks MADV_POPULATE_WRITE (before 5.14) the
// faults happen in the copy, as before.
func (m *fileMap) prefault(b []byte) {
	if !m.populate {
		return
	}
	if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err != nil {
		m.populate = false
		m.log.Debug("landing without prefaulting", "file", m.name, "err", err)
	}
}

func (m *fileMap) find(off int64) *region {
	for _, r := range m.regions {
		if r.off == off {
			return r
		}
	}
	return nil
}

// done is told a chunk of r is verified; r goes once it is empty and no
// longer the region chunks are started in.
func (m *fileMap) done(r *region) {
	r.live--
	if r.live == 0 && r != m.cur {
		m.drop(r)
	}
}

// drop unregisters and unmaps r. The MR's Close waits for a placement
// still under way; nothing is in flight in an empty region.
func (m *fileMap) drop(r *region) {
	for i, x := range m.regions {
		if x == r {
			m.regions = append(m.regions[:i], m.regions[i+1:]...)
			break
		}
	}
	r.mr.Close()
	unix.Munmap(r.buf)
	r.buf = nil
}

// close drops every region (after the engine is closed).
func (m *fileMap) close() {
	for len(m.regions) > 0 {
		m.drop(m.regions[0])
	}
	m.cur = nil
}

// errLandFault is a fault touching a mapped landing (its file cut short
// under us): the chunk's bytes can't be had.
var errLandFault = errors.New("the destination's mapping faulted (was the file truncated?)")
