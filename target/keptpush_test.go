package target_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// logWatch is a slog handler that hands on the messages it sees.
type logWatch struct{ msgs chan string }

func (w logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w logWatch) Handle(_ context.Context, r slog.Record) error {
	select {
	case w.msgs <- r.Message:
	default:
	}
	return nil
}
func (w logWatch) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w logWatch) WithGroup(string) slog.Handler      { return w }

// waitLog waits for a log message that starts with prefix.
func waitLog(t *testing.T, w logWatch, prefix string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-w.msgs:
			if strings.HasPrefix(m, prefix) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q in the target's log", prefix)
		}
	}
}

// keptTarget serves a writable "data" whose lost pushes are kept for
// keep, and returns its directory, address and log.
func keptTarget(t *testing.T, keep time.Duration) (string, string, logWatch) {
	dir := t.TempDir()
	w := logWatch{msgs: make(chan string, 256)}
	addr := serve(t, target.Config{ChunkSize: pushChunk, KeepPush: keep, Logger: slog.New(w),
		Exports: []target.Export{{Name: "data", Path: dir, Writable: true}}})
	return dir, addr, w
}

func pushTok(t *testing.T, p *peer, size int, mtime int64, token [16]byte) *protocol.PushReply {
	t.Helper()
	m, err := p.call(&protocol.Push{Path: "data/f", Name: "x", Size: uint64(size), Retries: 2, Mode: 0o640, MtimeNs: mtime, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*protocol.PushReply)
}

// A push whose session is lost after a window is kept; the same token on
// a new session goes on from that window, and the file is whole.
func TestPushResumesOnANewSession(t *testing.T) {
	dir, addr, w := keptTarget(t, time.Minute)
	src := randomBytes(3*pushChunk + 10)
	token := [16]byte{1, 2, 3}
	p := newPeer(t, addr)
	mr := p.source(src)
	r := pushTok(t, p, len(src), 1e18, token)
	if r.Resumed != 0 {
		t.Fatalf("a new push says Resumed %d", r.Resumed)
	}
	if _, err := p.window(r.Handle, mr, 0, 2*pushChunk, sums(src, 0, 2)); err != nil {
		t.Fatal(err)
	}
	p.ch.Close() // lost after two chunks
	waitLog(t, w, "push kept")

	p2 := newPeer(t, addr)
	mr2 := p2.source(src)
	r2 := pushTok(t, p2, len(src), 1e18, token)
	if r2.Resumed != 2*pushChunk {
		t.Fatalf("Resumed %d, want %d", r2.Resumed, 2*pushChunk)
	}
	wr, err := p2.window(r2.Handle, mr2, 2*pushChunk, len(src)-2*pushChunk, sums(src, 2, 4))
	if err != nil {
		t.Fatal(err)
	}
	if wr.BytesRead != uint64(len(src)-2*pushChunk) {
		t.Errorf("the resumed session READ %d bytes, want only the rest, %d", wr.BytesRead, len(src)-2*pushChunk)
	}
	if _, err := p2.call(&protocol.PushCommit{Handle: r2.Handle, FileDigest: fileDigest(t, src)}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("the resumed file differs (%v)", err)
	}
	clean(t, dir, "f")
}

// A token that comes back with another source starts over, and the kept
// push's temporary file goes; one nobody comes back for goes after
// KeepPush.
func TestKeptPushOtherSourceAndExpiry(t *testing.T) {
	dir, addr, w := keptTarget(t, 500*time.Millisecond)
	src := randomBytes(2 * pushChunk)
	token := [16]byte{9}
	p := newPeer(t, addr)
	mr := p.source(src)
	r := pushTok(t, p, len(src), 1e18, token)
	if _, err := p.window(r.Handle, mr, 0, pushChunk, sums(src, 0, 1)); err != nil {
		t.Fatal(err)
	}
	p.ch.Close()
	waitLog(t, w, "push kept")

	p2 := newPeer(t, addr)
	r2 := pushTok(t, p2, len(src), 2e18, token) // the source changed: another mtime
	if r2.Resumed != 0 {
		t.Fatalf("a changed source resumed at %d", r2.Resumed)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("after starting over: %d files, want the new temporary only", len(ents))
	}
	// Lose this one too, after a window, and let it expire.
	mr2 := p2.source(src)
	if _, err := p2.window(r2.Handle, mr2, 0, pushChunk, sums(src, 0, 1)); err != nil {
		t.Fatal(err)
	}
	p2.ch.Close()
	waitLog(t, w, "push kept")
	waitLog(t, w, "kept push dropped")
	clean(t, dir)
}

// An initiator back on a new session before the target has seen its old
// one lost: the new push of the same token begins while the old one still
// runs, so there is nothing to resume and it starts over; the old one,
// when its session ends, is not kept (it held its temporary file open for
// KeepPush, for nobody) and its temporary file goes.
func TestPushSupersededBeforeKept(t *testing.T) {
	dir, addr, w := keptTarget(t, time.Minute)
	src := randomBytes(2 * pushChunk)
	token := [16]byte{7}
	p := newPeer(t, addr)
	mr := p.source(src)
	r := pushTok(t, p, len(src), 1e18, token)
	if _, err := p.window(r.Handle, mr, 0, pushChunk, sums(src, 0, 1)); err != nil {
		t.Fatal(err)
	}
	p2 := newPeer(t, addr) // before the first session is lost
	r2 := pushTok(t, p2, len(src), 1e18, token)
	if r2.Resumed != 0 {
		t.Fatalf("Resumed %d from a push still running", r2.Resumed)
	}
	p.ch.Close()
	waitLog(t, w, "push not kept")
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files after the old session ended, want the new push's temporary only", len(ents))
	}
	mr2 := p2.source(src)
	if _, err := p2.window(r2.Handle, mr2, 0, len(src), sums(src, 0, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.call(&protocol.PushCommit{Handle: r2.Handle, FileDigest: fileDigest(t, src)}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("the pushed file differs (%v)", err)
	}
	clean(t, dir, "f")
}
