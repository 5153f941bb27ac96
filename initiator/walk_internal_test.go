package initiator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

func wEntry(dir uint32, typ protocol.FileType, name string) protocol.WalkEntry {
	return protocol.WalkEntry{Dir: dir, PackedFile: protocol.PackedFile{Entry: protocol.Entry{Type: typ, Name: name}}}
}

func wDir(dir uint32, name string) protocol.WalkEntry {
	return wEntry(dir, protocol.FileDir, name)
}

func wFile(dir uint32, name string) protocol.WalkEntry {
	return wEntry(dir, protocol.FileRegular, name)
}

// wPacked is a packed file of size bytes at off, with a CRC32C-sized digest.
func wPacked(dir uint32, name string, off, size uint64) protocol.WalkEntry {
	e := wFile(dir, name)
	e.Packed, e.Offset, e.Entry.Size, e.Digest = true, off, size, []byte{1, 2, 3, 4}
	return e
}

func wFailed(e protocol.WalkEntry, code protocol.Code) protocol.WalkEntry {
	e.Code, e.Message = code, "it failed"
	return e
}

func wBatch(done bool, length uint64, ents ...protocol.WalkEntry) *protocol.WalkBatch {
	b := &protocol.WalkBatch{Handle: 1, Done: done, Entries: ents}
	if length > 0 {
		b.Window = protocol.Window{ID: 9, Length: length, Addr: 1 << 30, RKeys: []uint32{5, 6}}
	}
	return b
}

const (
	trackQPs    = 2
	trackWindow = 1 << 20
)

// trackAll runs batches through one walkTrack, as a walk would.
func trackAll(t *testing.T, batches ...*protocol.WalkBatch) ([]Walked, error) {
	t.Helper()
	tr := newWalkTrack("data/t")
	var all []Walked
	for i, b := range batches {
		ws, err := tr.batch(b, trackQPs, trackWindow, chunker.CRC32C)
		if err != nil {
			return all, fmt.Errorf("batch %d: %w", i, err)
		}
		if len(ws) != len(b.Entries) {
			t.Fatalf("batch %d: %d walked for %d entries", i, len(ws), len(b.Entries))
		}
		all = append(all, ws...)
	}
	return all, nil
}

// Batches that add up: each entry's path from its Dir number, across
// batches, a directory's entries going on after a subdirectory's.
func TestWalkTrackPaths(t *testing.T) {
	ws, err := trackAll(t,
		wBatch(false, 0, wDir(0, "a"), wFile(1, "x"), wDir(1, "b"), wFile(2, "y")), // a 1, b 2
		wBatch(false, 30, wPacked(2, "p", 0, 10), wFile(1, "z"), wDir(1, "empty"), // empty 3
			wPacked(0, "c", 10, 20), wDir(0, "d"), wPacked(4, "zero", 30, 0)), // d 4
		wBatch(false, 0, wFile(4, "w"), wDir(4, "e"), wFile(5, "v"), wFile(4, "u"), wFile(0, "f")), // e 5
		wBatch(true, 0),
	)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "a/x", "a/b", "a/b/y", "a/b/p", "a/z", "a/empty", "c", "d", "d/zero", "d/w", "d/e", "d/e/v", "d/u", "f"}
	var got []string
	for _, w := range ws {
		got = append(got, w.Item.Rel)
		if w.Item.Err != nil {
			t.Errorf("%s: %v", w.Item.Rel, w.Item.Err)
		}
		if packed := w.Item.Entry.Name == "p" || w.Item.Entry.Name == "c" || w.Item.Entry.Name == "zero"; w.Packed != packed {
			t.Errorf("%s: packed %v", w.Item.Rel, w.Packed)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("paths\n%q\nwant\n%q", got, want)
	}
}

