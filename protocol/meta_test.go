package protocol

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

var sampleMeta = &Meta{UID: 12345, GID: 65534, User: "alice", Group: "nogroup", Dev: 0x803, Ino: 1 << 40, Nlink: 2,
	Xattrs: []Xattr{{Name: "user.mime_type", Value: []byte("text/plain")}, {Name: "system.posix_acl_access", Value: []byte{2, 0, 0, 0}}}}

// metaSamples are the messages that carry entries, each with Metas.
func metaSamples() []Message {
	e := sampleEntry
	e.Meta = sampleMeta
	dir := Entry{Type: FileDir, Mode: 0o1777, Name: "tmp", Meta: &Meta{UID: 0, Nlink: 3, Flags: MetaXattrsOmitted}}
	return []Message{
		&StatReply{RequestID: 4, Entry: e},
		&OpenReply{RequestID: 5, Handle: 77, ChunkSize: 4 << 20, Algorithm: 1, Chunks: 3, FileDigest: []byte{1, 2}, Entry: e},
		&ListReply{RequestID: 3, Entries: []Entry{e, dir}},
		&PackReply{RequestID: 11, Handle: 78, Window: Window{ID: 6, Length: 9, Addr: 0x1000, RKeys: []uint32{9}},
			Files: []PackedFile{{Digest: []byte{1, 2, 3, 4}, Entry: e}, {Code: CodeNotFound, Entry: dir, Message: "gone"}}},
		&WalkBatch{RequestID: 13, Handle: 80, Done: true, Entries: []WalkEntry{
			{Dir: 0, Packed: true, PackedFile: PackedFile{Entry: e}}, {Dir: 1, PackedFile: PackedFile{Entry: dir}}}},
	}
}

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range metaSamples() {
		b := mustMarshal(t, m)
		if h, _ := ParseHeader(b); h.Flags != FlagMeta {
			t.Errorf("%v: flags %#x, want FlagMeta", m.Type(), h.Flags)
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("%v: %v", m.Type(), err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%v: round trip\n got %+v\nwant %+v", m.Type(), got, m)
		}
	}
}

// A message without Metas is byte for byte what it was before Meta, so
// an older peer reads it.
func TestNoMetaUnchanged(t *testing.T) {
	b := mustMarshal(t, &StatReply{RequestID: 4, Entry: sampleEntry})
	if h, _ := ParseHeader(b); h.Flags != 0 {
		t.Fatalf("flags %#x without Meta", h.Flags)
	}
	if n := len(b) - HeaderSize; n != EntrySize(sampleEntry) {
		t.Errorf("body %d bytes, EntrySize %d", n, EntrySize(sampleEntry))
	}
}

// A nil Meta among others encodes as a zero one, so sizes stay right
// only if the target fills them all; a zero one decodes as such.
func TestMetaNilAmongOthers(t *testing.T) {
	e := sampleEntry
	e.Meta = sampleMeta
	m := &ListReply{Entries: []Entry{e, sampleEntry}}
	got, err := Unmarshal(mustMarshal(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if z := got.(*ListReply).Entries[1].Meta; z == nil || !reflect.DeepEqual(*z, Meta{}) {
		t.Errorf("nil Meta came back as %+v", z)
	}
}

func TestMetaSizes(t *testing.T) {
	e := sampleEntry
	e.Meta = sampleMeta
	b := mustMarshal(t, &StatReply{Entry: e})
	if n := len(b) - HeaderSize; n != EntrySize(e) {
		t.Errorf("body %d bytes, EntrySize %d", n, EntrySize(e))
	}
	f := PackedFile{Digest: []byte{1, 2, 3}, Entry: e, Message: "m"}
	b = mustMarshal(t, &PackReply{Files: []PackedFile{f}})
	if n := len(b) - PackReplyOverhead(0); n != PackedFileSize(f) {
		t.Errorf("packed file %d bytes, PackedFileSize %d", n, PackedFileSize(f))
	}
	w := WalkEntry{PackedFile: f}
	b = mustMarshal(t, &WalkBatch{Entries: []WalkEntry{w}})
	if n := len(b) - WalkBatchOverhead(0); n != WalkEntrySize(&w) {
		t.Errorf("walk entry %d bytes, WalkEntrySize %d", n, WalkEntrySize(&w))
	}
}

func TestMetaRefused(t *testing.T) {
	// FlagMeta on a message without entries.
	b := mustMarshal(t, &Stat{Path: "x"})
	b[3] = byte(FlagMeta)
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("Stat with FlagMeta: %v", err)
	}
	b = mustMarshal(t, &ListReply{})
	b[3] = byte(FlagMeta)
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty ListReply with FlagMeta: %v", err)
	}
	// Unknown Meta flags.
	e := sampleEntry
	e.Meta = &Meta{Flags: 0x80}
	b = mustMarshal(t, &StatReply{Entry: e})
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "meta flags") {
		t.Errorf("meta flags 0x80: %v", err)
	}
	// Xattrs over MaxXattrBytes.
	e.Meta = &Meta{Xattrs: []Xattr{{Name: "user.a", Value: bytes.Repeat([]byte{1}, MaxXattrBytes)}}}
	b = mustMarshal(t, &StatReply{Entry: e})
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "over") {
		t.Errorf("xattrs over the bound: %v", err)
	}
	// A count of xattrs the bytes left cannot hold.
	e.Meta = &Meta{Xattrs: []Xattr{{Name: "user.a"}}}
	b = mustMarshal(t, &StatReply{Entry: e})
	b[len(b)-4-len("user.a")-2-2] = 0xff // the count's high byte: before the name's length, the name and the value's length
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("oversized xattr count: %v", err)
	}
}

func TestMetaFeatures(t *testing.T) {
	c := ClientString("rdmacp", FeatureMeta, FeatureXattrs)
	if !HasFeature(c, FeatureMeta) || !HasFeature(c, FeatureXattrs) || HasFeature("rdmacp +xattrs", FeatureMeta) {
		t.Errorf("features of %q", c)
	}
}

func FuzzUnmarshalMeta(f *testing.F) {
	for _, m := range metaSamples() {
		b, err := Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v wraps neither ErrMalformed nor ErrVersion", err)
			}
			return
		}
		b2, err := Marshal(m)
		if err != nil {
			t.Fatalf("decoded %+v but cannot encode it: %v", m, err)
		}
		if !bytes.Equal(b, b2) {
			t.Fatalf("re-encoding differs:\n in % x\nout % x", b, b2)
		}
	})
}
