package target_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

const pushChunk = 4096

// pushTarget serves a writable directory export "data" (and a read-only
// "ro") with 4 KiB chunks.
func pushTarget(t *testing.T) (dir, ro, addr string) {
	dir, ro = t.TempDir(), t.TempDir()
	addr = serve(t, target.Config{ChunkSize: pushChunk, Exports: []target.Export{
		{Name: "data", Path: dir, Writable: true}, {Name: "ro", Path: ro}}})
	return dir, ro, addr
}

// source registers b for remote read in the peer's PD.
func (p *peer) source(b []byte) verbs.MR {
	p.t.Helper()
	buf, err := verbs.AllocBuffer(max(len(b), 1))
	if err != nil {
		p.t.Fatal(err)
	}
	copy(buf.Bytes(), b)
	mr, err := p.pd.RegMR(buf.Bytes(), verbs.AccessRemoteRead)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { mr.Close(); buf.Free() })
	return mr
}

// sums is the CRC32C digests of b's chunks, from chunk first to end.
func sums(b []byte, first, end int) []byte {
	var out []byte
	for i := first; i < end; i++ {
		out = chunker.AppendSum(out, chunker.CRC32C, b[i*pushChunk:min((i+1)*pushChunk, len(b))])
	}
	return out
}

func fileDigest(t *testing.T, b []byte) []byte {
	l := chunker.Layout{Size: int64(len(b)), ChunkSize: pushChunk}
	d, err := chunker.MakeDigests(chunker.CRC32C, l.Chunks(), sums(b, 0, l.Chunks()))
	if err != nil {
		t.Fatal(err)
	}
	fd, err := chunker.FileDigest(chunker.CRC32C, l, d)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func (p *peer) startPush(path string, size int) (uint32, error) {
	m, err := p.call(&protocol.Push{Path: path, Name: "src.bin", Size: uint64(size), Retries: 2, Mode: 0o640, MtimeNs: 1e18})
	if err != nil {
		return 0, err
	}
	r := m.(*protocol.PushReply)
	if r.ChunkSize != pushChunk || int(r.Chunks) != (size+pushChunk-1)/pushChunk {
		p.t.Fatalf("push reply %+v", r)
	}
	return r.Handle, nil
}

func (p *peer) window(h uint32, mr verbs.MR, off, n int, digests []byte) (*protocol.PushWindowReply, error) {
	m, err := p.call(&protocol.PushWindow{Handle: h, Digests: digests,
		Window: protocol.Window{Offset: uint64(off), Length: uint64(n), Addr: mr.Addr() + uint64(off), RKeys: []uint32{mr.RKey()}}})
	if err != nil {
		return nil, err
	}
	return m.(*protocol.PushWindowReply), nil
}

func wantCode(t *testing.T, what string, err error, code protocol.Code) {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != code {
		t.Errorf("%s: err = %v, want %v", what, err, code)
	}
}

// clean fails t unless dir holds exactly the names given.
func clean(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if len(got) != len(names) {
		t.Errorf("%s holds %v, want %v", dir, got, names)
		return
	}
	for i := range got {
		if got[i] != names[i] {
			t.Errorf("%s holds %v, want %v", dir, got, names)
			return
		}
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(n)}).Read(b)
	return b
}

func TestPushByHand(t *testing.T) {
	dir, _, addr := pushTarget(t)
	p := newPeer(t, addr)
	src := randomBytes(3*pushChunk + 100)
	mr := p.source(src)
	h, err := p.startPush("data", len(src))
	if err != nil {
		t.Fatal(err)
	}
	// Two windows: chunks 0-1, then 2-3 (the last one short).
	for _, w := range [][2]int{{0, 2}, {2, 4}} {
		off, end := w[0]*pushChunk, min(w[1]*pushChunk, len(src))
		r, err := p.window(h, mr, off, end-off, sums(src, w[0], w[1]))
		if err != nil {
			t.Fatal(err)
		}
		if r.Offset != uint64(off) || r.BytesRead != uint64(end-off) || r.Retries != 0 {
			t.Errorf("window reply %+v", r)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "src.bin")); err == nil {
		t.Fatal("the file is in place before commit")
	}
	if _, err := p.call(&protocol.PushCommit{Handle: h, FileDigest: fileDigest(t, src)}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "src.bin"))
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("pushed file differs (%v)", err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "src.bin"))
	if fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(time.Unix(0, 1e18)) {
		t.Errorf("mode %v mtime %v", fi.Mode(), fi.ModTime())
	}
	clean(t, dir, "src.bin")
}

