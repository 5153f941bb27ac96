//go:build rdma && linux && cgo

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmacp/rdmacp/verbs"
)

// Private data. InfiniBand CM messages carry fixed-size private data
// areas, which rdma_cm hands over zero-padded to their full size: 56 bytes
// in a request (92 less rdma_cm's header), 196 in a reply, 148 in a
// reject. The provider prefixes what callers send with one length byte so
// the peer gets exactly those bytes back.
const (
	maxPrivReq = 56 - 1
	maxPrivRep = 196 - 1
	maxPrivRej = 148 - 1
)

// IB CM reject reason for a reject by the peer application.
const rejConsumer = 28

func frame(b []byte) []byte { return append([]byte{byte(len(b))}, b...) }

// iWARP's MPA frames carry private data with its exact length, and a peer
// there may be any iWARP stack: no length byte on that transport.
func (d *device) frame(b []byte) []byte {
	if C.rc_transport(d.ctx) == C.IBV_TRANSPORT_IWARP {
		return append([]byte(nil), b...)
	}
	return frame(b)
}

func (d *device) unframe(raw []byte) []byte {
	if C.rc_transport(d.ctx) == C.IBV_TRANSPORT_IWARP {
		if len(raw) == 0 {
			return nil
		}
		return append([]byte(nil), raw...)
	}
	return unframe(raw)
}

func unframe(raw []byte) []byte {
	if len(raw) == 0 {
		return nil
	}
	n := int(raw[0])
	if n > len(raw)-1 {
		return append([]byte(nil), raw...) // not ours: hand it over as is
	}
	if n == 0 {
		return nil
	}
	return append([]byte(nil), raw[1:1+n]...)
}

func cbytes(b []byte) (unsafe.Pointer, C.uint8_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&b[0]), C.uint8_t(len(b))
}

func fmtAddr(family C.int, ip *[16]C.uint8_t, port C.uint16_t) string {
	var a net.IP
	switch family {
	case C.AF_INET:
		a = net.IPv4(byte(ip[0]), byte(ip[1]), byte(ip[2]), byte(ip[3]))
	case C.AF_INET6:
		a = make(net.IP, 16)
		for i := range a {
			a[i] = byte(ip[i])
		}
	default:
		return ""
	}
	return net.JoinHostPort(a.String(), strconv.Itoa(int(port)))
}

// addrs returns the id's local and peer "host:port".
func (c *cmID) addrs() (local, remote string) {
	var lf, rf C.int
	var lip, rip [16]C.uint8_t
	var lp, rp C.uint16_t
	C.rc_id_addrs(c.id, &lf, &lip[0], &lp, &rf, &rip[0], &rp)
	return fmtAddr(lf, &lip, lp), fmtAddr(rf, &rip, rp)
}

func sockaddr(ip net.IP, port int) (C.struct_sockaddr_storage, error) {
	var ss C.struct_sockaddr_storage
	var raw [16]C.uint8_t
	v6 := C.int(0)
	if v4 := ip.To4(); v4 != nil {
		for i := range 4 {
			raw[i] = C.uint8_t(v4[i])
		}
	} else if len(ip) == net.IPv6len {
		v6 = 1
		for i := range 16 {
			raw[i] = C.uint8_t(ip[i])
		}
	} else {
		return ss, fmt.Errorf("%w: bad IP address %v", verbs.ErrInvalid, ip)
	}
	C.rc_sockaddr_set(&ss, v6, &raw[0], C.uint16_t(port), 0)
	return ss, nil
}

func sa(ss *C.struct_sockaddr_storage) *C.struct_sockaddr {
	return (*C.struct_sockaddr)(unsafe.Pointer(ss))
}

// resolve splits "host:port". An empty or unspecified host means this
// device's own address (from its GID), when it has one.
func (d *device) resolve(ctx context.Context, addr string) (net.IP, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, err
	}
	port, err := net.DefaultResolver.LookupPort(ctx, "tcp", ps)
	if err != nil {
		return nil, 0, err
	}
	var ip net.IP
	if host != "" {
		ip = net.ParseIP(host)
		if ip == nil {
			ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
			if err != nil {
				return nil, 0, err
			}
			for _, a := range ips {
				if ip == nil || (ip.To4() == nil && a.IP.To4() != nil) {
					ip = a.IP
				}
			}
		}
	}
	if ip == nil || ip.IsUnspecified() {
		if d.port.ip != nil {
			ip = d.port.ip
		} else if ip == nil {
			ip = net.IPv4zero
		}
	}
	return ip, port, nil
}

