package target

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// A push runs the other way: the initiator registers windows of its file
// and the target READs them over the session's data QPs into staging
// slots, verifies each chunk against the initiator's digest and writes it
// to a temporary file beside the destination, which is renamed into place
// only on PushCommit. The temporary file goes on any failure.

// pushReadSize is the most bytes one of the target's READs moves.
const pushReadSize = 1 << 20

// maxPushRetries caps the re-reads of a chunk an initiator may ask for.
const maxPushRetries = 16

// pushDrain bounds the wait for READs still in flight when a window fails.
const pushDrain = 5 * time.Second

// pushWRID marks the work request IDs of a push's READs.
const pushWRID = 1 << 63

type push struct {
	x        *export
	dst      string // the destination, relative to the export root
	tmp      string // the temporary file, relative to the export root
	f        *os.File
	layout   chunker.Layout
	alg      chunker.Algorithm
	retries  int
	mode     uint32
	mtime    int64
	next     int64  // where the next window starts
	sums     []byte // digests of the chunks written so far
	qps      []verbs.QP
	depth    int // READs in flight per data QP
	readSize int
	slots    int // staging slots of one chunk each
	buf      *verbs.Buffer
	mr       verbs.MR
	reserved uint64 // bytes of the window budget the slots hold
	done     bool   // committed
}

// singleName reports whether s is one path element, as a file name must be.
func singleName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

// pushDest is where a file pushed to rel lands: rel itself, or rel/name if
// rel is a directory (symlinks inside the export followed).
func (x *export) pushDest(p, rel, name string) (string, *protocol.Error) {
	fi, err := x.root.Stat(rel)
	switch {
	case err == nil && fi.IsDir():
		if !singleName(name) {
			return "", errf(protocol.CodeBadRequest, "file name %q is not a single path element", name)
		}
		rel = path.Join(rel, name)
		p = path.Join(p, name)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", fsError(p, err)
	}
	fi, err = x.root.Lstat(rel)
	switch {
	case err == nil && fi.IsDir():
		return "", errf(protocol.CodeIsDir, "%s is a directory", p)
	case err == nil && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0:
		return "", errf(protocol.CodeUnsupported, "%s exists and is neither a regular file nor a symlink", p)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", fsError(p, err)
	}
	return rel, nil
}

// pushFile answers Push: it checks the destination, creates the
// temporary file with the file's space reserved, and sets up staging.
func (ss *session) pushFile(m *protocol.Push) protocol.Message {
	cfg := &ss.srv.cfg
	alg, cs, perr := ss.newHandle(m.Algorithm, m.ChunkSize)
	if perr != nil {
		return perr
	}
	if uint64(cs) > cfg.MaxWindow {
		return errf(protocol.CodeBadRequest, "chunk size %d is over the target's max window %d", cs, cfg.MaxWindow)
	}
	if m.Size > math.MaxInt64 {
		return errf(protocol.CodeBadRequest, "file size %d", m.Size)
	}
	layout := chunker.Layout{Size: int64(m.Size), ChunkSize: cs}
	if layout.Chunks() > math.MaxUint32 {
		return errf(protocol.CodeBadRequest, "%d bytes in chunks of %d is more than 2^32-1 chunks", m.Size, cs)
	}
	qps, perr := ss.dataQPs()
	if perr != nil {
		return perr
	}
	depth := cfg.PushDepth
	for i, qp := range qps {
		depth = min(depth, qp.Info().ReadsOut)
		if depth < 1 {
			return errf(protocol.CodeBadRequest, "data QP %d takes no READs from the target (ORD 0)", i)
		}
	}
	x, rel, perr := ss.srv.resolve(m.Path)
	if perr != nil {
		return perr
	}
	if x.root == nil {
		return errf(protocol.CodeNotDir, "export %q is a file; push into a directory export", x.Name)
	}
	if !x.Writable {
		return errf(protocol.CodeReadOnly, "export %q is read-only", x.Name)
	}
	dst, perr := x.pushDest(m.Path, rel, m.Name)
	if perr != nil {
		return perr
	}
	p := &push{x: x, dst: dst, layout: layout, alg: alg, retries: min(int(m.Retries), maxPushRetries),
		mode: m.Mode & 0o777, mtime: m.MtimeNs, qps: qps, depth: depth}
	if perr := ss.pushSetup(p); perr != nil {
		p.free(ss)
		return perr
	}
	h := &handle{id: ss.nextHandle, export: x, path: x.Name + "/" + dst, push: p}
	ss.nextHandle++
	ss.handles[h.id] = h
	ss.log.Debug("push", "path", h.path, "size", m.Size, "chunk", cs, "alg", alg, "tmp", p.tmp)
	return &protocol.PushReply{Handle: h.id, ChunkSize: uint32(cs), Algorithm: uint8(alg),
		Chunks: uint32(layout.Chunks()), Path: h.path}
}

