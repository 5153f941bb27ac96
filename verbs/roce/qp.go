package roce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
)

// qp is a reliable-connected queue pair. After connection setup one
// goroutine, the engine (run), owns the transport state of both halves:
// the requester (PSNs, WRs in flight, retransmission) and the responder
// (expected PSN, the receive being filled, ACKs owed). Other goroutines
// only queue work (PostSend, PostRecv), deliver packets (device.receive)
// or ask it to stop (shutdown).
type qp struct {
	dev     *device
	pd      *pd
	qpn     uint32
	sendCQ  *cq
	recvCQ  *cq
	maxSend int
	maxRecv int
	offer   reads // what this side offers: ORD (out) and IRD (in)

	// Set once at connection, before connected is stored.
	rqpn      uint32
	local     netip.Addr
	remote    netip.AddrPort
	mtu       int
	info      verbs.ConnInfo
	cm        net.Conn
	cmOnce    sync.Once
	connected atomic.Bool

	in     chan inPacket
	kick   chan struct{}
	stopCh chan error

	mu     sync.Mutex
	posted []*swqe // posted, not yet taken by the engine
	sqUsed int     // posted plus in flight
	rq     []verbs.RecvWR
	dead   bool
	err    error
	done   chan struct{}

	// Requester state, the engine's alone.
	inflight    []*swqe
	nextPSN     uint32 // the PSN the next new WR starts at
	una         uint32 // the oldest PSN not yet acknowledged
	readsOut    int    // negotiated ORD
	readsIn     int    // negotiated IRD
	readsActive int    // READ requests out and not finished
	readBytes   int64  // bytes those READs still owe
	acked       uint32 // the highest PSN acknowledged, when ackedOK
	ackedOK     bool
	retries     int
	rnrRetries  int
	progress    time.Time // when the requester last moved forward
	rnrUntil    time.Time // resend after an RNR NAK once this has passed
	nakFrom     uint32    // READs from this PSN on were dropped by the responder,
	nakAt       time.Time // as a NAK said then (zero: none pending; readrx.go)

	// Responder state, the engine's alone.
	ePSN     uint32 // the PSN the next new request must carry
	msn      uint32
	cur      *verbs.RecvWR // the receive a multi-packet SEND is filling
	curOff   int
	nakSent  bool // a PSN sequence NAK is out for ePSN
	ackOwed  bool
	rnrPSN   uint32
	rnrNaked bool

	resps   []readResp // the READs this responder took, IRD of them (readresp.go)
	respsAt int        // where the next goes

	scratch []byte
}

type reads struct{ out, in int }

type inPacket struct {
	packet
	buf *dgram
}

// swqe is a send WR the engine has taken.
type swqe struct {
	wr    verbs.SendWR
	first uint32 // its first PSN
	npsn  int    // PSNs it spans: its packets, or a READ's responses
	next  int    // SEND: packets transmitted since the last go-back-N
	bad   verbs.Status
	rx    readRx // READ: its responses (readrx.go)
}

func (w *swqe) last() uint32 { return psnAdd(w.first, w.npsn-1) }

// psnWindow bounds the PSNs in flight: PSN comparisons (psnDiff) hold
// only within half the 24-bit space, 2^23; this keeps well inside it. It
// refuses one message of 2^22 packets or more (1 GiB at MTU 256).
const psnWindow = 1 << 22

func packets(n uint64, mtu int) int {
	if n == 0 {
		return 1
	}
	return int((n + uint64(mtu) - 1) / uint64(mtu))
}

func newQP(d *device, pv verbs.PD, cfg verbs.QPConfig) (*qp, error) {
	p, ok := pv.(*pd)
	if !ok || p.dev != d {
		return nil, opErr("create_qp", fmt.Errorf("%w: protection domain of another device", verbs.ErrInvalid))
	}
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, opErr("create_qp", fmt.Errorf("%w: completion queues of another provider", verbs.ErrInvalid))
	}
	cfg, err := cfg.Resolve(d.Caps())
	if err != nil {
		return nil, opErr("create_qp", err)
	}
	q := &qp{dev: d, pd: p, sendCQ: scq, recvCQ: rcq,
		maxSend: cfg.MaxSendWR, maxRecv: cfg.MaxRecvWR,
		offer: reads{out: cfg.MaxReadsOut, in: cfg.MaxReadsIn},
		in:    make(chan inPacket, 8192), kick: make(chan struct{}, 1), stopCh: make(chan error, 1),
		done: make(chan struct{})}
	q.qpn = d.newQPN()
	q.nextPSN = randPSN()
	q.una = q.nextPSN
	d.register(q)
	return q, nil
}

