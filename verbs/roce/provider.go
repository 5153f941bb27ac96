// Package roce is roce-soft, a pure-Go RoCEv2 provider: InfiniBand's
// reliable-connected transport in UDP datagrams (port 4791), so that a
// host without an RDMA NIC speaks the wire protocol RoCE NICs speak.
//
// One UDP socket per device carries every QP's packets; the destination
// QP number in each BTH picks the QP. Connections are set up either out
// of band over TCP (cm.go; docs/protocol.md §1b), or, on the active side,
// with the IB CM over QP1 as rdma_cm speaks it (cmqp1.go; §1c), which a
// stock rdma_cm listener on a RoCE device accepts.
package roce

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"unsafe"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/roce/oob"
	"github.com/rdmacp/rdmacp/verbs/softcq"
	"golang.org/x/sys/unix"
)

// Name is the transport name of this provider.
const Name = "roce-soft"

// DeviceName is the name of the one device the provider has.
const DeviceName = "rocesoft0"

// Config tunes the provider. The zero value is ready to use.
type Config struct {
	// Port is the UDP port the device receives on and sends to: 0 means
	// 4791 (UDPPort), what every RoCEv2 peer uses; -1 lets the kernel
	// pick one, so that tests can run several devices on one host.
	Port int
	// MTU is the path MTU, the largest payload of one packet: 256, 512,
	// 1024, 2048 or 4096; 0 means 1024, what rxe picks on a 1500-byte
	// Ethernet MTU.
	MTU int
	// MaxReads is the IRD/ORD limit per QP; 0 means 16, what ConnectX
	// NICs offer (max_qp_rd_atom).
	MaxReads int
	// RetransmitTimeout is how long the oldest unacknowledged packet
	// waits before go-back-N; 0 means 65 ms, the IB local ACK timeout 14
	// (4.096 µs × 2^14) that rdma_cm sets by default.
	RetransmitTimeout time.Duration
	// RetryCount is how many retransmissions in a row without progress
	// fail the QP (StatusRetryExceeded); 0 means 7, the IB maximum.
	RetryCount int
	// RNRDelay is how long to wait after a receiver-not-ready NAK; 0
	// means the delay the NAK asks for. RNRRetry bounds how many in a row
	// fail the QP (StatusRNRRetry); 0 means 7 (bounded, unlike IB's
	// "7 means forever": every wait here has a bound).
	RNRDelay time.Duration
	RNRRetry int
	// NoICRCCheck accepts packets without checking their ICRC, for peers
	// whose IP header this side cannot reconstruct (see icrc).
	NoICRCCheck bool
	// RawICRC receives on a raw IPPROTO_UDP socket (needs CAP_NET_RAW),
	// which shows each datagram's IP header, so that the ICRC of a kernel
	// peer (rxe writes a non-zero IP ID, which the ICRC covers and a UDP
	// socket never shows) is checked rather than skipped; see raw.go.
	RawICRC bool
	// Setup is how connections are set up: SetupOOB (the zero value) or
	// SetupCM (the active side only: Listen refuses it).
	Setup Setup
	// SetupTimeout bounds connection setup when the context has no
	// deadline; 0 means verbs.DefaultTimeout.
	SetupTimeout time.Duration

	// testWire, set by tests, stands for the wire: it gets each
	// outgoing datagram (a copy it may keep) and calls put for each copy
	// that is to arrive, now or later, so that tests can drop, duplicate
	// and reorder packets.
	testWire func(b []byte, put func([]byte))
	// testCMPort, set by tests, is the UDP port of the peer's QP1 in place
	// of 4791.
	testCMPort uint16
}

const (
	defaultMTU     = 1024
	defaultReads   = 16
	defaultRTO     = 65 * time.Millisecond
	defaultRetries = 7
	socketBuffer   = 16 << 20
	// sendWindow bounds the SEND packets in flight beyond the oldest
	// unacknowledged one.
	sendWindow = 1024
)

type provider struct{ cfg Config }

