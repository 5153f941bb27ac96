package target

import (
	"context"
	"errors"
	"fmt"
	"github.com/rdmacp/rdmacp/blockdev"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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

// hello runs the version and authentication exchange.
func (ss *session) hello(ctx context.Context) error {
	cfg := &ss.srv.cfg
	hctx, cancel := context.WithDeadline(ctx, ss.srv.deadline(ss))
	defer cancel()
	m, err := ss.ch.Recv(hctx)
	if err != nil {
		return fmt.Errorf("waiting for hello: %w", err)
	}
	ss.srv.spoke(ss)
	h, ok := m.(*protocol.Hello)
	if !ok {
		ss.ch.Send(ctx, errf(protocol.CodeBadRequest, "expected Hello, got %v", m.Type()))
		return fmt.Errorf("expected Hello, got %v", m.Type())
	}
	if h.MinVersion > protocol.Version || h.MaxVersion < protocol.Version {
		theirs := fmt.Sprint(h.MinVersion)
		if h.MaxVersion != h.MinVersion {
			theirs = fmt.Sprintf("%d-%d", h.MinVersion, h.MaxVersion)
		}
		e := errf(protocol.CodeVersion, "%s", protocol.VersionMismatch("initiator", theirs))
		e.SetID(h.ID())
		ss.ch.Send(ctx, e)
		return e
	}
	ch := &protocol.Challenge{
		Version: protocol.Version, ServerNonce: protocol.NewNonce(),
		AuthRequired: ss.srv.authRequired(), Session: ss.token,
		MaxDataQPs:    uint16(cfg.MaxDataQPs),
		MaxReadsPerQP: uint16(min(cfg.Device.Caps().MaxReadsPerQP, 1<<16-1)),
		MaxWindow:     cfg.MaxWindow,
		RateCap:       ss.rateCap(),
	}
	ch.Server = "rdmacp"
	ch.Rails = uint8(len(cfg.DataAddrs)) // at most protocol.MaxRailAddrs: validateRails
	ch.SetID(h.ID())
	ss.want = wantOf(h.Client)
	if !ch.AuthRequired {
		if err := ss.setAuthed(); err != nil {
			return ss.refuse(ctx, h.ID(), err)
		}
		return ss.ch.Send(ctx, ch)
	}
	if err := ss.ch.Send(ctx, ch); err != nil {
		return err
	}
	m, err = ss.ch.Recv(hctx)
	if err != nil {
		return fmt.Errorf("waiting for auth: %w", err)
	}
	reply, err := ss.authenticate(m, ch.ServerNonce, h.ClientNonce)
	if err != nil {
		ss.ch.Send(ctx, reply)
		return err
	}
	if err := ss.setAuthed(); err != nil {
		return ss.refuse(ctx, m.ID(), err)
	}
	return ss.ch.Send(ctx, reply)
}

// refuse answers request id with why the session can't open (its slot
// is not a session's: they are all taken, or the CQs could not be made).
func (ss *session) refuse(ctx context.Context, id uint32, err error) error {
	e := errf(protocol.CodeInternal, "target out of resources")
	var full fullError
	if errors.As(err, &full) {
		e = errf(protocol.CodeTooMany, "%s", string(full))
	}
	e.SetID(id)
	ss.ch.Send(ctx, e)
	return err
}

// tellEvicted answers a handshake cut short for another (admit) with
// TooMany, for the initiator to retry, not to take as a broken
// connection. Request ID 0: it answers whatever the initiator sent last
// (Hello or Auth). Bounded: the peer may take nothing.
func (ss *session) tellEvicted(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), evictedSendTimeout)
	defer cancel()
	ss.ch.Send(ctx, errf(protocol.CodeTooMany, "%s", why))
}

// evictedSendTimeout bounds tellEvicted's send: one small message on a
// connected QP takes microseconds unless the peer has stopped reading.
const evictedSendTimeout = 100 * time.Millisecond

// setAuthed makes the handshake a session: it takes a session's place in
// the server's counts (or fails: MaxSessions, MaxSessionsPerAddr), makes
// the data QPs' CQs, and lets data QPs join.
func (ss *session) setAuthed() error {
	if err := ss.srv.promote(ss); err != nil {
		return err
	}
	if err := ss.ch.Grow(); err != nil { // the receives a session may use, before it is told it is one
		return err
	}
	var err error
	if ss.dataSCQ, ss.dataRCQ, err = dataCQs(ss.dev, &ss.srv.cfg); err != nil {
		return err
	}
	ss.mu.Lock()
	ss.devs = []*sdev{{dev: ss.dev, pd: ss.pd, scq: ss.dataSCQ, rcq: ss.dataRCQ}}
	ss.qpDev = map[verbs.QP]*sdev{}
	ss.authed = true
	ss.mu.Unlock()
	return nil
}