// accepts says whether a datagram from a may be for this QP: it is
// connected and the datagram comes from the peer's address. The source
// port is RoCEv2's flow entropy and says nothing.
func (q *qp) accepts(a addrs) bool {
	return q.connected.Load() && a.src == q.remote.Addr()
}

func (q *qp) deliver(p inPacket) {
	select {
	case q.in <- p:
	default: // the queue is full: a drop, as a NIC's full buffer; go-back-N repairs it
		q.dev.dropped.Add(1)
		putBuf(p.buf)
	}
}

func (q *qp) poke() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// start begins the engine once the connection's parameters are set.
func (q *qp) start(ePSN uint32) {
	q.ePSN = ePSN
	q.progress = time.Now()
	q.scratch = make([]byte, q.mtu+256)
	q.connected.Store(true)
	go q.run()
}

func (q *qp) run() {
	rto := q.dev.cfg.RetransmitTimeout
	tick := time.NewTicker(rto / 4)
	defer tick.Stop()
	for {
		select {
		case p := <-q.in:
			q.handle(p)
			for range 256 {
				select {
				case p := <-q.in:
					q.handle(p)
					continue
				default:
				}
				break
			}
		case <-q.kick:
		case <-tick.C:
			q.onTimer(rto)
		case err := <-q.stopCh:
			q.die(0, err)
		}
		if q.isDead() {
			q.drainIn()
			return
		}
		q.flushAck()
		q.transmit()
	}
}

func (q *qp) isDead() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dead
}

func (q *qp) drainIn() {
	for {
		select {
		case p := <-q.in:
			putBuf(p.buf)
		default:
			return
		}
	}
}

func (q *qp) handle(p inPacket) {
	defer putBuf(p.buf)
	if q.isDead() {
		return
	}
	switch p.opcode {
	case opAck:
		q.onAck(&p.packet)
	case opReadRespFirst, opReadRespMiddle, opReadRespLast, opReadRespOnly:
		q.onReadResponse(&p.packet)
	default:
		q.onRequest(&p.packet)
	}
}

// ---- Requester ----

// PostSend queues wrs for the engine.
func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return 0, q.deadErr("post_send")
	}
	for i, wr := range wrs {
		if wr.Op != verbs.OpSend && wr.Op != verbs.OpRead {
			return i, opErr("post_send", fmt.Errorf("%w: %v", verbs.ErrUnsupported, wr.Op))
		}
		if q.sqUsed >= q.maxSend {
			return i, opErr("post_send", verbs.ErrQueueFull)
		}
		q.sqUsed++
		q.posted = append(q.posted, &swqe{wr: wr})
	}
	q.poke()
	return len(wrs), nil
}

func (q *qp) deadErr(op string) error {
	return opErr(op, fmt.Errorf("%w: %w", verbs.ErrDisconnected, q.err))
}

// take moves posted WRs into flight, checking each one's local memory.
// A WR that fails its check is taken only once nothing is ahead of it,
// so that completions stay in posting order.
func (q *qp) take() {
	for len(q.inflight) < q.maxSend {
		q.mu.Lock()
		if len(q.posted) == 0 {
			q.mu.Unlock()
			return
		}
		w := q.posted[0]
		q.mu.Unlock()
		w.bad = q.checkLocal(w)
		if w.bad != verbs.StatusSuccess {
			if len(q.inflight) > 0 {
				return
			}
			q.mu.Lock()
			q.posted = q.posted[1:]
			q.mu.Unlock()
			q.inflight = append(q.inflight, w)
			q.die(w.bad, fmt.Errorf("work request %#x: %v", w.wr.ID, w.bad))
			return
		}
		np := packets(uint64(w.wr.Local.Length), q.mtu)
		if len(q.inflight) > 0 && psnDiff(q.nextPSN, q.una)+np >= psnWindow {
			return // the PSNs in flight would pass half the PSN space
		}
		q.mu.Lock()
		q.posted = q.posted[1:]
		q.mu.Unlock()
		w.first = q.nextPSN
		w.npsn = np
		q.nextPSN = psnAdd(q.nextPSN, w.npsn)
		if len(q.inflight) == 0 {
			q.progress = time.Now()
		}
		q.inflight = append(q.inflight, w)
	}
}

