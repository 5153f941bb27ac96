// Package oob is the out-of-band connection setup of RoCEv2 reliable
// connections over TCP (docs/protocol.md §1b.3): roce-soft uses it for
// every connection, and the ibverbs provider uses it when asked to
// (ibverbs.SetupOOB), so that a kernel rxe or a RoCE NIC can take a
// roce-soft peer without the IB CM over QP1.
//
// Frame: type (1 byte), body length (2 bytes, big-endian), body.
// REQ and REP body: version (1) = 1, QPN (4), starting PSN (4), UDP port
// (2), MTU (2), ORD offered (2), IRD offered (2), private data (rest).
package oob

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Message types.
const (
	REQ  = 1
	REP  = 2
	RTU  = 3
	REJ  = 4
	DREQ = 5
)

const (
	version  = 1
	fixedLen = 17
	// MaxPrivateData is what rdma_cm lets a user put in a REQ (IB CM's 92
	// bytes less its 36-byte header), so that software written against
	// this exchange fits the IB CM exchange too.
	MaxPrivateData = 56
	// MaxFrameLen is the longest body a frame may have.
	MaxFrameLen = fixedLen + MaxPrivateData
	// writeTimeout bounds one frame's write: frames are tiny, so a peer
	// that takes longer is not reading.
	writeTimeout = 5 * time.Second
)

// Params are a REQ's or REP's parameters.
type Params struct {
	QPN      uint32 // 2 to 0xffffff
	PSN      uint32 // the sender's first PSN, below 2^24
	UDPPort  uint16 // where the sender receives RoCEv2 packets (4791 for a kernel peer)
	MTU      uint16 // path MTU in bytes: 256 to 4096, a power of two
	ORD, IRD uint16 // READ depths offered, at least 1
	Private  []byte
}

// ErrFrame is a frame that breaks the format.
var ErrFrame = errors.New("roce: malformed connection message")

// ValidMTU reports whether m is an IB path MTU.
func ValidMTU(m int) bool { return m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096 }

// Encode returns p as a REQ or REP body.
func (p Params) Encode() []byte {
	b := make([]byte, fixedLen, fixedLen+len(p.Private))
	b[0] = version
	binary.BigEndian.PutUint32(b[1:], p.QPN)
	binary.BigEndian.PutUint32(b[5:], p.PSN)
	binary.BigEndian.PutUint16(b[9:], p.UDPPort)
	binary.BigEndian.PutUint16(b[11:], p.MTU)
	binary.BigEndian.PutUint16(b[13:], p.ORD)
	binary.BigEndian.PutUint16(b[15:], p.IRD)
	return append(b, p.Private...)
}

// Decode parses a REQ or REP body and checks every field's range.
func Decode(b []byte) (Params, error) {
	var p Params
	if len(b) < fixedLen || b[0] != version {
		return p, fmt.Errorf("%w: %d-byte REQ/REP", ErrFrame, len(b))
	}
	p.QPN = binary.BigEndian.Uint32(b[1:])
	p.PSN = binary.BigEndian.Uint32(b[5:])
	p.UDPPort = binary.BigEndian.Uint16(b[9:])
	p.MTU = binary.BigEndian.Uint16(b[11:])
	p.ORD = binary.BigEndian.Uint16(b[13:])
	p.IRD = binary.BigEndian.Uint16(b[15:])
	p.Private = append([]byte(nil), b[fixedLen:]...)
	if p.QPN < 2 || p.QPN > 0xffffff || p.PSN > 0xffffff || p.UDPPort == 0 || !ValidMTU(int(p.MTU)) || p.ORD == 0 || p.IRD == 0 {
		return p, fmt.Errorf("%w: QPN %#x PSN %#x port %d MTU %d ORD %d IRD %d", ErrFrame, p.QPN, p.PSN, p.UDPPort, p.MTU, p.ORD, p.IRD)
	}
	return p, nil
}

// WriteFrame writes one frame, within writeTimeout.
func WriteFrame(c net.Conn, typ uint8, body []byte) error {
	b := make([]byte, 3+len(body))
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], uint16(len(body)))
	copy(b[3:], body)
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := c.Write(b)
	return err
}

// ReadFrame reads one frame; a body over MaxFrameLen is an error. The
// caller bounds the wait with c's read deadline.
func ReadFrame(c net.Conn) (uint8, []byte, error) {
	var h [3]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(h[1:]))
	if n > MaxFrameLen {
		return 0, nil, fmt.Errorf("%w: %d-byte body", ErrFrame, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return 0, nil, err
	}
	return h[0], b, nil
}
