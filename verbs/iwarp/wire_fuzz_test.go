package iwarp

// Fuzz targets for every decoder of network bytes in this package.
//
//	go test ./verbs/iwarp -run '^$' -fuzz '^FuzzMPA$'    -fuzztime 15s
//	go test ./verbs/iwarp -run '^$' -fuzz '^FuzzHeader$' -fuzztime 15s
//	go test ./verbs/iwarp -run '^$' -fuzz '^FuzzReadReq$' -fuzztime 15s
//	go test ./verbs/iwarp -run '^$' -fuzz '^FuzzTerm$'   -fuzztime 15s
//	go test ./verbs/iwarp -run '^$' -fuzz '^FuzzStream$' -fuzztime 15s
//
// Without -fuzz, `go test` runs the seed corpora as ordinary tests.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/verbs"
)

// fzFPDU builds one FPDU with the package's own encoder.
func fzFPDU(crc bool, h header, body, payload []byte) []byte {
	f := &fpdus{crc: crc}
	f.add(&h, body, payload)
	var out []byte
	for _, b := range f.bufs {
		out = append(out, b...)
	}
	return out
}

// fzCRCOrder is the byte order this package writes the MPA CRC in,
// learnt from its own encoder, so that the harness below follows the
// provider whichever order it uses (see TestMPACRCByteOrder).
var fzCRCOrder = func() binary.ByteOrder {
	fp := fzFPDU(true, header{last: true, op: opSend, qn: qnSend, msn: 1}, nil, []byte("x"))
	if binary.LittleEndian.Uint32(fp[len(fp)-crcLen:]) == crc32.Checksum(fp[:len(fp)-crcLen], castagnoli) {
		return binary.LittleEndian
	}
	return binary.BigEndian
}()

func fzReadReqFPDU(crc bool, msn uint32, rr readReq) []byte {
	var body [readReqLen]byte
	rr.put(body[:])
	return fzFPDU(crc, header{last: true, op: opReadReq, qn: qnRead, msn: msn}, body[:], nil)
}

func fzTermFPDU(crc bool, te *termError) []byte {
	var body [termCtrlLen]byte
	te.put(body[:])
	return fzFPDU(crc, header{last: true, op: opTerm, qn: qnTerm, msn: 1}, body[:], nil)
}

func fzSendFPDU(crc bool, msn, mo uint32, last bool, payload []byte) []byte {
	return fzFPDU(crc, header{last: last, op: opSend, qn: qnSend, msn: msn, mo: mo}, nil, payload)
}

func fzCat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func fzPattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 12345
	for i := range b {
		x = x*1103515245 + 12345
		b[i] = byte(x >> 16)
	}
	return b
}

// ---- FuzzMPA ----

func FuzzMPA(f *testing.F) {
	frames := []mpaFrame{
		{crc: true, enhanced: true, rev: mpaRev2, ird: 128, ord: 8, p2p: true, rtr: rtrKindWrite | rtrKindRead, private: []byte("cli")},
		{reply: true, crc: true, enhanced: true, rev: mpaRev2, ird: 8, ord: 128, p2p: true, rtr: rtrKindWrite, private: []byte("srv")},
		{reply: true, crc: true, enhanced: true, rev: mpaRev2, ird: 1, ord: 1, p2p: true, rtr: rtrKindRead},
		{enhanced: true, rev: mpaRev2, ird: irdOrdMask, ord: irdOrdMask, p2p: true, rtr: rtrKindSend | rtrKindWrite | rtrKindRead},
		{rev: 1, crc: true},
		{reply: true, rev: 1, reject: true, private: []byte("no thanks")},
		{reply: true, rev: mpaRev2, enhanced: true, reject: true},
		{markers: true, rev: 1},
		{enhanced: true, rev: mpaRev2, private: make([]byte, mpaMaxPrivate-4)},
	}
	for _, fr := range frames {
		b, err := fr.marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, fr.reply)
		f.Add(b[:len(b)-1], fr.reply) // truncated
		f.Add(b, !fr.reply)           // wrong key
	}
	f.Add([]byte("MPA ID Req Frame\x10\x02\x00\x02\x80"), false) // enhanced, PD too short for IRD/ORD
	f.Add([]byte("MPA ID Rep Frame\x40\x01\x02\x01"), true)      // PD_Length over 512
	f.Add([]byte("MPA ID Req Frame\x1f\x03\x00\x04\xff\xff\xff\xff"), false)
	f.Add([]byte{}, false)

	f.Fuzz(func(t *testing.T, b []byte, reply bool) {
		fr, n, err := parseMPAHeader(b, reply)
		if err != nil {
			if !errors.Is(err, errMPA) {
				t.Fatalf("header error %v does not wrap errMPA", err)
			}
			return
		}
		if n < 0 || n > mpaMaxPrivate {
			t.Fatalf("PD_Length %d accepted", n)
		}
		if fr.reply != reply {
			t.Fatalf("reply %v, parsed with key for reply=%v", fr.reply, reply)
		}
		if len(b) < mpaHeaderLen+n {
			return // readMPA would wait for the rest
		}
		if err := parseMPAPrivate(&fr, b[mpaHeaderLen:mpaHeaderLen+n]); err != nil {
			if !errors.Is(err, errMPA) {
				t.Fatalf("private data error %v does not wrap errMPA", err)
			}
			if !fr.enhanced || n >= 4 {
				t.Fatalf("private data of %d bytes refused (enhanced %v): %v", n, fr.enhanced, err)
			}
			return
		}
		if fr.enhanced && fr.rev < mpaRev2 {
			t.Fatalf("enhanced frame of rev %d kept enhanced", fr.rev)
		}
		if fr.ird > irdOrdMask || fr.ord > irdOrdMask {
			t.Fatalf("IRD/ORD %d/%d over 14 bits", fr.ird, fr.ord)
		}
		if fr.rtr != 0 && !fr.p2p {
			t.Fatalf("RTR bits %#x without P2P", fr.rtr)
		}
		want := n
		if fr.enhanced {
			want -= 4
		}
		if len(fr.private) != want {
			t.Fatalf("%d bytes of private data, PD_Length %d", len(fr.private), n)
		}
		out, err := fr.marshal()
		if err != nil {
			t.Fatalf("re-marshal of a parsed frame: %v", err)
		}
		if len(out) != mpaHeaderLen+n {
			t.Fatalf("re-marshalled frame is %d bytes, original %d", len(out), mpaHeaderLen+n)
		}
		if !bytes.Equal(out[:16], b[:16]) || out[17] != b[17] || !bytes.Equal(out[18:20], b[18:20]) {
			t.Fatalf("re-marshalled header %x, original %x", out[:20], b[:20])
		}
		if fr.enhanced == (b[16]&mpaFlagEnhanced != 0) && out[16] != b[16]&0xf0 {
			t.Fatalf("flags %#x re-marshalled as %#x", b[16], out[16])
		}
		fr2, n2, err := parseMPAHeader(out, reply)
		if err != nil || n2 != n {
			t.Fatalf("re-parse header: n %d/%d, %v", n2, n, err)
		}
		if err := parseMPAPrivate(&fr2, out[mpaHeaderLen:]); err != nil {
			t.Fatalf("re-parse private data: %v", err)
		}
		if fmt.Sprintf("%+v", fr) != fmt.Sprintf("%+v", fr2) {
			t.Fatalf("round trip differs:\n %+v\n %+v", fr, fr2)
		}
	})
}

