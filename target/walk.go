package target

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/rdmacp/rdmacp/filter"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// maxOpenDirs is how many directories of a walk's path stay open; deeper
// ones are opened again through the export's root when the walk comes
// back to them.
const maxOpenDirs = 64

// walker is a walk in progress: a depth-first stack of the directories it
// is in, each with its sorted entries and how far it has got.
type walker struct {
	x       *export
	root    string // the walk's Path as sent: shard hashes start with it
	alg     chunker.Algorithm
	packMax int64
	shardI  uint32
	shardN  uint32
	dirs    uint32         // directory entries made so far
	stack   []*walkDir     // the walk's path, from its root
	held    []walkEntry    // made but not yet sent
	files   []packed       // a batch's packed files, kept for the next: grown afresh, a fifth of a walk's allocation
	buf     []byte         // for getdents
	work    *atomic.Uint64 // the session's work counter: entries read (progress.go)
	// meta sets an entry's Meta from name in directory dirfd, for an
	// initiator that asked for it (nil: none did).
	meta func(e *protocol.Entry, dirfd int, name string)
	// rules are the initiator's excludes: what they leave out is neither
	// sent nor opened, statted or entered (nil: none).
	rules *filter.Filter
	// plainFS: the devices whose file systems are not pseudo ones
	// (unstable), as this walk found them.
	plainFS map[uint64]bool
}

type walkDir struct {
	fd    int    // -1 while closed (too deep)
	dev   uint64 // what it is, to know it again when reopened
	ino   uint64
	rel   string // in the export: "." for its root
	wrel  string // under the walk's root: "" for the root itself
	index uint32 // its Dir number
	ents  []dirent
	pos   int
}

type dirent struct {
	name string
	typ  uint8 // DT_*
}

// walkEntry is an entry made for a batch, with its open file if packed:
// closed (fd -1) while the entry waits for room, and opened again by its
// path in the export when it is sent.
type walkEntry struct {
	e   protocol.WalkEntry
	pk  packed   // fd -1 unless e.Packed
	dir *walkDir // a packed file's
}

// newWalker starts a walk of directory rel of export x.
func newWalker(x *export, rel string, m *protocol.Walk, maxWindow uint64) (*walker, error) {
	w := &walker{x: x, root: m.Path, alg: chunker.Algorithm(m.Algorithm), packMax: int64(min(m.PackMax, maxWindow)), shardI: m.ShardI, shardN: m.ShardN}
	f, err := x.root.OpenFile(rel, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fd, err := dupFd(f)
	f.Close()
	if err != nil {
		return nil, &fs.PathError{Op: "dup", Path: rel, Err: err}
	}
	d := &walkDir{fd: fd, rel: rel}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "fstat", Path: rel, Err: err}
	}
	d.dev, d.ino = st.Dev, st.Ino
	w.buf = make([]byte, 32<<10)
	if d.ents, err = readDir(fd, w.buf); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "readdir", Path: rel, Err: err}
	}
	w.stack = []*walkDir{d}
	return w, nil
}

// close closes what the walk holds open.
func (w *walker) close() {
	for _, d := range w.stack {
		if d.fd >= 0 {
			unix.Close(d.fd)
		}
	}
	w.stack = nil
	w.closeHeld()
	w.held = nil
}

// closeHeld closes the files of the entries waiting to be sent.
func (w *walker) closeHeld() {
	for i := range w.held {
		if h := &w.held[i]; h.e.Packed && h.pk.fd >= 0 {
			unix.Close(h.pk.fd)
			h.pk.fd = -1
		}
	}
}

