package target

import (
	"context"
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
	"github.com/rdmacp/rdmacp/leftover"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
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

type push struct {
	x        *export
	dst      string   // the destination, relative to the export root
	dir      *os.Root // the destination's directory, held from the start
	tmp      string   // the temporary file's name in dir
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
	reserved uint64   // bytes of the window budget the slots hold
	done     bool     // committed
	landed   int64    // bytes pulled, verified and written, for the access log
	token    [16]byte // Push.Token: the push may be kept and resumed (keptpush.go)
	keep     bool     // its session was lost: keep it when freed
	live     bool     // counted in Server.live under its token (pushBegan)
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
	x, rel, perr := ss.resolve(m.Path, RightPush)
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
		mode: m.Mode & 0o777, mtime: m.MtimeNs, qps: qps, depth: depth, token: m.Token}
	if perr := ss.pushSetup(p); perr != nil {
		p.free(ss)
		return perr
	}
	h := &handle{id: ss.nextHandle, export: x, path: x.Name + "/" + dst, push: p}
	ss.nextHandle++
	ss.handles[h.id] = h
	ss.pushStarted(h)
	ss.log.Debug("push", "path", h.path, "size", m.Size, "chunk", cs, "alg", alg.String(), "tmp", p.tmp)
	return &protocol.PushReply{Handle: h.id, ChunkSize: uint32(cs), Algorithm: uint8(alg),
		Chunks: uint32(layout.Chunks()), Path: h.path, Resumed: uint64(p.next)}
}

// pushSetup gives p its temporary file (a kept push's, where p resumes
// one: see keptpush.go) and its staging slots.
func (ss *session) pushSetup(p *push) *protocol.Error {
	ss.resumeKept(p)
	if p.tmp == "" {
		if perr := ss.pushTemp(p); perr != nil {
			return perr
		}
	}
	return ss.pushStaging(p)
}

// resumeKept takes over the kept push of p's identity and token, if
// there is one: its temporary file, digests and progress when it is the
// same push; else the kept one goes, and p starts afresh.
func (ss *session) resumeKept(p *push) {
	if p.token == ([16]byte{}) {
		return
	}
	ss.srv.pushBegan(ss.identity(), p)
	k := ss.srv.takeKept(ss.identity(), p.token)
	if k == nil {
		return
	}
	if !k.sameSource(p) {
		ss.log.Info("push: a kept push of this token was of another source; starting over", "path", p.x.Name+"/"+p.dst)
		k.removeTemp(ss.srv)
		return
	}
	p.dir, p.tmp, p.f = k.dir, k.tmp, k.f
	p.next, p.sums, p.landed = k.next, k.sums, 0
	ss.log.Info("push resumed", "path", p.x.Name+"/"+p.dst, "from", p.next)
}

// pushTemp creates p's temporary file beside its destination, with its
// space reserved.
func (ss *session) pushTemp(p *push) *protocol.Error {
	// The temporary file lives in the destination's directory as it is
	// now, held open: a rename or a symlink swapped in for the directory
	// later can't send its removal or its rename anywhere else.
	dir, err := p.x.root.OpenRoot(path.Dir(p.dst))
	if err != nil {
		d := path.Join(p.x.Name, path.Dir(p.dst))
		if errors.Is(err, fs.ErrNotExist) {
			// The directory is missing, not the file (which is to be made).
			return errf(protocol.CodeNotFound, "%s: no such directory (the directory of %s/%s; a push makes files, not directories)", d, p.x.Name, p.dst)
		}
		return fsError(d, err)
	}
	p.dir = dir
	// What a daemon that was killed mid-push left here goes now: its
	// name says its pid is gone (leftover.Dead).
	for _, g := range leftover.Clean(dir, ".") {
		ss.log.Info("push: removed a temporary file a killed daemon left", "path", path.Join(p.x.Name, path.Dir(p.dst), g))
	}
	name := leftover.Name(path.Base(p.dst))
	f, err := dir.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fsError(p.x.Name+"/"+p.dst, err)
	}
	p.tmp, p.f = name, f // only now is it ours to remove
	if err := allocate(f, p.layout.Size); err != nil {
		return writeError(p, "reserving", err)
	}
	return nil
}