// ---- FuzzHeader ----

func FuzzHeader(f *testing.F) {
	var rr [readReqLen]byte
	(&readReq{sinkSTag: 1, sinkTO: 2, size: 3, srcSTag: 4, srcTO: 5}).put(rr[:])
	var tb [termCtrlLen]byte
	(&termError{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTNoBuffer}).put(tb[:])
	for _, fp := range [][]byte{
		fzFPDU(true, header{tagged: true, last: true, op: opWrite, stag: 0xdeadbeef, to: 0x1122334455667788}, nil, []byte("data")),
		fzFPDU(true, header{tagged: true, last: false, op: opReadResp, stag: 7, to: 9}, nil, make([]byte, 100)),
		fzFPDU(false, header{last: true, op: opSend, qn: qnSend, msn: 1}, nil, []byte("hello")),
		fzFPDU(false, header{last: false, op: opSendSE, qn: qnSend, msn: 3, mo: 64}, nil, nil),
		fzFPDU(false, header{last: true, op: opSendInv, qn: qnSend, msn: 3, inv: 0x55}, nil, nil),
		fzFPDU(false, header{last: true, op: opReadReq, qn: qnRead, msn: 1}, rr[:], nil),
		fzFPDU(false, header{last: true, op: opTerm, qn: qnTerm, msn: 1}, tb[:], nil),
		fzFPDU(false, header{last: true, op: opReadReq, qn: qnSend, msn: 1}, rr[:], nil), // wrong QN
		fzFPDU(false, header{tagged: true, last: true, op: opSend}, nil, nil),            // tagged send
		fzFPDU(false, header{last: true, op: 0xb, qn: qnSend}, nil, nil),                 // unknown opcode
	} {
		ulpdu := int(binary.BigEndian.Uint16(fp))
		f.Add(fp[mpaLenLen:], uint16(ulpdu))
		f.Add(fp[mpaLenLen:mpaLenLen+6], uint16(ulpdu)) // short
	}
	f.Add([]byte{0x42, 0x43}, uint16(18)) // bad DDP version
	f.Add([]byte{0x41, 0x83}, uint16(18)) // bad RDMAP version
	f.Add([]byte{}, uint16(0))

	f.Fuzz(func(t *testing.T, b []byte, ulpdu uint16) {
		h, err := parseHeader(b, int(ulpdu))
		if err != nil {
			var te *termError
			if !errors.As(err, &te) && !errors.Is(err, errFrame) {
				t.Fatalf("error %T %v is neither a termError nor errFrame", err, err)
			}
			if te != nil {
				_ = te.Error()
				if te.remote {
					t.Fatalf("locally detected error marked remote: %v", te)
				}
			}
			return
		}
		if h.len() > len(b) || h.len() > int(ulpdu) {
			t.Fatalf("header of %d bytes accepted from %d bytes, ULPDU %d", h.len(), len(b), ulpdu)
		}
		if h.tagged && h.op != opWrite && h.op != opReadResp {
			t.Fatalf("tagged opcode %d accepted", h.op)
		}
		if !h.tagged {
			switch h.op {
			case opSend, opSendSE, opSendInv, opSendSEInv:
				if h.qn != qnSend {
					t.Fatalf("send on QN %d accepted", h.qn)
				}
			case opReadReq:
				if h.qn != qnRead || !h.last || h.mo != 0 {
					t.Fatalf("bad read request accepted: %+v", h)
				}
			case opTerm:
				if h.qn != qnTerm {
					t.Fatalf("terminate on QN %d accepted", h.qn)
				}
			default:
				t.Fatalf("untagged opcode %d accepted", h.op)
			}
		}
		// Re-encode and re-parse: the fields must survive.
		buf := make([]byte, mpaLenLen+untaggedHdrLen)
		n := h.put(buf, int(ulpdu)-h.len())
		if n != mpaLenLen+h.len() {
			t.Fatalf("put wrote %d bytes for a %d-byte header", n, h.len())
		}
		if got := int(binary.BigEndian.Uint16(buf)); got != int(ulpdu) {
			t.Fatalf("re-encoded ULPDU length %d, want %d", got, ulpdu)
		}
		h2, err := parseHeader(buf[mpaLenLen:n], int(ulpdu))
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if h != h2 {
			t.Fatalf("round trip differs:\n %+v\n %+v", h, h2)
		}
		// Only the reserved bits may differ from the original.
		if b[0]&^ddpRsvd != buf[2] || b[1]&^0x30 != buf[3] || !bytes.Equal(b[2:h.len()], buf[4:n]) {
			t.Fatalf("re-encoded %x, original %x", buf[2:n], b[:h.len()])
		}
	})
}

// ---- FuzzReadReq ----

func FuzzReadReq(f *testing.F) {
	for _, rr := range []readReq{
		{},
		{sinkSTag: 0x12345678, sinkTO: 0x7fff00001000, size: 1 << 20, srcSTag: 0x9abcdef0, srcTO: 0x7fff00002000},
		{sinkSTag: ^uint32(0), sinkTO: ^uint64(0), size: ^uint32(0), srcSTag: ^uint32(0), srcTO: ^uint64(0)},
	} {
		var b [readReqLen]byte
		rr.put(b[:])
		f.Add(b[:])
		f.Add(b[:readReqLen-1])
		f.Add(append(b[:], 0))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rr, err := parseReadReq(b)
		if err != nil {
			if len(b) == readReqLen {
				t.Fatalf("refused a %d-byte body: %v", len(b), err)
			}
			if !errors.Is(err, errFrame) {
				t.Fatalf("error %v does not wrap errFrame", err)
			}
			return
		}
		if len(b) != readReqLen {
			t.Fatalf("accepted a %d-byte body", len(b))
		}
		var out [readReqLen]byte
		rr.put(out[:])
		if !bytes.Equal(out[:], b) {
			t.Fatalf("round trip %x, original %x", out, b)
		}
	})
}

// ---- FuzzTerm ----

func FuzzTerm(f *testing.F) {
	for _, te := range []termError{
		{layer: layerRDMAP, etype: rdmapRemoteProt, code: rdmapInvalidSTag},
		{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapCatStream},
		{layer: layerDDP, etype: ddpTaggedBuf, code: ddpTBaseBounds},
		{layer: layerDDP, etype: ddpUntaggedBuf, code: ddpUTTooLong},
		{layer: layerLLP, etype: llpMPA, code: llpBadCRC},
		{layer: 0xf, etype: 0xf, code: 0xff},
	} {
		var b [termCtrlLen]byte
		te.put(b[:])
		f.Add(b[:])
		f.Add(append(b[:], 0xe0, 0, 0, 0)) // HdrCt bits and more
		f.Add(b[:3])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		te, err := parseTerm(b)
		if err != nil {
			if len(b) >= termCtrlLen {
				t.Fatalf("refused a %d-byte terminate: %v", len(b), err)
			}
			return
		}
		if !te.remote {
			t.Fatal("parsed terminate not marked remote")
		}
		if te.layer > 0xf || te.etype > 0xf {
			t.Fatalf("layer %d etype %d over 4 bits", te.layer, te.etype)
		}
		_ = te.Error()
		_ = termStatus(te)
		var out [termCtrlLen]byte
		te.put(out[:])
		// Layer, EType and Error Code survive; HdrCt and the reserved
		// bits are not kept (this provider never sends headers back).
		if !bytes.Equal(out[:2], b[:2]) || out[2] != 0 || out[3] != 0 {
			t.Fatalf("round trip %x, original %x", out, b[:4])
		}
	})
}

