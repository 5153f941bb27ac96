package rdmacm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"reflect"
	"testing"
)

func seedREQ() *REQ {
	h := IPHeader{SrcPort: 50000, Src: netip.MustParseAddr("198.18.0.2"), Dst: netip.MustParseAddr("198.18.0.1")}
	return &REQ{
		LocalCommID: 0x11223344, ServiceID: ServiceID(7491), LocalCAGUID: 0x0202030405060708,
		LocalQPN: 0xabcdef, ResponderResources: 16, InitiatorDepth: 15,
		RemoteCMResponseTimeout: 18, StartingPSN: 0x123456, LocalCMResponseTimeout: 17, RetryCount: 7,
		PKey: 0xffff, PathMTU: 3, RNRRetryCount: 6, MaxCMRetries: 15,
		Primary: Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: GID(h.Src), RemoteGID: GID(h.Dst),
			FlowLabel: 0xabcde, PacketRate: 3, TrafficClass: 0x20, HopLimit: 64, SL: 5, SubnetLocal: true, LocalACKTimeout: 17},
		Private: append(h.Append(nil), 3, 'a', 'b', 'c'),
	}
}

func seedMessages() []Message {
	return []Message{
		seedREQ(),
		&REP{LocalCommID: 1, RemoteCommID: 0x11223344, LocalQPN: 0x11, LocalEECN: 0, StartingPSN: 0xfedcba,
			ResponderResources: 4, InitiatorDepth: 5, TargetACKDelay: 15, FailoverAccepted: 2, FlowControl: true,
			RNRRetryCount: 7, SRQ: true, LocalCAGUID: 9, Private: []byte{2, 'o', 'k'}},
		&RTU{LocalCommID: 1, RemoteCommID: 2},
		&MRA{LocalCommID: 1, RemoteCommID: 2, Messaged: 1, ServiceTimeout: 24},
		&REJ{LocalCommID: 1, RemoteCommID: 2, Rejected: 0, InfoLen: 3, Reason: ReasonConsumer, Info: []byte{1, 2, 3}, Private: []byte{1, 'x'}},
		&DREQ{LocalCommID: 1, RemoteCommID: 2, RemoteQPN: 0x123456},
		&DREP{LocalCommID: 2, RemoteCommID: 1},
	}
}

// padded returns m with its private data and reject info at their full
// sizes, as Decode returns them.
func padded(m Message) Message {
	pad := func(b []byte, n int) []byte { return append(append([]byte(nil), b...), make([]byte, n-len(b))...) }
	switch m := m.(type) {
	case *REQ:
		c := *m
		c.Private = pad(m.Private, PrivateREQ)
		return &c
	case *REP:
		c := *m
		c.Private = pad(m.Private, PrivateREP)
		return &c
	case *RTU:
		c := *m
		c.Private = pad(m.Private, PrivateRTU)
		return &c
	case *MRA:
		c := *m
		c.Private = pad(m.Private, PrivateMRA)
		return &c
	case *REJ:
		c := *m
		c.Info, c.Private = pad(m.Info, rejInfoLen), pad(m.Private, PrivateREJ)
		return &c
	case *DREQ:
		c := *m
		c.Private = pad(m.Private, PrivateDREQ)
		return &c
	case *DREP:
		c := *m
		c.Private = pad(m.Private, PrivateDREP)
		return &c
	}
	return m
}

func TestRoundTrip(t *testing.T) {
	for _, m := range seedMessages() {
		b, err := Encode(0x0102030405060708, m)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != MADLen || !bytes.Equal(b[:4], []byte{1, 7, 2, 3}) || binary.BigEndian.Uint16(b[16:]) != uint16(m.Attr()) {
			t.Errorf("%v: header % x", m.Attr(), b[:24])
		}
		tid, got, err := Decode(b)
		if err != nil || tid != 0x0102030405060708 || !reflect.DeepEqual(got, padded(m)) {
			t.Errorf("%v: decoded %+v (tid %#x, %v), want %+v", m.Attr(), got, tid, err, padded(m))
		}
	}
}