func (q *qp) checkLocal(w *swqe) verbs.Status {
	s := w.wr.Local
	if uint64(s.Length) > q.dev.Caps().MaxMsgSize || packets(uint64(s.Length), q.mtu) >= psnWindow {
		return verbs.StatusLocalLength
	}
	need := verbs.Access(0)
	if w.wr.Op == verbs.OpRead {
		need = verbs.AccessLocalWrite
	}
	if s.Length == 0 {
		return verbs.StatusSuccess
	}
	m, _, ok := q.dev.resolve(q.pd, s.LKey, s.Addr, uint64(s.Length), need)
	if !ok {
		return verbs.StatusLocalProtect
	}
	m.release()
	return verbs.StatusSuccess
}

// transmit sends what the window allows: SEND packets up to sendWindow
// PSNs past una, READ requests up to the negotiated ORD and
// maxReadBytesOut of responses owed.
func (q *qp) transmit() {
	if q.isDead() || time.Now().Before(q.rnrUntil) {
		return
	}
	q.take()
	for _, w := range q.inflight {
		switch w.wr.Op {
		case verbs.OpSend:
			for w.next < w.npsn {
				if psnDiff(psnAdd(w.first, w.next), q.una) >= sendWindow {
					return
				}
				if !q.sendSegment(w, w.next) {
					return
				}
				w.next++
			}
			if w.next < w.npsn {
				return
			}
		case verbs.OpRead:
			if w.rx.asked {
				continue
			}
			if !w.rx.sent && !q.startRead(w) {
				return
			}
			q.askRead(w, w.rx.got, w.npsn)
			w.rx.asked = true
		}
	}
}

func (q *qp) sendSegment(w *swqe, i int) bool {
	n := uint64(w.wr.Local.Length)
	off := uint64(i) * uint64(q.mtu)
	chunk := min(uint64(q.mtu), n-off)
	p := packet{pkey: defaultPKey, destQP: q.rqpn, psn: psnAdd(w.first, i)}
	switch {
	case w.npsn == 1:
		p.opcode = opSendOnly
	case i == 0:
		p.opcode = opSendFirst
	case i == w.npsn-1:
		p.opcode = opSendLast
	default:
		p.opcode = opSendMiddle
	}
	p.ackReq = p.opcode == opSendOnly || p.opcode == opSendLast
	if chunk == 0 {
		q.put(&p)
		return true
	}
	m, b, ok := q.dev.resolve(q.pd, w.wr.Local.LKey, w.wr.Local.Addr+off, chunk, 0)
	if !ok {
		q.die(verbs.StatusLocalProtect, fmt.Errorf("work request %#x: %w", w.wr.ID, errDeregistered))
		return false
	}
	p.payload = b
	q.put(&p)
	m.release()
	return true
}

var errDeregistered = errors.New("registered memory was deregistered (MR.Close) while in use")

// owe counts READ response bytes asked for (n > 0) or received or given
// up on (n < 0), for the QP and its device.
func (q *qp) owe(n int64) {
	q.readBytes += n
	q.dev.readOut.Add(n)
}

// put encodes and sends one packet to the peer. A send error is a lost
// packet: retransmission repairs it or the retry count ends the QP.
func (q *qp) put(p *packet) {
	a := addrs{src: q.local, dst: q.remote.Addr(), srcPort: q.dev.port, dstPort: q.remote.Port()}
	b := encode(q.scratch, p, a)
	q.dev.send(b, q.local, q.remote)
}

