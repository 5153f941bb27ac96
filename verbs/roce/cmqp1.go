package roce

// Connection setup with the InfiniBand Connection Manager over QP1, as
// rdma_cm does it on a RoCE device (Config.Setup = SetupCM): CM MADs
// (package rdmacm) in RoCEv2 unreliable-datagram packets to QP 1 of the
// peer, UDP port 4791. This end is its own GSI: it sends from QP 1 with
// the GSI Q_Key and answers on its UDP port, where rxe's QP1 replies.
//
// The active side (the passive one is cmpassive.go): REQ (with rdma_cm's IP header in front of the private
// data, and the one length byte our ibverbs provider puts before what the
// caller sends) -> the peer's REP (an MRA holds the REQ timer) -> RTU;
// a REJ is an error that names its reason. Disconnect sends DREQ and
// waits a bounded time for the DREP; a DREQ from the peer is answered
// with a DREP and ends the QP.
// docs/protocol.md §1c lists every field.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
	"github.com/rdmacp/rdmacp/verbs/roce/rdmacm"
)

// Setup says how a roce-soft end sets up its connections.
type Setup string

const (
	// SetupOOB is roce-soft's out-of-band exchange over TCP (cm.go).
	SetupOOB Setup = "oob"
	// SetupCM is the IB CM over QP1, what rdma_cm on a RoCE device speaks.
	SetupCM Setup = "cm"
)

// The UD transport to QP1.
const (
	opUDSendOnly = 0x64
	dethLen      = 8
	gsiQPN       = 1
	gsiQKey      = 0x80010000
	udLen        = bthLen + dethLen + rdmacm.MADLen + icrcLen
)

// CM timing and the REQ's fixed fields. A CM timeout field t means
// 4.096 µs × 2^t.
const (
	// cmResponseTimeout, 18 (1.07 s), is how long we wait for a REP
	// before sending the REQ again, and what we tell the peer we take to
	// answer; rdma_cm says 20 (4.3 s), which makes one lost REQ cost 4 s.
	cmResponseTimeout = 18
	cmMaxRetries      = 15 // REQs sent in all, as rdma_cm (CMA_MAX_CM_RETRIES)
	// ackTimeout, 17 (537 ms), is the local ACK timeout we ask the peer's
	// QP to use towards us: a software end on a busy host answers late.
	ackTimeout = 17
	cmHopLimit = 64
	// drepWait bounds Disconnect's wait for a DREP, over drepTries DREQs.
	drepWait  = 2 * time.Second
	drepTries = 4
)

// Private data of an rdma_cm REQ: 92 bytes less the 36 of rdma_cm's
// header less our one length byte.
const maxPrivateCM = rdmacm.PrivateREQ - rdmacm.IPHeaderLen - 1

var (
	errNotGSI = errors.New("roce: not a UD packet to QP1 from QP1 with the GSI Q_Key")
)

// encodeUD writes a MAD as the UD SEND from our QP1 to the peer's.
func encodeUD(mad []byte, psn uint32, a addrs) []byte {
	b := make([]byte, udLen)
	b[0] = opUDSendOnly
	b[1] = 0 // SE 0, M 0, pad 0 (a MAD is 256 bytes), TVer 0
	binary.BigEndian.PutUint16(b[2:], defaultPKey)
	binary.BigEndian.PutUint32(b[4:], gsiQPN)
	binary.BigEndian.PutUint32(b[8:], psn&psnMask) // A 0
	binary.BigEndian.PutUint32(b[12:], gsiQKey)
	binary.BigEndian.PutUint32(b[16:], gsiQPN) // reserved byte 0, source QP 1
	copy(b[bthLen+dethLen:], mad)
	o := udLen - icrcLen
	binary.LittleEndian.PutUint32(b[o:], icrc(a, b[:o]))
	return b
}

