package roce

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// Connection setup is an out-of-band exchange over TCP, shaped after the
// IB CM's REQ, REP, RTU, REJ and DREQ (docs/protocol.md, "roce-soft
// connection setup"). The TCP connection stays open for the QP's life:
// its end, or a DREQ on it, is the disconnect, so a peer that exits is
// seen at once rather than after the retry count runs out.
//
// Frame: type (1 byte), body length (2 bytes, big-endian), body.
// REQ and REP body: version (1) = 1, QPN (4), starting PSN (4), UDP port
// (2), MTU (2), ORD offered (2), IRD offered (2), private data (rest).
const (
	msgREQ  = 1
	msgREP  = 2
	msgRTU  = 3
	msgREJ  = 4
	msgDREQ = 5

	cmVersion   = 1
	cmFixedLen  = 17
	maxFrameLen = cmFixedLen + maxPrivateData
	// maxPrivateData is what rdma_cm lets a user put in a REQ (IB CM's 92
	// bytes less its 36-byte header), so that software written against
	// this provider fits the IB CM exchange too.
	maxPrivateData = 56
)

type cmParams struct {
	qpn      uint32
	psn      uint32
	udpPort  uint16
	mtu      uint16
	ord, ird uint16
	private  []byte
}

var errCMFrame = errors.New("roce: malformed connection message")

func encodeParams(p cmParams) []byte {
	b := make([]byte, cmFixedLen, cmFixedLen+len(p.private))
	b[0] = cmVersion
	binary.BigEndian.PutUint32(b[1:], p.qpn)
	binary.BigEndian.PutUint32(b[5:], p.psn)
	binary.BigEndian.PutUint16(b[9:], p.udpPort)
	binary.BigEndian.PutUint16(b[11:], p.mtu)
	binary.BigEndian.PutUint16(b[13:], p.ord)
	binary.BigEndian.PutUint16(b[15:], p.ird)
	return append(b, p.private...)
}

func decodeParams(b []byte) (cmParams, error) {
	var p cmParams
	if len(b) < cmFixedLen || b[0] != cmVersion {
		return p, fmt.Errorf("%w: %d-byte REQ/REP", errCMFrame, len(b))
	}
	p.qpn = binary.BigEndian.Uint32(b[1:])
	p.psn = binary.BigEndian.Uint32(b[5:])
	p.udpPort = binary.BigEndian.Uint16(b[9:])
	p.mtu = binary.BigEndian.Uint16(b[11:])
	p.ord = binary.BigEndian.Uint16(b[13:])
	p.ird = binary.BigEndian.Uint16(b[15:])
	p.private = append([]byte(nil), b[cmFixedLen:]...)
	if p.qpn < 2 || p.qpn > qpnMask || p.psn > psnMask || p.udpPort == 0 || !validMTU(int(p.mtu)) || p.ord == 0 || p.ird == 0 {
		return p, fmt.Errorf("%w: QPN %#x PSN %#x port %d MTU %d ORD %d IRD %d", errCMFrame, p.qpn, p.psn, p.udpPort, p.mtu, p.ord, p.ird)
	}
	return p, nil
}

func writeFrame(c net.Conn, typ uint8, body []byte) error {
	b := make([]byte, 3+len(body))
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], uint16(len(body)))
	copy(b[3:], body)
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Write(b)
	return err
}

func readFrame(c net.Conn) (uint8, []byte, error) {
	var h [3]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(h[1:]))
	if n > maxFrameLen {
		return 0, nil, fmt.Errorf("%w: %d-byte body", errCMFrame, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return 0, nil, err
	}
	return h[0], b, nil
}

func randPSN() uint32 { return rand.Uint32() & psnMask }

// watchDeadline makes blocking I/O on c end when ctx does; stop undoes it.
func watchDeadline(ctx context.Context, c net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

// ctxErr prefers the context's error to the I/O error it caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (d *device) setupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d.cfg.SetupTimeout)
}

// ---- Passive side ----

type listener struct {
	dev  *device
	ln   net.Listener
	reqs chan *connReq
	stop chan struct{}
	once sync.Once
}

func (d *device) Listen(ctx context.Context, addr string) (verbs.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp4", addr)
	if err != nil {
		return nil, &verbs.OpError{Op: "listen", Provider: Name, Addr: addr, Err: err}
	}
	l := &listener{dev: d, ln: ln, reqs: make(chan *connReq, 64), stop: make(chan struct{})}
	go l.acceptLoop()
	return l, nil
}

func (l *listener) acceptLoop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.readRequest(c)
	}
}