// beginSetup registers a connection set-up step (Listen, PrepareDial,
// Connect) and bounds it: by ctx, by SetupTimeout when ctx has no
// deadline, and by Close, which cancels the context it returns (cause
// ErrClosed) and waits for done before it frees the ids, QPs and event
// channel the step may be using. It fails with ErrClosed once Close has
// begun.
func (d *device) beginSetup(ctx context.Context) (context.Context, func(), error) {
	d.lifeMu.Lock()
	if d.closed {
		d.lifeMu.Unlock()
		return nil, nil, verbs.ErrClosed
	}
	d.setups.Add(1)
	d.lifeMu.Unlock()
	timeout := func() {}
	if _, ok := ctx.Deadline(); !ok {
		ctx, timeout = context.WithTimeout(ctx, d.p.cfg.SetupTimeout)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(d.closing, func() { cancel(context.Cause(d.closing)) })
	return ctx, func() {
		stop()
		cancel(nil)
		timeout()
		d.setups.Done()
	}, nil
}

// timeoutMS is what rdma_resolve_addr/route get: the time ctx has left.
func timeoutMS(ctx context.Context) C.int {
	ms := 5000
	if dl, ok := ctx.Deadline(); ok {
		ms = int(time.Until(dl) / time.Millisecond)
	}
	return C.int(min(max(ms, 50), 10000))
}

// checkDevice fails when the id was bound to another device than d.
func (d *device) checkDevice(c *cmID, addr string) error {
	v := C.rc_id_verbs(c.id)
	if v != nil && v != d.ctx {
		return fmt.Errorf("%w: %s is reached through device %s, not %s", verbs.ErrInvalid, addr, deviceName(v), d.name)
	}
	return nil
}

// ---- listener ----

type listener struct {
	d    *device
	cid  *cmID
	addr string

	mu     sync.Mutex
	q      []*connReq
	closed bool
	notify chan struct{}
	stop   chan struct{}
}

func (d *device) Listen(ctx context.Context, addr string) (verbs.Listener, error) {
	fail := func(err error) (verbs.Listener, error) {
		return nil, &verbs.OpError{Op: "listen", Provider: Name, Addr: addr, Err: err}
	}
	if d.isClosed() {
		return fail(verbs.ErrClosed)
	}
	if d.p.cfg.Setup == SetupOOB {
		return d.listenOOB(ctx, addr)
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
	ss, err := sockaddr(ip, port)
	if err != nil {
		return fail(err)
	}
	cid, err := d.newCMID()
	if err != nil {
		return fail(err)
	}
	if rc, err := C.rdma_bind_addr(cid.id, sa(&ss)); rc != 0 {
		cid.destroy()
		return fail(fmt.Errorf("rdma_bind_addr %s: %w", net.JoinHostPort(ip.String(), strconv.Itoa(port)), err))
	}
	if err := d.checkDevice(cid, addr); err != nil {
		cid.destroy()
		return fail(err)
	}
	if rc, err := C.rdma_listen(cid.id, 128); rc != 0 {
		cid.destroy()
		return fail(fmt.Errorf("rdma_listen: %w", err))
	}
	l := &listener{d: d, cid: cid, notify: make(chan struct{}, 1), stop: make(chan struct{})}
	l.addr, _ = cid.addrs()
	cid.mu.Lock()
	cid.owner = l
	cid.mu.Unlock()
	d.lifeMu.Lock()
	if d.closed {
		d.lifeMu.Unlock()
		cid.destroy()
		return fail(verbs.ErrClosed)
	}
	d.listeners[l] = struct{}{}
	d.lifeMu.Unlock()
	return l, nil
}

// push queues a connection request; false if the listener is closed.
func (l *listener) push(child *cmID, e cmEvent) bool {
	r := &connReq{
		d: l.d, cid: child, private: l.d.unframe(e.private),
		respRes: e.respRes, initDepth: e.initDepth, remoteQPN: e.qpNum,
	}
	r.local, r.remote = child.addrs()
	if v := C.rc_id_verbs(child.id); v != l.d.ctx {
		return false // a wildcard listener heard a request for another device
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.q = append(l.q, r)
	l.mu.Unlock()
	l.d.lifeMu.Lock()
	l.d.reqs[r] = struct{}{}
	l.d.lifeMu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
	return true
}

func (l *listener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	for {
		l.mu.Lock()
		if len(l.q) > 0 {
			r := l.q[0]
			l.q = l.q[1:]
			more := len(l.q) > 0
			l.mu.Unlock()
			if more {
				select {
				case l.notify <- struct{}{}:
				default:
				}
			}
			return r, nil
		}
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: l.addr, Err: verbs.ErrClosed}
		}
		select {
		case <-l.notify:
		case <-l.stop:
		case <-ctx.Done():
			return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: l.addr, Err: ctx.Err()}
		}
	}
}

