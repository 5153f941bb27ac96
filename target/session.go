package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
)

// A session is one initiator: a control QP, the data QPs that joined it,
// its own protection domain, and the files and windows it has open. Its
// keys are valid only on its own QPs and die with it.
type session struct {
	srv   *Server
	log   *slog.Logger
	token [16]byte
	pd    verbs.PD
	ch    *protocol.Channel
	mws   bool // bind a memory window per data QP
	// want: the metadata the initiator asked for in Hello (wantOf)
	want  metaWant
	names idNames
	// client is the identity the session authenticated as (nil before,
	// or on a target without a secret), under srv.kmu; addr its peer's
	// address, which exports' hosts rules judge.
	client *Client
	addr   netip.Addr

	dataSCQ verbs.CQ // binds and invalidations on data QPs
	dataRCQ verbs.CQ
	// dev is the control connection's device, where pd and the data
	// CQs are; devs are those of every device the session has data QPs
	// on (devs[0] is dev's), and qpDev each data QP's (devices.go).
	// Under mu.
	dev   verbs.Device
	devs  []*sdev
	qpDev map[verbs.QP]*sdev

	mu     sync.Mutex
	authed bool
	// data holds the data QPs by index; a dead one stays until a join
	// replaces it. frozen: windows hold keys for these indexes (or a
	// request that may map one is being served), so no new index may
	// join; see dataQPs and thaw.
	data    []verbs.QP
	joining map[int]bool // indexes connecting now (join)
	frozen  bool
	closing bool

	hmu sync.Mutex // held while a request is served, and to revoke
	// work counts what the session's serving code has done (progress.go).
	work       atomic.Uint64
	handles    map[uint32]*handle
	nextHandle uint32
	nextWindow uint32
	windows    int
	spare      packSpare
	stats      sessionStats // for the access log and metrics
	suspects   rateBudget   // bytes Suspect may have hashed again (suspect.go)
	pace       *reads.Pace  // the session's rate cap, under mu (ratecap.go)

	stop     chan struct{}
	stopOnce sync.Once
	// revoked says why a reload of the keys ended the session, rekeyed
	// whether its identity went or has a new key (set, under srv.kmu,
	// before stop is closed).
	revoked string
	rekeyed bool
}

type handle struct {
	id       uint32
	export   *export
	path     string
	f        *os.File
	size     int64
	mtime    int64 // for a block device: its write generation
	blockdev bool
	packed   bool    // a Pack's window: no file stays open
	push     *push   // a push in progress: no file open for reading
	walk     *walker // a walk in progress: its windows are its batches'
	layout   chunker.Layout
	digests  chunker.Digests // the whole file's, for an initiator without FeatureWinDigests
	wd       *winDigests     // window by window, for one with it
	windows  map[uint32]*window
	acc      fileStats // for the access log
}

type window struct {
	id      uint32
	off     uint64
	size    uint64 // bytes of the window budget it holds
	mapping []byte
	mr      verbs.MR
	mws     []verbs.MW
	pack    bool      // mapping is a pack's, from and back to session.spare
	at      time.Time // when it was mapped: trim revokes the oldest first
}

