// Package rdmacm is the wire format of the InfiniBand Connection Manager
// as rdma_cm speaks it over RoCE: 256-byte management datagrams (MADs)
// of class 0x07 (CM, class version 2) carrying REQ, MRA, REJ, REP, RTU,
// DREQ and DREP (IBTA volume 1, chapter 12.6), and the 36-byte header
// rdma_cm puts in front of a REQ's private data (the IP addressing annex
// A11: version, IP version, source port, source and destination IP).
//
// Every multi-bit field sits in a big-endian word with its most
// significant bit first, as the IBTA draws them; docs/protocol.md §1c
// lists every byte this package writes. Decoding never panics: a short
// or foreign MAD is an error, and the caller drops it.
package rdmacm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// MAD layout.
const (
	MADLen    = 256 // every MAD on QP1 is 256 bytes
	headerLen = 24  // the common MAD header
	dataLen   = MADLen - headerLen

	baseVersion  = 1
	ClassCM      = 0x07
	ClassVersion = 2
	MethodSend   = 0x03 // CM messages are all unsolicited SENDs
)

// Attr is a CM message's attribute ID.
type Attr uint16

const (
	AttrREQ  Attr = 0x0010
	AttrMRA  Attr = 0x0011
	AttrREJ  Attr = 0x0012
	AttrREP  Attr = 0x0013
	AttrRTU  Attr = 0x0014
	AttrDREQ Attr = 0x0015
	AttrDREP Attr = 0x0016
)

func (a Attr) String() string {
	switch a {
	case AttrREQ:
		return "REQ"
	case AttrMRA:
		return "MRA"
	case AttrREJ:
		return "REJ"
	case AttrREP:
		return "REP"
	case AttrRTU:
		return "RTU"
	case AttrDREQ:
		return "DREQ"
	case AttrDREP:
		return "DREP"
	}
	return fmt.Sprintf("attribute %#04x", uint16(a))
}

// Sizes of the private data areas: fixed, zero-padded on the wire.
const (
	PrivateREQ  = 92
	PrivateMRA  = 222
	PrivateREJ  = 148
	PrivateREP  = 196
	PrivateRTU  = 224
	PrivateDREQ = 220
	PrivateDREP = 224
	rejInfoLen  = 72
)

// Decode errors.
var (
	ErrShort   = errors.New("rdmacm: MAD shorter than 256 bytes")
	ErrClass   = errors.New("rdmacm: not a CM MAD (base version 1, class 0x07, class version 2, method SEND)")
	ErrAttr    = errors.New("rdmacm: unknown CM attribute")
	ErrPrivate = errors.New("rdmacm: private data longer than its area")
	ErrIPHdr   = errors.New("rdmacm: bad rdma_cm IP header")
)

// Message is one CM message body.
type Message interface {
	Attr() Attr
	put(b []byte) error // b: the 232 data bytes, zeroed
}

// Encode writes the MAD of m with transaction ID tid.
func Encode(tid uint64, m Message) ([]byte, error) {
	b := make([]byte, MADLen)
	b[0] = baseVersion
	b[1] = ClassCM
	b[2] = ClassVersion
	b[3] = MethodSend
	// status, class specific: 0
	binary.BigEndian.PutUint64(b[8:], tid)
	binary.BigEndian.PutUint16(b[16:], uint16(m.Attr()))
	// reserved, attribute modifier: 0
	if err := m.put(b[headerLen:]); err != nil {
		return nil, err
	}
	return b, nil
}

// Decode parses a CM MAD; it returns the transaction ID and the message
// (a *REQ, *MRA, *REJ, *REP, *RTU, *DREQ or *DREP).
func Decode(b []byte) (tid uint64, m Message, err error) {
	if len(b) < MADLen {
		return 0, nil, ErrShort
	}
	if b[0] != baseVersion || b[1] != ClassCM || b[2] != ClassVersion || b[3] != MethodSend {
		return 0, nil, fmt.Errorf("%w: % x", ErrClass, b[:4])
	}
	tid = binary.BigEndian.Uint64(b[8:])
	d := b[headerLen:MADLen]
	switch a := Attr(binary.BigEndian.Uint16(b[16:])); a {
	case AttrREQ:
		m = getREQ(d)
	case AttrMRA:
		m = &MRA{LocalCommID: be32(d[0:]), RemoteCommID: be32(d[4:]), Messaged: d[8] >> 6,
			ServiceTimeout: d[9] >> 3, Private: clone(d[10 : 10+PrivateMRA])}
	case AttrREJ:
		m = &REJ{LocalCommID: be32(d[0:]), RemoteCommID: be32(d[4:]), Rejected: d[8] >> 6,
			InfoLen: d[9] >> 1, Reason: binary.BigEndian.Uint16(d[10:]),
			Info: clone(d[12 : 12+rejInfoLen]), Private: clone(d[84 : 84+PrivateREJ])}
	case AttrREP:
		m = getREP(d)
	case AttrRTU:
		m = &RTU{LocalCommID: be32(d[0:]), RemoteCommID: be32(d[4:]), Private: clone(d[8 : 8+PrivateRTU])}
	case AttrDREQ:
		m = &DREQ{LocalCommID: be32(d[0:]), RemoteCommID: be32(d[4:]), RemoteQPN: be32(d[8:]) >> 8,
			Private: clone(d[12 : 12+PrivateDREQ])}
	case AttrDREP:
		m = &DREP{LocalCommID: be32(d[0:]), RemoteCommID: be32(d[4:]), Private: clone(d[8 : 8+PrivateDREP])}
	default:
		return tid, nil, fmt.Errorf("%w: %v", ErrAttr, a)
	}
	return tid, m, nil
}