// TestREQLayout pins the REQ's fields to the byte offsets of IBTA
// 12.6.5 (MAD offsets: the 24-byte header, then the message).
func TestREQLayout(t *testing.T) {
	b, err := Encode(1, seedREQ())
	if err != nil {
		t.Fatal(err)
	}
	d := b[24:]
	want := []struct {
		off  int
		val  []byte
		what string
	}{
		{0, []byte{0x11, 0x22, 0x33, 0x44}, "local comm ID"},
		{8, []byte{0, 0, 0, 0, 1, 6, 0x1d, 0x43}, "service ID 0x106<<16 | 7491"},
		{32, []byte{0xab, 0xcd, 0xef, 16}, "QPN, responder resources"},
		{36, []byte{0, 0, 0, 15}, "EECN, initiator depth"},
		{40, []byte{0, 0, 0, 18 << 3}, "remote EECN, remote CM response timeout, RC, no flow control"},
		{44, []byte{0x12, 0x34, 0x56, 17<<3 | 7}, "starting PSN, local CM response timeout, retry count"},
		{48, []byte{0xff, 0xff, 3<<4 | 6, 15 << 4}, "P_Key, MTU, RNR retry, max CM retries"},
		{52, []byte{0xff, 0xff, 0xff, 0xff}, "LIDs"},
		{56 + 10, []byte{0xff, 0xff, 198, 18, 0, 2}, "local GID"},
		{72 + 10, []byte{0xff, 0xff, 198, 18, 0, 1}, "remote GID"},
		{88, []byte{0xab, 0xcd, 0xe0, 3, 0x20, 64, 5<<4 | 8, 17 << 3}, "flow label, rate, TC, hop limit, SL, subnet local, ACK timeout"},
		{140, []byte{0, 0x40, 0xc3, 0x50}, "rdma_cm header: version, IPv4, source port 50000"},
		{140 + 4 + 12, []byte{198, 18, 0, 2}, "source IP"},
		{140 + 20 + 12, []byte{198, 18, 0, 1}, "destination IP"},
		{140 + 36, []byte{3, 'a', 'b', 'c', 0}, "framed private data"},
	}
	for _, w := range want {
		if got := d[w.off : w.off+len(w.val)]; !bytes.Equal(got, w.val) {
			t.Errorf("%s at %d: % x, want % x", w.what, w.off, got, w.val)
		}
	}
	if !bytes.Equal(d[96:140], make([]byte, 44)) {
		t.Errorf("alternate path not zero: % x", d[96:140])
	}
}

func TestDecodeErrors(t *testing.T) {
	good, _ := Encode(1, &RTU{LocalCommID: 1})
	for _, c := range []struct {
		name string
		mod  func([]byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:255] }, ErrShort},
		{"class", func(b []byte) []byte { b[1] = 0x81; return b }, ErrClass},
		{"class version", func(b []byte) []byte { b[2] = 1; return b }, ErrClass},
		{"response method", func(b []byte) []byte { b[3] = 0x81; return b }, ErrClass},
		{"attribute", func(b []byte) []byte { b[17] = 0x19; return b }, ErrAttr},
	} {
		if _, _, err := Decode(c.mod(append([]byte(nil), good...))); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := Encode(1, &REP{Private: make([]byte, PrivateREP+1)}); !errors.Is(err, ErrPrivate) {
		t.Errorf("oversized private data: %v", err)
	}
	for _, b := range [][]byte{make([]byte, 35), {1, 0x40}, append([]byte{0, 0x50}, make([]byte, 34)...)} {
		if _, _, err := ParseIPHeader(b); !errors.Is(err, ErrIPHdr) {
			t.Errorf("ParseIPHeader(% x): %v", b, err)
		}
	}
}

func TestIPHeader(t *testing.T) {
	for _, h := range []IPHeader{
		{SrcPort: 1, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")},
		{SrcPort: 65535, Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("2001:db8::2")},
	} {
		got, rest, err := ParseIPHeader(append(h.Append(nil), 9))
		if err != nil || got != h || !bytes.Equal(rest, []byte{9}) {
			t.Errorf("%+v: parsed %+v rest % x %v", h, got, rest, err)
		}
	}
}

func TestTimeoutMTU(t *testing.T) {
	if Timeout(0).Nanoseconds() != 4096 || Timeout(18).Milliseconds() != 1073 {
		t.Errorf("Timeout(0) %v, Timeout(18) %v", Timeout(0), Timeout(18))
	}
	for n, c := range map[int]uint8{256: 1, 1024: 3, 4096: 5, 1500: 0} {
		if MTUCode(n) != c || (c != 0 && MTUBytes(c) != n) {
			t.Errorf("MTU %d: code %d, back %d", n, MTUCode(n), MTUBytes(MTUCode(n)))
		}
	}
	if ReasonName(8) != "invalid service ID (nobody listens on that port) (reason 8)" || ReasonName(99) != "reason 99" {
		t.Errorf("%q %q", ReasonName(8), ReasonName(99))
	}
}