// reopenHeld opens again the file of packed entry we, which waited for
// room closed; if it is not the file it was (device, inode, size, mtime),
// the entry fails with Changed.
func (w *walker) reopenHeld(we *walkEntry) {
	fail := func(code protocol.Code, msg string) {
		we.e.Packed, we.e.Code, we.e.Message = false, code, msg
	}
	rel := path.Join(we.dir.rel, we.e.Entry.Name)
	shown := path.Join(we.dir.wrel, we.e.Entry.Name) // as the walk's other messages say it
	f, err := w.x.root.OpenFile(rel, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		fail(fsCode(shown, err))
		return
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Dev != we.pk.st.Dev || st.Ino != we.pk.st.Ino ||
		st.Size != we.pk.st.Size || st.Mtim != we.pk.st.Mtim {
		fail(protocol.CodeChanged, "changed while it was walked")
		return
	}
	fd, err := dupFd(f)
	if err != nil {
		fail(fsCode(shown, &fs.PathError{Op: "dup", Path: rel, Err: err}))
		return
	}
	we.pk.fd = fd
}

// next makes the walk's next entry in *we, false at its end. It fills
// the caller's entry (a batch's held slot) rather than returning one: an
// entry handed to meta by its address escaped, one allocation of a few
// hundred bytes a file.
func (w *walker) next(we *walkEntry) bool {
	for len(w.stack) > 0 {
		d := w.stack[len(w.stack)-1]
		if d.pos == len(d.ents) {
			if d.fd >= 0 {
				unix.Close(d.fd)
			}
			w.stack = w.stack[:len(w.stack)-1]
			continue
		}
		de := d.ents[d.pos]
		d.pos++
		known := de.typ != unix.DT_UNKNOWN
		if known && (de.typ != unix.DT_DIR && !w.inShard(d, de.name) || w.excluded(d, de)) {
			continue
		}
		if d.fd < 0 {
			if err := w.reopen(d); err != nil { // each of its entries left fails
				*we = w.failed(d, de.name, protocol.Entry{Name: de.name}, err)
				if errors.Is(err, errMoved) {
					we.e.Code = protocol.CodeChanged
				}
				return true
			}
		}
		if !known { // the file system does not say: ask
			var st unix.Stat_t
			if unix.Fstatat(d.fd, de.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				de.typ = dtype(st.Mode)
			}
			if de.typ != unix.DT_DIR && !w.inShard(d, de.name) || w.excluded(d, de) {
				continue
			}
		}
		var sub *walkDir
		*we, sub = w.entry(d, de)
		if w.meta != nil {
			w.meta(&we.e.Entry, d.fd, de.name)
		}
		if we.e.Entry.Type == protocol.FileDir {
			w.dirs++ // every directory entry sent takes a Dir number
			if sub != nil {
				sub.index = w.dirs
				w.stack = append(w.stack, sub)
				if n := len(w.stack); n > maxOpenDirs {
					if up := w.stack[n-1-maxOpenDirs]; up.fd >= 0 {
						unix.Close(up.fd)
						up.fd = -1
					}
				}
			}
		}
		return true
	}
	return false
}

// excluded reports whether the initiator's rules leave de out: its path
// under the walk's root, as the initiator matches it.
func (w *walker) excluded(d *walkDir, de dirent) bool {
	return w.rules != nil && w.rules.Excluded(path.Join(d.wrel, de.name), de.typ == unix.DT_DIR)
}

func (w *walker) inShard(d *walkDir, name string) bool {
	if w.shardN <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write([]byte(w.root))
	h.Write([]byte{'/'})
	if d.wrel != "" {
		h.Write([]byte(d.wrel))
		h.Write([]byte{'/'})
	}
	h.Write([]byte(name))
	return h.Sum32()%w.shardN == w.shardI
}

// dupFd duplicates f's descriptor, close-on-exec, to outlive f.
func dupFd(f *os.File) (int, error) {
	return unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
}

// errMoved: a directory reopened by its path is another one now.
var errMoved = errors.New("directory moved or replaced during the walk")

// reopen opens directory d again through the export's root, if it is
// still the directory it was.
func (w *walker) reopen(d *walkDir) error {
	f, err := w.x.root.OpenFile(d.rel, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: d.rel, Err: err}
	}
	if st.Dev != d.dev || st.Ino != d.ino {
		return &fs.PathError{Op: "reopen", Path: d.rel, Err: errMoved}
	}
	fd, err := dupFd(f)
	if err != nil {
		return &fs.PathError{Op: "dup", Path: d.rel, Err: err}
	}
	d.fd = fd
	return nil
}

