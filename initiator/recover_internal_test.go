package initiator

import (
	"context"
	"fmt"
	"testing"

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
