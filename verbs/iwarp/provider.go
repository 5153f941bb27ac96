package iwarp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/softcq"
)

// Name is the transport name of this provider.
const Name = "iwarp-soft"

// DeviceName is the name of the one device the provider has.
const DeviceName = "iwsoft0"

// Config tunes the provider. The zero value is ready to use.
type Config struct {
	// CRC says when this side asks for MPA CRC32c on every FPDU. CRC
	// is used whenever either side asks, as RFC 5044 requires.
	CRC CRCPolicy
	// NoPeerToPeer stops the active side asking for RFC 6581
	// peer-to-peer mode with a ready-to-receive message.
	NoPeerToPeer bool
	// MaxReads is the IRD/ORD limit per QP; 0 means 128.
	MaxReads int
	// SetupTimeout bounds connection setup when the context has no
	// deadline, and on a listener the time from a peer's connect to its
	// request being accepted or rejected; 0 means verbs.DefaultTimeout.
	SetupTimeout time.Duration
	// UserTimeout is TCP_USER_TIMEOUT on every QP socket: how long sent
	// data may go unacknowledged, or the peer's window stay shut, before
	// the kernel drops the connection and the QP dies (Done, Err). Idle
	// connections get keepalive probes often enough to be held to it too,
	// so a link that goes dark without a reset is found even when no one
	// is waiting. 0 means 30 s; negative leaves the kernel's defaults
	// (about 15 minutes of retransmission, tcp_retries2).
	UserTimeout time.Duration

	// testSegment, set by tests, caps each outgoing segment's payload at
	// message offset off, to cut messages as other peers might.
	testSegment func(off int) int
}

// CRCPolicy is when a side asks for MPA CRC32c.
type CRCPolicy uint8

const (
	// CRCAuto asks for CRC unless both ends of the TCP connection are
	// loopback addresses, where the bytes never leave memory and the
	// kernel checks nothing either.
	CRCAuto CRCPolicy = iota
	CRCOn             // always ask
	CRCOff            // never ask
)

func (c CRCPolicy) String() string {
	switch c {
	case CRCAuto:
		return "auto"
	case CRCOn:
		return "on"
	case CRCOff:
		return "off"
	}
	return fmt.Sprintf("CRCPolicy(%d)", uint8(c))
}

// wants says whether this side asks for CRC on connection c.
func (c CRCPolicy) wants(conn net.Conn) bool {
	switch c {
	case CRCOn:
		return true
	case CRCOff:
		return false
	}
	return !(isLoopback(conn.LocalAddr()) && isLoopback(conn.RemoteAddr()))
}

func isLoopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}

const defaultUserTimeout = 30 * time.Second

type provider struct{ cfg Config }

// New returns the software iWARP provider.
func New(cfg Config) verbs.Provider {
	if cfg.MaxReads <= 0 {
		cfg.MaxReads = 128
	}
	if cfg.MaxReads > irdOrdMask {
		cfg.MaxReads = irdOrdMask
	}
	if cfg.SetupTimeout <= 0 {
		cfg.SetupTimeout = verbs.DefaultTimeout
	}
	if cfg.UserTimeout == 0 {
		cfg.UserTimeout = defaultUserTimeout
	}
	return &provider{cfg: cfg}
}

func (p *provider) Name() string { return Name }

func (p *provider) Devices(ctx context.Context) ([]verbs.DeviceInfo, error) {
	return []verbs.DeviceInfo{{Name: DeviceName, Active: true, Detail: "pure-Go iWARP over TCP (MPA v2, DDP, RDMAP)"}}, nil
}

func (p *provider) Open(ctx context.Context, cfg verbs.DeviceConfig) (verbs.Device, error) {
	if cfg.Name != "" && cfg.Name != DeviceName {
		return nil, &verbs.OpError{Op: "open", Provider: Name, Err: fmt.Errorf("%w: %q (this provider has only %q)", verbs.ErrNoDevice, cfg.Name, DeviceName)}
	}
	return &device{cfg: p.cfg, regions: map[uint32]region{}}, nil
}

type device struct {
	cfg Config

	mu      sync.RWMutex
	regions map[uint32]region // live STags, and only those
	stags   stagGen           // the STag sequence (stag.go)
	closed  bool

	qpn atomic.Uint32
}

// region is what an STag names: an MR or a bound MW.
type region interface{ isRegion() }

func (d *device) Provider() string { return Name }
func (d *device) Name() string     { return DeviceName }

func (d *device) Caps() verbs.Caps {
	return verbs.Caps{
		MaxReadsPerQP:  d.cfg.MaxReads,
		MaxMsgSize:     1 << 31,
		MaxQPWR:        1 << 16,
		MaxCQE:         1 << 20,
		MaxPrivateData: mpaMaxPrivate - 4,
		MemoryWindows:  true,
		Addressing:     verbs.AddrIP,
		CPUPlaces:      true,
		ReadSums:       true,
	}
}

