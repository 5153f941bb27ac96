//go:build rdma && linux && cgo

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
)

// The out-of-band setup (Config.Setup SetupOOB): roce-soft's exchange
// (package oob, docs/protocol.md §1b.3) over a TCP connection to the
// listen address, in place of rdma_cm. The QP is created with
// ibv_create_qp and moved to INIT, RTR and RTS by hand (as perftest does
// without -R); the peer's GID is the IPv4-mapped address of its end of
// the TCP connection, so the RoCE v2 path is the TCP connection's path.
// The TCP connection stays open for the QP's life: a DREQ on it, or its
// end, is the disconnect.

// roceUDPPort is where a kernel RoCE v2 device sends and receives: rxe
// and NICs use the IANA port only, so a peer that receives elsewhere is
// refused at setup rather than left unanswered.
const roceUDPPort = 4791

// checkOOB refuses the out-of-band setup on a port it cannot address: it
// needs a RoCE v2 GID with an IPv4 address.
func (d *device) checkOOB() error {
	if d.port.gidIndex < 0 || d.port.gidType != "RoCE v2" || d.port.ip.To4() == nil {
		return fmt.Errorf("%w: the out-of-band setup needs a RoCE v2 port with an IPv4 GID; %s port %d has %s %s",
			verbs.ErrUnsupported, d.name, d.port.num, d.port.linkLayer, d.port.gidType)
	}
	return nil
}

// ---- listener ----

type oobListener struct {
	d    *device
	ln   net.Listener
	reqs chan *oobReq
	stop chan struct{}
	once sync.Once
}

func (d *device) listenOOB(ctx context.Context, addr string) (verbs.Listener, error) {
	fail := func(err error) (verbs.Listener, error) {
		return nil, &verbs.OpError{Op: "listen", Provider: Name, Addr: addr, Err: err}
	}
	if err := d.checkOOB(); err != nil {
		return fail(err)
	}
	ip, port, err := d.resolve(ctx, addr)
	if err != nil {
		return fail(err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp4", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
	if err != nil {
		return fail(err)
	}
	l := &oobListener{d: d, ln: ln, reqs: make(chan *oobReq, 64), stop: make(chan struct{})}
	d.lifeMu.Lock()
	if d.closed {
		d.lifeMu.Unlock()
		ln.Close()
		return fail(verbs.ErrClosed)
	}
	d.listeners[l] = struct{}{}
	d.lifeMu.Unlock()
	go l.acceptLoop()
	return l, nil
}

func (l *oobListener) acceptLoop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.readRequest(c)
	}
}

// readRequest reads a REQ within the setup timeout and queues it. A
// peer that does not receive on UDP 4791 is refused: this device would
// send it nothing it could read.
func (l *oobListener) readRequest(c net.Conn) {
	c.SetDeadline(time.Now().Add(l.d.p.cfg.SetupTimeout))
	typ, body, err := oob.ReadFrame(c)
	if err != nil || typ != oob.REQ {
		c.Close()
		return
	}
	p, err := oob.Decode(body)
	if err != nil || p.UDPPort != roceUDPPort {
		c.Close()
		return
	}
	r := &oobReq{d: l.d, c: c, peer: p}
	l.d.lifeMu.Lock()
	l.d.reqs[r] = struct{}{}
	l.d.lifeMu.Unlock()
	select {
	case l.reqs <- r:
	case <-l.stop:
		r.Reject(nil)
	default: // a backlog of 64 unanswered requests: refuse, as a full listen queue
		r.Reject(nil)
	}
}

func (l *oobListener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.stop:
	case <-ctx.Done():
		return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: l.Addr(), Err: ctx.Err()}
	}
	return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: l.Addr(), Err: verbs.ErrClosed}
}

func (l *oobListener) Addr() string { return l.ln.Addr().String() }

func (l *oobListener) Close() error {
	l.once.Do(func() { close(l.stop) })
	err := l.ln.Close()
	l.d.lifeMu.Lock()
	delete(l.d.listeners, l)
	l.d.lifeMu.Unlock()
	for {
		select {
		case r := <-l.reqs:
			r.Reject(nil)
		default:
			return err
		}
	}
}

// ---- connection requests ----

type oobReq struct {
	d    *device
	c    net.Conn
	peer oob.Params

	mu   sync.Mutex
	used bool
}

func (r *oobReq) PrivateData() []byte { return r.peer.Private }
func (r *oobReq) RemoteAddr() string  { return r.c.RemoteAddr().String() }

// take marks r used and forgets it; false if it was used already.
func (r *oobReq) take() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used {
		return false
	}
	r.used = true
	r.d.lifeMu.Lock()
	delete(r.d.reqs, r)
	r.d.lifeMu.Unlock()
	return true
}

func (r *oobReq) Prepare(p verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	if !r.take() {
		return nil, opErr("prepare", fmt.Errorf("%w: connection request already used", verbs.ErrInvalid))
	}
	q, err := r.d.newQP(nil, p, cfg)
	if err != nil {
		r.c.Close()
		return nil, err
	}
	if !q.setOOB(r.c) {
		return nil, opErr("prepare", verbs.ErrClosed)
	}
	return &oobPending{q: q, req: r, addr: r.RemoteAddr()}, nil
}

