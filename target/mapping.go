package target

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
	"golang.org/x/sys/unix"
)

// Mapping file ranges for READs: a window of an open file mapped (or
// staged), registered, bound to memory windows per data QP, its keys
// handed out, and unmapped or revoked.

// dataQPs is a snapshot of the session's data QPs, for keys or READs;
// BadRequest if none have joined. Some may be dead, or die while in use:
// a post on one fails or completes with an error status, and bind leaves
// its key unbound. Keys may be made from the snapshot, so no new index
// may join until thaw.
func (ss *session) dataQPs() ([]verbs.QP, *protocol.Error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.awaitJoins()
	if len(ss.data) == 0 {
		return nil, errf(protocol.CodeBadRequest, "no data QPs have joined the session")
	}
	for i, qp := range ss.data {
		if qp == nil {
			return nil, errf(protocol.CodeBadRequest, "data QP %d has not joined (of %d)", i, len(ss.data))
		}
	}
	for i := range ss.joining { // awaitJoins gave up on it
		if i >= len(ss.data) {
			return nil, errf(protocol.CodeBadRequest, "data QP %d is still joining", i)
		}
	}
	ss.frozen = true
	return append([]verbs.QP(nil), ss.data...), nil
}

// thaw lets new indexes join again if no window is mapped (under hmu,
// which guards the count of windows).
func (ss *session) thaw() {
	ss.mu.Lock()
	ss.frozen = ss.windows > 0
	ss.mu.Unlock()
}

// mapWindow maps file bytes for RDMA READ: an mmap of exactly the asked
// range (clipped to the window limit and the file), registered as its
// own MR, with a memory window bound per data QP where the device has
// them. The keys work only on this session's QPs. Where the window
// budget or the session's share of it can't hold the whole range, the
// window is shorter: whole chunks of the handle's layout, at least one
// (the initiator reads the chunks a window holds and maps the rest
// next); where it can't hold one, the answer is TooMany ("busy").
func (ss *session) mapWindow(ctx context.Context, m *protocol.Map) protocol.Message {
	cfg := &ss.srv.cfg
	h := ss.handles[m.Handle]
	if h == nil || !h.file() {
		return errf(protocol.CodeBadRequest, "no file handle %d", m.Handle)
	}
	if ss.windows >= cfg.MaxWindowsPerSession {
		return errf(protocol.CodeTooMany, "%d windows mapped in this session", ss.windows)
	}
	size := uint64(h.size)
	if m.Offset >= size || m.Length == 0 || m.Offset%uint64(os.Getpagesize()) != 0 {
		return errf(protocol.CodeBadRequest, "window at %d+%d of a %d-byte file", m.Offset, m.Length, size)
	}
	if h.changed() {
		return errf(protocol.CodeChanged, "%s changed since it was opened", h.path)
	}
	if h.wd != nil {
		h.wd.reach(h.wd.windowOf(m.Offset)) // hash it while the one before is read
	}
	qps, perr := ss.dataQPs()
	if perr != nil {
		return perr
	}
	n := min(m.Length, cfg.MaxWindow, size-m.Offset)
	least := wholeChunk(h.layout, m.Offset, n)
	got, perr := ss.srv.reserve(ss, n, least)
	if perr != nil {
		return perr
	}
	if got < n {
		// Shorter: it ends on a chunk boundary (or the file's end).
		end := m.Offset + got
		if end < size {
			end -= end % uint64(h.layout.ChunkSize)
		}
		ss.srv.release(ss, got-(end-m.Offset))
		n = end - m.Offset
		ss.log.Debug("window shortened to fit the budget", "path", h.path, "asked", m.Length, "granted", n)
	}
	mapping, err := unix.Mmap(int(h.f.Fd()), int64(m.Offset), int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		ss.srv.release(ss, n)
		return errf(protocol.CodeInternal, "mmap %s: %v", h.path, err)
	}
	w := &window{id: ss.nextWindow, off: m.Offset, mapping: mapping, size: n, at: time.Now()}
	access := verbs.AccessRemoteRead
	useMWs := ss.mws
	if useMWs {
		access |= verbs.AccessMWBind
	}
	w.mr, err = ss.register(mapping, access)
	if errors.Is(err, syscall.EFAULT) && useMWs {
		// The kernel pins MW_BIND regions for writing, which a read-only
		// file mapping refuses: register for READ alone (still zero-copy
		// where the kernel allows it) and hand out the MR's key, which is
		// this session's alone and dies with the window all the same.
		access = verbs.AccessRemoteRead
		if w.mr, err = ss.register(mapping, access); err == nil {
			useMWs = false
		}
	}
	if errors.Is(err, syscall.EFAULT) {
		// Some kernels (rxe on 6.1) can't pin a read-only shared file
		// mapping: stage the window through a registered bounce buffer.
		ss.srv.noteStaged(ss.log)
		if ss.mws {
			access |= verbs.AccessMWBind
			useMWs = true
		}
		w.mr, err = ss.stage(h, w, access)
	}
	if err != nil {
		ss.freeWindow(w)
		return errf(protocol.CodeInternal, "register %s: %v", h.path, err)
	}
	if h.wd != nil { // the window starts on a page, so on a span
		attachSpans(w.mr, &spanView{wd: h.wd, base: chunker.Spans(int64(w.off))})
	}
	rkeys, perr := ss.keys(ctx, w, qps, useMWs)
	if perr != nil {
		return perr
	}
	ss.nextWindow++
	ss.windows++
	ss.srv.met.windows.Inc()
	ss.windowMapped(h, n)
	h.windows[w.id] = w
	return &protocol.MapReply{Handle: h.id, Window: protocol.Window{ID: w.id, Offset: w.off, Length: n, Addr: w.mr.Addr(), RKeys: rkeys}}
}

