package protocol

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func nonce(start byte) (n [32]byte) {
	for i := range n {
		n[i] = start + byte(i)
	}
	return n
}

var sampleEntry = Entry{
	Type:    FileRegular,
	Mode:    0o644,
	Size:    1<<40 + 3,
	MtimeNs: -1234567890123, // before 1970: the sign must survive
	Name:    "data.bin",
}

// samples returns one message of every type with every field set.
func samples() []Message {
	return append([]Message{
		&Hello{RequestID: 1, MinVersion: 1, MaxVersion: 3, ClientNonce: nonce(1), Client: "rdmacp/0.1"},
		&AuthAs{RequestID: 3, MAC: nonce(5), Identity: "alice"},
		&Rails{RequestID: 4}, &RailsReply{RequestID: 4, Addrs: []string{"10.0.0.1:7471", "[fd00::2]:7471"}}, &RailDrop{RequestID: 5, Index: 3},
		&Challenge{RequestID: 1, Version: 1, ServerNonce: nonce(100), AuthRequired: true,
			Session:    [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
			MaxDataQPs: 8, MaxReadsPerQP: 16, MaxWindow: 1 << 30, Server: "rdmacp/0.1 target", RateCap: 50 << 20, Rails: 2},
		&Auth{RequestID: 2, MAC: nonce(7)},
		&AuthOK{RequestID: 2, MAC: nonce(9), RateCap: 20 << 20},
		&List{RequestID: 3, Cookie: 42, Path: "dir/sub"},
		&ListReply{RequestID: 3, NextCookie: 43, Entries: []Entry{
			sampleEntry,
			{Type: FileDir, Mode: 0o755, Name: "sub"},
			{Type: FileSymlink, Mode: 0o777, Size: 6, Name: "link", Target: "../elsewhere"},
			{Type: FileBlockDev, Mode: 0o660, Name: "\xff\xfe not utf-8"},
		}},
		&Stat{RequestID: 4, Path: "dir/data.bin"},
		&StatReply{RequestID: 4, Entry: sampleEntry},
		&Open{RequestID: 5, Algorithm: 1, ChunkSize: 4 << 20, Path: "dir/data.bin"},
		&OpenReply{RequestID: 5, Handle: 77, ChunkSize: 4 << 20, Algorithm: 1, Chunks: 262145, Flags: OpenDense,
			FileDigest: bytes.Repeat([]byte{0xab}, 32), Entry: sampleEntry},
		&Digests{RequestID: 6, Handle: 77, First: 100, Count: 2000},
		&DigestsReply{RequestID: 6, Handle: 77, First: 100, Digests: bytes.Repeat([]byte{1, 2, 3, 4}, 16)},
		&Map{RequestID: 7, Handle: 77, Offset: 1 << 33, Length: 1 << 30},
		&MapReply{RequestID: 7, Handle: 77, Window: Window{ID: 5, Offset: 1 << 33, Length: 1 << 29,
			Addr: 0x7f00_1234_5000, RKeys: []uint32{0x1001, 0x1002, 0xdeadbeef}}},
		&Unmap{RequestID: 8, Handle: 77, WindowID: 5},
		&Ack{RequestID: 8},
		&Close{RequestID: 9, Handle: 77},
		&CloseReply{RequestID: 9, Changed: true},
		&Error{RequestID: 10, Code: CodeNotFound, Message: "dir/missing: no such file"},
		&Bye{RequestID: 0xffffffff},
		&Pack{RequestID: 11, Algorithm: 0, Paths: []string{"data/a", "data/sub/b", "\xff odd"}},
		&PackReply{RequestID: 11, Handle: 78, Window: Window{ID: 6, Length: 8195, Addr: 0x7f00_0000_1000, RKeys: []uint32{9, 10}},
			Files: []PackedFile{
				{Offset: 0, Digest: []byte{1, 2, 3, 4}, Entry: sampleEntry},
				{Code: CodeNotFound, Message: "data/sub/b: no such file"},
				{Code: CodeTooMany, Entry: Entry{Type: FileRegular, Size: 1 << 30, Name: "big"}, Message: "too large to pack"},
			}},
		&Push{RequestID: 12, Algorithm: 1, ChunkSize: 4 << 20, Retries: 3, Size: 1<<40 + 5, Mode: 0o640,
			MtimeNs: -1234567890123, Path: "data/dir", Name: "disk.img", Token: [16]byte{1, 2, 3}},
		&PushReply{RequestID: 12, Handle: 79, ChunkSize: 4 << 20, Algorithm: 1, Chunks: 262145, Path: "data/dir/disk.img", Resumed: 8 << 20},
		&PushWindow{RequestID: 13, Handle: 79, Window: Window{ID: 1, Offset: 1 << 25, Length: 1 << 25,
			Addr: 0x7f00_2000_0000, RKeys: []uint32{0x11, 0x11, 0x11}}, Digests: bytes.Repeat([]byte{5, 6, 7, 8}, 8)},
		&PushWindowReply{RequestID: 13, Handle: 79, Offset: 1 << 25, Retries: 2, BytesRead: 1<<25 + 8<<20},
		&PushCommit{RequestID: 14, Handle: 79, FileDigest: []byte{0xde, 0xad, 0xbe, 0xef}},
		&Walk{RequestID: 15, Algorithm: 1, MaxEntries: 128, ShardI: 2, ShardN: 5, PackMax: 256 << 10, Path: "data/tree"},
		&Walk{RequestID: 16, Path: "data/tree", Rules: []WalkRule{{Pattern: "node_modules/"}, {Include: true, Pattern: "+ keep"}}},
		&WalkNext{RequestID: 16, Handle: 80, Release: 7, MaxEntries: 1024},
		&WalkBatch{RequestID: 16, Handle: 80, Done: true, Window: Window{ID: 8, Length: 4100, Addr: 0x7f00_0000_2000, RKeys: []uint32{11, 12}},
			Entries: []WalkEntry{
				{Dir: 0, PackedFile: PackedFile{Entry: Entry{Type: FileDir, Mode: 0o755, MtimeNs: 5, Name: "sub"}}},
				{Dir: 1, Packed: true, PackedFile: PackedFile{Offset: 4, Digest: []byte{1, 2, 3, 4}, Entry: sampleEntry}},
				{Dir: 1, PackedFile: PackedFile{Entry: Entry{Type: FileSymlink, Mode: 0o777, Size: 2, Name: "l", Target: ".."}}},
				{Dir: 1, PackedFile: PackedFile{Code: CodePermission, Entry: Entry{Type: FileRegular, Name: "secret"}, Message: "permission denied"}},
			}},
		&Working{RequestID: 17},
		&Working{RequestID: 18, Progress: 0x1122334455667788},
	}, winSamples()...) // the per-window digest messages: fuzz_test.go
}

func mustMarshal(t testing.TB, m Message) []byte {
	t.Helper()
	b, err := Marshal(m)
	if err != nil {
		t.Fatalf("Marshal(%T): %v", m, err)
	}
	return b
}

func TestSamplesCoverEveryType(t *testing.T) {
	seen := map[Type]bool{}
	for _, m := range samples() {
		seen[m.Type()] = true
		if nm := newMessage(m.Type()); reflect.TypeOf(nm) != reflect.TypeOf(m) {
			t.Errorf("newMessage(%v) = %T, want %T", m.Type(), nm, m)
		}
	}
	for ty := Type(0); ty < 255; ty++ {
		if known := newMessage(ty) != nil; known != seen[ty] {
			t.Errorf("type %v: known %v, sampled %v", ty, known, seen[ty])
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, m := range samples() {
		b := mustMarshal(t, m)
		if b[0] != Version || Type(b[1]) != m.Type() || b[2] != 0 || b[3] != 0 {
			t.Errorf("%v: header % x", m.Type(), b[:HeaderSize])
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Errorf("%v: Unmarshal: %v", m.Type(), err)
			continue
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%v: round trip\n got %+v\nwant %+v", m.Type(), got, m)
		}
		// AppendMarshal appends after what is there.
		b2, err := AppendMarshal([]byte("prefix"), m)
		if err != nil || string(b2[:6]) != "prefix" || !bytes.Equal(b2[6:], b) {
			t.Errorf("%v: AppendMarshal: %v", m.Type(), err)
		}
	}
}

func TestZeroMessages(t *testing.T) {
	// Empty slices and strings come back as nil and "".
	for ty := Type(1); ty <= typeMax; ty++ {
		m := newMessage(ty)
		if m == nil {
			continue // allocated to a feature whose messages live elsewhere
		}
		got, err := Unmarshal(mustMarshal(t, m))
		if err != nil {
			t.Fatalf("%v: %v", ty, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%v: zero message round trip: got %+v", ty, got)
		}
	}
}

// TestGolden pins the wire format that docs/protocol.md (section 2) describes.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		m   Message
		hex string
	}{
		{&Open{RequestID: 0x01020304, Algorithm: 2, ChunkSize: 0x00400000, Path: "a/b"},
			"01 09 0000 01020304" + "02 00400000 0003 612f62"},
		{&Error{RequestID: 7, Code: CodeIsDir, Message: "x"},
			"01 13 0000 00000007" + "0004 0001 78"},
		{&MapReply{RequestID: 1, Handle: 2, Window: Window{ID: 3, Offset: 4, Length: 5, Addr: 6, RKeys: []uint32{7, 8}}},
			"01 0e 0000 00000001" + "00000002 00000003 0000000000000004 0000000000000005 0000000000000006 00000002 00000007 00000008"},
		{&CloseReply{RequestID: 1, Changed: true}, "01 12 0000 00000001 01"},
		{&Bye{}, "01 14 0000 00000000"},
		{&Working{RequestID: 0x0a0b0c0d, Progress: 0x0102030405060708}, "01 1f 0000 0a0b0c0d" + "0102030405060708"},
		{&Pack{RequestID: 2, Algorithm: 1, Paths: []string{"a", "bc"}},
			"01 15 0000 00000002" + "01 00000002 0001 61 0002 6263"},
		{&PackReply{RequestID: 2, Handle: 3, Window: Window{ID: 4, Length: 5, Addr: 6, RKeys: []uint32{7}},
			Files: []PackedFile{{Code: 0, Offset: 1, Digest: []byte{0xaa}, Entry: Entry{Type: FileRegular, Mode: 0o644, Size: 5, MtimeNs: 9, Name: "a"}}}},
			"01 16 0000 00000002" + "00000003 00000004 0000000000000000 0000000000000005 0000000000000006 00000001 00000007" +
				"00000001" + "0000 0000000000000001 00000001 aa" + "01 000001a4 0000000000000005 0000000000000009 0001 61 0000" + "0000"},
		{&Walk{RequestID: 4, Algorithm: 1, MaxEntries: 0x80, ShardI: 1, ShardN: 3, PackMax: 0x40000, Path: "d/t"},
			"01 1c 0000 00000004" + "01 0080 00000001 00000003 0000000000040000 0003 642f74 0000"},
		{&Walk{RequestID: 4, Algorithm: 1, MaxEntries: 0x80, ShardI: 1, ShardN: 3, PackMax: 0x40000, Path: "d/t",
			Rules: []WalkRule{{Include: true, Pattern: "a"}, {Pattern: "b/"}}},
			"01 1c 0000 00000004" + "01 0080 00000001 00000003 0000000000040000 0003 642f74 0002 01 0001 61 00 0002 622f"},
		{&WalkNext{RequestID: 5, Handle: 6, Release: 7, MaxEntries: 0x400},
			"01 1d 0000 00000005" + "00000006 00000007 0400"},
		{&WalkBatch{RequestID: 5, Handle: 6, Done: true, Window: Window{ID: 7, Length: 5, Addr: 8, RKeys: []uint32{9}},
			Entries: []WalkEntry{{Dir: 2, Packed: true, PackedFile: PackedFile{Offset: 1, Digest: []byte{0xaa},
				Entry: Entry{Type: FileRegular, Mode: 0o644, Size: 5, MtimeNs: 9, Name: "a"}}}}},
			"01 1e 0000 00000005" + "00000006 01 00000007 0000000000000000 0000000000000005 0000000000000008 00000001 00000009" +
				"00000001" + "00000002 01" + "0000 0000000000000001 00000001 aa" + "01 000001a4 0000000000000005 0000000000000009 0001 61 0000" + "0000"},
		{&Push{RequestID: 3, Algorithm: 0, ChunkSize: 0x10000, Retries: 3, Size: 5, Mode: 0o644, MtimeNs: 9, Path: "d/x", Name: "y", Token: [16]byte{0xaa, 15: 0xbb}},
			"01 17 0000 00000003" + "00 00010000 03 0000000000000005 000001a4 0000000000000009 0003 642f78 0001 79 aa0000000000000000000000000000bb"},
		{&PushReply{RequestID: 3, Handle: 4, ChunkSize: 0x10000, Algorithm: 0, Chunks: 1, Path: "d/x", Resumed: 0x20000},
			"01 18 0000 00000003" + "00000004 00010000 00 00000001 0003 642f78 0000000000020000"},
		{&PushWindow{RequestID: 4, Handle: 4, Window: Window{ID: 1, Offset: 0, Length: 5, Addr: 6, RKeys: []uint32{7}}, Digests: []byte{1, 2, 3, 4}},
			"01 19 0000 00000004" + "00000004 00000001 0000000000000000 0000000000000005 0000000000000006 00000001 00000007 00000004 01020304"},
		{&PushWindowReply{RequestID: 4, Handle: 4, Offset: 0, Retries: 1, BytesRead: 10},
			"01 1a 0000 00000004" + "00000004 0000000000000000 00000001 000000000000000a"},
		{&PushCommit{RequestID: 5, Handle: 4, FileDigest: []byte{1, 2, 3, 4}},
			"01 1b 0000 00000005" + "00000004 00000004 01020304"},
	} {
		want, err := hex.DecodeString(strings.ReplaceAll(tc.hex, " ", ""))
		if err != nil {
			t.Fatal(err)
		}
		if got := mustMarshal(t, tc.m); !bytes.Equal(got, want) {
			t.Errorf("%v:\n got % x\nwant % x", tc.m.Type(), got, want)
		}
	}
}

func TestTruncations(t *testing.T) {
	for _, m := range samples() {
		b := mustMarshal(t, m)
		for i := range len(b) {
			got, err := Unmarshal(b[:i])
			if err == nil {
				t.Fatalf("%v truncated to %d of %d bytes decoded as %+v", m.Type(), i, len(b), got)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("%v truncated to %d: error %v does not wrap ErrMalformed", m.Type(), i, err)
			}
		}
	}
}

func TestTrailingBytes(t *testing.T) {
	for _, m := range samples() {
		b := append(mustMarshal(t, m), 0)
		if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "trailing") {
			t.Errorf("%v with a trailing byte: err = %v", m.Type(), err)
		}
	}
}

func TestVersionMismatch(t *testing.T) {
	for _, v := range []byte{0, 2, 255} {
		b := mustMarshal(t, &Hello{MinVersion: 1, MaxVersion: 1})
		b[0] = v
		_, err := Unmarshal(b)
		if !errors.Is(err, ErrVersion) || errors.Is(err, ErrMalformed) {
			t.Fatalf("version %d: err = %v, want ErrVersion", v, err)
		}
		var ve *VersionError
		if !errors.As(err, &ve) || ve.Got != v {
			t.Fatalf("version %d: err = %#v", v, err)
		}
		h, err := ParseHeader(b)
		if !errors.Is(err, ErrVersion) || h.Version != v || h.Type != TypeHello {
			t.Errorf("ParseHeader: %+v, %v", h, err)
		}
	}
}

func TestParseHeader(t *testing.T) {
	b := mustMarshal(t, &Stat{RequestID: 0xa1b2c3d4, Path: "x"})
	b[len(b)-1] = 0xff // the body does not matter
	h, err := ParseHeader(b)
	if err != nil || h != (Header{Version: 1, Type: TypeStat, RequestID: 0xa1b2c3d4}) {
		t.Errorf("ParseHeader = %+v, %v", h, err)
	}
	// The header of an unknown type parses, so the target can answer it.
	b[1] = 200
	if h, err := ParseHeader(b); err != nil || h.Type != 200 {
		t.Errorf("unknown type: %+v, %v", h, err)
	}
	if _, err := ParseHeader(b[:7]); !errors.Is(err, ErrMalformed) {
		t.Errorf("short header: %v", err)
	}
	big := make([]byte, MaxMessage+1)
	copy(big, b)
	if _, err := ParseHeader(big); !errors.Is(err, ErrMalformed) {
		t.Errorf("oversized message: %v", err)
	}
}

func TestUnknownTypeAndFlags(t *testing.T) {
	for _, ty := range []byte{0, byte(typeMax) + 1, 255} {
		b := mustMarshal(t, &Bye{RequestID: 5})
		b[1] = ty
		_, err := Unmarshal(b)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "unknown message type") {
			t.Errorf("type %d: err = %v", ty, err)
		}
		// The header is there to answer it by.
		var de *DecodeError
		if !errors.As(err, &de) || de.Header.RequestID != 5 || de.Header.Type != Type(ty) || de.Header.Type.Known() {
			t.Errorf("type %d: %#v", ty, err)
		}
	}
	stat := mustMarshal(t, &Stat{RequestID: 6, Path: "x"})
	var de *DecodeError
	if _, err := Unmarshal(stat[:len(stat)-1]); !errors.As(err, &de) || de.Header.RequestID != 6 || !de.Header.Type.Known() {
		t.Errorf("truncated Stat: %#v", err)
	}
	b := mustMarshal(t, &Bye{})
	b[3] = 1
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("flags 1: err = %v", err)
	}
}

