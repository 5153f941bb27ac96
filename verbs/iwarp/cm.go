package iwarp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/verbs"
)

// Connection management: TCP connect or accept, then one MPA request and
// reply (RFC 5044 section 7.1, RFC 6581 section 3). Private data rides in
// both frames after the IRD/ORD words.

type listener struct {
	dev  *device
	ln   net.Listener
	reqs chan *connReq
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu      sync.Mutex
	shaking map[net.Conn]struct{} // in handshake or waiting for Accept: Close hangs up on them
}

func (d *device) Listen(ctx context.Context, addr string) (verbs.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, &verbs.OpError{Op: "listen", Provider: Name, Addr: addr, Err: err}
	}
	l := &listener{dev: d, ln: ln, reqs: make(chan *connReq), stop: make(chan struct{}), shaking: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.loop()
	return l, nil
}

func (l *listener) loop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.stop:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and friends: back off
			continue
		}
		l.mu.Lock()
		select {
		case <-l.stop:
			l.mu.Unlock()
			c.Close()
			return
		default:
		}
		l.shaking[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handshake(c)
	}
}

// handshake reads one MPA request and offers it to Accept; a peer that
// sends garbage or nothing, or whose request is not accepted within the
// setup timeout (by then it gives up too), is dropped.
func (l *listener) handshake(c net.Conn) {
	defer l.wg.Done()
	kept := false
	defer func() {
		l.mu.Lock()
		delete(l.shaking, c)
		l.mu.Unlock()
		if !kept {
			c.Close()
		}
	}()
	tuneConn(c, &l.dev.cfg)
	deadline := time.Now().Add(l.dev.cfg.SetupTimeout)
	c.SetDeadline(deadline)
	f, err := readMPA(c, false)
	if err != nil {
		return
	}
	if f.markers || f.rev < 1 || f.rev > mpaRev2 {
		// We never place markers; refuse with a reply the peer can read.
		rej := mpaFrame{reply: true, reject: true, rev: mpaRev2}
		if b, err := rej.marshal(); err == nil {
			c.Write(b)
		}
		return
	}
	r := &connReq{dev: l.dev, conn: c, req: f}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case l.reqs <- r:
		kept = true
	case <-l.stop:
	case <-t.C:
	}
}

func (l *listener) Accept(ctx context.Context) (verbs.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		// The caller's now: Close must not hang up on it.
		l.mu.Lock()
		delete(l.shaking, r.conn)
		l.mu.Unlock()
		return r, nil
	case <-l.stop:
		return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: l.Addr(), Err: verbs.ErrClosed}
	case <-ctx.Done():
		return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: l.Addr(), Err: ctx.Err()}
	}
}

func (l *listener) Addr() string { return l.ln.Addr().String() }

// Close waits for no peer: it hangs up on connections still in their
// handshake, so the goroutines it waits for end at once.
func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.stop)
		l.ln.Close()
		l.mu.Lock()
		for c := range l.shaking {
			c.Close()
		}
		l.mu.Unlock()
	})
	l.wg.Wait()
	return nil
}

func readMPA(c net.Conn, reply bool) (mpaFrame, error) {
	var h [mpaHeaderLen]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return mpaFrame{}, err
	}
	f, n, err := parseMPAHeader(h[:], reply)
	if err != nil {
		return f, err
	}
	pd := make([]byte, n)
	if _, err := io.ReadFull(c, pd); err != nil {
		return f, err
	}
	return f, parseMPAPrivate(&f, pd)
}

// tuneConn sets up a QP socket: no Nagle, and keepalive with
// TCP_USER_TIMEOUT (Config.UserTimeout) so that a dead link kills the QP
// without the application waiting on it. Only at setup: nothing here
// touches the data path.
func tuneConn(c net.Conn, cfg *Config) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	tc.SetNoDelay(true)
	ka := net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 15 * time.Second}
	if ut := cfg.UserTimeout; ut > 0 {
		// Probe a quiet connection often enough that the timeout, which
		// counts from the last thing the peer acknowledged, applies.
		ka.Idle = min(max(ut/3, time.Second), 15*time.Second)
		ka.Interval = ka.Idle
		if rc, err := tc.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(ut.Milliseconds()))
			})
		}
	}
	tc.SetKeepAliveConfig(ka)
}

type connReq struct {
	dev  *device
	conn net.Conn
	req  mpaFrame
	used bool
}

func (r *connReq) PrivateData() []byte { return r.req.private }
func (r *connReq) RemoteAddr() string  { return r.conn.RemoteAddr().String() }

