package initiator

import (
	"context"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

// No two READs in flight land in one staging slot, whatever order they
// complete in: READs on different QPs complete out of order, and two
// placing into one slot at once made the iwarp-soft receiver, which
// checks the MPA CRC of the placed bytes, see the other's bytes (a CRC
// mismatch; the QP failed).
func TestBenchSlotsNotShared(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev, err := iwarp.New(iwarp.Config{}).Open(ctx, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 10
	b := &bench{s: &Session{pd: pd, nqps: 4, reads: 2}, size: size, win: protocol.Window{Length: 64 * size}}
	if err := b.setup(); err != nil {
		t.Fatal(err)
	}
	defer b.teardown()
	slot := func(p reads.Piece) int { return int((p.Local.Addr - b.mr.Addr()) / size) }
	var out []reads.Piece // in flight
	inUse := map[int]bool{}
	take := func() {
		p := b.piece()
		if s := slot(p); inUse[s] {
			t.Fatalf("READ %d got slot %d, which a READ in flight lands in (in flight: %d)", b.posted, s, len(out))
		} else {
			inUse[s] = true
		}
		out = append(out, p)
	}
	for range 8 {
		take()
	}
	// Complete them out of order: the second, the fifth, the last...
	for i, k := range []int{1, 4, 5, 0, 2, 0, 1, 3, 0, 0, 2, 1} {
		k %= len(out)
		p := out[k]
		out = append(out[:k], out[k+1:]...)
		delete(inUse, slot(p))
		b.done(&p)
		take()
		if len(out) != 8 {
			t.Fatalf("step %d: %d in flight", i, len(out))
		}
	}
}
