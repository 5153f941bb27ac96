package protocol

import (
	"net"
	"strconv"
)

// Rails: a target that listens on several addresses tells an initiator
// which of them carry data QPs, so that a session's data QPs can spread
// over several paths (NICs, links). The initiator asks with Rails once it
// has authenticated, and only of a target whose Challenge.Rails is not
// 0; any other keeps one path.
const (
	// MaxRailAddrs bounds RailsReply.Addrs.
	MaxRailAddrs = 16
	// MaxRailAddr bounds one address ("host:port"), in bytes.
	MaxRailAddr = 255
)

// Message types of rails (37-39 are allocated to it).
const (
	TypeRails      Type = 37
	TypeRailsReply Type = 38
	TypeRailDrop   Type = 39
)

// Rails asks for the target's data addresses. It has no body.
type Rails struct {
	RequestID uint32
}

// RailsReply lists the addresses data QPs may join the session at,
// "host:port" each, in the target's order of preference. An empty list
// means only the address the control connection reached.
type RailsReply struct {
	RequestID uint32
	Addrs     []string
}

func (m *Rails) Type() Type      { return TypeRails }
func (m *Rails) ID() uint32      { return m.RequestID }
func (m *Rails) SetID(id uint32) { m.RequestID = id }
func (m *Rails) encode(*encoder) {}
func (m *Rails) decode(*decoder) {}

func (m *RailsReply) Type() Type      { return TypeRailsReply }
func (m *RailsReply) ID() uint32      { return m.RequestID }
func (m *RailsReply) SetID(id uint32) { m.RequestID = id }

// encode: u8 count, then count strings (u16 length, bytes).
func (m *RailsReply) encode(e *encoder) {
	if len(m.Addrs) > MaxRailAddrs {
		if e.err == nil {
			e.err = ErrTooLarge
		}
		return
	}
	e.u8(uint8(len(m.Addrs)))
	for _, a := range m.Addrs {
		e.str(a)
	}
}

func (m *RailsReply) decode(d *decoder) {
	n := int(d.u8())
	if n > MaxRailAddrs {
		d.fail("%d rail addresses, at most %d", n, MaxRailAddrs)
		return
	}
	for range n {
		a := d.str()
		if d.err != nil {
			return
		}
		if !ValidRailAddr(a) {
			d.fail("rail address %q is not host:port", a)
			return
		}
		m.Addrs = append(m.Addrs, a)
	}
}

// ValidRailAddr reports whether a is a usable data address: an IP
// address (not unspecified) and a port, at most MaxRailAddr bytes.
func ValidRailAddr(a string) bool {
	if len(a) == 0 || len(a) > MaxRailAddr {
		return false
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	p, err := strconv.Atoi(port)
	return ip != nil && !ip.IsUnspecified() && err == nil && p > 0 && p < 1<<16 && strconv.Itoa(p) == port
}

// RailDrop tells the target that the initiator has given up data QP
// Index (its path went dark): the target disconnects its end, if it is
// still connected, so that a replacement, over another rail, may join
// in that slot. Answered by Ack. Only to a target whose Challenge.Rails
// is not 0.
type RailDrop struct {
	RequestID uint32
	Index     uint16
}

func (m *RailDrop) Type() Type        { return TypeRailDrop }
func (m *RailDrop) ID() uint32        { return m.RequestID }
func (m *RailDrop) SetID(id uint32)   { m.RequestID = id }
func (m *RailDrop) encode(e *encoder) { e.u16(m.Index) }
func (m *RailDrop) decode(d *decoder) { m.Index = d.u16() }