// newSession sets up a control connection and connects it, by deadline.
// What an unauthenticated connection holds is kept small, since anyone
// who can reach the port gets one: a protection domain, the control
// channel (its two CQs, and three registered slots of protocol.MaxMessage,
// 192 KiB, for the reply and for Hello and Auth: the control QP needs
// its receives posted before it connects to take Hello at all) and the
// connection's socket. The rest of the channel's receives (an
// authenticated initiator may have protocol.MaxOutstanding requests in
// flight) and the data QPs' CQs wait for authentication (setAuthed). Server
// caps these connections (MaxHandshakes, MaxHandshakesPerAddr) and
// frees each by its HelloTimeout.
func (s *Server) newSession(ctx context.Context, req verbs.ConnRequest, log *slog.Logger, deadline time.Time) (*session, error) {
	dev := s.deviceOf(req)
	pd, err := dev.AllocPD()
	if err != nil {
		req.Reject([]byte("target out of resources"))
		return nil, err
	}
	ss := &session{
		srv: s, log: log, token: protocol.NewSession(), pd: pd, addr: peerAddr(req.RemoteAddr()), dev: dev,
		mws:     dev.Caps().MemoryWindows,
		handles: map[uint32]*handle{}, nextHandle: 1, nextWindow: 1,
		stop:     make(chan struct{}),
		suspects: rateBudget{rate: float64(s.cfg.SuspectRate), burst: 2 * float64(s.cfg.SuspectRate)},
	}
	fail := func(err error) (*session, error) {
		ss.release()
		return nil, err
	}
	// Hello and Auth are all a peer may send before it has proved itself:
	// two receive slots until then (Grow, in setAuthed).
	if ss.ch, err = protocol.NewSmallChannel(dev, pd, 0, 2); err != nil {
		req.Reject(nil)
		return fail(err)
	}
	pq, err := req.Prepare(pd, ss.ch.QPConfig())
	if err != nil {
		req.Reject(nil)
		return fail(err)
	}
	if err := ss.ch.PostRecvs(pq); err != nil {
		pq.Close()
		return fail(err)
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	qp, err := pq.Connect(cctx, verbs.ConnParam{})
	if err != nil {
		return fail(err)
	}
	ss.ch.Attach(qp)
	// A peer that stops taking replies must not hold the session.
	ss.ch.SetTimeout(s.cfg.SendTimeout)
	ss.log = log.With("session", fmt.Sprintf("%x", ss.token[:4]))
	return ss, nil
}

// shutdown ends the session at once: it closes the QPs, so that nothing
// waits on the peer, and the session's goroutine frees the rest.
func (ss *session) shutdown() {
	ss.stopOnce.Do(func() { close(ss.stop) })
	ss.closeQPs()
}

func (ss *session) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ss.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	why := "the target is stopping"
	defer func() {
		if ss.stopped() && ss.revoked != "" {
			why = ss.revoked
		}
		ss.closed(why)
	}() // after release: the files' lines first
	defer ss.release()
	if err := ss.hello(ctx); err != nil {
		var full fullError
		if why := ss.srv.evictedWhy(ss); why != "" && !errors.As(err, &full) { // refuse told it already
			ss.tellEvicted(why)
		} else if ctx.Err() == nil {
			ss.srv.handshakeFailed(ss.srv.peerOf(ss), err) // aggregated: a flood of these must not flood the log
		}
		return
	}
	ss.begin()
	ss.log.Info("session open", "data_qps_max", ss.srv.cfg.MaxDataQPs)
	for {
		rctx, cancelRecv := context.WithTimeout(ctx, ss.srv.cfg.IdleTimeout)
		m, err := ss.ch.Recv(rctx)
		idle := rctx.Err() != nil && ctx.Err() == nil
		cancelRecv()
		if idle {
			why = "idle timeout (" + ss.srv.cfg.IdleTimeout.String() + ")"
			return
		}
		if err != nil {
			if errors.Is(err, protocol.ErrMalformed) {
				// Answer under the request's ID when its header is good,
				// so that the initiator's call gets its reply.
				e := errf(protocol.CodeBadRequest, "%v", err)
				var de *protocol.DecodeError
				if errors.As(err, &de) {
					e.SetID(de.Header.RequestID)
					if !de.Header.Type.Known() {
						e.Code = protocol.CodeUnsupported
					}
				}
				ss.log.Warn("malformed request", "err", err)
				ss.ch.Send(ctx, e)
				continue
			}
			var ve *protocol.VersionError
			if errors.As(err, &ve) {
				ss.ch.Send(ctx, errf(protocol.CodeVersion, "%v", err))
				return
			}
			if ctx.Err() == nil {
				why = err.Error()
			}
			return
		}
		if _, bye := m.(*protocol.Bye); bye {
			why = "closed by the initiator"
			return
		}
		if err := ss.answer(ctx, m); err != nil {
			why = err.Error()
			return
		}
	}
}

// replyHook, when set, rewrites every reply before it is sent: a
// hostile target for the tests (hostile_test.go sets it through
// export_hostile_test.go); nil in the program.
var replyHook atomic.Pointer[func(req, reply protocol.Message) protocol.Message]

// answer serves one request and sends its reply, with Working meanwhile
// (a request that waits for hmu is being served too).
func (ss *session) answer(ctx context.Context, m protocol.Message) error {
	stop := ss.keepAlive(ctx, m.ID(), ss.work.Load())
	ss.hmu.Lock()
	reply := ss.serve(ctx, m)
	ss.noteReply(m, reply)
	ss.thaw()
	ss.hmu.Unlock()
	if h := replyHook.Load(); h != nil {
		reply = (*h)(m, reply)
	}
	stop()
	reply.SetID(m.ID())
	return ss.ch.Send(ctx, reply)
}

