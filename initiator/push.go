package initiator

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/rdmacp/rdmacp/initiator/local"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// PutOptions tune one push.
type PutOptions struct {
	// Progress, if set, is called from the pushing goroutine as the
	// target confirms windows (about every 100 ms) and once at the end.
	Progress func(Progress)
	// Window is the most bytes of the file mapped and registered for one
	// PushWindow; default 32 MiB, at least one chunk. Three windows at
	// most are mapped at once.
	Window int64
}

// defaultPushWindow is PutOptions.Window's default.
const defaultPushWindow = 32 << 20

// Put pushes the local file src to the target: to dst ("EXPORT/PATH"),
// or inside dst under src's base name if dst is a directory there. This
// side registers windows of src for remote read, a few at a time, and
// the target pulls them with RDMA READs, checks every chunk against the
// digests sent with each window, and renames its temporary file into
// place only on commit, which this side sends once every window is in
// and src is seen unchanged. A failed push leaves nothing at dst.
//
// A session that breaks on the way is re-established (bounded by
// RetryFor) and the push goes on from what the target had verified and
// written: it keeps a lost session's push for a while, and this side
// names the push with the same token (protocol.Push.Token) again.
func (s *Session) Put(ctx context.Context, src, dst string, opt PutOptions) (*Result, error) {
	if err := s.joined(ctx); err != nil { // a push plans its windows from the QPs
		return &Result{Source: src, Dest: dst}, err
	}
	ps := &pushState{}
	if _, err := rand.Read(ps.token[:]); err != nil {
		return &Result{Source: src, Dest: dst}, err
	}
	for {
		t0, before := time.Now(), ps.confirmed
		res, err := s.put(ctx, src, dst, opt, ps)
		if err != nil && recoverable(ctx, err) {
			if ps.confirmed == before {
				s.spent += time.Since(t0) // no progress: it counts against --retry-for
			}
			if rerr := s.reconnect(ctx, err); rerr == nil {
				s.cfg.Logger.Warn("session re-established; the push goes on", "path", src, "bytes_confirmed", ps.confirmed)
				continue
			} else {
				err = rerr
			}
		}
		if err != nil {
			return res, pushErr(dst, err)
		}
		return res, nil
	}
}

// pushState is what a push keeps across the sessions it needs: its
// token, and the windows the target confirmed (their chunk digests).
type pushState struct {
	token     [16]byte
	confirmed int64  // bytes from the start the target confirmed
	sums      []byte // their chunks' digests
}

// pushErr words an error of a push to dst.
func pushErr(dst string, err error) error {
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Code == protocol.CodeReadOnly {
		err = &refusal{pe}
	}
	return fmt.Errorf("push to %s: %w", dst, err)
}

// refusal shows a target's refusal as the target worded it.
type refusal struct{ pe *protocol.Error }

func (r *refusal) Error() string { return r.pe.Message }
func (r *refusal) Unwrap() error { return r.pe }

