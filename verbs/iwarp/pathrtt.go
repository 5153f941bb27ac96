package iwarp

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// PathRTT is the kernel's lowest round-trip time on the QP's TCP
// connection (TCP_INFO tcpi_min_rtt): the minimum over the handshake
// and every ACK since, so one sample delayed by a loaded host does not
// make loopback look like a long link. ok is false where the socket
// can't be asked (not TCP, closed, or no sample yet).
func (q *qp) PathRTT() (time.Duration, bool) {
	sc, ok := q.conn.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil || info == nil {
		return 0, false
	}
	// Min_rtt is 0 until the first sample and ~0U when the kernel has
	// none (tcp_min_rtt of a socket that never measured one).
	if info.Min_rtt == 0 || info.Min_rtt == ^uint32(0) {
		return 0, false
	}
	return time.Duration(info.Min_rtt) * time.Microsecond, true
}