func (r *connReq) Prepare(p verbs.PD, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	if r.used {
		return nil, opErr("prepare", fmt.Errorf("%w: connection request already used", verbs.ErrInvalid))
	}
	pq, err := r.dev.newPending(p, cfg)
	if err != nil {
		return nil, err
	}
	r.used = true
	pq.req = r
	return pq, nil
}

func (r *connReq) Reject(private []byte) error {
	if r.used {
		return opErr("reject", fmt.Errorf("%w: connection request already used", verbs.ErrInvalid))
	}
	r.used = true
	defer r.conn.Close()
	f := mpaFrame{reply: true, reject: true, rev: r.req.rev, enhanced: r.req.enhanced, private: private}
	b, err := f.marshal()
	if err != nil {
		return opErr("reject", err)
	}
	r.conn.SetWriteDeadline(time.Now().Add(r.dev.cfg.SetupTimeout))
	if _, err := r.conn.Write(b); err != nil {
		return &verbs.OpError{Op: "reject", Provider: Name, Addr: r.RemoteAddr(), Err: err}
	}
	return nil
}

// pendingQP is a QP before its connection exists: it holds receives.
type pendingQP struct {
	dev    *device
	pd     *pd
	cfg    verbs.QPConfig
	sendCQ *cq
	recvCQ *cq
	recvs  []rwr
	addr   string   // active side
	req    *connReq // passive side
	done   bool
}

func (d *device) newPending(p verbs.PD, cfg verbs.QPConfig) (*pendingQP, error) {
	mp, ok := p.(*pd)
	if !ok || mp.dev != d {
		return nil, opErr("create_qp", fmt.Errorf("%w: protection domain of another device", verbs.ErrInvalid))
	}
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, opErr("create_qp", fmt.Errorf("%w: send and receive CQs must come from this device", verbs.ErrInvalid))
	}
	cfg, err := cfg.Resolve(d.Caps())
	if err != nil {
		return nil, opErr("create_qp", err)
	}
	return &pendingQP{dev: d, pd: mp, cfg: cfg, sendCQ: scq, recvCQ: rcq}, nil
}

func (d *device) PrepareDial(ctx context.Context, p verbs.PD, addr string, cfg verbs.QPConfig) (verbs.PendingQP, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, &verbs.OpError{Op: "resolve", Provider: Name, Addr: addr, Err: err}
	}
	pq, err := d.newPending(p, cfg)
	if err != nil {
		return nil, err
	}
	pq.addr = addr
	return pq, nil
}

func (p *pendingQP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if p.done {
		return 0, opErr("post_recv", verbs.ErrClosed)
	}
	for i, wr := range wrs {
		if len(p.recvs) >= p.cfg.MaxRecvWR {
			return i, opErr("post_recv", verbs.ErrQueueFull)
		}
		r, err := p.dev.checkRecv(p.pd, wr)
		if err != nil {
			return i, err
		}
		p.recvs = append(p.recvs, r)
	}
	return len(wrs), nil
}

func (p *pendingQP) Close() error {
	if !p.done && p.req != nil {
		p.req.conn.Close()
	}
	p.done = true
	return nil
}

func (p *pendingQP) Connect(ctx context.Context, cp verbs.ConnParam) (verbs.QP, error) {
	if p.done {
		return nil, opErr("connect", verbs.ErrClosed)
	}
	if len(cp.PrivateData) > p.dev.Caps().MaxPrivateData {
		return nil, opErr("connect", fmt.Errorf("%w: %d bytes of private data, limit %d", verbs.ErrInvalid, len(cp.PrivateData), p.dev.Caps().MaxPrivateData))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.dev.cfg.SetupTimeout)
		defer cancel()
	}
	var q *qp
	var err error
	if p.req != nil {
		q, err = p.accept(ctx, cp)
	} else {
		q, err = p.dial(ctx, cp)
	}
	if err != nil {
		return nil, err
	}
	p.done = true
	return q, nil
}

