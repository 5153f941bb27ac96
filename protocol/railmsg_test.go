package protocol

import (
	"errors"
	"strings"
	"testing"
)

func TestRailsReplyRoundTrip(t *testing.T) {
	m := &RailsReply{RequestID: 9, Addrs: []string{"10.1.1.2:7471", "10.1.2.2:7471"}}
	b, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// header, u8 count, then u16 length + bytes each
	if want := HeaderSize + 1 + 2*(2+len("10.1.1.2:7471")); len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	if b[HeaderSize] != 2 {
		t.Fatalf("count byte %d, want 2", b[HeaderSize])
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	r := got.(*RailsReply)
	if r.RequestID != 9 || strings.Join(r.Addrs, " ") != strings.Join(m.Addrs, " ") {
		t.Fatalf("round trip: %+v", r)
	}
}

func TestRailsReplyRefuses(t *testing.T) {
	enc := func(n int, addrs ...string) []byte {
		e := encoder{}
		e.b = make([]byte, HeaderSize)
		e.b[0], e.b[1] = Version, byte(TypeRailsReply)
		e.u8(uint8(n))
		for _, a := range addrs {
			e.str(a)
		}
		return e.b
	}
	many := make([]string, MaxRailAddrs+1)
	for i := range many {
		many[i] = "10.0.0.1:1"
	}
	for name, b := range map[string][]byte{
		"too many":      enc(len(many), many...),
		"short":         enc(2, "10.0.0.1:1"),
		"no port":       enc(1, "10.0.0.1"),
		"a name":        enc(1, "example:7471"),
		"unspecified":   enc(1, "0.0.0.0:7471"),
		"port 0":        enc(1, "10.0.0.1:0"),
		"port too high": enc(1, "10.0.0.1:65536"),
		"port 007":      enc(1, "10.0.0.1:007"),
		"empty":         enc(1, ""),
	} {
		if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := Marshal(&RailsReply{Addrs: many}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("encoding %d addresses: %v, want ErrTooLarge", len(many), err)
	}
}

func FuzzRailsReply(f *testing.F) {
	b, _ := Marshal(&RailsReply{Addrs: []string{"10.1.1.2:7471", "[fd00::1]:1"}})
	f.Add(b[HeaderSize:])
	f.Add([]byte{1, 0, 3, '1', ':', '1'})
	f.Fuzz(func(t *testing.T, body []byte) {
		hdr, _ := Marshal(&RailsReply{})
		m, err := Unmarshal(append(hdr[:HeaderSize:HeaderSize], body...))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("%v wraps no ErrMalformed", err)
			}
			return
		}
		for _, a := range m.(*RailsReply).Addrs {
			if !ValidRailAddr(a) {
				t.Fatalf("decoded an invalid address %q", a)
			}
		}
	})
}