// completeFront pops the oldest WR with status s.
func (q *qp) completeFront(s verbs.Status) {
	w := q.inflight[0]
	q.inflight = q.inflight[1:]
	if w.wr.Op == verbs.OpRead && w.rx.sent {
		q.readsActive--
		q.owe(-w.rx.owed)
		w.rx.owed = 0
	}
	q.mu.Lock()
	q.sqUsed--
	q.mu.Unlock()
	q.sendCQ.Push(verbs.Completion{WRID: w.wr.ID, Status: s, Op: w.wr.Op, QPN: q.qpn})
	q.moved()
}

func (q *qp) moved() { q.movedAt(time.Now()) }

// movedAt is moved for a caller that has read the clock already.
func (q *qp) movedAt(now time.Time) {
	q.progress = now
	q.retries = 0
	q.rnrRetries = 0
}

// ackThrough applies an acknowledgement of every PSN up to and including
// psn (an ACK, or a READ response for the requests before its READ). It
// also says that the responder has sent every response of the READs
// before psn: those still missing some were lost (readrx.go).
func (q *qp) ackThrough(psn uint32) {
	if psnDiff(psn, q.una) < -1 || psnDiff(psn, q.nextPSN) >= 0 {
		return // stale, or for a PSN never sent: ignore
	}
	if !q.ackedOK || psnDiff(psn, q.acked) > 0 {
		q.acked, q.ackedOK = psn, true
	}
	q.readsSentThrough(psn)
	q.completeReady()
}

// completeReady completes, in order, the WRs at the front that are done:
// SENDs acknowledged, READs whose every response has come.
func (q *qp) completeReady() {
	for len(q.inflight) > 0 {
		w := q.inflight[0]
		if w.wr.Op == verbs.OpRead {
			if !w.rx.sent {
				return
			}
			if una := psnAdd(w.first, w.rx.got); psnDiff(una, q.una) > 0 {
				q.una = una
			}
			if w.rx.recv < w.npsn {
				return
			}
			q.una = psnAdd(w.last(), 1)
			q.completeFront(verbs.StatusSuccess)
			continue
		}
		if !q.ackedOK {
			return
		}
		if psnDiff(q.acked, w.last()) >= 0 {
			q.una = psnAdd(w.last(), 1)
			q.completeFront(verbs.StatusSuccess)
			continue
		}
		if psnDiff(q.acked, q.una) >= 0 {
			q.una = psnAdd(q.acked, 1)
			q.moved()
		}
		return
	}
}

func (q *qp) onAck(p *packet) {
	syn := p.syndrome & 0xe0
	switch syn {
	case synACK:
		q.ackThrough(p.psn)
	case synRNR:
		q.ackThrough(psnAdd(p.psn, -1))
		if len(q.inflight) == 0 {
			return
		}
		q.rnrRetries++
		if q.rnrRetries > q.dev.cfg.RNRRetry {
			q.die(verbs.StatusRNRRetry, fmt.Errorf("receiver not ready %d times in a row", q.rnrRetries))
			return
		}
		delay := q.dev.cfg.RNRDelay
		if delay == 0 {
			delay = rnrDelay(p.syndrome & 0x1f)
		}
		q.rnrUntil = time.Now().Add(delay)
		q.goBackFrom(p.psn)
	case synNAK:
		q.ackThrough(psnAdd(p.psn, -1))
		if len(q.inflight) == 0 {
			return
		}
		switch code := p.syndrome & 0x1f; code {
		case nakPSNSeq:
			// The responder saw a gap in our requests: it expects
			// p.psn, and dropped what came after it.
			if psnDiff(p.psn, q.una) >= 0 && psnDiff(p.psn, q.nextPSN) < 0 {
				q.goBackFrom(p.psn)
			}
		case nakInvalidReq:
			q.die(verbs.StatusRemoteInvalid, errors.New("the peer refused a request as invalid (NAK)"))
		case nakRemoteAcc:
			q.die(verbs.StatusRemoteAccess, errors.New("the peer refused a READ: bad rkey, bounds or rights (NAK)"))
		default:
			q.die(verbs.StatusRemoteOp, fmt.Errorf("the peer failed a request (NAK code %d)", code))
		}
	}
}