// join accepts data QP index into the session: a new index (in any
// order) while no window holds keys for the indexes there are, or any
// index whose QP has died, which the new QP replaces. Windows mapped
// before a replacement keep, for its index, the dead QP's key, which
// serves nothing; those mapped after it get keys for the new QP. mu is
// not held while the QP connects; a request sent once the initiator's
// connect returns waits for the join to be installed (awaitJoins).
func (ss *session) join(ctx context.Context, req verbs.ConnRequest, index int) error {
	pq, d, err := ss.reserve(req, index)
	if err != nil {
		return err
	}
	// The connection's round trips run outside mu, so that a session's
	// data QPs join at once, not one after another: 16 of them took 6 s
	// at 200 ms RTT in turn (FeatureJoins).
	cctx, cancel := context.WithTimeout(ctx, ss.srv.cfg.HelloTimeout)
	defer cancel()
	qp, err := pq.Connect(cctx, verbs.ConnParam{})
	ss.mu.Lock()
	delete(ss.joining, index)
	if err == nil && ss.closing {
		err = errors.New("data QP joined a session that is closing")
	} else if err == nil {
		for len(ss.data) <= index {
			ss.data = append(ss.data, nil)
		}
		if old := ss.data[index]; old != nil {
			delete(ss.qpDev, old)
		}
		ss.data[index] = qp
		ss.qpDev[qp] = d
		ss.paceQP(qp) // ratecap.go
	}
	ss.mu.Unlock()
	if err != nil && qp != nil {
		qp.Close()
	}
	return err
}

// reserve checks that data QP index may join, closes the dead QP it
// replaces, and prepares its QP on the device it came on: index is
// joining until join installs it or gives up.
func (ss *session) reserve(req verbs.ConnRequest, index int) (verbs.PendingQP, *sdev, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	old, err := ss.joinable(req, index)
	if err != nil {
		return nil, nil, err
	}
	if old != nil {
		old.Close() // dead already: this frees it before its successor connects
	}
	d, err := ss.onDevice(ss.srv.deviceOf(req))
	if err != nil {
		req.Reject([]byte("target out of resources"))
		return nil, nil, err
	}
	pq, err := req.Prepare(d.pd, verbs.QPConfig{SendCQ: d.scq, RecvCQ: d.rcq, MaxSendWR: 64, MaxRecvWR: 1})
	if err != nil {
		req.Reject(nil)
		return nil, nil, err
	}
	if ss.joining == nil {
		ss.joining = map[int]bool{}
	}
	ss.joining[index] = true
	return pq, d, nil
}

// awaitJoins waits, under mu, until no data QP is joining, for at most
// HelloTimeout (each join's own bound): a peer's join completes at its
// end when the target's reply goes out, before the target installs the
// QP, so its first request can come first.
func (ss *session) awaitJoins() {
	deadline := time.Now().Add(ss.srv.cfg.HelloTimeout)
	for len(ss.joining) > 0 && time.Now().Before(deadline) {
		ss.mu.Unlock()
		time.Sleep(time.Millisecond)
		ss.mu.Lock()
	}
}

// joinable says whether data QP index may join, and which dead QP it
// replaces (nil: a new index). Indexes may join in any order, and at
// once; a new one only while no window is mapped. Under mu.
func (ss *session) joinable(req verbs.ConnRequest, index int) (old verbs.QP, err error) {
	refuse := func(why string, err error) (verbs.QP, error) {
		req.Reject([]byte(why))
		return nil, err
	}
	var cur verbs.QP
	if index < len(ss.data) {
		cur = ss.data[index]
	}
	switch {
	case !ss.authed || ss.closing:
		return refuse("session not authenticated", errors.New("data QP for a session that has not authenticated"))
	case index >= ss.srv.cfg.MaxDataQPs:
		return refuse("too many data QPs", fmt.Errorf("data QP %d over the limit of %d", index, ss.srv.cfg.MaxDataQPs))
	case ss.joining[index] || cur != nil && !dead(cur):
		return refuse("data QP index in use", fmt.Errorf("data QP %d joined while the one there is connected or joining", index))
	case cur != nil:
		return cur, nil
	case ss.frozen:
		return refuse("data QPs must join before windows are mapped", errors.New("data QP joined after windows were mapped"))
	}
	return nil, nil
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
		if ss.srv.cfg.NoPack {
			break
		}
		return ss.pack(ctx, m)
	case *protocol.Walk:
		if ss.srv.cfg.NoWalk {
			break
		}
		return ss.walk(ctx, m)
	case *protocol.WalkNext:
		return ss.walkNext(ctx, m)
	case *protocol.Push:
		if ss.srv.cfg.NoPush {
			break
		}
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
		Chunks: uint32(layout.Chunks()), FileDigest: fd, Entry: e}
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
		wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpBindMW, MW: mw, BindMR: mr,
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

// waitBinds waits for n bind completions of qps' on cq, their device's
// data send CQ.
func waitBinds(ctx context.Context, cq verbs.CQ, qps []verbs.QP, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	comps := make([]verbs.Completion, n)
	for got := 0; got < n; {
		k, err := cq.Poll(comps[got:])
		if err != nil {
			return err
		}
		for _, c := range comps[got : got+k] {
			if c.WRID >= uint64(len(qps)) {
				return fmt.Errorf("bind: completion for unknown request %#x", c.WRID)
			}
			if c.Status != verbs.StatusSuccess && !dead(qps[c.WRID]) {
				return fmt.Errorf("bind on data QP %d: %w", c.WRID, c.Status)
			}
		}
		got += k
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
