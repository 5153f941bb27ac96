package target

import (
	"context"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// maxPackFiles caps the files one Pack packs, whatever fits.
const maxPackFiles = 1024

// maxPackMessage bounds the message of a file that fails once packed.
const maxPackMessage = 32

// packed is a file Pack will copy into its window.
type packed struct {
	f    *os.File
	fi   os.FileInfo
	idx  int // in the reply's Files
	size int64
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
	ss.mu.Lock()
	qps := append([]verbs.QP(nil), ss.data...)
	ss.mu.Unlock()
	if len(qps) == 0 {
		return errf(protocol.CodeBadRequest, "no data QPs have joined the session")
	}
	reply := &protocol.PackReply{}
	size := protocol.PackReplyOverhead(len(qps))
	dsize := alg.Size()
	var files []packed
	defer func() {
		for _, p := range files {
			p.f.Close()
		}
	}()
	var total uint64
	var x0 *export
	for _, p := range m.Paths {
		if len(reply.Files) >= maxPackFiles {
			break
		}
		pf, pk, ok := ss.packOne(p, &x0)
		if ok && pk.size > 0 && total+uint64(pk.size) > cfg.MaxWindow {
			if uint64(pk.size) > cfg.MaxWindow {
				pk.f.Close()
				pf = protocol.PackedFile{Code: protocol.CodeTooMany, Entry: pf.Entry, Message: "too large to pack"}
				ok = false
			} else {
				pk.f.Close()
				break // full: the initiator asks again
			}
		}
		n := protocol.PackedFileSize(pf)
		if ok {
			n += max(dsize, maxPackMessage) // a digest, or why it failed after all
		}
		if size+n > protocol.MaxMessage {
			if ok {
				pk.f.Close()
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
	w := &window{id: ss.nextWindow}
	rkeys := make([]uint32, len(qps))
	if total > 0 {
		if !ss.srv.reserve(total) {
			return errf(protocol.CodeTooMany, "window budget of %d bytes in use; retry", cfg.WindowBudget)
		}
		w.size = total
		buf, err := unix.Mmap(-1, 0, int(total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			ss.srv.release(total)
			return errf(protocol.CodeInternal, "pack buffer: %v", err)
		}
		w.mapping = buf
		for _, p := range files {
			pf := &reply.Files[p.idx]
			data := buf[pf.Offset : pf.Offset+uint64(p.size)]
			_, err := p.f.ReadAt(data, 0)
			if err == io.EOF {
				err = nil
			}
			fi, serr := p.f.Stat()
			switch {
			case err != nil:
				ss.log.Warn("pack: read failed", "file", pf.Entry.Name, "err", err)
				*pf = protocol.PackedFile{Code: protocol.CodeInternal, Entry: pf.Entry, Message: "read failed"}
			case serr != nil || fi.Size() != p.size || !fi.ModTime().Equal(p.fi.ModTime()):
				*pf = protocol.PackedFile{Code: protocol.CodeChanged, Entry: pf.Entry, Message: "changed while it was packed"}
			default:
				pf.Digest = chunker.Sum(alg, data)
			}
		}
		access := verbs.AccessRemoteRead
		if ss.mws {
			access |= verbs.AccessMWBind
		}
		if w.mr, err = ss.pd.RegMR(buf, access); err != nil {
			ss.freeWindow(w)
			return errf(protocol.CodeInternal, "register pack: %v", err)
		}
		if ss.mws {
			if err := ss.bind(ctx, w, qps); err != nil {
				ss.freeWindow(w)
				return errf(protocol.CodeInternal, "bind windows: %v", err)
			}
			for i, mw := range w.mws {
				rkeys[i] = mw.RKey()
			}
		} else {
			for i := range rkeys {
				rkeys[i] = w.mr.RKey()
			}
		}
		reply.Window = protocol.Window{ID: w.id, Length: total, Addr: w.mr.Addr(), RKeys: rkeys}
	} else {
		reply.Window = protocol.Window{ID: w.id, RKeys: rkeys}
	}
	for i := range reply.Files {
		if f := &reply.Files[i]; f.Code == 0 && alg.Size() > 0 && f.Digest == nil {
			f.Digest = chunker.Sum(alg, nil) // an empty file
		}
	}
	h := &handle{id: ss.nextHandle, export: x0, path: "(pack)", packed: true, windows: map[uint32]*window{w.id: w}}
	ss.nextHandle++
	ss.nextWindow++
	ss.windows++
	ss.handles[h.id] = h
	reply.Handle = h.id
	ss.log.Debug("pack", "files", len(reply.Files), "packed", len(files), "bytes", total)
	return reply
}

// packOne opens one file for pack. All files of a pack must come from one
// export (x0 is set by the first), so removing the export revokes it.
func (ss *session) packOne(p string, x0 **export) (protocol.PackedFile, packed, bool) {
	x, rel, perr := ss.srv.resolve(p)
	if perr != nil {
		return protocol.PackedFile{Code: perr.Code, Message: perr.Message}, packed{}, false
	}
	if *x0 == nil {
		*x0 = x
	} else if x != *x0 {
		return protocol.PackedFile{Code: protocol.CodeBadRequest, Message: p + ": a pack's files must be in one export"}, packed{}, false
	}
	f, err := x.open(rel)
	if err != nil {
		e := fsError(p, err)
		return protocol.PackedFile{Code: e.Code, Message: e.Message}, packed{}, false
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		e := fsError(p, err)
		return protocol.PackedFile{Code: e.Code, Message: e.Message}, packed{}, false
	}
	e := entryOf(path.Base(p), fi)
	if !fi.Mode().IsRegular() {
		f.Close()
		return protocol.PackedFile{Code: protocol.CodeUnsupported, Entry: e, Message: p + " is not a regular file"}, packed{}, false
	}
	return protocol.PackedFile{Entry: e}, packed{f: f, fi: fi, size: fi.Size()}, true
}
