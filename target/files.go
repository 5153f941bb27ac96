package target

import (
	"context"
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/blockdev"
	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// noAtime opens an export's files and directories with O_NOATIME while
// the kernel allows it, so that serving them leaves their access times
// alone: no inode dirtied per file read (on a disk file system, no journal
// write for it; touch_atime was 1-2.6% of the daemon's CPU copying 300,000
// files in tmpfs). The kernel allows it to the file's owner and to a
// holder of CAP_FOWNER (root) and refuses anyone else with EPERM; the first
// open that fails so and works without the flag turns it off for the
// export, so a daemon that may not use it pays one open again, not one a
// file.
type noAtime struct{ off atomic.Bool }

// openat opens name in directory dirfd with flags (O_NOATIME added while
// it works).
func (n *noAtime) openat(dirfd int, name string, flags int) (int, error) {
	if !n.off.Load() {
		fd, err := unix.Openat(dirfd, name, flags|unix.O_NOATIME, 0)
		if err != unix.EPERM {
			return fd, err
		}
		if fd, err = unix.Openat(dirfd, name, flags, 0); err == nil {
			n.off.Store(true) // O_NOATIME's refusal, not the file's
		}
		return fd, err
	}
	return unix.Openat(dirfd, name, flags, 0)
}

// A session's requests about files: List, Stat, Open (a handle, its
// digests), Digests, Extents, and closing a handle.

func (ss *session) list(m *protocol.List) protocol.Message {
	var all []protocol.Entry
	if m.Path == "" || m.Path == "/" {
		for _, x := range ss.srv.exportList() {
			if ss.may(x.Name) < RightRead {
				continue // listed only to those who may use it
			}
			if en, err := x.entry("."); err == nil {
				all = append(all, en)
			}
		}
	} else {
		x, rel, perr := ss.resolve(m.Path, RightRead)
		if perr != nil {
			return perr
		}
		var err error
		if all, err = x.list(rel); err != nil {
			return fsError(m.Path, err)
		}
		ss.listMeta(x, rel, all)
	}
	if m.Cookie > uint64(len(all)) {
		return errf(protocol.CodeBadRequest, "list cookie %d past the end", m.Cookie)
	}
	reply := &protocol.ListReply{}
	size := protocol.ListReplyOverhead
	i := int(m.Cookie)
	for ; i < len(all); i++ {
		n := protocol.EntrySize(all[i])
		if size+n > protocol.MaxMessage {
			break
		}
		size += n
		reply.Entries = append(reply.Entries, all[i])
	}
	if i < len(all) {
		reply.NextCookie = uint64(i)
	}
	return reply
}

func (ss *session) stat(m *protocol.Stat) protocol.Message {
	x, rel, perr := ss.resolve(m.Path, RightRead)
	if perr != nil {
		return perr
	}
	e, err := x.entry(rel)
	if err != nil {
		return fsError(m.Path, err)
	}
	ss.withMeta(&e, func() *protocol.Meta { return ss.pathMeta(x, rel) })
	return &protocol.StatReply{Entry: e}
}

// newHandle checks what opening a file (Open or Push) asks for: room for
// another handle, and the checksum algorithm and chunk size (0: the
// target's), which it returns.
func (ss *session) newHandle(algorithm uint8, chunkSize uint32) (chunker.Algorithm, int64, *protocol.Error) {
	cfg := &ss.srv.cfg
	if len(ss.handles) >= cfg.MaxHandles {
		return 0, 0, errf(protocol.CodeTooMany, "%d files open in this session", len(ss.handles))
	}
	alg := chunker.Algorithm(algorithm)
	if !alg.Valid() {
		return 0, 0, errf(protocol.CodeUnsupported, "checksum algorithm %d", algorithm)
	}
	cs := int64(chunkSize)
	if cs == 0 {
		cs = cfg.ChunkSize
	}
	if err := chunker.ValidateChunkSize(cs); err != nil {
		return 0, 0, errf(protocol.CodeBadRequest, "%v", err)
	}
	return alg, cs, nil
}

func (ss *session) open(ctx context.Context, m *protocol.Open) protocol.Message {
	alg, cs, perr := ss.newHandle(m.Algorithm, m.ChunkSize)
	if perr != nil {
		return perr
	}
	x, rel, perr := ss.resolve(m.Path, RightRead)
	if perr != nil {
		return perr
	}
	f, err := x.open(rel)
	if err != nil {
		if re := (*replacedError)(nil); errors.As(err, &re) {
			ss.log.Warn("refused open: export replaced since it was exported", "path", m.Path, "export_path", x.Path)
		}
		return fsError(m.Path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fsError(m.Path, err)
	}
	if fi.IsDir() {
		f.Close()
		return errf(protocol.CodeIsDir, "%s is a directory", m.Path)
	}
	if perr := stableFile(m.Path, f); perr != nil {
		f.Close()
		return perr
	}
	size, mtime := fi.Size(), fi.ModTime().UnixNano()
	isDev := blockdev.Is(fi)
	switch {
	case isDev:
		if size, err = blockdev.Size(f); err != nil {
			f.Close()
			return errf(protocol.CodeInternal, "%v", err)
		}
		mtime = blockdev.Generation(fi)
		if bs, err := blockdev.LogicalBlockSize(f); err == nil {
			ss.log.Debug("block device", "path", m.Path, "size", size, "logical_block", bs)
		}
	}
	layout := chunker.Layout{Size: size, ChunkSize: cs}
	h := &handle{id: ss.nextHandle, export: x, path: m.Path, f: f, size: size, mtime: mtime, blockdev: isDev,
		layout: layout, windows: map[uint32]*window{}}
	fd, cached, perr := ss.openDigests(ctx, h, alg)
	if perr != nil {
		f.Close()
		return perr
	}
	if h.changed() {
		if h.wd != nil {
			h.wd.stop()
		}
		f.Close()
		return errf(protocol.CodeChanged, "%s changed while it was hashed", m.Path)
	}
	ss.nextHandle++
	ss.handles[h.id] = h
	ss.fileOpened(h)
	e := entryOf(fi.Name(), fi)
	e.Size = uint64(size)
	ss.withMeta(&e, func() *protocol.Meta { return ss.fdMeta(int(f.Fd())) })
	ss.log.Debug("open", "path", m.Path, "size", fi.Size(), "chunk", cs, "alg", alg.String(), "digests_cached", cached)
	return &protocol.OpenReply{Handle: h.id, ChunkSize: uint32(cs), Algorithm: uint8(alg),
		Chunks: uint32(layout.Chunks()), Flags: openFlags(h), FileDigest: fd, Entry: e}
}

// file reports whether h is a file open for reading (not a pack or a push).
func (h *handle) file() bool { return !h.packed && h.push == nil && h.walk == nil }

// changed reports whether the file's size or mtime (for a block device,
// its size or write counters) differ from open time.
func (h *handle) changed() bool {
	fi, err := h.f.Stat()
	if err != nil {
		return true
	}
	if h.blockdev {
		size, err := blockdev.Size(h.f)
		return err != nil || size != h.size || blockdev.Generation(fi) != h.mtime
	}
	return fi.Size() != h.size || fi.ModTime().UnixNano() != h.mtime
}

// openDigests gives h its digests: a winDigests, which hashes nothing yet
// beyond the first window, and no file digest (it comes at Close). With
// no digest algorithm, the empty list of the whole file.
func (ss *session) openDigests(ctx context.Context, h *handle, alg chunker.Algorithm) (fd []byte, cached bool, perr *protocol.Error) {
	if alg.Size() > 0 {
		if perr := ss.digestRoomFor(h.path, digestWindowBytes(h.layout, alg, ss.srv.cfg.MaxWindow), h.layout, alg); perr != nil {
			return nil, false, perr
		}
		h.wd = ss.newWinDigests(h.f, h.layout, alg, h.blockdev)
		return []byte{}, false, nil
	}
	if perr := ss.digestRoom(h.path, h.layout, alg); perr != nil {
		return nil, false, perr
	}
	digests, cached, err := ss.hashed(ctx, h.f, h.layout, alg)
	if err != nil {
		return nil, false, errf(protocol.CodeInternal, "hashing %s: %v", h.path, err)
	}
	fd, err = chunker.FileDigest(alg, h.layout, digests)
	if err != nil {
		return nil, false, errf(protocol.CodeInternal, "%v", err)
	}
	h.digests = digests
	return fd, cached, nil
}

func (ss *session) digestsReply(ctx context.Context, m *protocol.Digests) protocol.Message {
	h := ss.handles[m.Handle]
	if h == nil || !h.file() {
		return errf(protocol.CodeBadRequest, "no file handle %d", m.Handle)
	}
	if h.wd != nil {
		n := h.layout.Chunks()
		if int64(m.First) >= int64(n) || m.Count == 0 {
			return errf(protocol.CodeBadRequest, "chunks %d+%d of %d", m.First, m.Count, n)
		}
		count := min(int(m.Count), protocol.MaxDigestsPerReply(h.wd.alg.Size()))
		b, err := h.wd.get(ctx, int(m.First), count)
		if errors.Is(err, chunker.ErrChanged) {
			return errf(protocol.CodeChanged, "%s changed while it was hashed", h.path)
		}
		if err != nil {
			return errf(protocol.CodeInternal, "%s: %v", h.path, err)
		}
		return &protocol.DigestsReply{Handle: h.id, First: m.First, Digests: b}
	}
	n := h.digests.Len()
	if int64(m.First) > int64(n) {
		return errf(protocol.CodeBadRequest, "chunk %d past the last (%d)", m.First, n)
	}
	size := h.digests.Algorithm().Size()
	count := min(int(m.Count), n-int(m.First), protocol.MaxDigestsPerReply(size))
	b := make([]byte, 0, count*size)
	for i := range count {
		b = append(b, h.digests.At(int(m.First)+i)...)
	}
	return &protocol.DigestsReply{Handle: h.id, First: m.First, Digests: b}
}

// extentsReply answers Extents: a page of the file's data ranges.
func (ss *session) extentsReply(m *protocol.Extents) protocol.Message {
	h := ss.handles[m.Handle]
	if h == nil || !h.file() {
		return errf(protocol.CodeBadRequest, "no file handle %d", m.Handle)
	}
	if m.Offset > uint64(h.size) {
		return errf(protocol.CodeBadRequest, "extents from %d of a %d-byte file", m.Offset, h.size)
	}
	xs, next, err := extents(h.f, h.blockdev, int64(m.Offset), h.size, protocol.MaxExtentsPerReply)
	if err != nil {
		return errf(protocol.CodeInternal, "finding the data of %s: %v", h.path, err)
	}
	return &protocol.ExtentsReply{Handle: h.id, Next: uint64(next), Extents: xs}
}

func (ss *session) closeHandle(h *handle) {
	ss.fileClosed(h)
	for _, w := range h.windows {
		ss.unmap(h, w)
	}
	if h.wd != nil {
		h.wd.stop() // before the file closes under it
	}
	if h.f != nil {
		h.f.Close()
	}
	if h.push != nil {
		h.push.free(ss)
	}
	if h.walk != nil {
		h.walk.close()
	}
	delete(ss.handles, h.id)
}
