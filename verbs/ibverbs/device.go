//go:build rdma && linux && cgo

package ibverbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/rdmacp/rdmacp/verbs"
)

// Enabled reports whether this build has the libibverbs implementation
// (build tag rdma, linux, cgo).
const Enabled = true

type provider struct{ cfg Config }

// New returns the libibverbs provider.
func New(cfg Config) verbs.Provider {
	if cfg.Setup == "" {
		cfg.Setup = SetupRDMACM
	}
	if cfg.SetupTimeout <= 0 {
		cfg.SetupTimeout = verbs.DefaultTimeout
	}
	if cfg.MaxReads < 0 {
		cfg.MaxReads = 0
	}
	return &provider{cfg: cfg}
}

func (p *provider) Name() string { return Name }

func opErr(op string, err error) error { return &verbs.OpError{Op: op, Provider: Name, Err: err} }

func errnoErr(rc C.int) error {
	if rc == 0 {
		return nil
	}
	if rc < 0 {
		rc = -rc
	}
	return syscall.Errno(rc)
}

// contextList is librdmacm's device list: the verbs contexts rdma_cm ids
// are bound to. PDs and CQs must come from these contexts, so a device
// keeps its list until it is closed.
type contextList struct {
	list **C.struct_ibv_context
	ctxs []*C.struct_ibv_context
}

func getContexts() (*contextList, error) {
	var n C.int
	list, err := C.rdma_get_devices(&n)
	if list == nil {
		// No device, or no rdma_cm (rdma_ucm not loaded). Tell the two
		// apart by asking libibverbs.
		var m C.int
		if dl := C.ibv_get_device_list(&m); dl != nil {
			C.ibv_free_device_list(dl)
		}
		if m == 0 {
			return &contextList{}, nil
		}
		if err == nil {
			err = syscall.ENODEV
		}
		return nil, fmt.Errorf("rdma_cm has no devices though libibverbs sees %d (is rdma_ucm loaded?): %w", int(m), err)
	}
	return &contextList{list: list, ctxs: unsafe.Slice(list, int(n))}, nil
}

func (l *contextList) free() {
	if l.list != nil {
		C.rdma_free_devices(l.list)
		l.list = nil
	}
}

// portInfo is what one port offers.
type portInfo struct {
	num       int
	active    bool
	state     string
	linkLayer string // "InfiniBand", "Ethernet"
	mtu       int
	maxMsg    uint64
	gidIndex  int // chosen GID, -1 none
	gid       net.IP
	gidType   string // "RoCE v2", "RoCE v1", "IB", "?"
	ip        net.IP // IPv4 (or IPv6) address of the chosen GID, nil for IB GIDs
}

var portStates = map[C.enum_ibv_port_state]string{
	C.IBV_PORT_NOP: "NOP", C.IBV_PORT_DOWN: "DOWN", C.IBV_PORT_INIT: "INIT",
	C.IBV_PORT_ARMED: "ARMED", C.IBV_PORT_ACTIVE: "ACTIVE", C.IBV_PORT_ACTIVE_DEFER: "ACTIVE_DEFER",
}

func mtuBytes(m C.enum_ibv_mtu) int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << int(m)
}

func gidTypeName(t uint32) string {
	switch t {
	case C.IBV_GID_TYPE_IB:
		return "IB/RoCE v1"
	case C.IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2"
	}
	return "?"
}