// goBack rewinds transmission to una after a retransmit timeout: every
// SEND in flight is sent again from its first unacknowledged PSN
// (go-back-N), every READ asked again for what it still misses.
func (q *qp) goBack() {
	for _, w := range q.inflight {
		switch w.wr.Op {
		case verbs.OpSend:
			w.next = max(0, min(w.npsn, psnDiff(q.una, w.first)))
		case verbs.OpRead:
			w.rx.asked = false
			w.rx.fixAt = time.Time{}
		}
	}
	q.progress = time.Now()
}

// goBackFrom sends again every request from psn on, which the responder
// dropped (a PSN sequence NAK, an RNR NAK): SEND packets from psn at
// once, and the READs at or after it once they have had time to show
// they were taken after all (readsDropped).
func (q *qp) goBackFrom(psn uint32) {
	for _, w := range q.inflight {
		if w.wr.Op == verbs.OpSend && psnDiff(w.last(), psn) >= 0 {
			w.next = max(0, min(w.npsn, psnDiff(psn, w.first)))
		}
	}
	if q.nakAt.IsZero() || psnDiff(psn, q.nakFrom) < 0 {
		q.nakFrom = psn
	}
	q.nakAt = time.Now()
	q.progress = time.Now()
}

func (q *qp) onTimer(rto time.Duration) {
	if !q.onWire() {
		q.progress = time.Now() // waiting for the window or the READ budget is no loss
		return
	}
	if time.Since(q.progress) < rto || time.Now().Before(q.rnrUntil) {
		q.readsDropped(time.Now(), rto)
		q.repairReads(time.Now(), rto)
		return
	}
	q.retries++
	if q.retries > q.dev.cfg.RetryCount {
		q.die(verbs.StatusRetryExceeded, fmt.Errorf("no acknowledgement from %v after %d retransmissions %v apart", q.remote, q.dev.cfg.RetryCount, rto))
		return
	}
	q.goBack()
}

// onWire says whether a packet of ours awaits an answer: a SEND packet
// or a READ request sent and not yet acknowledged.
func (q *qp) onWire() bool {
	for _, w := range q.inflight {
		if w.rx.asked || w.next > 0 {
			return true
		}
	}
	return false
}

// rnrDelay decodes the IB RNR NAK timer field (IBTA table 45), in µs.
func rnrDelay(code uint8) time.Duration {
	us := [32]int{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
		2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}
	return time.Duration(us[code&0x1f]) * time.Microsecond
}

// rnrTimerCode is what this responder asks for in an RNR NAK: 10.24 ms.
const rnrTimerCode = 20

// ---- Responder ----

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return 0, q.deadErr("post_recv")
	}
	for i, wr := range wrs {
		if len(q.rq) >= q.maxRecv {
			return i, opErr("post_recv", verbs.ErrQueueFull)
		}
		q.rq = append(q.rq, wr)
	}
	return len(wrs), nil
}

func (q *qp) onRequest(p *packet) {
	d := psnDiff(p.psn, q.ePSN)
	if d < 0 {
		// A duplicate: the requester missed our answer. A READ is
		// served again if it may be (readresp.go), anything else is
		// acknowledged.
		if p.opcode == opReadRequest {
			if q.replayable(p) {
				q.dev.replays.Add(1)
				q.serveRead(p)
			}
		} else {
			q.ackOwed = true
		}
		return
	}
	if d > 0 {
		if !q.nakSent {
			q.nakSent = true
			q.sendAck(synNAK|nakPSNSeq, q.ePSN)
		}
		return
	}
	q.nakSent = false
	if p.opcode == opReadRequest {
		if q.cur != nil {
			q.refuse(nakInvalidReq, p.psn, verbs.StatusRemoteInvalid, "a READ request in the middle of a SEND")
			return
		}
		q.ePSN = psnAdd(q.ePSN, packets(uint64(p.dmaLen), q.mtu))
		q.msn++
		q.tookRead(p)
		q.serveRead(p)
		return
	}
	q.onSend(p)
}