// entry makes the entry for de in d. A directory is opened and read, and
// returned as sub for the walk to enter; a regular file small enough to
// pack is opened.
func (w *walker) entry(d *walkDir, de dirent) (we walkEntry, sub *walkDir) {
	const oflags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	name := de.name
	var st unix.Stat_t
	switch {
	case de.typ == unix.DT_DIR:
		fd, err := w.x.atime.openat(d.fd, name, oflags|unix.O_DIRECTORY)
		if err == unix.ENOTDIR || err == unix.ELOOP {
			return w.changed(d, name), nil
		}
		if err == nil {
			if err = unix.Fstat(fd, &st); err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			e := w.lstat(d, name)
			e.Type = protocol.FileDir
			return w.failed(d, name, e, &fs.PathError{Op: "open", Path: name, Err: err}), nil
		}
		we := plain(d, statEntry(name, &st))
		ents, err := readDir(fd, w.buf)
		if w.work != nil {
			w.work.Add(uint64(len(ents)) + 1)
		}
		if err != nil {
			unix.Close(fd)
			we.e.Code, we.e.Message = fsCode(path.Join(d.wrel, name), &fs.PathError{Op: "readdir", Path: name, Err: err})
			return we, nil
		}
		return we, &walkDir{fd: fd, dev: st.Dev, ino: st.Ino, rel: path.Join(d.rel, name), wrel: path.Join(d.wrel, name), ents: ents}
	case de.typ == unix.DT_REG && w.packMax > 0:
		fd, err := w.x.atime.openat(d.fd, name, oflags)
		if err == unix.ELOOP {
			return w.changed(d, name), nil
		}
		if err != nil {
			return w.failed(d, name, w.lstat(d, name), &fs.PathError{Op: "open", Path: name, Err: err}), nil
		}
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return w.failed(d, name, protocol.Entry{Type: protocol.FileRegular, Name: name}, &fs.PathError{Op: "fstat", Path: name, Err: err}), nil
		}
		e := statEntry(name, &st)
		switch {
		case e.Type != protocol.FileRegular:
			unix.Close(fd)
			return w.changed(d, name), nil
		}
		if why := w.unstable(fd, &st); why != "" {
			unix.Close(fd) // a /proc file, say: its size says nothing of its bytes
			perr := stableError(path.Join(d.wrel, name), why)
			we := plain(d, e)
			we.e.Code, we.e.Message = perr.Code, perr.Message
			return we, nil
		}
		switch {
		case st.Size > w.packMax:
			unix.Close(fd) // copied with Open
			return plain(d, e), nil
		}
		return walkEntry{e: protocol.WalkEntry{Dir: d.index, Packed: true, PackedFile: protocol.PackedFile{Entry: e}},
			pk: packed{fd: fd, st: st, size: st.Size}, dir: d}, nil
	}
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return w.failed(d, name, protocol.Entry{Name: name}, &fs.PathError{Op: "lstat", Path: name, Err: err}), nil
	}
	e := statEntry(name, &st)
	if e.Type == protocol.FileDir { // since it was listed
		return w.changed(d, name), nil
	}
	if e.Type == protocol.FileSymlink {
		e.Target = readlinkAt(d.fd, name)
	}
	return plain(d, e), nil
}

// plainFSMax bounds the file systems a walker remembers: a tree spans a
// few; past that many it forgets them and asks again.
const plainFSMax = 64

// unstable is unstable (stable.go) with the file system's statfs asked
// once per device a walk meets, not once per file: a tree's files are
// nearly all on one file system, and the fstatfs was 3.5% of the target's
// CPU serving 300,000 512-byte files. st.Dev is the file's own (a file
// bind-mounted from procfs or sysfs has its pseudo file system's), and a
// 0-byte file is always checked in full (it is read, not just statted).
func (w *walker) unstable(fd int, st *unix.Stat_t) string {
	reg := st.Mode&unix.S_IFMT == unix.S_IFREG
	if reg && st.Size > 0 && w.plainFS[st.Dev] {
		return ""
	}
	why := unstable(fd, st)
	if why == "" && reg {
		if w.plainFS == nil || len(w.plainFS) >= plainFSMax {
			w.plainFS = map[uint64]bool{}
		}
		w.plainFS[st.Dev] = true
	}
	return why
}

// plain is an entry of d that is sent without bytes.
func plain(d *walkDir, e protocol.Entry) walkEntry {
	return walkEntry{e: protocol.WalkEntry{Dir: d.index, PackedFile: protocol.PackedFile{Entry: e}}, pk: packed{fd: -1}}
}

// lstat is name's entry as far as it can be had; zero but for its name if not.
func (w *walker) lstat(d *walkDir, name string) protocol.Entry {
	var st unix.Stat_t
	if unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return protocol.Entry{Name: name}
	}
	return statEntry(name, &st)
}

func (w *walker) failed(d *walkDir, name string, e protocol.Entry, err error) walkEntry {
	we := plain(d, e)
	we.e.Code, we.e.Message = fsCode(path.Join(d.wrel, name), err)
	return we
}

// changed is the entry for a name whose type changed while it was walked.
func (w *walker) changed(d *walkDir, name string) walkEntry {
	we := plain(d, w.lstat(d, name))
	we.e.Code, we.e.Message = protocol.CodeChanged, "changed while it was walked"
	return we
}

