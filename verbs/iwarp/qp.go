package iwarp

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/crc32c"
	"github.com/rdmacp/rdmacp/verbs"
)

// A connected QP runs two goroutines: the reader parses FPDUs, places
// tagged data straight into registered memory and queues peer READ
// requests; the writer sends this side's requests and the READ responses,
// straight from registered memory with vectored writes. The application
// is never called on the data path.

// swr is a send-queue entry.
type swr struct {
	wr       verbs.SendWR
	status   verbs.Status
	done     bool
	internal bool // an RTR READ: no completion
	writing  bool // a SEND or WRITE the writer has taken: it completes it
	placed   uint64
	sum      uint32 // a READ's: the CRC-32C of its placed bytes, with wr.Sum
}

// rwr is a receive-queue entry.
type rwr struct {
	wr verbs.RecvWR
}

// inRead is a peer READ request waiting for its response.
type inRead struct {
	req readReq
	msn uint32
}

type qp struct {
	dev    *device
	pd     *pd
	sendCQ *cq
	recvCQ *cq
	qpn    uint32
	conn   net.Conn
	crc    bool
	info   verbs.ConnInfo

	maxSend, maxRecv int

	mu      sync.Mutex
	sq      []*swr // posted, not yet completed, in order
	posted  int    // entries of sq the application posted (not the RTR)
	next    int    // sq[next:] are not yet handed to the writer
	reads   []*swr // READs sent, awaiting their responses, in order
	rq      []rwr
	irq     []inRead
	gated   bool // passive p2p side: send nothing before the RTR arrives
	sendMSN uint32
	readMSN uint32
	dead    bool
	err     error
	cause   error // why this side is terminating, set before it says so (blame)
	half    bool  // Disconnect was called: half-close, let the peer finish

	// Reader-only state.
	recvMSN, recvMO uint32
	readReqMSN      uint32
	// pre holds Read Response segments already placed by a speculative
	// read (see readSpec), to be checked and completed in turn.
	pre      []preSeg
	noSpec   bool // the peer's segments did not come as predicted, specMisses times
	specMiss int
	segMax   int // the longest Read Response segment not the last of its response
	specBuf  []specSeg
	// shift is the crc32c.Shift of the last Read Response payload's
	// length, shiftLen: nearly all have the same one (sumPlaced).
	shift    crc32c.Shift
	shiftLen int

	wake     chan struct{}
	done     chan struct{}
	teardown sync.Once
	linger   *time.Timer // closes the socket a while after a disconnect
	wg       sync.WaitGroup

	respBytes atomic.Uint64            // Read Response payload sent (ReadResponseBytes)
	spanBytes atomic.Uint64            // of which CRC'd from SpanSums (SpanSumBytes)
	pace      atomic.Pointer[paceFunc] // paces Read Responses, nil: not (pace.go)
}

func newQP(p *pendingQP, c net.Conn, crc bool, ord, ird int, peerPrivate []byte) *qp {
	q := &qp{
		dev: p.dev, pd: p.pd, sendCQ: p.sendCQ, recvCQ: p.recvCQ,
		qpn: p.dev.qpn.Add(1), conn: c, crc: crc,
		maxSend: p.cfg.MaxSendWR, maxRecv: p.cfg.MaxRecvWR,
		rq:      p.recvs,
		sendMSN: 1, readMSN: 1, recvMSN: 1, readReqMSN: 1,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	q.info = verbs.ConnInfo{
		ReadsOut: ord, ReadsIn: ird, PrivateData: peerPrivate,
		Local:  verbs.Endpoint{Provider: Name, Addr: c.LocalAddr().String(), QPN: q.qpn},
		Remote: verbs.Endpoint{Provider: Name, Addr: c.RemoteAddr().String()},
	}
	return q
}

// start runs the engine. An active side that negotiated p2p sends its RTR
// first; a passive one waits for it.
func (q *qp) start(rtr uint8, gated bool) {
	q.gated = gated
	if rtr == rtrKindWrite {
		q.sq = append(q.sq, &swr{wr: verbs.SendWR{Op: verbs.OpWrite, RKey: 1}, internal: true})
	} else if rtr == rtrKindRead {
		q.sq = append(q.sq, &swr{wr: verbs.SendWR{Op: verbs.OpRead, RKey: 1}, internal: true})
	}
	q.wg.Add(2)
	go q.reader()
	go q.writer()
	q.kick()
}

func (q *qp) kick() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *qp) Info() verbs.ConnInfo  { return q.info }
func (q *qp) Done() <-chan struct{} { return q.done }

func (q *qp) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

func (q *qp) Disconnect() error {
	q.mu.Lock()
	q.half = !q.dead
	q.failLocked(verbs.ErrDisconnected, nil, 0)
	q.mu.Unlock()
	q.close()
	return nil
}

// Close is bounded: the reader and writer wait on nothing but their
// socket (never on a region or a lock held across I/O), and the socket
// is closed at the latest linger after the disconnect.
func (q *qp) Close() error {
	q.Disconnect()
	q.wg.Wait()
	q.conn.Close()
	if q.linger != nil {
		q.linger.Stop()
	}
	return nil
}