func (r *oobReq) Reject(private []byte) error {
	if !r.take() {
		return opErr("reject", fmt.Errorf("%w: connection request already used", verbs.ErrInvalid))
	}
	if len(private) > oob.MaxPrivateData {
		private = private[:oob.MaxPrivateData]
	}
	err := oob.WriteFrame(r.c, oob.REJ, private)
	r.c.Close()
	if err != nil {
		return &verbs.OpError{Op: "reject", Provider: Name, Addr: r.RemoteAddr(), Err: err}
	}
	return nil
}

// ---- active side ----

func (d *device) prepareDialOOB(ctx context.Context, p verbs.PD, addr string, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	fail := func(err error) (verbs.PendingQP, error) {
		return nil, &verbs.OpError{Op: "resolve", Provider: Name, Addr: addr, Err: err}
	}
	if err := d.checkOOB(); err != nil {
		return fail(err)
	}
	ctx, done, err := d.beginSetup(ctx)
	if err != nil {
		return fail(err)
	}
	defer done()
	ip, port, err := d.resolve(ctx, addr)
	if err != nil {
		return fail(err)
	}
	if ip.To4() == nil {
		return fail(fmt.Errorf("%w: the out-of-band setup is IPv4 only", verbs.ErrUnsupported))
	}
	src := d.port.ip
	if cfg.LocalAddr != "" {
		host := cfg.LocalAddr
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if src = net.ParseIP(host); src == nil || src.To4() == nil {
			return fail(fmt.Errorf("%w: local address %q is not an IPv4 address", verbs.ErrInvalid, cfg.LocalAddr))
		}
	}
	q, err := d.newQP(nil, p, cfg)
	if err != nil {
		return nil, err
	}
	return &oobPending{q: q, addr: net.JoinHostPort(ip.String(), strconv.Itoa(port)), src: src}, nil
}

// ---- pending QPs ----

type oobPending struct {
	q    *qp
	req  *oobReq // passive side
	addr string  // the peer's TCP address
	src  net.IP  // active side: the address to dial from

	mu    sync.Mutex
	state int // 0 pending, 1 connected, 2 closed
}

func (p *oobPending) PostRecv(wrs []verbs.RecvWR) (int, error) {
	p.mu.Lock()
	st := p.state
	p.mu.Unlock()
	if st != 0 {
		return 0, opErr("post_recv", verbs.ErrClosed)
	}
	return p.q.PostRecv(wrs)
}

func (p *oobPending) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == 0 {
		p.state = 2
		p.q.destroy() // closes the TCP connection: the peer's setup fails at once
	}
	return nil
}

func (p *oobPending) Connect(ctx context.Context, cp verbs.ConnParam) (verbs.QP, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	op := "connect"
	if p.req != nil {
		op = "accept"
	}
	fail := func(err error) (verbs.QP, error) {
		if p.state == 0 {
			p.state = 2
			p.q.destroy()
		}
		return nil, &verbs.OpError{Op: op, Provider: Name, Addr: p.addr, Err: err}
	}
	if p.state != 0 {
		return nil, &verbs.OpError{Op: op, Provider: Name, Addr: p.addr, Err: verbs.ErrClosed}
	}
	if len(cp.PrivateData) > oob.MaxPrivateData {
		return fail(fmt.Errorf("%w: %d bytes of private data, limit %d", verbs.ErrInvalid, len(cp.PrivateData), oob.MaxPrivateData))
	}
	ctx, done, err := p.q.d.beginSetup(ctx)
	if err != nil {
		return fail(err)
	}
	defer done()
	if p.req == nil {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: p.src}}
		c, err := d.DialContext(ctx, "tcp4", p.addr)
		if err != nil {
			return fail(err)
		}
		if !p.q.setOOB(c) {
			return fail(verbs.ErrClosed)
		}
	}
	c := p.q.oob
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	peer, err := p.exchange(cp.PrivateData)
	if err == nil && !stop() {
		err = ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return fail(err)
	}
	c.SetDeadline(time.Time{})
	q := p.q
	q.cmMu.Lock()
	q.connected = true
	q.cmMu.Unlock()
	p.describe(peer)
	p.state = 1
	go q.watchOOB()
	return q, nil
}