func (s *Session) put(ctx context.Context, src, dst string, opt PutOptions, ps *pushState) (*Result, error) {
	res := &Result{Source: src, Dest: dst, start: time.Now()}
	// The user named src (a symlink is followed), but it may have become
	// a FIFO since the CLI looked: that is refused, not waited on.
	f, err := local.OpenRegular(src, local.OpenMode{Flag: os.O_RDONLY, Follow: true})
	if err != nil {
		return res, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return res, err
	}
	if fi.IsDir() {
		return res, &fs.PathError{Op: "push", Path: src, Err: syscall.EISDIR}
	}
	if !fi.Mode().IsRegular() {
		return res, &fs.PathError{Op: "push", Path: src, Err: errors.New("not a regular file")}
	}
	m, err := s.retryBusy(ctx, nil, &protocol.Push{
		Algorithm: uint8(s.cfg.Algorithm), ChunkSize: uint32(s.cfg.ChunkSize), Retries: uint8(min(max(s.cfg.Retries, 0), 255)),
		Size: uint64(fi.Size()), Mode: unixMode(fi.Mode()), MtimeNs: fi.ModTime().UnixNano(),
		Path: dst, Name: filepath.Base(src), Token: ps.token,
	})
	if err != nil {
		return res, err
	}
	pr, ok := m.(*protocol.PushReply)
	if !ok {
		return res, unexpected(m)
	}
	layout := chunker.Layout{Size: fi.Size(), ChunkSize: int64(pr.ChunkSize)}
	alg := chunker.Algorithm(pr.Algorithm)
	if chunker.ValidateChunkSize(layout.ChunkSize) != nil || alg != s.cfg.Algorithm || int(pr.Chunks) != layout.Chunks() {
		s.abandon(ctx, pr.Handle)
		return res, fmt.Errorf("%w: target's layout for %s does not add up", protocol.ErrMalformed, dst)
	}
	res.Dest = pr.Path
	res.Chunks, res.ChunkSize, res.Algorithm = layout.Chunks(), layout.ChunkSize, alg
	u := &upload{s: s, f: f, fi: fi, src: src, handle: pr.Handle, layout: layout, alg: alg, progress: opt.Progress, res: res,
		winSize: cmp.Or(opt.Window, defaultPushWindow), state: ps}
	if err := u.resume(ctx, int64(pr.Resumed)); err != nil {
		s.abandon(ctx, pr.Handle)
		return res, err
	}
	sums, err := u.run(ctx)
	if err != nil {
		if !u.gone {
			s.abandon(ctx, pr.Handle)
		}
		return res, err
	}
	// The target has every chunk; commit only if src did not change.
	if u.changed() {
		s.abandon(ctx, pr.Handle)
		return res, fmt.Errorf("%w: %s was modified while it was pushed", ErrChanged, src)
	}
	d, err := chunker.MakeDigests(alg, layout.Chunks(), sums)
	if err != nil {
		s.abandon(ctx, pr.Handle)
		return res, err
	}
	fd, err := chunker.FileDigest(alg, layout, d)
	if err != nil {
		s.abandon(ctx, pr.Handle)
		return res, err
	}
	m, err = s.commit(ctx, &protocol.PushCommit{Handle: pr.Handle, FileDigest: fd})
	if err != nil {
		return res, err
	}
	if _, ok := m.(*protocol.Ack); !ok {
		return res, unexpected(m)
	}
	res.Bytes = layout.Size
	res.Digest = chunker.FormatDigest(alg, fd)
	res.Elapsed = time.Since(res.start)
	if opt.Progress != nil {
		opt.Progress(Progress{Path: src, Bytes: layout.Size, Total: layout.Size, Retries: res.Retries})
	}
	return res, nil
}

// commitGrace is how long a push still waits for the target's answer to
// its PushCommit once ctx has ended. The commit was sent: the target
// decides the outcome (it syncs and renames the file into place, whole,
// or fails), and only its answer says which. Interrupted at that point,
// the push reports the answer that comes within commitGrace (success:
// the file is in place) rather than a failure that is not one. It fits
// in the 2 s an interrupted command has to end in (cmd/rdmacp's
// interruptGrace, 1.8 s), with room for the Bye after it.
const commitGrace = time.Second

// ErrCommitInDoubt: the push was interrupted after its commit was sent
// and the target did not answer within commitGrace: the destination is
// in place whole, or not at all, never partial.
var ErrCommitInDoubt = errors.New("interrupted while the target committed it")

// commit sends m unless ctx has ended, and waits for the target's
// answer, up to commitGrace after ctx ends.
func (s *Session) commit(ctx context.Context, m *protocol.PushCommit) (protocol.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // not sent: the target drops the push with the session
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(commitGrace, cancel)
		context.AfterFunc(cctx, func() { t.Stop() })
	})
	defer stop()
	r, err := s.call(cctx, m)
	if err != nil && cctx.Err() != nil {
		return nil, fmt.Errorf("%w: it is in place whole or not at all, never partial; look before pushing it again (%w)", ErrCommitInDoubt, ctx.Err())
	}
	return r, err
}

// abandon tells the target to drop a push, waiting a little for its word
// (not at all once ctx has ended: the target drops it with the session).
func (s *Session) abandon(ctx context.Context, handle uint32) {
	s.tidy(ctx, &protocol.Close{Handle: handle})
}

// unixMode is m's permission, setuid, setgid and sticky bits as st_mode has them.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// upload is one push in flight: windows of the file mapped, registered
// and hashed ahead, handed to the target one PushWindow at a time.
type upload struct {
	s        *Session
	f        *os.File
	fi       os.FileInfo
	src      string
	handle   uint32
	layout   chunker.Layout
	alg      chunker.Algorithm
	progress func(Progress)
	winSize  int64 // PutOptions.Window
	res      *Result
	gone     bool       // the target has dropped the push (it answered a window with an error)
	state    *pushState // across sessions: what the target confirmed
	start    int64      // where this session's windows start (PushReply.Resumed)
}