// fail moves the QP to the error state: culprit (if any) completes with
// status, every other outstanding request with StatusWRFlush.
func (q *qp) fail(err error, culprit *swr, status verbs.Status) {
	q.mu.Lock()
	q.failLocked(err, culprit, status)
	q.mu.Unlock()
	q.close()
}

func (q *qp) failLocked(err error, culprit *swr, status verbs.Status) {
	if q.dead {
		// A socket the kernel aborted reports its reason (ETIMEDOUT, say)
		// once, to whichever of reader and writer asks first; the other
		// sees a plain end of stream or EPIPE. The more specific word,
		// if it comes second, replaces the plain one.
		if q.cause == nil && err != nil && moreSpecific(err, q.err) {
			q.err = err
		}
		return
	}
	q.dead = true
	q.err = err
	if q.cause != nil {
		q.err = q.cause
	}
	for _, s := range q.sq {
		if s.done || (s.writing && s != culprit) {
			// The writer has this one: if its bytes went out, it
			// completes with success even though the peer is gone.
			continue
		}
		s.done = true
		s.status = verbs.StatusWRFlush
		if s == culprit {
			s.status = status
		}
	}
	q.flushSQLocked()
	cs := make([]verbs.Completion, 0, len(q.rq))
	for _, r := range q.rq {
		cs = append(cs, verbs.Completion{WRID: r.wr.ID, Status: verbs.StatusWRFlush, Op: verbs.OpRecv, QPN: q.qpn})
	}
	q.rq = nil
	q.recvCQ.Push(cs...)
	q.reads = nil
	q.irq = nil
}

// moreSpecific says whether err explains a dead connection better than
// old: any word beats a plain end of stream, and one in words (a
// *connError: a timeout, a Terminate) beats a bare socket error.
func moreSpecific(err, old error) bool {
	if errors.Is(err, errPeerClosed) {
		return false
	}
	if errors.Is(old, errPeerClosed) {
		return true
	}
	var ce *connError
	return !errors.As(old, &ce) && errors.As(err, &ce)
}

// linger is how long a disconnect waits for the peer to read what was
// sent and hang up before the socket is closed anyway.
const linger = time.Second

// close ends the connection once the QP is dead. A disconnect half-closes
// first so that what was sent still arrives; the reader drains until the
// peer closes too, or linger passes.
func (q *qp) close() {
	q.mu.Lock()
	half := q.half
	q.mu.Unlock()
	q.teardown.Do(func() {
		close(q.done)
		if tc, ok := q.conn.(*net.TCPConn); ok && half {
			tc.CloseWrite()
			q.linger = time.AfterFunc(linger, func() { q.conn.Close() })
		} else {
			q.conn.Close()
		}
	})
}

// connError is a QP's Err in words for the layer above; the protocol or
// network error it stands for is wrapped.
type connError struct {
	msg string
	err error
}

func (e *connError) Error() string { return e.msg }
func (e *connError) Unwrap() error { return e.err }

// explain says what a Terminate, sent or received, means.
func (q *qp) explain(te *termError) error {
	peer := q.info.Remote.Addr
	what := termName(te.layer, te.etype, te.code)
	if te.msg != "" {
		what += ": " + te.msg
	}
	var msg string
	switch {
	case te.remote:
		msg = fmt.Sprintf("iwarp: %s terminated the connection (%s)", peer, what)
	case te.layer == layerLLP && te.code == llpBadCRC:
		msg = fmt.Sprintf("iwarp: FPDU CRC mismatch from %s (corrupted in transit); the connection was terminated", peer)
	case te.layer == layerLLP:
		msg = fmt.Sprintf("iwarp: malformed FPDU from %s (%s); the connection was terminated", peer, what)
	case te.layer == layerRDMAP && te.etype == rdmapCatastrophic:
		msg = fmt.Sprintf("iwarp: local error (%s); the connection to %s was terminated", te.msg, peer)
	case te.layer == layerRDMAP && te.etype == rdmapRemoteProt, te.layer == layerDDP && te.etype == ddpTaggedBuf:
		msg = fmt.Sprintf("iwarp: %s asked for memory it may not use (%s); the connection was terminated", peer, what)
	default:
		msg = fmt.Sprintf("iwarp: protocol error from %s (%s); the connection was terminated", peer, what)
	}
	return &connError{msg: msg, err: te}
}

// netErr is the Err of a connection the network broke.
func (q *qp) netErr(err error) error {
	if ut := q.dev.cfg.UserTimeout; ut > 0 && errors.Is(err, unix.ETIMEDOUT) {
		return &connError{
			msg: fmt.Sprintf("iwarp: %s acknowledged nothing within the TCP user timeout (%v): the link is down, or the peer is gone or stopped reading: %v", q.info.Remote.Addr, ut, err),
			err: fmt.Errorf("%w: %w", verbs.ErrDisconnected, err),
		}
	}
	return fmt.Errorf("%w: %w", verbs.ErrDisconnected, err)
}