func (l *listener) Addr() string { return l.addr }

func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	q := l.q
	l.q = nil
	close(l.stop)
	l.mu.Unlock()
	l.cid.destroy()
	for _, r := range q {
		r.Reject(nil)
	}
	l.d.lifeMu.Lock()
	delete(l.d.listeners, l)
	l.d.lifeMu.Unlock()
	return nil
}

// ---- connection requests ----

type connReq struct {
	d             *device
	cid           *cmID
	private       []byte
	respRes       int // READs the requester will have outstanding at most (our IRD bound)
	initDepth     int // READs the requester will serve (our ORD bound)
	remoteQPN     uint32
	local, remote string

	mu   sync.Mutex
	used bool
}

func (r *connReq) PrivateData() []byte { return r.private }
func (r *connReq) RemoteAddr() string  { return r.remote }

func (r *connReq) Prepare(p verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used {
		return nil, opErr("prepare", fmt.Errorf("%w: connection request already used", verbs.ErrInvalid))
	}
	q, err := r.d.newQP(r.cid, p, cfg)
	if err != nil {
		return nil, err
	}
	r.used = true
	r.forget()
	return &pendingQP{q: q, req: r}, nil
}

func (r *connReq) forget() {
	r.d.lifeMu.Lock()
	delete(r.d.reqs, r)
	r.d.lifeMu.Unlock()
}

func (r *connReq) Reject(private []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used {
		return opErr("reject", fmt.Errorf("%w: connection request already used", verbs.ErrInvalid))
	}
	if len(private) > maxPrivRej {
		return opErr("reject", fmt.Errorf("%w: %d bytes of private data, limit %d", verbs.ErrInvalid, len(private), maxPrivRej))
	}
	r.used = true
	r.forget()
	b := r.d.frame(private)
	p, n := cbytes(b)
	rc, err := C.rdma_reject(r.cid.id, p, n)
	r.cid.destroy()
	if rc != 0 {
		return &verbs.OpError{Op: "reject", Provider: Name, Addr: r.remote, Err: err}
	}
	return nil
}

// ---- active side ----

