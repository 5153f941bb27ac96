package initiator

import (
	"errors"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
)

// chain is a walk of depth directories, each in the last, named name,
// in batches of at most protocol.MaxBatchEntries.
func chain(depth int, name string) []*protocol.WalkBatch {
	var bs []*protocol.WalkBatch
	var ents []protocol.WalkEntry
	for i := range depth {
		ents = append(ents, wDir(uint32(i), name))
		if len(ents) == protocol.MaxBatchEntries {
			bs = append(bs, wBatch(false, 0, ents...))
			ents = nil
		}
	}
	return append(bs, wBatch(true, 0, ents...))
}

// A walk deeper than MaxDepth, or with a path longer than MaxPath, stops
// with an error naming the cap; at the caps it goes through.
func TestWalkTrackCaps(t *testing.T) {
	for _, c := range []struct {
		name  string
		depth int
		elem  string
		want  string // "" for no error
	}{
		{"at the depth cap", protocol.MaxDepth, "d", ""},
		{"past the depth cap", protocol.MaxDepth + 1, "d", "depth of 1025 levels, over the protocol's cap of 1024 levels"},
		{"at the path cap", 16, strings.Repeat("x", 255), ""}, // 16*256-1 = 4095
		{"past the path cap", 17, strings.Repeat("x", 255), "path of 4351 bytes, over the protocol's cap of 4096 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := trackAll(t, chain(c.depth, c.elem)...)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ce *protocol.CapError
			if !errors.As(err, &ce) || !errors.Is(err, protocol.ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a CapError saying %q", err, c.want)
			}
			if len(err.Error()) > 300 {
				t.Errorf("the error is %d bytes: the path should be cut short", len(err.Error()))
			}
		})
	}
}