// pushSetup creates p's temporary file and its staging slots.
func (ss *session) pushSetup(p *push) *protocol.Error {
	cfg := &ss.srv.cfg
	var r [6]byte
	rand.Read(r[:])
	base := path.Base(p.dst)
	if len(base) > 200 {
		base = base[:200] // leave room for the rest within NAME_MAX
	}
	tmp := path.Join(path.Dir(p.dst), "."+base+".rdmacp-"+hex.EncodeToString(r[:])+".part")
	f, err := p.x.root.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fsError(p.x.Name+"/"+p.dst, err)
	}
	p.tmp, p.f = tmp, f // only now is it ours to remove
	if err := allocate(f, p.layout.Size); err != nil {
		return writeError(p, "reserving", err)
	}
	cs := p.layout.ChunkSize
	p.readSize = int(min(int64(pushReadSize), cs, int64(min(cfg.Device.Caps().MaxMsgSize, 1<<30))))
	// Enough slots for the READs in flight and one more, within a window.
	inflight := int64(len(p.qps) * p.depth * p.readSize)
	p.slots = int(min((inflight+cs-1)/cs+1, int64(cfg.MaxWindow)/cs, int64(max(p.layout.Chunks(), 1))))
	n := uint64(p.slots) * uint64(cs)
	if !ss.srv.reserve(n) {
		return errf(protocol.CodeTooMany, "window budget of %d bytes in use; retry", cfg.WindowBudget)
	}
	p.reserved = n
	if p.buf, err = verbs.AllocBuffer(int(n)); err != nil {
		return errf(protocol.CodeInternal, "staging: %v", err)
	}
	if p.mr, err = ss.pd.RegMR(p.buf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return errf(protocol.CodeInternal, "register staging: %v", err)
	}
	return nil
}

// allocate reserves size bytes for f, so that a full disk shows at once.
func allocate(f *os.File, size int64) error {
	if size <= 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		err = f.Truncate(size)
	}
	return err
}

// writeError words a failure to write p's file.
func writeError(p *push, op string, err error) *protocol.Error {
	dst := p.x.Name + "/" + p.dst
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EDQUOT) {
		return errf(protocol.CodeNoSpace, "%s %s: %v", op, dst, err)
	}
	return errf(protocol.CodeInternal, "%s %s: %v", op, dst, err)
}

// free releases p's staging and, unless p was committed, its temporary file.
func (p *push) free(ss *session) {
	if p.mr != nil {
		p.mr.Close()
		p.mr = nil
	}
	if p.buf != nil {
		p.buf.Free()
		p.buf = nil
	}
	if p.reserved > 0 {
		ss.srv.release(p.reserved)
		p.reserved = 0
	}
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
	if !p.done && p.tmp != "" {
		if err := p.x.root.Remove(p.tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			ss.log.Warn("push: removing the temporary file", "path", p.tmp, "err", err)
		}
		p.tmp = ""
	}
}

// pushHandle returns the push of handle id, or nil.
func (ss *session) pushHandle(id uint32) (*handle, *push) {
	h := ss.handles[id]
	if h == nil || h.push == nil {
		return nil, nil
	}
	return h, h.push
}

