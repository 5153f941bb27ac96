package target_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

// walkOrder is the walk order of the tree at root: depth first, each
// directory's entries sorted by name.
func walkOrder(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	var walk func(rel string)
	walk = func(rel string) {
		ents, err := os.ReadDir(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			r := path.Join(rel, e.Name())
			out = append(out, r)
			if e.IsDir() {
				walk(r)
			}
		}
	}
	walk("")
	return out
}

// walkTree makes n small files under root in a few directories, a file
// too large to pack, an empty one and a symlink; it returns the regular
// files' contents.
func walkTree(t *testing.T, root string, n int) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	put := func(rel string, b []byte) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[rel] = b
	}
	for i := range n {
		put(fmt.Sprintf("d%d/f%03d", i%5, i), bytes.Repeat([]byte{byte(i)}, i*37%900+1))
	}
	put("big", bytes.Repeat([]byte("big"), 4000))
	put("empty", nil)
	os.MkdirAll(filepath.Join(root, "d2", "nothing"), 0o755)
	os.Symlink("d0/f000", filepath.Join(root, "link"))
	return files
}

// walkState follows a walk over the wire as an initiator would.
type walkState struct {
	p     *peer
	files map[string][]byte // regular files: what packed ones must hold
	dirs  []string          // by Dir number
	rels  []string          // in the order they came
	// changed: files expected to come with CodeChanged, and those that did.
	changed, sawChanged map[string]bool
}

func newWalkState(p *peer, files map[string][]byte) *walkState {
	return &walkState{p: p, files: files, dirs: []string{""}}
}

// take checks batch b, READs its window and checks each packed file's
// bytes and digest.
func (ws *walkState) take(b *protocol.WalkBatch, maxEntries int) {
	t := ws.p.t
	t.Helper()
	if len(b.Entries) == 0 && !b.Done || len(b.Entries) > maxEntries {
		t.Fatalf("batch of %d entries (done %v), want 1 to %d", len(b.Entries), b.Done, maxEntries)
	}
	var window []byte
	if n := b.Window.Length; n > 0 {
		if len(b.Window.RKeys) != 1 || b.Window.Offset != 0 || n > uint64(len(ws.p.buf)) {
			t.Fatalf("window %+v", b.Window)
		}
		if st := ws.p.read(b.Window.Addr, b.Window.RKeys[0], uint32(n)); st != verbs.StatusSuccess {
			t.Fatalf("READ of the batch's window: %v", st)
		}
		window = bytes.Clone(ws.p.buf[:n])
	} else if b.Window.ID != 0 || len(b.Window.RKeys) != 0 {
		t.Errorf("window %+v with no bytes", b.Window)
	}
	for _, e := range b.Entries {
		if int(e.Dir) >= len(ws.dirs) {
			t.Fatalf("%q in directory %d of %d", e.Entry.Name, e.Dir, len(ws.dirs)-1)
		}
		rel := path.Join(ws.dirs[e.Dir], e.Entry.Name)
		if e.Entry.Type == protocol.FileDir {
			ws.dirs = append(ws.dirs, rel)
		}
		ws.rels = append(ws.rels, rel)
		if e.Code != 0 {
			if ws.changed[rel] && e.Code == protocol.CodeChanged && !e.Packed {
				ws.sawChanged[rel] = true
				continue
			}
			t.Errorf("%s: %v %s", rel, e.Code, e.Message)
			continue
		}
		want, regular := ws.files[rel]
		small := regular && len(want) <= 4096
		if e.Packed != small {
			t.Errorf("%s (%d bytes): packed %v", rel, len(want), e.Packed)
			continue
		}
		if !e.Packed {
			if e.Offset != 0 || len(e.Digest) != 0 {
				t.Errorf("%s: not packed, at %d with digest %x", rel, e.Offset, e.Digest)
			}
			continue
		}
		if e.Entry.Size != uint64(len(want)) || e.Offset+e.Entry.Size > uint64(len(window)) {
			t.Errorf("%s: %d bytes at %d of a %d-byte window, want %d bytes", rel, e.Entry.Size, e.Offset, len(window), len(want))
			continue
		}
		if got := window[e.Offset : e.Offset+e.Entry.Size]; !bytes.Equal(got, want) {
			t.Errorf("%s: packed bytes differ", rel)
		}
		if !bytes.Equal(e.Digest, chunker.Sum(chunker.CRC32C, want)) {
			t.Errorf("%s: digest %x, want %x", rel, e.Digest, chunker.Sum(chunker.CRC32C, want))
		}
	}
}