func TestPushRefusals(t *testing.T) {
	dir, ro, addr := pushTarget(t)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	os.Mkdir(filepath.Join(dir, "sub", "src.bin"), 0o755)
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(dir, "escape"))
	p := newPeer(t, addr)
	for _, tc := range []struct {
		path string
		code protocol.Code
	}{
		{"ro/x", protocol.CodeReadOnly},
		{"ro", protocol.CodeReadOnly},
		{"data/../x", protocol.CodePermission},
		{"data//etc/x", protocol.CodePermission},
		{"data/escape/x", protocol.CodePermission},
		{"data/escape", protocol.CodePermission},
		{"nope/x", protocol.CodeNotFound},
		{"data/missing/x", protocol.CodeNotFound},
		{"data/sub", protocol.CodeIsDir}, // into sub as src.bin, a directory
	} {
		_, err := p.startPush(tc.path, 10)
		wantCode(t, tc.path, err, tc.code)
	}
	var pe *protocol.Error
	if _, err := p.startPush("ro/x", 10); errors.As(err, &pe) && pe.Message != `export "ro" is read-only` {
		t.Errorf("read-only message %q", pe.Message)
	}
	if _, err := p.call(&protocol.Push{Path: "data", Name: "../x", Size: 1}); err == nil {
		t.Error("a name that is a path was taken")
	}
	clean(t, dir, "escape", "sub")
	clean(t, ro)
	clean(t, outside)
	// A size no file system holds: refused up front, no temporary file.
	_, err := p.call(&protocol.Push{Path: "data/huge", ChunkSize: 32 << 20, Size: 1 << 50})
	wantCode(t, "1 PiB", err, protocol.CodeNoSpace)
	_, err = p.call(&protocol.Push{Path: "data/many", ChunkSize: 4096, Size: 1 << 50})
	wantCode(t, "2^38 chunks", err, protocol.CodeBadRequest)
	_, err = p.call(&protocol.Push{Path: "data/big-chunks", ChunkSize: 64 << 20, Size: 1})
	wantCode(t, "chunks over the max window", err, protocol.CodeBadRequest)
	_, err = p.call(&protocol.Push{Path: "data/x", Algorithm: 9, Size: 1})
	wantCode(t, "unknown algorithm", err, protocol.CodeUnsupported)
	clean(t, dir, "escape", "sub")
}

func TestPushBadWindowsAbandon(t *testing.T) {
	dir, _, addr := pushTarget(t)
	p := newPeer(t, addr)
	src := randomBytes(4 * pushChunk)
	mr := p.source(src)
	good := sums(src, 0, 2)
	for _, tc := range []struct {
		name string
		w    protocol.PushWindow
		code protocol.Code
	}{
		{"not first", protocol.PushWindow{Window: protocol.Window{Offset: pushChunk, Length: pushChunk}, Digests: good[:4]}, protocol.CodeBadRequest},
		{"past the end", protocol.PushWindow{Window: protocol.Window{Length: 5 * pushChunk}, Digests: sums(src, 0, 4)}, protocol.CodeBadRequest},
		{"empty", protocol.PushWindow{Window: protocol.Window{}}, protocol.CodeBadRequest},
		{"half a chunk", protocol.PushWindow{Window: protocol.Window{Length: pushChunk / 2}, Digests: good[:4]}, protocol.CodeBadRequest},
		{"digests short", protocol.PushWindow{Window: protocol.Window{Length: 2 * pushChunk}, Digests: good[:4]}, protocol.CodeBadRequest},
		{"wrapping address", protocol.PushWindow{Window: protocol.Window{Length: 2 * pushChunk, Addr: 1<<64 - 100}, Digests: good}, protocol.CodeBadRequest},
		{"wrong digests", protocol.PushWindow{Window: protocol.Window{Length: 2 * pushChunk}, Digests: make([]byte, 8)}, protocol.CodeVerify},
		{"bad key", protocol.PushWindow{Window: protocol.Window{Length: 2 * pushChunk, RKeys: []uint32{mr.RKey() + 1}}, Digests: good}, protocol.CodeBadRequest},
	} {
		h, err := p.startPush("data/f", len(src))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		w := tc.w
		w.Handle = h
		if w.Window.Addr == 0 {
			w.Window.Addr = mr.Addr() + w.Window.Offset
		}
		if w.Window.RKeys == nil {
			w.Window.RKeys = []uint32{mr.RKey()}
		}
		_, err = p.call(&w)
		wantCode(t, tc.name, err, tc.code)
		// The push is gone, and its temporary file with it.
		_, err = p.call(&protocol.PushCommit{Handle: h})
		wantCode(t, tc.name+": commit after", err, protocol.CodeBadRequest)
		clean(t, dir)
		if tc.name == "bad key" {
			break // the failed READ broke the data QP
		}
	}
}