// pushWindow answers PushWindow: READ, verify and write the window. Any
// error abandons the push.
func (ss *session) pushWindow(ctx context.Context, m *protocol.PushWindow) protocol.Message {
	h, p := ss.pushHandle(m.Handle)
	if p == nil {
		return errf(protocol.CodeBadRequest, "no push handle %d", m.Handle)
	}
	reply, perr := ss.pullWindow(ctx, p, m)
	if perr != nil {
		ss.log.Warn("push abandoned", "path", h.path, "err", perr.Message)
		ss.closeHandle(h)
		return perr
	}
	reply.Handle = h.id
	return reply
}

// checkWindow validates a window from the network against p; it returns
// the window's chunks [first, end).
func (p *push) checkWindow(m *protocol.PushWindow) (first, end int, perr *protocol.Error) {
	w := &m.Window
	size, cs := uint64(p.layout.Size), uint64(p.layout.ChunkSize)
	switch {
	case w.Offset != uint64(p.next):
		return 0, 0, errf(protocol.CodeBadRequest, "window at %d, want the next at %d", w.Offset, p.next)
	case w.Length == 0 || w.Length > size-w.Offset:
		return 0, 0, errf(protocol.CodeBadRequest, "window of %d bytes at %d of a %d-byte file", w.Length, w.Offset, size)
	case (w.Offset+w.Length)%cs != 0 && w.Offset+w.Length != size:
		return 0, 0, errf(protocol.CodeBadRequest, "window %d+%d does not end on a chunk", w.Offset, w.Length)
	case w.Addr+w.Length < w.Addr:
		return 0, 0, errf(protocol.CodeBadRequest, "window address %#x+%d wraps", w.Addr, w.Length)
	case len(w.RKeys) != len(p.qps):
		return 0, 0, errf(protocol.CodeBadRequest, "%d keys for %d data QPs", len(w.RKeys), len(p.qps))
	}
	first = int(w.Offset / cs)
	end = int((w.Offset + w.Length + cs - 1) / cs)
	if want := (end - first) * p.alg.Size(); len(m.Digests) != want {
		return 0, 0, errf(protocol.CodeBadRequest, "%d bytes of digests for %d chunks, want %d", len(m.Digests), end-first, want)
	}
	return first, end, nil
}

// pslot is a staging slot: a chunk being read into it.
type pslot struct {
	idx   int // chunk
	off   int64
	n     int
	left  int // READs outstanding
	tries int
}

type ppiece struct {
	slot int
	off  int // within the chunk
	n    int
}

