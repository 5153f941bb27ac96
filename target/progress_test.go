package target_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// progressCopy copies a 2 MiB file with a 3 s I/O timeout while hook
// runs before every hash read, and reports the copy's error and time.
func progressCopy(t *testing.T, hook func()) (error, time.Duration) {
	t.Helper()
	dir := t.TempDir()
	want := bytes.Repeat([]byte("0123456789abcdef"), (2<<20)/16)
	if err := os.WriteFile(filepath.Join(dir, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, target.Config{Exports: []target.Export{{Name: "data", Path: dir}}, ChunkSize: 64 << 10, MaxWindow: 2 << 20}) // one window: one request hashes it all
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, addr, initiator.Config{Device: device(t), QPs: 2, Depth: 4, ReadSize: 16 << 10,
		Timeout: 3 * time.Second}) // the default --retry-for: a stall must not be retried
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Cleanup(target.SetHashReadHook(hook))
	dst := filepath.Join(t.TempDir(), "f")
	start := time.Now()
	_, err = s.Get(ctx, "data/f", dst, initiator.GetOptions{})
	took := time.Since(start)
	if err == nil {
		if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
			t.Error("copy differs")
		}
	}
	return err, took
}

// A hash that stalls (hung storage) while the target's keepalive goes
// on fails the copy after about the I/O timeout, saying so; before
// Working carried progress, the keepalive kept cp waiting for ever.
func TestStalledHashFailsWithinTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	err, took := progressCopy(t, func() {
		select {
		case <-release:
		case <-time.After(30 * time.Second): // the bound on the stall itself
		}
	})
	if !errors.Is(err, protocol.ErrNoProgress) || !strings.Contains(err.Error(), "made no progress on") ||
		!strings.Contains(err.Error(), "for 3s; its storage may be hung") {
		t.Fatalf("copy: %v, want the target made no progress", err)
	}
	if took < 3*time.Second || took > 6*time.Second {
		t.Errorf("failed after %v, want about the 3s timeout", took)
	}
	if testing.Verbose() {
		t.Logf("copy: %v", err)
	}
}

// A slow hash that moves (a read every 250 ms, 4 s in all: longer than
// the 3 s timeout) finishes byte-exact.
func TestSlowMovingHashSucceeds(t *testing.T) {
	err, took := progressCopy(t, func() { time.Sleep(250 * time.Millisecond) })
	if err != nil {
		t.Fatalf("copy: %v", err)
	}
	if took < 3*time.Second {
		t.Errorf("took %v: the hash was not slower than the timeout, the test proves nothing", took)
	}
}

// Any request, not only a hash, is bounded by progress: a reply held
// back by a hostile target (or a serving thread stuck after its work)
// while the keepalive goes on fails the call after the I/O timeout.
func TestStalledReplyFailsWithinTimeout(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, target.Config{Exports: []target.Export{{Name: "data", Path: dir}}, ChunkSize: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := initiator.Dial(ctx, addr, initiator.Config{Device: device(t), QPs: 1, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	release := make(chan struct{})
	defer close(release)
	t.Cleanup(target.SetReplyHook(func(req, reply protocol.Message) protocol.Message {
		if _, ok := req.(*protocol.Stat); ok {
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
		return reply
	}))
	start := time.Now()
	_, err = s.Stat(ctx, "data/f")
	took := time.Since(start)
	if !errors.Is(err, protocol.ErrNoProgress) || !strings.Contains(err.Error(), "no progress on Stat for 2s") {
		t.Fatalf("Stat: %v, want no progress on Stat", err)
	}
	if took < 2*time.Second || took > 4*time.Second {
		t.Errorf("failed after %v, want about 2s", took)
	}
}
