package roce

// The passive side of the IB CM over QP1 (Config.Setup = SetupCM): a
// listener takes the REQs whose service ID names its port (rdma_cm's
// RDMA_PS_TCP space), the application accepts (REP, resent until the
// RTU) or rejects (REJ, consumer reason 28). A REQ sent again while ours
// is pending gets the REP again. docs/protocol.md §1b.4.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
	"github.com/rdmacp/rdmacp/verbs/roce/rdmacm"
)

// remoteKey names a connection by the peer's address and communication ID.
type remoteKey struct {
	addr netip.Addr
	id   uint32
}

type cmListener struct {
	dev  *device
	addr netip.AddrPort // the address may be unspecified: any of ours
	reqs chan *cmReq
	stop chan struct{}
	once sync.Once
}

func (d *device) listenCM(addr string) (verbs.Listener, error) {
	fail := func(err error) (verbs.Listener, error) {
		return nil, &verbs.OpError{Op: "listen", Provider: Name, Addr: addr, Err: err}
	}
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return fail(err)
	}
	ip := netip.IPv4Unspecified()
	if host != "" {
		if ip, err = netip.ParseAddr(host); err != nil || !ip.Unmap().Is4() {
			return fail(fmt.Errorf("%w: %q is not an IPv4 address", verbs.ErrInvalid, host))
		}
		ip = ip.Unmap()
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return fail(err)
	}
	l := &cmListener{dev: d, reqs: make(chan *cmReq, 64), stop: make(chan struct{})}
	g := &d.gsi
	g.mu.Lock()
	defer g.mu.Unlock()
	if port == 0 { // an ephemeral port, as rdma_cm binds one
		for range 1000 {
			if p := uint16(32768 + rand.IntN(28232)); g.listeners[p] == nil {
				port = uint64(p)
				break
			}
		}
	}
	if port == 0 || g.listeners[uint16(port)] != nil {
		return fail(syscall.EADDRINUSE)
	}
	l.addr = netip.AddrPortFrom(ip, uint16(port))
	g.listeners[uint16(port)] = l
	return l, nil
}