// New returns the roce-soft provider.
func New(cfg Config) verbs.Provider {
	if cfg.MTU == 0 {
		cfg.MTU = defaultMTU
	}
	if cfg.MaxReads <= 0 {
		cfg.MaxReads = defaultReads
	}
	if cfg.RetransmitTimeout <= 0 {
		cfg.RetransmitTimeout = defaultRTO
	}
	if cfg.RetryCount <= 0 {
		cfg.RetryCount = defaultRetries
	}
	if cfg.RNRRetry <= 0 {
		cfg.RNRRetry = defaultRetries
	}
	if cfg.SetupTimeout <= 0 {
		cfg.SetupTimeout = verbs.DefaultTimeout
	}
	if cfg.Setup == "" {
		cfg.Setup = SetupOOB
	}
	return &provider{cfg: cfg}
}

func (p *provider) Name() string { return Name }

func (p *provider) Devices(ctx context.Context) ([]verbs.DeviceInfo, error) {
	return []verbs.DeviceInfo{{Name: DeviceName, Active: true,
		Detail: fmt.Sprintf("pure-Go RoCEv2 over UDP port %d, MTU %d, setup %s", p.port(), p.cfg.MTU, p.cfg.Setup)}}, nil
}

func (p *provider) port() int {
	switch {
	case p.cfg.Port == 0:
		return UDPPort
	case p.cfg.Port < 0:
		return 0
	}
	return p.cfg.Port
}

func opErr(op string, err error) error { return &verbs.OpError{Op: op, Provider: Name, Err: err} }

func (p *provider) Open(ctx context.Context, cfg verbs.DeviceConfig) (verbs.Device, error) {
	if cfg.Name != "" && cfg.Name != DeviceName {
		return nil, opErr("open", fmt.Errorf("%w: %q (this provider has only %q)", verbs.ErrNoDevice, cfg.Name, DeviceName))
	}
	if p.cfg.Setup != SetupOOB && p.cfg.Setup != SetupCM {
		return nil, opErr("open", fmt.Errorf("%w: connection setup %q (want %s or %s)", verbs.ErrInvalid, p.cfg.Setup, SetupOOB, SetupCM))
	}
	if !oob.ValidMTU(p.cfg.MTU) {
		return nil, opErr("open", fmt.Errorf("%w: MTU %d (want 256, 512, 1024, 2048 or 4096)", verbs.ErrInvalid, p.cfg.MTU))
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{Port: p.port()})
	if err != nil {
		return nil, &verbs.OpError{Op: "open", Provider: Name, Addr: fmt.Sprintf("udp :%d", p.port()), Err: err}
	}
	rcvbuf, err := tuneSocket(conn)
	if err != nil {
		conn.Close()
		return nil, opErr("open", err)
	}
	d := &device{cfg: p.cfg, conn: conn, port: uint16(conn.LocalAddr().(*net.UDPAddr).Port),
		keys: map[uint32]*mr{}, qps: map[uint32]*qp{}, stop: make(chan struct{}), readLimit: int64(max(rcvbuf/4, 64<<10))}
	if p.cfg.RawICRC {
		if d.raw, err = openRaw(conn, d.port); err != nil {
			conn.Close()
			return nil, opErr("open", err)
		}
	}
	d.gsi.init(p.cfg.testCMPort)
	d.keySeq.Store(rand.Uint32())
	d.qpn.Store(rand.Uint32N(1<<23) + 16)
	d.wg.Add(1)
	go d.receive()
	return d, nil
}

// tuneSocket asks for IP_PKTINFO (the ICRC covers the destination
// address, which a socket bound to 0.0.0.0 learns only so), large buffers
// (a READ response is a burst of up to maxReadBytesOut), and DF with an
// IP ID of 0 on every datagram (what the ICRC assumes).
func tuneSocket(c *net.UDPConn) (rcvbuf int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		f := int(fd)
		if serr = unix.SetsockoptInt(f, unix.IPPROTO_IP, unix.IP_PKTINFO, 1); serr != nil {
			return
		}
		if serr = unix.SetsockoptInt(f, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); serr != nil {
			return
		}
		// FORCE passes rmem_max/wmem_max when we are allowed; the plain
		// call is capped there otherwise.
		for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if unix.SetsockoptInt(f, unix.SOL_SOCKET, o[0], socketBuffer) != nil {
				unix.SetsockoptInt(f, unix.SOL_SOCKET, o[1], socketBuffer)
			}
		}
		rcvbuf, serr = unix.GetsockoptInt(f, unix.SOL_SOCKET, unix.SO_RCVBUF)
	})
	if err != nil {
		return 0, err
	}
	return rcvbuf, serr
}