// resume starts the upload where the target says it has the file up to
// (PushReply.Resumed), with the digests of the chunks before it: those
// of windows it confirmed, and, for any it wrote but could not confirm
// before its session went, hashed here again.
func (u *upload) resume(ctx context.Context, from int64) error {
	l, ps, ds := u.layout, u.state, int64(u.alg.Size())
	if from < 0 || from > l.Size || (from%l.ChunkSize != 0 && from != l.Size) {
		return fmt.Errorf("%w: the target resumes %s at byte %d of %d (chunks of %d)", protocol.ErrMalformed, u.src, from, l.Size, l.ChunkSize)
	}
	have, chunks := int(ps.confirmed/l.ChunkSize), int((from+l.ChunkSize-1)/l.ChunkSize)
	if from <= ps.confirmed {
		ps.sums = ps.sums[:int64(chunks)*ds]
	} else {
		more, err := chunker.HashRange(ctx, u.f, l, have, chunks, u.alg, 1, nil)
		if err != nil {
			return &fs.PathError{Op: "read", Path: u.src, Err: err}
		}
		ps.sums = append(ps.sums, more...)
	}
	ps.confirmed, u.start = from, from
	return nil
}

// pwin is a registered window of the file.
type pwin struct {
	off, n  int64
	mapping []byte        // the file mapping, or nil
	staged  *verbs.Buffer // a copy, where the mapping can't be registered
	mr      verbs.MR
	addr    uint64 // address of file offset off
	digests []byte
	err     error
}

func (w *pwin) free() {
	if w.mr != nil {
		w.mr.Close() // waits for the READs in progress, before the memory goes
	}
	if w.mapping != nil {
		unix.Munmap(w.mapping)
	}
	if w.staged != nil {
		w.staged.Free()
	}
}

// changed reports whether the file's size or mtime differ from the start.
func (u *upload) changed() bool {
	fi, err := u.f.Stat()
	return err != nil || fi.Size() != u.fi.Size() || !fi.ModTime().Equal(u.fi.ModTime())
}

// windowSize is the bytes of one window: whole chunks, at most
// u.winSize (or one chunk) and no more than one PushWindow's digests.
func (u *upload) windowSize() int64 {
	cs := u.layout.ChunkSize
	n := max(u.winSize/cs, 1)
	if ds := u.alg.Size(); ds > 0 {
		n = min(n, int64((protocol.MaxMessage-protocol.PushWindowOverhead(u.s.nqps))/ds))
	}
	return n * cs
}

func (u *upload) run(ctx context.Context) ([]byte, error) {
	size := u.layout.Size
	ps := u.state
	if u.start == size {
		return ps.sums, nil
	}
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One window is with the target, one ready, one being prepared.
	ready := make(chan *pwin, 1)
	go u.prepare(ctx, ready)
	defer func() {
		u.s.hushIfCancelled(outer)
		cancel()
		for w := range ready {
			w.free()
		}
	}()
	sent := u.start
	var last time.Time // the first window reports at once
	for sent < size {
		var w *pwin
		ok := false
		select {
		case w, ok = <-ready:
		case <-ctx.Done():
		}
		if !ok { // cancelled (prepare stops sending when it is)
			return nil, cmp.Or(ctx.Err(), errors.New("push: windows stopped coming"))
		}
		if w.err != nil {
			w.free()
			return nil, w.err
		}
		r, err := u.send(ctx, w)
		// Cancelled, the target may still be READing w: its QPs fail
		// when w's memory goes, and that is no failure to recover from.
		u.s.hushIfCancelled(outer)
		w.free()
		if err != nil {
			return nil, err
		}
		u.res.Retries += int(r.Retries)
		u.res.BytesRead += int64(r.BytesRead)
		ps.sums = append(ps.sums, w.digests...)
		sent += w.n
		ps.confirmed = sent
		if u.progress != nil && time.Since(last) > 100*time.Millisecond {
			last = time.Now()
			u.progress(Progress{Path: u.src, Bytes: sent, Total: size, Retries: u.res.Retries})
		}
	}
	return ps.sums, nil
}