// ---- FuzzStream ----
//
// The QP under test is the passive side of a real connection: this test
// dials the package's listener over loopback TCP, does the MPA exchange by
// hand with mpaFrame, and then writes the fuzzer's bytes as if they were
// the peer's FPDUs, while reading back everything the QP sends.
//
// Input layout: data[0] is a mode byte, data[1] the IRD/ORD this side
// offers, and the rest is the stream. Because STags are random and TOs
// are virtual addresses, the stream names them with tokens that are
// replaced before sending:
//
//	A5 A5 A5 0k             the STag of region k
//	5A 5A 5A 0k d d d d     the TO of region k's first byte plus int32(dddd)
//
// Regions: 1 remote-read MR, 2 remote-write MR, 3 local-only MR (the
// receives and the sinks of the QP's own READs), 4 a memory window bound
// to the QP (remote read+write), 5 the MR under the window (no remote
// rights of its own). All of it lies in one mapping whose other bytes are
// a guard pattern.
//
// Checks: no panic; the QP ends within a bound once the stream is over;
// every FPDU the QP sends is well formed (with a good CRC when CRC is on);
// every Read Response answers a Read Request the QP accepted, at the
// request's sink, and serves it only from memory the request's STag may
// read (for region 1 the bytes must equal the region's); no byte outside
// the regions peers may write ever changes.

const (
	fzModeCRC    = 1 << 0 // ask for CRC
	fzModeFixCRC = 1 << 1 // recompute every FPDU's CRC after token substitution
	fzModeP2P    = 1 << 2 // ask for peer-to-peer mode
	fzModeRTRRd  = 1 << 3 // with P2P, offer only the READ RTR (else only WRITE)
	fzModeV1     = 1 << 4 // MPA revision 1, no enhanced words
)

// Layout of the guarded mapping.
const (
	fzMemLen = 40 << 10

	fzRdOff, fzRdLen   = 4096, 3000
	fzWrOff, fzWrLen   = 12288, 2000
	fzRcvOff, fzRcvLen = 20480, 1000
	fzMwmOff, fzMwmLen = 28672, 2000
	fzWinOff, fzWinLen = fzMwmOff + 500, 1000 // the window, inside the MW's MR

	// Inside region 3: two receives and the sinks of the QP's two READs,
	// as offsets from the region's start.
	fzRecv1Off, fzRecv1Len = 100, 200
	fzRecv2Off, fzRecv2Len = 400, 64
	fzSink1Off, fzSink1Len = 600, 100
	fzSink2Off, fzSink2Len = 800, 50

	fzGuard = 0xa7
)

type fzEnv struct {
	dev    verbs.Device
	pd     verbs.PD
	scq    verbs.CQ
	rcq    verbs.CQ
	ln     verbs.Listener
	buf    *verbs.Buffer
	mem    []byte
	golden []byte
	rd     verbs.MR
	wr     verbs.MR
	rcv    verbs.MR
	mwm    verbs.MR
}

var (
	fzOnce   sync.Once
	fzShared *fzEnv
	fzErr    error
)

