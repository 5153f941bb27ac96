package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
)

// A target that made no progress maps to exit 30, as it comes out of a
// session (bare or wrapped), and not to a connection failure.
func TestExitCodeNoProgress(t *testing.T) {
	np := &protocol.NoProgressError{Request: protocol.TypeOpen, For: 30 * time.Second}
	for _, err := range []error{np, fmt.Errorf("data/f: %w", np)} {
		if got := exitCode(context.Background(), err); got != exitStalled || exitStalled != 30 {
			t.Errorf("exitCode(%v) = %d, want 30", err, got)
		}
	}
	if want := "the target made no progress on Open for 30s; its storage may be hung"; np.Error() != want {
		t.Errorf("message %q, want %q", np.Error(), want)
	}
}
