package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func FuzzUnmarshal(f *testing.F) {
	for _, m := range samples() {
		b, err := Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	for ty := Type(1); ty <= typeMax; ty++ {
		if m := newMessage(ty); m != nil { // types may be allocated ahead of their messages
			b, _ := Marshal(m)
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps neither ErrMalformed nor ErrVersion", err)
			}
			return
		}
		// The encoding is canonical: what decodes re-encodes to the same
		// bytes, and decodes again to the same message.
		b2, err := Marshal(m)
		if err != nil {
			t.Fatalf("decoded %+v but cannot encode it: %v", m, err)
		}
		if !bytes.Equal(b, b2) {
			t.Fatalf("re-encoding differs:\n in % x\nout % x", b, b2)
		}
		m2, err := Unmarshal(b2)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("decode is not stable:\n%+v\n%+v", m, m2)
		}
	})
}

func FuzzUnmarshalPrivate(f *testing.F) {
	for _, p := range []PrivateData{ControlData(), JoinData(NewSession(), 7)} {
		b, err := MarshalPrivate(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(append(b, make([]byte, MaxPrivate-PrivateSize)...))
		f.Add(b[:PrivateSize-1])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := UnmarshalPrivate(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps neither ErrMalformed nor ErrVersion", err)
			}
			return
		}
		b2, err := MarshalPrivate(p)
		if err != nil {
			t.Fatalf("decoded %+v but cannot encode it: %v", p, err)
		}
		if !bytes.Equal(b[:PrivateSize], b2) {
			t.Fatalf("re-encoding differs:\n in % x\nout % x", b[:PrivateSize], b2)
		}
		p2, err := UnmarshalPrivate(b2)
		if err != nil || p2 != p {
			t.Fatalf("decode is not stable: %+v, %+v, %v", p, p2, err)
		}
	})
}

func FuzzHasFeature(f *testing.F) {
	f.Add("rdmacp", "working", "other")
	f.Add("rdmacp +working", "working", "")
	f.Add("+working", "working", "x")
	f.Add("rdmacp\t+working\n", "working", "working")
	f.Fuzz(func(t *testing.T, name, feature, other string) {
		token := func(s string) bool { return s != "" && len(strings.Fields(s)) == 1 && strings.Fields(s)[0] == s }
		// A Client string's first field is the name, never a feature.
		if token(name) && HasFeature(name, strings.TrimPrefix(name, "+")) {
			t.Fatalf("%q announces its own name as a feature", name)
		}
		if !token(name) || !token(feature) || !token(other) {
			HasFeature(name+" "+feature, other) // must not panic
			return
		}
		c := ClientString(name, other, feature)
		if !HasFeature(c, feature) || !HasFeature(c, other) {
			t.Fatalf("%q does not announce %q and %q", c, feature, other)
		}
		if HasFeature(ClientString(name, other), feature) != (feature == other) {
			t.Fatalf("%q: HasFeature(%q) = %v", ClientString(name, other), feature, !(feature == other))
		}
		if fs := strings.Fields(c); fs[0] != name {
			t.Fatalf("%q: name is %q, want %q", c, fs[0], name)
		}
	})
}

// winSamples are the per-window digest messages, for the fuzzer's seeds and
// the round trip below.
func winSamples() []Message {
	return []Message{
		&Extents{RequestID: 40, Handle: 3, Offset: 1 << 33},
		&ExtentsReply{RequestID: 40, Handle: 3, Next: 1 << 34, Extents: []Extent{{Offset: 0, Length: 4096}, {Offset: 1 << 33, Length: 8 << 20}}},
		&ExtentsReply{RequestID: 41, Handle: 3},
		&Closed{RequestID: 42, Changed: true, FileDigest: []byte{1, 2, 3, 4}},
		&Closed{RequestID: 43},
		&Suspect{RequestID: 44, Handle: 3, Chunk: 77},
	}
}

func TestWinDigestsMessagesRoundTrip(t *testing.T) {
	for _, m := range winSamples() {
		b, err := Marshal(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if got.Type() != m.Type() || got.ID() != m.ID() {
			t.Fatalf("%T came back as %v #%d", m, got.Type(), got.ID())
		}
		// Empty and nil lists both decode as nil.
		if r, ok := m.(*ExtentsReply); ok && len(r.Extents) == 0 {
			continue
		}
		if c, ok := m.(*Closed); ok && len(c.FileDigest) == 0 {
			c.FileDigest = got.(*Closed).FileDigest
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
		}
		if _, err := Unmarshal(b[:len(b)-1]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%T cut short: %v, want ErrMalformed", m, err)
		}
	}
	// A reply claiming more extents than its bytes hold allocates nothing.
	b, _ := Marshal(&ExtentsReply{Handle: 1})
	b[len(b)-1] = 0xff
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("extent count past the message: %v", err)
	}
	if n := MaxExtentsPerReply; n < 4000 {
		t.Fatalf("MaxExtentsPerReply %d", n)
	}
	full := &ExtentsReply{Extents: make([]Extent, MaxExtentsPerReply)}
	if _, err := Marshal(full); err != nil {
		t.Fatalf("a full page does not fit: %v", err)
	}
}

// FuzzWorking: Working's body is its Progress, 8 bytes big-endian, and
// nothing else decodes.
func FuzzWorking(f *testing.F) {
	f.Add(uint32(1), []byte{})
	f.Add(uint32(7), []byte{0, 0, 0, 0, 0, 0, 0, 1})
	f.Add(uint32(7), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0})
	f.Add(uint32(0), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, id uint32, body []byte) {
		b := binary.BigEndian.AppendUint32([]byte{Version, byte(TypeWorking), 0, 0}, id)
		m, err := Unmarshal(append(b, body...))
		if len(body) != 8 {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("a %d-byte body: %v, %+v, want Malformed", len(body), err, m)
			}
			return
		}
		w, ok := m.(*Working)
		if err != nil || !ok || w.RequestID != id || w.Progress != binary.BigEndian.Uint64(body) {
			t.Fatalf("decoded %+v, %v from % x", m, err, body)
		}
	})
}
