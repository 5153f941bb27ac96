package main

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// A failed rename or link at the destination (an *os.LinkError, not an
// *fs.PathError) is a local I/O error, exit 8, like any other failure
// to write the destination; it was exit 1.
func TestExitCodeLinkError(t *testing.T) {
	err := fmt.Errorf("placing dst: %w", &os.LinkError{Op: "rename", Old: "dst/.f.part", New: "dst/f", Err: syscall.EXDEV})
	if got := exitCode(context.Background(), err); got != exitLocalIO || exitLocalIO != 8 {
		t.Errorf("exitCode(%v) = %d, want 8", err, got)
	}
}