// readRequest reads a REQ within the setup timeout and queues it.
func (l *listener) readRequest(c net.Conn) {
	c.SetDeadline(time.Now().Add(l.dev.cfg.SetupTimeout))
	typ, body, err := readFrame(c)
	if err != nil || typ != msgREQ {
		c.Close()
		return
	}
	p, err := decodeParams(body)
	if err != nil {
		c.Close()
		return
	}
	r := &connReq{dev: l.dev, c: c, peer: p}
	select {
	case l.reqs <- r:
	case <-l.stop:
		c.Close()
	default: // a backlog of 64 unanswered requests: refuse, as a full listen queue
		c.Close()
	}
}

func (l *listener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.stop:
		return nil, opErr("accept", verbs.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() string { return l.ln.Addr().String() }

func (l *listener) Close() error {
	l.once.Do(func() { close(l.stop) })
	err := l.ln.Close()
	for {
		select {
		case r := <-l.reqs:
			r.c.Close()
		default:
			return err
		}
	}
}

type connReq struct {
	dev  *device
	c    net.Conn
	peer cmParams
}

func (r *connReq) PrivateData() []byte { return r.peer.private }

// RemoteAddr is the peer's RoCE endpoint: its IP address and UDP port.
func (r *connReq) RemoteAddr() string {
	if a, ok := r.c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			return netip.AddrPortFrom(ip, r.peer.udpPort).String()
		}
	}
	return r.c.RemoteAddr().String()
}

func (r *connReq) Prepare(p verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	pp, ok := p.(*pd)
	if !ok || pp.dev != r.dev {
		return nil, opErr("create_qp", fmt.Errorf("%w: protection domain of another device", verbs.ErrInvalid))
	}
	q, err := newQP(r.dev, pp, cfg)
	if err != nil {
		return nil, err
	}
	return &pendingQP{q: q, req: r}, nil
}

func (r *connReq) Reject(private []byte) error {
	if len(private) > maxPrivateData {
		private = private[:maxPrivateData]
	}
	err := writeFrame(r.c, msgREJ, private)
	r.c.Close()
	if err != nil {
		return opErr("reject", err)
	}
	return nil
}

// ---- Both sides ----

type pendingQP struct {
	q    *qp
	req  *connReq     // passive side
	addr *net.TCPAddr // active side
	used bool
}

func (d *device) PrepareDial(ctx context.Context, p verbs.PD, addr string, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	pp, ok := p.(*pd)
	if !ok || pp.dev != d {
		return nil, opErr("create_qp", fmt.Errorf("%w: protection domain of another device", verbs.ErrInvalid))
	}
	var r net.Resolver
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &verbs.OpError{Op: "resolve", Provider: Name, Addr: addr, Err: err}
	}
	ips, err := r.LookupNetIP(ctx, "ip4", host)
	if err != nil || len(ips) == 0 {
		if err == nil {
			err = errNotIPv4
		}
		return nil, &verbs.OpError{Op: "resolve", Provider: Name, Addr: addr, Err: err}
	}
	pn, err := net.LookupPort("tcp", port)
	if err != nil {
		return nil, &verbs.OpError{Op: "resolve", Provider: Name, Addr: addr, Err: err}
	}
	q, err := newQP(d, pp, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.LocalAddr != "" {
		q.info.Local.Addr = cfg.LocalAddr
	}
	return &pendingQP{q: q, addr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(ips[0].Unmap(), uint16(pn)))}, nil
}

func (pq *pendingQP) PostRecv(wrs []verbs.RecvWR) (int, error) { return pq.q.PostRecv(wrs) }

func (pq *pendingQP) Close() error {
	if !pq.used {
		pq.used = true
		if pq.req != nil {
			pq.req.c.Close()
		}
		pq.q.die(0, verbs.ErrClosed)
	}
	return nil
}

func (pq *pendingQP) Connect(ctx context.Context, cp verbs.ConnParam) (verbs.QP, error) {
	if pq.used {
		return nil, opErr("connect", verbs.ErrClosed)
	}
	if len(cp.PrivateData) > maxPrivateData {
		return nil, opErr("connect", fmt.Errorf("%w: %d bytes of private data (at most %d)", verbs.ErrInvalid, len(cp.PrivateData), maxPrivateData))
	}
	ctx, cancel := pq.q.dev.setupCtx(ctx)
	defer cancel()
	var err error
	if pq.req != nil {
		err = pq.accept(ctx, cp)
	} else {
		err = pq.dial(ctx, cp)
	}
	if err != nil {
		pq.Close()
		return nil, err
	}
	pq.used = true
	return pq.q, nil
}

func (pq *pendingQP) mine(private []byte) cmParams {
	q := pq.q
	return cmParams{qpn: q.qpn, psn: q.nextPSN, udpPort: q.dev.port, mtu: uint16(q.dev.cfg.MTU),
		ord: uint16(q.offer.out), ird: uint16(q.offer.in), private: private}
}