// readBudget says whether n more bytes of READ responses may be asked
// for now; alone (the asking QP has none outstanding) it may exceed the
// limit while nothing else is outstanding, so that any READ can go.
func (d *device) readBudget(n uint64, alone bool) bool {
	out := d.readOut.Load()
	return out+int64(n) <= d.readLimit || (alone && out == 0)
}

type device struct {
	cfg  Config
	conn *net.UDPConn
	raw  *net.IPConn // the raw receive path, with Config.RawICRC
	port uint16

	mu     sync.RWMutex
	keys   map[uint32]*mr
	qps    map[uint32]*qp
	closed bool
	keySeq atomic.Uint32
	qpn    atomic.Uint32

	sendMu sync.Mutex // one sendmsg at a time keeps oob buffers simple
	oob    []byte

	stop chan struct{}
	wg   sync.WaitGroup

	gsi gsi // QP1, for Config.Setup = SetupCM

	// READ response bytes the device's QPs have asked for and not yet
	// received, and the bound on them: a quarter of the receive buffer
	// the kernel granted (it doubles what is asked and charges each
	// datagram about twice its size), so that the bursts of every QP at
	// once fit and a loss costs one go-back-N, not a livelock of bursts
	// that overflow again. Measured: with 4 QPs x 16 x 4 MiB READs and no
	// device-wide bound, READs failed with the retry count exceeded.
	readOut   atomic.Int64
	readLimit int64

	// counters, for tests and the debug log
	dropped  atomic.Uint64 // datagrams that failed to decode or had no QP
	sentPkts atomic.Uint64
	repairs  atomic.Uint64 // READ requests for responses lost (readrx.go)
	replays  atomic.Uint64 // duplicate READ requests served again (readresp.go)
}

func (d *device) Provider() string { return Name }
func (d *device) Name() string     { return DeviceName }

func (d *device) Caps() verbs.Caps {
	return verbs.Caps{
		MaxReadsPerQP:  d.cfg.MaxReads,
		MaxMsgSize:     1 << 31, // the RETH DMA length is 32 bits; IB caps messages at 2 GiB
		MaxQPWR:        1 << 14,
		MaxCQE:         1 << 20,
		MaxPrivateData: d.maxPrivate(),
		Addressing:     verbs.AddrIP,
		CPUPlaces:      true,
	}
}

func (d *device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qps := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.mu.Unlock()
	for _, q := range qps {
		q.Close()
	}
	close(d.stop)
	if d.raw != nil {
		d.raw.Close()
	}
	err := d.conn.Close()
	d.wg.Wait()
	return err
}

