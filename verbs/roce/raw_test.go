package roce

import (
	"encoding/binary"
	"errors"
	"testing"
)

// TestICRCCoversIPID: a packet whose ICRC was computed over a non-zero
// IP ID (what rxe sends) checks against that ID and fails against the
// ID 0 a UDP socket has to assume.
func TestICRCCoversIPID(t *testing.T) {
	p := seedPackets()[0]
	a := fuzzAddrs
	a.ipID = 0x1234
	b := encode(make([]byte, 8192), &p, a)
	if _, err := decode(b, a, true); err != nil {
		t.Fatalf("decode with the sender's IP ID: %v", err)
	}
	a.ipID = 0
	if _, err := decode(b, a, true); !errors.Is(err, errICRC) {
		t.Fatalf("decode assuming IP ID 0: %v, want %v", err, errICRC)
	}
}

// rawDatagram wraps a RoCEv2 packet in the IPv4 and UDP headers rxe
// writes (IHL 5, DF, ID a.ipID).
func rawDatagram(a addrs, pkt []byte) []byte {
	b := make([]byte, 28+len(pkt))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	binary.BigEndian.PutUint16(b[4:], a.ipID)
	binary.BigEndian.PutUint16(b[6:], 0x4000)
	b[8], b[9] = 64, 17
	s, d := a.src.As4(), a.dst.As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[20:], a.srcPort)
	binary.BigEndian.PutUint16(b[22:], a.dstPort)
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(pkt)))
	copy(b[28:], pkt)
	return b
}

// TestParseIPv4: the raw path recovers the addresses, ports and IP ID the
// ICRC covers, so an rxe-style packet checks; headers RoCEv2 never has
// are refused.
func TestParseIPv4(t *testing.T) {
	a := fuzzAddrs
	a.ipID = 0xbeef
	pkt := encode(make([]byte, 8192), &seedPackets()[0], a)
	b := rawDatagram(a, pkt)
	got, payload, err := parseIPv4(b)
	if err != nil || got != a {
		t.Fatalf("parseIPv4: %+v, %v; want %+v", got, err, a)
	}
	if _, err := decode(payload, got, true); err != nil {
		t.Fatalf("decode: %v", err)
	}
	for name, mut := range map[string]func([]byte){
		"options":   func(b []byte) { b[0] = 0x46 },
		"fragment":  func(b []byte) { b[6] = 0x20 },
		"not udp":   func(b []byte) { b[9] = 6 },
		"ip length": func(b []byte) { b[3]++ },
		"udp len":   func(b []byte) { b[25]-- },
	} {
		c := append([]byte(nil), b...)
		mut(c)
		if _, _, err := parseIPv4(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseIPv4(f *testing.F) {
	a := fuzzAddrs
	a.ipID = 7
	for _, p := range seedPackets() {
		f.Add(rawDatagram(a, encode(make([]byte, 8192), &p, a)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, payload, err := parseIPv4(b)
		if err != nil {
			return
		}
		if len(payload) != len(b)-28 || got.src != fuzzAddrs.src && !got.src.Is4() {
			t.Fatalf("payload %d of %d", len(payload), len(b))
		}
		decode(payload, got, true)
	})
}
