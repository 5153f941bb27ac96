package target

import (
	"context"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// maxPackFiles caps the files one Pack (or walk batch) packs, whatever fits.
const maxPackFiles = protocol.MaxBatchEntries

// maxPackMessage bounds the message of a file that fails once packed.
const maxPackMessage = 32

// packed is a file Pack will copy into its window.
type packed struct {
	fd   int
	st   unix.Stat_t
	idx  int // in the reply's Files (a walk batch's Entries)
	size int64
}

// packDirs holds, for one Pack, each directory its files are in, opened
// once through the export's root, so that a file costs one openat of a
// single name rather than the resolution of its whole path.
type packDirs map[string]*os.File

func (d packDirs) close() {
	for _, f := range d {
		f.Close()
	}
}

// open opens rel (already resolved and clean) of export x for reading
// (O_NONBLOCK: a FIFO opens at once, to be refused). A last element that
// is a symlink goes through the root instead, which follows it if it
// stays inside the export.
func (d packDirs) open(x *export, rel string) (int, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	df := d[dir]
	if df == nil {
		var err error
		if df, err = x.root.Open(dir); err != nil {
			return -1, err
		}
		d[dir] = df
	}
	fd, err := x.atime.openat(int(df.Fd()), base, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err == unix.ELOOP {
		f, err := x.open(rel)
		if err != nil {
			return -1, err
		}
		defer f.Close()
		return dupFd(f)
	}
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: rel, Err: err}
	}
	return fd, nil
}

// pack copies whole small files into one anonymous buffer, registered and
// keyed like a window, with one digest per file. It answers for a prefix
// of the paths: as many as fit the window limit, the reply, and
// maxPackFiles (at least one). A file that cannot be packed gets an entry
// with its error code; one larger than the window limit gets CodeTooMany,
// for the initiator to copy it with Open.
func (ss *session) pack(ctx context.Context, m *protocol.Pack) protocol.Message {
	cfg := &ss.srv.cfg
	alg := chunker.Algorithm(m.Algorithm)
	switch {
	case !alg.Valid():
		return errf(protocol.CodeUnsupported, "checksum algorithm %d", m.Algorithm)
	case len(m.Paths) == 0:
		return errf(protocol.CodeBadRequest, "pack of no files")
	case len(ss.handles) >= cfg.MaxHandles:
		return errf(protocol.CodeTooMany, "%d files open in this session", len(ss.handles))
	case ss.windows >= cfg.MaxWindowsPerSession:
		return errf(protocol.CodeTooMany, "%d windows mapped in this session", ss.windows)
	}
	qps, perr := ss.dataQPs()
	if perr != nil {
		return perr
	}
	reply := &protocol.PackReply{}
	size := protocol.PackReplyOverhead(len(qps))
	dsize := alg.Size()
	var files []packed
	dirs := packDirs{}
	defer func() {
		for _, p := range files {
			unix.Close(p.fd)
		}
		dirs.close()
	}()
	var total uint64
	var x0 *export
	for _, p := range m.Paths {
		if len(reply.Files) >= maxPackFiles {
			break
		}
		pf, pk, ok := ss.packOne(p, &x0, dirs)
		ss.withMeta(&pf.Entry, func() *protocol.Meta { // a file that failed: a zero one
			if ok {
				return ss.fdMeta(pk.fd)
			}
			return nil
		})
		if ok && pk.size > 0 && total+uint64(pk.size) > cfg.MaxWindow {
			if uint64(pk.size) > cfg.MaxWindow {
				unix.Close(pk.fd)
				pf = protocol.PackedFile{Code: protocol.CodeTooMany, Entry: pf.Entry, Message: "too large to pack"}
				ok = false
			} else {
				unix.Close(pk.fd)
				break // full: the initiator asks again
			}
		}
		n := protocol.PackedFileSize(pf)
		if ok {
			n += max(dsize, maxPackMessage) // a digest, or why it failed after all
		}
		if size+n > protocol.MaxMessage {
			if ok {
				unix.Close(pk.fd)
			}
			break
		}
		size += n
		if ok {
			pf.Offset = total
			total += uint64(pk.size)
			pk.idx = len(reply.Files)
			files = append(files, pk)
		}
		reply.Files = append(reply.Files, pf)
	}
	if len(reply.Files) == 0 {
		return errf(protocol.CodeBadRequest, "the first file's entry does not fit a reply")
	}
	var w *window
	var buf []byte
	if total > 0 {
		var rkeys []uint32
		var perr *protocol.Error
		if w, rkeys, perr = ss.packWindow(ctx, total, qps); perr != nil {
			return perr
		}
		buf = w.mapping[:total]
		reply.Window = protocol.Window{ID: w.id, Length: total, Addr: w.mr.Addr(), RKeys: rkeys}
	} else { // every file empty or failed: a window of nothing
		w = &window{id: ss.nextWindow}
		ss.nextWindow++
		reply.Window = protocol.Window{ID: w.id, RKeys: make([]uint32, len(qps))}
	}
	ss.fill(buf, files, func(i int) *protocol.PackedFile { return &reply.Files[i] }, alg)
	h := &handle{id: ss.nextHandle, export: x0, path: "(pack)", packed: true, windows: map[uint32]*window{w.id: w}}
	ss.nextHandle++
	ss.windows++
	ss.srv.met.windows.Inc()
	ss.handles[h.id] = h
	reply.Handle = h.id
	ss.batchServed("served pack", x0, len(files), total, len(reply.Files)-len(files))
	ss.log.Debug("pack", "files", len(reply.Files), "packed", len(files), "bytes", total)
	return reply
}