// fzSetup makes the device, listener and memory once per process; fuzz
// iterations share them and each makes its own connection and window.
func fzSetup() (*fzEnv, error) {
	fzOnce.Do(func() {
		e := &fzEnv{}
		ctx := context.Background()
		p := New(Config{CRC: CRCOff, SetupTimeout: 2 * time.Second, MaxReads: 16})
		var err error
		if e.dev, err = p.Open(ctx, verbs.DeviceConfig{}); err != nil {
			fzErr = err
			return
		}
		e.pd, _ = e.dev.AllocPD()
		e.scq, _ = e.dev.CreateCQ(1 << 16)
		e.rcq, _ = e.dev.CreateCQ(1 << 16)
		if e.ln, err = e.dev.Listen(ctx, "127.0.0.1:0"); err != nil {
			fzErr = err
			return
		}
		if e.buf, err = verbs.AllocBuffer(fzMemLen); err != nil {
			fzErr = err
			return
		}
		e.mem = e.buf.Bytes()
		for i := range e.mem {
			e.mem[i] = fzGuard
		}
		copy(e.mem[fzRdOff:], fzPattern(fzRdLen, 1))
		copy(e.mem[fzWrOff:], fzPattern(fzWrLen, 2))
		copy(e.mem[fzRcvOff:], fzPattern(fzRcvLen, 3))
		copy(e.mem[fzMwmOff:], fzPattern(fzMwmLen, 4))
		e.golden = append([]byte(nil), e.mem...)
		reg := func(off, n int, acc verbs.Access) verbs.MR {
			m, err := e.pd.RegMR(e.mem[off:off+n], acc)
			if err != nil && fzErr == nil {
				fzErr = err
			}
			return m
		}
		e.rd = reg(fzRdOff, fzRdLen, verbs.AccessRemoteRead)
		e.wr = reg(fzWrOff, fzWrLen, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
		e.rcv = reg(fzRcvOff, fzRcvLen, verbs.AccessLocalWrite)
		e.mwm = reg(fzMwmOff, fzMwmLen, verbs.AccessLocalWrite|verbs.AccessMWBind)
		fzShared = e
	})
	return fzShared, fzErr
}

// fzMutable says whether a peer may legitimately change mem[i].
func fzMutable(i int) bool {
	in := func(off, n int) bool { return i >= off && i < off+n }
	return in(fzWrOff, fzWrLen) || in(fzWinOff, fzWinLen) ||
		in(fzRcvOff+fzRecv1Off, fzRecv1Len) || in(fzRcvOff+fzRecv2Off, fzRecv2Len) ||
		in(fzRcvOff+fzSink1Off, fzSink1Len) || in(fzRcvOff+fzSink2Off, fzSink2Len)
}

// fzRegions maps token numbers to STags and base addresses.
type fzRegions struct {
	stag [6]uint32
	base [6]uint64
}

func (r *fzRegions) substitute(s []byte) {
	for i := 0; i+4 <= len(s); i++ {
		if s[i] == 0xa5 && s[i+1] == 0xa5 && s[i+2] == 0xa5 && s[i+3] >= 1 && s[i+3] <= 5 {
			binary.BigEndian.PutUint32(s[i:], r.stag[s[i+3]])
			i += 3
			continue
		}
		if i+8 <= len(s) && s[i] == 0x5a && s[i+1] == 0x5a && s[i+2] == 0x5a && s[i+3] >= 1 && s[i+3] <= 5 {
			d := int64(int32(binary.BigEndian.Uint32(s[i+4:])))
			binary.BigEndian.PutUint64(s[i:], r.base[s[i+3]]+uint64(d))
			i += 7
		}
	}
}

// Tokens for building seeds.
func fzSTagTok(k byte) uint32 { return 0xa5a5a500 | uint32(k) }
func fzTOTok(k byte, d int32) uint64 {
	return uint64(0x5a5a5a00|uint32(k))<<32 | uint64(uint32(d))
}

// fzFixCRC rewrites the CRC of every complete FPDU in s, framed as the
// QP's reader frames them.
func fzFixCRC(s []byte) {
	for len(s) >= mpaLenLen {
		total := fpduLen(int(binary.BigEndian.Uint16(s)))
		if total > len(s) {
			return
		}
		fzCRCOrder.PutUint32(s[total-crcLen:], crc32.Checksum(s[:total-crcLen], castagnoli))
		s = s[total:]
	}
}

// fzPeerReads lists the Read Requests in the stream the QP will queue,
// in order, framing the stream exactly as readLoop does. It may list a
// few the QP ends up refusing (the QP then terminates, so those get no
// response); it never leaves out one the QP may serve. A Read Request
// whose FPDU fails the CRC check is not listed: the QP must not serve it.
func fzPeerReads(s []byte, crc bool) []readReq {
	var out []readReq
	msn := uint32(1)
	for len(s) >= mpaLenLen+2 {
		ulpdu := int(binary.BigEndian.Uint16(s))
		hlen := taggedHdrLen
		if s[2]&ddpTagged == 0 {
			hlen = untaggedHdrLen
		}
		if ulpdu < hlen || len(s) < mpaLenLen+hlen {
			return out
		}
		h, err := parseHeader(s[mpaLenLen:], ulpdu)
		if err != nil {
			return out
		}
		n := ulpdu - hlen
		total := fpduLen(ulpdu)
		crcOK := total <= len(s) && (!crc || fzCRCOrder.Uint32(s[total-crcLen:]) == crc32.Checksum(s[:total-crcLen], castagnoli))
		if !h.tagged {
			if n > maxPayload+readReqLen || !crcOK {
				return out
			}
			if h.op == opReadReq {
				rr, err := parseReadReq(s[mpaLenLen+hlen : mpaLenLen+ulpdu])
				if err != nil || h.msn != msn {
					return out
				}
				msn++
				out = append(out, rr)
			}
			if h.op == opTerm {
				return out
			}
		}
		if !crcOK {
			return out
		}
		s = s[total:]
	}
	return out
}

// fzOut is one FPDU the QP sent.
type fzOut struct {
	h       header
	body    []byte // untagged: the bytes after the header
	payload []byte // tagged: the data
}

// fzCapture reads the QP's FPDUs until EOF, checking their framing.
func fzCapture(c net.Conn, crc bool, out chan<- fzOut, errc chan<- error) {
	defer close(out)
	var hb [mpaLenLen + untaggedHdrLen]byte
	for {
		if _, err := io.ReadFull(c, hb[:mpaLenLen+2]); err != nil {
			if err == io.EOF || errors.Is(err, net.ErrClosed) || isReset(err) {
				errc <- nil
			} else {
				errc <- fmt.Errorf("reading the QP's next FPDU: %w", err)
			}
			return
		}
		ulpdu := int(binary.BigEndian.Uint16(hb[:]))
		hlen := taggedHdrLen
		if hb[2]&ddpTagged == 0 {
			hlen = untaggedHdrLen
		}
		if ulpdu < hlen || ulpdu-hlen > maxPayload+readReqLen {
			errc <- fmt.Errorf("QP sent an FPDU with ULPDU length %d (header %d)", ulpdu, hlen)
			return
		}
		rest := make([]byte, ulpdu-2+padLen(ulpdu)+crcLen)
		if _, err := io.ReadFull(c, rest); err != nil {
			errc <- fmt.Errorf("QP's FPDU cut short: %w", err)
			return
		}
		whole := append(append([]byte(nil), hb[:mpaLenLen+2]...), rest...)
		h, err := parseHeader(whole[mpaLenLen:], ulpdu)
		if err != nil {
			errc <- fmt.Errorf("QP sent an FPDU its own parser refuses: %v", err)
			return
		}
		total := len(whole)
		if crc {
			if got, want := fzCRCOrder.Uint32(whole[total-crcLen:]), crc32.Checksum(whole[:total-crcLen], castagnoli); got != want {
				errc <- fmt.Errorf("QP sent an FPDU with CRC %#08x, want %#08x", got, want)
				return
			}
		}
		for _, p := range whole[mpaLenLen+ulpdu : total-crcLen] {
			if p != 0 {
				errc <- fmt.Errorf("QP sent non-zero pad")
				return
			}
		}
		o := fzOut{h: h}
		if h.tagged {
			o.payload = whole[mpaLenLen+hlen : mpaLenLen+ulpdu]
		} else {
			o.body = whole[mpaLenLen+hlen : mpaLenLen+ulpdu]
		}
		out <- o
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func FuzzStream(f *testing.F) {
	crcFix := byte(fzModeCRC | fzModeFixCRC)
	io1 := byte(0x34) // offers IRD 4 (QP's ORD), ORD 4 (QP's IRD)
	seed := func(mode byte, parts ...[]byte) {
		f.Add(append([]byte{mode, io1}, fzCat(parts...)...))
	}
	rdReq := func(msn uint32, to int32, size uint32) []byte {
		return fzReadReqFPDU(false, msn, readReq{sinkSTag: 0x1234, sinkTO: 0x10000, size: size, srcSTag: fzSTagTok(1), srcTO: fzTOTok(1, to)})
	}
	mwReq := func(msn uint32, to int32, size uint32) []byte {
		return fzReadReqFPDU(false, msn, readReq{sinkSTag: 0x4321, sinkTO: 0x20000, size: size, srcSTag: fzSTagTok(4), srcTO: fzTOTok(4, to)})
	}
	write := func(k byte, to int32, data []byte, last bool) []byte {
		return fzFPDU(false, header{tagged: true, last: last, op: opWrite, stag: fzSTagTok(k), to: fzTOTok(k, to)}, nil, data)
	}
	resp := func(sink int32, data []byte, last bool) []byte {
		return fzFPDU(false, header{tagged: true, last: last, op: opReadResp, stag: fzSTagTok(3), to: fzTOTok(3, sink)}, nil, data)
	}
	for _, mode := range []byte{crcFix, 0, crcFix | fzModeP2P, fzModeP2P | fzModeRTRRd, fzModeV1} {
		seed(mode, fzSendFPDU(false, 1, 0, true, []byte("hello, receive")))
		seed(mode, rdReq(1, 100, 1000), rdReq(2, 0, fzRdLen), rdReq(3, fzRdLen-1, 1))
	}
	seed(crcFix, fzSendFPDU(false, 1, 0, false, fzPattern(20, 9)), fzSendFPDU(false, 1, 20, true, fzPattern(30, 10)),
		fzSendFPDU(false, 2, 0, true, fzPattern(64, 11)))
	seed(crcFix, write(2, 10, fzPattern(100, 12), true), write(4, 0, fzPattern(fzWinLen, 13), true), rdReq(1, 0, 8))
	seed(crcFix, mwReq(1, 0, fzWinLen), mwReq(2, 500, 500), rdReq(3, 2000, 1000))
	seed(crcFix, resp(fzSink1Off, fzPattern(40, 14), false), resp(fzSink1Off+40, fzPattern(60, 15), true),
		resp(fzSink2Off, fzPattern(50, 16), true))
	// Faults the QP must refuse.
	seed(crcFix, rdReq(1, fzRdLen-100, 200))                                                              // crosses the end
	seed(crcFix, rdReq(1, -8, 16))                                                                        // starts before
	seed(crcFix, rdReq(1, 0, ^uint32(0)))                                                                 // huge
	seed(crcFix, fzReadReqFPDU(false, 1, readReq{srcSTag: fzSTagTok(2), srcTO: fzTOTok(2, 0), size: 10})) // no read right
	seed(crcFix, fzReadReqFPDU(false, 1, readReq{srcSTag: fzSTagTok(3), srcTO: fzTOTok(3, 0), size: 10})) // local only
	seed(crcFix, fzReadReqFPDU(false, 1, readReq{srcSTag: fzSTagTok(5), srcTO: fzTOTok(5, 500), size: 10}))
	seed(crcFix, mwReq(1, fzWinLen-10, 20))                                                 // crosses the window's end
	seed(crcFix, fzReadReqFPDU(false, 1, readReq{srcSTag: 0x77777777, srcTO: 0, size: 10})) // unknown STag
	seed(crcFix, write(1, 0, []byte("no write right"), true))
	seed(crcFix, write(2, fzWrLen-4, []byte("past the end"), true))
	seed(crcFix, write(4, -4, []byte("before window"), true))
	seed(crcFix, write(5, 0, []byte("MR under window"), true))
	seed(crcFix, resp(fzSink1Off, fzPattern(101, 17), true))                 // longer than the READ
	seed(crcFix, resp(fzSink1Off+1, fzPattern(10, 17), true))                // wrong TO
	seed(crcFix, fzSendFPDU(false, 1, 0, true, fzPattern(fzRecv1Len+1, 18))) // too long for the receive
	seed(crcFix, fzSendFPDU(false, 2, 0, true, []byte("bad MSN")))
	seed(crcFix, fzSendFPDU(false, 1, 0, true, nil), fzSendFPDU(false, 2, 0, true, nil), fzSendFPDU(false, 3, 0, true, nil)) // no third receive
	seed(crcFix, rdReq(2, 0, 10))                                                                                            // bad MSN
	seed(crcFix, rdReq(1, 0, 1), rdReq(2, 0, 1), rdReq(3, 0, 1), rdReq(4, 0, 1), rdReq(5, 0, 1), rdReq(6, 0, 1))             // over IRD
	seed(crcFix, fzTermFPDU(false, &termError{layer: layerRDMAP, etype: rdmapRemoteOp, code: rdmapOpcode}))
	seed(fzModeCRC, fzSendFPDU(false, 1, 0, true, []byte("CRC left zero")))
	seed(fzModeCRC, rdReq(1, 0, 100)) // read request with a bad CRC
	seed(0, []byte{0xff, 0xff, 0x41, 0x43})
	seed(0, []byte{0x00, 0x02, 0x41, 0x43, 0, 0, 0, 0})
	seed(crcFix, []byte("garbage that is not an FPDU at all, not even close"))

	env, err := fzSetup()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 || len(data) > 1<<18 {
			return
		}
		fzRun(t, env, data[0], data[1], data[2:])
	})
}

func fzRun(t *testing.T, e *fzEnv, mode, offer byte, stream []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	defer fzRestore(t, e)
	// A hung iteration (a deadlocked QP never lets Close return) must be
	// a crash the fuzzer records, with every goroutine's stack.
	watchdog := time.AfterFunc(8*time.Second, func() {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		panic(fmt.Sprintf("FuzzStream iteration hung (mode %#x, offer %#x, %d stream bytes):\n%s", mode, offer, len(stream), buf[:n]))
	})
	defer watchdog.Stop()

	// MPA request, by hand.
	req := mpaFrame{crc: mode&fzModeCRC != 0, enhanced: true, rev: mpaRev2,
		ird: uint16(1 + (offer>>4)&7), ord: uint16(offer & 0xf)}
	if mode&fzModeP2P != 0 {
		req.p2p = true
		req.rtr = rtrKindWrite
		if mode&fzModeRTRRd != 0 {
			req.rtr = rtrKindRead
		}
	}
	if mode&fzModeV1 != 0 {
		req = mpaFrame{crc: req.crc, rev: 1}
	}
	rb, err := req.marshal()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", e.ln.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(rb); err != nil {
		t.Fatal(err)
	}
	cr, err := e.ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pq, err := cr.Prepare(e.pd, verbs.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	rcv := e.rcv
	if _, err := pq.PostRecv([]verbs.RecvWR{
		{ID: 1, Local: verbs.SGE{Addr: rcv.Addr() + fzRecv1Off, Length: fzRecv1Len, LKey: rcv.LKey()}},
		{ID: 2, Local: verbs.SGE{Addr: rcv.Addr() + fzRecv2Off, Length: fzRecv2Len, LKey: rcv.LKey()}},
	}); err != nil {
		t.Fatal(err)
	}
	qpi, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: []byte("fuzz")})
	if err != nil {
		t.Fatal(err)
	}
	q := qpi.(*qp)
	defer q.Close()
	rep, err := readMPA(c, true)
	if err != nil {
		t.Fatalf("reading the MPA reply: %v", err)
	}
	if rep.crc != req.crc {
		t.Fatalf("asked for CRC %v, reply says %v (the device has CRCOff)", req.crc, rep.crc)
	}
	crc := rep.crc

	// A window bound to the QP, and two READs of its own for the stream
	// to answer.
	w, err := e.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := q.PostSend([]verbs.SendWR{{ID: 100, Op: verbs.OpBindMW, MW: w, BindMR: e.mwm,
		BindAddr: e.mwm.Addr() + (fzWinOff - fzMwmOff), BindLen: fzWinLen,
		BindAccess: verbs.AccessRemoteRead | verbs.AccessRemoteWrite}}); err != nil {
		t.Fatal(err)
	}
	if w.RKey() == 0 {
		t.Fatal("window not bound")
	}
	if _, err := q.PostSend([]verbs.SendWR{
		{ID: 101, Op: verbs.OpRead, Local: verbs.SGE{Addr: rcv.Addr() + fzSink1Off, Length: fzSink1Len, LKey: rcv.LKey()}, RemoteAddr: 0x1000, RKey: 0x5eed},
		{ID: 102, Op: verbs.OpRead, Local: verbs.SGE{Addr: rcv.Addr() + fzSink2Off, Length: fzSink2Len, LKey: rcv.LKey()}, RemoteAddr: 0x2000, RKey: 0x5eed},
	}); err != nil {
		t.Fatal(err)
	}
	regs := fzRegions{
		stag: [6]uint32{0, e.rd.RKey(), e.wr.RKey(), e.rcv.RKey(), w.RKey(), e.mwm.RKey()},
		base: [6]uint64{0, e.rd.Addr(), e.wr.Addr(), e.rcv.Addr(), e.mwm.Addr() + (fzWinOff - fzMwmOff), e.mwm.Addr()},
	}

	// Everything the QP sends from here on.
	outc := make(chan fzOut, 1024)
	capErr := make(chan error, 1)
	go fzCapture(c, crc, outc, capErr)
	var outs []fzOut

	// The RTR first, if one was negotiated, so that the passive QP lets
	// its READs go; then wait for them so that the stream's responses
	// find them outstanding.
	var prefix []byte
	if rep.p2p {
		switch {
		case rep.rtr&rtrKindWrite != 0:
			prefix = fzFPDU(crc, header{tagged: true, last: true, op: opWrite}, nil, nil)
		case rep.rtr&rtrKindRead != 0:
			prefix = fzReadReqFPDU(crc, 1, readReq{})
		default:
			t.Fatalf("reply chose no RTR kind: %+v", rep)
		}
		if _, err := c.Write(prefix); err != nil {
			t.Fatal(err)
		}
	}
	wantReads := min(2, q.Info().ReadsOut)
	seen := 0
	for seen < wantReads {
		select {
		case o, ok := <-outc:
			if !ok {
				t.Fatalf("QP closed before sending its READs: %v", <-capErr)
			}
			outs = append(outs, o)
			if !o.h.tagged && o.h.op == opReadReq {
				seen++
			}
		case <-ctx.Done():
			t.Fatalf("QP sent %d of its %d READs", seen, wantReads)
		}
	}

	s := append([]byte(nil), stream...)
	regs.substitute(s)
	if mode&fzModeFixCRC != 0 {
		fzFixCRC(s)
	}
	full := append(prefix, s...)
	peerReads := fzPeerReads(full, crc)

	// Write the stream; half-close once every READ the stream made has
	// been answered (or the QP ended, or 100ms passed) so that the
	// responses get out before the QP sees the end of the stream.
	wrote := make(chan struct{})
	go func() {
		c.Write(s)
		close(wrote)
	}()
	answered := 0
	var idle <-chan time.Time
	halfClose := func() {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}
	closed := false
	for outc != nil {
		if !closed && idle == nil && wrote == nil && answered >= len(peerReads) {
			halfClose()
			closed = true
		}
		select {
		case o, ok := <-outc:
			if !ok {
				outc = nil
				break
			}
			outs = append(outs, o)
			if o.h.tagged && o.h.op == opReadResp && o.h.last {
				answered++
			}
		case <-wrote:
			wrote = nil
			idle = time.After(100 * time.Millisecond)
			if answered >= len(peerReads) {
				idle = nil
			}
		case <-idle:
			idle = nil
			if !closed {
				halfClose()
				closed = true
			}
		}
	}
	if err := <-capErr; err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("QP still running 2s after the stream ended")
	}

	// Match Read Responses to the requests, in order.
	k, off := 0, uint64(0)
	for _, o := range outs {
		h := o.h
		switch {
		case h.tagged && h.op == opReadResp:
			if k >= len(peerReads) {
				t.Fatalf("Read Response (STag %#x TO %#x, %d bytes) with no Read Request to answer (%d accepted)", h.stag, h.to, len(o.payload), len(peerReads))
			}
			r := peerReads[k]
			if h.stag != r.sinkSTag || h.to != r.sinkTO+off {
				t.Fatalf("response %d segment at STag %#x TO %#x, want %#x %#x", k, h.stag, h.to, r.sinkSTag, r.sinkTO+off)
			}
			if uint64(len(o.payload)) > uint64(r.size)-off {
				t.Fatalf("response %d carries %d bytes past the %d requested", k, off+uint64(len(o.payload)), r.size)
			}
			if len(o.payload) > 0 {
				fzCheckSource(t, e, &regs, r, off, o.payload)
			}
			off += uint64(len(o.payload))
			if h.last {
				if off != uint64(r.size) {
					t.Fatalf("response %d has %d bytes, READ of %d", k, off, r.size)
				}
				k++
				off = 0
			}
		case h.tagged:
			t.Fatalf("QP sent a tagged opcode %d", h.op)
		case h.op == opReadReq, h.op == opTerm:
		default:
			t.Fatalf("QP sent untagged opcode %d", h.op)
		}
	}
	// A response cut short by the connection's end (off != 0) is fine:
	// its bytes were checked above.
	q.Close()
	fzCheckGuards(t, e)
	t.Logf("mode %#x: %d peer READs accepted, %d answered, %d FPDUs from the QP; QP ended with: %v", mode, len(peerReads), k, len(outs), q.Err())
}