// A batch that does not add up is an error, wrapping ErrMalformed.
func TestWalkTrackMalformed(t *testing.T) {
	ok := wBatch(false, 0, wDir(0, "a"), wDir(1, "b"), wFile(2, "x")) // a 1, b 2
	packedAs := func(e protocol.WalkEntry) protocol.WalkEntry {
		e.Packed, e.Digest = true, []byte{1, 2, 3, 4}
		return e
	}
	badWindow := func(mod func(*protocol.Window)) *protocol.WalkBatch {
		b := wBatch(false, 10, wPacked(0, "f", 0, 10))
		mod(&b.Window)
		return b
	}
	for _, tc := range []struct {
		name    string
		batches []*protocol.WalkBatch
	}{
		{"window offset", []*protocol.WalkBatch{badWindow(func(w *protocol.Window) { w.Offset = 4096 })}},
		{"window past max", []*protocol.WalkBatch{badWindow(func(w *protocol.Window) { w.Length = trackWindow + 1 })}},
		{"a key short", []*protocol.WalkBatch{badWindow(func(w *protocol.Window) { w.RKeys = w.RKeys[:1] })}},
		{"no keys", []*protocol.WalkBatch{badWindow(func(w *protocol.Window) { w.RKeys = nil })}},
		{"empty, not done", []*protocol.WalkBatch{ok, wBatch(false, 0)}},
		{"unknown dir", []*protocol.WalkBatch{wBatch(false, 0, wFile(1, "f"))}},
		{"dir not yet sent", []*protocol.WalkBatch{ok, wBatch(false, 0, wFile(3, "f"))}},
		{"dir number past 32 bits", []*protocol.WalkBatch{wBatch(false, 0, wFile(1<<32-1, "f"))}},
		{"back in a dir left", []*protocol.WalkBatch{wBatch(false, 0, wDir(0, "a"), wFile(1, "x"), wFile(0, "c"), wFile(1, "late"))}},
		{"back in a dir left, next batch", []*protocol.WalkBatch{ok, wBatch(false, 0, wFile(1, "y"), wFile(2, "late"))}},
		{"back in a sibling", []*protocol.WalkBatch{ok, wBatch(false, 0, wDir(1, "c"), wFile(3, "y"), wFile(2, "late"))}},
		{"packed past the window", []*protocol.WalkBatch{wBatch(false, 10, wPacked(0, "f", 11, 0))}},
		{"packed across the window's end", []*protocol.WalkBatch{wBatch(false, 10, wPacked(0, "f", 5, 6))}},
		{"packed size wraps", []*protocol.WalkBatch{wBatch(false, 10, wPacked(0, "f", 1, 1<<64-1))}},
		{"packed with no window", []*protocol.WalkBatch{wBatch(false, 0, wPacked(0, "f", 0, 1))}},
		{"packed digest size", []*protocol.WalkBatch{wBatch(false, 10, func() protocol.WalkEntry {
			e := wPacked(0, "f", 0, 10)
			e.Digest = e.Digest[:2]
			return e
		}())}},
		{"packed dir", []*protocol.WalkBatch{wBatch(false, 10, packedAs(wDir(0, "d")))}},
		{"packed symlink", []*protocol.WalkBatch{wBatch(false, 10, packedAs(wEntry(0, protocol.FileSymlink, "l")))}},
		{"packed and failed", []*protocol.WalkBatch{wBatch(false, 10, wFailed(wPacked(0, "f", 0, 10), protocol.CodePermission))}},
	} {
		_, err := trackAll(t, tc.batches...)
		if !errors.Is(err, protocol.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", tc.name, err)
		}
	}
}