// wholeChunk is the least of a window of n bytes at off that holds a
// whole chunk of l: up to the end of the first chunk that starts at off
// or after it (or the file's end), and all n where that is more than n.
func wholeChunk(l chunker.Layout, off, n uint64) uint64 {
	cs := uint64(l.ChunkSize)
	first := (off + cs - 1) / cs * cs
	end := min(first+cs, uint64(l.Size))
	if end <= off || end-off > n {
		return n
	}
	return end - off
}

// stage replaces w's file mapping with anonymous memory holding a copy
// of the same bytes, and registers that.
func (ss *session) stage(h *handle, w *window, access verbs.Access) (verbs.MR, error) {
	n := len(w.mapping)
	unix.Munmap(w.mapping)
	w.mapping = nil
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	w.mapping = buf
	if _, err := h.f.ReadAt(buf, int64(w.off)); err != nil {
		return nil, fmt.Errorf("staging %s: %w", h.path, err)
	}
	return ss.register(buf, access)
}

// bind binds one memory window per data QP over the whole of w's MR on
// the QP's device. A dead QP's window is left unbound (key 0), or bound
// to it, as is one of a QP on a device w is not registered on (a
// replacement that joined on another device): either serves nothing,
// and the live QPs' keys still work.
func (ss *session) bind(ctx context.Context, w *window, qps []verbs.QP, devs []*sdev) error {
	w.mws = make([]verbs.MW, len(qps))
	posted := map[*sdev]int{}
	for i, qp := range qps {
		d := devs[i]
		if d == nil || dead(qp) || mrOn(w.mr, d) == nil {
			continue
		}
		mw, err := d.pd.AllocMW()
		if err != nil {
			return err
		}
		w.mws[i] = mw
		mr := mrOn(w.mr, d)
		wr := verbs.SendWR{ID: bindMark | uint64(i), Op: verbs.OpBindMW, MW: mw, BindMR: mr,
			BindAddr: mr.Addr(), BindLen: mr.Len(), BindAccess: verbs.AccessRemoteRead}
		if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil {
			if dead(qp) {
				continue
			}
			return err
		}
		posted[d]++
	}
	for d, n := range posted {
		if err := waitBinds(ctx, d.scq, qps, n); err != nil {
			return err
		}
	}
	return nil
}

// bindMark marks the work request ID of a bind: bindMark | the data
// QP's index. The session's data send CQs have one other user, the READ
// engine of a push (reads/), whose IDs carry bit 63; a completion of its
// still in a CQ (a READ flushed after its engine ended) is not a bind's,
// and waitBinds passes over it rather than failing the Map.
const bindMark = 1 << 62

// waitBinds waits for n bind completions of qps' on cq, their device's
// data send CQ.
func waitBinds(ctx context.Context, cq verbs.CQ, qps []verbs.QP, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	comps := make([]verbs.Completion, n)
	for got := 0; got < n; {
		k, err := cq.Poll(comps[:n-got])
		if err != nil {
			return err
		}
		for _, c := range comps[:k] {
			if c.WRID&bindMark == 0 {
				continue // not a bind's
			}
			i := c.WRID &^ bindMark
			if i >= uint64(len(qps)) {
				return fmt.Errorf("bind: completion for unknown request %#x", c.WRID)
			}
			if c.Status != verbs.StatusSuccess && !dead(qps[i]) {
				return fmt.Errorf("bind on data QP %d: %w", i, c.Status)
			}
			got++
		}
		if k == 0 {
			if err := cq.Wait(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// keys returns a registered window's key for each data QP: a memory
// window bound on each (withMWs, where every device has them), else the
// MR's own key on the QP's device (0 for a QP on a device the window is
// not registered on: see bind). On error it frees the window.
func (ss *session) keys(ctx context.Context, w *window, qps []verbs.QP, withMWs bool) ([]uint32, *protocol.Error) {
	devs := ss.devsOf(qps)
	rkeys := make([]uint32, len(qps))
	for _, d := range devs {
		if d != nil && !d.dev.Caps().MemoryWindows {
			withMWs = false
		}
	}
	if !withMWs {
		for i, d := range devs {
			if mr := mrOnQP(w.mr, d); mr != nil {
				rkeys[i] = mr.RKey()
			}
		}
		return rkeys, nil
	}
	if err := ss.bind(ctx, w, qps, devs); err != nil {
		ss.freeWindow(w)
		return nil, errf(protocol.CodeInternal, "bind windows: %v", err)
	}
	for i, mw := range w.mws {
		if mw != nil {
			rkeys[i] = mw.RKey()
		}
	}
	return rkeys, nil
}

func (ss *session) unmap(h *handle, w *window) {
	delete(h.windows, w.id)
	ss.windows--
	ss.srv.met.windows.Dec()
	ss.freeWindow(w)
	ss.noteReadResponses()
}

// freeWindow revokes a window's keys and releases its memory. Windows go
// before MRs, and MRs before the mapping, so no key outlives its memory.
func (ss *session) freeWindow(w *window) {
	for _, mw := range w.mws {
		if mw != nil {
			mw.Close()
		}
	}
	if w.mr != nil {
		w.mr.Close()
	}
	if w.pack {
		ss.spare.put(ss, w.mapping, w.size, true)
		return
	}
	if w.mapping != nil {
		unix.Munmap(w.mapping)
	}
	ss.srv.release(ss, w.size)
}

// revoke closes the files the session opened from x.
func (ss *session) revoke(x *export) {
	ss.hmu.Lock()
	defer ss.hmu.Unlock()
	for _, h := range ss.handles {
		if h.export == x {
			ss.log.Info("export removed: closing file", "path", h.path)
			h.acc.result = "export removed"
			ss.closeHandle(h)
		}
	}
	ss.thaw()
}
