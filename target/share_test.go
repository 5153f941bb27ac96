package target_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

// Fair shares of the window budget (issue 14): windows of 64 KiB, a
// budget of 32 of them, shared by the sessions there are.
const (
	shareWindow = 64 << 10
	shareBudget = 32 * shareWindow
)

func shareConfig(t *testing.T, logs *lockedBuffer) (target.Config, []byte) {
	cfg, content := exportFile(t, 1<<20)
	cfg.MaxWindow, cfg.WindowBudget = shareWindow, shareBudget
	cfg.RevokeAfter = time.Millisecond
	if logs != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg, content
}

// holder is a session that maps windows of data/f and keeps them.
type holder struct {
	*peer
	h    uint32
	wins []protocol.Window
}

func newHolder(t *testing.T, addr string) *holder {
	p := newPeer(t, addr)
	m, err := p.call(&protocol.Open{Path: "data/f"})
	if err != nil {
		t.Fatal(err)
	}
	return &holder{peer: p, h: m.(*protocol.OpenReply).Handle}
}

// hold maps n whole windows, one after another along the file.
func (g *holder) hold(n int) {
	g.t.Helper()
	for range n {
		off := uint64(len(g.wins)) * shareWindow
		m, err := g.call(&protocol.Map{Handle: g.h, Offset: off, Length: shareWindow})
		if err != nil {
			g.t.Fatalf("map %d: %v", len(g.wins), err)
		}
		w := m.(*protocol.MapReply).Window
		if w.Length != shareWindow {
			g.t.Fatalf("map %d: %d bytes, want %d", len(g.wins), w.Length, shareWindow)
		}
		g.wins = append(g.wins, w)
	}
}

