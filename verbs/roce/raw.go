package roce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The raw receive path (Config.RawICRC). The ICRC covers the IPv4
// header's identification field; Linux writes 0 there for this
// provider's datagrams (DF, unconnected socket) but the kernel's rxe sets
// skb->ignore_df and so gets a non-zero ID, which a UDP socket never
// shows. A raw IPPROTO_UDP socket gets a copy of each datagram with its
// IP header, so the ICRC can be checked against the ID on the wire. The
// UDP socket stays bound (it holds the port, and the kernel answers
// nothing with ICMP port-unreachable) but a filter drops all it gets.
// The raw socket gets datagrams before UDP checks their checksum; the
// ICRC covers every byte the UDP checksum does, so a corrupt one is
// still dropped here.

var errIPHeader = errors.New("roce: IPv4 header not a RoCEv2 one (options, fragment, or not UDP)")

// parseIPv4 splits a raw socket's datagram into the addresses the ICRC
// covers and the UDP payload. It takes only what a RoCEv2 sender writes:
// IHL 5, flags DF, no fragment offset, UDP, lengths that agree.
func parseIPv4(b []byte) (addrs, []byte, error) {
	var a addrs
	if len(b) < 28 {
		return a, nil, errShort
	}
	if b[0] != 0x45 || b[9] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(b[6:]) != 0x4000 {
		return a, nil, errIPHeader
	}
	if int(binary.BigEndian.Uint16(b[2:])) != len(b) || int(binary.BigEndian.Uint16(b[24:])) != len(b)-20 {
		return a, nil, errShort
	}
	a.ipID = binary.BigEndian.Uint16(b[4:])
	a.src = netip.AddrFrom4([4]byte(b[12:16]))
	a.dst = netip.AddrFrom4([4]byte(b[16:20]))
	a.srcPort = binary.BigEndian.Uint16(b[20:])
	a.dstPort = binary.BigEndian.Uint16(b[22:])
	return a, b[28:], nil
}

// openRaw opens the raw socket, filtered in the kernel to datagrams for
// port, and makes udp drop everything it receives.
func openRaw(udp *net.UDPConn, port uint16) (*net.IPConn, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_UDP)
	if err != nil {
		return nil, &net.OpError{Op: "open", Net: "ip4:udp", Err: os.NewSyscallError("socket", fmt.Errorf("%w (the raw receive path needs CAP_NET_RAW)", err))}
	}
	portOnly := []unix.SockFilter{
		{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0}, // X = IP header length
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},  // UDP destination port
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: uint32(port), Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	if err := attachFilter(fd, portOnly); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
	}
	f := os.NewFile(uintptr(fd), "roce-raw")
	c, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	rc, err := udp.SyscallConn()
	if err == nil {
		var ferr error
		err = rc.Control(func(u uintptr) {
			ferr = attachFilter(int(u), []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}})
		})
		if err == nil {
			err = ferr
		}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c.(*net.IPConn), nil
}

func attachFilter(fd int, prog []unix.SockFilter) error {
	return os.NewSyscallError("setsockopt SO_ATTACH_FILTER",
		unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}))
}

// readRaw reads one datagram, IP header included (net.IPConn's own reads
// strip it).
func readRaw(rc syscall.RawConn, b []byte) (int, error) {
	var n int
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b, 0)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	return n, rerr
}

// icrcMode names how received ICRCs are checked, for the transport line,
// in the words of rdmacp's --roce-icrc: id0 (over IP ID 0, on the UDP
// socket), raw (over the ID on the wire, on the raw socket) or off.
func (d *device) icrcMode() string {
	switch {
	case d.cfg.NoICRCCheck:
		return "off"
	case d.raw != nil:
		return "raw"
	}
	return "id0"
}