// Names that are not one path element, names a directory sent twice and
// whatever is under a directory refused or failed come back refused, as
// items with err; the rest of the walk goes on.
func TestWalkTrackRefuses(t *testing.T) {
	type want struct {
		rel  string
		bad  string // in err's text; "" for none
		code protocol.Code
	}
	for _, tc := range []struct {
		name    string
		batches []*protocol.WalkBatch
		want    []want
	}{
		{"names", []*protocol.WalkBatch{wBatch(true, 0,
			wFile(0, ""), wFile(0, "."), wFile(0, "a/b"), wFile(0, "/"), wFile(0, "x\x00y"), wFile(0, "ok"))},
			[]want{{`""`, "refused name", 0}, {`"."`, "refused name", 0}, {`"a/b"`, "refused name", 0}, {`"/"`, "refused name", 0},
				{`"x\x00y"`, "refused name", 0}, {"ok", "", 0}}},
		{"a dir named ..", []*protocol.WalkBatch{wBatch(false, 10, wDir(0, ".."), wFile(1, "passwd"), wDir(1, "etc"), wPacked(2, "shadow", 0, 10)),
			wBatch(true, 0, wFile(0, "ok"))},
			[]want{{`".."`, "refused name", 0}, {`".."/passwd`, "could not be read", 0}, {`".."/etc`, "could not be read", 0},
				{`".."/etc/shadow`, "could not be read", 0}, {"ok", "", 0}}},
		{"a file twice", []*protocol.WalkBatch{wBatch(false, 0, wFile(0, "f")), wBatch(true, 10, wPacked(0, "f", 0, 10), wFile(0, "g"))},
			[]want{{"f", "", 0}, {"f", "listed twice", 0}, {"g", "", 0}}},
		{"a dir twice", []*protocol.WalkBatch{wBatch(true, 0, wDir(0, "d"), wFile(1, "x"), wDir(0, "d"), wFile(2, "y"), wFile(0, "z"))},
			[]want{{"d", "", 0}, {"d/x", "", 0}, {"d", "listed twice", 0}, {"d/y", "could not be read", 0}, {"z", "", 0}}},
		{"a name in two dirs", []*protocol.WalkBatch{wBatch(true, 0, wDir(0, "f"), wFile(1, "f"), wDir(1, "f"), wFile(2, "f"), wFile(0, "g"))},
			[]want{{"f", "", 0}, {"f/f", "", 0}, {"f/f", "listed twice", 0}, {"f/f/f", "could not be read", 0}, {"g", "", 0}}},
		{"a dir that failed", []*protocol.WalkBatch{wBatch(false, 0, wFailed(wDir(0, "d"), protocol.CodePermission), wFile(1, "x"), wDir(1, "e")),
			wBatch(true, 10, wPacked(2, "y", 0, 10), wFile(0, "ok"))},
			[]want{{"d", "data/t/d", protocol.CodePermission}, {"d/x", "could not be read", 0}, {"d/e", "could not be read", 0},
				{"d/e/y", "could not be read", 0}, {"ok", "", 0}}},
		{"a file that failed", []*protocol.WalkBatch{wBatch(true, 0, wFailed(wFile(0, "f"), protocol.CodeChanged), wFile(0, "g"))},
			[]want{{"f", "data/t/f", protocol.CodeChanged}, {"g", "", 0}}},
	} {
		ws, err := trackAll(t, tc.batches...)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if len(ws) != len(tc.want) {
			t.Errorf("%s: %d walked, want %d", tc.name, len(ws), len(tc.want))
			continue
		}
		for i, w := range tc.want {
			g := ws[i]
			switch {
			case g.Item.Rel != w.rel:
				t.Errorf("%s: entry %d at %q, want %q", tc.name, i, g.Item.Rel, w.rel)
			case w.bad == "" && g.Item.Err != nil, w.bad != "" && (g.Item.Err == nil || !strings.Contains(g.Item.Err.Error(), w.bad)):
				t.Errorf("%s: %s: %v, want %q", tc.name, w.rel, g.Item.Err, w.bad)
			case w.bad == "refused name" && !errors.Is(g.Item.Err, ErrName), w.bad == "listed twice" && !errors.Is(g.Item.Err, ErrName):
				t.Errorf("%s: %s: %v is not ErrName", tc.name, w.rel, g.Item.Err)
			case g.Item.Err != nil && g.Packed:
				t.Errorf("%s: %s refused but packed", tc.name, w.rel)
			}
			var pe *protocol.Error
			if w.code != 0 && (!errors.As(g.Item.Err, &pe) || pe.Code != w.code) {
				t.Errorf("%s: %s: %v, want code %v", tc.name, w.rel, g.Item.Err, w.code)
			}
		}
	}
}