func (d *device) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	return nil
}

func opErr(op string, err error) error { return &verbs.OpError{Op: op, Provider: Name, Err: err} }

// newSTag maps r to a fresh STag and returns it: the next key of the
// device's keyed, non-repeating sequence that is neither 0 nor live (see
// stag.go for why keys are made this way).
func (d *device) newSTag(r region) uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stags.next(d.regions)
	d.regions[s] = r
	return s
}

// dropSTag forgets s if r still owns it. A key can be handed out again
// after 2^32 allocations, so a second drop of a stale key (an MR closed
// twice) must not take the key from its new owner.
func (d *device) dropSTag(s uint32, r region) {
	d.mu.Lock()
	if d.regions[s] == r {
		delete(d.regions, s)
	}
	d.mu.Unlock()
}

func (d *device) lookup(s uint32) region {
	d.mu.RLock()
	r := d.regions[s]
	d.mu.RUnlock()
	return r
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

type pd struct {
	dev *device
}

func (p *pd) Close() error { return nil }

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, opErr("reg_mr", fmt.Errorf("%w: empty buffer", verbs.ErrInvalid))
	}
	m := &mr{pd: p, buf: buf, addr: verbs.AddrOf(buf), access: access, drained: make(chan struct{})}
	m.stag = p.dev.newSTag(m)
	return m, nil
}

func (p *pd) AllocMW() (verbs.MW, error) {
	return &mw{pd: p}, nil
}

// mr is a registered region. users counts the goroutines touching buf
// right now (acquire, release); Close sets mrClosing and waits for the
// count to drain, so once Close returns nothing touches buf. Taking a
// share never blocks, and nobody holds one while waiting on the network:
// the reader and writer let go before they wait on their socket and take
// it back after. So Close waits only for copies already under way,
// never for a peer.
type mr struct {
	pd     *pd
	buf    []byte
	addr   uint64
	access verbs.Access
	stag   uint32

	// sums, when set, gives the CRC-32C of buf's spans to the writer's
	// MPA CRC (SetSpanSums).
	sums atomic.Pointer[verbs.SpanSums]

	users   atomic.Int64
	drained chan struct{} // closed once users is mrClosing alone
	drain   sync.Once
}

const mrClosing = 1 << 62

// SetSpanSums attaches s (nil detaches): Read Responses from m then take
// their MPA CRC from s's spans where it has them (verbs.SpanSums).
func (m *mr) SetSpanSums(s verbs.SpanSums) {
	if s == nil {
		m.sums.Store(nil)
		return
	}
	m.sums.Store(&s)
}

// refuseSpanSums detaches the span sums of every region of pd: a peer
// found an FPDU CRC wrong, and a CRC made from sums that no longer match
// the bytes (a source changed after it was summed) looks the same. The
// other connections of pd, which READs failed on this one move to, then
// CRC the bytes they send; an owner may attach sums again to regions it
// registers later.
func (d *device) refuseSpanSums(p *pd) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, r := range d.regions {
		if m, ok := r.(*mr); ok && m.pd == p {
			m.SetSpanSums(nil)
		}
	}
}

// spanSums is what is attached to m, or nil.
func (m *mr) spanSums() verbs.SpanSums {
	if p := m.sums.Load(); p != nil {
		return *p
	}
	return nil
}

// errDeregistered is a transfer cut short by MR.Close: the region it was
// copying from or into went while it waited on the socket.
var errDeregistered = errors.New("registered memory was deregistered (MR.Close) while in use")

// acquire takes a share of m; false once Close has begun.
func (m *mr) acquire() bool {
	if m.users.Add(1)&mrClosing != 0 {
		m.release()
		return false
	}
	return true
}

func (m *mr) release() {
	if m.users.Add(-1) == mrClosing {
		m.drain.Do(func() { close(m.drained) })
	}
}

func (*mr) isRegion() {}

func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Len() uint64          { return uint64(len(m.buf)) }
func (m *mr) LKey() uint32         { return m.stag }
func (m *mr) RKey() uint32         { return m.stag }
func (m *mr) Access() verbs.Access { return m.access }

// Close waits for copies into or out of the region under way (a readv,
// a writev, a CRC); it does not wait for the network. A transfer still
// waiting on its socket for the rest of its data is cut: its QP fails
// with a local protection error and an Err saying so. Close a QP first,
// or let its work complete, to have its transfers finish.
func (m *mr) Close() error {
	m.pd.dev.dropSTag(m.stag, m)
	if m.users.Or(mrClosing)&^mrClosing != 0 {
		<-m.drained
	}
	return nil
}