func walkCode(t *testing.T, err error, want protocol.Code, what string) {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != want {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

func walkConfig(dir string) target.Config {
	return target.Config{Exports: []target.Export{{Name: "data", Path: dir}}, ChunkSize: 4096, MaxWindow: 64 << 10}
}

// A walk over the wire, a few entries at a time: every entry once, in
// order, each packed file's bytes and digest as on disk; each batch's
// window freed with the next WalkNext (two windows are all the session
// may have), and bad WalkNexts refused without losing the walk's place.
func TestWalkBatches(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "t")
	files := walkTree(t, root, 100)
	cfg := walkConfig(dir)
	cfg.MaxWindowsPerSession = 2
	addr := serve(t, cfg)
	p := newPeer(t, addr)
	const max = 7
	m, err := p.call(&protocol.Walk{Algorithm: uint8(chunker.CRC32C), MaxEntries: max, PackMax: 4096, Path: "data/t"})
	if err != nil {
		t.Fatal(err)
	}
	b := m.(*protocol.WalkBatch)
	h := b.Handle
	ws := newWalkState(p, files)
	batches := 0
	for {
		batches++
		if b.Handle != h {
			t.Fatalf("batch of walk %d, want %d", b.Handle, h)
		}
		ws.take(b, max)
		if b.Done {
			break
		}
		if batches == 3 {
			_, err := p.call(&protocol.WalkNext{Handle: h, Release: 9999, MaxEntries: max})
			walkCode(t, err, protocol.CodeBadRequest, "release of no window")
			_, err = p.call(&protocol.WalkNext{Handle: h + 1, MaxEntries: max})
			walkCode(t, err, protocol.CodeBadRequest, "next of no walk")
		}
		m, err := p.call(&protocol.WalkNext{Handle: h, Release: b.Window.ID, MaxEntries: max})
		if err != nil {
			t.Fatalf("batch %d: %v", batches+1, err)
		}
		b = m.(*protocol.WalkBatch)
	}
	if want := walkOrder(t, root); !slices.Equal(ws.rels, want) {
		t.Fatalf("walked\n%q\nwant\n%q", ws.rels, want)
	}
	if batches < len(ws.rels)/max {
		t.Errorf("%d entries in %d batches of at most %d", len(ws.rels), batches, max)
	}
	m, err = p.call(&protocol.Close{Handle: h})
	if err != nil || m.(*protocol.CloseReply).Changed {
		t.Fatalf("close: %v %v", m, err)
	}
	_, err = p.call(&protocol.WalkNext{Handle: h})
	walkCode(t, err, protocol.CodeBadRequest, "next of a closed walk")
}

// The walk's handle is not a file's, and closing it kills its windows'
// keys.
func TestWalkClose(t *testing.T) {
	dir := t.TempDir()
	files := walkTree(t, filepath.Join(dir, "t"), 10)
	addr := serve(t, walkConfig(dir))
	p := newPeer(t, addr)
	m, err := p.call(&protocol.Walk{MaxEntries: 4, PackMax: 4096, Path: "data/t"})
	if err != nil {
		t.Fatal(err)
	}
	b := m.(*protocol.WalkBatch)
	newWalkState(p, files).take(b, 4)
	if b.Window.Length == 0 {
		t.Fatalf("first batch packed nothing: %+v", b)
	}
	_, err = p.call(&protocol.Map{Handle: b.Handle, Length: 4096})
	walkCode(t, err, protocol.CodeBadRequest, "map of a walk")
	_, err = p.call(&protocol.Digests{Handle: b.Handle, Count: 1})
	walkCode(t, err, protocol.CodeBadRequest, "digests of a walk")
	if _, err := p.call(&protocol.Close{Handle: b.Handle}); err != nil {
		t.Fatal(err)
	}
	if st := p.read(b.Window.Addr, b.Window.RKeys[0], uint32(b.Window.Length)); st == verbs.StatusSuccess {
		t.Fatal("a closed walk's window still reads")
	}
}

// Walks that cannot start are refused, and take no handle.
func TestWalkRefused(t *testing.T) {
	dir := t.TempDir()
	walkTree(t, filepath.Join(dir, "t"), 3)
	os.Symlink("/etc", filepath.Join(dir, "out"))
	cfg := walkConfig(dir)
	cfg.Exports = append(cfg.Exports, target.Export{Name: "file", Path: filepath.Join(dir, "t", "big")})
	cfg.MaxHandles = 1
	addr := serve(t, cfg)
	p := newPeer(t, addr)
	for _, tc := range []struct {
		m    protocol.Walk
		code protocol.Code
	}{
		{protocol.Walk{Path: "file"}, protocol.CodeNotDir},
		{protocol.Walk{Path: "file/x"}, protocol.CodeNotDir},
		{protocol.Walk{Path: "data/t/big"}, protocol.CodeNotDir},
		{protocol.Walk{Path: "data/nope"}, protocol.CodeNotFound},
		{protocol.Walk{Path: "nope/t"}, protocol.CodeNotFound},
		{protocol.Walk{Path: "data/../t"}, protocol.CodePermission},
		{protocol.Walk{Path: "data/t/../../x"}, protocol.CodePermission},
		{protocol.Walk{Path: "data/out"}, protocol.CodePermission},
		{protocol.Walk{Path: "data/t", ShardI: 3, ShardN: 3}, protocol.CodeBadRequest},
		{protocol.Walk{Path: "data/t", Algorithm: 9}, protocol.CodeUnsupported},
	} {
		_, err := p.call(&tc.m)
		walkCode(t, err, tc.code, fmt.Sprintf("%+v", tc.m))
	}
	// None of them holds the session's one handle.
	m, err := p.call(&protocol.Walk{Path: "data/t", ShardI: 1, ShardN: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.call(&protocol.Walk{Path: "data/t"})
	walkCode(t, err, protocol.CodeTooMany, "a second walk with one handle")
	p.call(&protocol.Close{Handle: m.(*protocol.WalkBatch).Handle})

	// A session with no data QP has nowhere to send a batch's keys.
	ch, err := rawSession(t, addr, protocol.ControlData())
	if err != nil {
		t.Fatal(err)
	}
	call := func(m protocol.Message) (protocol.Message, error) {
		p := &peer{t: t, ch: ch}
		return p.call(m)
	}
	if _, err := call(&protocol.Hello{MinVersion: 1, MaxVersion: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = call(&protocol.Walk{Path: "data/t"})
	walkCode(t, err, protocol.CodeBadRequest, "walk with no data QP")
	if _, err := call(&protocol.Open{Path: "data/t/big"}); err != nil {
		t.Errorf("open after a refused walk: %v", err)
	}
}

// While the target has no room for a batch's window, Walk and WalkNext
// are answered TooMany, and the entries are kept for the next try: the
// walk as a whole loses none and repeats none.
func TestWalkTooMany(t *testing.T) {
	for _, limit := range []string{"budget", "windows"} {
		t.Run(limit, func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "t")
			files := map[string][]byte{}
			os.Mkdir(root, 0o755)
			for i := range 40 { // all packed, 5 to a batch: 2500 bytes a window
				rel := fmt.Sprintf("f%02d", i)
				files[rel] = bytes.Repeat([]byte{byte(i)}, 500)
				if err := os.WriteFile(filepath.Join(root, rel), files[rel], 0o644); err != nil {
					t.Fatal(err)
				}
			}
			os.WriteFile(filepath.Join(dir, "big"), make([]byte, 64<<10), 0o644)
			cfg := walkConfig(dir)
			cfg.WindowBudget = 64 << 10
			cfg.MaxHandles = 1
			if limit == "windows" {
				cfg.MaxWindowsPerSession = 2
			}
			cfg.RevokeAfter = time.Hour // the other's windows stay while a waits
			addr := serve(t, cfg)
			other := newPeer(t, addr)
			m, err := other.call(&protocol.Open{Path: "data/big"})
			if err != nil {
				t.Fatal(err)
			}
			oh := m.(*protocol.OpenReply).Handle
			hold := func(n uint64) func() { // n bytes of the budget, by the other session
				t.Helper()
				m, err := other.call(&protocol.Map{Handle: oh, Length: n})
				if err != nil {
					t.Fatal(err)
				}
				w := m.(*protocol.MapReply).Window
				return func() { other.call(&protocol.Unmap{Handle: oh, WindowID: w.ID}) }
			}
			// The other session, alone, may hold all of the budget: room for
			// a's two windows and the other's, not a third, and then the
			// rest. Once a is a session too, either's share is half.
			var freeRest, freeSome func()
			if limit == "budget" {
				freeRest, freeSome = hold(59<<10), hold(5<<10)
			}
			a := newPeer(t, addr)
			ws := newWalkState(a, files)
			const max = 5
			walk := &protocol.Walk{MaxEntries: max, PackMax: 4096, Path: "data/t"}
			if limit == "budget" {
				// All of the budget in use: the walk does not start, and
				// takes none of a's one handle.
				for range 2 {
					_, err := a.call(walk)
					walkCode(t, err, protocol.CodeTooMany, "walk with the budget in use")
				}
				freeSome()
			}
			m, err = a.call(walk)
			if err != nil {
				t.Fatal(err)
			}
			b1 := m.(*protocol.WalkBatch)
			h := b1.Handle
			ws.take(b1, max)
			next := func(release uint32) (*protocol.WalkBatch, error) {
				m, err := a.call(&protocol.WalkNext{Handle: h, Release: release, MaxEntries: max})
				if err != nil {
					return nil, err
				}
				return m.(*protocol.WalkBatch), nil
			}
			b2, err := next(0) // as an initiator does: batch 1 still held
			if err != nil {
				t.Fatal(err)
			}
			ws.take(b2, max)
			if b1.Window.Length != 2500 || b2.Window.Length != 2500 {
				t.Fatalf("windows of %d and %d bytes, want 2500", b1.Window.Length, b2.Window.Length)
			}
			free := func() {}
			what := "next with two windows held"
			if limit == "budget" {
				// Room for a's two windows and the other's, not a third.
				free, what = freeRest, "next with the budget in use"
			}
			fds := func() int {
				ents, err := os.ReadDir("/proc/self/fd")
				if err != nil {
					t.Skipf("no /proc/self/fd: %v", err)
				}
				return len(ents)
			}
			before := fds()
			for range 2 {
				_, err := next(0)
				walkCode(t, err, protocol.CodeTooMany, what)
			}
			if n := fds() - before; n > 0 {
				t.Errorf("%d more descriptors open while the walk waits for room", n)
			}
			if limit == "budget" {
				// The next batch's files were opened and closed again to
				// wait: one changed meanwhile is sent as changed, not
				// read as what it is now.
				ws.changed = map[string]bool{"f10": true}
				ws.sawChanged = map[string]bool{}
				os.WriteFile(filepath.Join(root, "f10"), bytes.Repeat([]byte{'x'}, 600), 0o644)
			}
			free()
			release := b1.Window.ID
			prev := b2.Window.ID
			for {
				b, err := next(release)
				if err != nil {
					t.Fatalf("after %d entries: %v", len(ws.rels), err)
				}
				ws.take(b, max)
				if b.Done {
					break
				}
				release, prev = prev, b.Window.ID
			}
			if want := walkOrder(t, root); !slices.Equal(ws.rels, want) {
				t.Fatalf("walked\n%q\nwant\n%q", ws.rels, want)
			}
			if limit == "budget" && !ws.sawChanged["f10"] {
				t.Error("f10, changed while its entry waited, was not sent as changed")
			}
		})
	}
}

// A session has at most eight walks open at once (each holds its path's
// listings); closing one makes room for another.
func TestWalkLimit(t *testing.T) {
	dir := t.TempDir()
	walkTree(t, filepath.Join(dir, "t"), 3)
	p := newPeer(t, serve(t, walkConfig(dir)))
	var handles []uint32
	for range 8 {
		m, err := p.call(&protocol.Walk{MaxEntries: 1, Path: "data/t"})
		if err != nil {
			t.Fatalf("walk %d: %v", len(handles)+1, err)
		}
		handles = append(handles, m.(*protocol.WalkBatch).Handle)
	}
	_, err := p.call(&protocol.Walk{MaxEntries: 1, Path: "data/t"})
	walkCode(t, err, protocol.CodeTooMany, "a ninth walk")
	if _, err := p.call(&protocol.Close{Handle: handles[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.call(&protocol.Walk{MaxEntries: 1, Path: "data/t"}); err != nil {
		t.Errorf("a walk after one was closed: %v", err)
	}
}

// Open of a FIFO in an export is refused at once: it does not wait for a
// writer (which would hold the session's requests up for good).
func TestOpenFIFO(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newPeer(t, serve(t, walkConfig(dir)))
	_, err := p.call(&protocol.Open{Path: "data/fifo"})
	walkCode(t, err, protocol.CodeUnsupported, "open of a FIFO")
	if _, err := p.call(&protocol.Stat{Path: "data/fifo"}); err != nil {
		t.Errorf("the session after: %v", err)
	}
}