// receive reads datagrams and hands each to the QP its BTH names.
// Anything that does not decode is dropped and counted, never answered.
func (d *device) receive() {
	defer d.wg.Done()
	read := d.readUDP()
	if d.raw != nil {
		read = d.readRaw()
	}
	for {
		buf := getBuf()
		a, b, err := read(buf)
		if err != nil {
			putBuf(buf)
			select {
			case <-d.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if errors.Is(err, errDropped) {
				d.dropped.Add(1)
			}
			continue
		}
		if len(b) > 0 && b[0] == opUDSendOnly { // to QP1: connection management
			d.onGSI(b, a)
			putBuf(buf)
			continue
		}
		p, err := decode(b, a, !d.cfg.NoICRCCheck)
		if err != nil {
			d.dropped.Add(1)
			putBuf(buf)
			continue
		}
		d.mu.RLock()
		q := d.qps[p.destQP]
		d.mu.RUnlock()
		if q == nil || !q.accepts(a) {
			d.dropped.Add(1)
			putBuf(buf)
			continue
		}
		q.deliver(inPacket{packet: p, buf: buf})
	}
}

// errDropped marks a datagram read but not taken (not IPv4, a header
// RoCEv2 never has): counted as dropped, like a bad ICRC.
var errDropped = errors.New("roce: datagram dropped")

// readUDP reads from the UDP socket; the IP ID it cannot see is taken to
// be 0, what Linux writes for this provider's datagrams.
func (d *device) readUDP() func(*dgram) (addrs, []byte, error) {
	oob := make([]byte, 128)
	return func(buf *dgram) (addrs, []byte, error) {
		n, oobn, _, src, err := d.conn.ReadMsgUDPAddrPort(buf.b[:], oob)
		if err != nil {
			return addrs{}, nil, err
		}
		dst, ok := pktinfoDst(oob[:oobn])
		if !ok || !src.Addr().Unmap().Is4() {
			return addrs{}, nil, errDropped
		}
		return addrs{src: src.Addr().Unmap(), dst: dst, srcPort: src.Port(), dstPort: d.port}, buf.b[:n], nil
	}
}

// readRaw reads from the raw socket, IP header and all.
func (d *device) readRaw() func(*dgram) (addrs, []byte, error) {
	rc, err := d.raw.SyscallConn()
	return func(buf *dgram) (addrs, []byte, error) {
		if err != nil {
			return addrs{}, nil, err
		}
		n, rerr := readRaw(rc, buf.b[:])
		if rerr != nil {
			return addrs{}, nil, rerr
		}
		a, b, perr := parseIPv4(buf.b[:n])
		if perr != nil || a.dstPort != d.port {
			return addrs{}, nil, errDropped
		}
		return a, b, nil
	}
}

func pktinfoDst(oob []byte) (netip.Addr, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo {
			var a [4]byte
			copy(a[:], m.Data[8:12]) // ipi_addr: the header's destination address
			return netip.AddrFrom4(a), true
		}
	}
	return netip.Addr{}, false
}

// send writes one datagram from src to dst.
func (d *device) send(b []byte, src netip.Addr, dst netip.AddrPort) error {
	if w := d.cfg.testWire; w != nil {
		// A test wire may deliver later (a packet held back to reorder):
		// only a delivery made before w returns reports its error here.
		var mu sync.Mutex
		var err error
		returned := false
		w(append([]byte(nil), b...), func(b []byte) {
			e := d.sendNow(b, src, dst)
			mu.Lock()
			if !returned {
				err = e
			}
			mu.Unlock()
		})
		mu.Lock()
		defer mu.Unlock()
		returned = true
		return err
	}
	return d.sendNow(b, src, dst)
}

func (d *device) sendNow(b []byte, src netip.Addr, dst netip.AddrPort) error {
	d.sendMu.Lock()
	defer d.sendMu.Unlock()
	if d.oob == nil {
		d.oob = make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
		h := (*unix.Cmsghdr)(unsafePointer(&d.oob[0]))
		h.Level = unix.IPPROTO_IP
		h.Type = unix.IP_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	}
	info := d.oob[unix.CmsgLen(0):]
	s := src.As4()
	copy(info[4:8], s[:]) // ipi_spec_dst: the source address to use
	_, _, err := d.conn.WriteMsgUDPAddrPort(b, d.oob, dst)
	d.sentPkts.Add(1)
	return err
}

// datagram buffers, recycled: one per packet in flight in a QP's queue.
type dgram struct{ b [4096 + 256]byte }

var bufPool = sync.Pool{New: func() any { return new(dgram) }}

func getBuf() *dgram  { return bufPool.Get().(*dgram) }
func putBuf(b *dgram) { bufPool.Put(b) }

func (d *device) register(q *qp) {
	d.mu.Lock()
	d.qps[q.qpn] = q
	d.mu.Unlock()
}

func (d *device) unregister(q *qp) {
	d.mu.Lock()
	if d.qps[q.qpn] == q {
		delete(d.qps, q.qpn)
	}
	d.mu.Unlock()
}

// newQPN hands out a 24-bit QP number that is not 0 or 1 (QP0 and QP1 are
// the management QPs) and not live.
func (d *device) newQPN() uint32 {
	for {
		n := d.qpn.Add(1) & qpnMask
		if n < 2 {
			continue
		}
		d.mu.RLock()
		_, live := d.qps[n]
		d.mu.RUnlock()
		if !live {
			return n
		}
	}
}

