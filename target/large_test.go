package target_test

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// rss is this process's resident set, in bytes.
func rss(t *testing.T) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}

func TestLargeSparseExportStaysInBudget(t *testing.T) {
	// A 64 GiB sparse file, read through windows spread across it: the
	// target maps windows on demand, and what stays resident is bounded
	// by the window budget, not the file.
	dir := t.TempDir()
	const size = 64 << 30
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Skipf("no sparse files here: %v", err)
	}
	f.Close()
	const window, budget = 32 << 20, 64 << 20
	addr := serve(t, targetConfig(dir, window, budget))
	p := newPeer(t, addr)
	m, err := p.call(&protocol.Open{Path: "data/sparse", Algorithm: 2}) // no digests: nothing hashes 64 GiB
	if err != nil {
		t.Fatal(err)
	}
	h := m.(*protocol.OpenReply).Handle
	base := rss(t)
	peak := base
	zero := make([]byte, 1<<20)
	for i := range 8 {
		off := uint64(i) * (size / 8)
		m, err := p.call(&protocol.Map{Handle: h, Offset: off, Length: window})
		if err != nil {
			t.Fatal(err)
		}
		w := m.(*protocol.MapReply).Window
		if w.Length != window {
			t.Fatalf("window of %d bytes, want %d", w.Length, window)
		}
		for o := uint64(0); o < w.Length; o += 1 << 20 {
			if st := p.read(w.Addr+o, w.RKeys[0], 1<<20); st != verbs.StatusSuccess {
				t.Fatalf("READ at %d: %v", off+o, st)
			}
			if !bytes.Equal(p.buf[:1<<20], zero) {
				t.Fatalf("hole at %d reads non-zero", off+o)
			}
		}
		peak = max(peak, rss(t))
		if _, err := p.call(&protocol.Unmap{Handle: h, WindowID: w.ID}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("read 256 MiB across a 64 GiB export: RSS %d MiB before, %d MiB at peak", base>>20, peak>>20)
	if grow := peak - base; grow > budget+(32<<20) {
		t.Fatalf("RSS grew by %d MiB, over the %d MiB window budget", grow>>20, budget>>20)
	}
}