// exchange runs REQ, REP (or REJ) and RTU on the TCP connection and
// brings the QP to RTS before the peer may send: the dialer before its
// RTU, the acceptor before its REP.
func (p *oobPending) exchange(private []byte) (oob.Params, error) {
	q, c := p.q, p.q.oob
	d := q.d
	mine := oob.Params{QPN: q.qpn, PSN: rand.Uint32() & 0xffffff, UDPPort: roceUDPPort, MTU: uint16(d.port.mtu),
		ORD: uint16(q.cfg.MaxReadsOut), IRD: uint16(q.cfg.MaxReadsIn), Private: private}
	if p.req != nil {
		peer := p.req.peer
		mine.ORD, mine.IRD = min(mine.ORD, peer.IRD), min(mine.IRD, peer.ORD)
		if err := p.ready(peer, mine); err != nil {
			return peer, err
		}
		if err := oob.WriteFrame(c, oob.REP, mine.Encode()); err != nil {
			return peer, err
		}
		typ, _, err := oob.ReadFrame(c)
		if err == nil && typ != oob.RTU {
			err = fmt.Errorf("%w: type %d where an RTU was due", oob.ErrFrame, typ)
		}
		return peer, err
	}
	if err := oob.WriteFrame(c, oob.REQ, mine.Encode()); err != nil {
		return oob.Params{}, err
	}
	typ, body, err := oob.ReadFrame(c)
	if err != nil {
		return oob.Params{}, err
	}
	switch typ {
	case oob.REJ:
		return oob.Params{}, &verbs.RejectedError{PrivateData: body}
	case oob.REP:
	default:
		return oob.Params{}, fmt.Errorf("%w: type %d where a REP or REJ was due", oob.ErrFrame, typ)
	}
	peer, err := oob.Decode(body)
	if err != nil {
		return peer, err
	}
	if peer.UDPPort != roceUDPPort {
		return peer, fmt.Errorf("%w: the peer receives RoCEv2 on UDP port %d; this device sends to %d only", verbs.ErrUnsupported, peer.UDPPort, roceUDPPort)
	}
	if err := p.ready(peer, mine); err != nil {
		return peer, err
	}
	return peer, oob.WriteFrame(c, oob.RTU, nil)
}

// ready moves the QP to RTR towards peer and on to RTS.
func (p *oobPending) ready(peer, mine oob.Params) error {
	q := p.q
	d := q.d
	ra, ok := q.oob.RemoteAddr().(*net.TCPAddr)
	if !ok || ra.IP.To4() == nil {
		return fmt.Errorf("%w: peer %v is not IPv4", verbs.ErrUnsupported, q.oob.RemoteAddr())
	}
	gid := ra.IP.To16() // IPv4-mapped: the RoCE v2 GID of an IPv4 address
	mtu := min(d.port.mtu, int(peer.MTU))
	ord, ird := min(int(mine.ORD), int(peer.IRD)), min(int(mine.IRD), int(peer.ORD))
	var e C.int
	step := C.rc_qp_rtr_rts(q.qp, C.uint8_t(d.port.num), C.int(d.port.gidIndex), (*C.uint8_t)(unsafe.Pointer(&gid[0])),
		C.uint32_t(peer.QPN), C.uint32_t(peer.PSN), C.uint32_t(mine.PSN), mtuEnum(mtu), C.uint8_t(ird), C.uint8_t(ord), &e)
	switch step {
	case 1:
		return fmt.Errorf("modify QP to RTR (peer QPN %#x, GID %s, MTU %d, IRD %d): %w", peer.QPN, ra.IP, mtu, ird, errnoErr(e))
	case 2:
		return fmt.Errorf("modify QP to RTS (ORD %d): %w", ord, errnoErr(e))
	}
	return nil
}

// mtuEnum is the IB MTU enum of a path MTU in bytes (256 -> 1 ... 4096 -> 5).
func mtuEnum(b int) C.int {
	e := C.int(1)
	for m := 256; m < b && e < 5; m <<= 1 {
		e++
	}
	return e
}

// describe fills the QP's ConnInfo from what the device settled on.
func (p *oobPending) describe(peer oob.Params) {
	q := p.q
	d := q.d
	ord, ird, mtu := 0, 0, 0
	var aord, aird, amtu, state C.int
	if C.rc_query_qp_rd(q.qp, &aord, &aird, &amtu, &state) == 0 {
		ord, ird, mtu = int(aord), int(aird), mtuBytes(C.enum_ibv_mtu(amtu))
	}
	q.info = verbs.ConnInfo{
		ReadsOut: ord, ReadsIn: ird, PrivateData: peer.Private,
		Local:  verbs.Endpoint{Provider: Name, Addr: q.oob.LocalAddr().String(), QPN: q.qpn},
		Remote: verbs.Endpoint{Provider: Name, Addr: q.oob.RemoteAddr().String(), QPN: peer.QPN},
		Detail: fmt.Sprintf("out-of-band setup (TCP) %s %s port %d, path mtu %d, gid[%d] %s",
			d.trans, d.name, d.port.num, mtu, d.port.gidIndex, d.port.gid),
	}
}

// setOOB gives q its TCP connection; false, with c closed, if q was
// destroyed meanwhile (its device closed under a setup).
func (q *qp) setOOB(c net.Conn) bool {
	q.cmMu.Lock()
	defer q.cmMu.Unlock()
	if q.destroyed {
		c.Close()
		return false
	}
	q.oob = c
	return true
}

// watchOOB waits for the peer's DREQ or the end of the TCP connection.
func (q *qp) watchOOB() {
	for {
		typ, _, err := oob.ReadFrame(q.oob)
		if err != nil || typ == oob.DREQ {
			q.fail(opErr("disconnect", fmt.Errorf("%w by peer", verbs.ErrDisconnected)), true)
			return
		}
	}
}
