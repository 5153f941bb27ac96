package roce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
)

// The RoCEv2 packet as this provider sends it: an InfiniBand base
// transport header (BTH), the extended headers its opcode calls for
// (RETH, AETH), the payload padded to four bytes, and the invariant CRC
// (ICRC), all inside one UDP datagram to port 4791. Field layouts follow
// the IBTA's volume 1 and annex A17 as rxe implements them
// (drivers/infiniband/sw/rxe/rxe_hdr.h); docs/protocol.md lists every byte.

// Opcodes of the reliable-connected transport (transport bits 000).
const (
	opSendFirst      = 0x00
	opSendMiddle     = 0x01
	opSendLast       = 0x02
	opSendOnly       = 0x04
	opReadRequest    = 0x0c
	opReadRespFirst  = 0x0d
	opReadRespMiddle = 0x0e
	opReadRespLast   = 0x0f
	opReadRespOnly   = 0x10
	opAck            = 0x11
)

const (
	bthLen  = 12
	rethLen = 16
	aethLen = 4
	icrcLen = 4

	// UDPPort is RoCEv2's registered destination port.
	UDPPort = 4791

	defaultPKey = 0xffff
	psnMask     = 0xffffff
	qpnMask     = 0xffffff
)

// AETH syndromes (bits 7..5 of the syndrome byte) and NAK codes.
const (
	synACK = 0x00
	synRNR = 0x20
	synNAK = 0x60

	nakPSNSeq     = 0
	nakInvalidReq = 1
	nakRemoteAcc  = 2
	nakRemoteOp   = 3

	// creditInvalid is the ACK credit count that says "no credits
	// advertised", as a responder without end-to-end credits sends.
	creditInvalid = 0x1f
)

// packet is one decoded RoCEv2 transport packet. payload aliases the
// datagram it was decoded from.
type packet struct {
	opcode   uint8
	ackReq   bool
	padCount uint8
	pkey     uint16
	destQP   uint32
	psn      uint32

	// RETH, for READ requests.
	va     uint64
	rkey   uint32
	dmaLen uint32

	// AETH, for ACKs and READ responses except the middle ones.
	syndrome uint8
	msn      uint32

	payload []byte
}

func hasRETH(op uint8) bool { return op == opReadRequest }

func hasAETH(op uint8) bool {
	return op == opAck || op == opReadRespFirst || op == opReadRespLast || op == opReadRespOnly
}

func hasPayload(op uint8) bool {
	switch op {
	case opSendFirst, opSendMiddle, opSendLast, opSendOnly,
		opReadRespFirst, opReadRespMiddle, opReadRespLast, opReadRespOnly:
		return true
	}
	return false
}

func knownOpcode(op uint8) bool {
	return hasPayload(op) || op == opReadRequest || op == opAck
}

// headerLen is the length of the BTH and extended headers of op.
func headerLen(op uint8) int {
	n := bthLen
	if hasRETH(op) {
		n += rethLen
	}
	if hasAETH(op) {
		n += aethLen
	}
	return n
}

// Decode errors. Every one means "drop the datagram": a corrupt or
// foreign packet is never answered, as the spec says of ICRC failures.
var (
	errShort   = errors.New("roce: datagram shorter than its headers")
	errOpcode  = errors.New("roce: opcode not of the RC transport this provider speaks")
	errVersion = errors.New("roce: BTH transport version is not 0")
	errPad     = errors.New("roce: pad count on a packet without payload, or longer than the payload")
	errICRC    = errors.New("roce: ICRC mismatch")
	errNotIPv4 = errors.New("roce: only IPv4 addresses are supported")
	errPKey    = errors.New("roce: P_Key outside the default partition")
)

// addrs is what the ICRC covers of the IP and UDP headers that carried
// (or will carry) a packet.
type addrs struct {
	src, dst         netip.Addr
	srcPort, dstPort uint16
	// ipID is the IPv4 header's identification field. It is 0 for what
	// this provider sends and reads on its UDP socket; a receiver on the
	// raw socket (Config.RawICRC) fills in the one on the wire.
	ipID uint16
}