func TestBadBool(t *testing.T) {
	b := mustMarshal(t, &CloseReply{Changed: true})
	b[HeaderSize] = 2
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("bool 2: err = %v", err)
	}
	b = mustMarshal(t, &Challenge{AuthRequired: true})
	b[HeaderSize+33] = 0x80
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("Challenge.AuthRequired 0x80: err = %v", err)
	}
	b = mustMarshal(t, &Challenge{Rails: MaxRailAddrs})
	b[len(b)-1] = MaxRailAddrs + 1
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("Challenge.Rails %d: err = %v", MaxRailAddrs+1, err)
	}
}

func TestOversizedCounts(t *testing.T) {
	// A ListReply claiming 2^32-1 entries in a few bytes.
	list := mustMarshal(t, &ListReply{NextCookie: 1, Entries: []Entry{{Name: "a"}}})
	list[HeaderSize+8], list[HeaderSize+9], list[HeaderSize+10], list[HeaderSize+11] = 0xff, 0xff, 0xff, 0xff
	// A MapReply claiming more rkeys than there are bytes for.
	mapr := mustMarshal(t, &MapReply{Window: Window{RKeys: []uint32{1, 2}}})
	mapr[HeaderSize+32+3] = 3
	// Blobs whose length runs past the end.
	open := mustMarshal(t, &OpenReply{FileDigest: []byte{1, 2, 3, 4}})
	open[HeaderSize+14] = 0x7f // FileDigest's length, after Flags
	digests := mustMarshal(t, &DigestsReply{Digests: []byte{1}})
	digests[HeaderSize+8] = 0xff
	// A string longer than what is left.
	stat := mustMarshal(t, &Stat{Path: "abc"})
	stat[HeaderSize+1] = 4

	for name, b := range map[string][]byte{"ListReply": list, "MapReply": mapr, "OpenReply": open, "DigestsReply": digests, "Stat": stat} {
		if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
		// Rejected before allocating for the claimed items: only the
		// message struct and the error remain.
		if n := allocBytes(func() { Unmarshal(b) }); n > 2048 {
			t.Errorf("%s: %d bytes allocated to reject an oversized count", name, n)
		}
	}

	// A count the bytes left could hold, but whose items do not decode:
	// one entry of 65 bytes claimed as two (at least 50).
	two := mustMarshal(t, &ListReply{Entries: []Entry{{Name: strings.Repeat("n", 40)}}})
	two[HeaderSize+11] = 2
	if _, err := Unmarshal(two); !errors.Is(err, ErrMalformed) {
		t.Errorf("two entries in the bytes of one: err = %v", err)
	}
}

