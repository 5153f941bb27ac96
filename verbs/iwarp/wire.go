// Package iwarp is a pure-Go software iWARP provider: RDMAP (RFC 5040)
// over DDP (RFC 5041) over MPA (RFC 5044, with RFC 6581's enhanced
// connection setup) over TCP. It gives any machine the one-sided RDMA
// semantics of an RDMA NIC: a READ is served by the responder's engine
// straight from registered memory, without calling into the application.
//
// Nothing waits on a peer for ever. QP.Close returns within about a
// second whatever the peer does (frozen, gone quiet mid-FPDU, reading
// nothing); MR.Close waits only for copies under way and cuts, failing
// its QP, a transfer still waiting on the network for the region;
// Listener.Close hangs up on handshakes in progress, and setup is held to
// Config.SetupTimeout; a link that goes dark is found by keepalive and
// TCP_USER_TIMEOUT (Config.UserTimeout). A QP's Err says in words why it
// died.
package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// MPA connection setup (RFC 5044 section 7, RFC 6581 section 3).
const (
	keyReq = "MPA ID Req Frame"
	keyRep = "MPA ID Rep Frame"

	mpaFlagMarkers  = 0x80
	mpaFlagCRC      = 0x40
	mpaFlagReject   = 0x20
	mpaFlagEnhanced = 0x10 // RFC 6581: IRD/ORD words lead the private data

	mpaRev2 = 2

	mpaMaxPrivate = 512 // PD_Length limit, the IRD/ORD words included

	// RFC 6581 IRD/ORD words.
	p2pFlag    = 0x8000 // IRD word: peer-to-peer mode
	rtrSend    = 0x4000 // IRD word: zero-length Send as RTR
	rtrWrite   = 0x8000 // ORD word: zero-length RDMA Write as RTR
	rtrRead    = 0x4000 // ORD word: zero-length RDMA Read as RTR
	irdOrdMask = 0x3fff
)

// mpaFrame is an MPA request or reply frame.
type mpaFrame struct {
	reply    bool
	markers  bool
	crc      bool
	reject   bool
	enhanced bool
	rev      uint8
	// Enhanced (v2) fields, valid when enhanced is set.
	ird, ord uint16 // 14-bit values
	p2p      bool
	rtr      uint8 // rtrKind bits
	private  []byte
}

// RTR kinds, as a bit set.
const (
	rtrKindWrite = 1 << iota
	rtrKindRead
	rtrKindSend
)

const mpaHeaderLen = 20 // key, flags, rev, PD_Length

func (f *mpaFrame) marshal() ([]byte, error) {
	pd := len(f.private)
	if f.enhanced {
		pd += 4
	}
	if pd > mpaMaxPrivate {
		return nil, fmt.Errorf("mpa: %d bytes of private data, limit %d", pd, mpaMaxPrivate)
	}
	b := make([]byte, mpaHeaderLen, mpaHeaderLen+pd)
	if f.reply {
		copy(b, keyRep)
	} else {
		copy(b, keyReq)
	}
	var flags byte
	if f.markers {
		flags |= mpaFlagMarkers
	}
	if f.crc {
		flags |= mpaFlagCRC
	}
	if f.reject {
		flags |= mpaFlagReject
	}
	if f.enhanced {
		flags |= mpaFlagEnhanced
	}
	b[16] = flags
	b[17] = f.rev
	binary.BigEndian.PutUint16(b[18:], uint16(pd))
	if f.enhanced {
		ird := f.ird & irdOrdMask
		ord := f.ord & irdOrdMask
		if f.p2p {
			ird |= p2pFlag
			if f.rtr&rtrKindSend != 0 {
				ird |= rtrSend
			}
			if f.rtr&rtrKindWrite != 0 {
				ord |= rtrWrite
			}
			if f.rtr&rtrKindRead != 0 {
				ord |= rtrRead
			}
		}
		b = binary.BigEndian.AppendUint16(b, ird)
		b = binary.BigEndian.AppendUint16(b, ord)
	}
	return append(b, f.private...), nil
}

var errMPA = errors.New("malformed MPA frame")