// pullWindow READs a window's chunks into the staging slots, striped over
// the data QPs, and verifies and writes each one as it completes.
func (ss *session) pullWindow(ctx context.Context, p *push, m *protocol.PushWindow) (*protocol.PushWindowReply, *protocol.Error) {
	first, end, perr := p.checkWindow(m)
	if perr != nil {
		return nil, perr
	}
	w := &m.Window
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A data QP that fails flushes its READs, which says why; the
	// control QP has none to flush.
	go func() {
		select {
		case <-ss.ch.QP().Done():
			cancel(fmt.Errorf("control connection lost: %v", ss.ch.QP().Err()))
		case <-ctx.Done():
		}
	}()

	cs := p.layout.ChunkSize
	ds := p.alg.Size()
	cq := ss.dataSCQ
	slots := make([]pslot, p.slots)
	free := make([]int, 0, p.slots)
	for i := p.slots - 1; i >= 0; i-- {
		free = append(free, i)
	}
	var queue []ppiece
	inflight := make([]int, len(p.qps))
	outstanding := 0
	enqueue := func(s int) {
		sl := &slots[s]
		sl.left = 0
		for off := 0; off < sl.n; off += p.readSize {
			queue = append(queue, ppiece{slot: s, off: off, n: min(p.readSize, sl.n-off)})
			sl.left++
		}
	}
	reply := &protocol.PushWindowReply{Offset: w.Offset}
	// fail waits for the READs still out, so that none lands in the
	// staging slots after they are reused or freed.
	fail := func(e *protocol.Error) (*protocol.PushWindowReply, *protocol.Error) {
		ss.drain(cq, &outstanding)
		return nil, e
	}
	comps := make([]verbs.Completion, 64)
	wrs := make([]verbs.SendWR, 0, p.depth)
	var sum []byte
	next, done := first, 0
	for done < end-first {
		for next < end && len(free) > 0 {
			s := free[len(free)-1]
			free = free[:len(free)-1]
			off, n := p.layout.Chunk(next)
			slots[s] = pslot{idx: next, off: off, n: int(n)}
			enqueue(s)
			next++
		}
		// Post to the least busy QPs, up to their depth.
		for len(queue) > 0 {
			q := 0
			for i, n := range inflight {
				if n < inflight[q] {
					q = i
				}
			}
			room := p.depth - inflight[q]
			if room <= 0 {
				break
			}
			wrs = wrs[:0]
			for _, pc := range queue[:min(room, len(queue))] {
				sl := &slots[pc.slot]
				wrs = append(wrs, verbs.SendWR{
					ID: pushWRID | uint64(q)<<48 | uint64(pc.slot)<<24 | uint64(pc.off/p.readSize),
					Op: verbs.OpRead,
					Local: verbs.SGE{Addr: p.mr.Addr() + uint64(pc.slot)*uint64(cs) + uint64(pc.off),
						Length: uint32(pc.n), LKey: p.mr.LKey()},
					RemoteAddr: w.Addr + uint64(sl.off-int64(w.Offset)) + uint64(pc.off),
					RKey:       w.RKeys[q],
				})
			}
			posted, err := p.qps[q].PostSend(wrs)
			inflight[q] += posted
			outstanding += posted
			queue = queue[posted:]
			if err != nil {
				return fail(errf(protocol.CodeInternal, "post READ on data QP %d: %v", q, err))
			}
		}
		k, err := cq.Poll(comps)
		if err != nil {
			return fail(errf(protocol.CodeInternal, "poll: %v", err))
		}
		outstanding -= k // all of them: fail may leave some of the batch unread
		for _, c := range comps[:k] {
			q, s, piece := int(c.WRID>>48)&0x7fff, int(c.WRID>>24)&0xffffff, int(c.WRID&0xffffff)
			if c.WRID&pushWRID == 0 || q >= len(inflight) || s >= len(slots) {
				return fail(errf(protocol.CodeInternal, "completion for unknown request %#x", c.WRID))
			}
			inflight[q]--
			sl := &slots[s]
			if c.Status != verbs.StatusSuccess {
				why := ""
				if err := p.qps[q].Err(); err != nil {
					why = " (" + err.Error() + ")"
				}
				code := protocol.CodeInternal // the connection is gone
				switch c.Status {
				case verbs.StatusRemoteAccess, verbs.StatusRemoteInvalid, verbs.StatusRemoteOp:
					code = protocol.CodeBadRequest // the initiator's keys or addresses are wrong
				}
				return fail(errf(code, "READ of chunk %d on data QP %d: %v%s", sl.idx, q, c.Status, why))
			}
			reply.BytesRead += uint64(min(p.readSize, sl.n-piece*p.readSize))
			if sl.left--; sl.left > 0 {
				continue
			}
			data := p.buf.Bytes()[s*int(cs):][:sl.n]
			if ds > 0 {
				i := sl.idx - first
				sum = chunker.AppendSum(sum[:0], p.alg, data)
				if !chunker.Equal(sum, m.Digests[i*ds:(i+1)*ds]) {
					sl.tries++
					reply.Retries++
					if sl.tries > p.retries {
						return fail(errf(protocol.CodeVerify, "chunk %d (bytes %d-%d) failed its %v digest %d times", sl.idx, sl.off, sl.off+int64(sl.n), p.alg, sl.tries))
					}
					ss.log.Warn("push: chunk failed its digest; reading it again", "chunk", sl.idx, "try", sl.tries)
					enqueue(s)
					continue
				}
			}
			if _, err := p.f.WriteAt(data, sl.off); err != nil {
				return fail(writeError(p, "writing", err))
			}
			free = append(free, s)
			done++
		}
		if k > 0 || done == end-first {
			continue
		}
		wctx, wcancel := context.WithTimeout(ctx, ss.srv.cfg.IdleTimeout)
		err = cq.Wait(wctx)
		stalled := wctx.Err() != nil && ctx.Err() == nil
		wcancel()
		switch {
		case ctx.Err() != nil:
			return fail(errf(protocol.CodeInternal, "push abandoned: %v", context.Cause(ctx)))
		case stalled:
			return fail(errf(protocol.CodeInternal, "no READ completed for %v", ss.srv.cfg.IdleTimeout))
		case err != nil:
			return fail(errf(protocol.CodeInternal, "wait: %v", err))
		}
	}
	p.next = int64(w.Offset + w.Length)
	p.sums = append(p.sums, m.Digests...)
	return reply, nil
}