// decodeUD checks a datagram is a UD SEND to QP1 from QP1 with the GSI
// Q_Key in the default partition (its ICRC too, with check) and returns
// its MAD.
func decodeUD(b []byte, a addrs, check bool) ([]byte, error) {
	if len(b) < bthLen+dethLen+icrcLen {
		return nil, errShort
	}
	if b[0] != opUDSendOnly || b[1]&0x0f != 0 || binary.BigEndian.Uint32(b[4:])&qpnMask != gsiQPN ||
		binary.BigEndian.Uint32(b[12:]) != gsiQKey || binary.BigEndian.Uint32(b[16:])&qpnMask != gsiQPN {
		return nil, errNotGSI
	}
	if binary.BigEndian.Uint16(b[2:])&0x7fff != defaultPKey&0x7fff {
		return nil, errPKey
	}
	end := len(b) - icrcLen
	if check {
		if got, want := binary.LittleEndian.Uint32(b[end:]), icrc(a, b[:end]); got != want {
			return nil, fmt.Errorf("%w: got %#08x, computed %#08x", errICRC, got, want)
		}
	}
	pad := int(b[1]>>4) & 3
	body := b[bthLen+dethLen : end]
	if pad > len(body) {
		return nil, errPad
	}
	return body[:len(body)-pad], nil
}

// gsi is a device's QP1: the CM connections it has under way or up, by
// our local communication ID.
type gsi struct {
	mu        sync.Mutex
	conns     map[uint32]*cmConn
	remotes   map[remoteKey]*cmConn // the passive side's, by the peer's ID
	listeners map[uint16]*cmListener
	psn       atomic.Uint32
	tid       atomic.Uint64
	guid      uint64 // our "CA GUID": random, locally administered
	// testMAD, set by tests, sees each CM message first and takes it
	// when it returns true: a stand-in for a passive side.
	testMAD func(tid uint64, m rdmacm.Message, from addrs) bool
	// testPort, set by tests, is the UDP port of the peer's QP1 in place
	// of 4791 (Config.testCMPort at first).
	testPort uint16
}

func (g *gsi) init(port uint16) {
	g.testPort = port
	g.conns = map[uint32]*cmConn{}
	g.remotes = map[remoteKey]*cmConn{}
	g.listeners = map[uint16]*cmListener{}
	g.psn.Store(rand.Uint32())
	g.tid.Store(rand.Uint64())
	g.guid = rand.Uint64()&^(1<<57) | 1<<57 // the EUI-64 "locally administered" bit
}

// cmPort is the UDP port a peer receives on, its QP1 and the others.
func (d *device) cmPort() uint16 {
	d.gsi.mu.Lock()
	defer d.gsi.mu.Unlock()
	if d.gsi.testPort != 0 {
		return d.gsi.testPort
	}
	return UDPPort
}

// sendMAD sends one CM message from our QP1 to the peer's.
func (d *device) sendMAD(tid uint64, m rdmacm.Message, local, remote netip.Addr) error {
	return d.sendMADTo(tid, m, local, netip.AddrPortFrom(remote, d.cmPort()))
}

func (d *device) sendMADTo(tid uint64, m rdmacm.Message, local netip.Addr, dst netip.AddrPort) error {
	mad, err := rdmacm.Encode(tid, m)
	if err != nil {
		return err
	}
	remote := dst.Addr()
	a := addrs{src: local, dst: remote, srcPort: d.port, dstPort: dst.Port()}
	return d.send(encodeUD(mad, d.gsi.psn.Add(1), a), local, dst)
}

// onGSI takes a datagram for QP1. Whatever does not decode is dropped.
func (d *device) onGSI(b []byte, a addrs) {
	mad, err := decodeUD(b, a, !d.cfg.NoICRCCheck)
	if err != nil {
		d.dropped.Add(1)
		return
	}
	tid, m, err := rdmacm.Decode(mad)
	if err != nil {
		d.dropped.Add(1)
		return
	}
	if f := d.gsi.testHook(); f != nil && f(tid, m, a) {
		return
	}
	switch m := m.(type) {
	case *rdmacm.REQ:
		d.onREQ(tid, m, a)
		return
	case *rdmacm.DREQ:
		// Answered whether or not the connection is still known: a DREQ
		// repeated after we let go still wants its DREP.
		d.sendMAD(tid, &rdmacm.DREP{LocalCommID: m.RemoteCommID, RemoteCommID: m.LocalCommID}, a.dst, a.src)
		if c := d.gsi.conn(m.RemoteCommID); c != nil && c.remote == a.src {
			c.peerGone()
			c.deliver(m) // ends a disconnect of ours that crossed it
		}
		return
	}
	var id uint32
	switch m := m.(type) {
	case *rdmacm.REP:
		id = m.RemoteCommID
	case *rdmacm.REJ:
		id = m.RemoteCommID
	case *rdmacm.MRA:
		id = m.RemoteCommID
	case *rdmacm.DREP:
		id = m.RemoteCommID
	case *rdmacm.RTU:
		id = m.RemoteCommID
	}
	if c := d.gsi.conn(id); c != nil && c.remote == a.src {
		c.deliver(m)
		return
	}
	d.dropped.Add(1)
}