// queryPort reads one port and picks its GID: want >= 0 is an explicit
// index; otherwise a RoCE v2 IPv4-mapped GID is preferred, then any
// IPv4-mapped one, then a RoCE v2 global one, then index 0.
func queryPort(ctx *C.struct_ibv_context, port int, want int) (portInfo, error) {
	var pa C.struct_ibv_port_attr
	if rc := C.rc_query_port(ctx, C.uint8_t(port), &pa); rc != 0 {
		return portInfo{}, fmt.Errorf("query port %d: %w", port, errnoErr(rc))
	}
	pi := portInfo{
		num:      port,
		active:   pa.state == C.IBV_PORT_ACTIVE,
		state:    portStates[pa.state],
		mtu:      mtuBytes(pa.active_mtu),
		maxMsg:   uint64(pa.max_msg_sz),
		gidIndex: -1,
	}
	switch pa.link_layer {
	case C.IBV_LINK_LAYER_ETHERNET:
		pi.linkLayer = "Ethernet"
	default:
		pi.linkLayer = "InfiniBand"
	}
	if pi.state == "" {
		pi.state = fmt.Sprintf("state %d", int(pa.state))
	}
	best, bestScore := -1, -1
	var bestGID net.IP
	var bestType uint32
	for i := 0; i < int(pa.gid_tbl_len); i++ {
		if want >= 0 && i != want {
			continue
		}
		var raw [16]C.uint8_t
		var typ C.uint32_t
		if C.rc_query_gid(ctx, C.uint32_t(port), C.uint32_t(i), &raw[0], &typ) != 0 {
			continue
		}
		g := make(net.IP, 16)
		for j := range g {
			g[j] = byte(raw[j])
		}
		if g.Equal(net.IPv6zero) {
			continue
		}
		score := 0
		v4 := g.To4() != nil
		switch {
		case v4 && uint32(typ) == C.IBV_GID_TYPE_ROCE_V2:
			score = 4
		case v4:
			score = 3
		case uint32(typ) == C.IBV_GID_TYPE_ROCE_V2 && !g.IsLinkLocalUnicast():
			score = 2
		case i == 0:
			score = 1
		}
		if score > bestScore {
			best, bestScore, bestGID, bestType = i, score, g, uint32(typ)
		}
	}
	if want >= 0 && best < 0 {
		return pi, fmt.Errorf("%w: port %d has no GID at index %d", verbs.ErrNoDevice, port, want)
	}
	if best >= 0 {
		pi.gidIndex = best
		pi.gid = bestGID
		pi.gidType = gidTypeName(bestType)
		if pi.linkLayer == "Ethernet" {
			if v4 := bestGID.To4(); v4 != nil {
				pi.ip = v4
			} else if !bestGID.IsLinkLocalUnicast() {
				pi.ip = bestGID
			}
		}
	}
	return pi, nil
}

func transportName(ctx *C.struct_ibv_context, pi portInfo) string {
	switch C.rc_transport(ctx) {
	case C.IBV_TRANSPORT_IWARP:
		return "iWARP"
	case C.IBV_TRANSPORT_IB:
		if pi.linkLayer == "Ethernet" {
			if strings.HasPrefix(pi.gidType, "RoCE v2") {
				return "RoCE v2"
			}
			return "RoCE"
		}
		return "InfiniBand"
	}
	return "unknown transport"
}

func deviceName(ctx *C.struct_ibv_context) string { return C.GoString(C.rc_device_name(ctx)) }

func physPorts(ctx *C.struct_ibv_context) (int, error) {
	var da C.struct_ibv_device_attr
	if rc := C.ibv_query_device(ctx, &da); rc != 0 {
		return 0, fmt.Errorf("query device: %w", errnoErr(rc))
	}
	return int(da.phys_port_cnt), nil
}

