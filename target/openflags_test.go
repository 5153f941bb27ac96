package target_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
)

// OpenReply says OpenDense for a file with no holes, so the initiator
// asks for no Extents, and not for one with a hole (at its end, past
// the data, or at its start), whose Extents the initiator needs.
func TestOpenDense(t *testing.T) {
	dir := t.TempDir()
	const size = 3 << 20
	if err := os.WriteFile(filepath.Join(dir, "dense"), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	sparseFile(t, filepath.Join(dir, "tail"), 16<<20, []int64{0}, 1<<20)
	sparseFile(t, filepath.Join(dir, "head"), 16<<20, []int64{8 << 20}, 1<<20)
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, targetConfig(dir, 4<<20, 16<<20))
	p := newPeerAs(t, addr, winClient)
	for name, want := range map[string]uint8{"dense": protocol.OpenDense, "tail": 0, "head": 0, "empty": 0} {
		m, err := p.call(&protocol.Open{Path: "data/" + name})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := m.(*protocol.OpenReply).Flags; got != want {
			t.Errorf("%s: Flags %#x, want %#x", name, got, want)
		}
	}
}