// packWindow takes memory for total bytes of packed files from the
// session's spare and registers it as a new window, keyed for each of
// qps: the caller fills it before anyone can read it (the keys are not
// sent yet) and keeps it in a handle.
func (ss *session) packWindow(ctx context.Context, total uint64, qps []verbs.QP) (*window, []uint32, *protocol.Error) {
	mapping, size, perr := ss.spare.get(ss, total)
	if perr != nil {
		return nil, nil, perr
	}
	w := &window{id: ss.nextWindow, mapping: mapping, size: size, pack: true, at: time.Now()}
	access := verbs.AccessRemoteRead
	if ss.mws {
		access |= verbs.AccessMWBind
	}
	var err error
	if w.mr, err = ss.register(mapping[:total], access); err != nil {
		ss.freeWindow(w)
		return nil, nil, errf(protocol.CodeInternal, "register pack: %v", err)
	}
	rkeys, perr := ss.keys(ctx, w, qps, ss.mws)
	if perr != nil {
		return nil, nil, perr
	}
	ss.nextWindow++
	return w, rkeys, nil
}

// maxSpare is the largest pack buffer a session keeps for its next pack.
const maxSpare = 8 << 20

// packSpare is the memory of a session's last pack, kept for the next
// one: a fresh mapping for every pack costs a page fault per page. Its
// keys die with the pack's window; only the memory stays, and only this
// session's packs use it. Kept, it holds none of the window budget (so it
// never keeps another session from mapping), and at most
// WindowBudget/MaxSessions of memory.
type packSpare struct {
	mu sync.Mutex
	b  []byte
}

// get returns memory for a pack of n bytes, of which it reserves all in
// the window budget (the window's size), within ss's share: a fresh
// buffer is the larger of n and 4 MiB where that fits, else n.
func (p *packSpare) get(ss *session, n uint64) ([]byte, uint64, *protocol.Error) {
	srv := ss.srv
	p.mu.Lock()
	b := p.b
	p.b = nil
	p.mu.Unlock()
	if uint64(len(b)) < n {
		if b != nil {
			unix.Munmap(b)
		}
		b = nil
	}
	size := uint64(len(b))
	if b == nil {
		size = max(n, min(4<<20, p.limit(srv)))
	}
	got, perr := srv.reserve(ss, size, n)
	if perr != nil {
		p.put(ss, b, 0, true) // kept for when the budget frees up
		return nil, 0, perr
	}
	size = got // a kept buffer larger than what is reserved registers n bytes of it all the same
	if b == nil {
		var err error
		if b, err = unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
			srv.release(ss, size)
			return nil, 0, errf(protocol.CodeInternal, "pack buffer: %v", err)
		}
	}
	return b, size, nil
}

// limit is the most memory a spare may keep.
func (p *packSpare) limit(srv *Server) uint64 {
	return min(maxSpare, srv.cfg.WindowBudget/uint64(max(srv.cfg.MaxSessions, 1)))
}

// put takes back a pack's memory, whose window held size bytes of the
// budget, once the window is gone; kept if keep and small enough and no
// other is kept, else unmapped.
func (p *packSpare) put(ss *session, b []byte, size uint64, keep bool) {
	srv := ss.srv
	srv.release(ss, size)
	if b == nil {
		return
	}
	p.mu.Lock()
	if keep && p.b == nil && uint64(len(b)) <= p.limit(srv) {
		p.b, b = b, nil
	}
	p.mu.Unlock()
	if b != nil {
		unix.Munmap(b)
	}
}

// drop unmaps the kept memory, if any.
func (p *packSpare) drop() {
	p.mu.Lock()
	b := p.b
	p.b = nil
	p.mu.Unlock()
	if b != nil {
		unix.Munmap(b)
	}
}

// packReaders is how many files one Pack (or walk batch) reads at once.
const packReaders = 4

// fill reads the packed files into buf at their offsets, several at a
// time, and sets each one's digest, or its error if it failed or changed
// since it was opened, in out(its idx).
func (ss *session) fill(buf []byte, files []packed, out func(idx int) *protocol.PackedFile, alg chunker.Algorithm) {
	var next atomic.Int64
	var wg sync.WaitGroup
	// The digests, each in its own part of one slice: a slice a file was
	// an allocation a file.
	dsize := alg.Size()
	sums := make([]byte, len(files)*dsize)
	read := func() {
		for {
			k := int(next.Add(1) - 1)
			if k >= len(files) {
				return
			}
			ss.fillOne(buf, &files[k], out, sums[k*dsize:k*dsize:(k+1)*dsize], alg)
		}
	}
	// The caller is one of the readers: a batch whose files are read
	// before a helper starts costs no hand-off to wait for them.
	for range min(packReaders, len(files)) - 1 {
		wg.Go(read)
	}
	read()
	wg.Wait()
}