func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

func clone(b []byte) []byte { return append([]byte(nil), b...) }

func putPrivate(dst, p []byte) error {
	if len(p) > len(dst) {
		return fmt.Errorf("%w: %d bytes, area %d", ErrPrivate, len(p), len(dst))
	}
	copy(dst, p)
	return nil
}

func bit(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// Path is a REQ's primary path. For RoCE the LIDs are 0 (the permissive
// LID is not used), the GIDs are IPv4-mapped IPv6 addresses, and traffic
// class and hop limit go into the IP header (TOS, TTL).
type Path struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID [16]byte
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits: 4.096 µs × 2^n
}

// REQ is a connection request (IBTA 12.6.5). The alternate path is not
// supported: it is written as zeros and ignored when read.
type REQ struct {
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8  // READs the sender serves at once (its IRD)
	InitiatorDepth          uint8  // READs the sender issues at once (its ORD)
	LocalEECN, RemoteEECN   uint32 // 24 bits; 0 for RC
	RemoteCMResponseTimeout uint8  // 5 bits: how long the sender waits for a REP
	TransportType           uint8  // 2 bits: 0 RC, 1 UC, 3 XRC with the extended type
	FlowControl             bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits: how long the sender takes to answer
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 uint8 // 4 bits: 1 = 256 ... 5 = 4096
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtTransportType        uint8 // 3 bits
	Primary                 Path
	Private                 []byte // up to PrivateREQ bytes
}

func (*REQ) Attr() Attr { return AttrREQ }

func (m *REQ) put(d []byte) error {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint64(d[8:], m.ServiceID)
	binary.BigEndian.PutUint64(d[16:], m.LocalCAGUID)
	binary.BigEndian.PutUint32(d[28:], m.LocalQKey)
	binary.BigEndian.PutUint32(d[32:], m.LocalQPN<<8|uint32(m.ResponderResources))
	binary.BigEndian.PutUint32(d[36:], m.LocalEECN<<8|uint32(m.InitiatorDepth))
	binary.BigEndian.PutUint32(d[40:], m.RemoteEECN<<8|uint32(m.RemoteCMResponseTimeout&0x1f)<<3|uint32(m.TransportType&3)<<1|uint32(bit(m.FlowControl)))
	binary.BigEndian.PutUint32(d[44:], m.StartingPSN<<8|uint32(m.LocalCMResponseTimeout&0x1f)<<3|uint32(m.RetryCount&7))
	binary.BigEndian.PutUint16(d[48:], m.PKey)
	d[50] = (m.PathMTU&0xf)<<4 | bit(m.RDCExists)<<3 | m.RNRRetryCount&7
	d[51] = (m.MaxCMRetries&0xf)<<4 | bit(m.SRQ)<<3 | m.ExtTransportType&7
	p := &m.Primary
	binary.BigEndian.PutUint16(d[52:], p.LocalLID)
	binary.BigEndian.PutUint16(d[54:], p.RemoteLID)
	copy(d[56:72], p.LocalGID[:])
	copy(d[72:88], p.RemoteGID[:])
	binary.BigEndian.PutUint32(d[88:], (p.FlowLabel&0xfffff)<<12|uint32(p.PacketRate&0x3f))
	d[92] = p.TrafficClass
	d[93] = p.HopLimit
	d[94] = (p.SL&0xf)<<4 | bit(p.SubnetLocal)<<3
	d[95] = (p.LocalACKTimeout & 0x1f) << 3
	// 96..139: the alternate path, zeros.
	return putPrivate(d[140:140+PrivateREQ], m.Private)
}