// mapBusy maps as the initiator does (retryBusy): again while the target
// answers TooMany, for up to bound.
func (g *holder) mapBusy(off uint64, bound time.Duration) (protocol.Window, time.Duration) {
	g.t.Helper()
	start := time.Now()
	backoff := 10 * time.Millisecond
	for {
		m, err := g.call(&protocol.Map{Handle: g.h, Offset: off, Length: shareWindow})
		if err == nil {
			return m.(*protocol.MapReply).Window, time.Since(start)
		}
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany {
			g.t.Fatalf("map: %v", err)
		}
		if !strings.HasPrefix(pe.Message, "busy: ") {
			g.t.Errorf("refusal %q does not say busy", pe.Message)
		}
		if time.Since(start) > bound {
			g.t.Fatalf("map still refused after %v: %v", bound, err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// readsAs READs the first 4 KiB of w and checks them against content.
func (g *holder) readsAs(w protocol.Window, content []byte) bool {
	g.t.Helper()
	if st := g.read(w.Addr, w.RKeys[0], 4096); st != verbs.StatusSuccess {
		return false
	}
	if !bytes.Equal(g.buf[:4096], content[w.Offset:w.Offset+4096]) {
		g.t.Fatalf("window at %d reads the wrong bytes", w.Offset)
	}
	return true
}

// revoked waits until g's window w no longer reads (a READ that fails
// breaks g's data QP: check g's live windows first).
func (g *holder) revoked(w protocol.Window, content []byte) bool {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !g.readsAs(w, content) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// Four sessions that each keep 8 windows hold all of the budget; a fifth
// session's Map still gets a window, soon, and the four are trimmed back
// to their share: their least recently mapped windows go, their newest
// stay.
func TestGreedySessionsCannotStarveAnother(t *testing.T) {
	var logs lockedBuffer
	cfg, content := shareConfig(t, &logs)
	addr := serve(t, cfg)
	var greedy []*holder
	for range 4 {
		greedy = append(greedy, newHolder(t, addr))
	}
	for _, g := range greedy {
		g.hold(8) // 4 sessions: a share of 8 windows each
	}
	fifth := newHolder(t, addr)
	w, took := fifth.mapBusy(0, 10*time.Second)
	if w.Length == 0 || w.Length%4096 != 0 || w.Length > shareWindow {
		t.Fatalf("fifth session's window of %d bytes", w.Length)
	}
	t.Logf("fifth session mapped %d bytes after %v", w.Length, took)
	if !fifth.readsAs(w, content) {
		t.Fatal("fifth session's window does not read")
	}
	// Five sessions: a share of 6.4 windows. Each greedy session keeps
	// its 6 newest at least, and loses its oldest.
	for i, g := range greedy {
		if !g.readsAs(g.wins[7], content) {
			t.Errorf("greedy session %d lost its newest window", i)
		}
		if !g.revoked(g.wins[0], content) {
			t.Errorf("greedy session %d kept its oldest window, over its share", i)
		}
	}
	if !strings.Contains(logs.String(), "window revoked") {
		t.Error("no revocation logged")
	}
}

// A session within its share is never revoked, however full the budget:
// the sessions over theirs are.
func TestWithinShareNeverRevoked(t *testing.T) {
	var logs lockedBuffer
	cfg, content := shareConfig(t, &logs)
	addr := serve(t, cfg)
	modest := newHolder(t, addr)
	modest.hold(4)
	var greedy []*holder
	for range 3 {
		g := newHolder(t, addr)
		g.hold(8)
		greedy = append(greedy, g)
	}
	// 28 of 32 windows are held. The fifth takes the rest, within its
	// share, then asks for more: the budget is full.
	fifth := newHolder(t, addr)
	fifth.hold(4)
	w, _ := fifth.mapBusy(4*shareWindow, 10*time.Second)
	fifth.wins = append(fifth.wins, w)
	for i, g := range greedy {
		if !g.revoked(g.wins[0], content) {
			t.Errorf("greedy session %d kept its oldest window, over its share", i)
		}
	}
	time.Sleep(100 * time.Millisecond) // any trim still running has run
	for i, w := range modest.wins {
		if !modest.readsAs(w, content) {
			t.Fatalf("the modest session's window %d was revoked, within its share", i)
		}
	}
	for i, w := range fifth.wins {
		if !fifth.readsAs(w, content) {
			t.Fatalf("the fifth session's window %d was revoked, within its share", i)
		}
	}
	if n := strings.Count(logs.String(), "window revoked"); n < 3 {
		t.Errorf("%d revocations logged, want one per greedy session at least", n)
	}
}

// A session at its share is refused ("busy", TooMany) rather than granted
// more, short of it is granted what is left in whole chunks, and refused
// for its share alone it revokes nothing of others.
func TestShareCapsASession(t *testing.T) {
	var logs lockedBuffer
	cfg, content := shareConfig(t, &logs)
	cfg.MaxWindowsPerSession = 16
	addr := serve(t, cfg)
	a, b, c := newHolder(t, addr), newHolder(t, addr), newHolder(t, addr)
	b.hold(1)
	c.hold(1)
	a.hold(10) // three sessions: a share of 10.7 windows each
	share := uint64(shareBudget / 3)
	m, err := a.call(&protocol.Map{Handle: a.h, Offset: 10 * shareWindow, Length: shareWindow})
	if err != nil {
		t.Fatal(err)
	}
	w := m.(*protocol.MapReply).Window
	if want := (share - 10*shareWindow) / 4096 * 4096; w.Length != want {
		t.Fatalf("window of %d bytes past 10 held, want %d (the rest of the share, in whole chunks)", w.Length, want)
	}
	_, err = a.call(&protocol.Map{Handle: a.h, Offset: 11 * shareWindow, Length: shareWindow})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany || !strings.Contains(pe.Message, "share") {
		t.Fatalf("map past the share: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	for _, g := range []*holder{a, b, c} {
		if !g.readsAs(g.wins[0], content) {
			t.Fatal("a window was revoked")
		}
	}
	if strings.Contains(logs.String(), "window revoked") {
		t.Error("a refusal for the share revoked a window")
	}
}

// A real copy through a budget that grants it windows shorter than it
// asks (half the budget, shared with an idle session) and refuses it more
// than one at a time: the copy waits, reads whole chunks and ends right.
func TestCopyWithShortWindows(t *testing.T) {
	var logs lockedBuffer
	dir := t.TempDir()
	want := bytes.Repeat([]byte("abcdefghijklmnopq"), (1<<20+17*4097)/17)
	if err := os.WriteFile(filepath.Join(dir, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := target.Config{Exports: []target.Export{{Name: "data", Path: dir}}, ChunkSize: 64 << 10,
		MaxWindow: 256 << 10, WindowBudget: 256 << 10,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	addr := serve(t, cfg)
	newPeer(t, addr) // idle: the copy's share is half the budget
	s, err := initiator.Dial(context.Background(), addr, initiator.Config{Device: device(t), QPs: 2, Depth: 4, ReadSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dst := filepath.Join(t.TempDir(), "copy")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.Get(ctx, "data/f", dst, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(want) {
		t.Fatal("the copy differs")
	}
	if !strings.Contains(logs.String(), "window shortened") {
		t.Error("no window was shortened")
	}
}

// The digests of a session's open files are bounded: an Open over the
// limit is refused TooMany, asking for larger chunks; closing a file
// makes room.
func TestDigestMemoryLimit(t *testing.T) {
	cfg, _ := exportFile(t, 1<<20)
	cfg.MaxDigestMemory = 20 << 10 // 256 chunks of 4 KiB take 8 KiB of BLAKE3 digests
	addr := serve(t, cfg)
	p := newPeer(t, addr)
	open := func(cs uint32) (uint32, error) {
		m, err := p.call(&protocol.Open{Path: "data/f", Algorithm: uint8(chunker.BLAKE3), ChunkSize: cs})
		if err != nil {
			return 0, err
		}
		return m.(*protocol.OpenReply).Handle, nil
	}
	h1, err := open(4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(4096); err != nil {
		t.Fatal(err)
	}
	_, err = open(4096)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany || !strings.Contains(pe.Message, "--chunk-size") {
		t.Fatalf("open over the digest limit: %v", err)
	}
	t.Logf("refused: %s", pe.Message)
	if _, err := open(64 << 10); err != nil { // 16 chunks: 512 bytes
		t.Fatalf("open with larger chunks: %v", err)
	}
	// Another session has a limit of its own.
	if _, err := newPeer(t, addr).call(&protocol.Open{Path: "data/f", Algorithm: uint8(chunker.BLAKE3), ChunkSize: 4096}); err != nil {
		t.Fatalf("another session's open: %v", err)
	}
	if _, err := p.call(&protocol.Close{Handle: h1}); err != nil {
		t.Fatal(err)
	}
	if _, err := open(4096); err != nil {
		t.Fatalf("open after a close: %v", err)
	}
}
