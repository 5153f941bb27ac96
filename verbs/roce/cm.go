package roce

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
)

// Connection setup is the out-of-band exchange over TCP of package oob,
// shaped after the IB CM's REQ, REP, RTU, REJ and DREQ (docs/protocol.md
// §1b.3). The TCP connection stays open for the QP's life: its end, or a
// DREQ on it, is the disconnect, so a peer that exits is seen at once
// rather than after the retry count runs out.

const maxPrivateData = oob.MaxPrivateData

// maxPrivate is the private data a connection request may carry: less
// with the CM, whose REQ holds rdma_cm's header too.
func (d *device) maxPrivate() int {
	if d.cfg.Setup == SetupCM {
		return maxPrivateCM
	}
	return maxPrivateData
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
	if d.cfg.Setup == SetupCM {
		return d.listenCM(addr)
	}
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
	typ, body, err := oob.ReadFrame(c)
	if err != nil || typ != oob.REQ {
		c.Close()
		return
	}
	p, err := oob.Decode(body)
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
	peer oob.Params
}

func (r *connReq) PrivateData() []byte { return r.peer.Private }

// RemoteAddr is the peer's RoCE endpoint: its IP address and UDP port.
func (r *connReq) RemoteAddr() string {
	if a, ok := r.c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			return netip.AddrPortFrom(ip, r.peer.UDPPort).String()
		}
	}
	return r.c.RemoteAddr().String()
}

func (r *connReq) Prepare(p verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	q, err := newQP(r.dev, p, cfg)
	if err != nil {
		return nil, err
	}
	return &pendingQP{q: q, req: r}, nil
}

func (r *connReq) Reject(private []byte) error {
	if len(private) > maxPrivateData {
		private = private[:maxPrivateData]
	}
	err := oob.WriteFrame(r.c, oob.REJ, private)
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
	q, err := newQP(d, p, cfg)
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
	if pq.req == nil && pq.q.dev.cfg.Setup == SetupCM {
		q, err := pq.dialCM(ctx, cp)
		if err != nil {
			pq.Close()
			return nil, err
		}
		pq.used = true
		return q, nil
	}
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

func (pq *pendingQP) mine(private []byte) oob.Params {
	q := pq.q
	return oob.Params{QPN: q.qpn, PSN: q.nextPSN, UDPPort: q.dev.port, MTU: uint16(q.dev.cfg.MTU),
		ORD: uint16(q.offer.out), IRD: uint16(q.offer.in), Private: private}
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
	if err := oob.WriteFrame(c, oob.REQ, pq.mine(cp.PrivateData).Encode()); err != nil {
		return fail(err)
	}
	typ, body, err := oob.ReadFrame(c)
	if err != nil {
		return fail(err)
	}
	switch typ {
	case oob.REJ:
		c.Close()
		return &verbs.OpError{Op: "connect", Provider: Name, Addr: pq.addr.String(), Err: &verbs.RejectedError{PrivateData: body}}
	case oob.REP:
	default:
		return fail(fmt.Errorf("%w: type %d where a REP or REJ was due", oob.ErrFrame, typ))
	}
	peer, err := oob.Decode(body)
	if err != nil {
		return fail(err)
	}
	if err := oob.WriteFrame(c, oob.RTU, nil); err != nil {
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
	if err := oob.WriteFrame(c, oob.REP, mine.Encode()); err != nil {
		return fail(err)
	}
	typ, _, err := oob.ReadFrame(c)
	if err != nil {
		return fail(err)
	}
	if typ != oob.RTU {
		return fail(fmt.Errorf("%w: type %d where an RTU was due", oob.ErrFrame, typ))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	c.SetDeadline(time.Time{})
	return q.establish(c, pq.req.peer)
}

// establish fixes the connection's parameters from the peer's REQ or
// REP, starts the engine and watches the TCP connection for the end.
func (q *qp) establish(c net.Conn, peer oob.Params) error {
	la, ok1 := c.LocalAddr().(*net.TCPAddr)
	ra, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || la.IP.To4() == nil || ra.IP.To4() == nil {
		c.Close()
		return opErr("connect", errNotIPv4)
	}
	local, _ := netip.AddrFromSlice(la.IP.To4())
	remote, _ := netip.AddrFromSlice(ra.IP.To4())
	q.cm = c
	q.begin(local, netip.AddrPortFrom(remote, peer.UDPPort), peer, SetupOOB)
	go q.watchCM()
	return nil
}

// begin fixes the connection's parameters from the peer's and starts
// the engine, whichever exchange set them up.
func (q *qp) begin(local netip.Addr, remote netip.AddrPort, peer oob.Params, setup Setup) {
	q.rqpn = peer.QPN
	q.local = local
	q.remote = remote
	q.mtu = min(q.dev.cfg.MTU, int(peer.MTU))
	q.readsOut = min(q.offer.out, int(peer.IRD))
	q.readsIn = min(q.offer.in, int(peer.ORD))
	q.info = verbs.ConnInfo{
		ReadsOut: q.readsOut, ReadsIn: q.readsIn, PrivateData: peer.Private,
		Local:  verbs.Endpoint{Provider: Name, Addr: netip.AddrPortFrom(local, q.dev.port).String(), QPN: q.qpn},
		Remote: verbs.Endpoint{Provider: Name, Addr: q.remote.String(), QPN: peer.QPN},
		Detail: fmt.Sprintf("rocev2 udp mtu=%d icrc=%s setup=%s", q.mtu, q.dev.icrcMode(), setup),
	}
	q.start(peer.PSN)
}

// watchCM waits for the peer's DREQ or the end of the TCP connection.
func (q *qp) watchCM() {
	for {
		typ, _, err := oob.ReadFrame(q.cm)
		if err != nil || typ == oob.DREQ {
			q.shutdown(verbs.ErrDisconnected)
			q.closeCM(false)
			return
		}
	}
}