// parseMPAHeader decodes the fixed 20 bytes and returns PD_Length.
func parseMPAHeader(h []byte, wantReply bool) (mpaFrame, int, error) {
	var f mpaFrame
	if len(h) < mpaHeaderLen {
		return f, 0, fmt.Errorf("%w: short header", errMPA)
	}
	key := keyReq
	if wantReply {
		key = keyRep
	}
	if string(h[:16]) != key {
		return f, 0, fmt.Errorf("%w: key %q, want %q", errMPA, h[:16], key)
	}
	f.reply = wantReply
	flags := h[16]
	f.markers = flags&mpaFlagMarkers != 0
	f.crc = flags&mpaFlagCRC != 0
	f.reject = flags&mpaFlagReject != 0
	f.enhanced = flags&mpaFlagEnhanced != 0
	f.rev = h[17]
	n := int(binary.BigEndian.Uint16(h[18:]))
	if n > mpaMaxPrivate {
		return f, 0, fmt.Errorf("%w: PD_Length %d over %d", errMPA, n, mpaMaxPrivate)
	}
	return f, n, nil
}

// parseMPAPrivate fills in the private data (and v2 words) of f.
func parseMPAPrivate(f *mpaFrame, pd []byte) error {
	if f.enhanced && f.rev >= mpaRev2 {
		if len(pd) < 4 {
			return fmt.Errorf("%w: enhanced frame without IRD/ORD", errMPA)
		}
		ird := binary.BigEndian.Uint16(pd[0:])
		ord := binary.BigEndian.Uint16(pd[2:])
		f.ird = ird & irdOrdMask
		f.ord = ord & irdOrdMask
		f.p2p = ird&p2pFlag != 0
		if f.p2p {
			if ird&rtrSend != 0 {
				f.rtr |= rtrKindSend
			}
			if ord&rtrWrite != 0 {
				f.rtr |= rtrKindWrite
			}
			if ord&rtrRead != 0 {
				f.rtr |= rtrKindRead
			}
		}
		pd = pd[4:]
	} else {
		f.enhanced = false
	}
	f.private = append([]byte(nil), pd...)
	return nil
}

// DDP and RDMAP header fields (RFC 5041 section 4, RFC 5040 section 4).
const (
	ddpTagged = 0x80
	ddpLast   = 0x40
	ddpVer1   = 0x01
	ddpVerMsk = 0x03
	ddpRsvd   = 0x3c

	rdmapVer1   = 0x40 // RV = 01 in the top two bits
	rdmapVerMsk = 0xc0
	rdmapOpMask = 0x0f

	opWrite     = 0x0
	opReadReq   = 0x1
	opReadResp  = 0x2
	opSend      = 0x3
	opSendInv   = 0x4
	opSendSE    = 0x5
	opSendSEInv = 0x6
	opTerm      = 0x7

	qnSend = 0
	qnRead = 1
	qnTerm = 2

	taggedHdrLen   = 14 // DDP ctrl, RDMAP ctrl, STag, TO
	untaggedHdrLen = 18 // DDP ctrl, RDMAP ctrl, reserved/inv STag, QN, MSN, MO
	readReqLen     = 28 // sink STag, sink TO, size, source STag, source TO
	termCtrlLen    = 4

	mpaLenLen = 2
	crcLen    = 4

	// maxPayload keeps every FPDU's ULPDU under the 16-bit length.
	maxPayload = 64512
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// padLen is the pad that makes an FPDU of ulpdu bytes a multiple of 4.
func padLen(ulpdu int) int { return (4 - (mpaLenLen+ulpdu)%4) % 4 }

// fpduLen is the length on the wire of an FPDU carrying ulpdu bytes.
func fpduLen(ulpdu int) int { return mpaLenLen + ulpdu + padLen(ulpdu) + crcLen }

// header is one decoded DDP/RDMAP header.
type header struct {
	tagged bool
	last   bool
	op     uint8
	// Tagged.
	stag uint32
	to   uint64
	// Untagged.
	inv, qn, msn, mo uint32
}

func (h *header) len() int {
	if h.tagged {
		return taggedHdrLen
	}
	return untaggedHdrLen
}

// put writes the MPA length and h into b and returns the bytes used.
func (h *header) put(b []byte, payload int) int {
	n := h.len()
	binary.BigEndian.PutUint16(b, uint16(n+payload))
	c := byte(ddpVer1)
	if h.tagged {
		c |= ddpTagged
	}
	if h.last {
		c |= ddpLast
	}
	b[2] = c
	b[3] = rdmapVer1 | h.op
	if h.tagged {
		binary.BigEndian.PutUint32(b[4:], h.stag)
		binary.BigEndian.PutUint64(b[8:], h.to)
	} else {
		binary.BigEndian.PutUint32(b[4:], h.inv)
		binary.BigEndian.PutUint32(b[8:], h.qn)
		binary.BigEndian.PutUint32(b[12:], h.msn)
		binary.BigEndian.PutUint32(b[16:], h.mo)
	}
	return mpaLenLen + n
}

var errFrame = errors.New("malformed FPDU")

// parseHeader decodes the DDP/RDMAP header at b (after the MPA length).
// ulpdu is the MPA length: the header plus its payload.
func parseHeader(b []byte, ulpdu int) (header, error) {
	var h header
	if len(b) < 2 {
		return h, fmt.Errorf("%w: short header", errFrame)
	}
	c, r := b[0], b[1]
	if c&ddpVerMsk != ddpVer1 {
		if c&ddpTagged == 0 {
			return h, &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTVersion, msg: fmt.Sprintf("DDP version %d", c&ddpVerMsk)}
		}
		return h, &termError{layer: layerDDP, etype: ddpTaggedBuf, code: ddpTVersion, msg: fmt.Sprintf("DDP version %d", c&ddpVerMsk)}
	}
	if r&rdmapVerMsk != rdmapVer1 {
		return h, &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapVersion, msg: fmt.Sprintf("RDMAP version %d", r>>6)}
	}
	h.tagged = c&ddpTagged != 0
	h.last = c&ddpLast != 0
	h.op = r & rdmapOpMask
	if ulpdu < h.len() || len(b) < h.len() {
		return h, fmt.Errorf("%w: ULPDU length %d shorter than its header", errFrame, ulpdu)
	}
	if h.tagged {
		h.stag = binary.BigEndian.Uint32(b[2:])
		h.to = binary.BigEndian.Uint64(b[6:])
		if h.op != opWrite && h.op != opReadResp {
			return h, &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapOpcode, msg: fmt.Sprintf("opcode %d in a tagged segment", h.op)}
		}
	} else {
		h.inv = binary.BigEndian.Uint32(b[2:])
		h.qn = binary.BigEndian.Uint32(b[6:])
		h.msn = binary.BigEndian.Uint32(b[10:])
		h.mo = binary.BigEndian.Uint32(b[14:])
		switch h.op {
		case opSend, opSendSE, opSendInv, opSendSEInv:
			if h.qn != qnSend {
				return h, &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTInvalidQN, msg: fmt.Sprintf("send on QN %d", h.qn)}
			}
		case opReadReq:
			if h.qn != qnRead || !h.last || h.mo != 0 {
				return h, &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTInvalidQN, msg: "read request not a single segment on QN 1"}
			}
		case opTerm:
			if h.qn != qnTerm {
				return h, &termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTInvalidQN, msg: fmt.Sprintf("terminate on QN %d", h.qn)}
			}
		default:
			return h, &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapOpcode, msg: fmt.Sprintf("opcode %d in an untagged segment", h.op)}
		}
	}
	return h, nil
}