// send offers w to the target and waits until it has written it.
func (u *upload) send(ctx context.Context, w *pwin) (*protocol.PushWindowReply, error) {
	s := u.s
	keys := make([]uint32, s.nqps)
	for i := range keys {
		keys[i] = rkeyOn(w.mr, s.railOf(i).dev) // the target READs over slot i's QP, on that device
	}
	m, err := s.call(ctx, &protocol.PushWindow{Handle: u.handle, Digests: w.digests,
		Window: protocol.Window{Offset: uint64(w.off), Length: uint64(w.n), Addr: w.addr, RKeys: keys}})
	var pe *protocol.Error
	if errors.As(err, &pe) {
		u.gone = true // the target dropped the push
		if pe.Code == protocol.CodeVerify {
			if u.changed() {
				return nil, fmt.Errorf("%w: %s was modified while it was pushed (%w)", ErrChanged, u.src, err)
			}
			return nil, fmt.Errorf("%w: %w", ErrVerify, err)
		}
		if qerr := s.deadQP(); qerr != nil {
			return nil, fmt.Errorf("%w (%w)", qerr, err)
		}
	}
	if err != nil {
		return nil, err
	}
	r, ok := m.(*protocol.PushWindowReply)
	if !ok || r.Offset != uint64(w.off) {
		return nil, unexpected(m)
	}
	return r, nil
}

// deadQP says whether a data QP has failed.
func (s *Session) deadQP() error {
	if s.qps == nil {
		return fmt.Errorf("%w: the session has no data QPs", ErrConnect)
	}
	if live := s.qps.Live(); live < s.nqps {
		return fmt.Errorf("%w: %d of %d data QPs failed", ErrConnect, s.nqps-live, s.nqps)
	}
	return nil
}

// prepare maps, registers and hashes the file's windows in order, one
// ahead of the sender.
func (u *upload) prepare(ctx context.Context, out chan<- *pwin) {
	defer close(out)
	// A file truncated under its mapping faults when read: make that an
	// error, not a crash.
	debug.SetPanicOnFault(true)
	step := u.windowSize()
	for off := u.start; off < u.layout.Size; off += step {
		w := u.window(off, min(step, u.layout.Size-off))
		select {
		case out <- w:
		case <-ctx.Done():
			w.free()
			return
		}
		if w.err != nil {
			return
		}
	}
}

// window maps file bytes [off, off+n), registers them for remote read
// and computes their chunks' digests.
func (u *upload) window(off, n int64) (w *pwin) {
	w = &pwin{off: off, n: n}
	defer func() {
		if r := recover(); r != nil {
			w.err = fmt.Errorf("%w: %s: reading its mapping failed (%v): was it truncated?", ErrChanged, u.src, r)
		}
	}()
	if u.changed() {
		w.err = fmt.Errorf("%w: %s was modified while it was pushed", ErrChanged, u.src)
		return w
	}
	pg := int64(os.Getpagesize())
	moff := off &^ (pg - 1)
	mapping, err := unix.Mmap(int(u.f.Fd()), moff, int(n+off-moff), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		w.err = &fs.PathError{Op: "mmap", Path: u.src, Err: err}
		return w
	}
	w.mapping = mapping
	data := mapping[off-moff:]
	w.mr, err = u.s.regMR(mapping, verbs.AccessRemoteRead)
	if errors.Is(err, syscall.EFAULT) {
		// Some kernels can't pin a read-only file mapping: register a copy.
		w.mr, data, err = u.stage(w)
	}
	if err != nil {
		w.err = fmt.Errorf("register %s: %w", u.src, err)
		return w
	}
	w.addr = w.mr.Addr() + uint64(off-moff)
	if w.staged != nil {
		w.addr = w.mr.Addr()
	}
	if ds := u.alg.Size(); ds > 0 {
		cs := u.layout.ChunkSize
		w.digests = make([]byte, 0, (n+cs-1)/cs*int64(ds))
		for c := int64(0); c < n; c += cs {
			w.digests = chunker.AppendSum(w.digests, u.alg, data[c:min(c+cs, n)])
		}
	}
	return w
}

// stage copies w's bytes into registered anonymous memory.
func (u *upload) stage(w *pwin) (verbs.MR, []byte, error) {
	unix.Munmap(w.mapping)
	w.mapping = nil
	buf, err := verbs.AllocBuffer(int(w.n))
	if err != nil {
		return nil, nil, err
	}
	w.staged = buf
	if _, err := u.f.ReadAt(buf.Bytes(), w.off); err != nil {
		return nil, nil, &fs.PathError{Op: "read", Path: u.src, Err: err}
	}
	mr, err := u.s.regMR(buf.Bytes(), verbs.AccessRemoteRead)
	return mr, buf.Bytes(), err
}