func fsCode(p string, err error) (protocol.Code, string) {
	e := fsError(p, err)
	return e.Code, e.Message
}

// dtype is the DT_* type of a stat's mode (IFTODT: Linux numbers them
// alike).
func dtype(mode uint32) uint8 { return uint8(mode & unix.S_IFMT >> 12) }

// readlinkAt is the target of symlink name in directory fd, "" if it
// cannot be read.
func readlinkAt(fd int, name string) string {
	b := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(fd, name, b)
		if err != nil {
			return ""
		}
		if n < len(b) {
			return string(b[:n])
		}
		if len(b) >= 1<<16 {
			return ""
		}
		b = make([]byte, 2*len(b))
	}
}

// readDir reads all of directory fd's entries but "." and "..", sorted by
// name, through buf.
func readDir(fd int, buf []byte) ([]dirent, error) {
	var ents []dirent
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			break
		}
		ents = parseDirents(buf[:n], ents)
	}
	slices.SortFunc(ents, func(a, b dirent) int { return strings.Compare(a.name, b.name) })
	return ents, nil
}

// parseDirents appends the entries of getdents64 records b to ents.
// Their names are slices of one string made of b, not a string each: one
// allocation a getdents call, not one a file.
func parseDirents(b []byte, ents []dirent) []dirent {
	const hdr = 8 + 8 + 2 + 1 // d_ino, d_off, d_reclen, d_type
	all := string(b)
	for off := 0; len(b)-off >= hdr; {
		r := b[off:]
		ino := binary.NativeEndian.Uint64(r)
		reclen := int(binary.NativeEndian.Uint16(r[16:]))
		if reclen < hdr || reclen > len(r) {
			break
		}
		typ := r[18]
		name := all[off+hdr : off+reclen]
		if i := strings.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		off += reclen
		if ino == 0 || name == "." || name == ".." || len(name) == 0 {
			continue
		}
		ents = append(ents, dirent{name: name, typ: typ})
	}
	return ents
}

// walkMaxEntries caps a batch's entries, whatever fits.
const walkMaxEntries = maxPackFiles

// maxWalks caps the walks a session has open at once: each holds its
// path's directory listings.
const maxWalks = 8

// walk starts a walk and answers with its first batch.
func (ss *session) walk(ctx context.Context, m *protocol.Walk) protocol.Message {
	cfg := &ss.srv.cfg
	alg := chunker.Algorithm(m.Algorithm)
	switch {
	case !alg.Valid():
		return errf(protocol.CodeUnsupported, "checksum algorithm %d", m.Algorithm)
	case m.ShardN > 1 && m.ShardI >= m.ShardN:
		return errf(protocol.CodeBadRequest, "shard %d of %d", m.ShardI, m.ShardN)
	case len(ss.handles) >= cfg.MaxHandles:
		return errf(protocol.CodeTooMany, "%d files open in this session", len(ss.handles))
	}
	walks := 0
	for _, h := range ss.handles {
		if h.walk != nil {
			walks++
		}
	}
	if walks >= maxWalks {
		return errf(protocol.CodeTooMany, "%d walks open in this session", walks)
	}
	x, rel, perr := ss.resolve(m.Path, RightRead)
	if perr != nil {
		return perr
	}
	if x.root == nil {
		return errf(protocol.CodeNotDir, "%s is not a directory", m.Path)
	}
	rules := make([]filter.Rule, len(m.Rules))
	for i, r := range m.Rules {
		rules[i] = filter.Rule{Include: r.Include, Pattern: r.Pattern}
	}
	excl, err := filter.FromRules(rules)
	if err != nil {
		return errf(protocol.CodeBadRequest, "walk rules: %v", err)
	}
	w, err := newWalker(x, rel, m, cfg.MaxWindow)
	if err != nil {
		return fsError(m.Path, err)
	}
	w.rules = excl
	w.work = &ss.work
	if ss.want != 0 {
		w.meta = func(e *protocol.Entry, dirfd int, name string) {
			ss.withMeta(e, func() *protocol.Meta { return ss.metaAt(dirfd, name) })
		}
	}
	h := &handle{id: ss.nextHandle, export: x, path: m.Path, walk: w, windows: map[uint32]*window{}}
	ss.nextHandle++
	ss.handles[h.id] = h
	ss.log.Debug("walk", "path", m.Path, "pack_max", w.packMax, "shard", m.ShardI, "of", m.ShardN)
	reply := ss.walkBatch(ctx, h, m.MaxEntries)
	if _, ok := reply.(*protocol.Error); ok {
		ss.closeHandle(h) // the initiator never learns of it: it asks again
	}
	return reply
}