func (p *provider) Devices(ctx context.Context) ([]verbs.DeviceInfo, error) {
	l, err := getContexts()
	if err != nil {
		return nil, opErr("devices", err)
	}
	defer l.free()
	var out []verbs.DeviceInfo
	for _, c := range l.ctxs {
		info := verbs.DeviceInfo{Name: deviceName(c)}
		n, err := physPorts(c)
		if err != nil {
			info.Detail = err.Error()
			out = append(out, info)
			continue
		}
		var parts []string
		for port := 1; port <= n; port++ {
			pi, err := queryPort(c, port, -1)
			if err != nil {
				parts = append(parts, err.Error())
				continue
			}
			if pi.active {
				info.Active = true
			}
			parts = append(parts, describePort(c, pi))
		}
		info.Detail = strings.Join(parts, "; ")
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func describePort(c *C.struct_ibv_context, pi portInfo) string {
	s := fmt.Sprintf("%s port %d %s mtu %d", transportName(c, pi), pi.num, pi.state, pi.mtu)
	if pi.gidIndex >= 0 {
		s += fmt.Sprintf(" gid[%d] %s", pi.gidIndex, pi.gid)
		if pi.ip != nil {
			s += " (" + pi.ip.String() + ")"
		}
	}
	return s
}

// device is an opened RDMA device: one librdmacm context, one port, and
// one rdma_cm event channel whose descriptor Go's netpoller waits on.
type device struct {
	p      *provider
	list   *contextList
	ctx    *C.struct_ibv_context
	name   string
	port   portInfo
	caps   verbs.Caps
	trans  string
	shared *ctxShared

	ch     *C.struct_rdma_event_channel
	chFile *os.File
	evbuf  *C.struct_rc_cm_event
	wg     sync.WaitGroup

	idMu      sync.Mutex
	ids       map[uint64]*cmID // by token (rc_create_id)
	nextToken uint64

	// Connection set-ups in flight (beginSetup): Close cancels them and
	// waits for them before it frees what they use.
	closing    context.Context
	stopSetups context.CancelCauseFunc
	setups     sync.WaitGroup

	// Object lifetimes; not on the data path.
	lifeMu    sync.Mutex
	closed    bool
	pds       map[*pd]struct{}
	cqs       map[*cq]struct{}
	qps       map[*qp]struct{}
	listeners map[verbs.Listener]struct{} // rdma_cm's and the out-of-band setup's
	reqs      map[verbs.ConnRequest]struct{}

	// Translation of completions: QP tables by serial, windows by key index.
	tabMu      sync.RWMutex
	tabs       map[uint32]*qp
	nextSerial uint32
	mwMu       sync.Mutex
	mws        map[uint32]*mw
}

func (p *provider) Open(ctx context.Context, cfg verbs.DeviceConfig) (verbs.Device, error) {
	if err := p.cfg.Validate(); err != nil {
		return nil, opErr("open", err)
	}
	l, err := getContexts()
	if err != nil {
		return nil, opErr("open", err)
	}
	d, err := p.open(l, cfg)
	if err != nil {
		l.free()
		return nil, opErr("open", err)
	}
	return d, nil
}

func (p *provider) open(l *contextList, cfg verbs.DeviceConfig) (*device, error) {
	if len(l.ctxs) == 0 {
		return nil, fmt.Errorf("%w: no RDMA devices on this host", verbs.ErrNoDevice)
	}
	want := cfg.GIDIndex
	if want == 0 {
		want = -1 // GID 0 is the link-local default GID: choose automatically
	}
	var names []string
	var lastErr error
	for _, c := range l.ctxs {
		name := deviceName(c)
		names = append(names, name)
		if cfg.Name != "" && name != cfg.Name {
			continue
		}
		n, err := physPorts(c)
		if err != nil {
			lastErr = fmt.Errorf("%s: %w", name, err)
			continue
		}
		if cfg.Port > n {
			lastErr = fmt.Errorf("%w: %s has %d port(s), no port %d", verbs.ErrNoDevice, name, n, cfg.Port)
			continue
		}
		for port := 1; port <= n; port++ {
			if cfg.Port != 0 && port != cfg.Port {
				continue
			}
			pi, err := queryPort(c, port, want)
			if err != nil {
				lastErr = fmt.Errorf("%s: %w", name, err)
				continue
			}
			if !pi.active {
				lastErr = fmt.Errorf("%w: %s port %d is %s", verbs.ErrNoDevice, name, port, pi.state)
				continue
			}
			return p.openCtx(l, c, pi)
		}
	}
	if lastErr != nil {
		return nil, lastErr
	}
	if cfg.Name != "" {
		return nil, fmt.Errorf("%w: %q (devices: %s)", verbs.ErrNoDevice, cfg.Name, strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("%w: no active port on %s", verbs.ErrNoDevice, strings.Join(names, ", "))
}

func (p *provider) openCtx(l *contextList, c *C.struct_ibv_context, pi portInfo) (*device, error) {
	var da C.struct_ibv_device_attr
	if rc := C.ibv_query_device(c, &da); rc != 0 {
		return nil, fmt.Errorf("query device: %w", errnoErr(rc))
	}
	reads := min(int(da.max_qp_rd_atom), int(da.max_qp_init_rd_atom), 255)
	if p.cfg.MaxReads > 0 {
		reads = min(reads, p.cfg.MaxReads)
	}
	if reads < 1 {
		reads = 1
	}
	flags := uint32(da.device_cap_flags)
	hasMW := flags&C.IBV_DEVICE_MEM_WINDOW != 0 && flags&(C.IBV_DEVICE_MEM_WINDOW_TYPE_2A|C.IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0
	d := &device{
		p: p, list: l, ctx: c, name: deviceName(c), port: pi,
		caps: verbs.Caps{
			MaxReadsPerQP:  reads,
			MaxMsgSize:     pi.maxMsg,
			MaxQPWR:        int(da.max_qp_wr),
			MaxCQE:         int(da.max_cqe),
			MaxPrivateData: maxPrivReq,
			MemoryWindows:  hasMW,
			Addressing:     verbs.AddrIP,
		},
		ids: map[uint64]*cmID{}, pds: map[*pd]struct{}{}, cqs: map[*cq]struct{}{},
		qps: map[*qp]struct{}{}, listeners: map[verbs.Listener]struct{}{}, reqs: map[verbs.ConnRequest]struct{}{},
		tabs: map[uint32]*qp{}, mws: map[uint32]*mw{},
	}
	d.trans = transportName(c, pi)
	d.closing, d.stopSetups = context.WithCancelCause(context.Background())
	sh, err := acquireShared(c)
	if err != nil {
		return nil, err
	}
	d.shared = sh
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		releaseShared(sh)
		return nil, fmt.Errorf("rdma_create_event_channel: %w", err)
	}
	d.ch = ch
	f, err := pollableFile(int(ch.fd), "rdma_cm")
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		releaseShared(sh)
		return nil, err
	}
	d.chFile = f
	d.evbuf = (*C.struct_rc_cm_event)(C.calloc(1, C.sizeof_struct_rc_cm_event))
	d.wg.Add(1)
	go d.eventLoop()
	return d, nil
}

// pollableFile makes fd non-blocking and returns a duplicate of it that
// Go's netpoller waits on; the original stays with its library.
func pollableFile(fd int, name string) (*os.File, error) {
	if rc := C.rc_set_nonblock(C.int(fd)); rc != 0 {
		return nil, fmt.Errorf("%s: set non-blocking: %w", name, syscall.Errno(rc))
	}
	nfd, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("%s: dup: %w", name, err)
	}
	syscall.CloseOnExec(nfd)
	if rc := C.rc_set_nonblock(C.int(nfd)); rc != 0 {
		syscall.Close(nfd)
		return nil, fmt.Errorf("%s: set non-blocking: %w", name, syscall.Errno(rc))
	}
	return os.NewFile(uintptr(nfd), name), nil
}

func (d *device) Provider() string { return Name }
func (d *device) Name() string     { return d.name }
func (d *device) Caps() verbs.Caps { return d.caps }

func (d *device) String() string { return d.name + " " + describePort(d.ctx, d.port) }

func (d *device) Close() error {
	d.lifeMu.Lock()
	if d.closed {
		d.lifeMu.Unlock()
		return nil
	}
	d.closed = true
	d.lifeMu.Unlock()
	// Set-ups in flight end first (each wait in them is bounded by its
	// context, which this cancels): they use ids, QPs and the event
	// channel freed below.
	d.stopSetups(verbs.ErrClosed)
	d.setups.Wait()
	d.lifeMu.Lock()
	ls := keys(d.listeners)
	rs := keys(d.reqs)
	qs := keys(d.qps)
	d.lifeMu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, r := range rs {
		r.Reject(nil)
	}
	for _, q := range qs {
		q.destroy()
	}
	d.lifeMu.Lock()
	ps := keys(d.pds)
	cs := keys(d.cqs)
	d.lifeMu.Unlock()
	for _, p := range ps {
		p.destroyAll()
	}
	for _, c := range cs {
		c.Close()
	}
	d.chFile.Close() // stops the event loop
	d.wg.Wait()
	C.rdma_destroy_event_channel(d.ch)
	C.free(unsafe.Pointer(d.evbuf))
	releaseShared(d.shared)
	d.list.free()
	return nil
}

func keys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (d *device) isClosed() bool {
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	return d.closed
}

// ---- rdma_cm events ----

type cmEvent struct {
	typ       C.enum_rdma_cm_event_type
	status    int
	idp       *C.struct_rdma_cm_id
	token     uint64
	listen    uint64 // CONNECT_REQUEST: the listening id's token
	qpNum     uint32
	respRes   int
	initDepth int
	private   []byte // raw, as the transport delivered it
}

func (e cmEvent) String() string {
	return fmt.Sprintf("%s (status %d)", C.GoString(C.rdma_event_str(e.typ)), e.status)
}

// cmID is one rdma_cm id. Events for it either go to its handler, once
// set, or queue on events for a setup step to read.
type cmID struct {
	d       *device
	id      *C.struct_rdma_cm_id
	token   uint64
	mu      sync.Mutex
	handler func(cmEvent)
	events  chan cmEvent
	owner   any // *listener for a listening id
}

func (d *device) token() uint64 {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	d.nextToken++
	return d.nextToken
}

func (d *device) newCMID() (*cmID, error) {
	var id *C.struct_rdma_cm_id
	tok := d.token()
	if rc := C.rc_create_id(d.ch, C.uint64_t(tok), &id); rc != 0 {
		return nil, fmt.Errorf("rdma_create_id: %w", errnoErr(rc))
	}
	return d.register(id, tok), nil
}

func (d *device) register(id *C.struct_rdma_cm_id, tok uint64) *cmID {
	c := &cmID{d: d, id: id, token: tok, events: make(chan cmEvent, 16)}
	d.idMu.Lock()
	d.ids[tok] = c
	d.idMu.Unlock()
	return c
}

// adopt registers a child id that a CONNECT_REQUEST created; it has its
// listener's token until then. The event loop calls it, before it reads
// the next event.
func (d *device) adopt(id *C.struct_rdma_cm_id) *cmID {
	tok := d.token()
	C.rc_set_token(id, C.uint64_t(tok))
	return d.register(id, tok)
}

// destroy destroys the id, once. Its events were all acked when they
// were read, so this never waits on the event loop; and rdma_destroy_id
// returns only once librdmacm has finished with every event it reported
// for the id: see qp.destroy.
func (c *cmID) destroy() {
	c.mu.Lock()
	id := c.id
	c.id = nil
	c.mu.Unlock()
	if id == nil {
		return
	}
	c.d.idMu.Lock()
	delete(c.d.ids, c.token)
	c.d.idMu.Unlock()
	C.rdma_destroy_id(id)
}

func (c *cmID) deliver(e cmEvent) {
	c.mu.Lock()
	h := c.handler
	if h == nil {
		select {
		case c.events <- e:
		default: // setup reads at most a few; drop the excess
		}
	}
	c.mu.Unlock()
	if h != nil {
		h(e)
	}
}

// setHandler routes this id's events to h from now on, including any
// that queued meanwhile.
func (c *cmID) setHandler(h func(cmEvent)) {
	c.mu.Lock()
	c.handler = h
	var queued []cmEvent
	for {
		select {
		case e := <-c.events:
			queued = append(queued, e)
			continue
		default:
		}
		break
	}
	c.mu.Unlock()
	for _, e := range queued {
		h(e)
	}
}

// wait returns the next event for c, or why ctx ended (ErrClosed when
// the device is closing: beginSetup).
func (c *cmID) wait(ctx context.Context) (cmEvent, error) {
	select {
	case e := <-c.events:
		return e, nil
	case <-ctx.Done():
		return cmEvent{}, context.Cause(ctx)
	}
}

func (d *device) eventLoop() {
	defer d.wg.Done()
	rc, err := d.chFile.SyscallConn()
	if err != nil {
		return
	}
	for {
		err := rc.Read(func(fd uintptr) bool {
			for {
				r := C.rc_get_cm_event(d.ch, d.evbuf)
				if r != 0 {
					return false // EAGAIN (or an error): wait for the fd
				}
				d.dispatch(d.copyEvent())
			}
		})
		if err != nil {
			return // closed
		}
	}
}

func (d *device) copyEvent() cmEvent {
	b := d.evbuf
	e := cmEvent{
		typ:       C.enum_rdma_cm_event_type(b.event),
		status:    int(b.status),
		idp:       b.id,
		token:     uint64(b.token),
		listen:    uint64(b.listen_token),
		qpNum:     uint32(b.qp_num),
		respRes:   int(b.responder_resources),
		initDepth: int(b.initiator_depth),
	}
	if b.private_len > 0 {
		e.private = C.GoBytes(unsafe.Pointer(&b.private_data[0]), C.int(b.private_len))
	}
	return e
}

func (d *device) dispatch(e cmEvent) {
	if e.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		d.idMu.Lock()
		lc := d.ids[e.listen]
		d.idMu.Unlock()
		child := d.adopt(e.idp)
		var l *listener
		if lc != nil {
			lc.mu.Lock()
			l, _ = lc.owner.(*listener)
			lc.mu.Unlock()
		}
		if l == nil || !l.push(child, e) {
			// Here, not in a goroutine that could outlive Close: this
			// never waits on the event loop (librdmacm counts the
			// request against the listening id, acked already).
			C.rdma_reject(child.id, nil, 0)
			child.destroy()
		}
		return
	}
	d.idMu.Lock()
	c := d.ids[e.token]
	d.idMu.Unlock()
	if c != nil {
		c.deliver(e)
	}
}

// ---- state shared by every device on one verbs context ----

// ctxShared reads the context's async events (one reader per context,
// however many devices are opened on it) and routes QP and CQ errors.
type ctxShared struct {
	ctx  *C.struct_ibv_context
	refs int
	file *os.File
	done chan struct{}

	mu  sync.Mutex
	qps map[uintptr]*qp
	cqs map[uintptr]*cq
}

var (
	sharedMu sync.Mutex
	shared   = map[*C.struct_ibv_context]*ctxShared{}
)

func acquireShared(c *C.struct_ibv_context) (*ctxShared, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s := shared[c]; s != nil {
		s.refs++
		return s, nil
	}
	f, err := pollableFile(int(C.rc_async_fd(c)), "async events")
	if err != nil {
		return nil, err
	}
	s := &ctxShared{ctx: c, refs: 1, file: f, done: make(chan struct{}), qps: map[uintptr]*qp{}, cqs: map[uintptr]*cq{}}
	shared[c] = s
	go s.loop()
	return s, nil
}

func releaseShared(s *ctxShared) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	s.refs--
	if s.refs > 0 {
		return
	}
	delete(shared, s.ctx)
	s.file.Close()
	<-s.done
}