// allocBytes is the average number of bytes f allocates.
func allocBytes(f func()) uint64 {
	const runs = 20
	f()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / runs
}

func TestDecodeCopies(t *testing.T) {
	b := mustMarshal(t, &DigestsReply{Digests: []byte{1, 2, 3, 4}})
	m, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if got := m.(*DigestsReply).Digests; !bytes.Equal(got, []byte{1, 2, 3, 4}) {
		t.Errorf("digests alias the receive buffer: %x", got)
	}
}

func TestTooLarge(t *testing.T) {
	dst := []byte("keep")
	long := strings.Repeat("x", MaxString+1)
	for _, m := range []Message{
		&Stat{Path: long},
		&Error{Message: long},
		&ListReply{Entries: []Entry{{Name: "a", Target: long}}},
		&DigestsReply{Digests: make([]byte, MaxMessage)},
		&MapReply{Window: Window{RKeys: make([]uint32, MaxMessage/4)}},
	} {
		out, err := AppendMarshal(dst, m)
		if !errors.Is(err, ErrTooLarge) {
			t.Errorf("%v: err = %v, want ErrTooLarge", m.Type(), err)
		}
		if string(out) != "keep" {
			t.Errorf("%v: dst changed to %d bytes on error", m.Type(), len(out))
		}
	}
	// A message of exactly MaxMessage bytes fits; one more byte does not.
	if b, err := Marshal(&Stat{Path: long[:MaxMessage-HeaderSize-2]}); err != nil || len(b) != MaxMessage {
		t.Errorf("message of MaxMessage bytes: %d bytes, %v", len(b), err)
	}
	if _, err := Marshal(&Stat{Path: long[:MaxMessage-HeaderSize-1]}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("message of MaxMessage+1 bytes: %v", err)
	}
	if _, err := Marshal(nil); err == nil {
		t.Error("Marshal(nil) succeeded")
	}
}