// readReq is the body of an RDMA Read Request.
type readReq struct {
	sinkSTag uint32
	sinkTO   uint64
	size     uint32
	srcSTag  uint32
	srcTO    uint64
}

func (r *readReq) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], r.sinkSTag)
	binary.BigEndian.PutUint64(b[4:], r.sinkTO)
	binary.BigEndian.PutUint32(b[12:], r.size)
	binary.BigEndian.PutUint32(b[16:], r.srcSTag)
	binary.BigEndian.PutUint64(b[20:], r.srcTO)
}

func parseReadReq(b []byte) (readReq, error) {
	if len(b) != readReqLen {
		return readReq{}, fmt.Errorf("%w: read request body of %d bytes", errFrame, len(b))
	}
	return readReq{
		sinkSTag: binary.BigEndian.Uint32(b[0:]),
		sinkTO:   binary.BigEndian.Uint64(b[4:]),
		size:     binary.BigEndian.Uint32(b[12:]),
		srcSTag:  binary.BigEndian.Uint32(b[16:]),
		srcTO:    binary.BigEndian.Uint64(b[20:]),
	}, nil
}

// Terminate layers, types and codes (RFC 5040 section 7).
const (
	layerRDMAP = 0
	layerDDP   = 1
	layerLLP   = 2

	rdmapCatastrophic = 0
	rdmapRemoteProt   = 1
	rdmapRemoteOp     = 2

	rdmapInvalidSTag   = 0x00
	rdmapBaseBounds    = 0x01
	rdmapAccessRights  = 0x02
	rdmapSTagNotAssoc  = 0x03
	rdmapTOWrap        = 0x04
	rdmapVersion       = 0x05
	rdmapOpcode        = 0x06
	rdmapCatStream     = 0x07
	rdmapCatGlobal     = 0x08
	rdmapCannotInvalid = 0x09
	rdmapUnspecified   = 0xff

	ddpCatastrophic = 0
	ddpTaggedBuf    = 1
	ddpUntaggedBuf  = 2

	ddpTInvalidSTag  = 0x00
	ddpTBaseBounds   = 0x01
	ddpTSTagNotAssoc = 0x02
	ddpTTOWrap       = 0x03
	ddpTVersion      = 0x04
	ddpUTInvalidQN   = 0x01
	ddpUTNoBuffer    = 0x02
	ddpUTInvalidMSN  = 0x03
	ddpUTInvalidMO   = 0x04
	ddpUTTooLong     = 0x05
	ddpUTVersion     = 0x06

	llpMPA         = 0
	llpStreamLost  = 0x01
	llpBadCRC      = 0x02
	llpFPDUStart   = 0x03
	llpInvalidReq  = 0x04
	llpCatastrophe = 0x05
	llpNoIRD       = 0x06
	llpNoRTR       = 0x07
)

