package tree

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

// chainLister lists a chain of depth directories named name.
type chainLister struct {
	depth int
	name  string
}

func (c chainLister) List(_ context.Context, p string) ([]protocol.Entry, error) {
	if strings.Count(p, "/")-1 >= c.depth {
		return nil, nil
	}
	return []protocol.Entry{{Type: protocol.FileDir, Name: c.name}}, nil
}

func (c chainLister) Stat(context.Context, string) (protocol.Entry, error) {
	return protocol.Entry{Type: protocol.FileDir}, nil
}

// The same caps hold for a tree listed with List.
func TestPlanTreeCaps(t *testing.T) {
	ctx := context.Background()
	if _, err := planTree(ctx, chainLister{protocol.MaxDepth, "d"}, "data/t", initiator.Shard{}); err != nil {
		t.Fatalf("at the depth cap: %v", err)
	}
	_, err := planTree(ctx, chainLister{protocol.MaxDepth + 1, "d"}, "data/t", initiator.Shard{})
	if !errors.Is(err, protocol.ErrMalformed) || !strings.Contains(err.Error(), "depth of 1025 levels") {
		t.Fatalf("past the depth cap: %v", err)
	}
	_, err = planTree(ctx, chainLister{17, strings.Repeat("x", 255)}, "data/t", initiator.Shard{})
	if !errors.Is(err, protocol.ErrMalformed) || !strings.Contains(err.Error(), "path of 4351 bytes") {
		t.Fatalf("past the path cap: %v", err)
	}
}
