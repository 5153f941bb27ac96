package tree

import (
	"fmt"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

// The large-file queue gives back what it was given, in order, entries
// whole, whether kept in memory or spilled to its file, and only
// largeInMemory of them stay in memory.
func TestLargeQueueSpills(t *testing.T) {
	defer func(n int) { largeInMemory = n }(largeInMemory)
	largeInMemory = 3
	var q largeQueue
	defer q.close()
	for i := range 10 {
		q.add(initiator.Item{Rel: fmt.Sprintf("d/f%d", i), Entry: protocol.Entry{Name: fmt.Sprintf("f%d", i), Type: protocol.FileRegular,
			Size: uint64(1 << 20 * i), MtimeNs: int64(i) * 1e9, Mode: 0o640, Meta: &protocol.Meta{UID: uint32(i), Ino: uint64(i)}}})
	}
	if len(q.mem) != 3 || q.spilled != 7 || q.len() != 10 {
		t.Fatalf("%d in memory, %d spilled", len(q.mem), q.spilled)
	}
	i := 0
	err := q.each(func(it initiator.Item) error {
		e := it.Entry
		if it.Rel != fmt.Sprintf("d/f%d", i) || e.Size != uint64(1<<20*i) || e.MtimeNs != int64(i)*1e9 || e.Mode != 0o640 ||
			e.Meta == nil || e.Meta.UID != uint32(i) || e.Meta.Ino != uint64(i) {
			t.Errorf("item %d: %+v", i, it)
		}
		i++
		return nil
	})
	if err != nil || i != 10 {
		t.Fatalf("each: %v after %d", err, i)
	}
	if q.len() != 0 {
		t.Error("not emptied")
	}
}
