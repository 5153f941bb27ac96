package roce

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"testing"
)

var fuzzAddrs = addrs{src: netip.MustParseAddr("10.0.0.1"), dst: netip.MustParseAddr("10.0.0.2"), srcPort: 49152, dstPort: UDPPort}

func seedPackets() []packet {
	return []packet{
		{opcode: opSendOnly, pkey: defaultPKey, destQP: 0x11, psn: 5, ackReq: true, payload: []byte("hello")},
		{opcode: opSendFirst, pkey: defaultPKey, destQP: 0x12, psn: psnMask, payload: bytes.Repeat([]byte{7}, 256)},
		{opcode: opReadRequest, pkey: defaultPKey, destQP: 0x13, psn: 9, va: 1 << 40, rkey: 0xdeadbeef, dmaLen: 1 << 20},
		{opcode: opReadRespFirst, pkey: defaultPKey, destQP: 0x14, psn: 10, syndrome: synACK | creditInvalid, msn: 3, payload: make([]byte, 1024)},
		{opcode: opReadRespMiddle, pkey: defaultPKey, destQP: 0x14, psn: 11, payload: make([]byte, 1024)},
		{opcode: opAck, pkey: defaultPKey, destQP: 0x15, psn: 12, syndrome: synNAK | nakRemoteAcc, msn: 1},
	}
}

// FuzzDecode: no datagram panics the decoder, and whatever decodes (its
// ICRC checked) encodes back to a datagram that decodes the same.
func FuzzDecode(f *testing.F) {
	buf := make([]byte, 8192)
	for _, p := range seedPackets() {
		f.Add(append([]byte(nil), encode(buf, &p, fuzzAddrs)...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, check := range []bool{true, false} {
			p, err := decode(b, fuzzAddrs, check)
			if err != nil || len(b) > 4096+64 {
				continue
			}
			out := encode(make([]byte, len(b)+64), &p, fuzzAddrs)
			q, err := decode(out, fuzzAddrs, true)
			if err != nil {
				t.Fatalf("re-encoded packet does not decode: %v", err)
			}
			p.padCount, q.padCount = 0, 0 // encode picks the pad; decode reports it
			if len(p.payload) == 0 {
				p.payload, q.payload = nil, nil
			}
			if !reflect.DeepEqual(p, q) {
				t.Fatalf("round trip changed the packet:\n%+v\n%+v", p, q)
			}
		}
	})
}

// TestICRCCatchesCorruption: flipping any bit the ICRC covers (all but
// the masked BTH byte) makes the packet fail to decode.
func TestICRCCatchesCorruption(t *testing.T) {
	buf := make([]byte, 8192)
	for _, p := range seedPackets() {
		b := encode(buf, &p, fuzzAddrs)
		if _, err := decode(b, fuzzAddrs, true); err != nil {
			t.Fatalf("opcode %#x: clean packet: %v", p.opcode, err)
		}
		for i := range len(b) {
			if i == 4 { // FECN, BECN, resv6: masked, switches may set them
				continue
			}
			b[i] ^= 0x10
			if _, err := decode(b, fuzzAddrs, true); err == nil {
				t.Fatalf("opcode %#x: bit flipped in byte %d not caught", p.opcode, i)
			}
			b[i] ^= 0x10
		}
		b[4] ^= 0xc0 // a congestion mark does not break the ICRC
		if _, err := decode(b, fuzzAddrs, true); err != nil {
			t.Fatalf("opcode %#x: FECN/BECN set broke the ICRC: %v", p.opcode, err)
		}
		other := fuzzAddrs
		other.src = netip.MustParseAddr("10.0.0.3")
		if _, err := decode(b, other, true); err == nil {
			t.Fatalf("opcode %#x: ICRC does not cover the source address", p.opcode)
		}
	}
}

// TestPKeyPartition: a packet with a correct ICRC but a P_Key of another
// partition is dropped; the default partition's limited-member P_Key
// (0x7fff) is taken, since this end is a full member.
func TestPKeyPartition(t *testing.T) {
	buf := make([]byte, 8192)
	for _, c := range []struct {
		pkey uint16
		ok   bool
	}{{0xffff, true}, {0x7fff, true}, {0x8001, false}, {0x0000, false}, {0xfffe, false}} {
		p := seedPackets()[0]
		p.pkey = c.pkey
		_, err := decode(encode(buf, &p, fuzzAddrs), fuzzAddrs, true)
		if c.ok && err != nil {
			t.Errorf("P_Key %#04x: %v", c.pkey, err)
		}
		if !c.ok && !errors.Is(err, errPKey) {
			t.Errorf("P_Key %#04x: got %v, want errPKey", c.pkey, err)
		}
	}
}