func (d *device) AllocPD() (verbs.PD, error) {
	d.mu.RLock()
	closed := d.closed
	d.mu.RUnlock()
	if closed {
		return nil, opErr("alloc_pd", verbs.ErrClosed)
	}
	return &pd{dev: d}, nil
}

type pd struct{ dev *device }

func (p *pd) Close() error { return nil }

func (p *pd) AllocMW() (verbs.MW, error) {
	return nil, opErr("alloc_mw", verbs.ErrUnsupported)
}

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, opErr("reg_mr", fmt.Errorf("%w: empty buffer", verbs.ErrInvalid))
	}
	m := &mr{pd: p, buf: buf, addr: verbs.AddrOf(buf), access: access}
	d := p.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		// An odd multiplier is a bijection on 32 bits: keys do not repeat
		// for 2^32 registrations, and are not guessable in sequence.
		k := d.keySeq.Add(1) * 0x9e3779b1
		if _, live := d.keys[k]; k != 0 && !live {
			m.key = k
			d.keys[k] = m
			return m, nil
		}
	}
}

// mr is a registered region. users counts the goroutines copying into or
// out of buf right now; Close waits for them, so once it returns nothing
// touches buf. Nobody holds a share while waiting on the network.
type mr struct {
	pd     *pd
	buf    []byte
	addr   uint64
	access verbs.Access
	key    uint32

	mu      sync.Mutex
	users   int
	closing bool
	idle    *sync.Cond
}

func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Len() uint64          { return uint64(len(m.buf)) }
func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Access() verbs.Access { return m.access }

func (m *mr) acquire() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return false
	}
	m.users++
	return true
}

func (m *mr) release() {
	m.mu.Lock()
	m.users--
	if m.users == 0 && m.idle != nil {
		m.idle.Broadcast()
	}
	m.mu.Unlock()
}

func (m *mr) Close() error {
	d := m.pd.dev
	d.mu.Lock()
	if d.keys[m.key] == m {
		delete(d.keys, m.key)
	}
	d.mu.Unlock()
	m.mu.Lock()
	m.closing = true
	if m.idle == nil {
		m.idle = sync.NewCond(&m.mu)
	}
	for m.users > 0 {
		m.idle.Wait() // bounded: users copy memory, they never wait on the network
	}
	m.mu.Unlock()
	return nil
}

// span returns buf's bytes [addr, addr+n) if they lie inside the region.
func (m *mr) span(addr, n uint64) ([]byte, bool) {
	if addr < m.addr {
		return nil, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf)) || n > uint64(len(m.buf))-off {
		return nil, false
	}
	return m.buf[off : off+n], true
}

// resolve finds the memory key names for [addr, addr+n) with rights need
// in protection domain p, acquired on success: the caller releases it.
func (d *device) resolve(p *pd, key uint32, addr, n uint64, need verbs.Access) (*mr, []byte, bool) {
	d.mu.RLock()
	m := d.keys[key]
	d.mu.RUnlock()
	if m == nil || m.pd != p || m.access&need != need || addr+n < addr {
		return nil, nil, false
	}
	b, ok := m.span(addr, n)
	if !ok || !m.acquire() {
		return nil, nil, false
	}
	return m, b, true
}

// cq is a completion queue: the one the software providers share.
type cq = softcq.CQ

func (d *device) CreateCQ(size int) (verbs.CQ, error) {
	return softcq.New(Name, size, d.Caps().MaxCQE)
}

func unsafePointer(b *byte) unsafe.Pointer { return unsafe.Pointer(b) }

// Describe says, for doctor, where dev receives RoCEv2 packets, its path
// MTU, and the GIDs it presents: RoCEv2 GIDs are IPv4-mapped IPv6
// addresses, one per local IPv4 address. ok is false for a device of
// another provider.
func Describe(dev verbs.Device) (detail string, ok bool) {
	d, ok := dev.(*device)
	if !ok {
		return "", false
	}
	var gids []string
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if n, isIP := a.(*net.IPNet); isIP && n.IP.To4() != nil {
				gids = append(gids, "::ffff:"+n.IP.String())
			}
		}
	}
	return fmt.Sprintf("UDP port %d bound; path MTU %d; GIDs %v", d.port, d.cfg.MTU, gids), true
}