func (g *gsi) testHook() func(uint64, rdmacm.Message, addrs) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.testMAD
}

func (g *gsi) conn(id uint32) *cmConn {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.conns[id]
}

// add registers c under a fresh, non-zero local communication ID.
func (g *gsi) add(c *cmConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		id := rand.Uint32()
		if _, live := g.conns[id]; id != 0 && !live {
			c.localID = id
			g.conns[id] = c
			return
		}
	}
}

func (g *gsi) remove(c *cmConn) {
	g.mu.Lock()
	if g.conns[c.localID] == c {
		delete(g.conns, c.localID)
	}
	if k := (remoteKey{c.remote, c.remoteID}); g.remotes[k] == c {
		delete(g.remotes, k)
	}
	g.mu.Unlock()
}

// cmConn is one CM connection of the active side.
type cmConn struct {
	dev           *device
	q             *qp
	local, remote netip.Addr
	localID       uint32
	srcPort       uint16 // rdma_cm's "source port": random, as rdma_cm's ephemeral ones
	// recvPSN is the PSN we expect first, the REQ's starting PSN: in the
	// IB CM each side names the PSN it will receive, and the peer sends
	// from there (the kernel's cm.c: the REQ's PSN is the active side's
	// rq_psn, the REP's its sq_psn).
	recvPSN  uint32
	remoteID uint32 // from the REP
	tid      uint64 // of our REQ, and of the RTU that answers its REP
	in       chan rdmacm.Message

	mu   sync.Mutex
	up   bool // REP taken and RTU sent; passive: RTU taken
	gone bool // the peer sent a DREQ
	rtu  *rdmacm.RTU
	rep  *rdmacm.REP // passive: our REP, for a REQ that comes again
}

func (c *cmConn) deliver(m rdmacm.Message) {
	c.mu.Lock()
	up, rtu := c.up, c.rtu
	c.mu.Unlock()
	if _, isREP := m.(*rdmacm.REP); isREP && up {
		if rtu == nil { // a REP to the passive side: nothing asked for it
			return
		}
		// The peer sends its REP again when our RTU was lost.
		c.dev.sendMAD(c.tid, rtu, c.local, c.remote)
		return
	}
	select {
	case c.in <- m:
	default: // a flood of repeats: the ones queued say the same
	}
}

// peerGone ends the QP after the peer's DREQ (answered already).
func (c *cmConn) peerGone() {
	c.mu.Lock()
	c.gone = true
	q := c.q
	c.mu.Unlock()
	if q != nil {
		q.shutdown(verbs.ErrDisconnected)
	}
}

// cmQP is a QP set up with the CM: Disconnect sends a DREQ.
type cmQP struct {
	*qp
	c *cmConn
}

func (w *cmQP) Disconnect() error {
	err := w.qp.Disconnect()
	w.c.disconnect()
	return err
}

func (w *cmQP) Close() error { return w.Disconnect() }