// fakeTarget connects a session's control channel to one the test
// answers on by hand; the session has no data QPs.
func fakeTarget(t *testing.T) (*Session, *protocol.Channel) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev := func() verbs.Device {
		d, err := iwarp.New(iwarp.Config{}).Open(context.Background(), verbs.DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	tdev, idev := dev(), dev()
	ln, err := tdev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	tpd, _ := tdev.AllocPD()
	tch, err := protocol.NewChannel(tdev, tpd, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tch.Close() })
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			accepted <- err
			return
		}
		pq, err := req.Prepare(tpd, tch.QPConfig())
		if err == nil {
			err = tch.PostRecvs(pq)
		}
		if err != nil {
			accepted <- err
			return
		}
		qp, err := pq.Connect(ctx, verbs.ConnParam{})
		if err == nil {
			tch.Attach(qp)
		}
		accepted <- err
	}()
	ipd, _ := idev.AllocPD()
	ich, err := protocol.NewChannel(idev, ipd, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ich.Close() })
	pq, err := idev.PrepareDial(ctx, ipd, ln.Addr(), ich.QPConfig())
	if err != nil {
		t.Fatal(err)
	}
	ich.PostRecvs(pq)
	qp, err := pq.Connect(ctx, verbs.ConnParam{})
	if err != nil {
		t.Fatal(err)
	}
	ich.Attach(qp)
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	s := &Session{ch: ich, ch0: &protocol.Challenge{MaxWindow: trackWindow}, cfg: Config{Logger: slog.New(slog.DiscardHandler)}}
	return s, tch
}

// answer receives the session's next request, which must be a T, and
// answers it with what reply makes of it.
func answer[T protocol.Message](t *testing.T, ch *protocol.Channel, reply func(T) protocol.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := ch.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req, ok := m.(T)
	if !ok {
		t.Fatalf("got %T %+v, want a %T", m, m, req)
	}
	r := reply(req)
	r.SetID(m.ID())
	if err := ch.Send(ctx, r); err != nil {
		t.Fatal(err)
	}
}

func tooMany() *protocol.Error {
	return &protocol.Error{Code: protocol.CodeTooMany, Message: "window budget in use"}
}

