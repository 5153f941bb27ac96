package rdmacm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// IPHeaderLen is the length of rdma_cm's header in a REQ's private data,
// so that what a caller of rdma_connect can put there is 92 - 36 = 56
// bytes.
const IPHeaderLen = 36

// PortSpaceTCP is rdma_cm's port space for RC connections (RDMA_PS_TCP).
const PortSpaceTCP = 0x0106

// ServiceID is the service ID rdma_cm listens on for port: the port space
// above the port, 0x0000000001060000 | port for RDMA_PS_TCP (the top 40
// bits, 0x0000000001, are the IBTA's prefix for IP-based services).
func ServiceID(port uint16) uint64 { return PortSpaceTCP<<16 | uint64(port) }

// IPHeader is rdma_cm's header (annex A11's IP addressing private data):
// byte 0 the version (major 0, minor 0), byte 1 the IP version in its top
// four bits, bytes 2-3 the sender's source port, then the source and
// destination addresses, 16 bytes each; an IPv4 address sits in the last
// four bytes of its field, the first twelve zero.
type IPHeader struct {
	SrcPort  uint16
	Src, Dst netip.Addr // both IPv4 or both IPv6
}

// Append writes h after b.
func (h IPHeader) Append(b []byte) []byte {
	var w [IPHeaderLen]byte
	w[0] = 0 // MajV 0, MinV 0
	w[1] = 6 << 4
	if h.Src.Is4() {
		w[1] = 4 << 4
	}
	binary.BigEndian.PutUint16(w[2:], h.SrcPort)
	putIP(w[4:20], h.Src)
	putIP(w[20:36], h.Dst)
	return append(b, w[:]...)
}

func putIP(f []byte, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		copy(f[12:], v[:])
		return
	}
	v := a.As16()
	copy(f, v[:])
}

// ParseIPHeader reads rdma_cm's header from the front of a REQ's private
// data and returns it with the rest.
func ParseIPHeader(b []byte) (IPHeader, []byte, error) {
	var h IPHeader
	if len(b) < IPHeaderLen {
		return h, nil, fmt.Errorf("%w: %d bytes", ErrIPHdr, len(b))
	}
	if b[0] != 0 {
		return h, nil, fmt.Errorf("%w: version %#02x (want 0)", ErrIPHdr, b[0])
	}
	h.SrcPort = binary.BigEndian.Uint16(b[2:])
	switch b[1] >> 4 {
	case 4:
		h.Src = netip.AddrFrom4([4]byte(b[16:20]))
		h.Dst = netip.AddrFrom4([4]byte(b[32:36]))
	case 6:
		h.Src = netip.AddrFrom16([16]byte(b[4:20]))
		h.Dst = netip.AddrFrom16([16]byte(b[20:36]))
	default:
		return h, nil, fmt.Errorf("%w: IP version %d", ErrIPHdr, b[1]>>4)
	}
	return h, b[IPHeaderLen:], nil
}

// GID is the RoCEv2 GID of an address: IPv4-mapped IPv6 for IPv4.
func GID(a netip.Addr) [16]byte { return a.As16() }