func TestEntrySizePaging(t *testing.T) {
	e := Entry{Type: FileSymlink, Name: "some name", Target: "its target"}
	one := mustMarshal(t, &ListReply{Entries: []Entry{e}})
	if len(one) != ListReplyOverhead+EntrySize(e) {
		t.Fatalf("reply of one entry is %d bytes, want %d", len(one), ListReplyOverhead+EntrySize(e))
	}
	// Fill a page exactly as a target would, then overflow it by one.
	var page []Entry
	size := ListReplyOverhead
	for i := 0; ; i++ {
		e := Entry{Name: strings.Repeat("n", 1+i%200)}
		if size+EntrySize(e) > MaxMessage {
			break
		}
		page = append(page, e)
		size += EntrySize(e)
	}
	b, err := Marshal(&ListReply{Entries: page})
	if err != nil || len(b) != size {
		t.Fatalf("full page: %d bytes (want %d), %v", len(b), size, err)
	}
	page = append(page, Entry{Name: strings.Repeat("n", MaxMessage-size-entryMin+1)})
	if _, err := Marshal(&ListReply{Entries: page}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("page one byte over: err = %v", err)
	}
}

func TestMaxDigestsPerReply(t *testing.T) {
	for _, size := range []int{4, 32} {
		n := MaxDigestsPerReply(size)
		if _, err := Marshal(&DigestsReply{Digests: make([]byte, n*size)}); err != nil {
			t.Errorf("size %d: %d digests do not fit: %v", size, n, err)
		}
		if _, err := Marshal(&DigestsReply{Digests: make([]byte, (n+1)*size)}); !errors.Is(err, ErrTooLarge) {
			t.Errorf("size %d: %d digests fit, so %d is not the most", size, n+1, n)
		}
	}
	if MaxDigestsPerReply(0) != 1<<32-1 {
		t.Error("size 0 is bounded")
	}
}