func getREQ(d []byte) *REQ {
	m := &REQ{
		LocalCommID: be32(d[0:]), ServiceID: binary.BigEndian.Uint64(d[8:]), LocalCAGUID: binary.BigEndian.Uint64(d[16:]),
		LocalQKey: be32(d[28:]),
		LocalQPN:  be32(d[32:]) >> 8, ResponderResources: d[35],
		LocalEECN: be32(d[36:]) >> 8, InitiatorDepth: d[39],
		RemoteEECN: be32(d[40:]) >> 8, RemoteCMResponseTimeout: d[43] >> 3, TransportType: d[43] >> 1 & 3, FlowControl: d[43]&1 != 0,
		StartingPSN: be32(d[44:]) >> 8, LocalCMResponseTimeout: d[47] >> 3, RetryCount: d[47] & 7,
		PKey:    binary.BigEndian.Uint16(d[48:]),
		PathMTU: d[50] >> 4, RDCExists: d[50]&8 != 0, RNRRetryCount: d[50] & 7,
		MaxCMRetries: d[51] >> 4, SRQ: d[51]&8 != 0, ExtTransportType: d[51] & 7,
		Private: clone(d[140 : 140+PrivateREQ]),
	}
	p := &m.Primary
	p.LocalLID = binary.BigEndian.Uint16(d[52:])
	p.RemoteLID = binary.BigEndian.Uint16(d[54:])
	copy(p.LocalGID[:], d[56:72])
	copy(p.RemoteGID[:], d[72:88])
	p.FlowLabel = be32(d[88:]) >> 12
	p.PacketRate = d[91] & 0x3f
	p.TrafficClass, p.HopLimit = d[92], d[93]
	p.SL, p.SubnetLocal = d[94]>>4, d[94]&8 != 0
	p.LocalACKTimeout = d[95] >> 3
	return m
}

// REP is a connection reply (IBTA 12.6.8).
type REP struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32 // 24 bits
	LocalEECN                 uint32 // 24 bits
	StartingPSN               uint32 // 24 bits
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8 // 5 bits
	FailoverAccepted          uint8 // 2 bits
	FlowControl               bool
	RNRRetryCount             uint8 // 3 bits
	SRQ                       bool
	LocalCAGUID               uint64
	Private                   []byte // up to PrivateREP bytes
}

func (*REP) Attr() Attr { return AttrREP }

func (m *REP) put(d []byte) error {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], m.LocalQKey)
	binary.BigEndian.PutUint32(d[12:], m.LocalQPN<<8)
	binary.BigEndian.PutUint32(d[16:], m.LocalEECN<<8)
	binary.BigEndian.PutUint32(d[20:], m.StartingPSN<<8)
	d[24] = m.ResponderResources
	d[25] = m.InitiatorDepth
	d[26] = (m.TargetACKDelay&0x1f)<<3 | (m.FailoverAccepted&3)<<1 | bit(m.FlowControl)
	d[27] = (m.RNRRetryCount&7)<<5 | bit(m.SRQ)<<4
	binary.BigEndian.PutUint64(d[28:], m.LocalCAGUID)
	return putPrivate(d[36:36+PrivateREP], m.Private)
}

func getREP(d []byte) *REP {
	return &REP{
		LocalCommID: be32(d[0:]), RemoteCommID: be32(d[4:]), LocalQKey: be32(d[8:]),
		LocalQPN: be32(d[12:]) >> 8, LocalEECN: be32(d[16:]) >> 8, StartingPSN: be32(d[20:]) >> 8,
		ResponderResources: d[24], InitiatorDepth: d[25],
		TargetACKDelay: d[26] >> 3, FailoverAccepted: d[26] >> 1 & 3, FlowControl: d[26]&1 != 0,
		RNRRetryCount: d[27] >> 5, SRQ: d[27]&0x10 != 0,
		LocalCAGUID: binary.BigEndian.Uint64(d[28:]),
		Private:     clone(d[36 : 36+PrivateREP]),
	}
}

// RTU says "ready to use" (IBTA 12.6.9).
type RTU struct {
	LocalCommID, RemoteCommID uint32
	Private                   []byte
}

func (*RTU) Attr() Attr { return AttrRTU }

func (m *RTU) put(d []byte) error {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	return putPrivate(d[8:8+PrivateRTU], m.Private)
}

// MRA asks the peer to wait longer (IBTA 12.6.6).
type MRA struct {
	LocalCommID, RemoteCommID uint32
	Messaged                  uint8 // 2 bits: 0 the REQ, 1 the REP, 2 a LAP
	ServiceTimeout            uint8 // 5 bits: 4.096 µs × 2^n
	Private                   []byte
}