// pushStaging sizes p's READs and sets up its staging slots.
func (ss *session) pushStaging(p *push) *protocol.Error {
	cfg := &ss.srv.cfg
	var err error
	cs := p.layout.ChunkSize
	p.readSize = int(min(int64(pushReadSize), cs, int64(min(cfg.Device.Caps().MaxMsgSize, 1<<30))))
	// Enough slots for the READs in flight and one more, within a window.
	inflight := int64(len(p.qps) * p.depth * p.readSize)
	p.slots = int(min((inflight+cs-1)/cs+1, int64(cfg.MaxWindow)/cs, int64(max(p.layout.Chunks(), 1))))
	if perr := ss.digestRoom(p.x.Name+"/"+p.dst, p.layout, p.alg); perr != nil {
		return perr
	}
	// Fewer slots (one at least) where the budget or the session's share
	// can't hold them all.
	got, perr := ss.srv.reserve(ss, uint64(p.slots)*uint64(cs), uint64(cs))
	if perr != nil {
		return perr
	}
	p.slots = int(got / uint64(cs))
	n := uint64(p.slots) * uint64(cs)
	ss.srv.release(ss, got-n)
	p.reserved = n
	if p.buf, err = verbs.AllocBuffer(int(n)); err != nil {
		return errf(protocol.CodeInternal, "staging: %v", err)
	}
	if p.mr, err = ss.register(p.buf.Bytes(), verbs.AccessLocalWrite); err != nil {
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

// free releases p's staging and, unless p was committed or is to be
// kept for its initiator to resume (keptpush.go), its temporary file.
func (p *push) free(ss *session) {
	p.freeStaging(ss)
	superseded := ss.srv.pushEnded(ss.identity(), p)
	if p.keep {
		p.keep = false
		if !superseded {
			ss.srv.keepPush(ss.identity(), p)
			return
		}
		ss.log.Info("push not kept: a push of the same token has begun on another session", "path", p.x.Name+"/"+p.dst)
	}
	p.removeTemp(ss.srv)
}

// freeStaging releases what p holds of its session: staging and budget.
func (p *push) freeStaging(ss *session) {
	if p.mr != nil {
		p.mr.Close()
		p.mr = nil
	}
	if p.buf != nil {
		p.buf.Free()
		p.buf = nil
	}
	if p.reserved > 0 {
		ss.srv.release(ss, p.reserved)
		p.reserved = 0
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
		h.acc.result = "abandoned: " + perr.Message
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

// pullWindow READs a window's chunks into the staging slots with the READ
// engine, and verifies and writes each one as it completes.
func (ss *session) pullWindow(ctx context.Context, p *push, m *protocol.PushWindow) (*protocol.PushWindowReply, *protocol.Error) {
	// The data QPs as they are now: one the initiator replaced since the
	// last window takes its slot.
	if qps, perr := ss.dataQPs(); perr == nil && len(qps) == len(p.qps) {
		p.qps = qps
	}
	first, end, perr := p.checkWindow(m)
	if perr != nil {
		return nil, perr
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A data QP that fails is the engine's to route around; the control
	// QP going means the initiator is gone.
	go func() {
		select {
		case <-ss.ch.QP().Done():
			cancel(fmt.Errorf("control connection lost: %v", ss.ch.QP().Err()))
		case <-ctx.Done():
		}
	}()
	pw := &pushWindow{p: p, m: m, first: first, end: end, reply: &protocol.PushWindowReply{Offset: m.Window.Offset}}
	eng, err := reads.New(ctx, reads.Config{CQs: ss.sendCQs(), QPs: newFixedQPs(ss, p.qps), Depth: p.depth,
		Timeout: ss.srv.cfg.IdleTimeout, GroupDone: pw.chunkIn, Pace: ss.bucket()})
	if err != nil {
		return nil, errf(protocol.CodeInternal, "%v", err)
	}
	pw.eng = eng
	perr = pw.run(ctx, ss)
	if perr != nil {
		end := eng.Close // a chunk or the disk failed: the QPs are fine
		if pw.pathErr || ctx.Err() != nil {
			end = func() int { return eng.Abort(errors.New(perr.Message)) }
		}
		if left := end(); left > 0 {
			// Their completions would be taken for later binds' own:
			// the session can't go on.
			ss.log.Warn("push: READs still in flight after the drain; ending the session", "reads", left)
			ss.shutdown()
		}
		return nil, perr
	}
	eng.Close()
	pw.reply.BytesRead = uint64(eng.BytesRead())
	p.next = int64(m.Window.Offset + m.Window.Length)
	p.sums = append(p.sums, m.Digests...)
	return pw.reply, nil
}

// pushWindow is one window of a push being pulled.
type pushWindow struct {
	p          *push
	m          *protocol.PushWindow
	first, end int // the window's chunks
	eng        *reads.Engine
	slots      []pslot
	free       []int
	ready      []int // slots whose READs are all in
	reply      *protocol.PushWindowReply
	sum        []byte
	done       int
	pathErr    bool // the engine gave up on the QPs
}

// pslot is a staging slot: a chunk being read into it.
type pslot struct {
	idx int // chunk
	off int64
	n   int
	g   reads.Group
}

func (pw *pushWindow) run(ctx context.Context, ss *session) *protocol.Error {
	p := pw.p
	pw.slots = make([]pslot, p.slots)
	for i := p.slots - 1; i >= 0; i-- {
		pw.free = append(pw.free, i)
	}
	next := pw.first
	for pw.done < pw.end-pw.first {
		for next < pw.end && len(pw.free) > 0 {
			pw.start(pw.free[len(pw.free)-1], next)
			pw.free = pw.free[:len(pw.free)-1]
			next++
		}
		stepped, err := pw.eng.Step()
		if errors.Is(err, reads.ErrRefused) {
			return errf(protocol.CodeBadRequest, "push: %v", err) // the initiator's keys or addresses are wrong
		}
		if err != nil {
			pw.pathErr = true
			return errf(protocol.CodeInternal, "push: %v", err)
		}
		for len(pw.ready) > 0 {
			sl := pw.ready[0]
			pw.ready = pw.ready[1:]
			if perr := pw.land(ss, sl); perr != nil {
				return perr
			}
		}
		if stepped {
			continue
		}
		select {
		case <-pw.eng.Ready():
		case <-ctx.Done():
			return errf(protocol.CodeInternal, "push abandoned: %v", context.Cause(ctx))
		}
	}
	return nil
}

// start queues the READs of chunk idx into slot sl.
func (pw *pushWindow) start(sl, idx int) {
	p := pw.p
	w := &pw.m.Window
	off, n := p.layout.Chunk(idx)
	s := &pw.slots[sl]
	*s = pslot{idx: idx, off: off, n: int(n), g: reads.Group{Tag: sl}}
	keys := &reads.Keys{RKeys: w.RKeys} // the initiator's MR keys: good on any of its QPs
	cs := uint64(p.layout.ChunkSize)
	var ps []reads.Piece
	for o := 0; o < s.n; o += p.readSize {
		ps = append(ps, reads.Piece{
			Local:  verbs.SGE{Addr: p.mr.Addr() + uint64(sl)*cs + uint64(o), Length: uint32(min(p.readSize, s.n-o)), LKey: p.mr.LKey()},
			LKeys:  lkeysOf(p.mr),
			Remote: w.Addr + uint64(s.off-int64(w.Offset)) + uint64(o), Keys: keys,
		})
	}
	pw.eng.AddGroup(&s.g, ps)
}

func (pw *pushWindow) chunkIn(g *reads.Group) { pw.ready = append(pw.ready, g.Tag) }

// land verifies the chunk in slot sl and writes it, or reads it again.
func (pw *pushWindow) land(ss *session, sl int) *protocol.Error {
	p := pw.p
	s := &pw.slots[sl]
	cs := p.layout.ChunkSize
	data := p.buf.Bytes()[sl*int(cs):][:s.n]
	if ds := p.alg.Size(); ds > 0 {
		i := s.idx - pw.first
		pw.sum = chunker.AppendSum(pw.sum[:0], p.alg, data)
		ok, err := pw.eng.Check(&s.g, pw.sum, pw.m.Digests[i*ds:(i+1)*ds], p.retries)
		if !ok {
			pw.reply.Retries++
			if err != nil {
				return errf(protocol.CodeVerify, "chunk %d (bytes %d-%d) %v (%v)", s.idx, s.off, s.off+int64(s.n), err, p.alg)
			}
			ss.log.Warn("push: chunk failed its digest; reading it again", "chunk", s.idx, "try", s.g.Tries)
			return nil
		}
	}
	if _, err := p.f.WriteAt(data, s.off); err != nil {
		return writeError(p, "writing", err)
	}
	ss.work.Add(uint64(s.n)) // read from the initiator and written: progress.go
	p.landed += int64(s.n)
	pw.free = append(pw.free, sl)
	pw.done++
	return nil
}

// fixedQPs is the engine's view of a push's data QPs: the session's. One
// that fails is disconnected (the initiator sees it go and replaces
// it); its replacement, once joined, takes the slot: the initiator's
// keys are MR keys, good on any of its QPs.
type fixedQPs struct {
	ss   *session
	qps  []verbs.QP
	gens []uint32
	dead []bool
}

func newFixedQPs(ss *session, qps []verbs.QP) *fixedQPs {
	return &fixedQPs{ss: ss, qps: qps, gens: make([]uint32, len(qps)), dead: make([]bool, len(qps))}
}

func (f *fixedQPs) Len() int { return len(f.qps) }

func (f *fixedQPs) QP(i int) (verbs.QP, uint32) {
	f.ss.mu.Lock()
	var cur verbs.QP
	if i < len(f.ss.data) {
		cur = f.ss.data[i]
	}
	f.ss.mu.Unlock()
	if cur != nil && cur != f.qps[i] {
		f.qps[i], f.dead[i] = cur, false
		f.gens[i] += 2
	}
	if f.dead[i] {
		return nil, f.gens[i] + 1
	}
	return f.qps[i], f.gens[i]
}

// Device is reads.Devices': the index of slot i's QP's device, into
// the session's devices and so the staging's LKeys.
func (f *fixedQPs) Device(i int) int {
	f.ss.mu.Lock()
	defer f.ss.mu.Unlock()
	if d := f.ss.qpDev[f.qps[i]]; d != nil {
		return d.idx
	}
	return 0
}

func (f *fixedQPs) Failed(i int, gen uint32, err error) {
	if gen == f.gens[i] && !f.dead[i] {
		f.ss.srv.met.readError(err)
		f.dead[i] = true
		f.qps[i].Disconnect()
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
		h.acc.result = "abandoned: " + perr.Message
	}
	ss.closeHandle(h) // logs it
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
	if err := p.dir.Chtimes(p.tmp, mt, mt); err != nil {
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
	// Within the directory the push began in: the last push to commit a
	// name wins, whole, as with cp and rsync.
	if err := p.dir.Rename(p.tmp, path.Base(p.dst)); err != nil {
		return fsError(dst, err)
	}
	p.done = true
	if d, err := p.dir.Open("."); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