func (s *ctxShared) loop() {
	defer close(s.done)
	rc, err := s.file.SyscallConn()
	if err != nil {
		return
	}
	var ev C.struct_rc_async_event
	for {
		err := rc.Read(func(fd uintptr) bool {
			for {
				if C.rc_get_async_event(s.ctx, &ev) != 0 {
					return false
				}
				s.handle(ev)
			}
		})
		if err != nil {
			return
		}
	}
}

func (s *ctxShared) handle(ev C.struct_rc_async_event) {
	switch ev._type {
	case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR:
		s.mu.Lock()
		q := s.qps[uintptr(ev.element)]
		s.mu.Unlock()
		if q != nil {
			q.asyncError(C.GoString(C.ibv_event_type_str(C.enum_ibv_event_type(ev._type))))
		}
	case C.IBV_EVENT_CQ_ERR:
		s.mu.Lock()
		c := s.cqs[uintptr(ev.element)]
		s.mu.Unlock()
		if c != nil {
			c.setOverrun()
		}
	case C.IBV_EVENT_DEVICE_FATAL:
		s.mu.Lock()
		qs := make([]*qp, 0, len(s.qps))
		for _, q := range s.qps {
			qs = append(qs, q)
		}
		s.mu.Unlock()
		for _, q := range qs {
			q.asyncError("device fatal error")
		}
	}
}

func (s *ctxShared) addQP(q *qp) {
	s.mu.Lock()
	s.qps[uintptr(unsafe.Pointer(q.qp))] = q
	s.mu.Unlock()
}

func (s *ctxShared) delQP(q *qp) {
	s.mu.Lock()
	delete(s.qps, uintptr(unsafe.Pointer(q.qp)))
	s.mu.Unlock()
}

func (s *ctxShared) addCQ(c *cq) {
	s.mu.Lock()
	s.cqs[uintptr(unsafe.Pointer(c.cq))] = c
	s.mu.Unlock()
}

func (s *ctxShared) delCQ(c *cq) {
	s.mu.Lock()
	delete(s.cqs, uintptr(unsafe.Pointer(c.cq)))
	s.mu.Unlock()
}