// fzCheckSource fails unless payload, bytes [off, off+len) of the
// response to r, comes from memory r's source STag allows peers to read.
func fzCheckSource(t *testing.T, e *fzEnv, regs *fzRegions, r readReq, off uint64, payload []byte) {
	t.Helper()
	src := r.srcTO + off
	end := src + uint64(len(payload))
	inside := func(base uint64, n int) bool {
		return r.srcTO >= base && r.srcTO+uint64(r.size) >= r.srcTO && r.srcTO+uint64(r.size) <= base+uint64(n)
	}
	switch r.srcSTag {
	case regs.stag[1]:
		if !inside(regs.base[1], fzRdLen) {
			t.Fatalf("READ of %d bytes at %#x served from the remote-read MR [%#x, +%d)", r.size, r.srcTO, regs.base[1], fzRdLen)
		}
		want := e.golden[fzRdOff+int(src-regs.base[1]) : fzRdOff+int(end-regs.base[1])]
		if !bytes.Equal(payload, want) {
			t.Fatalf("READ at %#x+%d: payload differs from the MR's bytes", r.srcTO, off)
		}
	case regs.stag[4]:
		if !inside(regs.base[4], fzWinLen) {
			t.Fatalf("READ of %d bytes at %#x served through the window [%#x, +%d)", r.size, r.srcTO, regs.base[4], fzWinLen)
		}
	default:
		t.Fatalf("READ of %d bytes at %#x served for STag %#x, which has no remote read right (regions %x)", r.size, r.srcTO, r.srcSTag, regs.stag)
	}
	if bytes.Count(payload, []byte{fzGuard, fzGuard, fzGuard, fzGuard}) > 0 && r.srcSTag == regs.stag[1] {
		t.Fatalf("guard bytes in a response")
	}
}