// keepAlive sends Working for request id every WorkingInterval until the
// returned stop is called. stop
// returns once no Working is being sent, so that none follows the reply.
// A Working that fails is not retried: the reply's send will fail too.
// Each carries the work done since the request began (the session's
// work counter less base): progress.go.
func (ss *session) keepAlive(ctx context.Context, id uint32, base uint64) (stop func()) {
	var mu sync.Mutex
	stopped := false
	mu.Lock()
	defer mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(protocol.WorkingInterval, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped && ss.ch.Send(ctx, &protocol.Working{RequestID: id, Progress: ss.work.Load() - base}) == nil {
			t.Reset(protocol.WorkingInterval)
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// dead reports whether qp's connection is gone.
func dead(qp verbs.QP) bool {
	select {
	case <-qp.Done():
		return true
	default:
		return false
	}
}

// serve answers one request.
func (ss *session) serve(ctx context.Context, m protocol.Message) protocol.Message {
	switch m := m.(type) {
	case *protocol.List:
		return ss.list(m)
	case *protocol.Stat:
		return ss.stat(m)
	case *protocol.Open:
		return ss.open(ctx, m)
	case *protocol.Digests:
		return ss.digestsReply(ctx, m)
	case *protocol.Extents:
		return ss.extentsReply(m)
	case *protocol.Suspect:
		return ss.suspect(ctx, m)
	case *protocol.Map:
		return ss.mapWindow(ctx, m)
	case *protocol.Pack:
		return ss.pack(ctx, m)
	case *protocol.Walk:
		return ss.walk(ctx, m)
	case *protocol.WalkNext:
		return ss.walkNext(ctx, m)
	case *protocol.Push:
		return ss.pushFile(m)
	case *protocol.PushWindow:
		return ss.pushWindow(ctx, m)
	case *protocol.PushCommit:
		return ss.pushCommit(m)
	case *protocol.Rails:
		return ss.rails()
	case *protocol.RailDrop:
		return ss.railDrop(m)
	case *protocol.Working:
		return errf(protocol.CodeBadRequest, "Working is sent by the target, not to it")
	case *protocol.Unmap:
		h := ss.handles[m.Handle]
		if h == nil || h.windows[m.WindowID] == nil {
			return errf(protocol.CodeBadRequest, "no window %d on handle %d", m.WindowID, m.Handle)
		}
		ss.unmap(h, h.windows[m.WindowID])
		return &protocol.Ack{}
	case *protocol.Close:
		h := ss.handles[m.Handle]
		if h == nil {
			return errf(protocol.CodeBadRequest, "no handle %d", m.Handle)
		}
		changed := h.file() && h.changed()
		h.acc.result = map[bool]string{false: "ok", true: "changed"}[changed]
		if h.push != nil { // a push ends well only by its commit
			h.acc.result = "aborted: the initiator closed it before the commit"
		}
		if h.wd != nil {
			closed := &protocol.Closed{Changed: changed, FileDigest: []byte{}}
			closed.FileDigest = h.wd.fileDigest(ctx)
			ss.closeHandle(h)
			return closed
		}
		ss.closeHandle(h)
		return &protocol.CloseReply{Changed: changed}
	}
	return errf(protocol.CodeUnsupported, "unexpected %v", m.Type())
}

// closeQPs closes the session's QPs, control and data, all at once: a
// QP's Close can take a second (iwarp drains a half-closed connection).
// Once they are closed no peer holds anything of the session's: no READ
// is served from its windows, no send of its waits, and no more data QPs
// join.
func (ss *session) closeQPs() {
	ss.mu.Lock()
	ss.closing = true
	qps := slices.DeleteFunc(append([]verbs.QP(nil), ss.data...), func(qp verbs.QP) bool { return qp == nil })
	ss.mu.Unlock()
	if ss.ch != nil && ss.ch.QP() != nil {
		qps = append(qps, ss.ch.QP())
	}
	var wg sync.WaitGroup
	for _, qp := range qps {
		wg.Go(func() { qp.Close() })
	}
	wg.Wait()
}

// release frees everything the session holds: the QPs first, so that no
// peer can hold up what follows (closing a window waits for READs being
// served from it, which a peer that stopped reading would stall), then
// the windows and files, then the protection domain. Keys die with the
// QPs: a closed QP serves no READ.
func (ss *session) release() {
	ss.closeQPs()
	ss.hmu.Lock()
	for _, h := range ss.handles {
		// A push the lost session left half done is kept for its
		// initiator to resume (keptpush.go); not when the target stops
		// the session itself (shutting down, keys revoked).
		if p := h.push; p != nil && p.keepable() && !ss.stopped() {
			p.keep = true
			h.acc.result = "kept: the session ended; its initiator may resume it"
		}
		ss.closeHandle(h)
	}
	ss.spare.drop()
	ss.hmu.Unlock()
	if ss.ch != nil {
		ss.ch.Close()
	}
	if ss.dataSCQ != nil {
		ss.dataSCQ.Close()
	}
	if ss.dataRCQ != nil {
		ss.dataRCQ.Close()
	}
	ss.closeDevs()
	ss.pd.Close()
}