func (q *qp) onSend(p *packet) {
	first := p.opcode == opSendFirst || p.opcode == opSendOnly
	last := p.opcode == opSendLast || p.opcode == opSendOnly
	if first != (q.cur == nil) {
		q.refuse(nakInvalidReq, p.psn, verbs.StatusRemoteInvalid, fmt.Sprintf("SEND opcode %#x out of sequence", p.opcode))
		return
	}
	if (!last && len(p.payload) != q.mtu) || len(p.payload) > q.mtu {
		q.refuse(nakInvalidReq, p.psn, verbs.StatusRemoteInvalid, fmt.Sprintf("SEND packet of %d bytes with MTU %d", len(p.payload), q.mtu))
		return
	}
	if first {
		q.mu.Lock()
		if len(q.rq) == 0 {
			q.mu.Unlock()
			// Every try gets its NAK: the requester counts them
			// (RNRRetry), and a try unanswered would cost it a
			// retransmit timeout instead.
			q.sendAck(synRNR|rnrTimerCode, p.psn)
			return
		}
		wr := q.rq[0]
		q.rq = q.rq[1:]
		q.mu.Unlock()
		q.cur, q.curOff = &wr, 0
	}
	if n := len(p.payload); n > 0 {
		if q.curOff+n > int(q.cur.Local.Length) {
			q.refuse(nakInvalidReq, p.psn, verbs.StatusLocalLength, fmt.Sprintf("a SEND longer than the %d-byte receive", q.cur.Local.Length))
			return
		}
		m, b, ok := q.dev.resolve(q.pd, q.cur.Local.LKey, q.cur.Local.Addr+uint64(q.curOff), uint64(n), verbs.AccessLocalWrite)
		if !ok {
			q.refuse(nakRemoteOp, p.psn, verbs.StatusLocalProtect, "the receive's memory is not writable (lkey, bounds or rights)")
			return
		}
		copy(b, p.payload)
		m.release()
		q.curOff += n
	}
	q.ePSN = psnAdd(q.ePSN, 1)
	if last {
		q.recvCQ.Push(verbs.Completion{WRID: q.cur.ID, Status: verbs.StatusSuccess, Op: verbs.OpRecv, Bytes: uint32(q.curOff), QPN: q.qpn})
		q.cur = nil
		q.msn++
	}
	if p.ackReq {
		q.ackOwed = true
	}
}

// refuse NAKs the request at psn and fails the QP: the receive being
// filled, if any, completes with s.
func (q *qp) refuse(code uint8, psn uint32, s verbs.Status, why string) {
	q.sendAck(synNAK|code, psn)
	q.dieRecv(s, errors.New(why))
}

func (q *qp) serveRead(p *packet) {
	n := uint64(p.dmaLen)
	if n > q.dev.Caps().MaxMsgSize {
		q.refuse(nakInvalidReq, p.psn, verbs.StatusRemoteInvalid, fmt.Sprintf("peer READ of %d bytes, past the %d-byte message limit", n, q.dev.Caps().MaxMsgSize))
		return
	}
	var m *mr
	var b []byte
	if n > 0 {
		var ok bool
		m, b, ok = q.dev.resolve(q.pd, p.rkey, p.va, n, verbs.AccessRemoteRead)
		if !ok {
			q.sendAck(synNAK|nakRemoteAcc, p.psn)
			q.die(0, fmt.Errorf("peer READ of %d bytes at %#x with rkey %#x refused: unknown key, out of bounds or not readable", n, p.va, p.rkey))
			return
		}
		defer m.release()
	}
	np := packets(n, q.mtu)
	for i := range np {
		r := packet{pkey: defaultPKey, destQP: q.rqpn, psn: psnAdd(p.psn, i), syndrome: synACK | creditInvalid, msn: q.msn}
		switch {
		case np == 1:
			r.opcode = opReadRespOnly
		case i == 0:
			r.opcode = opReadRespFirst
		case i == np-1:
			r.opcode = opReadRespLast
		default:
			r.opcode = opReadRespMiddle
		}
		if n > 0 {
			off := uint64(i) * uint64(q.mtu)
			r.payload = b[off : off+min(uint64(q.mtu), n-off)]
		}
		q.put(&r)
	}
}