// span returns buf's bytes [addr, addr+n) if they lie inside the region.
func (m *mr) span(addr uint64, n uint64) ([]byte, bool) {
	if addr < m.addr {
		return nil, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf)) || n > uint64(len(m.buf))-off {
		return nil, false
	}
	return m.buf[off : off+n], true
}

// mw is a type-2 memory window.
type mw struct {
	pd *pd

	mu     sync.Mutex
	stag   uint32 // 0 when unbound
	mr     *mr
	qp     *qp
	addr   uint64
	len    uint64
	access verbs.Access
	closed bool
}

func (*mw) isRegion() {}

func (w *mw) RKey() uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stag
}

func (w *mw) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stag != 0 {
		w.pd.dev.dropSTag(w.stag, w)
		w.stag = 0
	}
	w.closed = true
	return nil
}

// bind binds w to q over [addr, addr+n) of m.
func (w *mw) bind(q *qp, m *mr, addr, n uint64, access verbs.Access) verbs.Status {
	if m.pd != w.pd || q.pd != w.pd || m.access&verbs.AccessMWBind == 0 {
		return verbs.StatusMWBind
	}
	if access&verbs.AccessRemoteWrite != 0 && m.access&verbs.AccessLocalWrite == 0 {
		return verbs.StatusMWBind
	}
	if _, ok := m.span(addr, n); !ok {
		return verbs.StatusMWBind
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return verbs.StatusMWBind
	}
	if w.stag != 0 {
		w.pd.dev.dropSTag(w.stag, w)
	}
	w.mr, w.qp, w.addr, w.len, w.access = m, q, addr, n, access
	w.stag = w.pd.dev.newSTag(w)
	return verbs.StatusSuccess
}

// invalidate unbinds the window whose current key is stag.
func (w *mw) invalidate(stag uint32) verbs.Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stag == 0 || w.stag != stag {
		return verbs.StatusMWBind
	}
	w.pd.dev.dropSTag(w.stag, w)
	w.stag = 0
	w.mr = nil
	w.qp = nil
	return verbs.StatusSuccess
}

// resolve finds the memory a remote access names, checking the STag's
// protection domain, QP binding, bounds and rights. On success the
// returned MR is acquired and the caller must release it.
func (d *device) resolve(q *qp, stag uint32, to uint64, n uint64, need verbs.Access) (*mr, []byte, *termError) {
	r := d.lookup(stag)
	var m *mr
	switch r := r.(type) {
	case *mr:
		if r.pd != q.pd {
			return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapSTagNotAssoc, msg: fmt.Sprintf("STag %#x belongs to another protection domain", stag)}
		}
		if r.access&need != need {
			return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapAccessRights, msg: fmt.Sprintf("STag %#x allows %v, not %v", stag, r.access, need)}
		}
		m = r
	case *mw:
		r.mu.Lock()
		wm, wq, wa, wl, acc, live := r.mr, r.qp, r.addr, r.len, r.access, r.stag == stag
		r.mu.Unlock()
		if !live || wm == nil {
			return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapInvalidSTag, msg: fmt.Sprintf("STag %#x is not bound", stag)}
		}
		if wq != q {
			return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapSTagNotAssoc, msg: fmt.Sprintf("window %#x is bound to another QP", stag)}
		}
		if acc&need != need {
			return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapAccessRights, msg: fmt.Sprintf("window %#x allows %v, not %v", stag, acc, need)}
		}
		if to < wa || to-wa > wl || n > wl-(to-wa) {
			return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapBaseBounds, msg: fmt.Sprintf("%d bytes at %#x outside window %#x", n, to, stag)}
		}
		m = wm
	default:
		return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapInvalidSTag, msg: fmt.Sprintf("unknown STag %#x", stag)}
	}
	if to+n < to {
		return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapTOWrap, msg: "tagged offset wraps"}
	}
	if !m.acquire() {
		return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapInvalidSTag, msg: fmt.Sprintf("STag %#x was deregistered", stag)}
	}
	b, ok := m.span(to, n)
	if !ok {
		m.release()
		return nil, nil, &termError{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapBaseBounds, msg: fmt.Sprintf("%d bytes at %#x outside region %#x", n, to, stag)}
	}
	return m, b, nil
}

// local finds the local memory an SGE names, acquired on success.
func (d *device) local(q *qp, s verbs.SGE, need verbs.Access) (*mr, []byte, bool) {
	m, ok := d.lookup(s.LKey).(*mr)
	if !ok || m.pd != q.pd || m.access&need != need {
		return nil, nil, false
	}
	b, ok := m.span(s.Addr, uint64(s.Length))
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
