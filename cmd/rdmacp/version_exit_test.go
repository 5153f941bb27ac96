package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/rdmacp/rdmacp/protocol"
)

// A peer of another protocol version is a protocol error: exit 12, bare,
// wrapped, or as the initiator reports a target's refusal.
func TestExitCodeVersionMismatch(t *testing.T) {
	for _, err := range []error{
		&protocol.VersionError{Got: 2, Peer: "target"},
		fmt.Errorf("data/f: %w", &protocol.VersionError{Got: 2}),
		fmt.Errorf("%w: the target refused us: %s", protocol.ErrVersion, protocol.VersionMismatch("initiator", "1")),
	} {
		if got := exitCode(context.Background(), err); got != exitProtocol || exitProtocol != 12 {
			t.Errorf("exitCode(%v) = %d, want 12", err, got)
		}
	}
}
