package initiator_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
)

// A target refusing for want of room (here its one session is taken) is
// dialed again with backoff within RetryFor: the dial gets in once the
// place frees, not the moment it is refused.
func TestDialRetriesWhileTargetBusy(t *testing.T) {
	e := startTarget(t, func(c *target.Config) { c.MaxSessions = 1 })
	first := e.Dial(t, nil)
	freed := time.AfterFunc(700*time.Millisecond, func() { first.Close() })
	defer freed.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	s, err := initiator.Dial(ctx, e.Addr, initiator.Config{Device: e.Dev, QPs: 1, Depth: 1, RetryFor: 15 * time.Second})
	if err != nil {
		t.Fatalf("dial while the target was busy for 0.7 s: %v", err)
	}
	s.Close()
	if took := time.Since(t0); took < 500*time.Millisecond {
		t.Fatalf("got in after %v, before the place was freed", took)
	}
}

// Within RetryFor only: then the refusal, saying what it retried.
func TestDialBusyGivesUpWithinRetryFor(t *testing.T) {
	e := startTarget(t, func(c *target.Config) { c.MaxSessions = 1 })
	e.Dial(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err := initiator.Dial(ctx, e.Addr, initiator.Config{Device: e.Dev, QPs: 1, Depth: 1, RetryFor: time.Second})
	took := time.Since(t0)
	if err == nil || !strings.Contains(err.Error(), "too many sessions") || !strings.Contains(err.Error(), "--retry-for") || !errors.Is(err, initiator.ErrConnect) {
		t.Fatalf("dial of a full target: %v", err)
	}
	if took < time.Second || took > 8*time.Second {
		t.Fatalf("gave up after %v with --retry-for 1s", took)
	}
}

// Any other refusal is the command's at once: nothing listens there.
func TestDialNotBusyFailsAtOnce(t *testing.T) {
	e := startTarget(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := initiator.Dial(ctx, addr, initiator.Config{Device: e.Dev, QPs: 1, Depth: 1, RetryFor: 15 * time.Second}); err == nil {
		t.Fatal("dialed a port nothing listens on")
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Fatalf("a connection refused took %v: retried as if the target were busy", took)
	}
}