func (q *qp) sendAck(syndrome uint8, psn uint32) {
	if syndrome == synACK {
		syndrome |= creditInvalid
	}
	q.put(&packet{opcode: opAck, pkey: defaultPKey, destQP: q.rqpn, psn: psn, syndrome: syndrome, msn: q.msn})
}

// flushAck sends the one ACK that covers every request handled since the
// last (ACK coalescing): it goes when the engine has no packet waiting.
func (q *qp) flushAck() {
	if q.ackOwed && !q.isDead() {
		q.ackOwed = false
		q.sendAck(synACK, psnAdd(q.ePSN, -1))
	}
}

// ---- Teardown ----

// shutdown asks the engine to stop with err; before the engine runs it
// stops the QP itself.
func (q *qp) shutdown(err error) {
	if !q.connected.Load() {
		q.die(0, err)
		return
	}
	select {
	case q.stopCh <- err:
	default:
	}
}

// die moves the QP to the error state: the oldest WR in flight completes
// with s (unless s is 0), every other WR and every receive is flushed,
// and the connection is closed. Only the engine calls it once started.
func (q *qp) die(s verbs.Status, err error) { q.dieWith(s, 0, err) }

// dieRecv is die for a responder error: the receive being filled
// completes with s.
func (q *qp) dieRecv(s verbs.Status, err error) { q.dieWith(0, s, err) }

func (q *qp) dieWith(sendStatus, recvStatus verbs.Status, err error) {
	q.mu.Lock()
	if q.dead {
		q.mu.Unlock()
		return
	}
	q.dead = true
	q.err = err
	posted, rq := q.posted, q.rq
	q.posted, q.rq = nil, nil
	q.mu.Unlock()

	var sc []verbs.Completion
	for i, w := range append(q.inflight, posted...) {
		s := verbs.StatusWRFlush
		if i == 0 && sendStatus != 0 {
			s = sendStatus
		}
		sc = append(sc, verbs.Completion{WRID: w.wr.ID, Status: s, Op: w.wr.Op, QPN: q.qpn})
	}
	q.inflight = nil
	q.owe(-q.readBytes)
	q.sendCQ.Push(sc...)
	var rc []verbs.Completion
	if q.cur != nil {
		s := verbs.StatusWRFlush
		if recvStatus != 0 {
			s = recvStatus
		}
		rc = append(rc, verbs.Completion{WRID: q.cur.ID, Status: s, Op: verbs.OpRecv, QPN: q.qpn})
		q.cur = nil
	}
	for _, r := range rq {
		rc = append(rc, verbs.Completion{WRID: r.ID, Status: verbs.StatusWRFlush, Op: verbs.OpRecv, QPN: q.qpn})
	}
	q.recvCQ.Push(rc...)
	q.dev.unregister(q)
	close(q.done)
}

func (q *qp) Info() verbs.ConnInfo { return q.info }

func (q *qp) Done() <-chan struct{} { return q.done }

func (q *qp) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Disconnect ends the connection: the engine flushes the outstanding
// work, then a DREQ tells the peer. A QP that failed on its own (a NAK,
// the retry count) stays connected until then, as an IB QP in the error
// state does, so that the peer learns of the failure from the NAK, not
// from a DREQ racing it.
func (q *qp) Disconnect() error {
	q.shutdown(verbs.ErrDisconnected)
	var err error
	select {
	case <-q.done:
	case <-time.After(q.dev.cfg.SetupTimeout):
		err = opErr("disconnect", errors.New("engine did not stop in time"))
	}
	q.closeCM(true)
	return err
}

// closeCM ends the connection-setup channel, with a DREQ if dreq is set.
func (q *qp) closeCM(dreq bool) {
	q.cmOnce.Do(func() {
		if q.cm == nil {
			return
		}
		if dreq {
			oob.WriteFrame(q.cm, oob.DREQ, nil) // best effort: else the peer sees the close
		}
		q.cm.Close()
	})
}

func (q *qp) Close() error { return q.Disconnect() }
