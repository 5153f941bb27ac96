package target_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
)

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// protoErr is err's protocol error, failing the test if there is none.
func protoErr(t *testing.T, what string, err error) *protocol.Error {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		t.Fatalf("%s: err = %v, want a protocol error", what, err)
	}
	return pe
}

// A single-file export is pinned when it is exported: a symlink swapped in
// for it, or another file renamed over it, is refused, not followed.
func TestSingleExportPinned(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	secret := filepath.Join(dir, "secret")
	other := filepath.Join(dir, "other")
	os.WriteFile(real, []byte("exported"), 0o644)
	os.WriteFile(secret, []byte("not for you"), 0o600)
	os.WriteFile(other, []byte("some other file"), 0o644)
	var logs lockedBuffer
	addr := serve(t, target.Config{
		Exports: []target.Export{{Name: "single", Path: real}},
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	p := newPeer(t, addr)

	if _, err := p.call(&protocol.Open{Path: "single"}); err != nil {
		t.Fatalf("Open before the swap: %v", err)
	}
	want := "export single: " + real + " is no longer the file exported at start (replaced by a symlink or another file); reload the daemon to export it"
	refused := func(how string) {
		t.Helper()
		_, err := p.call(&protocol.Open{Path: "single"})
		if pe := protoErr(t, how+": Open", err); pe.Code != protocol.CodePermission || pe.Message != want {
			t.Errorf("%s: Open: %v %q, want %q", how, pe.Code, pe.Message, want)
		}
		_, err = p.call(&protocol.Stat{Path: "single"})
		if pe := protoErr(t, how+": Stat", err); pe.Code != protocol.CodePermission || pe.Message != want {
			t.Errorf("%s: Stat: %v %q", how, pe.Code, pe.Message)
		}
	}

	// mv real real.orig; ln -s secret real
	if err := os.Rename(real, real+".orig"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, real); err != nil {
		t.Fatal(err)
	}
	refused("symlink")
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "export replaced") {
		t.Errorf("no warning logged; log:\n%s", logs.String())
	}

	// mv other real: a regular file, but not the one exported.
	os.Remove(real)
	if err := os.Rename(other, real); err != nil {
		t.Fatal(err)
	}
	refused("another file")

	// The exported file put back is served again.
	if err := os.Rename(real+".orig", real); err != nil {
		t.Fatal(err)
	}
	m, err := p.call(&protocol.Open{Path: "single"})
	if err != nil {
		t.Fatalf("Open after putting it back: %v", err)
	}
	if r := m.(*protocol.OpenReply); r.Entry.Size != uint64(len("exported")) {
		t.Errorf("size %d", r.Entry.Size)
	}
}

// A single-file export configured as a symlink is refused at start: the
// link could be repointed.
func TestSingleExportSymlinkRefused(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.WriteFile(real, []byte("x"), 0o644)
	link := filepath.Join(dir, "link")
	os.Symlink(real, link)
	_, err := target.New(target.Config{Device: device(t), Exports: []target.Export{{Name: "single", Path: link}}})
	if err == nil || !strings.Contains(err.Error(), link+" is a symlink (to "+real+"); export the file itself") {
		t.Fatalf("err = %v", err)
	}
	// A directory reached through a symlink is still fine: it is held open.
	dirlink := filepath.Join(t.TempDir(), "dirlink")
	if err := os.Symlink(dir, dirlink); err != nil {
		t.Fatal(err)
	}
	if _, err := target.New(target.Config{Device: device(t), Exports: []target.Export{{Name: "dir", Path: dirlink}}}); err != nil {
		t.Fatalf("directory through a symlink: %v", err)
	}
}

// Files whose size says nothing of their contents are refused, in a
// directory export and exported on their own.
func TestOpenProcRefused(t *testing.T) {
	addr := serve(t, target.Config{Exports: []target.Export{
		{Name: "kernel", Path: "/proc/sys/kernel"},
		{Name: "hostname", Path: "/proc/sys/kernel/hostname"},
	}})
	p := newPeer(t, addr)
	for _, c := range []struct{ path, want string }{
		{"kernel/hostname", "kernel/hostname is on procfs, a pseudo file system whose sizes say nothing of the contents; only regular files and block devices whose size is their length are served"},
		{"hostname", "hostname is on procfs"},
	} {
		_, err := p.call(&protocol.Open{Path: c.path})
		if pe := protoErr(t, c.path, err); pe.Code != protocol.CodeUnsupported || !strings.HasPrefix(pe.Message, c.want) {
			t.Errorf("%s: %v %q, want %q", c.path, pe.Code, pe.Message, c.want)
		}
	}
}

// A reload pins a replaced single-file export anew, and refuses one
// whose name has become a symlink.
func TestReloadRepinsASingleFileExport(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.WriteFile(real, []byte("first"), 0o644)
	exps := []target.Export{{Name: "single", Path: real}}
	srv, err := target.New(target.Config{Device: device(t), Exports: exps})
	if err != nil {
		t.Fatal(err)
	}
	if added, removed, err := srv.SetExports(exps); err != nil || len(added)+len(removed) != 0 {
		t.Fatalf("reload of an unchanged export: added %v removed %v, %v", added, removed, err)
	}
	os.Rename(real, real+".orig")
	os.WriteFile(real, []byte("second"), 0o644)
	added, _, err := srv.SetExports(exps)
	if err != nil || len(added) != 1 || added[0] != "single" {
		t.Fatalf("reload after the file was replaced: added %v, %v; want it pinned anew", added, err)
	}
	os.Remove(real)
	os.Symlink(real+".orig", real)
	if _, _, err := srv.SetExports(exps); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("reload with a symlink at the export's name: %v, want it refused", err)
	}
}
