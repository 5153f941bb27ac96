package target_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// A push the initiator closes before its commit (cp interrupted) is
// logged as aborted, with the bytes that moved: never ok with the
// file's size.
func TestPushClosedBeforeCommitLogged(t *testing.T) {
	dir := t.TempDir()
	var logs logBuffer
	_, addr := serveSrv(t, target.Config{ChunkSize: pushChunk, Exports: []target.Export{{Name: "data", Path: dir, Writable: true}},
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	p := newPeer(t, addr)
	src := randomBytes(4 * pushChunk)
	mr := p.source(src)
	h, err := p.startPush("data", len(src))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.window(h, mr, 0, 2*pushChunk, sums(src, 0, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.call(&protocol.Close{Handle: h}); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for end := time.Now().Add(5 * time.Second); len(lines) == 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		lines = logs.find(t, "pushed")
	}
	if len(lines) != 1 {
		t.Fatalf("%d access lines for the push, want 1", len(lines))
	}
	l := lines[0]
	if r, _ := l["result"].(string); !strings.HasPrefix(r, "aborted") || l["bytes"] != float64(2*pushChunk) {
		t.Fatalf("push closed after 2 of 4 chunks logged result %q bytes %v, want aborted and %d", l["result"], l["bytes"], 2*pushChunk)
	}
	if _, err := os.Stat(filepath.Join(dir, "src.bin")); err == nil {
		t.Fatal("an aborted push is in place")
	}
}
