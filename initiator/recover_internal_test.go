package initiator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
)

func TestRecoverable(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		err  error
		ctx  context.Context
		want bool
	}{
		{fmt.Errorf("%w: reading x: %w", ErrConnect, reads.ErrNoPath), nil, true},
		{fmt.Errorf("%w: %w", ErrConnect, reads.ErrRefused), nil, true}, // keys revoked: a new session, not another QP
		{fmt.Errorf("data QP 0: %w", reads.ErrTimeout), nil, true},
		{fmt.Errorf("x: %w", protocol.ErrTimeout), nil, true},
		{fmt.Errorf("x: %w", protocol.ErrClosed), nil, true},
		{fmt.Errorf("%w: chunk 3", ErrVerify), nil, false}, // a new session would read the same bytes
		{fmt.Errorf("%w: x", ErrChanged), nil, false},
		{fmt.Errorf("%w: wrong secret", ErrAuth), nil, false},
		{&protocol.Error{Code: protocol.CodeNotFound, Message: "no such file"}, nil, false},
		{fmt.Errorf("%w: x", ErrConnect), cancelled, false}, // interrupted: no reconnecting
	} {
		ctx := c.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		if got := recoverable(ctx, c.err); got != c.want {
			t.Errorf("recoverable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// A session whose budget earlier reconnects spent says so when it gives
// up: its attempts over the whole command, and how many worked, not "0
// attempts" for the last break alone.
func TestGaveUpCountsTheWholeCommand(t *testing.T) {
	s := &Session{cfg: Config{RetryFor: time.Second, Logger: slog.New(slog.DiscardHandler)}, spent: time.Second, reconnects: 3, reconnectTries: 4}
	cause := fmt.Errorf("%w: the control connection was lost", ErrConnect)
	err := s.reconnect(context.Background(), cause)
	var gu *GaveUpError
	if !errors.As(err, &gu) || gu.Attempts != 4 || gu.Reconnects != 3 || !errors.Is(err, ErrConnect) {
		t.Fatalf("err = %#v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "after 4 attempts to connect in 1s") || !strings.Contains(msg, "3 of which reconnected") {
		t.Errorf("message: %s", msg)
	}
}