func fzCheckGuards(t *testing.T, e *fzEnv) {
	t.Helper()
	for i := range e.mem {
		if e.mem[i] != e.golden[i] && !fzMutable(i) {
			t.Fatalf("byte %d of the mapping changed (%#x -> %#x): outside every region a peer may write", i, e.golden[i], e.mem[i])
		}
	}
}

// fzRestore puts the mapping back and empties the CQs for the next run.
func fzRestore(t *testing.T, e *fzEnv) {
	copy(e.mem, e.golden)
	buf := make([]verbs.Completion, 256)
	for _, cq := range []verbs.CQ{e.scq, e.rcq} {
		for {
			n, err := cq.Poll(buf)
			if err != nil {
				t.Fatalf("poll: %v", err)
			}
			if n == 0 {
				break
			}
		}
	}
}

// ---- Regression tests for provider bugs found while writing the fuzzers ----

// fzRaw is a QP under test (the passive side) and the raw TCP connection
// of its peer, which this test drives by hand.
type fzRaw struct {
	c    net.Conn
	q    *qp
	pd   verbs.PD
	scq  verbs.CQ
	rcq  verbs.CQ
	hung bool // the QP is deadlocked: leave it, Close would never return
}

func fzRawPair(t *testing.T, crc bool, recvs func(verbs.PD) []verbs.RecvWR) *fzRaw {
	t.Helper()
	return fzRawPairReq(t, mpaFrame{crc: crc, enhanced: true, rev: mpaRev2, ird: 4, ord: 4}, recvs)
}