func (l *cmListener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.stop:
		return nil, opErr("accept", verbs.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *cmListener) Addr() string { return l.addr.String() }

func (l *cmListener) Close() error {
	l.once.Do(func() {
		g := &l.dev.gsi
		g.mu.Lock()
		if g.listeners[l.addr.Port()] == l {
			delete(g.listeners, l.addr.Port())
		}
		g.mu.Unlock()
		close(l.stop)
	})
	for {
		select {
		case r := <-l.reqs:
			r.refuse(rdmacm.ReasonNoResources, nil)
		default:
			return nil
		}
	}
}

// onREQ takes a REQ: to a listener, as a repeat of one under way, or
// refused with the reason the IB CM names.
func (d *device) onREQ(tid uint64, m *rdmacm.REQ, a addrs) {
	g := &d.gsi
	g.mu.Lock()
	c := g.remotes[remoteKey{a.src, m.LocalCommID}]
	var l *cmListener
	if m.ServiceID>>16 == rdmacm.PortSpaceTCP {
		l = g.listeners[uint16(m.ServiceID)]
	}
	g.mu.Unlock()
	if c != nil { // sent again: our REP was lost, or not sent yet
		c.mu.Lock()
		rep := c.rep
		c.mu.Unlock()
		if rep != nil {
			d.sendMAD(c.tid, rep, c.local, c.remote)
		}
		return
	}
	rej := func(reason uint16) {
		d.sendMAD(tid, &rdmacm.REJ{RemoteCommID: m.LocalCommID, Reason: reason}, a.dst, a.src)
	}
	hdr, rest, err := rdmacm.ParseIPHeader(m.Private)
	switch {
	case l == nil:
		rej(rdmacm.ReasonInvalidServiceID)
		return
	case err != nil || !hdr.Src.Is4():
		rej(rdmacm.ReasonUnsupported)
		return
	case m.TransportType != 0:
		rej(rdmacm.ReasonInvalidTransport)
		return
	case !l.addr.Addr().IsUnspecified() && hdr.Dst != l.addr.Addr():
		rej(rdmacm.ReasonInvalidServiceID)
		return
	case rdmacm.MTUBytes(m.PathMTU) == 0:
		rej(rdmacm.ReasonInvalidMTU)
		return
	}
	c = &cmConn{dev: d, local: a.dst, remote: a.src, remoteID: m.LocalCommID, tid: tid,
		in: make(chan rdmacm.Message, 16), recvPSN: randPSN()}
	g.add(c)
	g.mu.Lock()
	g.remotes[remoteKey{a.src, m.LocalCommID}] = c
	g.mu.Unlock()
	r := &cmReq{dev: d, c: c, req: m, hdr: hdr, private: unframe(rest)}
	select {
	case l.reqs <- r:
	default: // a backlog of 64 unanswered requests, as a full listen queue
		r.refuse(rdmacm.ReasonNoResources, nil)
	}
}

// cmReq is a REQ waiting for the application.
type cmReq struct {
	dev     *device
	c       *cmConn
	req     *rdmacm.REQ
	hdr     rdmacm.IPHeader
	private []byte
}

func (r *cmReq) PrivateData() []byte { return r.private }

// RemoteAddr is the peer's RoCE endpoint: its IP address and the UDP
// port it receives on (rdma_cm's port in the REQ names no socket).
func (r *cmReq) RemoteAddr() string { return netip.AddrPortFrom(r.c.remote, r.dev.cmPort()).String() }

func (r *cmReq) Prepare(p verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	q, err := newQP(r.dev, p, cfg)
	if err != nil {
		return nil, err
	}
	return &cmPending{q: q, r: r}, nil
}

func (r *cmReq) Reject(private []byte) error {
	if len(private) > rdmacm.PrivateREJ-1 {
		private = private[:rdmacm.PrivateREJ-1]
	}
	if err := r.refuse(rdmacm.ReasonConsumer, frame(private)); err != nil {
		return opErr("reject", err)
	}
	return nil
}

// refuse sends a REJ and forgets the connection.
func (r *cmReq) refuse(reason uint16, private []byte) error {
	c := r.c
	c.dev.gsi.remove(c)
	return c.dev.sendMAD(c.tid, &rdmacm.REJ{LocalCommID: c.localID, RemoteCommID: r.req.LocalCommID, Reason: reason, Private: private}, c.local, c.remote)
}

// cmPending is the passive side's QP before the RTU.
type cmPending struct {
	q    *qp
	r    *cmReq
	used bool
}

func (p *cmPending) PostRecv(wrs []verbs.RecvWR) (int, error) { return p.q.PostRecv(wrs) }

func (p *cmPending) Close() error {
	if !p.used {
		p.used = true
		p.r.refuse(rdmacm.ReasonNoResources, nil)
		p.q.die(0, verbs.ErrClosed)
	}
	return nil
}

// Connect accepts: the QP starts, the REP goes until the RTU comes.
func (p *cmPending) Connect(ctx context.Context, cp verbs.ConnParam) (verbs.QP, error) {
	if p.used {
		return nil, opErr("accept", verbs.ErrClosed)
	}
	q, d, c, req := p.q, p.q.dev, p.r.c, p.r.req
	fail := func(err error) (verbs.QP, error) {
		return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: p.r.RemoteAddr(), Err: err}
	}
	if len(cp.PrivateData) > rdmacm.PrivateREP-1 {
		return fail(fmt.Errorf("%w: %d bytes of private data (at most %d)", verbs.ErrInvalid, len(cp.PrivateData), rdmacm.PrivateREP-1))
	}
	ctx, cancel := d.setupCtx(ctx)
	defer cancel()
	p.used = true
	port := d.cmPort()
	// We send from the PSN the REQ names and expect the one our REP does.
	q.nextPSN, q.una = req.StartingPSN&psnMask, req.StartingPSN&psnMask
	peer := oob.Params{QPN: req.LocalQPN, PSN: c.recvPSN, UDPPort: port, MTU: uint16(rdmacm.MTUBytes(req.PathMTU)),
		ORD: uint16(req.InitiatorDepth), IRD: uint16(req.ResponderResources), Private: p.r.private}
	rep := &rdmacm.REP{LocalCommID: c.localID, RemoteCommID: req.LocalCommID, LocalQPN: q.qpn, StartingPSN: c.recvPSN,
		ResponderResources: uint8(min(q.offer.in, int(req.InitiatorDepth))), InitiatorDepth: uint8(min(q.offer.out, int(req.ResponderResources))),
		TargetACKDelay: ackTimeout, RNRRetryCount: 7, LocalCAGUID: d.gsi.guid, Private: frame(cp.PrivateData)}
	c.mu.Lock()
	c.q = q
	c.mu.Unlock()
	// At RTS before the REP goes: the peer may send once it has it.
	q.begin(c.local, netip.AddrPortFrom(c.remote, port), peer, SetupCM)
	c.mu.Lock()
	c.rep = rep
	c.mu.Unlock()
	if err := c.awaitRTU(ctx, rep); err != nil {
		c.mu.Lock()
		c.gone = true // no DREQ: the peer never had the connection
		c.mu.Unlock()
		q.Disconnect()
		d.gsi.remove(c)
		return fail(err)
	}
	return &cmQP{qp: q, c: c}, nil
}

// awaitRTU sends the REP until the RTU comes, 15 times 1.07 s apart at
// most, bounded by ctx.
func (c *cmConn) awaitRTU(ctx context.Context, rep *rdmacm.REP) error {
	wait := rdmacm.Timeout(cmResponseTimeout)
	t := time.NewTimer(wait)
	defer t.Stop()
	for sent := 0; sent < cmMaxRetries; sent++ {
		if err := c.dev.sendMAD(c.tid, rep, c.local, c.remote); err != nil {
			return err
		}
		t.Reset(wait)
	wait:
		for {
			select {
			case <-ctx.Done():
				c.dev.sendMAD(c.tid, &rdmacm.REJ{LocalCommID: c.localID, RemoteCommID: c.remoteID, Rejected: 1, Reason: rdmacm.ReasonTimeout}, c.local, c.remote)
				return ctx.Err()
			case <-c.dev.stop:
				return verbs.ErrClosed
			case <-t.C:
				break wait
			case m := <-c.in:
				switch m := m.(type) {
				case *rdmacm.RTU:
					c.mu.Lock()
					c.up = true
					c.mu.Unlock()
					return nil
				case *rdmacm.REJ:
					return rejectErr(m)
				case *rdmacm.DREQ:
					return verbs.ErrDisconnected
				}
			}
		}
	}
	return fmt.Errorf("no RTU to %d REPs: %w", cmMaxRetries, syscall.ETIMEDOUT)
}