// termError is a protocol error that ends the connection with a
// Terminate message carrying layer, type and code.
type termError struct {
	layer, etype, code uint8
	msg                string
	remote             bool // received from the peer rather than detected here
}

func (e *termError) Error() string {
	who := "local"
	if e.remote {
		who = "peer"
	}
	s := fmt.Sprintf("terminate (%s): %s", who, termName(e.layer, e.etype, e.code))
	if e.msg != "" {
		s += ": " + e.msg
	}
	return s
}

func termName(layer, etype, code uint8) string {
	switch layer {
	case layerRDMAP:
		if etype == rdmapCatastrophic {
			return "RDMAP local catastrophic error"
		}
		kind := map[uint8]string{rdmapCatastrophic: "catastrophic", rdmapRemoteProt: "remote protection", rdmapRemoteOp: "remote operation"}[etype]
		what := map[uint8]string{
			rdmapInvalidSTag: "invalid STag", rdmapBaseBounds: "base or bounds violation",
			rdmapAccessRights: "access rights violation", rdmapSTagNotAssoc: "STag not associated with stream",
			rdmapTOWrap: "tagged offset wrap", rdmapVersion: "invalid RDMAP version", rdmapOpcode: "unexpected opcode",
			rdmapCatStream: "catastrophic error, local to stream", rdmapCatGlobal: "catastrophic error, global",
			rdmapCannotInvalid: "STag cannot be invalidated", rdmapUnspecified: "general error",
		}[code]
		return fmt.Sprintf("RDMAP %s error: %s", kind, orCode(what, code))
	case layerDDP:
		switch etype {
		case ddpTaggedBuf:
			what := map[uint8]string{ddpTInvalidSTag: "invalid STag", ddpTBaseBounds: "base or bounds violation",
				ddpTSTagNotAssoc: "STag not associated with stream", ddpTTOWrap: "tagged offset wrap", ddpTVersion: "invalid DDP version"}[code]
			return "DDP tagged buffer error: " + orCode(what, code)
		case ddpUntaggedBuf:
			what := map[uint8]string{ddpUTInvalidQN: "invalid QN", ddpUTNoBuffer: "no buffer available",
				ddpUTInvalidMSN: "invalid MSN", ddpUTInvalidMO: "invalid MO", ddpUTTooLong: "message too long", ddpUTVersion: "invalid DDP version"}[code]
			return "DDP untagged buffer error: " + orCode(what, code)
		}
		return "DDP catastrophic error"
	case layerLLP:
		what := map[uint8]string{llpStreamLost: "TCP stream lost", llpBadCRC: "received MPA CRC does not match",
			llpFPDUStart: "FPDU start not found", llpInvalidReq: "invalid MPA request or reply",
			llpCatastrophe: "local catastrophic error", llpNoIRD: "insufficient IRD", llpNoRTR: "no matching RTR"}[code]
		return "MPA error: " + orCode(what, code)
	}
	return fmt.Sprintf("layer %d type %d code %d", layer, etype, code)
}

func orCode(s string, code uint8) string {
	if s == "" {
		return fmt.Sprintf("code %#x", code)
	}
	return s
}

func (e *termError) put(b []byte) {
	binary.BigEndian.PutUint32(b, uint32(e.layer&0xf)<<28|uint32(e.etype&0xf)<<24|uint32(e.code)<<16)
}

func parseTerm(b []byte) (*termError, error) {
	if len(b) < termCtrlLen {
		return nil, fmt.Errorf("%w: terminate of %d bytes", errFrame, len(b))
	}
	v := binary.BigEndian.Uint32(b)
	return &termError{layer: uint8(v >> 28), etype: uint8(v>>24) & 0xf, code: uint8(v >> 16), remote: true}, nil
}