// fzRawPairReq is fzRawPair with the MPA request req.
func fzRawPairReq(t *testing.T, req mpaFrame, recvs func(verbs.PD) []verbs.RecvWR) *fzRaw {
	t.Helper()
	crc := req.crc
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev, err := New(Config{CRC: CRCOff}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r := &fzRaw{}
	r.pd, _ = dev.AllocPD()
	r.scq, _ = dev.CreateCQ(1024)
	r.rcq, _ = dev.CreateCQ(1024)
	ln, err := dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	rb, _ := req.marshal()
	if r.c, err = net.Dial("tcp", ln.Addr()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Write(rb); err != nil {
		t.Fatal(err)
	}
	cr, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pq, err := cr.Prepare(r.pd, verbs.QPConfig{SendCQ: r.scq, RecvCQ: r.rcq})
	if err != nil {
		t.Fatal(err)
	}
	if recvs != nil {
		if _, err := pq.PostRecv(recvs(r.pd)); err != nil {
			t.Fatal(err)
		}
	}
	qpi, err := pq.Connect(ctx, verbs.ConnParam{})
	if err != nil {
		t.Fatal(err)
	}
	r.q = qpi.(*qp)
	t.Cleanup(func() {
		r.c.Close() // first, so that the QP's disconnect need not wait for it
		if !r.hung {
			r.q.Close()
		}
	})
	rep, err := readMPA(r.c, true)
	if err != nil || rep.crc != crc {
		t.Fatalf("MPA reply %+v, %v", rep, err)
	}
	return r
}

// A Send whose FPDU fails the CRC check must not complete successfully:
// RFC 5044 has the receiver verify the CRC before it passes the ULPDU to
// DDP, and the data placed from a corrupted FPDU is not to be
// trusted. (qp.go's untagged() used to push the receive's successful
// completion before readLoop compared the CRC.)
func TestBadCRCSendDoesNotComplete(t *testing.T) {
	var recvBuf []byte
	r := fzRawPair(t, true, func(p verbs.PD) []verbs.RecvWR {
		recvBuf = buffer(t, 4096)
		m, err := p.RegMR(recvBuf, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return []verbs.RecvWR{{ID: 7, Local: verbs.SGE{Addr: m.Addr(), Length: 64, LKey: m.LKey()}}}
	})
	fp := fzSendFPDU(true, 1, 0, true, []byte("this message is corrupted"))
	fp[len(fp)-1] ^= 0xff
	if _, err := r.c.Write(fp); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.q.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("QP accepted an FPDU with a bad CRC")
	}
	cs := wait(t, r.rcq, 1)
	if cs[0].WRID != 7 || cs[0].Status == verbs.StatusSuccess {
		t.Fatalf("receive of a Send with a bad CRC completed with %+v (%v); want an error or flush status", cs[0], cs[0].Status)
	}
}

// MR.Close promises that once it returns nothing touches the memory. A
// Read Response longer than one write batch (flushBytes, 8 MiB) used to
// break that: fpdus.write released every held region after each batch,
// so the rest of the response was sent from the region's memory with no
// hold on it (fpdus.message flushed mid-message; send() took the hold
// once, before the message). A peer then read memory that was
// deregistered, and possibly reused, after Close returned.
//
// Close does not wait for a peer that stops reading, either: the writer
// holds no region while it waits on the socket. So Close returns at
// once, the response is cut where the socket stopped taking it, and the
// QP fails; every byte the peer does get is the region's content from
// before Close.
func TestCloseCutsLongReadResponse(t *testing.T) {
	r := fzRawPair(t, true, nil)
	const n = 32 << 20
	buf := buffer(t, n)
	orig := fzPattern(n, 42)
	copy(buf, orig)
	m, err := r.pd.RegMR(buf, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Write(fzReadReqFPDU(true, 1, readReq{sinkSTag: 9, sinkTO: 0, size: n, srcSTag: m.RKey(), srcTO: m.Addr()})); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the response fills the socket buffers; this side reads nothing yet
	closed := make(chan struct{})
	go func() {
		m.Close()
		for i := range buf { // the application reuses the memory at once
			buf[i] = 0xff
		}
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Fatal("MR.Close waited for a peer that reads nothing")
	}
	r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	stream, err := io.ReadAll(r.c)
	if err != nil && !isReset(err) {
		t.Fatalf("reading the response: %v", err)
	}
	got := 0
	for len(stream) >= mpaLenLen+taggedHdrLen {
		ulpdu := int(binary.BigEndian.Uint16(stream))
		if stream[3]&rdmapOpMask != opReadResp {
			t.Fatalf("after %d bytes: opcode %d", got, stream[3]&rdmapOpMask)
		}
		to := binary.BigEndian.Uint64(stream[8:])
		pay := stream[mpaLenLen+taggedHdrLen:]
		pay = pay[:min(len(pay), ulpdu-taggedHdrLen)]
		if i := firstDiff(pay, orig[to:to+uint64(len(pay))]); i >= 0 {
			t.Fatalf("byte %d of the Read Response was read from the region after MR.Close returned (got %#x, want %#x)", int(to)+i, pay[i], orig[int(to)+i])
		}
		got += len(pay)
		stream = stream[min(len(stream), fpduLen(ulpdu)):]
	}
	if got >= n {
		t.Errorf("the whole response went out, from a peer that read nothing until Close returned")
	}
	select {
	case <-r.q.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the QP lives on")
	}
	t.Logf("%d of %d bytes went out before Close; QP: %v", got, n, r.q.Err())
	if err := r.q.Err(); err == nil || !strings.Contains(err.Error(), "deregistered") {
		t.Errorf("QP error %v does not say the region was deregistered", err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// MR.Close must not deadlock with the writer. The writer takes a share
// of a region for every Read Response of a batch and releases them all
// only after the batch is written, so a batch of two responses from one
// region takes two shares in one goroutine. When the shares were a
// sync.RWMutex's read locks, a Close (use.Lock) arriving between the two
// made the second RLock wait for the Close, which waited for the first:
// both hung for ever. (Shares are now a count that never blocks.)
// Through a memory window the window is wide: closing the MR does not
// drop the window's STag, so the second lookup still succeeds while
// Close waits.
func TestCloseDuringReadBatchNoDeadlock(t *testing.T) {
	const big = 7 << 20 // one batch: under flushBytes, under 3*flushFPDUs buffers
	for attempt := range 30 {
		r := fzRawPair(t, true, nil)
		buf := buffer(t, big+4096)
		m, err := r.pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessMWBind)
		if err != nil {
			t.Fatal(err)
		}
		w, _ := r.pd.AllocMW()
		if _, err := r.q.PostSend([]verbs.SendWR{{ID: 1, Op: verbs.OpBindMW, MW: w, BindMR: m, BindAddr: m.Addr(), BindLen: m.Len(), BindAccess: verbs.AccessRemoteRead}}); err != nil || w.RKey() == 0 {
			t.Fatal("bind", err)
		}
		go io.Copy(io.Discard, r.c)
		reqs := fzCat(
			fzReadReqFPDU(true, 1, readReq{sinkSTag: 9, size: big, srcSTag: w.RKey(), srcTO: m.Addr()}),
			fzReadReqFPDU(true, 2, readReq{sinkSTag: 9, size: 1, srcSTag: w.RKey(), srcTO: m.Addr()}),
		)
		if _, err := r.c.Write(reqs); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(attempt%10) * 100 * time.Microsecond)
		done := make(chan struct{})
		go func() { m.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			r.hung = true
			st := make([]byte, 1<<20)
			st = st[:runtime.Stack(st, true)]
			var writer []byte
			for _, g := range bytes.Split(st, []byte("\n\n")) {
				if bytes.Contains(g, []byte("(*qp).writer")) {
					writer = g
				}
			}
			t.Fatalf("attempt %d: MR.Close and the QP's writer deadlocked (QP error so far: %v); the writer:\n%s", attempt, r.q.Err(), writer)
		}
		r.c.Close()
	}
}

// The MPA CRC goes on the wire as iSCSI's does (RFC 5044 takes CRC32c from
// iSCSI; RFC 3720 appendix B.4's first example, 32 bytes of
// zeros, has CRC 0x8a9136aa sent as aa 36 91 8a): least significant byte
// of the CRC value first. Wireshark's iwarp_mpa dissector and Linux siw
// (whose CRC field is a __le32) expect exactly that. qp.go used to write
// and read the value most significant byte first (fpdus.add, readLoop),
// so two of these providers agreed with each other and with no one else:
// every FPDU failed the CRC check of a conforming peer.
func TestMPACRCByteOrder(t *testing.T) {
	if got := crc32.Checksum(make([]byte, 32), castagnoli); got != 0x8a9136aa {
		t.Fatalf("CRC32c of 32 zero bytes is %#08x, want 0x8a9136aa (RFC 3720 B.4)", got)
	}
	fp := fzFPDU(true, header{last: true, op: opSend, qn: qnSend, msn: 1}, nil, []byte("crc byte order"))
	sum := crc32.Checksum(fp[:len(fp)-crcLen], castagnoli)
	if got := fp[len(fp)-crcLen:]; binary.LittleEndian.Uint32(got) != sum {
		t.Errorf("FPDU CRC %#08x written as % x, want % x (least significant byte first)", sum, got, binary.LittleEndian.AppendUint32(nil, sum))
	}
	// And the reader must take a correctly ordered CRC.
	r := fzRawPair(t, true, func(p verbs.PD) []verbs.RecvWR {
		b := buffer(t, 4096)
		m, err := p.RegMR(b, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return []verbs.RecvWR{{ID: 1, Local: verbs.SGE{Addr: m.Addr(), Length: 64, LKey: m.LKey()}}}
	})
	fp = fzSendFPDU(false, 1, 0, true, []byte("crc sent as RFC 5044 says"))
	binary.LittleEndian.PutUint32(fp[len(fp)-crcLen:], crc32.Checksum(fp[:len(fp)-crcLen], castagnoli))
	if _, err := r.c.Write(fp); err != nil {
		t.Fatal(err)
	}
	cs := wait(t, r.rcq, 1)
	if cs[0].Status != verbs.StatusSuccess || r.q.Err() != nil {
		t.Errorf("Send with a least-significant-byte-first CRC: completion %v, QP error %v", cs[0].Status, r.q.Err())
	}
}

// A peer that offers IRD 0 (RFC 6581 allows it) leaves the passive side
// an ORD of 0 (cm.go accept: ord = min(ord, int(r.req.ird)), and dial
// likewise with rep.ird). A READ posted then is neither refused nor ever
// sent: the writer waits for len(q.reads) < ReadsOut, which never holds,
// so the READ and everything posted after it hang until the connection
// ends, with no error anywhere.
func TestZeroORDReadDoesNotHang(t *testing.T) {
	r := fzRawPairReq(t, mpaFrame{enhanced: true, rev: mpaRev2, ird: 0, ord: 4}, nil)
	t.Logf("ORD %d, IRD %d", r.q.Info().ReadsOut, r.q.Info().ReadsIn)
	b := buffer(t, 4096)
	m, err := r.pd.RegMR(b, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.q.PostSend([]verbs.SendWR{{ID: 5, Op: verbs.OpRead, Local: verbs.SGE{Addr: m.Addr(), Length: 16, LKey: m.LKey()}, RemoteAddr: 0x1000, RKey: 0x1234}})
	if n == 0 && err != nil {
		return // refused at post: fine
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out := make([]verbs.Completion, 1)
	for {
		if k, _ := r.scq.Poll(out); k == 1 {
			if out[0].Status == verbs.StatusSuccess {
				t.Fatalf("READ on a connection with ORD 0 succeeded: %+v", out[0])
			}
			return // failed with a status: fine
		}
		if err := r.scq.Wait(ctx); err != nil {
			t.Fatalf("READ posted with ORD %d was accepted by PostSend and neither sent nor completed within 2s", r.q.Info().ReadsOut)
		}
	}
}

// RDMAP Send with Invalidate (RFC 5040: "Send with Invalidate" and "Send
// with Solicited Event and Invalidate", opcodes 0x4 and 0x6) asks the
// receiver to invalidate the STag it names.
// parseHeader accepts the opcodes and untagged() treats them as plain
// Sends, ignoring the Invalidate STag: a peer that revokes its own access
// to a window this way keeps that access, and the application is not
// told. (Either invalidate, or refuse the opcode with a Terminate.)
func TestSendWithInvalidateInvalidates(t *testing.T) {
	r := fzRawPair(t, false, func(p verbs.PD) []verbs.RecvWR {
		b := buffer(t, 4096)
		m, err := p.RegMR(b, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return []verbs.RecvWR{{ID: 1, Local: verbs.SGE{Addr: m.Addr(), Length: 64, LKey: m.LKey()}}}
	})
	win := buffer(t, 4096)
	m, err := r.pd.RegMR(win, verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := r.pd.AllocMW()
	if _, err := r.q.PostSend([]verbs.SendWR{{ID: 2, Op: verbs.OpBindMW, MW: w, BindMR: m, BindAddr: m.Addr(), BindLen: 4096, BindAccess: verbs.AccessRemoteRead}}); err != nil || w.RKey() == 0 {
		t.Fatal("bind", err)
	}
	key := w.RKey()
	inv := fzFPDU(false, header{last: true, op: opSendInv, qn: qnSend, msn: 1, inv: key}, nil, []byte("done with your window"))
	if _, err := r.c.Write(inv); err != nil {
		t.Fatal(err)
	}
	if cs := wait(t, r.rcq, 1); cs[0].Status != verbs.StatusSuccess {
		t.Logf("Send with Invalidate refused: %+v (%v)", cs[0], r.q.Err())
		return // refusing the opcode is acceptable
	}
	// The window must be gone: a READ through it must not be served.
	if _, err := r.c.Write(fzReadReqFPDU(false, 1, readReq{sinkSTag: 3, size: 8, srcSTag: key, srcTO: m.Addr()})); err != nil {
		t.Fatal(err)
	}
	r.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	hb := make([]byte, 4)
	if _, err := io.ReadFull(r.c, hb); err == nil && hb[2]&ddpTagged != 0 && hb[3]&rdmapOpMask == opReadResp {
		t.Fatalf("after a Send with Invalidate of STag %#x, a READ through it was served (window key now %#x)", key, w.RKey())
	}
}