// deregistered is the Err of a transfer MR.Close cut; what names the
// region, up to the peer's address.
func (q *qp) deregistered(what string) error {
	return &connError{
		msg: fmt.Sprintf("iwarp: %s %s was deregistered (MR.Close) mid-transfer; the connection was closed", what, q.info.Remote.Addr),
		err: fmt.Errorf("%w: %w", errDeregistered, verbs.StatusLocalProtect),
	}
}

// flushSQLocked delivers, in order, the completions at the head of the SQ.
func (q *qp) flushSQLocked() {
	n := 0
	var cs []verbs.Completion
	for n < len(q.sq) && q.sq[n].done {
		s := q.sq[n]
		if !s.internal {
			cs = append(cs, verbs.Completion{WRID: s.wr.ID, Status: s.status, Op: s.wr.Op, QPN: q.qpn, Sum: s.sum})
			q.posted--
		}
		q.sq[n] = nil
		n++
	}
	if n == 0 {
		return
	}
	q.sq = q.sq[n:]
	q.next -= n
	if q.next < 0 {
		q.next = 0
	}
	q.sendCQ.Push(cs...)
}

func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	q.mu.Lock()
	defer q.close2()
	defer q.mu.Unlock()
	if q.dead {
		// Flushed, behind whatever the writer still has to complete.
		for _, wr := range wrs {
			q.sq = append(q.sq, &swr{wr: wr, done: true, status: verbs.StatusWRFlush})
			q.posted++
		}
		q.flushSQLocked()
		return len(wrs), nil
	}
	for i, wr := range wrs {
		if q.posted >= q.maxSend {
			return i, opErr("post_send", verbs.ErrQueueFull)
		}
		s := &swr{wr: wr}
		switch wr.Op {
		case verbs.OpSend, verbs.OpWrite:
			if uint64(wr.Local.Length) > q.dev.Caps().MaxMsgSize {
				return i, opErr("post_send", fmt.Errorf("%w: %d bytes over the message limit", verbs.ErrInvalid, wr.Local.Length))
			}
		case verbs.OpRead:
			if wr.Local.Length == 0 || uint64(wr.Local.Length) > q.dev.Caps().MaxMsgSize {
				return i, opErr("post_send", fmt.Errorf("%w: READ of %d bytes", verbs.ErrInvalid, wr.Local.Length))
			}
			if q.info.ReadsOut == 0 {
				return i, opErr("post_send", fmt.Errorf("%w: the peer accepts no READs (IRD 0)", verbs.ErrInvalid))
			}
		case verbs.OpBindMW:
			w, ok := wr.MW.(*mw)
			m, ok2 := wr.BindMR.(*mr)
			s.done = true
			s.status = verbs.StatusMWBind
			if ok && ok2 {
				s.status = w.bind(q, m, wr.BindAddr, wr.BindLen, wr.BindAccess)
			}
		case verbs.OpLocalInv:
			s.done = true
			s.status = verbs.StatusMWBind
			if w, ok := q.dev.lookup(wr.RKey).(*mw); ok && w.pd == q.pd {
				s.status = w.invalidate(wr.RKey)
			}
		default:
			return i, opErr("post_send", fmt.Errorf("%w: opcode %v on the send queue", verbs.ErrInvalid, wr.Op))
		}
		q.sq = append(q.sq, s)
		q.posted++
		if s.done && s.status != verbs.StatusSuccess {
			q.failLocked(fmt.Errorf("%v: %w", wr.Op, s.status), s, s.status)
			return i + 1, nil
		}
	}
	q.flushSQLocked()
	q.kick()
	return len(wrs), nil
}

// close2 tears the connection down if a post just failed the QP.
func (q *qp) close2() {
	q.mu.Lock()
	dead := q.dead
	q.mu.Unlock()
	if dead {
		q.close()
	}
}

func (d *device) checkRecv(p *pd, wr verbs.RecvWR) (rwr, error) {
	if wr.Local.Length == 0 {
		return rwr{wr: wr}, nil
	}
	m, ok := d.lookup(wr.Local.LKey).(*mr)
	if !ok || m.pd != p || m.access&verbs.AccessLocalWrite == 0 {
		return rwr{}, opErr("post_recv", fmt.Errorf("%w: lkey %#x is not writable local memory of this PD", verbs.ErrInvalid, wr.Local.LKey))
	}
	if _, ok := m.span(wr.Local.Addr, uint64(wr.Local.Length)); !ok {
		return rwr{}, opErr("post_recv", fmt.Errorf("%w: buffer outside its MR", verbs.ErrInvalid))
	}
	return rwr{wr: wr}, nil
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		cs := make([]verbs.Completion, len(wrs))
		for i, wr := range wrs {
			cs[i] = verbs.Completion{WRID: wr.ID, Status: verbs.StatusWRFlush, Op: verbs.OpRecv, QPN: q.qpn}
		}
		q.recvCQ.Push(cs...)
		return len(wrs), nil
	}
	for i, wr := range wrs {
		if len(q.rq) >= q.maxRecv {
			return i, opErr("post_recv", verbs.ErrQueueFull)
		}
		r, err := q.dev.checkRecv(q.pd, wr)
		if err != nil {
			return i, err
		}
		q.rq = append(q.rq, r)
	}
	return len(wrs), nil
}
