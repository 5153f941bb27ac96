package tree

import (
	"sync"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"
)

// session is a tree copy's view of an initiator session.
type session struct {
	*initiator.Session
	cfg  initiator.Config
	meta *local.Metadata
	// lister, if set, takes trees in instead of Walk: the session itself
	// (List, directory by directory) or a fake target's listings. Tests
	// only: a copy walks, and lists only for a quick check (quick.go).
	lister lister
}

func newSession(s *initiator.Session) *session {
	ts := &session{Session: s, cfg: s.Config(), meta: s.Metadata()}
	if _, ok := listedBy.Load(s); ok {
		ts.lister = ts
	}
	return ts
}

// listedBy holds the sessions whose trees are listed, not walked: set by
// tests only (ListTrees, export_test.go), to cover the List path with
// every tree test.
var listedBy sync.Map // *initiator.Session -> struct{}