// drain collects the completions of the READs still outstanding, for a
// while: flushed ones come at once when the connection is gone.
func (ss *session) drain(cq verbs.CQ, outstanding *int) {
	ctx, cancel := context.WithTimeout(context.Background(), pushDrain)
	defer cancel()
	comps := make([]verbs.Completion, 64)
	for *outstanding > 0 {
		k, err := cq.Poll(comps[:min(len(comps), *outstanding)])
		if err == nil && k == 0 {
			err = cq.Wait(ctx)
		}
		if err != nil {
			// Their completions would be taken for later requests' own:
			// the session can't go on.
			ss.log.Warn("push: READs still in flight after the drain timeout; ending the session", "reads", *outstanding, "err", err)
			ss.shutdown()
			return
		}
		*outstanding -= k
	}
}

// pushCommit answers PushCommit: check the whole file, then sync and
// rename it into place.
func (ss *session) pushCommit(m *protocol.PushCommit) protocol.Message {
	h, p := ss.pushHandle(m.Handle)
	if p == nil {
		return errf(protocol.CodeBadRequest, "no push handle %d", m.Handle)
	}
	perr := p.commit(m.FileDigest)
	if perr != nil {
		ss.log.Warn("push abandoned", "path", h.path, "err", perr.Message)
	} else {
		ss.log.Info("pushed", "path", h.path, "bytes", p.layout.Size)
	}
	ss.closeHandle(h)
	if perr != nil {
		return perr
	}
	return &protocol.Ack{}
}

func (p *push) commit(fileDigest []byte) *protocol.Error {
	dst := p.x.Name + "/" + p.dst
	if p.next != p.layout.Size {
		return errf(protocol.CodeBadRequest, "commit of %s with %d of %d bytes written", dst, p.next, p.layout.Size)
	}
	d, err := chunker.MakeDigests(p.alg, p.layout.Chunks(), p.sums)
	if err != nil {
		return errf(protocol.CodeInternal, "%v", err)
	}
	fd, err := chunker.FileDigest(p.alg, p.layout, d)
	if err != nil {
		return errf(protocol.CodeInternal, "%v", err)
	}
	if !chunker.Equal(fd, fileDigest) {
		return errf(protocol.CodeVerify, "whole-file digest of %s is %s, the initiator says %s", dst,
			chunker.FormatDigest(p.alg, fd), chunker.FormatDigest(p.alg, fileDigest))
	}
	if err := p.f.Chmod(fs.FileMode(p.mode)); err != nil {
		return writeError(p, "chmod", err)
	}
	mt := time.Unix(0, p.mtime) // before the sync, which then covers it
	if err := p.x.root.Chtimes(p.tmp, mt, mt); err != nil {
		return writeError(p, "chtimes", err)
	}
	if err := p.f.Sync(); err != nil {
		return writeError(p, "syncing", err)
	}
	err = p.f.Close()
	p.f = nil
	if err != nil {
		return writeError(p, "closing", err)
	}
	if err := p.x.root.Rename(p.tmp, p.dst); err != nil {
		return fsError(dst, err)
	}
	p.done = true
	if d, err := p.x.root.Open(path.Dir(p.dst)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