// A WalkNext answered TooMany has had its Release freed by the target all
// the same: sent again, it must not name that window (which the target
// would refuse, BadRequest), but may release one the walk is done with
// since.
func TestWalkCallRetriesWithoutItsRelease(t *testing.T) {
	s, tch := fakeTarget(t)
	done := make(chan error, 1)
	free := []uint32{8} // what the walk is done with by the second try
	go func() {
		b, _, err := s.walkCall(context.Background(), &protocol.WalkNext{Handle: 4, Release: 7, MaxEntries: 9}, func() uint32 {
			if len(free) == 0 {
				return 0
			}
			r := free[0]
			free = free[1:]
			return r
		})
		if err == nil && (b.Handle != 4 || !b.Done) {
			err = fmt.Errorf("batch %+v", b)
		}
		done <- err
	}()
	releases := []uint32{7, 8, 0}
	for i, want := range releases {
		answer(t, tch, func(m *protocol.WalkNext) protocol.Message {
			if m.Release != want || m.Handle != 4 || m.MaxEntries != 9 {
				t.Errorf("try %d: %+v, want release %d", i, m, want)
			}
			if i < len(releases)-1 {
				return tooMany()
			}
			return &protocol.WalkBatch{Handle: 4, Done: true}
		})
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// walk sends the fields it was given, doubles the batches it asks for,
// and on a batch that does not add up stops with ErrMalformed and closes
// the walk, once the WalkNext it had sent is answered.
func TestWalkStopsOnABadBatch(t *testing.T) {
	s, tch := fakeTarget(t)
	s.cfg.Algorithm = chunker.BLAKE3
	var got [][]string
	done := make(chan error, 1)
	go func() {
		done <- s.Walk(context.Background(), "data/t", 1000, Shard{I: 1, N: 3}, nil, func(ws []Walked) error {
			var rels []string
			for _, w := range ws {
				rels = append(rels, w.Item.Rel)
			}
			got = append(got, rels)
			return nil
		})
	}()
	answer(t, tch, func(m *protocol.Walk) protocol.Message {
		want := protocol.Walk{RequestID: m.RequestID, Algorithm: uint8(chunker.BLAKE3), MaxEntries: walkFirst, ShardI: 1, ShardN: 3, PackMax: 1000, Path: "data/t"}
		if !reflect.DeepEqual(*m, want) {
			t.Errorf("walk %+v, want %+v", *m, want)
		}
		return tooMany() // tried again
	})
	answer(t, tch, func(m *protocol.Walk) protocol.Message {
		return wBatch(false, 0, wDir(0, "a"), wFile(1, "x"))
	})
	answer(t, tch, func(m *protocol.WalkNext) protocol.Message {
		if m.Handle != 1 || m.Release != 0 || m.MaxEntries != 2*walkFirst {
			t.Errorf("first next %+v", m)
		}
		return wBatch(false, 0, wFile(1, "y"), wFile(0, "b"))
	})
	answer(t, tch, func(m *protocol.WalkNext) protocol.Message {
		if m.Handle != 1 || m.MaxEntries != 4*walkFirst {
			t.Errorf("second next %+v", m)
		}
		return wBatch(false, 0, wFile(1, "late")) // a has been left
	})
	// A batch is checked as it comes, before the next is asked for: the
	// walk stops at the bad one, with a Close.
	answer(t, tch, func(m *protocol.Close) protocol.Message {
		if m.Handle != 1 {
			t.Errorf("close %+v", m)
		}
		return &protocol.CloseReply{}
	})
	err := <-done
	if !errors.Is(err, protocol.ErrMalformed) {
		t.Fatalf("walk: %v, want ErrMalformed", err)
	}
	if want := "[[a a/x] [a/y b]]"; fmt.Sprint(got) != want {
		t.Errorf("batches %v, want %s", got, want)
	}
}

// The next batch is asked for as soon as a batch's reply comes, not once
// fn has written the batch before: while fn still writes the first batch,
// the target is asked for the second and then the third, so that it is
// not left idle while the initiator writes (docs/performance.md, "Small
// files", round 5).
func TestWalkAsksAhead(t *testing.T) {
	s, tch := fakeTarget(t)
	asked := make(chan struct{}) // closed once the third batch is asked for
	var got [][]string
	done := make(chan error, 1)
	go func() {
		done <- s.Walk(context.Background(), "data/t", 0, Shard{}, nil, func(ws []Walked) error {
			var rels []string
			for _, w := range ws {
				rels = append(rels, w.Item.Rel)
			}
			got = append(got, rels)
			if len(got) == 1 {
				select { // bounded: the test fails first, waiting for the third ask
				case <-asked:
				case <-time.After(10 * time.Second):
					return errors.New("the third batch was not asked for while the first was written")
				}
			}
			return nil
		})
	}()
	answer(t, tch, func(m *protocol.Walk) protocol.Message { return wBatch(false, 0, wDir(0, "a")) })
	answer(t, tch, func(m *protocol.WalkNext) protocol.Message { return wBatch(false, 0, wFile(1, "x")) })
	answer(t, tch, func(m *protocol.WalkNext) protocol.Message {
		close(asked) // fn is still in the first batch
		return wBatch(true, 0, wFile(1, "y"), wFile(0, "b"))
	})
	answer(t, tch, func(m *protocol.Close) protocol.Message { return &protocol.CloseReply{} })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := "[[a] [a/x] [a/y b]]"; fmt.Sprint(got) != want {
		t.Errorf("batches %v, want %v", got, want)
	}
}

// The walk asks ahead only so far: while fn holds the first batch, the
// second waits in the other sink, the third to be READ, the fourth to be
// taken for it, and the fifth is asked for; no sixth is asked for until
// fn lets a batch go (walkPipe's bound).
func TestWalkAsksAheadBounded(t *testing.T) {
	s, tch := fakeTarget(t)
	hold := make(chan struct{})
	batches := 0
	done := make(chan error, 1)
	go func() {
		done <- s.Walk(context.Background(), "data/t", 0, Shard{}, nil, func(ws []Walked) error {
			if batches++; batches == 1 {
				select { // bounded: the test ends it sooner
				case <-hold:
				case <-time.After(10 * time.Second):
					return errors.New("held too long")
				}
			}
			return nil
		})
	}()
	answer(t, tch, func(m *protocol.Walk) protocol.Message { return wBatch(false, 0, wDir(0, "a")) })
	for i := range 4 {
		answer(t, tch, func(m *protocol.WalkNext) protocol.Message {
			return wBatch(false, 0, wFile(1, fmt.Sprint("f", i)))
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	m, err := tch.Recv(ctx) // a sixth batch asked for while fn holds the first
	cancel()
	if err == nil {
		t.Fatalf("%T %+v asked for while fn held the first of 5 batches", m, m)
	}
	close(hold)
	answer(t, tch, func(m *protocol.WalkNext) protocol.Message { return wBatch(true, 0, wFile(1, "last")) })
	answer(t, tch, func(m *protocol.Close) protocol.Message { return &protocol.CloseReply{} })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if batches != 6 {
		t.Errorf("%d batches, want 6", batches)
	}
}