// disconnect sends DREQs until the DREP comes or drepWait passes; the
// peer's own DREQ, already answered, makes it unnecessary, and ends the
// wait when it crosses ours (seen in the rxe guest: the kernel answers a
// crossed DREQ only when it comes again, 500 ms later).
func (c *cmConn) disconnect() {
	defer c.dev.gsi.remove(c)
	c.mu.Lock()
	skip := c.gone || !c.up
	c.gone = true
	c.mu.Unlock()
	if skip {
		return
	}
	dreq := &rdmacm.DREQ{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.q.rqpn}
	tid := c.dev.gsi.tid.Add(1)
	t := time.NewTimer(drepWait / drepTries)
	defer t.Stop()
	for range drepTries {
		if c.dev.sendMAD(tid, dreq, c.local, c.remote) != nil {
			return
		}
		t.Reset(drepWait / drepTries)
	wait:
		for {
			select {
			case m := <-c.in:
				switch m.(type) {
				case *rdmacm.DREP, *rdmacm.DREQ: // a DREQ crossing ours: both are answered
					return
				}
			case <-t.C:
				break wait
			case <-c.dev.stop:
				return
			}
		}
	}
}

// localFor is the address this host sends from to reach remote: the one
// given (QPConfig.LocalAddr), else the route's.
func localFor(given string, remote netip.Addr) (netip.Addr, error) {
	if given != "" {
		if ap, err := netip.ParseAddrPort(given); err == nil {
			return ap.Addr().Unmap(), nil
		}
		a, err := netip.ParseAddr(given)
		return a.Unmap(), err
	}
	// Connecting a UDP socket sends nothing; it asks the kernel's route.
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(remote, UDPPort)))
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// dialCM is the active side's exchange: REQ, REP (or REJ), RTU.
func (pq *pendingQP) dialCM(ctx context.Context, cp verbs.ConnParam) (verbs.QP, error) {
	q, d := pq.q, pq.q.dev
	addr := pq.addr.String()
	fail := func(err error) error {
		return &verbs.OpError{Op: "connect", Provider: Name, Addr: addr, Err: err}
	}
	if len(cp.PrivateData) > maxPrivateCM {
		return nil, fail(fmt.Errorf("%w: %d bytes of private data (at most %d with --roce-setup cm)", verbs.ErrInvalid, len(cp.PrivateData), maxPrivateCM))
	}
	remote, _ := netip.AddrFromSlice(pq.addr.IP.To4())
	local, err := localFor(q.info.Local.Addr, remote)
	if err != nil || !local.Is4() {
		if err == nil {
			err = errNotIPv4
		}
		return nil, fail(err)
	}
	c := &cmConn{dev: d, q: q, local: local, remote: remote, in: make(chan rdmacm.Message, 16), tid: d.gsi.tid.Add(1),
		srcPort: uint16(49152 + rand.IntN(16384)), recvPSN: randPSN()}
	d.gsi.add(c)
	req := c.request(uint16(pq.addr.Port), cp.PrivateData)
	rep, err := c.exchange(ctx, req)
	if err != nil {
		d.gsi.remove(c)
		return nil, fail(err)
	}
	port := d.cmPort() // every RoCEv2 peer receives on 4791
	// We send from the PSN the REP names, and expect the one our REQ did.
	q.nextPSN, q.una = rep.StartingPSN&psnMask, rep.StartingPSN&psnMask
	peer := oob.Params{QPN: rep.LocalQPN, PSN: c.recvPSN, UDPPort: port, MTU: uint16(d.cfg.MTU),
		ORD: uint16(rep.InitiatorDepth), IRD: uint16(rep.ResponderResources), Private: unframe(rep.Private)}
	c.mu.Lock()
	c.remoteID = rep.LocalCommID
	c.rtu = &rdmacm.RTU{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	c.up = true
	c.mu.Unlock()
	if err := d.sendMAD(c.tid, c.rtu, local, remote); err != nil {
		d.gsi.remove(c)
		return nil, fail(err)
	}
	q.begin(local, netip.AddrPortFrom(remote, port), peer, SetupCM)
	return &cmQP{qp: q, c: c}, nil
}

// request is our REQ for a connection to the rdma_cm listener on port.
func (c *cmConn) request(port uint16, private []byte) *rdmacm.REQ {
	q := c.q
	hdr := rdmacm.IPHeader{SrcPort: c.srcPort, Src: c.local, Dst: c.remote}
	return &rdmacm.REQ{
		LocalCommID: c.localID, ServiceID: rdmacm.ServiceID(port), LocalCAGUID: c.dev.gsi.guid,
		LocalQPN: q.qpn, ResponderResources: uint8(min(q.offer.in, 255)), InitiatorDepth: uint8(min(q.offer.out, 255)),
		RemoteCMResponseTimeout: cmResponseTimeout, TransportType: 0, // RC
		StartingPSN: c.recvPSN, LocalCMResponseTimeout: cmResponseTimeout, RetryCount: 7,
		PKey: defaultPKey, PathMTU: rdmacm.MTUCode(c.dev.cfg.MTU), RNRRetryCount: 7, MaxCMRetries: cmMaxRetries,
		Primary: rdmacm.Path{
			// What rdma_cm writes on RoCE: permissive LIDs, not subnet
			// local (the hop limit is over 1), the GIDs of the addresses.
			LocalLID: 0xffff, RemoteLID: 0xffff,
			LocalGID: rdmacm.GID(c.local), RemoteGID: rdmacm.GID(c.remote),
			HopLimit: cmHopLimit, LocalACKTimeout: ackTimeout,
		},
		Private: append(hdr.Append(nil), frame(private)...),
	}
}

// exchange sends the REQ until a REP, a REJ or the end of ctx; an MRA
// makes it wait as long as the peer asks before sending again.
func (c *cmConn) exchange(ctx context.Context, req *rdmacm.REQ) (*rdmacm.REP, error) {
	d := c.dev
	wait := rdmacm.Timeout(cmResponseTimeout)
	t := time.NewTimer(wait)
	defer t.Stop()
	for sent := 0; ; {
		if sent == cmMaxRetries {
			c.giveUp()
			return nil, fmt.Errorf("no REP to %d REQs over %v: %w", sent, time.Duration(sent)*wait, syscall.ETIMEDOUT)
		}
		if err := d.sendMAD(c.tid, req, c.local, c.remote); err != nil {
			return nil, err
		}
		sent++
		t.Reset(wait)
	wait:
		for {
			select {
			case <-ctx.Done():
				c.giveUp()
				return nil, ctx.Err()
			case <-d.stop:
				return nil, verbs.ErrClosed
			case <-t.C:
				break wait
			case m := <-c.in:
				switch m := m.(type) {
				case *rdmacm.REP:
					return m, nil
				case *rdmacm.REJ:
					return nil, rejectErr(m)
				case *rdmacm.MRA:
					if m.Messaged == 0 { // our REQ: the peer needs longer
						t.Reset(rdmacm.Timeout(m.ServiceTimeout) + wait)
					}
				}
			}
		}
	}
}

// giveUp tells the peer we stopped waiting: REJ with reason timeout.
func (c *cmConn) giveUp() {
	c.dev.sendMAD(c.tid, &rdmacm.REJ{LocalCommID: c.localID, Rejected: 0, Reason: rdmacm.ReasonTimeout}, c.local, c.remote)
}

// rejectErr turns a REJ into the error Connect returns: the application's
// refusal (reason 28) with its private data, as the other providers
// return it; any other reason is a refused connection that names it.
func rejectErr(m *rdmacm.REJ) error {
	if m.Reason == rdmacm.ReasonConsumer {
		return &verbs.RejectedError{PrivateData: unframe(m.Private)}
	}
	return fmt.Errorf("%w: the peer's CM rejected the REQ: %s", syscall.ECONNREFUSED, rdmacm.ReasonName(m.Reason))
}

// frame and unframe are our ibverbs provider's private data framing on
// the IB CM (verbs/ibverbs/cm.go): one length byte, then the bytes, so
// that the peer gets exactly those back out of the zero-padded area.
func frame(b []byte) []byte { return append([]byte{byte(len(b))}, b...) }

func unframe(raw []byte) []byte {
	if len(raw) == 0 || raw[0] == 0 {
		return nil
	}
	n := int(raw[0])
	if n > len(raw)-1 {
		return append([]byte(nil), raw...) // not framed: hand it over as is
	}
	return append([]byte(nil), raw[1:1+n]...)
}