func (d *device) PrepareDial(ctx context.Context, p verbs.PD, addr string, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	fail := func(err error) (verbs.PendingQP, error) {
		return nil, &verbs.OpError{Op: "resolve", Provider: Name, Addr: addr, Err: err}
	}
	if mp, ok := p.(*pd); !ok || mp.d != d {
		return fail(fmt.Errorf("%w: protection domain of another device", verbs.ErrInvalid))
	}
	if d.isClosed() {
		return fail(verbs.ErrClosed)
	}
	if d.p.cfg.Setup == SetupOOB {
		return d.prepareDialOOB(ctx, p, addr, cfg)
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
	dst, err := sockaddr(ip, port)
	if err != nil {
		return fail(err)
	}
	var srcp *C.struct_sockaddr
	var src C.struct_sockaddr_storage
	srcIP := d.port.ip
	if cfg.LocalAddr != "" {
		// The caller's choice of source picks the path: rdma_cm binds the
		// id to the device owning it, and checkDevice below refuses one
		// that is not this device.
		host := cfg.LocalAddr
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if srcIP = net.ParseIP(host); srcIP == nil {
			return fail(fmt.Errorf("%w: local address %q is not an IP address", verbs.ErrInvalid, cfg.LocalAddr))
		}
	}
	if srcIP != nil && (srcIP.To4() != nil) == (ip.To4() != nil) {
		if src, err = sockaddr(srcIP, 0); err == nil {
			srcp = sa(&src)
		}
	}
	cid, err := d.newCMID()
	if err != nil {
		return fail(err)
	}
	ok := false
	defer func() {
		if !ok {
			cid.destroy()
		}
	}()
	if rc, err := C.rdma_resolve_addr(cid.id, srcp, sa(&dst), timeoutMS(ctx)); rc != 0 {
		return fail(fmt.Errorf("rdma_resolve_addr: %w", err))
	}
	if err := d.expect(ctx, cid, C.RDMA_CM_EVENT_ADDR_RESOLVED, "address resolution"); err != nil {
		return fail(err)
	}
	if err := d.checkDevice(cid, addr); err != nil {
		return fail(err)
	}
	if rc, err := C.rdma_resolve_route(cid.id, timeoutMS(ctx)); rc != 0 {
		return fail(fmt.Errorf("rdma_resolve_route: %w", err))
	}
	if err := d.expect(ctx, cid, C.RDMA_CM_EVENT_ROUTE_RESOLVED, "route resolution"); err != nil {
		return fail(err)
	}
	q, err := d.newQP(cid, p, cfg)
	if err != nil {
		return nil, err
	}
	ok = true
	return &pendingQP{q: q, addr: addr}, nil
}

// expect waits for an event of type want on c.
func (d *device) expect(ctx context.Context, c *cmID, want C.enum_rdma_cm_event_type, what string) error {
	e, err := c.wait(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if e.typ != want {
		return fmt.Errorf("%s: %v: %w", what, e, statusErr(e.status))
	}
	return nil
}

// statusErr makes an rdma_cm event status an error: negative values are
// errnos.
func statusErr(s int) error {
	if s < 0 {
		return syscall.Errno(-s)
	}
	if s == 0 {
		return verbs.ErrDisconnected
	}
	return fmt.Errorf("transport status %d", s)
}

// ---- pending QPs ----

type pendingQP struct {
	q    *qp
	req  *connReq // passive side
	addr string   // active side

	mu    sync.Mutex
	state int // 0 pending, 1 connected, 2 closed
}

func (p *pendingQP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	p.mu.Lock()
	st := p.state
	p.mu.Unlock()
	if st != 0 {
		return 0, opErr("post_recv", verbs.ErrClosed)
	}
	return p.q.PostRecv(wrs)
}

func (p *pendingQP) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != 0 {
		return nil
	}
	p.state = 2
	q := p.q
	if p.req != nil {
		q.cmMu.Lock()
		if !q.destroyed { // the device may have been closed under us
			C.rdma_reject(q.cid.id, nil, 0)
		}
		q.cmMu.Unlock()
	}
	q.destroy()
	return nil
}

func (p *pendingQP) Connect(ctx context.Context, cp verbs.ConnParam) (verbs.QP, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	op, addr := "connect", p.addr
	if p.req != nil {
		op, addr = "accept", p.req.remote
	}
	fail := func(err error) (verbs.QP, error) {
		return nil, &verbs.OpError{Op: op, Provider: Name, Addr: addr, Err: err}
	}
	if p.state != 0 {
		return fail(verbs.ErrClosed)
	}
	limit := maxPrivReq
	if p.req != nil {
		limit = maxPrivRep
	}
	if len(cp.PrivateData) > limit {
		return fail(fmt.Errorf("%w: %d bytes of private data, limit %d", verbs.ErrInvalid, len(cp.PrivateData), limit))
	}
	q := p.q
	d := q.d
	ctx, done, err := d.beginSetup(ctx)
	if err != nil {
		p.state = 2
		return fail(err)
	}
	defer done()
	ord, ird := q.cfg.MaxReadsOut, q.cfg.MaxReadsIn
	if p.req != nil {
		// The requester's offer bounds ours: it serves initDepth READs
		// and will send at most respRes.
		ird = min(ird, p.req.respRes)
		ord = min(ord, p.req.initDepth)
	}
	b := d.frame(cp.PrivateData)
	pd, n := cbytes(b)
	accept := C.int(0)
	if p.req != nil {
		accept = 1
	}
	// Every use of the id and QP here is under cmMu and checks that the
	// QP is not destroyed: Device.Close waits for this Connect
	// (beginSetup), but qp.destroy has other callers.
	q.cmMu.Lock()
	rc := C.int(0)
	if !q.destroyed {
		rc = C.rc_connect(q.cid.id, pd, n, C.uint8_t(ird), C.uint8_t(ord), accept)
	}
	gone := q.destroyed
	q.cmMu.Unlock()
	if gone {
		p.state = 2
		return fail(verbs.ErrClosed)
	}
	if rc != 0 {
		p.teardown()
		return fail(fmt.Errorf("rdma_%s: %w", op, errnoErr(rc)))
	}
	var peer []byte
	remoteQPN := uint32(0)
	if p.req != nil {
		peer, remoteQPN = p.req.private, p.req.remoteQPN
	}
	for {
		e, err := q.cid.wait(ctx)
		if err != nil {
			p.teardown()
			return fail(err)
		}
		switch e.typ {
		case C.RDMA_CM_EVENT_ESTABLISHED:
			if p.req == nil {
				peer, remoteQPN = d.unframe(e.private), e.qpNum
			}
		case C.RDMA_CM_EVENT_REJECTED:
			p.teardown()
			if e.status == rejConsumer || (C.rc_transport(d.ctx) == C.IBV_TRANSPORT_IWARP && len(e.private) > 0) {
				return fail(&verbs.RejectedError{PrivateData: d.unframe(e.private)})
			}
			return fail(fmt.Errorf("%w (rdma_cm reject reason %d: no listener?)", syscall.ECONNREFUSED, e.status))
		case C.RDMA_CM_EVENT_UNREACHABLE, C.RDMA_CM_EVENT_CONNECT_ERROR:
			p.teardown()
			if e.status == -int(syscall.ETIMEDOUT) || e.status == -int(syscall.ECONNREFUSED) {
				return fail(fmt.Errorf("%v: %w", e, syscall.Errno(-e.status)))
			}
			return fail(fmt.Errorf("%v: %w", e, syscall.EHOSTUNREACH))
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
			p.teardown()
			return fail(fmt.Errorf("%v: %w", e, verbs.ErrDisconnected))
		default:
			continue
		}
		break
	}
	q.cmMu.Lock()
	if q.destroyed {
		q.cmMu.Unlock()
		p.state = 2
		return fail(verbs.ErrClosed)
	}
	q.connected = true
	local, remote := q.cid.addrs()
	var aord, aird, mtu, state C.int
	detail := fmt.Sprintf("rdma_cm %s %s port %d", d.trans, d.name, C.rc_id_port(q.cid.id))
	if C.rc_query_qp_rd(q.qp, &aord, &aird, &mtu, &state) == 0 {
		ord, ird = int(aord), int(aird)
		detail += fmt.Sprintf(", path mtu %d", mtuBytes(C.enum_ibv_mtu(mtu)))
	}
	q.cmMu.Unlock()
	if d.port.gidIndex >= 0 {
		detail += fmt.Sprintf(", gid[%d] %s", d.port.gidIndex, d.port.gid)
	}
	q.info = verbs.ConnInfo{
		ReadsOut: ord, ReadsIn: ird, PrivateData: peer,
		Local:  verbs.Endpoint{Provider: Name, Addr: local, QPN: q.qpn},
		Remote: verbs.Endpoint{Provider: Name, Addr: remote, QPN: remoteQPN},
		Detail: detail,
	}
	q.cid.setHandler(q.cmEvent)
	p.state = 1
	return q, nil
}

// teardown frees a QP whose connection attempt failed; p.mu is held.
func (p *pendingQP) teardown() {
	p.state = 2
	p.q.destroy()
}