func TestErrorMessage(t *testing.T) {
	var err error = &Error{Code: CodePermission, Message: "/etc/shadow"}
	if err.Error() != "remote error: permission denied: /etc/shadow" {
		t.Errorf("Error() = %q", err.Error())
	}
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodePermission {
		t.Error("errors.As failed")
	}
	if s := (&Error{Code: 999}).Error(); s != "remote error: error code 999" {
		t.Errorf("unknown code: %q", s)
	}
	for c := CodeNotFound; c <= CodeNoSpace; c++ {
		if strings.HasPrefix(c.String(), "error code") {
			t.Errorf("code %d has no name", c)
		}
	}
	if TypeOpen.String() != "Open" || Type(99).String() != "Type(99)" {
		t.Error("Type.String")
	}
}

func TestMACs(t *testing.T) {
	secret := []byte("secret")
	server, client := nonce(0), nonce(32)
	// Computed independently with Python's hmac module.
	wantClient := "0fecd38b6cc01490d3e97bb70507acbe0b32bb948b714a52dd291bba18309f11"
	wantServer := "9241c07558784101a454794d01563345047816e733555179345c0292c85e6d2c"
	c := ClientMAC(secret, server, client)
	s := ServerMAC(secret, server, client)
	if hex.EncodeToString(c[:]) != wantClient {
		t.Errorf("ClientMAC = %x", c)
	}
	if hex.EncodeToString(s[:]) != wantServer {
		t.Errorf("ServerMAC = %x", s)
	}
	if !CheckMAC(c, ClientMAC(secret, server, client)) {
		t.Error("CheckMAC rejects an equal MAC")
	}
	if CheckMAC(c, s) || CheckMAC(c, ClientMAC([]byte("other"), server, client)) || CheckMAC(c, ClientMAC(secret, client, server)) {
		t.Error("CheckMAC accepts a different MAC")
	}
	if NewNonce() == NewNonce() || NewSession() == NewSession() {
		t.Error("random values repeat")
	}
}