// fillOne reads packed file p into its place in buf and sets its digest
// (in sum, its part of the batch's digests), or its error if it failed or
// changed since it was opened.
func (ss *session) fillOne(buf []byte, p *packed, out func(idx int) *protocol.PackedFile, sum []byte, alg chunker.Algorithm) {
	pf := out(p.idx)
	data := buf[pf.Offset : pf.Offset+uint64(p.size)]
	err := readFull(p.fd, data)
	ss.work.Add(uint64(len(data)))
	var st unix.Stat_t
	serr := unix.Fstat(p.fd, &st)
	switch {
	case err != nil && err != io.ErrUnexpectedEOF:
		clear(data)
		ss.log.Warn("pack: read failed", "file", pf.Entry.Name, "err", err)
		*pf = protocol.PackedFile{Code: protocol.CodeInternal, Entry: pf.Entry, Message: "read failed"}
	case err != nil || serr != nil || st.Size != p.size || st.Mtim != p.st.Mtim:
		clear(data) // no bytes of an earlier pack in the window
		*pf = protocol.PackedFile{Code: protocol.CodeChanged, Entry: pf.Entry, Message: "changed while it was packed"}
	default:
		pf.Digest = chunker.AppendSum(sum, alg, data)
	}
}

// packOne opens one file for pack. All files of a pack must come from one
// export (x0 is set by the first), so removing the export revokes it.
func (ss *session) packOne(p string, x0 **export, dirs packDirs) (protocol.PackedFile, packed, bool) {
	x, rel, perr := ss.resolve(p, RightRead)
	if perr != nil {
		return protocol.PackedFile{Code: perr.Code, Message: perr.Message}, packed{}, false
	}
	if *x0 == nil {
		*x0 = x
	} else if x != *x0 {
		return protocol.PackedFile{Code: protocol.CodeBadRequest, Message: p + ": a pack's files must be in one export"}, packed{}, false
	}
	fail := func(err error) (protocol.PackedFile, packed, bool) {
		e := fsError(p, err)
		return protocol.PackedFile{Code: e.Code, Message: e.Message}, packed{}, false
	}
	if x.root == nil || rel == "." {
		return protocol.PackedFile{Code: protocol.CodeUnsupported, Message: p + " is not a file in a directory export"}, packed{}, false
	}
	fd, err := dirs.open(x, rel)
	if err != nil {
		return fail(err)
	}
	pk := packed{fd: fd}
	if err := unix.Fstat(fd, &pk.st); err != nil {
		unix.Close(fd)
		return fail(&fs.PathError{Op: "fstat", Path: rel, Err: err})
	}
	e := statEntry(path.Base(p), &pk.st)
	if e.Type != protocol.FileRegular {
		unix.Close(fd)
		return protocol.PackedFile{Code: protocol.CodeUnsupported, Entry: e, Message: p + " is not a regular file"}, packed{}, false
	}
	if perr := stableFd(p, fd, &pk.st); perr != nil {
		unix.Close(fd) // a /proc file, say: its size says nothing of its bytes
		return protocol.PackedFile{Code: perr.Code, Entry: e, Message: perr.Message}, packed{}, false
	}
	pk.size = pk.st.Size
	return protocol.PackedFile{Entry: e}, pk, true
}

// statEntry is entryOf for a stat of an open file.
func statEntry(name string, st *unix.Stat_t) protocol.Entry {
	return modeEntry(name, st.Mode, st.Size, st.Mtim.Nano())
}

// modeEntry is the entry of a file with st_mode mode, size and mtime. Its
// type is protocol.FileTypeOf's for the same file, from the raw mode.
func modeEntry(name string, mode uint32, size, mtimeNs int64) protocol.Entry {
	e := protocol.Entry{Name: name, Mode: mode & 0o7777, Size: uint64(max(size, 0)), MtimeNs: mtimeNs}
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = protocol.FileRegular
	case unix.S_IFDIR:
		e.Type = protocol.FileDir
	case unix.S_IFLNK:
		e.Type = protocol.FileSymlink
	case unix.S_IFBLK:
		e.Type = protocol.FileBlockDev
	case unix.S_IFIFO:
		e.Type = protocol.FileFIFO
	case unix.S_IFSOCK:
		e.Type = protocol.FileSocket
	case unix.S_IFCHR:
		e.Type = protocol.FileCharDev
	default:
		e.Type = protocol.FileOther
	}
	return e
}

// readFull reads len(b) bytes from the start of fd; a file shorter than
// b is an error (it changed).
func readFull(fd int, b []byte) error {
	for off := 0; off < len(b); {
		n, err := unix.Pread(fd, b[off:], int64(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		off += n
	}
	return nil
}