// withCtx makes blocking I/O on c end when ctx does.
func withCtx(ctx context.Context, c net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (p *pendingQP) dial(ctx context.Context, cp verbs.ConnParam) (*qp, error) {
	fail := func(err error) (*qp, error) {
		return nil, &verbs.OpError{Op: "connect", Provider: Name, Addr: p.addr, Err: err}
	}
	var d net.Dialer
	if p.cfg.LocalAddr != "" {
		la, err := localTCPAddr(p.cfg.LocalAddr)
		if err != nil {
			return fail(err)
		}
		d.LocalAddr = la
	}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return fail(ctxErr(ctx, err))
	}
	tuneConn(c, &p.dev.cfg)
	stop := withCtx(ctx, c)
	req := mpaFrame{
		crc: p.dev.cfg.CRC.wants(c), enhanced: true, rev: mpaRev2,
		ird: uint16(p.cfg.MaxReadsIn), ord: uint16(p.cfg.MaxReadsOut),
		p2p: !p.dev.cfg.NoPeerToPeer, rtr: rtrKindWrite | rtrKindRead,
		private: cp.PrivateData,
	}
	b, err := req.marshal()
	if err == nil {
		_, err = c.Write(b)
	}
	var rep mpaFrame
	if err == nil {
		rep, err = readMPA(c, true)
	}
	stopped := stop()
	if err != nil || !stopped {
		c.Close()
		if err == nil {
			err = ctx.Err()
		}
		return fail(ctxErr(ctx, err))
	}
	c.SetDeadline(time.Time{})
	if rep.reject {
		c.Close()
		return fail(&verbs.RejectedError{PrivateData: rep.private})
	}
	if rep.markers {
		c.Close()
		return fail(fmt.Errorf("%w: peer asked for MPA markers, which this provider does not place", errMPA))
	}
	ord := int(p.cfg.MaxReadsOut)
	ird := int(p.cfg.MaxReadsIn)
	if rep.enhanced {
		ord = min(ord, int(rep.ird))
		ird = min(ird, max(int(rep.ord), 1))
	} else {
		ord = 1 // MPA v1 peers say nothing about IRD; assume the minimum
	}
	var rtr uint8
	if req.p2p && rep.enhanced && rep.p2p {
		switch {
		case rep.rtr&rtrKindWrite != 0:
			rtr = rtrKindWrite
		case rep.rtr&rtrKindRead != 0:
			rtr = rtrKindRead
		default:
			c.Close()
			return fail(fmt.Errorf("%w: peer chose an RTR kind we did not offer", errMPA))
		}
	}
	q := newQP(p, c, req.crc || rep.crc, ord, ird, rep.private)
	q.info.Detail = detail(rep.rev, q.crc, rtr)
	q.start(rtr, false)
	return q, nil
}

// localTCPAddr parses QPConfig.LocalAddr: an IP, or an IP and port.
func localTCPAddr(s string) (*net.TCPAddr, error) {
	host, port := s, 0
	if h, ps, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.Atoi(ps)
		if err != nil {
			return nil, fmt.Errorf("%w: local address %q: bad port", verbs.ErrInvalid, s)
		}
		host, port = h, n
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, fmt.Errorf("%w: local address %q is not an IP address", verbs.ErrInvalid, s)
	}
	return &net.TCPAddr{IP: ip, Port: port}, nil
}

func (p *pendingQP) accept(ctx context.Context, cp verbs.ConnParam) (*qp, error) {
	r := p.req
	c := r.conn
	fail := func(err error) (*qp, error) {
		c.Close()
		return nil, &verbs.OpError{Op: "accept", Provider: Name, Addr: r.RemoteAddr(), Err: err}
	}
	ird, ord := p.cfg.MaxReadsIn, p.cfg.MaxReadsOut
	if r.req.enhanced {
		ird = min(ird, max(int(r.req.ord), 1))
		ord = min(ord, int(r.req.ird))
	} else {
		ord = 1
	}
	var rtr uint8
	if r.req.p2p && r.req.enhanced {
		switch {
		case r.req.rtr&rtrKindWrite != 0:
			rtr = rtrKindWrite
		case r.req.rtr&rtrKindRead != 0:
			rtr = rtrKindRead
		}
	}
	rep := mpaFrame{
		reply: true, crc: r.req.crc || p.dev.cfg.CRC.wants(c), enhanced: r.req.enhanced, rev: r.req.rev,
		ird: uint16(ird), ord: uint16(ord), p2p: rtr != 0, rtr: rtr, private: cp.PrivateData,
	}
	b, err := rep.marshal()
	if err != nil {
		return fail(err)
	}
	stop := withCtx(ctx, c)
	_, err = c.Write(b)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return fail(ctxErr(ctx, err))
	}
	c.SetDeadline(time.Time{})
	q := newQP(p, c, rep.crc, ord, ird, r.req.private)
	q.info.Detail = detail(rep.rev, q.crc, rtr)
	q.start(0, rtr != 0)
	return q, nil
}

func detail(rev uint8, crc bool, rtr uint8) string {
	s := fmt.Sprintf("mpa rev %d, crc32c %s, markers off", rev, onOff(crc))
	switch rtr {
	case rtrKindWrite:
		s += ", p2p rtr write"
	case rtrKindRead:
		s += ", p2p rtr read"
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