// icrc computes the invariant CRC of a RoCEv2 packet (BTH to the end of
// the padding): CRC-32 (the Ethernet polynomial) over 8 bytes of 0xff
// standing in for the LRH, the IPv4 and UDP headers with their variant
// fields (TOS, TTL, IP checksum, UDP checksum) and the BTH's FECN, BECN
// and reserved byte masked to ones, then the rest of the packet; stored
// little-endian, the bit order the IBTA defines and rxe_icrc.c writes.
//
// A sender on a UDP socket cannot see its IP header, so this assumes the
// one Linux writes for an unconnected datagram with DF set: IHL 5, flags
// DF, ID a.ipID (0 for everything this provider sends). A kernel peer
// (rxe) sets a non-zero ID, which a UDP socket cannot read back; the raw
// receive path (Config.RawICRC) reads it from the header, or
// Config.NoICRCCheck skips the check.
func icrc(a addrs, pkt []byte) uint32 {
	var ph [8 + 20 + 8 + bthLen]byte
	for i := range 8 {
		ph[i] = 0xff
	}
	ip := ph[8:28]
	udpLen := 8 + len(pkt) + icrcLen
	ip[0] = 0x45
	ip[1] = 0xff // TOS, masked
	binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
	binary.BigEndian.PutUint16(ip[4:], a.ipID)
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = 0xff                               // TTL, masked
	ip[9] = 17                                 // UDP
	ip[10], ip[11] = 0xff, 0xff                // checksum, masked
	s, d := a.src.As4(), a.dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	udp := ph[28:36]
	binary.BigEndian.PutUint16(udp[0:], a.srcPort)
	binary.BigEndian.PutUint16(udp[2:], a.dstPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	udp[6], udp[7] = 0xff, 0xff // checksum, masked
	copy(ph[36:], pkt[:bthLen])
	ph[36+4] = 0xff // FECN, BECN, resv6
	c := crc32.Update(0, crc32.IEEETable, ph[:])
	return crc32.Update(c, crc32.IEEETable, pkt[bthLen:])
}

// encode writes p's headers, payload, pad and ICRC into buf and returns
// the datagram. buf must hold headerLen + payload + 3 + icrcLen bytes.
func encode(buf []byte, p *packet, a addrs) []byte {
	pad := (4 - len(p.payload)%4) % 4
	h := headerLen(p.opcode)
	n := h + len(p.payload) + pad + icrcLen
	b := buf[:n]
	b[0] = p.opcode
	b[1] = uint8(pad) << 4 // SE 0, M 0, TVer 0
	binary.BigEndian.PutUint16(b[2:], p.pkey)
	binary.BigEndian.PutUint32(b[4:], p.destQP&qpnMask)
	binary.BigEndian.PutUint32(b[8:], p.psn&psnMask)
	if p.ackReq {
		b[8] |= 0x80
	}
	o := bthLen
	if hasRETH(p.opcode) {
		binary.BigEndian.PutUint64(b[o:], p.va)
		binary.BigEndian.PutUint32(b[o+8:], p.rkey)
		binary.BigEndian.PutUint32(b[o+12:], p.dmaLen)
		o += rethLen
	}
	if hasAETH(p.opcode) {
		binary.BigEndian.PutUint32(b[o:], uint32(p.syndrome)<<24|p.msn&0xffffff)
		o += aethLen
	}
	o += copy(b[o:], p.payload)
	for range pad {
		b[o] = 0
		o++
	}
	binary.LittleEndian.PutUint32(b[o:], icrc(a, b[:o]))
	return b
}

// decode parses a datagram. With check set it verifies the ICRC against
// a, the addresses and ports the datagram came with.
func decode(b []byte, a addrs, check bool) (packet, error) {
	var p packet
	if len(b) < bthLen+icrcLen {
		return p, errShort
	}
	p.opcode = b[0]
	if !knownOpcode(p.opcode) {
		return p, fmt.Errorf("%w: %#02x", errOpcode, p.opcode)
	}
	if b[1]&0x0f != 0 {
		return p, errVersion
	}
	p.padCount = (b[1] >> 4) & 3
	p.pkey = binary.BigEndian.Uint16(b[2:])
	p.destQP = binary.BigEndian.Uint32(b[4:]) & qpnMask
	p.ackReq = b[8]&0x80 != 0
	p.psn = binary.BigEndian.Uint32(b[8:]) & psnMask
	h := headerLen(p.opcode)
	if len(b) < h+icrcLen {
		return p, errShort
	}
	end := len(b) - icrcLen
	if check {
		if got, want := binary.LittleEndian.Uint32(b[end:]), icrc(a, b[:end]); got != want {
			return p, fmt.Errorf("%w: got %#08x, computed %#08x", errICRC, got, want)
		}
	}
	// Every QP of this provider is in the default partition as a full
	// member, so a packet matches when its P_Key names that partition
	// (low 15 bits 0x7fff), full or limited member; rxe_recv.c drops
	// the others the same way, silently.
	if p.pkey&0x7fff != defaultPKey&0x7fff {
		return p, fmt.Errorf("%w: %#04x", errPKey, p.pkey)
	}
	o := bthLen
	if hasRETH(p.opcode) {
		p.va = binary.BigEndian.Uint64(b[o:])
		p.rkey = binary.BigEndian.Uint32(b[o+8:])
		p.dmaLen = binary.BigEndian.Uint32(b[o+12:])
		o += rethLen
	}
	if hasAETH(p.opcode) {
		v := binary.BigEndian.Uint32(b[o:])
		p.syndrome = uint8(v >> 24)
		p.msn = v & 0xffffff
		o += aethLen
	}
	body := b[o:end]
	if !hasPayload(p.opcode) {
		if p.padCount != 0 || len(body) != 0 {
			return p, errPad
		}
		return p, nil
	}
	if int(p.padCount) > len(body) {
		return p, errPad
	}
	p.payload = body[:len(body)-int(p.padCount)]
	return p, nil
}

// psnAdd and psnDiff do 24-bit PSN arithmetic: psnDiff(a, b) is a-b as
// a signed distance, valid while the two are within 2^23 of each other.
func psnAdd(a uint32, n int) uint32 { return (a + uint32(n)) & psnMask }

func psnDiff(a, b uint32) int { return int(int32((a-b)<<8) >> 8) }