func TestPushCommitChecks(t *testing.T) {
	dir, _, addr := pushTarget(t)
	p := newPeer(t, addr)
	src := randomBytes(2 * pushChunk)
	mr := p.source(src)
	// Commit before the last window.
	h, _ := p.startPush("data/f", len(src))
	if _, err := p.window(h, mr, 0, pushChunk, sums(src, 0, 1)); err != nil {
		t.Fatal(err)
	}
	_, err := p.call(&protocol.PushCommit{Handle: h, FileDigest: fileDigest(t, src)})
	wantCode(t, "early commit", err, protocol.CodeBadRequest)
	clean(t, dir)
	// A whole-file digest that does not match the chunks'.
	h, _ = p.startPush("data/f", len(src))
	if _, err := p.window(h, mr, 0, len(src), sums(src, 0, 2)); err != nil {
		t.Fatal(err)
	}
	_, err = p.call(&protocol.PushCommit{Handle: h, FileDigest: []byte{1, 2, 3, 4}})
	wantCode(t, "wrong file digest", err, protocol.CodeVerify)
	clean(t, dir)
	// Close abandons; an empty file commits without windows.
	h, _ = p.startPush("data/f", len(src))
	if _, err := p.call(&protocol.Close{Handle: h}); err != nil {
		t.Fatal(err)
	}
	clean(t, dir)
	h, _ = p.startPush("data/empty", 0)
	if _, err := p.call(&protocol.PushCommit{Handle: h, FileDigest: fileDigest(t, nil)}); err != nil {
		t.Fatal(err)
	}
	clean(t, dir, "empty")
	// Replacing a file that is there.
	os.WriteFile(filepath.Join(dir, "old"), []byte("old contents"), 0o644)
	h, _ = p.startPush("data/old", len(src))
	p.window(h, mr, 0, len(src), sums(src, 0, 2))
	if _, err := p.call(&protocol.PushCommit{Handle: h, FileDigest: fileDigest(t, src)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "old")); !bytes.Equal(got, src) {
		t.Error("existing file not replaced")
	}
	// Handles of a push are not files: no Map, no Digests.
	h, _ = p.startPush("data/g", len(src))
	_, err = p.call(&protocol.Map{Handle: h, Length: pushChunk})
	wantCode(t, "map of a push", err, protocol.CodeBadRequest)
	_, err = p.call(&protocol.Digests{Handle: h, Count: 1})
	wantCode(t, "digests of a push", err, protocol.CodeBadRequest)
}

func TestPushGoneWithTheSession(t *testing.T) {
	dir, _, addr := pushTarget(t)
	p := newPeer(t, addr)
	src := randomBytes(2 * pushChunk)
	mr := p.source(src)
	h, _ := p.startPush("data/f", len(src))
	p.window(h, mr, 0, pushChunk, sums(src, 0, 1))
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("no temporary file while pushing: %v", ents)
	}
	p.ch.Close() // the initiator goes away without a word
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, _ := os.ReadDir(dir)
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", ents)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A directory swapped for a symlink while a push into it is under way
// can't make the push leave its temporary file behind, in either place.
func TestPushDirectorySwappedForASymlink(t *testing.T) {
	dir, _, addr := pushTarget(t)
	for _, d := range []string{"sub", "other"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := newPeer(t, addr)
	src := randomBytes(4 * pushChunk)
	mr := p.source(src)
	for _, commit := range []bool{false, true} {
		h, err := p.startPush("data/sub/f", len(src))
		if err != nil {
			t.Fatal(err)
		}
		// Swap: sub goes, and a symlink to other takes its name.
		if err := os.Rename(filepath.Join(dir, "sub"), filepath.Join(dir, "sub.old")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("other", filepath.Join(dir, "sub")); err != nil {
			t.Fatal(err)
		}
		if commit {
			if _, err := p.window(h, mr, 0, len(src), sums(src, 0, 4)); err != nil {
				t.Fatal(err)
			}
			if _, err := p.call(&protocol.PushCommit{Handle: h, FileDigest: fileDigest(t, src)}); err != nil {
				t.Fatal(err)
			}
			// It lands where the push began, never through the symlink.
			clean(t, filepath.Join(dir, "sub.old"), "f")
			os.Remove(filepath.Join(dir, "sub.old", "f"))
		} else if _, err := p.call(&protocol.Close{Handle: h}); err != nil {
			t.Fatal(err)
		}
		clean(t, filepath.Join(dir, "sub.old"))
		clean(t, filepath.Join(dir, "other"))
		os.Remove(filepath.Join(dir, "sub"))
		if err := os.Rename(filepath.Join(dir, "sub.old"), filepath.Join(dir, "sub")); err != nil {
			t.Fatal(err)
		}
	}
}