func TestPrivateData(t *testing.T) {
	sess := NewSession()
	for _, p := range []PrivateData{ControlData(), JoinData(sess, 0), JoinData(sess, 65535)} {
		b, err := MarshalPrivate(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != PrivateSize || PrivateSize > MaxPrivate || string(b[:4]) != "RDCP" {
			t.Fatalf("private data % x", b)
		}
		got, err := UnmarshalPrivate(b)
		if err != nil || got != p {
			t.Fatalf("round trip: %+v, %v; want %+v", got, err, p)
		}
		// As padded by the InfiniBand CM.
		padded := append(b, make([]byte, MaxPrivate-PrivateSize)...)
		if got, err := UnmarshalPrivate(padded); err != nil || got != p {
			t.Fatalf("padded: %+v, %v", got, err)
		}
		padded[MaxPrivate-1] = 1
		if _, err := UnmarshalPrivate(padded); !errors.Is(err, ErrMalformed) {
			t.Errorf("non-zero padding: err = %v", err)
		}
		for i := range PrivateSize {
			if _, err := UnmarshalPrivate(b[:i]); !errors.Is(err, ErrMalformed) {
				t.Fatalf("truncated to %d: err = %v", i, err)
			}
		}
	}
	b, _ := MarshalPrivate(JoinData(sess, 3))
	bad := append([]byte(nil), b...)
	bad[0] = 'X'
	if _, err := UnmarshalPrivate(bad); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad magic: err = %v", err)
	}
	bad = append([]byte(nil), b...)
	bad[4] = 2
	var ve *VersionError
	if _, err := UnmarshalPrivate(bad); !errors.As(err, &ve) || ve.Got != 2 {
		t.Errorf("version 2: err = %v", err)
	}
	bad = append([]byte(nil), b...)
	bad[5] = 3
	if _, err := UnmarshalPrivate(bad); !errors.Is(err, ErrMalformed) {
		t.Errorf("kind 3: err = %v", err)
	}
	if _, err := MarshalPrivate(PrivateData{Kind: KindData}); !errors.Is(err, ErrMalformed) {
		t.Errorf("marshal without magic: err = %v", err)
	}
}