// walkNext answers WalkNext: it frees the released window and sends the
// next batch.
func (ss *session) walkNext(ctx context.Context, m *protocol.WalkNext) protocol.Message {
	h := ss.handles[m.Handle]
	if h == nil || h.walk == nil {
		return errf(protocol.CodeBadRequest, "no walk %d", m.Handle)
	}
	if m.Release != 0 {
		w := h.windows[m.Release]
		if w == nil {
			return errf(protocol.CodeBadRequest, "no window %d on walk %d", m.Release, m.Handle)
		}
		ss.unmap(h, w)
	}
	return ss.walkBatch(ctx, h, m.MaxEntries)
}

// walkBatch makes the walk's next batch: as many entries as fit the
// reply, the window limit and max (at least one, while there are any),
// with the packed files' bytes in a window of their own.
func (ss *session) walkBatch(ctx context.Context, h *handle, maxEntries uint16) protocol.Message {
	cfg := &ss.srv.cfg
	w := h.walk
	limit := walkMaxEntries
	if maxEntries > 0 {
		limit = min(limit, int(maxEntries))
	}
	qps, perr := ss.dataQPs()
	if perr != nil {
		return perr
	}
	if w.packMax > 0 && ss.windows >= cfg.MaxWindowsPerSession {
		// Before any file is opened: no descriptors wait for room.
		return errf(protocol.CodeTooMany, "%d windows mapped in this session", ss.windows)
	}
	reply := &protocol.WalkBatch{Handle: h.id}
	size := protocol.WalkBatchOverhead(len(qps))
	reserve := max(w.alg.Size(), maxPackMessage) // a digest, or why it failed after all
	var total uint64
	n := 0 // entries taken, from w.held
	for n < limit {
		if n == len(w.held) {
			w.held = append(w.held, walkEntry{})
			if !w.next(&w.held[n]) {
				w.held = w.held[:n]
				reply.Done = true
				break
			}
		}
		we := &w.held[n]
		if we.e.Packed && we.pk.fd < 0 {
			w.reopenHeld(we)
		}
		sz := protocol.WalkEntrySize(&we.e)
		if we.e.Packed {
			sz += reserve
			if total+uint64(we.pk.size) > cfg.MaxWindow {
				break
			}
		}
		if size+sz > protocol.MaxMessage {
			break
		}
		size += sz
		if we.e.Packed {
			we.e.Offset = total
			total += uint64(we.pk.size)
		}
		n++
	}
	sent := w.held[:n]
	var win *window
	var rkeys []uint32
	if total > 0 {
		if win, rkeys, perr = ss.packWindow(ctx, total, qps); perr != nil {
			// The entries wait for the next try, their files closed: a
			// walk holds no descriptors while it waits for room.
			w.closeHeld()
			return perr
		}
	}
	files := w.files[:0]
	defer func() { clear(files); w.files = files[:0] }() // for the next batch: read and closed by then
	reply.Entries = make([]protocol.WalkEntry, n)
	for i := range sent {
		reply.Entries[i] = sent[i].e
		if sent[i].e.Packed {
			pk := sent[i].pk
			pk.idx = i
			files = append(files, pk)
		}
	}
	var buf []byte
	if win != nil {
		buf = win.mapping[:total]
		h.windows[win.id] = win
		ss.windows++
		ss.srv.met.windows.Inc()
		reply.Window = protocol.Window{ID: win.id, Length: total, Addr: win.mr.Addr(), RKeys: rkeys}
	}
	ss.fill(buf, files, func(i int) *protocol.PackedFile { return &reply.Entries[i].PackedFile }, w.alg)
	for i := range reply.Entries {
		if e := &reply.Entries[i]; e.Packed && e.Code != 0 {
			e.Packed = false // it failed as it was read
		}
	}
	for _, pk := range files { // read: closed, and the sent entries dropped
		unix.Close(pk.fd)
	}
	w.held = append(w.held[:0], w.held[n:]...)
	ss.log.Debug("walk batch", "entries", n, "packed", len(files), "bytes", total, "done", reply.Done)
	ss.batchServed("served walk batch", w.x, len(files), total, 0)
	return reply
}
