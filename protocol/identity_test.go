package protocol

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestAuthAsRoundTrip(t *testing.T) {
	m := &AuthAs{RequestID: 7, MAC: nonce(3), Identity: "alice"}
	b, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// Header, MAC, then the name as a u16 length and its bytes.
	want := append(append([]byte(nil), b[:HeaderSize]...), m.MAC[:]...)
	want = append(want, 0, 5, 'a', 'l', 'i', 'c', 'e')
	if !bytes.Equal(b, want) {
		t.Fatalf("encoding\n got % x\nwant % x", b, want)
	}
	if b[1] != 32 {
		t.Fatalf("type byte %d, want 32", b[1])
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("got %+v, want %+v", got, m)
	}
	if _, err := Unmarshal(b[:len(b)-1]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated AuthAs: %v, want ErrMalformed", err)
	}
}

// The identity MACs bind the name: another name, the plain Auth MAC, or
// the other side's MAC never pass for one.
func TestIdentityMACs(t *testing.T) {
	key := []byte("0123456789abcdef")
	sn, cn := nonce(1), nonce(2)
	a := ClientMACAs(key, "alice", sn, cn)
	for name, other := range map[string][32]byte{
		"another name":  ClientMACAs(key, "alicf", sn, cn),
		"plain Auth":    ClientMAC(key, sn, cn),
		"server side":   ServerMACAs(key, "alice", sn, cn),
		"another key":   ClientMACAs([]byte("0123456789abcdeg"), "alice", sn, cn),
		"nonces turned": ClientMACAs(key, "alice", cn, sn),
	} {
		if CheckMAC(a, other) {
			t.Errorf("%s: MAC equal", name)
		}
	}
	if a != ClientMACAs(key, "alice", sn, cn) {
		t.Fatal("MAC not deterministic")
	}
}

func TestValidIdentity(t *testing.T) {
	for _, ok := range []string{"alice", "backup-01", "a.b_c@d", "default"} {
		if !ValidIdentity(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "a b", "a/b", "é", string(make([]byte, MaxIdentity+1))} {
		if ValidIdentity(bad) {
			t.Errorf("%q taken", bad)
		}
	}
}

// FuzzAuthAs: whatever arrives, the decoder fails cleanly or decodes a
// message that re-encodes to the same bytes.
func FuzzAuthAs(f *testing.F) {
	for _, m := range []*AuthAs{{RequestID: 1, MAC: nonce(1), Identity: "alice"}, {Identity: "default"}, {}} {
		b, err := Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[HeaderSize:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		hdr, _ := Marshal(&AuthAs{})
		b := append(append([]byte(nil), hdr[:HeaderSize]...), body...)
		m, err := Unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		a, ok := m.(*AuthAs)
		if !ok {
			t.Fatalf("decoded a %T", m)
		}
		b2, err := Marshal(a)
		if err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("re-encoding differs (%v):\n in % x\nout % x", err, b, b2)
		}
	})
}