func (pq *pendingQP) dial(ctx context.Context, cp verbs.ConnParam) error {
	var dl net.Dialer
	if la := pq.q.info.Local.Addr; la != "" {
		ip, err := netip.ParseAddr(la)
		if ap, err2 := netip.ParseAddrPort(la); err2 == nil {
			ip, err = ap.Addr(), nil
		}
		if err != nil {
			return &verbs.OpError{Op: "connect", Provider: Name, Addr: la, Err: err}
		}
		dl.LocalAddr = &net.TCPAddr{IP: ip.AsSlice()}
	}
	c, err := dl.DialContext(ctx, "tcp4", pq.addr.String())
	if err != nil {
		return &verbs.OpError{Op: "connect", Provider: Name, Addr: pq.addr.String(), Err: ctxErr(ctx, err)}
	}
	stop := watchDeadline(ctx, c)
	defer stop()
	fail := func(err error) error {
		c.Close()
		return &verbs.OpError{Op: "connect", Provider: Name, Addr: pq.addr.String(), Err: ctxErr(ctx, err)}
	}
	if err := writeFrame(c, msgREQ, encodeParams(pq.mine(cp.PrivateData))); err != nil {
		return fail(err)
	}
	typ, body, err := readFrame(c)
	if err != nil {
		return fail(err)
	}
	switch typ {
	case msgREJ:
		c.Close()
		return &verbs.OpError{Op: "connect", Provider: Name, Addr: pq.addr.String(), Err: &verbs.RejectedError{PrivateData: body}}
	case msgREP:
	default:
		return fail(fmt.Errorf("%w: type %d where a REP or REJ was due", errCMFrame, typ))
	}
	peer, err := decodeParams(body)
	if err != nil {
		return fail(err)
	}
	if err := writeFrame(c, msgRTU, nil); err != nil {
		return fail(err)
	}
	if !stop() {
		return fail(ctx.Err())
	}
	c.SetDeadline(time.Time{})
	return pq.q.establish(c, peer)
}

func (pq *pendingQP) accept(ctx context.Context, cp verbs.ConnParam) error {
	c := pq.req.c
	stop := watchDeadline(ctx, c)
	defer stop()
	fail := func(err error) error {
		c.Close()
		return &verbs.OpError{Op: "accept", Provider: Name, Addr: c.RemoteAddr().String(), Err: ctxErr(ctx, err)}
	}
	q := pq.q
	// Answer with the negotiated values, so that both sides compute the same.
	mine := pq.mine(cp.PrivateData)
	if err := writeFrame(c, msgREP, encodeParams(mine)); err != nil {
		return fail(err)
	}
	typ, _, err := readFrame(c)
	if err != nil {
		return fail(err)
	}
	if typ != msgRTU {
		return fail(fmt.Errorf("%w: type %d where an RTU was due", errCMFrame, typ))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	c.SetDeadline(time.Time{})
	return q.establish(c, pq.req.peer)
}

// establish fixes the connection's parameters from the peer's REQ or
// REP, starts the engine and watches the TCP connection for the end.
func (q *qp) establish(c net.Conn, peer cmParams) error {
	la, ok1 := c.LocalAddr().(*net.TCPAddr)
	ra, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || la.IP.To4() == nil || ra.IP.To4() == nil {
		c.Close()
		return opErr("connect", errNotIPv4)
	}
	local, _ := netip.AddrFromSlice(la.IP.To4())
	remote, _ := netip.AddrFromSlice(ra.IP.To4())
	q.rqpn = peer.qpn
	q.local = local
	q.remote = netip.AddrPortFrom(remote, peer.udpPort)
	q.mtu = min(q.dev.cfg.MTU, int(peer.mtu))
	q.readsOut = min(q.offer.out, int(peer.ird))
	q.readsIn = min(q.offer.in, int(peer.ord))
	q.cm = c
	q.info = verbs.ConnInfo{
		ReadsOut: q.readsOut, ReadsIn: q.readsIn, PrivateData: peer.private,
		Local:  verbs.Endpoint{Provider: Name, Addr: netip.AddrPortFrom(local, q.dev.port).String(), QPN: q.qpn},
		Remote: verbs.Endpoint{Provider: Name, Addr: q.remote.String(), QPN: peer.qpn},
		Detail: fmt.Sprintf("rocev2 udp mtu=%d icrc=%s", q.mtu, q.dev.icrcMode()),
	}
	q.start(peer.psn)
	go q.watchCM()
	return nil
}

// watchCM waits for the peer's DREQ or the end of the TCP connection.
func (q *qp) watchCM() {
	for {
		typ, _, err := readFrame(q.cm)
		if err != nil || typ == msgDREQ {
			q.shutdown(verbs.ErrDisconnected)
			q.closeCM(false)
			return
		}
	}
}
