// Package verbs is rdmacp's RDMA verbs layer: the capabilities of an RDMA
// transport, with no policy. It is shaped after libibverbs and librdmacm:
// devices, protection domains, memory regions and windows, completion
// queues, reliable-connected queue pairs and a connection manager.
//
// Providers implement the interfaces here; the initiator and target decide
// how to use them (striping, windows in flight, retries, verification).
//
// Setup is typestate: a PendingQP can only post receives; it becomes a QP,
// which can post sends and RDMA READs, once it is connected.
package verbs

import (
	"context"
	"fmt"
	"time"
)

// Provider is one transport implementation, such as the pure-Go software
// iWARP provider or libibverbs.
type Provider interface {
	// Name is the transport name users type: "iwarp-soft", "ibverbs".
	Name() string
	// Devices lists what this provider can open on this host. An empty
	// list with a nil error means the provider works but has no device.
	Devices(ctx context.Context) ([]DeviceInfo, error)
	// Open opens a device. A zero DeviceConfig picks the provider's default.
	Open(ctx context.Context, cfg DeviceConfig) (Device, error)
}

// DeviceInfo describes a device a provider can open.
type DeviceInfo struct {
	Name   string // e.g. "mlx5_0", "rxe0", "soft"
	Active bool   // at least one port is usable
	Detail string // one line for humans: transport, port state, GID
}

// DeviceConfig selects a device. The field names follow perftest.
type DeviceConfig struct {
	Name     string // -d; empty means the first active device
	Port     int    // -i; 0 means the first active port
	GIDIndex int    // -x / --gid-index; -1 (or 0, the zero value) means choose automatically
}

// AddrMode says how a provider's endpoints are addressed.
type AddrMode int

const (
	// AddrIP: endpoints are IP host:port pairs, as with rdma_cm and iWARP.
	AddrIP AddrMode = iota + 1
)

// Caps are a device's limits, reported without policy.
type Caps struct {
	MaxReadsPerQP  int    // outstanding RDMA READs per QP, either direction (IRD/ORD)
	MaxMsgSize     uint64 // largest single message or READ in bytes
	MaxQPWR        int    // largest send or receive queue
	MaxCQE         int    // largest completion queue
	MaxPrivateData int    // bytes of private data in a connection request or reply
	MemoryWindows  bool   // type-2 memory windows are available
	// CPUPlaces: the CPU places incoming data (a software transport), so
	// registering memory pins nothing and any mapping may be registered;
	// false for a device that DMAs into pinned pages.
	CPUPlaces bool
	// ReadSums: a READ posted with SendWR.Sum completes with the CRC-32C
	// of the bytes it placed, computed as they were placed, while they
	// are in cache (Completion.Sum). A software transport has them in
	// cache anyway; a NIC that DMAs them does not, and says false.
	ReadSums   bool
	Addressing AddrMode
}

// Device is an opened RDMA device.
type Device interface {
	Provider() string
	Name() string
	Caps() Caps
	AllocPD() (PD, error)
	// CreateCQ makes a completion queue holding at least size entries.
	CreateCQ(size int) (CQ, error)
	// Listen starts accepting connections on addr ("host:port"). ctx
	// bounds setup only, as with net.Dialer: the listener outlives it.
	Listen(ctx context.Context, addr string) (Listener, error)
	// PrepareDial resolves addr and makes a QP that will connect to it.
	PrepareDial(ctx context.Context, pd PD, addr string, cfg QPConfig) (PendingQP, error)
	Close() error
}

// Access is a set of memory access rights.
type Access uint32

const (
	AccessLocalWrite Access = 1 << iota
	AccessRemoteWrite
	AccessRemoteRead
	AccessMWBind
)

