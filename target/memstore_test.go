package target_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
)

// TestMemStoreNoRehash: a daemon that does not persist digests (serve
// --no-persist-digests: a MemStore as Config.Digests) hashes an unchanged
// file once, however often it serves it; a file that changed is hashed
// again. Without a store (Digests nil) every Open+read hashed it again.
func TestMemStoreNoRehash(t *testing.T) {
	dir := t.TempDir()
	const size = 24 << 20
	path := filepath.Join(dir, "f")
	sparseFile(t, path, size, []int64{0, 16 << 20}, 4<<20)
	// Digests of a file changed within the last 2 s are not kept.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(path, old, old)
	time.Sleep(2100 * time.Millisecond)
	cfg := targetConfig(dir, 8<<20, 64<<20)
	cfg.Digests = chunker.NewMemStore(0)
	srv, addr := serveSrv(t, cfg)
	serveOnce := func() (hashed float64, digest []byte) {
		before := metric(t, srv, "rdmacp_digest_bytes_total")
		p := newPeerAs(t, addr, winClient)
		m, err := p.call(&protocol.Open{Path: "data/f"})
		if err != nil {
			t.Fatal(err)
		}
		or := m.(*protocol.OpenReply)
		digestsOf(t, p, or.Handle, 0, int(or.Chunks), 4)
		m, err = p.call(&protocol.Close{Handle: or.Handle})
		if err != nil {
			t.Fatal(err)
		}
		return metric(t, srv, "rdmacp_digest_bytes_total") - before, m.(*protocol.Closed).FileDigest
	}
	first, d1 := serveOnce()
	if first != 8<<20 || len(d1) == 0 {
		t.Fatalf("first serve hashed %v bytes, want the 8 MiB of data; file digest %x", first, d1)
	}
	second, d2 := serveOnce()
	if second != 0 || !bytes.Equal(d1, d2) {
		t.Fatalf("second serve of the unchanged file hashed %v bytes (want 0), file digest %x then %x", second, d1, d2)
	}
	// A write whose mtime is put back: the ctime moves, the key changes.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("edit"), 100)
	f.Close()
	os.Chtimes(path, old, old)
	third, d3 := serveOnce()
	if third != 8<<20 || bytes.Equal(d3, d1) {
		t.Fatalf("after an edit: hashed %v bytes (want 8 MiB again), file digest %x (was %x)", third, d3, d1)
	}
}