func TestPushWindowOverhead(t *testing.T) {
	for _, m := range samples() {
		if w, ok := m.(*PushWindow); ok {
			if n := len(mustMarshal(t, w)); n != PushWindowOverhead(len(w.Window.RKeys))+len(w.Digests) {
				t.Errorf("PushWindow: %d bytes, PushWindowOverhead says %d", n, PushWindowOverhead(len(w.Window.RKeys))+len(w.Digests))
			}
		}
	}
}

func TestPackSizes(t *testing.T) {
	for _, m := range samples() {
		switch m := m.(type) {
		case *Pack:
			if n := len(mustMarshal(t, m)); n != PackSize(m.Paths) {
				t.Errorf("Pack: %d bytes, PackSize says %d", n, PackSize(m.Paths))
			}
		case *PackReply:
			want := PackReplyOverhead(len(m.Window.RKeys))
			for _, f := range m.Files {
				want += PackedFileSize(f)
			}
			if n := len(mustMarshal(t, m)); n != want {
				t.Errorf("PackReply: %d bytes, sizes say %d", n, want)
			}
		case *WalkBatch:
			want := WalkBatchOverhead(len(m.Window.RKeys))
			for i := range m.Entries {
				want += WalkEntrySize(&m.Entries[i])
			}
			if n := len(mustMarshal(t, m)); n != want {
				t.Errorf("WalkBatch: %d bytes, sizes say %d", n, want)
			}
		}
	}
}

func TestFeatures(t *testing.T) {
	if c := ClientString("rdmacp", FeatureMeta); c != "rdmacp +meta" {
		t.Errorf("ClientString = %q", c)
	}
	if c := ClientString("rdmacp/0.1"); c != "rdmacp/0.1" {
		t.Errorf("ClientString without features = %q", c)
	}
	for client, want := range map[string]bool{
		"rdmacp +meta":          true,
		"rdmacp +x +meta":       true,
		"rdmacp  +meta\t":       true,
		"rdmacp":                false, // no wishes
		"rdmacp/0.1":            false,
		"rdmacp meta":           false, // a token is +NAME
		"rdmacp +metax":         false,
		"+meta":                 false, // the software's name, not a feature
		"":                      false,
		"rdmacp +meta-extended": false,
	} {
		if got := HasFeature(client, FeatureMeta); got != want {
			t.Errorf("HasFeature(%q) = %v, want %v", client, got, want)
		}
	}
}