func (a Access) String() string {
	s := ""
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "local-write"}, {AccessRemoteWrite, "remote-write"}, {AccessRemoteRead, "remote-read"}, {AccessMWBind, "mw-bind"}} {
		if a&f.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += f.name
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// PD is a protection domain: memory and QPs of one PD only see each other.
type PD interface {
	// RegMR registers buf, which the caller owns and which must not be Go
	// heap memory (use AllocBuffer or unix.Mmap). buf must stay mapped
	// until the MR is closed.
	RegMR(buf []byte, access Access) (MR, error)
	// AllocMW allocates an unbound type-2 memory window.
	AllocMW() (MW, error)
	Close() error
}

// MR is a registered memory region. Addr is the address remote peers use
// in READs: the virtual address of the first byte.
type MR interface {
	Addr() uint64
	Len() uint64
	LKey() uint32
	RKey() uint32
	Access() Access
	// Close deregisters the region; it returns once no operation in
	// progress still uses the memory.
	Close() error
}

// SpanSize is the span of SpanSums: a page, so that a region that maps a
// file from any page on has its spans on the file's own 4 KiB boundaries.
const SpanSize = 4096

// SpanSums hands a provider the CRC-32C of a registered region's bytes a
// span at a time (SpanSize bytes from the region's first byte), so that
// a provider that checksums what it sends (iwarp-soft's MPA CRC) can
// combine them instead of reading the bytes once more before sending
// them. A provider that can use them gives its MRs a method
// SetSpanSums(SpanSums) (nil detaches); the region's owner decides where
// the sums come from and when they stop holding. Sums that no longer
// match the bytes make the peer fail the connection (MPA: a CRC error is
// fatal), so an owner whose source may change detaches them when a
// connection that used them fails.
type SpanSums interface {
	// Spans fills dst with the CRC-32C of the region's whole spans
	// first, first+1, …; false if it lacks one of them, and the provider
	// reads those bytes instead.
	Spans(first int, dst []uint32) bool
}

// MW is a type-2 memory window: bound to one QP and a sub-range of an MR
// with a SendWR of OpBindMW, and invalidated with OpLocalInv.
type MW interface {
	// RKey is the key of the current binding, 0 while unbound or after
	// OpLocalInv.
	RKey() uint32
	Close() error
}

// CQ is a completion queue shared by any number of QPs.
type CQ interface {
	// Poll moves up to len(out) completions into out and returns how
	// many. It never blocks.
	Poll(out []Completion) (int, error)
	// Wait blocks until a completion may be ready to poll, or ctx ends.
	Wait(ctx context.Context) error
	Close() error
}

// QPConfig sizes a reliable-connected QP.
type QPConfig struct {
	SendCQ, RecvCQ CQ
	MaxSendWR      int // send queue depth; 0 means the provider's default
	MaxRecvWR      int // receive queue depth; 0 means the provider's default
	// MaxReadsOut is this side's ORD: READs it may have outstanding.
	// MaxReadsIn is this side's IRD: peer READs it will serve at once.
	// Zero means the device maximum. The connection settles on the
	// smaller of each side's offer; see ConnInfo.
	MaxReadsOut int
	MaxReadsIn  int
	// LocalAddr is the local IP address (or "ip:port") an active QP
	// connects from, to pick the interface, and so the path, it takes;
	// "" lets the provider choose (the device's own address, or the
	// routing table's). Passive QPs ignore it.
	LocalAddr string
}

// DefaultQPWR is the send or receive queue depth of a QPConfig that
// asks for none (capped at the device's Caps.MaxQPWR).
const DefaultQPWR = 256

// Resolve is c as a provider applies it on a device with caps: a queue
// depth of 0 becomes DefaultQPWR, one over caps.MaxQPWR is refused
// (ErrInvalid); an ORD or IRD of 0 or over caps.MaxReadsPerQP becomes
// the device maximum. Every provider calls it, so they agree.
func (c QPConfig) Resolve(caps Caps) (QPConfig, error) {
	if c.MaxSendWR <= 0 {
		c.MaxSendWR = min(DefaultQPWR, caps.MaxQPWR)
	}
	if c.MaxRecvWR <= 0 {
		c.MaxRecvWR = min(DefaultQPWR, caps.MaxQPWR)
	}
	if c.MaxSendWR > caps.MaxQPWR || c.MaxRecvWR > caps.MaxQPWR {
		return c, fmt.Errorf("%w: queue depth over %d", ErrInvalid, caps.MaxQPWR)
	}
	clamp := func(v int) int {
		if v <= 0 || v > caps.MaxReadsPerQP {
			return caps.MaxReadsPerQP
		}
		return v
	}
	c.MaxReadsOut = clamp(c.MaxReadsOut)
	c.MaxReadsIn = clamp(c.MaxReadsIn)
	return c, nil
}

// ConnParam is what one side offers when connecting or accepting.
type ConnParam struct {
	PrivateData []byte
}

// ConnInfo is what a connection negotiated.
type ConnInfo struct {
	ReadsOut    int    // READs this side may have outstanding (ORD)
	ReadsIn     int    // peer READs this side serves at once (IRD)
	PrivateData []byte // the peer's private data; it may come back zero-padded (the IB CM pads it)
	Local       Endpoint
	Remote      Endpoint
	Detail      string // provider specifics, e.g. "mpa v2 crc=on"
}

// Endpoint names one end of a connection. It is small and serialisable.
type Endpoint struct {
	Provider string `json:"provider"`
	Addr     string `json:"addr"`
	QPN      uint32 `json:"qpn"`
}

// Listener accepts connection requests, as an rdma_cm listening id.
type Listener interface {
	// Accept waits for the next connection request.
	Accept(ctx context.Context) (ConnRequest, error)
	Addr() string
	Close() error
}

// ConnRequest is an incoming connection not yet accepted.
type ConnRequest interface {
	PrivateData() []byte
	RemoteAddr() string
	// Prepare makes the QP that will carry the connection; the request
	// is accepted by the PendingQP's Connect.
	Prepare(pd PD, cfg QPConfig) (PendingQP, error)
	// Reject refuses the connection, sending private data to the peer.
	Reject(privateData []byte) error
}

// PendingQP is a QP that is not connected yet: it can take receives so
// that they are in place before the first message arrives.
type PendingQP interface {
	PostRecv(wrs []RecvWR) (int, error)
	// Connect connects (active side) or accepts (passive side). On
	// success the PendingQP must not be used again. ctx bounds the
	// setup only; the QP outlives it.
	Connect(ctx context.Context, p ConnParam) (QP, error)
	Close() error
}

// QP is a connected reliable-connected queue pair.
type QP interface {
	// PostSend posts wrs in order and returns how many it took; on a
	// short count err says why wrs[n] was refused (like bad_wr).
	PostSend(wrs []SendWR) (int, error)
	PostRecv(wrs []RecvWR) (int, error)
	Info() ConnInfo
	// Done is closed once the connection is gone: disconnected by
	// either side, broken, or in the error state after any error
	// completion. Err then says why.
	Done() <-chan struct{}
	Err() error
	// Disconnect ends the connection; outstanding work requests
	// complete with StatusWRFlush.
	Disconnect() error
	// Close disconnects and frees the QP.
	Close() error
}

// Opcode is a work request or completion kind.
type Opcode uint8

const (
	OpSend Opcode = iota + 1
	OpRead
	OpWrite
	OpRecv
	OpBindMW
	OpLocalInv
)

func (o Opcode) String() string {
	switch o {
	case OpSend:
		return "send"
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpRecv:
		return "recv"
	case OpBindMW:
		return "bind-mw"
	case OpLocalInv:
		return "local-inv"
	}
	return "op?"
}

// SGE is a local buffer: an address inside an MR and the MR's lkey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send-queue work request.
//
//   - OpSend: send Local.
//   - OpRead: read Local.Length bytes at RemoteAddr/RKey into Local;
//     with Sum, on a device with Caps.ReadSums, the completion carries
//     the CRC-32C of the bytes placed.
//   - OpWrite: write Local to RemoteAddr/RKey.
//   - OpBindMW: bind MW to this QP over [BindAddr, BindAddr+BindLen) of
//     BindMR with BindAccess; the new key is MW.RKey() on completion.
//   - OpLocalInv: invalidate the window whose key is RKey.
type SendWR struct {
	ID         uint64
	Op         Opcode
	Local      SGE
	RemoteAddr uint64
	RKey       uint32
	Sum        bool // OpRead: ask for Completion.Sum (Caps.ReadSums)

	MW         MW
	BindMR     MR
	BindAddr   uint64
	BindLen    uint64
	BindAccess Access
}

// RecvWR is a receive-queue work request.
type RecvWR struct {
	ID    uint64
	Local SGE
}

// Completion reports a finished work request. Completions of one queue
// arrive in the order their requests were posted.
type Completion struct {
	WRID   uint64
	Status Status
	Op     Opcode // valid only when Status is StatusSuccess, as in ibverbs
	Bytes  uint32 // bytes received, for OpRecv
	QPN    uint32 // the local QP's number: its Info().Local.QPN
	// Sum is the CRC-32C of the bytes a successful OpRead placed, when it
	// was posted with SendWR.Sum on a device with Caps.ReadSums.
	Sum uint32
}

// DefaultTimeout bounds connection setup when the caller's context has
// no deadline.
const DefaultTimeout = 30 * time.Second