func (*MRA) Attr() Attr { return AttrMRA }

func (m *MRA) put(d []byte) error {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	d[8] = (m.Messaged & 3) << 6
	d[9] = (m.ServiceTimeout & 0x1f) << 3
	return putPrivate(d[10:10+PrivateMRA], m.Private)
}

// REJ refuses a REQ or REP (IBTA 12.6.7).
type REJ struct {
	LocalCommID, RemoteCommID uint32
	Rejected                  uint8 // 2 bits: 0 the REQ, 1 the REP, 2 none (a timeout)
	InfoLen                   uint8 // 7 bits: bytes of Info that mean something
	Reason                    uint16
	Info                      []byte // up to 72 bytes of additional reject information
	Private                   []byte
}

func (*REJ) Attr() Attr { return AttrREJ }

func (m *REJ) put(d []byte) error {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	d[8] = (m.Rejected & 3) << 6
	d[9] = (m.InfoLen & 0x7f) << 1
	binary.BigEndian.PutUint16(d[10:], m.Reason)
	if err := putPrivate(d[12:12+rejInfoLen], m.Info); err != nil {
		return err
	}
	return putPrivate(d[84:84+PrivateREJ], m.Private)
}

// DREQ asks to disconnect (IBTA 12.6.10).
type DREQ struct {
	LocalCommID, RemoteCommID uint32
	RemoteQPN                 uint32 // 24 bits: the receiver's QP
	Private                   []byte
}

func (*DREQ) Attr() Attr { return AttrDREQ }

func (m *DREQ) put(d []byte) error {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], m.RemoteQPN<<8)
	return putPrivate(d[12:12+PrivateDREQ], m.Private)
}

// DREP answers a DREQ (IBTA 12.6.11).
type DREP struct {
	LocalCommID, RemoteCommID uint32
	Private                   []byte
}

func (*DREP) Attr() Attr { return AttrDREP }

func (m *DREP) put(d []byte) error {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	return putPrivate(d[8:8+PrivateDREP], m.Private)
}

// Timeout converts a CM timeout field, 4.096 µs × 2^t, to a duration.
func Timeout(t uint8) time.Duration {
	return time.Duration(4096<<min(t&0x1f, 31)) * time.Nanosecond
}

// MTUCode is the IB encoding of a path MTU in bytes (1 = 256 ... 5 = 4096);
// 0 for a size that has none.
func MTUCode(n int) uint8 {
	for c, s := uint8(1), 256; c <= 5; c, s = c+1, s*2 {
		if n == s {
			return c
		}
	}
	return 0
}

// MTUBytes is the inverse of MTUCode; 0 for a code that names no MTU.
func MTUBytes(c uint8) int {
	if c < 1 || c > 5 {
		return 0
	}
	return 128 << c
}

// Reject reasons (IBTA table 112) that a peer's REJ may carry.
var reasons = map[uint16]string{
	1: "no QP available", 2: "no EE context available", 3: "no resources available",
	4: "timeout", 5: "unsupported request", 6: "invalid communication ID",
	7: "invalid communication instance", 8: "invalid service ID (nobody listens on that port)",
	9: "invalid transport service type", 10: "stale connection", 11: "RDC does not exist",
	12: "invalid primary GID", 13: "invalid primary LID", 14: "invalid primary SL",
	15: "invalid primary traffic class", 16: "invalid primary hop limit", 17: "invalid primary packet rate",
	18: "invalid alternate GID", 19: "invalid alternate LID", 20: "invalid alternate SL",
	21: "invalid alternate traffic class", 22: "invalid alternate hop limit", 23: "invalid alternate packet rate",
	24: "port and CM redirection", 25: "port redirection", 26: "invalid path MTU",
	27: "insufficient responder resources", 28: "consumer reject", 29: "RNR retry count reject",
	30: "duplicate local communication ID", 31: "unsupported class version",
	32: "invalid primary flow label", 33: "invalid alternate flow label",
}

// Reject reasons this end sends or acts on.
const (
	ReasonNoResources      = 3
	ReasonTimeout          = 4 // the sender waited too long
	ReasonUnsupported      = 5
	ReasonInvalidServiceID = 8 // nobody listens on that port
	ReasonInvalidTransport = 9
	ReasonInvalidMTU       = 26
	ReasonConsumer         = 28 // the peer's application refused
)

// ReasonName names an IB CM reject reason.
func ReasonName(r uint16) string {
	if s, ok := reasons[r]; ok {
		return fmt.Sprintf("%s (reason %d)", s, r)
	}
	return fmt.Sprintf("reason %d", r)
}
